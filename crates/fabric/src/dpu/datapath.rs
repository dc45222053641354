//! The DPU's data path: a train from a VM or the uplink meets the fast path, a redirect rule
//! or the SoC's slow path; a train the plane sends back passes the steering engine again. Each
//! step charges the resource it uses ([`super::resources`]); a delivered train steps its
//! connection's state, and a change is mirrored to the plane.

use spillway_vswitch::Instant;

use super::lifecycle::{DrainStep, Phase};
use super::resources::SocWork;
use super::shard::{DpuShard, ShardView};
use super::{DpuConn, DpuNode, RecallHistory, ResourcesHandle, Role};
use crate::links::{at_ps, ps};
use crate::server::PS_PER_NS;
use crate::stats::FabricDrop;
use crate::types::{Channel, ConnPhase, ConnState, Dest, Kind, Msg, SyncKind, Train};

impl<R: ResourcesHandle> DpuNode<R> {
    /// A train from a VM or the uplink.
    pub fn handle_train(&mut self, now: Instant, t: &Train) {
        let view = self.control.view();
        self.shard_for(t.conn).handle_train(now, t, view);
    }

    /// Packets the last [`DpuNode::handle_train`] or [`DpuNode::handle_msg`] delivered into
    /// their VM or onto the wire at once (for a plane's `Packets`, those the DPU sent on): how a
    /// driver forwarding real frames learns what became of the one it offered (steered packets
    /// are the phy messages it polls; the rest dropped).
    pub fn delivered_last(&self) -> u32 {
        self.shards[self.last].delivered_last
    }
}

impl<R: ResourcesHandle> DpuShard<R> {
    /// A train from a VM or the uplink.
    pub fn handle_train(&mut self, now: Instant, t: &Train, view: ShardView) {
        self.delivered_last = 0;
        self.counters.offered += u64::from(t.packets);
        self.count_tenant(t.tenant, t.packets);
        let fast = self.res.write().offer_fast_path(now, t);
        if let Some(a) = fast {
            self.refuse(t, FabricDrop::HwOverload, t.packets, a.count);
            if a.count < t.packets {
                self.count_tenant_hw_lost(t.tenant, t.packets - a.count);
            }
            if a.count > 0 {
                let sum = a.wait_sum_ps + u64::from(a.count) * self.hw_latency_ps;
                self.deliver(now, t, a.count, sum, true);
                // Payload on the hardware path changes no connection state: the entry's own
                // counters count it, and the SoC's record is left alone (as hardware conntrack
                // offload does). Control packets and the close still step the record.
                if t.kind != Kind::Data {
                    self.update_state(now, t, view);
                }
            }
            return;
        }
        let redirected = view.redirects(t.conn, self.f.dpu.redirect_buckets)
            && !self.f.dpu_only
            && !self.conns.get(&t.conn).is_some_and(DpuConn::stays_on_dpu);
        if redirected {
            self.steer_to_host(now, t);
            return;
        }
        self.slow_path(now, t, false, view);
    }

    pub(super) fn steer_to_host(&mut self, now: Instant, t: &Train) {
        let s = self.res.write().steer(now, t.packets);
        self.refuse(t, FabricDrop::SteerOverload, t.packets, s.count);
        if s.count == 0 {
            if t.kind == Kind::Open {
                self.counters.open_dropped += 1;
            }
            return;
        }
        // A link backed up toward the host backs up into the phy vNIC's ring (PCIe is lossless).
        let room = self.res.write().link_down.room(ps(now));
        let mut part = *t;
        part.packets = s.count.min(room);
        self.refuse(t, FabricDrop::VnicRingFull, s.count, part.packets);
        if part.packets == 0 {
            if t.kind == Kind::Open {
                self.counters.open_dropped += 1;
            }
            return;
        }
        let a = self.res.write().to_host.offer(ps(now), &part);
        self.refuse(t, FabricDrop::VnicRingFull, part.packets, a.count);
        if a.count == 0 {
            if t.kind == Kind::Open {
                self.counters.open_dropped += 1;
            }
            return;
        }
        let l = self
            .res
            .write()
            .link_down
            .cross(a.finish_ps, a.count, t.packet_bytes);
        self.refuse(t, FabricDrop::PcieLinkFull, a.count, l.count);
        if l.count == 0 {
            if t.kind == Kind::Open {
                self.counters.open_dropped += 1;
            }
            return;
        }
        part.packets = l.count;
        self.counters.steered += u64::from(l.count);
        self.steered_active += u64::from(l.count);
        if t.kind == Kind::Open {
            self.counters.steered_new_conn += 1;
        }
        self.counters.pcie_crossings += u64::from(l.count);
        self.send(at_ps(l.finish_ps), Channel::PhyVnic, Msg::Packets(part));
    }

    pub(super) fn slow_path(&mut self, now: Instant, t: &Train, punted: bool, view: ShardView) {
        let known = self.conns.get(&t.conn).copied();
        if t.denied {
            // The policy walk runs, then denies: the SoC pays a new-connection walk.
            let a = self.res.write().soc(now, SocWork::NewConn, t.packets);
            self.refuse(t, FabricDrop::SocQueueFull, t.packets, a.count);
            self.drops.add(FabricDrop::Policy, u64::from(a.count));
            return;
        }
        match known {
            None if t.kind == Kind::Open => {
                if !self.res.write().reserve_conn() {
                    self.drops.add(FabricDrop::MemFull, u64::from(t.packets));
                    self.counters.open_dropped += 1;
                    return;
                }
                let a = self.res.write().soc(now, SocWork::NewConn, t.packets);
                self.refuse(t, FabricDrop::SocQueueFull, t.packets, a.count);
                if a.count == 0 {
                    self.res.write().conn_removed();
                    self.counters.open_dropped += 1;
                    return;
                }
                self.counters.soc_new_conn += 1;
                let state = ConnState::open(now, t);
                // The insert commands leave when the slow path has finished this packet.
                let queued = self.queue_inserts(at_ps(a.finish_ps), t.conn, false);
                self.add_reserved(
                    t.conn,
                    DpuConn {
                        state,
                        role: Role::Owner,
                        hw_live: 0,
                        inserts_pending: queued,
                        recalled: false,
                        hw_pkts_mark: 0,
                        hw_mark_at: Instant::ZERO,
                        history: RecallHistory::Never,
                    },
                );
                self.deliver(now, t, a.count, a.wait_sum_ps, false);
                if view.phase.has_plane() {
                    self.send_sync(now, view.colour, SyncKind::Mirror, state);
                }
            }
            None if !punted
                && matches!(
                    view.phase,
                    Phase::Draining {
                        step: DrainStep::Drain,
                        ..
                    }
                ) =>
            {
                // The redirect rules are gone but the plane still runs: a connection it opened
                // while releasing may be handed over yet. It has the state; send it there.
                self.steer_to_host(now, t);
            }
            None if self.closed_recently.contains(t.conn) => {
                self.drops.add(FabricDrop::AfterClose, u64::from(t.packets));
            }
            None => {
                self.drops.add(FabricDrop::NoState, u64::from(t.packets));
                self.first_no_state.get_or_insert(t.conn);
            }
            Some(c) => {
                let a = self.res.write().soc(now, SocWork::Miss, t.packets);
                self.refuse(t, FabricDrop::SocQueueFull, t.packets, a.count);
                if a.count == 0 {
                    return;
                }
                // An owned connection without entries (handed back by the plane, or refused
                // earlier): the slow path installs them again while the table has room.
                if c.role == Role::Owner
                    && c.hw_live == 0
                    && c.inserts_pending == 0
                    && t.kind != Kind::Close
                    && self.free_entries() >= 2
                {
                    let queued = self.queue_inserts(at_ps(a.finish_ps), t.conn, false);
                    if let Some(r) = self.conns.get_mut(&t.conn) {
                        r.inserts_pending = queued;
                    }
                }
                self.deliver(now, t, a.count, a.wait_sum_ps, false);
                self.update_state(now, t, view);
            }
        }
    }

    /// A delivered train of a connection the DPU serves: step its state; mirror changes to
    /// the plane; a Close removes it.
    pub(super) fn update_state(&mut self, now: Instant, t: &Train, view: ShardView) {
        let has_plane = view.phase.has_plane() && !self.f.dpu_only;
        let Some(c) = self.conns.get_mut(&t.conn) else {
            return;
        };
        if t.kind == Kind::Close {
            let mut st = c.state;
            st.phase = ConnPhase::Closing;
            st.version += 1;
            self.close_conn(now, t.conn);
            if has_plane {
                // Tell the plane to drop its copy.
                self.send_sync(now, view.colour, SyncKind::Closed, st);
            }
            return;
        }
        let changed = c.state.apply(t);
        let st = c.state;
        let kind = if c.role == Role::Owner {
            SyncKind::Mirror
        } else {
            SyncKind::Update
        };
        if changed && has_plane {
            self.send_sync(now, view.colour, kind, st);
        }
    }

    /// Delivers `n` packets of `t` that left the fast path or the SoC `latency_ps_sum` after
    /// arriving at `now` (summed over the packets): into a VM across the PCIe link (its latency
    /// and bandwidth), or out of the uplink.
    pub(super) fn deliver(
        &mut self,
        now: Instant,
        t: &Train,
        n: u32,
        latency_ps_sum: u64,
        hw: bool,
    ) {
        let mut latency_ps_sum = latency_ps_sum;
        let mut extra = 0;
        let mut n = n;
        if t.dest == Dest::Vm {
            // The crossing into the VM starts when the batch's average packet is done.
            let at = ps(now) + latency_ps_sum / u64::from(n.max(1));
            let l = self.res.write().link_down.cross(at, n, t.packet_bytes);
            self.refuse(t, FabricDrop::PcieLinkFull, n, l.count);
            if l.count == 0 {
                return;
            }
            latency_ps_sum = latency_ps_sum / u64::from(n) * u64::from(l.count) + l.wait_sum_ps;
            n = l.count;
            extra = self.pcie_latency_ns;
        }
        self.delivered_last += n;
        let mean_ns = latency_ps_sum / u64::from(n.max(1)) / PS_PER_NS + extra;
        self.tenants.delivered(t.tenant.0, n, mean_ns);
        self.latency.record(mean_ns, u64::from(n));
        self.latency_window.record(mean_ns, u64::from(n));
        self.counters.pcie_crossings += u64::from(n);
        if t.kind == Kind::Close {
            self.counters.closed += 1;
        }
        if hw {
            self.counters.hw_delivered += u64::from(n);
        } else {
            self.counters.soc_delivered += u64::from(n);
        }
    }

    /// Packets the plane processed and sent back (the path without vATC): they pass the
    /// steering engine again (parse + match, no rewrite), then go out of the uplink or, for a
    /// VM, cross the PCIe link a third time into it.
    pub(super) fn handle_returned(&mut self, now: Instant, t: &Train) {
        let s = self.res.write().steer(now, t.packets);
        self.refuse(t, FabricDrop::SteerOverload, t.packets, s.count);
        if s.count == 0 {
            return;
        }
        let (n, mean_done_ps, extra) = if t.dest == Dest::Vm {
            let l = self
                .res
                .write()
                .link_down
                .cross(s.finish_ps, s.count, t.packet_bytes);
            self.refuse(t, FabricDrop::PcieLinkFull, s.count, l.count);
            if l.count == 0 {
                return;
            }
            let mean = s.finish_ps + l.wait_sum_ps / u64::from(l.count);
            (l.count, mean, self.pcie_latency_ns)
        } else {
            let mean = ps(now) + s.wait_sum_ps / u64::from(s.count);
            (s.count, mean, 0)
        };
        let lat = (mean_done_ps / PS_PER_NS).saturating_sub(t.born.0) + extra;
        self.tenants.delivered(t.tenant.0, n, lat);
        self.latency.record(lat, u64::from(n));
        self.latency_window.record(lat, u64::from(n));
        self.counters.host_out += u64::from(n);
        self.delivered_last += n;
        if t.kind == Kind::Close {
            self.counters.closed += 1;
        }
        // The crossing back (counted here, where it lands), and for a VM the one into it.
        let crossings = if t.dest == Dest::Vm { 2 } else { 1 };
        self.counters.pcie_crossings += u64::from(n) * crossings;
    }
}
