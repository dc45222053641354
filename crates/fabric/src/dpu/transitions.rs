//! The DPU's lifecycle transitions (the diagram is in the [`crate::dpu`] module doc): the
//! plane coming up or failing, the timers of the redirect rules, the measurement window that
//! feeds URSched and applies its decisions, the operator's hold, and shedding an overloaded
//! fast path. The state they move between is [`super::lifecycle::Lifecycle`]'s.

use spillway_vswitch::Instant;

use super::control::{DpuControl, Shards, SyncBack};
use super::lifecycle::{Command, DrainStep, EventKind, FabricEvent, Hold, Phase, Upgrade, Warm};
use crate::links::at_ps;
use crate::params::ns;
use crate::types::{Channel, Colour, Msg, PlaneSlot};
use crate::ursched::{Decision, Load};

impl DpuControl {
    /// The plane's process runs (the driver's report after [`Command::StartPlane`]).
    pub fn handle_plane_up(&mut self, now: Instant, sh: &mut dyn Shards) {
        self.life.last_heartbeat = now;
        if let Phase::Preparing { colour } = self.life.phase {
            self.enter_shadow(now, colour, sh);
        }
    }

    /// The plane in `slot` runs (the driver's report after [`Command::StartPlane`]).
    pub fn handle_plane_up_in(&mut self, now: Instant, slot: PlaneSlot, sh: &mut dyn Shards) {
        if slot == self.life.active {
            self.handle_plane_up(now, sh);
        } else if let Warm::Starting { colour } = self.life.warm {
            self.warm_up(now, colour, sh);
        }
    }

    /// The plane in `slot` died or was found stalled.
    pub fn handle_plane_failed_in(
        &mut self,
        now: Instant,
        slot: PlaneSlot,
        reason: &str,
        sh: &mut dyn Shards,
    ) {
        if slot == self.life.active {
            self.active_failed(now, reason.to_string(), sh);
        } else {
            self.warm_failed(now, reason.to_string(), sh);
        }
    }

    /// The active plane failed: flip to a synced warm plane where one is ready and the
    /// phase allows it (a release under way is not continued by another plane: it fails
    /// open, which ends it as well), fail open otherwise.
    fn active_failed(&mut self, now: Instant, reason: String, sh: &mut dyn Shards) {
        self.remote_plane_lost();
        match (self.life.warm, self.life.phase) {
            (
                Warm::Ready { colour },
                Phase::Shadow { .. } | Phase::Activating { .. } | Phase::Active { .. },
            ) => self.begin_flip(now, colour, reason, sh),
            (
                Warm::Off
                | Warm::Starting { .. }
                | Warm::Syncing { .. }
                | Warm::Ready { .. }
                | Warm::Flipping { .. },
                Phase::Idle
                | Phase::Preparing { .. }
                | Phase::Shadow { .. }
                | Phase::Activating { .. }
                | Phase::Active { .. }
                | Phase::Draining { .. },
            ) => self.fail_open(now, reason, sh),
        }
    }

    /// A plane on the pool failed (it died, broke the protocol or missed its heartbeats): the
    /// pool's grant is void until the driver reports one again, so no plane is started on a
    /// pool that just failed. Every failure path comes here; the driver learns of it from the
    /// plane's `StopPlane { failed: true }` or its own report, and gives the cores back.
    fn remote_plane_lost(&mut self) {
        if self.life.remote {
            self.set_remote_grant(None);
        }
    }

    /// A failover starts: the failed plane is stopped (fenced) at once, and the redirect
    /// rules are flipped to the warm slot, live after `dpu.flip_latency`.
    fn begin_flip(&mut self, now: Instant, colour: Colour, reason: String, sh: &mut dyn Shards) {
        let old = self.life.active;
        self.life.commands.push_back(Command::StopPlane {
            slot: old,
            failed: true,
        });
        let live_at = now + self.f.dpu.flip_latency;
        self.life.warm = Warm::Flipping { colour, live_at };
        // The failure is the trigger of the warm plane's first absorbed packet: the
        // `Absorbing` event after a failover measures the forwarding gap of the overflow.
        self.life.absorbed = false;
        self.life.trigger = Some(now);
        self.event(
            now,
            EventKind::FailOver,
            format!(
                "{reason}; flipping the redirect rules from {old} to the warm plane in {}",
                old.other()
            ),
        );
        if live_at <= now {
            self.finish_flip(now, sh);
        }
    }

    /// The flip is live: the warm slot is the active one, its plane takes every connection
    /// the failed plane owned, and a new warm plane is asked for in the freed slot.
    fn finish_flip(&mut self, now: Instant, sh: &mut dyn Shards) {
        let Warm::Flipping { colour, .. } = self.life.warm else {
            return;
        };
        if self.life.upgrade == Upgrade::Releasing {
            self.finish_upgrade_flip(now, colour, sh);
            return;
        }
        self.take_warm_slot(now, colour);
        let handed = sh.flip(now, colour);
        sh.count_failover();
        self.life.phase = match self.life.phase {
            Phase::Active { .. } => {
                sh.send(now, Channel::Control, Msg::Activated { colour });
                Phase::Active { colour }
            }
            // The activation's timer sends `Activated` to the new plane when the rules are live.
            Phase::Activating { live_at, .. } => Phase::Activating { colour, live_at },
            Phase::Shadow { .. } => Phase::Shadow {
                colour,
                synced: true,
            },
            // Nothing else starts a flip, and decisions wait for it to finish.
            p @ (Phase::Idle | Phase::Preparing { .. } | Phase::Draining { .. }) => {
                debug_assert!(false, "a flip finished in phase {p:?}");
                p
            }
        };
        let workers = self.life.plane_workers;
        if workers > self.f.host.warm_workers {
            sh.send(now, Channel::Control, Msg::SetWorkers { workers });
        }
        // Verified once it has taken them: its digests against the DPU's.
        self.ask_digests(now, (false, true), colour, sh);
        self.life.events.push_back(FabricEvent {
            at: now,
            what: EventKind::FailOver,
            reason: format!(
                "redirect rules flipped to {}: {handed} connections handed to the warm plane (colour {}), {workers} workers asked",
                self.life.active, colour.0
            ),
            since: None,
        });
        self.ensure_warm(now, sh);
    }

    /// An operator asks for an online upgrade (`spillway ctl upgrade`): the plane in the warm
    /// slot, started for it if warm standby is off, replaces the active one. See [`Upgrade`].
    /// `fresh`: the upgrade is to another binary, so a warm plane already up (running the old
    /// one) is stopped first and one is started for the upgrade. Refused (an event says why)
    /// unless a plane is active and no upgrade or flip is under way.
    pub fn handle_upgrade(&mut self, now: Instant, fresh: bool, sh: &mut dyn Shards) {
        let busy =
            self.life.upgrade != Upgrade::None || matches!(self.life.warm, Warm::Flipping { .. });
        if busy || !matches!(self.life.phase, Phase::Active { .. }) {
            self.event(
                now,
                EventKind::Upgrade,
                format!(
                    "upgrade refused: it needs an active plane and no upgrade or failover under way (phase {}, warm plane {})",
                    self.life.phase.name(),
                    self.life.warm.name()
                ),
            );
            return;
        }
        self.life.upgrade = Upgrade::Pending;
        self.event(
            now,
            EventKind::UpgradeAsked,
            format!(
                "online upgrade asked; the warm plane is {}{}",
                self.life.warm.name(),
                if fresh {
                    ", and a new one is started for it"
                } else {
                    ""
                }
            ),
        );
        if fresh && self.life.warm != Warm::Off {
            let slot = self.life.active.other();
            let why = format!("warm plane in {slot} stopped: it runs the binary being replaced");
            self.stop_warm(now, why, false, sh);
        }
        self.ensure_warm(now, sh);
        self.try_upgrade(now, sh);
    }

    /// The upgrade's next step once the warm plane is ready: the active plane hands every
    /// connection back (a release's first step; the redirect rules stay).
    pub(super) fn try_upgrade(&mut self, now: Instant, sh: &mut dyn Shards) {
        if self.life.upgrade != Upgrade::Pending || !matches!(self.life.warm, Warm::Ready { .. }) {
            return;
        }
        let Phase::Active { colour } = self.life.phase else {
            // The plane was released or failed meanwhile: nothing left to upgrade.
            self.life.upgrade = Upgrade::None;
            return;
        };
        self.life.upgrade = Upgrade::Releasing;
        self.begin_hand_back(now, colour, sh);
        self.event(
            now,
            EventKind::Upgrade,
            "the warm plane is ready; the active plane hands its connections back",
        );
    }

    /// A release's first step (an upgrade's too): the active plane hands every connection
    /// back, and the shards note what arrives for the sync-back check (see [`SyncBack`]).
    fn begin_hand_back(&mut self, now: Instant, colour: Colour, sh: &mut dyn Shards) {
        self.life.phase = Phase::Draining {
            colour,
            step: DrainStep::HandBack,
        };
        self.sync_back = Some(SyncBack::new(colour));
        sh.sync_back_begin(colour);
        sh.send(now, Channel::Control, Msg::Release { colour });
        self.await_markers(sh.count());
    }

    /// The hand-back is over when every shard's `Released` is in and every bucket the
    /// sync-back check asked for again has come back (or `dpu.drain_timeout` passed): the
    /// release removes the redirect rules, an upgrade flips them to the new plane.
    pub(super) fn hand_back_done(&mut self, now: Instant, sh: &mut dyn Shards) {
        let Phase::Draining {
            colour,
            step: DrainStep::HandBack,
        } = self.life.phase
        else {
            return;
        };
        let Some(sb) = self
            .sync_back
            .take_if(|sb| sb.handed.is_some() && sb.pending == 0)
        else {
            return;
        };
        self.life.drain_deadline = None;
        let count = sb.handed.unwrap_or(0);
        if !sb.differ.is_empty() {
            let mut differ = sb.differ;
            differ.sort_unstable();
            self.event(
                now,
                EventKind::Draining,
                format!(
                    "the plane's digests of what it handed back differed in {} buckets ({differ:?}); {} connections handed back again",
                    differ.len(),
                    sb.sent
                ),
            );
        }
        // An upgrade flips to the new plane instead of removing the rules (unless the new
        // plane failed meanwhile: then this is a release after all).
        if self.life.upgrade == Upgrade::Releasing && self.upgrade_handed_back(now, count, sh) {
            return;
        }
        let done_at = now + self.f.dpu.redirect_latency;
        self.life.phase = Phase::Draining {
            colour,
            step: DrainStep::RemoveRedirect { done_at },
        };
        self.event(
            now,
            EventKind::Draining,
            format!("{count} connections handed back; removing redirect rules"),
        );
    }

    /// Every shard of the old plane has handed its connections back during an upgrade: flip
    /// the redirect rules to the new plane, or, if it failed meanwhile, finish as a release.
    /// Returns false in the second case (the caller goes on with the release).
    pub(super) fn upgrade_handed_back(
        &mut self,
        now: Instant,
        count: u64,
        sh: &mut dyn Shards,
    ) -> bool {
        let Warm::Ready { colour } = self.life.warm else {
            self.life.upgrade = Upgrade::None;
            self.event(
                now,
                EventKind::Upgrade,
                "upgrade abandoned: the new plane failed; the old one is released",
            );
            return false;
        };
        let live_at = now + self.f.dpu.flip_latency;
        self.life.warm = Warm::Flipping { colour, live_at };
        self.event(
            now,
            EventKind::Upgrade,
            format!(
                "{count} connections handed back; flipping the redirect rules to the new plane in {}",
                self.life.active.other()
            ),
        );
        if live_at <= now {
            self.finish_flip(now, sh);
        }
        true
    }

    /// The upgrade's flip is live: the new plane is the active one and takes the redirected
    /// buckets' connections (the DPU owns them all since the hand-back); the old plane
    /// retires after a window, finishing what is in flight.
    fn finish_upgrade_flip(&mut self, now: Instant, colour: Colour, sh: &mut dyn Shards) {
        let old = self.take_warm_slot(now, colour);
        // The new plane's first served packet measures the upgrade's forwarding gap.
        self.life.absorbed = false;
        self.life.trigger = Some(now);
        // Anything the old plane still owned (a recall going live stays with the DPU).
        let handed = sh.flip(now, colour);
        self.life.phase = Phase::Active { colour };
        sh.send(now, Channel::Control, Msg::Activated { colour });
        sh.hand_over_buckets(now, colour, 0, self.life.quota);
        let workers = self.life.plane_workers;
        if workers > self.f.host.warm_workers {
            sh.send(now, Channel::Control, Msg::SetWorkers { workers });
        }
        // Verified once it has taken them: its digests against the DPU's.
        self.ask_digests(now, (false, true), colour, sh);
        let at = now + self.f.sched.window;
        self.life.upgrade = Upgrade::Retiring { slot: old, at };
        self.event(
            now,
            EventKind::Upgrade,
            format!(
                "redirect rules flipped to {} (colour {}): the redirected buckets' connections handed to it ({handed} the old plane still held); the old plane in {old} retires",
                self.life.active, colour.0
            ),
        );
    }

    /// A flip went live: the warm slot, whose plane has `colour`, is the active one. Returns
    /// the slot that was.
    fn take_warm_slot(&mut self, now: Instant, colour: Colour) -> PlaneSlot {
        let old = self.life.active;
        self.life.active = old.other();
        self.life.colour = colour;
        self.life.warm = Warm::Off;
        self.digests = [None, None];
        // Its heartbeats were the warm plane's until now.
        self.life.last_heartbeat = now;
        self.life.plane_util = 0.0;
        old
    }

    /// The warm plane failed (or, during a flip, the plane about to take over: then the DPU
    /// fails open, since no plane holds the failed one's connections).
    fn warm_failed(&mut self, now: Instant, reason: String, sh: &mut dyn Shards) {
        self.remote_plane_lost();
        match self.life.warm {
            Warm::Off => {}
            Warm::Flipping { .. } => self.fail_open(
                now,
                format!("the warm plane failed during a flip: {reason}"),
                sh,
            ),
            Warm::Starting { .. } | Warm::Syncing { .. } | Warm::Ready { .. } => {
                let slot = self.life.active.other();
                let why =
                    format!("warm plane in {slot} failed: {reason}; a new one at the next window");
                self.stop_warm(now, why, true, sh);
            }
        }
    }

    /// Stops the warm plane (not during a flip), which `failed` or is no longer wanted; the
    /// event says `why`.
    fn stop_warm(&mut self, now: Instant, why: String, failed: bool, sh: &mut dyn Shards) {
        self.life.warm = Warm::Off;
        self.digests[1] = None;
        sh.warm_off();
        self.life.commands.push_back(Command::StopPlane {
            slot: self.life.active.other(),
            failed,
        });
        self.event(now, EventKind::Warm, why);
    }

    /// The warm plane of `colour` runs: its bulk sync starts.
    pub(super) fn warm_up(&mut self, now: Instant, colour: Colour, sh: &mut dyn Shards) {
        self.life.warm = Warm::Syncing { colour };
        self.life.warm_heartbeat = now;
        let count = sh.warm_sync(now, colour);
        self.warm_markers.await_all(sh.count());
        self.event(
            now,
            EventKind::Warm,
            format!(
                "warm plane up in {}; bulk sync of {count} connections (colour {})",
                self.life.active.other(),
                colour.0
            ),
        );
    }

    /// Asks for a warm plane in the other slot if warm standby is on, a plane is up and none
    /// is warm or on its way.
    pub(super) fn ensure_warm(&mut self, now: Instant, _sh: &mut dyn Shards) {
        let wanted = match self.life.upgrade {
            Upgrade::Pending => true,
            // The old plane still holds the other slot.
            Upgrade::Retiring { .. } => false,
            Upgrade::None | Upgrade::Releasing => self.f.host.warm_standby,
        };
        if !wanted || self.f.dpu_only || self.life.warm != Warm::Off || !self.life.phase.has_plane()
        {
            return;
        }
        let colour = self.life.issue_colour();
        let slot = self.life.active.other();
        let workers = self.f.host.warm_workers;
        // Where the active plane runs: a failover or an upgrade then flips to a plane on the
        // same host, with the same links, and never moves the overflow between hosts. For a
        // plane on the pool its `warm_workers` come on top of the cores reserved there
        // (`remote_wanted` counts the active plane's), as on this host they are not counted
        // against the isolatable cores either.
        let remote = self.life.remote;
        self.life.warm = Warm::Starting { colour };
        self.life.commands.push_back(Command::StartPlane {
            slot,
            workers,
            remote,
        });
        self.event(
            now,
            EventKind::Warm,
            format!(
                "starting a warm plane in {slot} with {workers} workers{} (colour {})",
                if remote { " on the remote pool" } else { "" },
                colour.0
            ),
        );
    }

    pub(super) fn enter_shadow(&mut self, now: Instant, colour: Colour, sh: &mut dyn Shards) {
        self.life.phase = Phase::Shadow {
            colour,
            synced: false,
        };
        // Bulk sync: every connection the DPU owns, in connection order, then the end marker.
        let count = sh.bulk_sync(now, colour);
        self.await_markers(sh.count());
        self.event(
            now,
            EventKind::Shadow,
            format!(
                "plane up; bulk sync of {count} connections (colour {})",
                colour.0
            ),
        );
        self.ensure_warm(now, sh);
    }

    /// The active plane's process died (the driver saw it exit). Same as a lost heartbeat.
    pub fn handle_plane_failed(&mut self, now: Instant, reason: &str, sh: &mut dyn Shards) {
        self.active_failed(now, reason.to_string(), sh);
    }

    pub(super) fn fail_open(&mut self, now: Instant, reason: String, sh: &mut dyn Shards) {
        if matches!(self.life.phase, Phase::Idle) {
            return;
        }
        sh.count_fail_open();
        // Every copy becomes owned: the mirror is the state. Redirect rules go at once (a
        // fail-open is local to the DPU, no handshake).
        let n = sh.promote_copies();
        self.event(
            now,
            EventKind::FailOpen,
            format!("{reason}; redirect rules removed, {n} connections taken over from mirrors"),
        );
        self.go_idle(now, "fail-open: plane stopped".into(), true, sh);
    }

    /// No plane any more: the active one is stopped (killed at once if it `failed`), and the
    /// warm one if any; the DPU owns every connection.
    pub(super) fn go_idle(
        &mut self,
        now: Instant,
        reason: String,
        failed: bool,
        sh: &mut dyn Shards,
    ) {
        self.life.phase = Phase::Idle;
        self.life.quota = 0;
        self.life.absorbed = false;
        sh.set_headroom(0.0);
        // With no plane, every record is the DPU's. A release handed back what the plane
        // owned and a fail-open promoted its mirrors; what is still a copy here was being
        // handed to the plane when it stopped (a hand-over on the flow vNIC, overtaken by the
        // release on the control channel): the plane never took it, and the DPU's copy is its
        // state. A hand-back from the plane still on its way is taken by version.
        let stranded = sh.promote_copies();
        let reason = if stranded > 0 {
            format!("{reason}; {stranded} connections still on their way to the plane kept")
        } else {
            reason
        };
        self.life.commands.push_back(Command::StopPlane {
            slot: self.life.active,
            failed,
        });
        if self.life.warm != Warm::Off || matches!(self.life.upgrade, Upgrade::Retiring { .. }) {
            self.life.warm = Warm::Off;
            sh.warm_off();
            self.life.commands.push_back(Command::StopPlane {
                slot: self.life.active.other(),
                failed: false,
            });
        }
        self.digests = [None, None];
        self.sync_back = None;
        self.life.upgrade = Upgrade::None;
        self.life.drain_deadline = None;
        self.life.plane_workers = 0;
        self.life.remote = false;
        self.event(now, EventKind::Idle, reason);
    }

    /// Timers: insert completions, redirect install/removal, URSched windows.
    pub fn handle_timeout(&mut self, now: Instant, sh: &mut dyn Shards) {
        if let Warm::Flipping { live_at, .. } = self.life.warm
            && now >= live_at
        {
            self.finish_flip(now, sh);
        }
        if let Phase::Draining {
            step: DrainStep::HandBack,
            ..
        } = self.life.phase
            && self.life.drain_deadline.is_some_and(|d| now >= d)
            && let Some(sb) = &mut self.sync_back
        {
            // A bucket asked for again never came back (the flow vNIC is not the reliable
            // channel): go on with what the DPU holds, and say so.
            let waited = self.f.dpu.drain_timeout.as_secs_f64() * 1e3;
            let missing = sb.pending;
            sb.pending = 0;
            self.event(
                now,
                EventKind::Draining,
                format!(
                    "{missing} buckets asked for again did not come back within {waited:.0} ms"
                ),
            );
            self.hand_back_done(now, sh);
        }
        if let Phase::Draining {
            step: DrainStep::Drain,
            ..
        } = self.life.phase
            && self.life.drain_deadline.is_some_and(|d| now >= d)
        {
            let waited = self.f.dpu.drain_timeout.as_secs_f64() * 1e3;
            self.go_idle(
                now,
                format!("the plane did not drain within {waited:.0} ms; stopped"),
                false,
                sh,
            );
        }
        if let Upgrade::Retiring { slot, at } = self.life.upgrade
            && now >= at
        {
            self.life.upgrade = Upgrade::None;
            self.life.commands.push_back(Command::StopPlane {
                slot,
                failed: false,
            });
            self.event(
                now,
                EventKind::Upgraded,
                format!("the old plane in {slot} stopped; upgrade done"),
            );
            sh.count_upgrade();
            self.ensure_warm(now, sh);
        }
        match self.life.phase {
            Phase::Activating { colour, live_at } if now >= live_at => {
                self.life.phase = Phase::Active { colour };
                self.life.events.push_back(FabricEvent {
                    at: now,
                    what: EventKind::Active,
                    reason: format!(
                        "redirect rules live for {} of {} buckets",
                        self.life.quota, self.f.dpu.redirect_buckets
                    ),
                    since: self.life.trigger,
                });
                sh.send(now, Channel::Control, Msg::Activated { colour });
                sh.hand_over_buckets(now, self.life.colour, 0, self.life.quota);
                self.enforce_hold(now, sh);
            }
            Phase::Draining {
                colour,
                step: DrainStep::RemoveRedirect { done_at },
            } if now >= done_at => {
                self.life.phase = Phase::Draining {
                    colour,
                    step: DrainStep::Drain,
                };
                self.life.quota = 0;
                self.event(
                    now,
                    EventKind::RedirectRemoved,
                    "redirect rules removed; draining in-flight packets",
                );
                // After the last redirected packet has left for the plane: the channels are
                // separate, so the drain request must not overtake packets still queued on the
                // phy vNIC.
                let at = at_ps(sh.host_idle_ps(now));
                sh.drain(at, colour);
                self.await_markers(sh.count());
                self.life.drain_deadline = Some(now + self.f.dpu.drain_timeout);
            }
            _ => {}
        }
        if self.win.window_due(now) {
            self.window(now, sh);
        }
        if self.win.variance_due(now) {
            let sched = &mut self.win;
            sh.drain_tenant_packets(&mut self.tenant_spare, &mut |tenant, packets| {
                sched.count_tenant(tenant, packets)
            });
            self.win.roll_variance();
        }
    }

    pub(super) fn window(&mut self, now: Instant, sh: &mut dyn Shards) {
        let totals = sh.totals();
        let utils = sh.take_utils(now);
        let (load, headroom) = self.win.close(
            totals,
            utils,
            self.life.plane_util,
            self.life.plane_workers,
            self.f.sched.dpu_target_util,
            self.f.dpu.hw_pps_limit,
        );
        sh.set_headroom(headroom);
        // A stalled plane: three heartbeats missed. The active one fails over or open; a
        // warm one is replaced. A plane on a pool host (and its warm one, which runs there
        // too) beats across the network: it is allowed the remote period if that is longer.
        let period = if self.life.remote {
            self.f.host.heartbeat.max(self.f.host.remote_heartbeat)
        } else {
            self.f.host.heartbeat
        };
        let missed = |last: Instant| now.0.saturating_sub(last.0) > 3 * ns(period);
        let flipping = matches!(self.life.warm, Warm::Flipping { .. });
        if self.life.phase.has_plane() && !flipping && missed(self.life.last_heartbeat) {
            let late = (now - self.life.last_heartbeat).as_secs_f64() * 1e3;
            self.active_failed(
                now,
                format!("no heartbeat from the plane for {late:.1} ms"),
                sh,
            );
            return;
        }
        if matches!(self.life.warm, Warm::Syncing { .. } | Warm::Ready { .. })
            && missed(self.life.warm_heartbeat)
        {
            let late = (now - self.life.warm_heartbeat).as_secs_f64() * 1e3;
            self.warm_failed(
                now,
                format!("no heartbeat from the warm plane for {late:.1} ms"),
                sh,
            );
        }
        if flipping {
            // Decisions wait for the flip: the phase it continues must not change under it.
            return;
        }
        self.ensure_warm(now, sh);
        self.try_upgrade(now, sh);
        if !self.f.host.digest_interval.is_zero() && now >= self.next_digest {
            self.ask_warm_digests(now, sh);
        }
        if self.f.dpu_only {
            return;
        }
        if let Phase::Active { .. } = self.life.phase {
            if load.hw_util > 1.0
                || (load.dpu_drops > 0 && load.hw_util > self.f.sched.dpu_target_util)
            {
                self.shed(now, &load, sh);
            }
            let (free, headroom) = self.recall_budget(sh);
            sh.send(
                now,
                Channel::Control,
                Msg::Budget {
                    free_entries: free as u64,
                    headroom_pps: headroom,
                },
            );
            if self.win.stats_due(now) {
                sh.send_offload_stats(now);
            }
        }
        let mut decisions = self.win.decide(&load, self.life.plane_view());
        for d in decisions.drain(..) {
            let against_hold = matches!(
                (self.life.hold, &d),
                (
                    Hold::Active,
                    Decision::Release { .. } | Decision::Quota { .. }
                ) | (
                    Hold::Released,
                    Decision::Prepare { .. } | Decision::Activate { .. } | Decision::Quota { .. }
                ) | (
                    Hold::Shadow,
                    Decision::Activate { .. } | Decision::Quota { .. } | Decision::Release { .. }
                )
            );
            if !against_hold {
                self.apply(now, d, sh);
            }
        }
        self.win.give_back(decisions);
        self.enforce_hold(now, sh);
    }

    /// An operator sets (or clears, with [`Hold::Auto`]) a hold on the lifecycle. The DPU takes
    /// the next step towards it at once where one is possible (prepare a plane, activate a
    /// synced one, release an active one), and the rest as the protocol completes.
    pub fn handle_hold(&mut self, now: Instant, hold: Hold, sh: &mut dyn Shards) {
        if hold != self.life.hold {
            self.life.hold = hold;
            self.event(
                now,
                EventKind::Hold,
                format!(
                    "operator set hold {} in {}",
                    hold.name(),
                    self.life.phase.name()
                ),
            );
        }
        self.enforce_hold(now, sh);
    }

    /// The one step the hold asks for in the current phase, if any.
    pub(super) fn enforce_hold(&mut self, now: Instant, sh: &mut dyn Shards) {
        if matches!(self.life.warm, Warm::Flipping { .. }) {
            return; // the flip's phase must not change under it; the next window enforces
        }
        let buckets = self.f.dpu.redirect_buckets;
        let reason = |what: &str| format!("operator hold: {what}");
        match (self.life.hold, self.life.phase) {
            // An operator's plane runs on this host, as it always has: where a plane goes on
            // the remote pool is URSched's rule, which a hold does not ask.
            (Hold::Active, Phase::Idle) => self.apply(
                now,
                Decision::Prepare {
                    workers: self.f.host.workers_initial,
                    cause: crate::ursched::Cause::Operator,
                    reason: reason("activate"),
                    remote: false,
                },
                sh,
            ),
            (Hold::Shadow, Phase::Idle) => self.apply(
                now,
                Decision::Prepare {
                    workers: self.f.host.workers_initial,
                    // A pre-warm is not a trigger: the activation that follows is.
                    cause: crate::ursched::Cause::Memory,
                    reason: reason("prepare (shadow)"),
                    remote: false,
                },
                sh,
            ),
            (Hold::Active, Phase::Shadow { synced: true, .. }) => {
                // The operator's command is the trigger of a warm activation.
                self.life.trigger.get_or_insert(now);
                self.life.quota = buckets;
                self.apply(
                    now,
                    Decision::Activate {
                        reason: reason("activate"),
                    },
                    sh,
                );
            }
            (Hold::Active, Phase::Active { .. }) if self.life.quota < buckets => self.apply(
                now,
                Decision::Quota {
                    buckets,
                    reason: reason("every bucket"),
                },
                sh,
            ),
            (Hold::Released, Phase::Active { .. } | Phase::Shadow { .. }) => self.apply(
                now,
                Decision::Release {
                    reason: reason("release"),
                },
                sh,
            ),
            (
                Hold::Auto | Hold::Active | Hold::Released | Hold::Shadow,
                Phase::Idle
                | Phase::Preparing { .. }
                | Phase::Shadow { .. }
                | Phase::Activating { .. }
                | Phase::Active { .. }
                | Phase::Draining { .. },
            ) => {}
        }
    }

    /// The fast path is over its capacity while the plane is active (established flows grew,
    /// or the DPU took a failed plane's connections back): hand connections of redirected
    /// buckets, entries and all, to the plane until the measured excess is covered. Redirect
    /// rules only catch misses, so without this an overloaded fast path would stay overloaded.
    /// Highest rate first (fewest entries moved) over every shard, ties by connection id; the
    /// recall headroom is zero afterwards, so placement does not bring them straight back.
    pub(super) fn shed(&mut self, now: Instant, load: &Load, sh: &mut dyn Shards) {
        let target = self.f.sched.dpu_target_util * self.f.dpu.hw_pps_limit;
        let excess = load.hw_util * self.f.dpu.hw_pps_limit - target;
        if excess <= 0.0 {
            return;
        }
        let shape = (
            self.life.colour,
            self.life.quota,
            self.f.dpu.redirect_buckets,
        );
        let (moved, shed) = sh.shed(now, shape, excess);
        if moved > 0 {
            self.event(
                now,
                EventKind::Quota,
                format!(
                    "fast path over capacity (util {:.2}): {moved} established connections ({:.2} Mpps) handed to the plane",
                    load.hw_util,
                    shed / 1e6
                ),
            );
        }
    }

    pub(super) fn apply(&mut self, now: Instant, d: Decision, sh: &mut dyn Shards) {
        match (self.life.phase, d) {
            (
                Phase::Idle,
                Decision::Prepare {
                    workers,
                    cause,
                    reason,
                    remote,
                },
            ) => {
                self.life.trigger = matches!(
                    cause,
                    crate::ursched::Cause::Load | crate::ursched::Cause::Operator
                )
                .then_some(now);
                self.life.colour = self.life.issue_colour();
                self.life.phase = Phase::Preparing {
                    colour: self.life.colour,
                };
                self.life.plane_workers = workers;
                // Where is URSched's choice; the node only remembers it (for the warm plane
                // and for URSched's next windows) and passes it on.
                self.life.remote = remote;
                self.life.commands.push_back(Command::StartPlane {
                    slot: self.life.active,
                    workers,
                    remote,
                });
                self.event(
                    now,
                    EventKind::Preparing,
                    format!(
                        "{reason}; starting plane with {workers} workers{}",
                        if remote { " on the remote pool" } else { "" }
                    ),
                );
            }
            (_, Decision::Fallback { reason }) => {
                self.event(now, EventKind::Fallback, reason);
            }
            (
                Phase::Shadow {
                    colour,
                    synced: true,
                },
                Decision::Activate { reason },
            ) => {
                // A warm plane: the activation's trigger is this decision.
                self.life.trigger.get_or_insert(now);
                let live_at = now + self.f.dpu.redirect_latency;
                self.life.phase = Phase::Activating { colour, live_at };
                self.event(now, EventKind::Activating, format!("activated: {reason}"));
            }
            (Phase::Activating { .. }, Decision::Quota { buckets, reason }) => {
                self.life.quota = buckets;
                self.event(
                    now,
                    EventKind::Quota,
                    format!("{buckets} buckets: {reason}"),
                );
            }
            (Phase::Active { .. }, Decision::Quota { buckets, reason }) => {
                let old = self.life.quota;
                self.life.quota = buckets;
                self.event(
                    now,
                    EventKind::Quota,
                    format!("{old} -> {buckets} buckets: {reason}"),
                );
                sh.hand_over_buckets(now, self.life.colour, old, buckets);
            }
            (Phase::Active { .. }, Decision::Workers { workers, reason }) => {
                self.life.plane_workers = workers;
                sh.send(now, Channel::Control, Msg::SetWorkers { workers });
                self.event(
                    now,
                    EventKind::Workers,
                    format!("{workers} workers: {reason}"),
                );
            }
            (Phase::Active { colour }, Decision::Release { reason }) => {
                self.begin_hand_back(now, colour, sh);
                self.event(now, EventKind::Draining, format!("release: {reason}"));
            }
            (Phase::Shadow { .. }, Decision::Release { reason }) => {
                // Nothing was redirected: drop the copies the plane sent and stop it.
                self.go_idle(now, format!("release: {reason}"), false, sh);
            }
            (phase, d) => {
                // URSched only proposes what fits the phase it was shown; anything else is a
                // bug in the scheduler.
                debug_assert!(false, "decision {d:?} in phase {phase:?}");
            }
        }
    }

    /// The recall budget the DPU sends the plane every window (`Msg::Budget`): free hardware
    /// entries and the fast-path headroom left, pps.
    pub fn recall_budget(&self, sh: &mut dyn Shards) -> (usize, f64) {
        sh.budget()
    }
}
