//! The DPU's lifecycle as data: the phase (see the diagram in the [`crate::dpu`] module doc),
//! the operator's hold, the activation's colour and overflow quota, what the DPU last heard
//! from the plane, and the events and plane commands a transition emits.
//!
//! The transitions themselves are the node's (they move connection records and send sync
//! messages); this object owns the state they move between. What the data path needs of it
//! (is this bucket redirected?) it reads from a [`super::shard::ShardView`], a copy of the
//! phase, colour and quota, without reaching into the rest of the node.

use std::collections::VecDeque;

use spillway_vswitch::Instant;

use crate::types::{Colour, PlaneSlot};
use crate::ursched::PlaneView;

/// A lifecycle change, with its reason (URSched's, or the protocol step's).
#[derive(Clone, Debug, PartialEq)]
pub struct FabricEvent {
    /// When.
    pub at: Instant,
    /// The phase entered, or what changed.
    pub what: EventKind,
    /// Why.
    pub reason: String,
    /// For [`EventKind::Active`] and [`EventKind::Absorbing`]: when the decision that led to
    /// it was taken (URSched's or the operator's; the prepare decision of a cold start, the
    /// activate decision of a warm plane).
    pub since: Option<Instant>,
}

/// What a [`FabricEvent`] records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EventKind {
    /// Plane requested (Idle -> Preparing).
    Preparing,
    /// Plane up; bulk sync started (Preparing -> Shadow).
    Shadow,
    /// Bulk sync acknowledged.
    Synced,
    /// Redirect rules requested (Shadow -> Activating).
    Activating,
    /// Redirect rules live (Activating -> Active).
    Active,
    /// First redirected packet served by the plane (the overflow is being absorbed).
    Absorbing,
    /// Overflow quota changed.
    Quota,
    /// Worker count changed.
    Workers,
    /// Release started (Active -> Draining).
    Draining,
    /// Redirect rules removed.
    RedirectRemoved,
    /// Back to Idle, host resources released.
    Idle,
    /// The plane failed or stalled; traffic fell back to the DPU.
    FailOpen,
    /// Pressure but no safe host capacity, and no remote pool cores granted yet.
    Fallback,
    /// An operator set or cleared a hold on the lifecycle ([`crate::dpu::DpuNode::handle_hold`]).
    Hold,
    /// The active plane failed or stalled and the redirect rules were flipped to the warm
    /// plane's slot, which continues every connection with its state.
    FailOver,
    /// The warm standby plane changed: started, synced, failed.
    Warm,
    /// An operator asked for an online upgrade ([`crate::dpu::DpuNode::handle_upgrade`]), and
    /// it was taken: the time the upgrade's figures count from.
    UpgradeAsked,
    /// A step of an online upgrade: the active plane hands back, the rules flip to the new
    /// plane, the old one retires; or the upgrade was refused or abandoned.
    Upgrade,
    /// An online upgrade finished: the old plane stopped.
    Upgraded,
}

impl EventKind {
    /// Lowercase name for reports.
    pub fn name(self) -> &'static str {
        match self {
            EventKind::Preparing => "preparing",
            EventKind::Shadow => "shadow",
            EventKind::Synced => "synced",
            EventKind::Activating => "activating",
            EventKind::Active => "active",
            EventKind::Absorbing => "absorbing",
            EventKind::Quota => "quota",
            EventKind::Workers => "workers",
            EventKind::Draining => "draining",
            EventKind::RedirectRemoved => "redirect_removed",
            EventKind::Idle => "idle",
            EventKind::FailOpen => "fail_open",
            EventKind::Fallback => "fallback",
            EventKind::Hold => "hold",
            EventKind::FailOver => "fail_over",
            EventKind::Warm => "warm",
            EventKind::UpgradeAsked => "upgrade_asked",
            EventKind::Upgrade => "upgrade",
            EventKind::Upgraded => "upgraded",
        }
    }
}

/// A command to the driver about the plane's process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    /// Start a plane in `slot` with `workers` workers on isolated cores; report
    /// [`crate::dpu::DpuNode::handle_plane_up_in`] when it runs.
    StartPlane {
        /// The slot (vNIC set) it serves.
        slot: PlaneSlot,
        /// Workers.
        workers: u32,
        /// Start it on the remote pool host that granted this host cores
        /// ([`crate::dpu::DpuNode::set_remote_grant`]), not on this host. URSched chooses
        /// where a plane runs when it prepares it; a warm standby plane (and an upgrade's new
        /// plane) is started where the active one runs, so a flip never moves the overflow
        /// between hosts.
        remote: bool,
    },
    /// Stop the plane in `slot` and release its cores. This also fences it: whatever it sends
    /// from now on is not the state of any connection (a stalled plane that resumes).
    StopPlane {
        /// The slot.
        slot: PlaneSlot,
        /// The plane failed (it died, or missed its heartbeats: stalled or starved): nothing
        /// it still holds is worth waiting for, so it is killed at once rather than asked to
        /// finish, and what it never took from its vNICs may be taken back and served again.
        /// False for a plane stopped in order (released, retired after an upgrade, a warm
        /// plane no longer wanted), which finishes what is in flight first.
        failed: bool,
    },
}

/// The warm standby plane in the slot that is not active (`host.warm_standby`).
///
/// ```text
///         plane up (ensure_warm)      plane up            every shard's marker acked
///   Off ----------------------> Starting ---------> Syncing -----------------------> Ready
///    ^                                                 |                               |
///    +------ failed, or the DPU went Idle -------------+-------------------------------+
///    ^                                                                                 |
///    +--- flip done (the warm slot is active now) <--- Flipping <--- active failed ---+
/// ```
///
/// Off at start, when warm standby is off, when no plane is up, after a flip, and when the
/// warm plane failed (its replacement is asked for at the next window). Starting only from
/// Off; Syncing only from Starting; Ready only from Syncing; Flipping only from Ready.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Warm {
    /// No warm plane.
    Off,
    /// Asked for ([`Command::StartPlane`] for the other slot); not up yet.
    Starting {
        /// The colour its bulk sync will carry.
        colour: Colour,
    },
    /// Up; its bulk sync is under way and every state message is relayed to it.
    Syncing {
        /// Colour.
        colour: Colour,
    },
    /// Synced and kept current: a failover can flip to it.
    Ready {
        /// Colour.
        colour: Colour,
    },
    /// The active plane failed and the redirect rules are being flipped to this one; live at
    /// `live_at`. Until then redirected packets still go to the failed slot.
    Flipping {
        /// Colour.
        colour: Colour,
        /// When the flip is live.
        live_at: Instant,
    },
}

/// An online upgrade (`spillway ctl upgrade`): the plane in the warm slot (the new version)
/// replaces the active one without a failure.
///
/// ```text
///          upgrade asked           warm plane ready           every shard's Released
///   None -----------------> Pending ----------------> Releasing ----------------------+
///    ^                                                                                |
///    |   old plane stopped                            flip live                       v
///    +------------------- Retiring <------------------------------------------- (Flipping)
/// ```
///
/// Releasing: the active plane hands every connection back to the DPU (a release's first
/// step, its redirect rules kept), so that at the flip the DPU owns everything and hands the
/// redirected buckets' connections to the new plane. Retiring: the old plane finishes what is
/// in flight (its packets are served, its state taken as an orphan's) and is stopped at
/// `at`. A failure of either plane during an upgrade fails open, which ends it. Pending is
/// entered from None only, Releasing from Pending or None, Retiring from Releasing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Upgrade {
    /// No upgrade.
    None,
    /// Waiting for a warm plane to be ready.
    Pending,
    /// The active plane is handing its connections back; the flip follows.
    Releasing,
    /// The old plane in `slot` finishes what is in flight until `at`, then stops.
    Retiring {
        /// Its slot.
        slot: PlaneSlot,
        /// When it is stopped.
        at: Instant,
    },
}

impl Warm {
    /// Lowercase name.
    pub fn name(self) -> &'static str {
        match self {
            Warm::Off => "off",
            Warm::Starting { .. } => "starting",
            Warm::Syncing { .. } => "syncing",
            Warm::Ready { .. } => "ready",
            Warm::Flipping { .. } => "flipping",
        }
    }
}

impl Upgrade {
    /// Lowercase name.
    pub fn name(self) -> &'static str {
        match self {
            Upgrade::None => "none",
            Upgrade::Pending => "pending",
            Upgrade::Releasing => "releasing",
            Upgrade::Retiring { .. } => "retiring",
        }
    }
}

/// An operator's hold on the lifecycle (`spillway ctl activate | release | auto`). While a hold
/// is set, URSched's decisions against it are dropped and the DPU moves towards the held state
/// by the same transitions URSched would use; a fail-open under `Active` is followed by a fresh
/// plane at the next window (the fabric recovers without the operator).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Hold {
    /// No hold: URSched decides.
    #[default]
    Auto,
    /// Keep a plane active with every bucket redirected.
    Active,
    /// Keep the plane released.
    Released,
    /// Keep a plane prepared (started, bulk-synced, in shadow) but not active: a pre-warm, so
    /// that a later activation only installs the redirect rules.
    Shadow,
}

impl Hold {
    /// Lowercase name.
    pub fn name(self) -> &'static str {
        match self {
            Hold::Auto => "auto",
            Hold::Active => "active",
            Hold::Released => "released",
            Hold::Shadow => "shadow",
        }
    }
}

/// Lifecycle phase. See the module doc's diagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// No plane. Entered at start, from `Draining` when the plane drained, from `Shadow` when
    /// it is released before activation, and from every state with a plane on a fail-open.
    Idle,
    /// Plane starting (URSched's or an operator's prepare). Entered only from `Idle`.
    Preparing {
        /// Colour of this activation.
        colour: Colour,
    },
    /// Plane up, bulk sync running or done; forwarding untouched. Entered only from
    /// `Preparing`, at the plane's first heartbeat (or the driver's report that it runs).
    Shadow {
        /// Colour.
        colour: Colour,
        /// The plane acknowledged the bulk sync of this colour.
        synced: bool,
    },
    /// Redirect rules being installed. Entered only from a synced `Shadow`.
    Activating {
        /// Colour.
        colour: Colour,
        /// When they are live.
        live_at: Instant,
    },
    /// Redirect rules live. Entered only from `Activating`, when the rules are.
    Active {
        /// Colour.
        colour: Colour,
    },
    /// Releasing: hand back, remove the redirect rules, drain. Entered only from `Active`.
    Draining {
        /// Colour.
        colour: Colour,
        /// Where the release is.
        step: DrainStep,
    },
}

/// Steps of a release.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DrainStep {
    /// Waiting for the plane to hand every connection back.
    HandBack,
    /// Redirect rules being removed; live until `done_at`.
    RemoveRedirect {
        /// When they are gone.
        done_at: Instant,
    },
    /// Waiting for the plane's in-flight packets.
    Drain,
}

impl Phase {
    /// Lowercase name.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Idle => "idle",
            Phase::Preparing { .. } => "preparing",
            Phase::Shadow { .. } => "shadow",
            Phase::Activating { .. } => "activating",
            Phase::Active { .. } => "active",
            Phase::Draining { .. } => "draining",
        }
    }

    pub(crate) fn has_plane(self) -> bool {
        !matches!(self, Phase::Idle | Phase::Preparing { .. })
    }

    /// Redirect rules steer packets.
    pub fn redirect_live(self) -> bool {
        matches!(
            self,
            Phase::Active { .. }
                | Phase::Draining {
                    step: DrainStep::HandBack | DrainStep::RemoveRedirect { .. },
                    ..
                }
        )
    }
}

/// The lifecycle's state. See the module doc.
#[derive(Debug)]
pub(crate) struct Lifecycle {
    pub(crate) phase: Phase,
    pub(crate) hold: Hold,
    /// The colour of the active slot's plane (a new one at every prepare, and the warm
    /// plane's at a flip): what the DPU's state messages carry, and older than which a state
    /// message is an orphan's.
    pub(crate) colour: Colour,
    /// The last colour given to a plane (the active's or the warm one's).
    pub(crate) issued: Colour,
    /// The slot whose plane the redirect rules steer to.
    pub(crate) active: PlaneSlot,
    /// The warm standby plane, in the other slot.
    pub(crate) warm: Warm,
    /// The warm plane's last heartbeat (or start).
    pub(crate) warm_heartbeat: Instant,
    /// An online upgrade under way.
    pub(crate) upgrade: Upgrade,
    /// When a release's drain step gives up waiting for the plane (`dpu.drain_timeout`).
    pub(crate) drain_deadline: Option<Instant>,
    /// Redirected buckets (the overflow quota).
    pub(crate) quota: u16,
    /// When the decision behind the activation under way was taken (for the time to absorb).
    pub(crate) trigger: Option<Instant>,
    /// The plane reported its first redirected packet in this activation.
    pub(crate) absorbed: bool,
    /// The plane's last heartbeat (or start).
    pub(crate) last_heartbeat: Instant,
    /// Workers the plane runs (its last heartbeat, or what was asked of it).
    pub(crate) plane_workers: u32,
    /// The plane runs on a remote pool host (URSched's prepare said so), not on this host.
    /// Set at every prepare and false in Idle; a flip or an upgrade keeps it, since the warm
    /// plane is started where the active one runs.
    pub(crate) remote: bool,
    /// The plane's utilisation in its last heartbeat.
    pub(crate) plane_util: f64,
    pub(crate) events: VecDeque<FabricEvent>,
    pub(crate) commands: VecDeque<Command>,
}

impl Lifecycle {
    pub(crate) fn new() -> Lifecycle {
        Lifecycle {
            phase: Phase::Idle,
            hold: Hold::Auto,
            colour: Colour(0),
            issued: Colour(0),
            active: PlaneSlot(0),
            warm: Warm::Off,
            warm_heartbeat: Instant::ZERO,
            upgrade: Upgrade::None,
            drain_deadline: None,
            quota: 0,
            trigger: None,
            absorbed: false,
            last_heartbeat: Instant::ZERO,
            plane_workers: 0,
            remote: false,
            plane_util: 0.0,
            events: VecDeque::new(),
            commands: VecDeque::new(),
        }
    }

    /// Records a lifecycle event.
    pub(crate) fn event(&mut self, at: Instant, what: EventKind, reason: impl Into<String>) {
        self.events.push_back(FabricEvent {
            at,
            what,
            reason: reason.into(),
            since: None,
        });
    }

    /// The plane as URSched sees it.
    pub(crate) fn plane_view(&self) -> PlaneView {
        let remote = self.remote;
        match self.phase {
            Phase::Idle => PlaneView::Idle,
            Phase::Preparing { .. } => PlaneView::Preparing {
                synced: false,
                remote,
            },
            Phase::Shadow { synced, .. } => PlaneView::Preparing { synced, remote },
            Phase::Activating { .. } | Phase::Draining { .. } => PlaneView::Busy,
            Phase::Active { .. } => PlaneView::Active { remote },
        }
    }

    /// A new colour for a plane being started.
    pub(crate) fn issue_colour(&mut self) -> Colour {
        self.issued = Colour(self.issued.0 + 1);
        self.issued
    }

    /// The lifecycle's next timer: redirect rules going live, gone, or flipped.
    pub(crate) fn next_timer(&self) -> Option<Instant> {
        let phase = match self.phase {
            Phase::Activating { live_at, .. } => Some(live_at),
            Phase::Draining {
                step: DrainStep::RemoveRedirect { done_at },
                ..
            } => Some(done_at),
            Phase::Draining {
                step: DrainStep::Drain | DrainStep::HandBack,
                ..
            } => self.drain_deadline,
            Phase::Idle | Phase::Preparing { .. } | Phase::Shadow { .. } | Phase::Active { .. } => {
                None
            }
        };
        let warm = match self.warm {
            Warm::Flipping { live_at, .. } => Some(live_at),
            Warm::Off | Warm::Starting { .. } | Warm::Syncing { .. } | Warm::Ready { .. } => None,
        };
        let retire = match self.upgrade {
            Upgrade::Retiring { at, .. } => Some(at),
            Upgrade::None | Upgrade::Pending | Upgrade::Releasing => None,
        };
        [phase, warm, retire].into_iter().flatten().min()
    }
}
