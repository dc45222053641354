//! The vSwitch pipeline: fast path over a bounded flow table, slow path over the policy.
//!
//! [`Pipeline::process_batch`] takes a batch of frames that arrived on one port and returns one
//! [`Verdict`] per frame, rewriting the frames in place. The stages of a batch:
//!
//! 1. **Parse and classify** every frame (`spillway_wire::parse_frame_decap`, no copy). VXLAN is
//!    decapsulated only on the uplink and only when addressed to our VTEP
//!    ([`crate::policy::HostConfig::decap_at`]); anywhere else UDP to the VXLAN port is plain
//!    tenant UDP. Frames that can never be fast-path hits (malformed, non-IP, fragments) are
//!    marked for the slow path, which drops them with a reason.
//! 2. **Batched lookup** of `(port, vni, 5-tuple)` in the flow table: hashes first, then bucket and
//!    entry prefetches, so the DRAM latency of a million-entry table is paid once per group.
//! 3. **Execute**: a hit whose entry is of the current epoch runs the entry's action list
//!    ([`crate::action::apply`]); conntrack is stepped only when the TCP flags or the connection's
//!    state require it (see [`FlowEntry::ct_steady`]) and otherwise refreshed once per
//!    `ct_refresh`. A miss or a stale entry takes the slow path.
//!
//! ARP and IPv6 neighbour discovery from VM ports never reach the policy: the slow path hands
//! them to the neighbour responder ([`crate::neigh`]), which answers in place or consumes them.
//!
//! The slow path walks anti-spoof -> conntrack -> security groups -> route -> SNAT -> conntrack
//! create, builds the forward and reverse flow entries of the connection, installs them, and then
//! applies the forward entry to the packet with the same executor the fast path uses. That is why
//! the two paths agree byte for byte (`tests/path_equivalence.rs` checks it).
//!
//! Every entry of a packet the tenant router forwards starts with `Route` (TTL / hop limit and
//! the next link's MTU). A packet it refuses, or one with no route or no VM at its destination,
//! is answered in place with the ICMP error a router sends, out of the port it came in on
//! ([`crate::router`]), as the last step of a batch so both paths share it.
//!
//! IP fragments always take the slow path: a first fragment is decided like any packet and its
//! verdict tracked, later fragments follow it (see [`crate::frag`] for why tracking rather than
//! reassembly, and what is dropped).
//!
//! Security groups are stateful: a packet of an existing connection is not re-evaluated. After
//! a policy change routes, MACs and NAT are recomputed under the new epoch, and what happens to
//! the security-group verdict is the tenant's choice (`on_policy_change`): `keep` leaves
//! established connections alone; `recheck` judges each again, lazily, when its next packet
//! takes the slow path, and cuts it if the new groups would not admit it (see [`recheck`]).
//!
//! # Layout
//!
//! This file owns the [`Pipeline`] type, its configuration and errors, and the per-packet hot
//! path (the batch loop and the fast path), kept together and in order so that splitting the
//! module changed neither what the compiler sees of the hot path nor what it inlines. The
//! children hold what a batch calls out to: the slow path's policy walk ([`slow_path`]), the
//! flow entries it builds ([`entries`]), SNAT bindings ([`snat`]), the router's ICMP errors
//! ([`icmp_error`]), the counters ([`counters`]) and policy-change rechecks ([`recheck`]).

use core::time::Duration;

use foldhash::fast::FixedState;
use spillway_wire::{FlowKey, Fragment, Headers, IpAddr16, Layer, ParsedFrame, WireError};
use spillway_wire::{ip_proto, parse_frame_decap};

use crate::action::{ActionList, apply};
use crate::conntrack::{Conntrack, ConntrackConfig, CtError, CtSnapshot, CtState, TcpState};
use crate::flow::{FlowEntry, FlowMatch};
use crate::flow_table::{EntryIdx, FlowTable, FlowTableConfig};
use crate::frag::{FragConfig, FragCounters, FragTable};
use crate::ids::{Epoch, PortId, TenantId};
use crate::neigh::NeighCounters;
use crate::packet::PacketBuf;
use crate::policy::Policy;
use crate::router::{IcmpError, IcmpErrorCounters, IcmpErrorLimit, IcmpErrors};
use crate::time::Instant;
use crate::verdict::{DropCounters, DropReason, Verdict};

mod counters;
mod entries;
mod icmp_error;
mod recheck;
mod slow_path;
mod snat;

pub use counters::PipelineCounters;
use entries::Shape;
use snat::SnatBindings;

/// Frames processed per stage of a batch: enough lookups in flight to hide DRAM latency, few
/// enough that the per-batch scratch arrays stay in L1.
const BATCH_GROUP: usize = 32;

/// TCP flags that always step the connection's state machine, even in steady state.
const TCP_STATE_FLAGS: u8 = 0x01 | 0x02 | 0x04; // FIN | SYN | RST

/// Pipeline configuration.
#[derive(Clone, Debug)]
pub struct PipelineConfig {
    /// The flow table (capacity, idle timeout, full behaviour).
    pub flow_table: FlowTableConfig,
    /// The conntrack table.
    pub conntrack: ConntrackConfig,
    /// How often a steady flow entry refreshes its connection's idle timer. Much shorter than
    /// any conntrack timeout, so an active connection never expires; long enough that the common
    /// fast-path hit does not touch the conntrack table.
    pub ct_refresh: Duration,
    /// Seed of the hash that picks the VXLAN UDP source port from the inner flow.
    pub hash_seed: u64,
    /// When false, no flow entry is installed or looked up: every packet walks the slow path
    /// (against conntrack, so established connections still work). This is the SoC-only mode of
    /// a DPU whose hardware table is off, and the oracle the path-equivalence test compares the
    /// fast path against.
    pub fast_path: bool,
    /// IP fragment tracking (capacity, per-zone budget, fragments per datagram, timeout).
    pub frag: FragConfig,
    /// The router's ICMP errors per ingress port.
    pub icmp_errors: IcmpErrorLimit,
}

impl Default for PipelineConfig {
    fn default() -> Self {
        PipelineConfig {
            flow_table: FlowTableConfig::default(),
            conntrack: ConntrackConfig::default(),
            ct_refresh: Duration::from_secs(1),
            hash_seed: 0x5eed_5b11_1a7e,
            fast_path: true,
            frag: FragConfig::default(),
            icmp_errors: IcmpErrorLimit::default(),
        }
    }
}

/// Placeholder for the batch's parse results before stage 1 fills them.
const UNPARSED: Result<ParsedFrame, WireError> = Err(WireError::truncated(Layer::Ethernet, 14, 0));

/// The vSwitch pipeline. See the module doc for the stages.
#[derive(Debug)]
pub struct Pipeline {
    policy: Policy,
    epoch: Epoch,
    flows: FlowTable<FlowMatch, FlowEntry>,
    ct: Conntrack,
    snat: SnatBindings,
    ct_refresh_ns: u64,
    fast_path_enabled: bool,
    hasher: FixedState,
    counters: PipelineCounters,
    drops: DropCounters,
    frags: FragTable<FragFollow>,
    neigh: NeighCounters,
    router: IcmpErrors,
}

/// What later fragments of a datagram repeat: the first fragment's actions, and the source MAC
/// it was admitted with when it came from a VM port (the uplink's MACs are the routers').
#[derive(Clone, Copy, Debug)]
struct FragFollow {
    actions: ActionList,
    src_mac: Option<spillway_wire::MacAddr>,
}

/// Why [`Pipeline::adopt_conn`] refused a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AdoptError {
    /// The connection is source-NATed: its binding belongs to the sender's SNAT pool, which
    /// state sync does not carry (yet).
    #[error("connection is source-NATed; its SNAT binding is not synced")]
    Nat,
    /// The tracker refused it (full with nothing expired to reclaim).
    #[error("conntrack: {0}")]
    Conntrack(#[from] CtError),
    /// Its tenant rechecks connections on policy changes and this pipeline's security groups
    /// no longer admit it: adopting it would resurrect a connection a policy change cut.
    #[error("connection revoked by the current policy")]
    Revoked,
}

/// Errors building a pipeline.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    /// The flow table configuration is invalid.
    #[error("flow table: {0}")]
    FlowTable(#[from] crate::flow_table::FlowTableConfigError),
    /// The conntrack configuration is invalid.
    #[error("conntrack: {0}")]
    Conntrack(#[from] crate::conntrack::ConntrackConfigError),
    /// The fragment table configuration is invalid.
    #[error("{0}")]
    Frag(#[from] crate::frag::FragConfigError),
}

impl Pipeline {
    /// A pipeline over `policy`, at epoch 1.
    pub fn new(policy: Policy, cfg: PipelineConfig) -> Result<Pipeline, PipelineError> {
        let flows = FlowTable::new(cfg.flow_table)?;
        let ct = Conntrack::new(cfg.conntrack)?;
        let frags = FragTable::new(cfg.frag)?;
        let mut p = Pipeline {
            frags,
            snat: SnatBindings::default(),
            policy,
            epoch: Epoch(1),
            flows,
            ct,
            ct_refresh_ns: u64::try_from(cfg.ct_refresh.as_nanos()).unwrap_or(u64::MAX),
            fast_path_enabled: cfg.fast_path,
            hasher: FixedState::with_seed(cfg.hash_seed),
            counters: PipelineCounters::default(),
            drops: DropCounters::default(),
            neigh: NeighCounters::default(),
            router: IcmpErrors::new(cfg.icmp_errors),
        };
        p.snat.rebuild(&p.policy);
        Ok(p)
    }

    /// Replace the policy. The epoch advances; existing flow entries become stale and are
    /// recomputed on their next hit. SNAT bindings of live connections are kept. Established
    /// connections of tenants with `on_policy_change = "recheck"` are judged again when their
    /// next packet takes the slow path (see [`recheck`]); nothing is swept here.
    pub fn set_policy(&mut self, policy: Policy) {
        self.policy = policy;
        self.epoch = self.epoch.next();
        self.snat.rebuild(&self.policy);
        let policy = &self.policy;
        self.router
            .retain(|p| p == policy.host().uplink_port || policy.port(p).is_some());
    }

    /// The current policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The current epoch.
    pub fn epoch(&self) -> Epoch {
        self.epoch
    }

    /// Pipeline counters.
    pub fn counters(&self) -> &PipelineCounters {
        &self.counters
    }

    /// Drop counters by reason.
    pub fn drops(&self) -> &DropCounters {
        &self.drops
    }

    /// Counters of the router's ICMP errors (`vswitch.icmp_error.*`).
    pub fn icmp_error_counters(&self) -> &IcmpErrorCounters {
        self.router.counters()
    }

    /// Counters of the ARP / neighbour-discovery responder.
    pub fn neigh_counters(&self) -> &NeighCounters {
        &self.neigh
    }

    /// The flow table.
    pub fn flows(&self) -> &FlowTable<FlowMatch, FlowEntry> {
        &self.flows
    }

    /// The tracked connection with `key` (either direction) in `zone`, as state sync carries it.
    pub fn export_conn(&self, now: Instant, zone: TenantId, key: &FlowKey) -> Option<CtSnapshot> {
        let (h, _) = self.ct.lookup(now, zone, key)?;
        self.ct.get(h).map(|c| c.snapshot())
    }

    /// Installs a connection another plane tracked, so its next packets here find their state
    /// (the slow path then derives the flow entries from policy, as after an idle-out). The
    /// sender owns the connection: its state replaces any this pipeline held.
    pub fn adopt_conn(&mut self, now: Instant, s: &CtSnapshot) -> Result<(), AdoptError> {
        if s.reply != s.orig.reversed() {
            return Err(AdoptError::Nat);
        }
        self.recheck_adopted(s)?;
        let (policy, snat) = (&self.policy, &mut self.snat);
        self.ct.adopt(now, s, |c| snat.release_conn(policy, c))?;
        Ok(())
    }

    /// Removes the tracked connection with `key` (either direction) in `zone`, releasing its
    /// SNAT binding: another plane carried its last packets, so this pipeline's entry is stale
    /// (a reused tuple must open afresh here, not meet a half-closed state). Returns whether
    /// one was removed.
    pub fn forget_conn(&mut self, now: Instant, zone: TenantId, key: &FlowKey) -> bool {
        let Some((h, _)) = self.ct.lookup(now, zone, key) else {
            return false;
        };
        match self.ct.remove(h) {
            Some(c) => {
                self.snat.release_conn(&self.policy, &c);
                true
            }
            None => false,
        }
    }

    /// The connection tracker.
    pub fn conntrack(&self) -> &Conntrack {
        &self.ct
    }

    /// SNAT ports (or ICMP identifiers) of `tenant` for `proto` currently bound to connections.
    pub fn snat_in_use(&self, tenant: TenantId, proto: u8) -> u32 {
        self.snat.in_use(tenant, proto)
    }

    /// Fragment-tracking counters (`vswitch.frag.*`).
    pub fn frag_counters(&self) -> FragCounters {
        self.frags.counters()
    }

    /// Process one frame that arrived on `ingress`.
    pub fn process(&mut self, now: Instant, ingress: PortId, pkt: &mut PacketBuf) -> Verdict {
        let mut v = [Verdict::Drop(DropReason::PolicyDrop)];
        self.process_batch(now, ingress, core::slice::from_mut(pkt), &mut v);
        v[0]
    }

    /// Process a batch of frames that arrived on `ingress`; `verdicts[i]` is the fate of
    /// `pkts[i]`, which is rewritten in place. Panics if the slices differ in length.
    pub fn process_batch(
        &mut self,
        now: Instant,
        ingress: PortId,
        pkts: &mut [PacketBuf],
        verdicts: &mut [Verdict],
    ) {
        assert_eq!(pkts.len(), verdicts.len(), "one verdict per packet");
        // VXLAN is decapsulated only on the uplink and only for our VTEP: on a VM port, UDP to
        // the VXLAN port is the tenant's own traffic, judged like any other UDP.
        let decap = self.policy.host().decap_at(ingress);
        // Every slot a group reads is written first.
        let mut parsed = [UNPARSED; BATCH_GROUP];
        for (pkts, verdicts) in pkts
            .chunks_mut(BATCH_GROUP)
            .zip(verdicts.chunks_mut(BATCH_GROUP))
        {
            for (slot, pkt) in parsed.iter_mut().zip(pkts.iter()) {
                *slot = parse_frame_decap(pkt.data(), decap);
            }
            self.process_group(now, ingress, pkts, verdicts, &parsed[..pkts.len()]);
        }
    }

    /// [`Pipeline::process`] for a frame the caller has parsed already (a frame node classifies
    /// it before the vSwitch runs): `parsed` must be `parse_frame_decap(pkt.data(),
    /// self.policy().host().decap_at(ingress))`, so the frame is parsed once, not twice.
    pub fn process_parsed(
        &mut self,
        now: Instant,
        ingress: PortId,
        pkt: &mut PacketBuf,
        parsed: &ParsedFrame,
    ) -> Verdict {
        let mut v = [Verdict::Drop(DropReason::PolicyDrop)];
        self.process_group(
            now,
            ingress,
            core::slice::from_mut(pkt),
            &mut v,
            &[Ok(*parsed)],
        );
        v[0]
    }

    /// At most [`BATCH_GROUP`] frames from `ingress` with their parses: classify, look up in
    /// one batch, run the hits, walk the policy for the rest, answer what a router answers.
    fn process_group(
        &mut self,
        now: Instant,
        ingress: PortId,
        pkts: &mut [PacketBuf],
        verdicts: &mut [Verdict],
        parsed: &[Result<ParsedFrame, WireError>],
    ) {
        debug_assert!(pkts.len() <= BATCH_GROUP && parsed.len() == pkts.len());
        let uplink = ingress == self.policy.host().uplink_port;
        let vtep = self.policy.host().vtep_ip;
        let mut keys = [FlowMatch::EMPTY; BATCH_GROUP];
        let mut bytes = [0u32; BATCH_GROUP];
        let mut which = [0usize; BATCH_GROUP];
        let mut found = [None::<EntryIdx>; BATCH_GROUP];
        let n = pkts.len();
        self.counters.rx_packets += n as u64;
        // Stage 1: classify; gather the lookups.
        let mut m = 0;
        for i in 0..n {
            let fm = match (&parsed[i], self.fast_path_enabled) {
                (Ok(p), true) => cacheable_match(ingress, uplink, vtep, p),
                _ => None,
            };
            if let Some(fm) = fm {
                keys[m] = fm;
                bytes[m] = pkts[i].len() as u32;
                which[m] = i;
                m += 1;
            }
        }
        // Stage 2: batched, prefetched lookup.
        self.flows
            .lookup_batch(now, &keys[..m], &bytes[..m], &mut found[..m]);
        // Stage 3: execute hits; everything else takes the slow path.
        let mut hit = [false; BATCH_GROUP];
        for j in 0..m {
            let i = which[j];
            if let (Some(idx), Ok(p)) = (found[j], &parsed[i])
                && let Some(v) = self.fast_path(now, idx, &mut pkts[i], p)
            {
                verdicts[i] = v;
                hit[i] = true;
            }
        }
        // Before the slow path runs frame by frame, prefetch the bucket of the reverse entry
        // each new overlay connection will install: no lookup has touched it, so otherwise
        // every new connection pays that DRAM miss in full, one after another.
        if uplink && self.fast_path_enabled {
            for i in 0..n {
                if !hit[i] {
                    self.prefetch_reverse_bucket(parsed[i].as_ref().ok());
                }
            }
        }
        for i in 0..n {
            if hit[i] {
                continue;
            }
            verdicts[i] = match &parsed[i] {
                Err(e) => Verdict::Drop(DropReason::Malformed(*e)),
                Ok(p) => self.slow_path(now, ingress, &mut pkts[i], p),
            };
        }
        // Drops a router answers become ICMP errors back out of the ingress port. Both paths
        // leave a refused frame as it arrived, so this is one step for hits and misses.
        for i in 0..n {
            if let (Verdict::Drop(r), Ok(p)) = (verdicts[i], &parsed[i])
                && let Some(err) = IcmpError::for_drop(&r)
                && self.answer(now, ingress, &mut pkts[i], p, err)
            {
                verdicts[i] = Verdict::Forward(ingress);
            }
        }
        for v in verdicts.iter() {
            match v {
                Verdict::Forward(_) => self.counters.forwarded += 1,
                Verdict::Drop(r) => {
                    self.counters.dropped += 1;
                    self.drops.add(r);
                }
            }
        }
    }

    /// Prefetch the flow-table bucket of the reverse entry a new connection arriving over VXLAN
    /// would install (`(VM port, no VNI, reversed inner tuple)`); a hint only, so a frame that
    /// turns out to be something else costs one wasted prefetch.
    #[inline]
    fn prefetch_reverse_bucket(&self, parsed: Option<&ParsedFrame>) {
        let Some(p) = parsed else { return };
        if let (Some(vx), Some(inner)) = (p.vxlan.as_ref(), p.inner.as_ref())
            && let Some(key) = inner.key
            && let Some(tenant) = self.policy.tenant_by_vni(vx.vni)
            && let Some(b) = self.policy.port_by_ip(tenant, key.dst_ip)
        {
            self.flows.prefetch(&FlowMatch {
                port: b,
                vni: None,
                key: key.reversed(),
            });
        }
    }

    /// The hit path. `None` means "not usable, take the slow path" (stale epoch, stale
    /// connection, or a source MAC the entry does not allow).
    #[inline]
    fn fast_path(
        &mut self,
        now: Instant,
        idx: EntryIdx,
        pkt: &mut PacketBuf,
        parsed: &ParsedFrame,
    ) -> Option<Verdict> {
        let epoch = self.epoch;
        let refresh = self.ct_refresh_ns;
        let e = self.flows.value_mut(idx);
        if e.epoch != epoch {
            self.counters.stale_epoch += 1;
            return None;
        }
        if let Some(mac) = e.expect_src_mac
            && parsed.outer.src_mac != mac
        {
            return None;
        }
        let headers = parsed.inner.as_ref().unwrap_or(&parsed.outer);
        if let Some((h, dir)) = e.ct {
            let flags = tcp_flags(headers);
            if !e.ct_steady || flags & TCP_STATE_FLAGS != 0 {
                match self.ct.update(now, h, dir, flags, pkt.len() as u32) {
                    Ok(state) => {
                        let e = self.flows.value_mut(idx);
                        let steady = is_steady(state);
                        e.ct_steady = steady;
                        e.ct_refreshed_at = now;
                        // A FIN or RST from this side changes what the other side's plain ACKs
                        // mean: its entry must step the connection again.
                        if let Some(peer) = e.peer.filter(|_| !steady)
                            && let Some(p) = self.flows.try_value_mut(peer)
                        {
                            p.ct_steady = false;
                        }
                    }
                    Err(CtError::Invalid) => {
                        return Some(Verdict::Drop(DropReason::ConntrackInvalid));
                    }
                    Err(_) => return None,
                }
            } else if now.0.saturating_sub(e.ct_refreshed_at.0) >= refresh {
                if self.ct.touch(now, h).is_err() {
                    return None;
                }
                self.flows.value_mut(idx).ct_refreshed_at = now;
            }
        }
        self.counters.fast_path_hits += 1;
        // Borrowed, not copied: the list is hundreds of bytes and a hit usually runs three.
        Some(apply(&self.flows.value(idx).actions, pkt, parsed))
    }

    /// Expire idle connections, flow entries and timed-out fragmented datagrams, at most
    /// `budget` slots of each per call. SNAT ports of expired connections return to their pools.
    pub fn expire(&mut self, now: Instant, budget: usize) -> usize {
        let (policy, snat) = (&self.policy, &mut self.snat);
        let n = self
            .ct
            .expire(now, budget, |conn| snat.release_conn(policy, conn));
        n + self.flows.expire(now, budget, |_, _| {}) + self.frags.expire(now, budget)
    }

    /// Check the invariants of every table; the simulator calls this after every event.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.flows.check_invariants()?;
        self.ct.check_invariants()?;
        self.frags.check_invariants()?;
        let c = &self.counters;
        if c.forwarded + c.dropped != c.rx_packets {
            return Err(format!(
                "conservation: forwarded {} + dropped {} != received {}",
                c.forwarded, c.dropped, c.rx_packets
            ));
        }
        if self.drops.total() != c.dropped {
            return Err("drop counters disagree with the dropped total".into());
        }
        Ok(())
    }
}

/// Whether a conntrack state is steady: then only SYN/FIN/RST packets need to step it.
fn is_steady(state: CtState) -> bool {
    matches!(
        state,
        CtState::Tcp(TcpState::Established) | CtState::Replied
    )
}

impl FlowMatch {
    /// A placeholder for batch scratch arrays.
    const EMPTY: FlowMatch = FlowMatch {
        port: PortId(u32::MAX),
        vni: None,
        key: FlowKey {
            src_ip: IpAddr16::UNSPECIFIED,
            dst_ip: IpAddr16::UNSPECIFIED,
            src_port: 0,
            dst_port: 0,
            proto: 0,
        },
    };
}

/// The flow-table key of a frame, or `None` when it can only take the slow path.
#[inline]
fn cacheable_match(
    ingress: PortId,
    uplink: bool,
    vtep: IpAddr16,
    p: &ParsedFrame,
) -> Option<FlowMatch> {
    let outer = p.outer.key?;
    if p.outer.fragment != Fragment::None {
        return None;
    }
    if uplink && let (Some(vx), Some(inner)) = (p.vxlan.as_ref(), p.inner.as_ref()) {
        if outer.dst_ip != vtep || inner.fragment != Fragment::None {
            return None;
        }
        return Some(FlowMatch {
            port: ingress,
            vni: Some(vx.vni),
            key: inner.key?,
        });
    }
    Some(FlowMatch {
        port: ingress,
        vni: None,
        key: outer,
    })
}

#[inline]
fn tcp_flags(h: &Headers) -> u8 {
    match h.key {
        Some(k) if k.proto == ip_proto::TCP => h.tcp_flags,
        _ => 0,
    }
}
