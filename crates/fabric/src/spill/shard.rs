//! One shard of the spill plane: the records of its connections, what it has on the fast
//! path, its outbox, its counters, drops and latency. See the [module](super) for the split.

use std::collections::BTreeMap;

use spillway_vswitch::Instant;

use super::{SpillConn, SpillCounters};
use crate::links::{PcieLink, PhyVnic, at_ps, ps};
use crate::params::{FabricParams, ns};
use crate::placement::{Candidate, Offloaded};
use crate::records::{Outbox, Records, Role};
use crate::server::{Ledger, PS_PER_NS, Server};
use crate::stats::{Drops, FabricDrop, LatencyHist, TenantStats};
use crate::types::{
    Channel, Colour, ConnId, ConnPhase, ConnState, Dest, Kind, Msg, SyncKind, Train, Transmit,
};

/// What a shard knows of the plane's lifecycle: the control part's, passed with every input
/// so that a shard keeps no copy that could go stale.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PlaneView {
    /// The newest activation the plane has heard of.
    pub colour: Colour,
    /// Serving redirected traffic (`Msg::Activated`).
    pub active: bool,
    /// Handing everything back (`Msg::Release`).
    pub releasing: bool,
    /// VM-bound packets go straight into VM memory.
    pub vatc: bool,
}

/// What the plane's shards share, as the DPU's shards share its `Resources`: one budget each,
/// whatever the number of shards. A shard charges it per train.
#[derive(Debug)]
pub struct PlaneResources {
    /// The workers.
    pub(crate) workers: Server,
    /// The phy vNIC toward the DPU.
    pub(crate) to_dpu: PhyVnic,
    /// The PCIe link toward the DPU.
    pub(crate) link_up: PcieLink,
    /// Most jobs one tenant may hold in the workers' queue (`host.tenant_worker_share` of
    /// it); `None` when the share is off.
    tenant_cap: Option<u32>,
    /// Each tenant's jobs in the workers' queue, while the share is on: one entry per tenant
    /// that offered (kept when empty, so that a tenant at its share allocates nothing per
    /// packet; cleared when the workers fail or the plane stops).
    tenant_queues: BTreeMap<u32, Ledger>,
}

impl PlaneResources {
    /// `workers` workers, and the plane's side of the phy vNIC and the link.
    pub fn new(f: &FabricParams, workers: u32) -> PlaneResources {
        PlaneResources {
            workers: Server::new(workers, f.pcie.phy_vnic_ring),
            to_dpu: PhyVnic::new(f),
            link_up: PcieLink::new(f),
            tenant_cap: (f.host.tenant_worker_share < 1.0).then(|| {
                ((f64::from(f.pcie.phy_vnic_ring) * f.host.tenant_worker_share).ceil() as u32)
                    .max(1)
            }),
            tenant_queues: BTreeMap::new(),
        }
    }

    /// Offers `count` packets of `tenant` at `cost_ps` each to the workers, first held to the
    /// tenant's share of their queue. Returns what the share let through (the rest is the
    /// tenant's to drop) and what the workers admitted of it.
    fn offer_workers(
        &mut self,
        now_ps: u64,
        tenant: u32,
        count: u32,
        cost_ps: u64,
    ) -> (u32, crate::server::Admitted) {
        let Some(cap) = self.tenant_cap else {
            return (count, self.workers.offer(now_ps, count, cost_ps));
        };
        let ledger = self.tenant_queues.entry(tenant).or_default();
        let allowed = count.min(cap.saturating_sub(ledger.queued(now_ps)));
        let a = self.workers.offer(now_ps, allowed, cost_ps);
        ledger.push(&a);
        (allowed, a)
    }

    /// The workers failed: every job is gone, every tenant's with them.
    pub(crate) fn fail_workers(&mut self, now_ps: u64) -> u32 {
        self.tenant_queues.clear();
        self.workers.fail(now_ps)
    }

    /// Packets of `t` leave for the DPU at `at_ps`: the phy vNIC toward the DPU, then the PCIe
    /// link toward it (the driver adds `pcie.latency`). Returns how many got through and when
    /// the last left; the rest are dropped with their reason into `drops`, and against their
    /// tenant into `tenants`.
    fn cross_back(
        &mut self,
        at_ps_: u64,
        t: &Train,
        drops: &mut Drops,
        tenants: &mut TenantStats,
    ) -> Option<(u32, Instant)> {
        // A link backed up toward the DPU backs up into the phy vNIC's ring (PCIe is lossless).
        let mut part = *t;
        part.packets = t.packets.min(self.link_up.room(at_ps_));
        let v = self.to_dpu.offer(at_ps_, &part);
        drops.add_refused(FabricDrop::VnicRingFull, t.packets, v.count);
        tenants.lost(t.tenant.0, t.packets - v.count);
        if v.count == 0 {
            return None;
        }
        let l = self.link_up.cross(v.finish_ps, v.count, t.packet_bytes);
        drops.add_refused(FabricDrop::PcieLinkFull, v.count, l.count);
        tenants.lost(t.tenant.0, v.count - l.count);
        (l.count > 0).then(|| (l.count, at_ps(l.finish_ps)))
    }

    /// The workers.
    pub fn workers(&self) -> &Server {
        &self.workers
    }

    /// When the workers and the phy vNIC toward the DPU are idle, ps.
    pub fn idle_at_ps(&self) -> u64 {
        self.workers
            .busy_until_ps()
            .max(self.to_dpu.busy_until_ps())
    }
}

/// How the plane's control part and shards reach the one [`PlaneResources`]: owned by a plane
/// whose shards are all in one thread, behind a lock (the driver's) when shards run on
/// threads of their own. A caller takes a guard for one charge and drops it before anything
/// else runs, so a handle behind a lock cannot deadlock on it.
pub trait PlaneResourcesHandle: core::fmt::Debug {
    /// Read access.
    type Read<'a>: core::ops::Deref<Target = PlaneResources>
    where
        Self: 'a;
    /// Write access.
    type Write<'a>: core::ops::DerefMut<Target = PlaneResources>
    where
        Self: 'a;
    /// The resources, to read.
    fn read(&self) -> Self::Read<'_>;
    /// The resources, to charge.
    fn write(&mut self) -> Self::Write<'_>;
}

/// A plane's own resources: every shard in one thread (the simulator, and the real-time plane
/// of one thread).
impl PlaneResourcesHandle for PlaneResources {
    type Read<'a> = &'a PlaneResources;
    type Write<'a> = &'a mut PlaneResources;
    fn read(&self) -> &PlaneResources {
        self
    }
    fn write(&mut self) -> &mut PlaneResources {
        self
    }
}

/// How the control part reaches the shards it does not hold: one request to one shard, one
/// reply (a driver carries it to the shard's thread and back).
pub trait PlaneShards: core::fmt::Debug {
    /// How many shards this transport reaches.
    fn count(&self) -> usize;
    /// Asks shard `shard` (of this transport's, from 0) and returns its reply.
    fn call(&mut self, shard: usize, req: PlaneRequest) -> PlaneReply;
}

/// One thing the control part asks of one shard. The driver carries it to the shard (a call
/// in one thread, a message between threads) and brings the reply back.
#[derive(Debug)]
pub enum PlaneRequest {
    /// A message of the control part's own (heartbeats, deletes) onto this shard's outbox.
    /// [`PlaneReply::Done`].
    Send {
        /// When it leaves.
        at: Instant,
        /// On which channel.
        channel: Channel,
        /// What.
        msg: Msg,
    },
    /// A placement tick: every record's counters become its features for the tick ending at
    /// `now`; measured owners are appended to `cands`, the entries on the fast path to
    /// `offl`, and the connections closed since the last tick to `closed` (for the policy).
    /// The vectors travel with the request and come back. [`PlaneReply::Tick`].
    Tick {
        /// When.
        now: Instant,
        /// The candidates.
        cands: Vec<Candidate>,
        /// The offloaded entries.
        offl: Vec<Offloaded>,
        /// Closed connections.
        closed: Vec<ConnId>,
    },
    /// Recall `conn` onto the fast path, on the shard's flow vNIC. [`PlaneReply::Done`].
    Recall {
        /// When.
        now: Instant,
        /// Which.
        conn: ConnId,
        /// Its rate.
        pps: f64,
        /// The rate of what it replaces.
        replaces_pps: f64,
    },
    /// Recall `conn` in a swap: take the recall's step (the shard keeps a copy) and return the
    /// message rather than send it, for the control part to send behind the adoption of the
    /// demoted connection, on that connection's shard's control channel. [`PlaneReply::Msg`].
    SwapRecall {
        /// Which.
        conn: ConnId,
        /// Its rate.
        pps: f64,
        /// The rate of what it replaces.
        replaces_pps: f64,
    },
    /// A demotion of `conn` was acknowledged: it is off the fast path, and the plane owns it
    /// if the DPU sent its state. [`PlaneReply::Done`].
    Demoted {
        /// When.
        now: Instant,
        /// Which.
        conn: ConnId,
        /// Its state, if the DPU handed it over.
        state: Option<ConnState>,
    },
    /// Release: hand every owned connection back, then `Msg::Released` behind them on the
    /// flow vNIC. [`PlaneReply::Done`].
    Release {
        /// When.
        now: Instant,
        /// The activation released.
        colour: Colour,
        /// The colour the handovers carry (the newest the plane has heard of).
        sync_colour: Colour,
    },
    /// The DPU's `Msg::Drain` for this shard, if it reached the control part: see
    /// `PlaneShard::drain`. [`PlaneReply::Done`].
    Drain {
        /// When.
        now: Instant,
        /// The activation drained.
        colour: Colour,
        /// When the workers and the phy vNIC are idle, ps.
        host_idle_ps: u64,
        /// Packets the DPU shard steered to this plane (the drain fence).
        packets: u64,
    },
    /// The process stopped: forget everything. [`PlaneReply::Done`].
    Stop,
    /// The DPU's [`Msg::DigestAsk`] for this shard, if it reached the control part.
    /// [`PlaneReply::Done`].
    Digest {
        /// When.
        now: Instant,
        /// The colour asked with.
        colour: Colour,
        /// The round asked with.
        round: u16,
    },
    /// The DPU's [`Msg::Resync`] of a bucket of this shard, if it reached the control part.
    /// [`PlaneReply::Done`].
    Resync {
        /// The bucket.
        bucket: u16,
    },
    /// The DPU's [`Msg::Remirror`] of a bucket of this shard, if it reached the control part.
    /// [`PlaneReply::Done`].
    Remirror {
        /// When.
        now: Instant,
        /// The plane's colour.
        colour: Colour,
        /// The bucket.
        bucket: u16,
    },
    /// The DPU's [`Msg::SendBack`] of a bucket of this shard, if it reached the control part.
    /// [`PlaneReply::Done`].
    SendBack {
        /// When.
        now: Instant,
        /// The activation released.
        colour: Colour,
        /// The bucket.
        bucket: u16,
    },
    /// Acknowledge the end of the DPU's bulk sync on this shard's flow vNIC, if it reached the
    /// control part rather than the shard. [`PlaneReply::Done`].
    AckSync {
        /// When.
        now: Instant,
        /// Colour of the round.
        colour: Colour,
        /// States sent.
        count: u64,
    },
}

/// A shard's answer to a [`PlaneRequest`].
#[derive(Debug)]
pub enum PlaneReply {
    /// Done.
    Done,
    /// A message for the control part to send (none: the request took no effect).
    Msg(Option<Msg>),
    /// A tick's vectors, filled.
    Tick {
        /// The candidates.
        cands: Vec<Candidate>,
        /// The offloaded entries.
        offl: Vec<Offloaded>,
        /// Closed connections.
        closed: Vec<ConnId>,
    },
}

/// One shard of the plane. See the module doc.
#[derive(Debug)]
pub struct PlaneShard {
    /// Its index, which its end markers carry.
    index: u16,
    /// `dpu.redirect_buckets`: what digests and resyncs are per.
    buckets: u16,
    tick: core::time::Duration,
    flow_cache_max: usize,
    pkt_ps: u64,
    new_ps: u64,
    /// vATC: fixed cost per packet (copy setup plus the expected miss cost), ps.
    vatc_ps: u64,
    /// vATC: copy cost per byte, ps.
    copy_ps_per_byte: f64,
    vatc_hit_ratio: f64,
    /// Expected translation misses not yet counted whole.
    atc_miss_acc: f64,
    pub(super) conns: Records<SpillConn>,
    /// Every connection this shard handed back to the DPU since it started releasing: what
    /// its sync-back digest covers and a `Msg::SendBack` sends again.
    handed: Vec<ConnId>,
    /// This shard's connections on the fast path, with their last measured rate.
    offloaded: BTreeMap<ConnId, f64>,
    /// Connections closed since the last tick: the placement policy forgets them.
    closed: Vec<ConnId>,
    absorbed_sent: bool,
    /// Packets received from the DPU since the process started (the drain fence's count).
    rx_active: u64,
    /// A drain waiting for the packets the DPU steered here: its colour and their count.
    drain_fence: Option<(Colour, u64)>,
    pub(super) first_no_state: Option<ConnId>,
    out: Outbox,
    pub(super) counters: SpillCounters,
    /// Packets the current input sent the vATC way.
    pub(super) direct_last: u32,
    pub(super) drops: Drops,
    pub(super) latency: LatencyHist,
    /// Delivery, loss and latency by tenant.
    pub(super) tenants: TenantStats,
}

impl PlaneShard {
    /// Shard `index` of `shards` of a plane with parameters `f`: its flow cache is its share
    /// of `host.flow_cache_max` (each shard keeps its own, as a PMD thread keeps its own
    /// exact-match cache).
    pub fn new(f: &FabricParams, index: u16, shards: usize) -> PlaneShard {
        let per_ps = |d: core::time::Duration| ns(d) * PS_PER_NS;
        PlaneShard {
            index,
            buckets: f.dpu.redirect_buckets,
            tick: f.placement.tick,
            flow_cache_max: f.host.flow_cache_max / shards.max(1),
            pkt_ps: per_ps(f.host.pkt_cost),
            new_ps: per_ps(f.host.new_conn_cost),
            vatc_ps: per_ps(f.host.vatc_copy_cost)
                + ((1.0 - f.host.vatc_hit_ratio) * per_ps(f.host.vatc_miss_cost) as f64) as u64,
            copy_ps_per_byte: 1e12 / f.host.copy_bandwidth_bytes,
            vatc_hit_ratio: f.host.vatc_hit_ratio,
            atc_miss_acc: 0.0,
            conns: Records::new(11),
            handed: Vec::new(),
            offloaded: BTreeMap::new(),
            closed: Vec::new(),
            absorbed_sent: false,
            rx_active: 0,
            drain_fence: None,
            first_no_state: None,
            out: Outbox::new(f),
            counters: SpillCounters::default(),
            direct_last: 0,
            drops: Drops::default(),
            latency: LatencyHist::default(),
            tenants: TenantStats::default(),
        }
    }

    /// The next message for the DPU.
    #[inline]
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.out.pop()
    }

    /// The shard's record of `conn`.
    pub fn conn(&self, conn: ConnId) -> Option<&SpillConn> {
        self.conns.get(&conn)
    }

    /// Packets the last [`PlaneShard::handle_msg`] sent the vATC way.
    pub fn direct_last(&self) -> u32 {
        self.direct_last
    }

    /// Its counters.
    pub fn counters(&self) -> &SpillCounters {
        &self.counters
    }

    /// Drops by reason.
    pub fn drops(&self) -> &Drops {
        &self.drops
    }
    /// Records held.
    pub fn conns_len(&self) -> usize {
        self.conns.len()
    }

    /// Answers a request of the control part.
    pub fn serve(&mut self, req: PlaneRequest) -> PlaneReply {
        match req {
            PlaneRequest::Send { at, channel, msg } => self.out.send(at, channel, msg),
            PlaneRequest::Tick {
                now,
                mut cands,
                mut offl,
                mut closed,
            } => {
                self.tick(now, &mut cands);
                // The tenant from the copy the plane keeps of a recalled connection.
                let conns = &self.conns;
                offl.extend(self.offloaded.iter().map(|(&conn, &pps)| {
                    Offloaded {
                        conn,
                        tenant: conns
                            .get(&conn)
                            .map_or(spillway_vswitch::TenantId(0), |c| c.state.tenant),
                        pps,
                    }
                }));
                closed.append(&mut self.closed);
                return PlaneReply::Tick {
                    cands,
                    offl,
                    closed,
                };
            }
            PlaneRequest::Recall {
                now,
                conn,
                pps,
                replaces_pps,
            } => {
                if let Some(msg) = self.take_recall(conn, pps, replaces_pps) {
                    self.out.send_flow(now, msg);
                }
            }
            PlaneRequest::SwapRecall {
                conn,
                pps,
                replaces_pps,
            } => return PlaneReply::Msg(self.take_recall(conn, pps, replaces_pps)),
            PlaneRequest::Demoted { now, conn, state } => {
                self.offloaded.remove(&conn);
                if let Some(st) = state {
                    self.out.send(now, Channel::Control, Msg::Adopted { conn });
                    self.conns
                        .insert(conn, SpillConn::new(st, Role::Owner, now));
                }
            }
            PlaneRequest::Release {
                now,
                colour,
                sync_colour,
            } => {
                let owned = self.conns.keys_where(|_, c| c.role == Role::Owner);
                let count = owned.len() as u64;
                for conn in owned {
                    self.hand_over(now, sync_colour, conn);
                }
                // On the flow vNIC, after the handovers, so the DPU has them all first: this
                // shard's digest of what it handed back (the DPU compares at `Released`).
                self.send_back_digests(now, colour);
                let at = self.out.flow_idle_at(now);
                let done = Msg::Released {
                    colour,
                    count,
                    shard: self.index,
                };
                self.out.send(at, Channel::FlowVnic, done);
            }
            PlaneRequest::Drain {
                now,
                colour,
                host_idle_ps,
                packets,
            } => self.drain(now, colour, packets, host_idle_ps),
            PlaneRequest::AckSync { now, colour, count } => {
                let msg = Msg::SyncDone {
                    colour,
                    count,
                    shard: self.index,
                };
                self.out.send_flow(now, msg);
            }
            PlaneRequest::Digest { now, colour, round } => self.send_digests(now, colour, round),
            PlaneRequest::Resync { bucket } => self.resync(bucket),
            PlaneRequest::SendBack {
                now,
                colour,
                bucket,
            } => self.send_back(now, colour, bucket),
            PlaneRequest::Remirror {
                now,
                colour,
                bucket,
            } => self.remirror(now, colour, bucket),
            PlaneRequest::Stop => {
                self.handed.clear();
                self.rx_active = 0;
                self.drain_fence = None;
                self.conns.clear();
                self.offloaded.clear();
                self.closed.clear();
                self.out.clear();
                self.absorbed_sent = false;
            }
        }
        PlaneReply::Done
    }

    /// A message from the DPU about one of this shard's connections ([`Msg::conn`]), or the
    /// end of a bulk sync on its flow vNIC. `res` is the plane's, charged per train.
    #[inline]
    pub fn handle_msg(
        &mut self,
        now: Instant,
        msg: Msg,
        view: &PlaneView,
        res: &mut PlaneResources,
    ) {
        self.direct_last = 0;
        match msg {
            Msg::Packets(t) => {
                self.handle_packets(now, &t, view, res);
                // The last packet a pending drain waited for: answer it now, behind whatever
                // this packet made the shard send.
                if let Some((colour, packets)) = self.drain_fence
                    && self.rx_active >= packets
                {
                    self.drain(now, colour, packets, res.idle_at_ps());
                }
            }
            Msg::Sync { kind, state, .. } => self.ingest_sync(now, kind, state, view),
            msg @ Msg::SyncDone { .. } => {
                // In order on the flow vNIC: every state of this shard's bulk sync is in.
                self.out.send_flow(now, msg);
            }
            Msg::DigestAsk { colour, round, .. } => self.send_digests(now, colour, round),
            Msg::Drain {
                colour, packets, ..
            } => self.drain(now, colour, packets, res.idle_at_ps()),
            Msg::Resync { bucket, .. } => self.resync(bucket),
            Msg::SendBack { colour, bucket } => self.send_back(now, colour, bucket),
            Msg::Remirror { colour, bucket } => self.remirror(now, colour, bucket),
            Msg::RecallDone { conn, ok } => {
                if ok {
                    self.counters.recalls_ok += 1;
                    // Keep a copy: packets redirected before the entries went live may still
                    // be on their way, and the DPU mirrors the connection's changes to it.
                    if let Some(c) = self.conns.get_mut(&conn) {
                        c.recalling = false;
                        self.offloaded.insert(conn, c.pps.max(0.0));
                    }
                } else {
                    self.counters.recalls_refused += 1;
                    if let Some(c) = self.conns.get_mut(&conn) {
                        c.recalling = false;
                    }
                    self.conns.set_role(conn, Role::Owner);
                }
            }
            Msg::OffloadStats { conn, pps } => {
                if let Some(v) = self.offloaded.get_mut(&conn) {
                    *v = pps;
                }
            }
            // The control part's, or plane-to-DPU messages, which never arrive here.
            _ => {}
        }
    }

    /// See [`super::SpillPlane::handle_direct_refused`].
    pub fn handle_direct_refused(&mut self, now: Instant, t: &Train, res: &mut PlaneResources) {
        self.counters.direct_refused += u64::from(t.packets);
        if let Some((n, at)) = res.cross_back(ps(now), t, &mut self.drops, &mut self.tenants) {
            let mut back = *t;
            back.packets = n;
            self.counters.to_dpu += u64::from(n);
            self.out.send(at, Channel::PhyVnic, Msg::Packets(back));
        }
    }

    fn send_sync(&mut self, now: Instant, colour: Colour, kind: SyncKind, state: ConnState) {
        self.counters.sync_tx += 1;
        self.out.sync(now, colour, kind, state);
    }

    /// The DPU asks this shard to drain: `Msg::Drained` on the flow vNIC, behind every
    /// handover the shard has sent (the DPU must own all of them before it stops the plane),
    /// once the workers and the phy vNIC toward the DPU (idle at `host_idle_ps`) are idle
    /// and, first, the `packets` the DPU shard steered here have all arrived: the request
    /// travels on the control channel and may overtake them, and one of them may open a
    /// connection the plane must hand back before it is stopped.
    fn drain(&mut self, now: Instant, colour: Colour, packets: u64, host_idle_ps: u64) {
        if self.rx_active < packets {
            self.drain_fence = Some((colour, packets));
            return;
        }
        self.drain_fence = None;
        let done = host_idle_ps
            .max(ps(self.out.flow_idle_at(now)))
            .max(ps(now));
        let msg = Msg::Drained {
            colour,
            shard: self.index,
        };
        self.out.send(at_ps(done), Channel::FlowVnic, msg);
    }

    /// Answers a [`Msg::DigestAsk`]: the digest of every bucket the shard holds records in,
    /// on its flow vNIC, then the end marker. Every state message the DPU sent before the ask
    /// has been taken (it is FIFO behind them).
    fn send_digests(&mut self, now: Instant, colour: Colour, round: u16) {
        let digests = self.conns.digests(self.buckets);
        self.send_bucket_digests(now, (colour, round), digests);
        let done = Msg::DigestDone {
            colour,
            round,
            shard: self.index,
        };
        self.out.send_flow(now, done);
    }

    /// The digest of what this shard handed back, per bucket ([`Msg::Digest`], none for an
    /// empty bucket), sent just before its `Released`: the copies it kept of them, which are
    /// what it sent or newer changes it mirrored behind them.
    fn send_back_digests(&mut self, now: Instant, colour: Colour) {
        let digests = self.conns.digests_of(&mut self.handed, self.buckets);
        self.send_bucket_digests(now, (colour, 0), digests);
    }

    /// One [`Msg::Digest`] per non-empty bucket of `digests`, on the flow vNIC (round 0: the
    /// digest of a sync-back, which no ask precedes).
    fn send_bucket_digests(
        &mut self,
        now: Instant,
        (colour, round): (Colour, u16),
        digests: Vec<(u32, u64)>,
    ) {
        for (bucket, (count, digest)) in digests.into_iter().enumerate() {
            if count > 0 {
                let msg = Msg::Digest {
                    colour,
                    round,
                    bucket: bucket as u16,
                    count,
                    digest,
                };
                self.out.send_flow(now, msg);
            }
        }
    }

    /// A [`Msg::SendBack`]: the DPU's state of what this shard handed back in `bucket` differed
    /// from the shard's digest: hand each of those connections back again, with the copy's
    /// state (the DPU takes it by version), then [`Msg::SentBack`].
    fn send_back(&mut self, now: Instant, colour: Colour, bucket: u16) {
        let buckets = self.buckets;
        let mut count = 0u32;
        for i in 0..self.handed.len() {
            let conn = self.handed[i];
            if conn.bucket(buckets) != bucket {
                continue;
            }
            if let Some(c) = self.conns.get(&conn).copied() {
                self.send_handover(now, colour, c.state);
                count += 1;
            }
        }
        let at = self.out.flow_idle_at(now);
        let done = Msg::SentBack {
            colour,
            bucket,
            count,
        };
        self.out.send(at, Channel::FlowVnic, done);
    }

    /// A [`Msg::Remirror`]: the DPU's records of `bucket` differed from this shard's after a
    /// flip: mirror every connection the shard owns in it again, in connection order.
    fn remirror(&mut self, now: Instant, colour: Colour, bucket: u16) {
        let buckets = self.buckets;
        let owned = self
            .conns
            .keys_where(|k, c| c.role == Role::Owner && k.bucket(buckets) == bucket);
        for conn in owned {
            if let Some(c) = self.conns.get(&conn).copied() {
                self.send_sync(now, colour, SyncKind::Mirror, c.state);
            }
        }
    }

    /// A [`Msg::Resync`]: the copies of `bucket` differed from the DPU's; forget them (the
    /// DPU's mirrors of the bucket follow). A record the shard owns stays, and so does one it
    /// is handing to the DPU by a recall (its outcome decides who owns it).
    fn resync(&mut self, bucket: u16) {
        let buckets = self.buckets;
        let stale = self
            .conns
            .keys_where(|k, c| c.role == Role::Copy && !c.recalling && k.bucket(buckets) == bucket);
        for conn in stale {
            self.conns.remove(conn);
        }
    }

    fn remove_conn(&mut self, conn: ConnId) -> Option<SpillConn> {
        // A closed connection is no longer on the fast path either: placement must not see it
        // among the offloaded flows (a swap would demote a connection that is gone).
        self.offloaded.remove(&conn);
        self.closed.push(conn);
        self.conns.remove(conn)
    }

    fn cache_full(&self) -> bool {
        self.conns.len() * 2 + 2 > self.flow_cache_max
    }

    fn hand_over(&mut self, now: Instant, colour: Colour, conn: ConnId) {
        let Some(c) = self.conns.get(&conn).copied() else {
            return;
        };
        self.conns.set_role(conn, Role::Copy);
        self.handed.push(conn);
        self.send_handover(now, colour, c.state);
    }

    fn send_handover(&mut self, now: Instant, colour: Colour, state: ConnState) {
        self.counters.handovers += 1;
        self.send_sync(now, colour, SyncKind::Handover, state);
    }

    fn ingest_sync(&mut self, now: Instant, kind: SyncKind, state: ConnState, view: &PlaneView) {
        match kind {
            SyncKind::Closed => {
                // Its last packet went through the DPU: forget it, owner or copy.
                self.remove_conn(state.conn);
            }
            SyncKind::Update => {
                if let Some(c) = self.conns.get_mut(&state.conn)
                    && state.version >= c.state.version
                {
                    c.state = state;
                }
            }
            SyncKind::Mirror | SyncKind::Handover => {
                let role = if kind == SyncKind::Handover {
                    Role::Owner
                } else {
                    Role::Copy
                };
                match self.conns.get_mut(&state.conn) {
                    Some(c) => {
                        if state.version >= c.state.version {
                            c.state = state;
                        }
                        if role == Role::Owner {
                            c.recalling = false;
                            self.conns.set_role(state.conn, Role::Owner);
                        }
                    }
                    None => {
                        // No room for a mirror: counted; a handover is taken regardless.
                        if self.cache_full() && role == Role::Copy {
                            self.drops.add(FabricDrop::SpillCacheFull, 0);
                            return;
                        }
                        self.conns
                            .insert(state.conn, SpillConn::new(state, role, now));
                    }
                }
                if role == Role::Owner {
                    self.out
                        .send(now, Channel::Control, Msg::Adopted { conn: state.conn });
                }
                if role == Role::Owner && view.releasing {
                    // Handed to a releasing plane (a demotion crossing the release): give it
                    // straight back.
                    self.hand_over(now, view.colour, state.conn);
                }
            }
        }
    }

    fn handle_packets(
        &mut self,
        now: Instant,
        t: &Train,
        view: &PlaneView,
        res: &mut PlaneResources,
    ) {
        self.counters.rx += u64::from(t.packets);
        self.rx_active += u64::from(t.packets);
        // The cost depends on the packet, not on what the plane knows of its connection.
        let direct = view.vatc && t.dest == Dest::Vm && !t.denied;
        let copy = if direct {
            self.vatc_ps + (f64::from(t.packet_bytes) * self.copy_ps_per_byte) as u64
        } else {
            0
        };
        let cost = copy
            + if t.kind == Kind::Open || t.denied {
                self.new_ps
            } else {
                self.pkt_ps
            };
        let (allowed, a) = res.offer_workers(ps(now), t.tenant.0, t.packets, cost);
        self.counters.busy_ns += u64::from(a.count) * (cost / PS_PER_NS);
        self.drops
            .add_refused(FabricDrop::SpillTenantShare, t.packets, allowed);
        self.drops
            .add_refused(FabricDrop::SpillQueueFull, allowed, a.count);
        self.tenants.lost(t.tenant.0, t.packets - a.count);
        if a.count == 0 {
            if t.kind == Kind::Open {
                self.counters.open_dropped += 1;
            }
            return;
        }
        if t.denied {
            self.drops.add(FabricDrop::Policy, u64::from(a.count));
            return;
        }
        self.counters.processed += u64::from(a.count);
        let bytes = u64::from(a.count) * u64::from(t.packet_bytes);
        // Control packets: the trains that step the connection (open, control, close).
        let ctrl = if t.kind == Kind::Data { 0 } else { a.count };
        let cache_full = self.cache_full();
        // One lookup of the connection per train.
        match self.conns.get_mut(&t.conn) {
            None if t.kind == Kind::Open => {
                if cache_full {
                    self.drops
                        .add(FabricDrop::SpillCacheFull, u64::from(a.count));
                    self.counters.open_dropped += 1;
                    return;
                }
                self.counters.new_conn += 1;
                let st = ConnState::open(now, t);
                let mut rec = SpillConn::new(st, Role::Owner, now);
                rec.counters.record(now.0, a.count, bytes, ctrl);
                self.conns.insert(t.conn, rec);
                if view.releasing {
                    self.hand_over(now, view.colour, t.conn);
                } else {
                    self.send_sync(now, view.colour, SyncKind::Mirror, st);
                }
            }
            None => {
                // No state here (yet): the owner's mirror is still on its way, or the DPU kept
                // it. Hand the packets back to the DPU's slow path rather than drop them.
                self.first_no_state.get_or_insert(t.conn);
                let mut back = *t;
                back.packets = a.count;
                self.counters.punted += u64::from(a.count);
                if let Some((n, at)) =
                    res.cross_back(a.finish_ps, &back, &mut self.drops, &mut self.tenants)
                {
                    back.packets = n;
                    self.out.send(at, Channel::PhyVnic, Msg::Punt(back));
                }
                return;
            }
            Some(rec) if t.kind == Kind::Close => {
                let mut st = rec.state;
                st.phase = ConnPhase::Closing;
                st.version += 1;
                self.remove_conn(t.conn);
                // Owner or not, the DPU must forget its record of a closed connection.
                self.send_sync(now, view.colour, SyncKind::Closed, st);
            }
            Some(rec) => {
                rec.counters.record(now.0, a.count, bytes, ctrl);
                if rec.state.apply(t) {
                    let st = rec.state;
                    let kind = if rec.role == Role::Owner {
                        SyncKind::Mirror
                    } else {
                        SyncKind::Update
                    };
                    self.send_sync(now, view.colour, kind, st);
                }
            }
        }
        if view.active && !self.absorbed_sent {
            self.absorbed_sent = true;
            self.out
                .send(at_ps(a.finish_ps), Channel::Control, Msg::Absorbing);
        }
        let mut done = *t;
        done.packets = a.count;
        if direct {
            // Straight into the VM's receive buffer (the copy was part of the workers' cost):
            // no crossing back. Latency to the batch's average packet, like the DPU's.
            let mean_ps = ps(now) + a.wait_sum_ps / u64::from(a.count);
            let lat = (mean_ps / PS_PER_NS).saturating_sub(t.born.0);
            self.latency.record(lat, u64::from(a.count));
            self.tenants.delivered(t.tenant.0, a.count, lat);
            self.counters.direct += u64::from(a.count);
            self.direct_last += a.count;
            self.atc_miss_acc += f64::from(a.count) * (1.0 - self.vatc_hit_ratio);
            let whole = self.atc_miss_acc.floor();
            self.counters.atc_miss += whole as u64;
            self.atc_miss_acc -= whole;
            if t.kind == Kind::Close {
                self.counters.closed_direct += 1;
            }
            return;
        }
        match res.cross_back(a.finish_ps, &done, &mut self.drops, &mut self.tenants) {
            Some((n, at)) => {
                done.packets = n;
                self.counters.to_dpu += u64::from(n);
                self.out.send(at, Channel::PhyVnic, Msg::Packets(done));
            }
            None if t.kind == Kind::Open => self.counters.open_dropped += 1,
            None => {}
        }
    }

    /// The recall of `conn` (an owner not already on its way): the shard keeps a copy, and the
    /// state travels with the message returned.
    fn take_recall(&mut self, conn: ConnId, pps: f64, replaces_pps: f64) -> Option<Msg> {
        let c = self.conns.get_mut(&conn)?;
        if c.role != Role::Owner || c.recalling {
            return None;
        }
        c.recalling = true;
        let state = c.state;
        // The state travels with the recall: from here the plane holds a copy.
        self.conns.set_role(conn, Role::Copy);
        self.counters.recalls_sent += 1;
        Some(Msg::Recall {
            state,
            pps,
            replaces_pps,
        })
    }

    /// Every record's counters become its features for the tick ending at `now`; measured,
    /// established owners not on their way to the fast path are appended to `cands`.
    fn tick(&mut self, now: Instant, cands: &mut Vec<Candidate>) {
        let tick = self.tick;
        for (k, c) in self.conns.iter_mut() {
            let measured = c.pps >= 0.0;
            let features = c.counters.take(tick);
            // A flow joining mid-tick has a partial first sample; it counts from the next one.
            let full_tick = now.0.saturating_sub(c.since.0) >= ns(tick);
            c.pps = if full_tick { features.pps } else { -1.0 };
            if measured
                && full_tick
                && c.role == Role::Owner
                && !c.recalling
                && c.state.phase == ConnPhase::Established
            {
                cands.push(Candidate {
                    conn: *k,
                    tenant: c.state.tenant,
                    since: c.since,
                    features,
                });
            }
        }
    }

    /// Checks owner accounting and the flow cache's bound.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.conns.check("spill")?;
        if self.conns.len() * 2 > self.flow_cache_max {
            return Err(format!(
                "spill: flow cache {} entries > {}",
                self.conns.len() * 2,
                self.flow_cache_max
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tenant's packets stop at its share of the workers' queue while another tenant's
    /// still get in; finished jobs give the share back; a failure forgets every tenant's.
    #[test]
    fn a_tenant_holds_at_most_its_share_of_the_workers_queue() {
        let mut f = FabricParams::default();
        f.pcie.phy_vnic_ring = 8;
        f.host.tenant_worker_share = 0.25;
        let mut res = PlaneResources::new(&f, 1);
        let cost = 1_000 * PS_PER_NS;
        // Cap: 2 of 8.
        let (allowed, a) = res.offer_workers(0, 1, 5, cost);
        assert_eq!((allowed, a.count), (2, 2));
        let (allowed, a) = res.offer_workers(0, 2, 5, cost);
        assert_eq!((allowed, a.count), (2, 2));
        assert_eq!(res.offer_workers(0, 1, 1, cost).0, 0);
        assert_eq!(res.workers.queued(0), 4);
        // After 1 us one job of tenant 1 is done: it may queue one more.
        assert_eq!(res.offer_workers(1_000 * PS_PER_NS, 1, 3, cost).0, 1);
        assert_eq!(res.fail_workers(1_000 * PS_PER_NS), 4);
        assert!(res.tenant_queues.is_empty());
        assert_eq!(res.offer_workers(1_000 * PS_PER_NS, 1, 5, cost).0, 2);
        // Off (the default): the whole queue.
        f.host.tenant_worker_share = 1.0;
        let mut res = PlaneResources::new(&f, 1);
        let (allowed, a) = res.offer_workers(0, 1, 10, cost);
        assert_eq!((allowed, a.count), (10, 8));
        assert!(res.tenant_queues.is_empty());
    }
}
