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

use core::time::Duration;
use std::collections::BTreeMap;

use foldhash::fast::FixedState;
use spillway_wire::icmp::IcmpKind;
use spillway_wire::{FlowKey, Fragment, Headers, IpAddr16, Layer, ParsedFrame, Vni, WireError};
use spillway_wire::{ip_proto, parse_frame_decap};

use crate::action::{Action, ActionList, NatSide, apply};
use crate::conntrack::{
    Connection, Conntrack, ConntrackConfig, CtDir, CtError, CtHandle, CtSnapshot, CtState, TcpState,
};
use crate::flow::{FlowEntry, FlowMatch};
use crate::flow_table::{EntryIdx, FlowTable, FlowTableConfig, Inserted};
use crate::frag::{FragConfig, FragCounters, FragDrop, FragKey, FragPiece, FragTable, FragZone};
use crate::ids::{Direction, Epoch, PortId, TenantId};
use crate::neigh::{self, NeighCounters};
use crate::packet::PacketBuf;
use crate::policy::{Policy, RouteTarget, SnatPools, SnatRange};
use crate::router::{ErrorOrigin, IcmpError, IcmpErrorCounters, IcmpErrorLimit, IcmpErrors};
use crate::time::Instant;
use crate::verdict::{DropCounters, DropReason, Verdict};
use spillway_wire::build::VxlanOuter;

mod recheck;

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

crate::counters! {
    /// Pipeline counters (dotted names in [`PipelineCounters::iter`]).
    #[derive(PartialEq, Eq)]
    pub struct PipelineCounters {
        /// Frames offered.
        rx_packets => "vswitch.rx.packets",
        /// Frames handled by a flow entry.
        fast_path_hits => "vswitch.fast_path.hit",
        /// Frames that walked the policy.
        slow_path_packets => "vswitch.slow_path.packets",
        /// Hits on an entry of an older epoch (recomputed).
        stale_epoch => "vswitch.slow_path.stale_epoch",
        /// Connections created.
        new_connections => "vswitch.slow_path.new_conn",
        /// Flow entries installed.
        flows_installed => "vswitch.flow.installed",
        /// Flow entries evicted to make room.
        flows_evicted => "vswitch.flow.evicted",
        /// Entries not installed because the table was full (the packet is still forwarded; later
        /// packets take the slow path).
        flows_rejected => "vswitch.flow.install_rejected",
        /// ICMP errors admitted as related to a connection.
        icmp_related => "vswitch.slow_path.icmp_related",
        /// Established connections cut because a policy change revoked them (tenants with
        /// `on_policy_change = "recheck"`).
        conn_cut => "vswitch.policy.conn_cut",
        /// Frames forwarded.
        forwarded => "vswitch.tx.forwarded",
        /// Frames dropped (by reason in [`Pipeline::drops`]).
        dropped => "vswitch.tx.dropped",
    }
}

/// A flow entry with its match, ready to install.
type Installable = (FlowMatch, FlowEntry);

/// How a connection crosses the vSwitch; enough to rebuild both flow entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Shape {
    /// VM `a` to VM `b`, both on this host.
    Local { a: PortId, b: PortId },
    /// VM `a` to a remote subnet behind `vtep`.
    TunnelOut { a: PortId, vtep: IpAddr16 },
    /// A remote sender behind `vtep` to VM `b`.
    TunnelIn { b: PortId, vtep: IpAddr16 },
    /// VM `a` to the internet through the underlay, SNATed to `nat` (IPv4) or not (IPv6).
    Internet {
        a: PortId,
        nat: Option<(IpAddr16, u16)>,
    },
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
    snat: BTreeMap<TenantId, (SnatRange, SnatPools)>,
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
            snat: BTreeMap::new(),
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
        p.rebuild_snat_pools();
        Ok(p)
    }

    /// Replace the policy. The epoch advances; existing flow entries become stale and are
    /// recomputed on their next hit. SNAT bindings of live connections are kept. Established
    /// connections of tenants with `on_policy_change = "recheck"` are judged again when their
    /// next packet takes the slow path (see [`recheck`]); nothing is swept here.
    pub fn set_policy(&mut self, policy: Policy) {
        self.policy = policy;
        self.epoch = self.epoch.next();
        self.rebuild_snat_pools();
        let policy = &self.policy;
        self.router
            .retain(|p| p == policy.host().uplink_port || policy.port(p).is_some());
    }

    fn rebuild_snat_pools(&mut self) {
        let mut pools = BTreeMap::new();
        for t in self.policy.tenants() {
            if let Some(range) = t.snat.as_ref() {
                // Keep the pools of tenants whose range is unchanged, so live bindings stay valid.
                let pool = match self.snat.remove(&t.id) {
                    Some((old_range, old)) if old_range == *range => old,
                    _ => SnatPools::new(range),
                };
                pools.insert(t.id, (*range, pool));
            }
        }
        self.snat = pools;
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
        self.ct
            .adopt(now, s, |c| release_snat_of(policy, snat, c))?;
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
                release_snat_of(&self.policy, &mut self.snat, &c);
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
        self.snat
            .get(&tenant)
            .and_then(|(_, pools)| pools.get(proto))
            .map_or(0, |pool| pool.in_use())
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

    /// Turn the frame into the ICMP error `err` back to its sender, if a router would send one
    /// (see [`crate::router`]). From a VM port every routed drop is answered, from the tenant's
    /// router; from the uplink only internet traffic to a SNAT address that the router refused
    /// (TTL, MTU), from the address it was sent to. Frames that came over VXLAN were routed by
    /// their sender's host and are never answered here.
    fn answer(
        &mut self,
        now: Instant,
        ingress: PortId,
        pkt: &mut PacketBuf,
        parsed: &ParsedFrame,
        err: IcmpError,
    ) -> bool {
        let h = &parsed.outer;
        let Some(key) = h.key else { return false };
        let host = *self.policy.host();
        let origin = if ingress == host.uplink_port {
            let refused = matches!(err, IcmpError::TimeExceeded | IcmpError::TooBig { .. });
            if parsed.vxlan.is_some() || !refused {
                return false;
            }
            self.policy
                .is_snat_address(key.dst_ip)
                .map(|_| ErrorOrigin {
                    src_mac: host.uplink_mac,
                    dst_mac: host.gateway_mac,
                    src_ip: key.dst_ip,
                })
        } else {
            let Some(port) = self.policy.port(ingress) else {
                return false;
            };
            self.policy.tenant(port.tenant).and_then(|t| {
                Some(ErrorOrigin {
                    src_mac: t.router_mac,
                    dst_mac: port.mac,
                    src_ip: crate::router::router_source(t, key.src_ip)?,
                })
            })
        };
        self.router.answer(now, ingress, pkt, h, err, origin)
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

    /// The slow path: decide, install, apply.
    fn slow_path(
        &mut self,
        now: Instant,
        ingress: PortId,
        pkt: &mut PacketBuf,
        parsed: &ParsedFrame,
    ) -> Verdict {
        self.counters.slow_path_packets += 1;
        // ARP and ND from a VM are answered (or consumed) here, never routed: see `neigh`.
        // Fragmented ND is the responder's to refuse (RFC 6980), so it goes first.
        if ingress != self.policy.host().uplink_port && neigh::claims(parsed) {
            return neigh::respond(&self.policy, ingress, pkt, parsed, &mut self.neigh);
        }
        let frag = match self.fragment_of(ingress, parsed) {
            Ok(f) => f,
            Err(reason) => return Verdict::Drop(reason),
        };
        if let Some((key, piece, false)) = frag {
            return match self.frags.follow(now, key, piece) {
                Ok(f) if f.src_mac.is_some_and(|m| m != parsed.outer.src_mac) => {
                    Verdict::Drop(DropReason::SpoofedMac)
                }
                Ok(f) => apply(&f.actions, pkt, parsed),
                Err(d) => Verdict::Drop(frag_drop(d)),
            };
        }
        match self.decide(now, ingress, pkt.data(), parsed) {
            Err(reason) => Verdict::Drop(reason),
            Ok(entry) => {
                if let Some((key, piece, true)) = frag {
                    let follow = FragFollow {
                        actions: entry.actions,
                        src_mac: (ingress != self.policy.host().uplink_port)
                            .then_some(parsed.outer.src_mac),
                    };
                    if let Err(d) = self.frags.track_first(now, key, piece, follow) {
                        return Verdict::Drop(frag_drop(d));
                    }
                }
                apply(&entry.actions, pkt, parsed)
            }
        }
    }

    /// The datagram a fragment belongs to, its piece, and whether it is the first fragment;
    /// `None` for a packet that is not a fragment. Outer fragments on the uplink addressed to
    /// our VTEP are fragmented VXLAN, which is not reassembled: dropped as `Fragment` (the
    /// underlay MTU is sized for the overlay, so a sender that fragments VXLAN is misconfigured).
    /// Outer fragments to a SNAT address are tracked like a VM's.
    fn fragment_of(
        &self,
        ingress: PortId,
        parsed: &ParsedFrame,
    ) -> Result<Option<(FragKey, FragPiece, bool)>, DropReason> {
        let outer = &parsed.outer;
        let (h, vni) = match (parsed.vxlan.as_ref(), parsed.inner.as_ref()) {
            (Some(vx), Some(inner)) => (inner, Some(vx.vni.get())),
            _ => (outer, None),
        };
        if h.fragment == Fragment::None {
            return Ok(None);
        }
        let Some(key) = h.key else { return Ok(None) };
        if ingress == self.policy.host().uplink_port
            && vni.is_none()
            && key.dst_ip == self.policy.host().vtep_ip
        {
            return Err(DropReason::Fragment);
        }
        let (start, end) = h.frag.byte_range(h);
        Ok(Some((
            FragKey {
                zone: FragZone { port: ingress, vni },
                src: key.src_ip,
                dst: key.dst_ip,
                // RFC 8200 section 4.5 identifies an IPv6 datagram without its protocol.
                proto: if key.src_ip.is_v4() { key.proto } else { 0 },
                id: h.frag.id,
            },
            FragPiece {
                start,
                end,
                more: h.frag.more,
            },
            h.fragment == Fragment::First,
        )))
    }

    /// Fragment-tracking counters (`vswitch.frag.*`).
    pub fn frag_counters(&self) -> FragCounters {
        self.frags.counters()
    }

    /// Walk the policy for one packet; on success install the connection's entries and return
    /// the entry for this packet's direction.
    fn decide(
        &mut self,
        now: Instant,
        ingress: PortId,
        frame: &[u8],
        parsed: &ParsedFrame,
    ) -> Result<FlowEntry, DropReason> {
        let host = *self.policy.host();
        if ingress == host.uplink_port {
            return self.decide_uplink(now, frame, parsed);
        }
        let port = self
            .policy
            .port(ingress)
            .ok_or(DropReason::UnknownPort(ingress))?;
        let h = &parsed.outer;
        let key = l3_key(h)?;
        if h.src_mac != port.mac {
            return Err(DropReason::SpoofedMac);
        }
        if !port.ips.contains(&key.src_ip) {
            return Err(DropReason::SpoofedIp);
        }
        let tenant = port.tenant;
        let flags = tcp_flags(h);
        if let Some((handle, dir)) = self.ct.lookup(now, tenant, &key) {
            return self.existing(now, tenant, handle, dir, flags, None);
        }
        if key.icmp_kind() == Some(IcmpKind::Error) {
            return self.related(now, tenant, &key, h, frame, None);
        }
        opens_connection(&key)?;
        // A new connection from a VM.
        if let Some(reason) = self
            .policy
            .sg_evaluate(ingress, Direction::Egress, &key)
            .drop_reason()
        {
            return Err(reason);
        }
        let shape = match self.policy.route(tenant, key.dst_ip) {
            None => return Err(DropReason::NoRoute),
            Some(RouteTarget::Blackhole) => return Err(DropReason::Blackhole),
            Some(RouteTarget::Local) => Shape::Local {
                a: ingress,
                b: self.admit_local(tenant, &key)?,
            },
            Some(RouteTarget::Tunnel { vtep }) => Shape::TunnelOut { a: ingress, vtep },
            Some(RouteTarget::Internet) => Shape::Internet {
                a: ingress,
                nat: self.snat_allocate(tenant, &key)?,
            },
        };
        let reply = reply_key(&key, shape);
        let (policy, snat) = (&self.policy, &mut self.snat);
        let created = self.ct.create(now, tenant, key, reply, flags, 0, |c| {
            release_snat_of(policy, snat, c)
        });
        let handle = match created {
            Ok(h) => h,
            Err(e) => {
                self.snat_release(tenant, &key, shape);
                return Err(ct_create_drop(e));
            }
        };
        self.counters.new_connections += 1;
        self.install(now, tenant, handle, CtDir::Original, &key, shape)
    }

    /// The local VM port a new connection is addressed to, if the destination exists in the
    /// tenant and that port's ingress security groups admit the connection.
    fn admit_local(&self, tenant: TenantId, key: &FlowKey) -> Result<PortId, DropReason> {
        let b = self
            .policy
            .port_by_ip(tenant, key.dst_ip)
            .ok_or(DropReason::NoSuchVm)?;
        match self
            .policy
            .sg_evaluate(b, Direction::Ingress, key)
            .drop_reason()
        {
            Some(reason) => Err(reason),
            None => Ok(b),
        }
    }

    /// A frame on the uplink: VXLAN to our VTEP, or return traffic to a SNAT address.
    fn decide_uplink(
        &mut self,
        now: Instant,
        frame: &[u8],
        parsed: &ParsedFrame,
    ) -> Result<FlowEntry, DropReason> {
        let host = *self.policy.host();
        let outer = &parsed.outer;
        let outer_key = l3_key(outer)?;
        if let (Some(vx), Some(inner)) = (parsed.vxlan.as_ref(), parsed.inner.as_ref()) {
            if outer_key.dst_ip != host.vtep_ip {
                return Err(DropReason::NotForUs);
            }
            let tenant = self
                .policy
                .tenant_by_vni(vx.vni)
                .ok_or(DropReason::UnknownVni(vx.vni.get()))?;
            let key = l3_key(inner)?;
            let flags = tcp_flags(inner);
            if let Some((handle, dir)) = self.ct.lookup(now, tenant, &key) {
                return self.existing(now, tenant, handle, dir, flags, Some(outer_key.src_ip));
            }
            if key.icmp_kind() == Some(IcmpKind::Error) {
                return self.related(now, tenant, &key, inner, frame, Some(outer_key.src_ip));
            }
            opens_connection(&key)?;
            let b = self.admit_local(tenant, &key)?;
            let shape = Shape::TunnelIn {
                b,
                vtep: outer_key.src_ip,
            };
            let (policy, snat) = (&self.policy, &mut self.snat);
            let handle = self.ct.create(
                now,
                tenant,
                key,
                key.reversed(),
                flags,
                vtep_tag(outer_key.src_ip),
                |c| release_snat_of(policy, snat, c),
            );
            let handle = handle.map_err(ct_create_drop)?;
            self.counters.new_connections += 1;
            return self.install(now, tenant, handle, CtDir::Original, &key, shape);
        }
        // Plain IP on the uplink: only return traffic of SNATed connections is ours.
        let tenant = self
            .policy
            .is_snat_address(outer_key.dst_ip)
            .ok_or(DropReason::NotForUs)?;
        match self.ct.lookup(now, tenant, &outer_key) {
            Some((handle, dir)) => self.existing(now, tenant, handle, dir, tcp_flags(outer), None),
            None if outer_key.icmp_kind() == Some(IcmpKind::Error) => {
                self.related(now, tenant, &outer_key, outer, frame, None)
            }
            None => Err(opens_connection(&outer_key)
                .err()
                .unwrap_or(DropReason::NoConnection)),
        }
    }

    /// An ICMP error (`key`, headers `h` within `frame`) that matched no connection itself: as
    /// nf_conntrack's `nf_conntrack_inet_error`, it is *related* to the connection a reply to
    /// the packet it carries would belong to, if that connection is live and the error is
    /// addressed to the embedded packet's sender; it then takes that direction's entry (routes,
    /// MACs, encapsulation, and SNAT, which `Action::Nat` applies to the embedded header too)
    /// without stepping the connection or passing the security groups. Anything else is dropped
    /// as `IcmpErrorUnrelated`. Nothing is installed: errors always take the slow path.
    fn related(
        &mut self,
        now: Instant,
        tenant: TenantId,
        key: &FlowKey,
        h: &Headers,
        frame: &[u8],
        learned_vtep: Option<IpAddr16>,
    ) -> Result<FlowEntry, DropReason> {
        let unrelated = DropReason::IcmpErrorUnrelated;
        let end = usize::from(h.l3_offset) + usize::from(h.l3_len);
        let msg = frame.get(usize::from(h.l4_offset)..end).ok_or(unrelated)?;
        let e = spillway_wire::icmp_error::embedded(!key.src_ip.is_v4(), msg).ok_or(unrelated)?;
        let (handle, dir) = self
            .ct
            .lookup(now, tenant, &e.key.reversed())
            .ok_or(unrelated)?;
        let conn = self.ct.get(handle).ok_or(unrelated)?;
        if conn.tuple(dir).dst_ip != key.dst_ip {
            return Err(unrelated);
        }
        self.recheck(tenant, handle, learned_vtep, dir)?;
        let conn = self.ct.get(handle).ok_or(unrelated)?;
        let (orig, reply, tag) = (conn.orig(), conn.reply(), conn.tag());
        let shape = self.shape_of(tenant, &orig, &reply, tag, learned_vtep, dir)?;
        let (fwd, rev) = self.build_entries(tenant, handle, &orig, shape)?;
        self.counters.icmp_related += 1;
        Ok(match dir {
            CtDir::Original => fwd.1,
            CtDir::Reply => rev.1,
        })
    }

    /// A packet of an existing connection whose flow entry was missing or stale: step conntrack,
    /// rebuild the entries under the current policy (no security-group re-evaluation, unless the
    /// tenant rechecks connections on policy changes).
    #[allow(clippy::too_many_arguments)]
    fn existing(
        &mut self,
        now: Instant,
        tenant: TenantId,
        handle: CtHandle,
        dir: CtDir,
        flags: u8,
        learned_vtep: Option<IpAddr16>,
    ) -> Result<FlowEntry, DropReason> {
        self.recheck(tenant, handle, learned_vtep, dir)?;
        match self.ct.update(now, handle, dir, flags, 0) {
            Ok(_) => {}
            Err(CtError::Invalid) => return Err(DropReason::ConntrackInvalid),
            Err(_) => return Err(DropReason::NoConnection),
        }
        let conn = self.ct.get(handle).ok_or(DropReason::NoConnection)?;
        let (orig, reply, tag) = (conn.orig(), conn.reply(), conn.tag());
        let shape = self.shape_of(tenant, &orig, &reply, tag, learned_vtep, dir)?;
        let entry = self.install(now, tenant, handle, dir, &orig, shape)?;
        debug_assert!(entry.ct == Some((handle, dir)));
        Ok(entry)
    }

    /// Recover a connection's shape from its tuples and the current policy.
    fn shape_of(
        &self,
        tenant: TenantId,
        orig: &FlowKey,
        reply: &FlowKey,
        tag: u64,
        learned_vtep: Option<IpAddr16>,
        dir: CtDir,
    ) -> Result<Shape, DropReason> {
        if let Some(a) = self.policy.port_by_ip(tenant, orig.src_ip) {
            return match self.policy.route(tenant, orig.dst_ip) {
                None => Err(DropReason::NoRoute),
                Some(RouteTarget::Blackhole) => Err(DropReason::Blackhole),
                Some(RouteTarget::Local) => {
                    let b = self
                        .policy
                        .port_by_ip(tenant, orig.dst_ip)
                        .ok_or(DropReason::NoSuchVm)?;
                    Ok(Shape::Local { a, b })
                }
                Some(RouteTarget::Tunnel { vtep }) => Ok(Shape::TunnelOut { a, vtep }),
                Some(RouteTarget::Internet) => {
                    let nat = (reply.dst_ip != orig.src_ip).then(|| nat_of_reply(reply));
                    Ok(Shape::Internet { a, nat })
                }
            };
        }
        let b = self
            .policy
            .port_by_ip(tenant, orig.dst_ip)
            .ok_or(DropReason::NoSuchVm)?;
        let vtep = match (tag_vtep(tag), learned_vtep, dir) {
            (Some(v), _, _) => v,
            (None, Some(v), CtDir::Original) => v,
            _ => match self.policy.route(tenant, orig.src_ip) {
                Some(RouteTarget::Tunnel { vtep }) => vtep,
                _ => return Err(DropReason::NoRoute),
            },
        };
        Ok(Shape::TunnelIn { b, vtep })
    }

    /// Build and install both entries of a connection; return the one for direction `dir`.
    fn install(
        &mut self,
        now: Instant,
        tenant: TenantId,
        handle: CtHandle,
        dir: CtDir,
        orig: &FlowKey,
        shape: Shape,
    ) -> Result<FlowEntry, DropReason> {
        let (fwd, rev) = self.build_entries(tenant, handle, orig, shape)?;
        if self.fast_path_enabled {
            let mut slots = [None; 2];
            for (i, &(fm, e)) in [fwd, rev].iter().enumerate() {
                match self.flows.insert_indexed(now, fm, e, true) {
                    Ok((idx, outcome)) => {
                        self.counters.flows_installed += 1;
                        if let Inserted::Evicted { victim } = outcome {
                            self.counters.flows_evicted += 1;
                            // The reverse entry may have evicted the forward one just installed.
                            if victim == fwd.0 {
                                slots[0] = None;
                            }
                        }
                        slots[i] = Some(idx);
                    }
                    Err(_) => self.counters.flows_rejected += 1,
                }
            }
            if let [Some(f), Some(r)] = slots {
                self.flows.value_mut(f).peer = Some(r);
                self.flows.value_mut(r).peer = Some(f);
            }
        }
        Ok(match dir {
            CtDir::Original => fwd.1,
            CtDir::Reply => rev.1,
        })
    }

    /// The forward (original direction) and reverse (reply direction) entries of a connection.
    fn build_entries(
        &self,
        tenant: TenantId,
        handle: CtHandle,
        orig: &FlowKey,
        shape: Shape,
    ) -> Result<(Installable, Installable), DropReason> {
        let host = *self.policy.host();
        let t = self.policy.tenant(tenant).ok_or(DropReason::PolicyDrop)?;
        let router = t.router_mac;
        let vni = t.vni;
        let port_of = |p: PortId| {
            self.policy
                .port(p)
                .map(|vp| (vp.mac, vp.mtu))
                .ok_or(DropReason::NoSuchVm)
        };
        // What the tenant router does to every packet it forwards: TTL and the next link's MTU.
        let route = |mtu: u16| Action::Route { mtu };
        let entry = |actions: ActionList, dir: CtDir, mac| FlowEntry {
            epoch: self.epoch,
            tenant,
            actions,
            expect_src_mac: mac,
            ct: Some((handle, dir)),
            ct_steady: false,
            ct_refreshed_at: Instant::ZERO,
            peer: None,
        };
        // The builder's lists always fit and policy validation keeps both VTEPs in one family, so
        // encoding cannot fail; if it ever did, the flow gets a counted drop, never a panic.
        let list = |acts: &[Action]| {
            ActionList::from_actions(acts).unwrap_or_else(|_| {
                ActionList::from_actions(&[Action::Drop(DropReason::PolicyDrop)])
                    .expect("a single drop always fits")
            })
        };
        let reply = reply_key(orig, shape);
        let encap = |to: IpAddr16, inner: &FlowKey| VxlanOuter {
            src_mac: host.uplink_mac,
            dst_mac: host.gateway_mac,
            src_ip: host.vtep_ip.to_std(),
            dst_ip: to.to_std(),
            src_port: self.entropy_port(inner),
            dst_port: host.vxlan_port,
            vni,
            ttl: 64,
        };
        // Where an entry matches, and what it does, in the few forms connections take.
        let at_vm = |port: PortId, key: FlowKey| FlowMatch {
            port,
            vni: None,
            key,
        };
        let at_uplink = |vni: Option<Vni>, key: FlowKey| FlowMatch {
            port: host.uplink_port,
            vni,
            key,
        };
        let set_macs = |mac| Action::SetMacs {
            src: router,
            dst: mac,
        };
        let to_vm = |port: PortId, (mac, mtu)| [route(mtu), set_macs(mac), Action::Output(port)];
        // Delivered as it came: the sending host's router already routed it.
        let decap_to_vm =
            |port: PortId, (mac, _)| [Action::Decap, set_macs(mac), Action::Output(port)];
        let overlay_mtu = host.overlay_mtu();
        let to_remote = |vtep: IpAddr16, inner: &FlowKey| {
            [
                route(overlay_mtu),
                // The remote vSwitch rewrites the inner MACs on delivery.
                Action::SetMacs {
                    src: router,
                    dst: router,
                },
                Action::Encap(encap(vtep, inner)),
                Action::Output(host.uplink_port),
            ]
        };
        let (fwd, rev) = match shape {
            Shape::Local { a, b } => {
                let (pa, pb) = (port_of(a)?, port_of(b)?);
                (
                    (
                        at_vm(a, *orig),
                        entry(list(&to_vm(b, pb)), CtDir::Original, Some(pa.0)),
                    ),
                    (
                        at_vm(b, reply),
                        entry(list(&to_vm(a, pa)), CtDir::Reply, Some(pb.0)),
                    ),
                )
            }
            Shape::TunnelOut { a, vtep } => {
                let pa = port_of(a)?;
                let out = list(&to_remote(vtep, orig));
                (
                    (at_vm(a, *orig), entry(out, CtDir::Original, Some(pa.0))),
                    (
                        at_uplink(Some(vni), reply),
                        entry(list(&decap_to_vm(a, pa)), CtDir::Reply, None),
                    ),
                )
            }
            Shape::TunnelIn { b, vtep } => {
                let pb = port_of(b)?;
                let back = list(&to_remote(vtep, &reply));
                (
                    (
                        at_uplink(Some(vni), *orig),
                        entry(list(&decap_to_vm(b, pb)), CtDir::Original, None),
                    ),
                    (at_vm(b, reply), entry(back, CtDir::Reply, Some(pb.0))),
                )
            }
            Shape::Internet { a, nat } => {
                let pa = port_of(a)?;
                let ma = pa.0;
                let out_macs = Action::SetMacs {
                    src: host.uplink_mac,
                    dst: host.gateway_mac,
                };
                let [in_route, in_macs, to_a] = to_vm(a, pa);
                let out_route = route(host.underlay_mtu);
                let uplink_out = Action::Output(host.uplink_port);
                let (fwd_acts, rev_acts) = match nat {
                    Some((ip, port)) => {
                        let snat = Action::Nat {
                            side: NatSide::Source,
                            ip,
                            port,
                        };
                        let unsnat = Action::Nat {
                            side: NatSide::Destination,
                            ip: orig.src_ip,
                            port: orig.src_port,
                        };
                        (
                            list(&[out_route, snat, out_macs, uplink_out]),
                            list(&[in_route, unsnat, in_macs, to_a]),
                        )
                    }
                    None => (
                        list(&[out_route, out_macs, uplink_out]),
                        list(&[in_route, in_macs, to_a]),
                    ),
                };
                (
                    (at_vm(a, *orig), entry(fwd_acts, CtDir::Original, Some(ma))),
                    (at_uplink(None, reply), entry(rev_acts, CtDir::Reply, None)),
                )
            }
        };
        Ok((fwd, rev))
    }

    /// VXLAN UDP source port for a flow: from the flow hash, in the dynamic range 49152-65535
    /// (RFC 7348 section 5 recommends that range).
    fn entropy_port(&self, key: &FlowKey) -> u16 {
        use core::hash::BuildHasher;
        let h = self.hasher.hash_one(key);
        49152 | (h as u16 & 0x3fff)
    }

    fn snat_allocate(
        &mut self,
        tenant: TenantId,
        key: &FlowKey,
    ) -> Result<Option<(IpAddr16, u16)>, DropReason> {
        if !key.src_ip.is_v4() {
            // IPv6 is globally routed: no NAT66.
            return Ok(None);
        }
        let public = self
            .policy
            .tenant(tenant)
            .and_then(|t| t.snat.as_ref().map(|s| s.public_ip))
            .ok_or(DropReason::NoRoute)?;
        if key.icmp_kind().is_some_and(|k| k != IcmpKind::Request) {
            // Only ICMP queries carry an identifier that can be translated (and only they open
            // connections; `opens_connection` already refused the rest).
            return Err(DropReason::PolicyDrop);
        }
        let (_, pools) = self.snat.get_mut(&tenant).ok_or(DropReason::NoRoute)?;
        let pool = pools
            .for_protocol(key.proto)
            .ok_or(DropReason::PolicyDrop)?;
        let port = pool.allocate().map_err(|_| DropReason::SnatExhausted)?;
        Ok(Some((public, port)))
    }

    fn snat_release(&mut self, tenant: TenantId, key: &FlowKey, shape: Shape) {
        if let Shape::Internet {
            nat: Some((_, port)),
            ..
        } = shape
            && let Some(pool) = self
                .snat
                .get_mut(&tenant)
                .and_then(|p| p.1.for_protocol(key.proto))
        {
            let _ = pool.release(port);
        }
    }

    /// Expire idle connections, flow entries and timed-out fragmented datagrams, at most
    /// `budget` slots of each per call. SNAT ports of expired connections return to their pools.
    pub fn expire(&mut self, now: Instant, budget: usize) -> usize {
        let (policy, snat) = (&self.policy, &mut self.snat);
        let n = self
            .ct
            .expire(now, budget, |conn| release_snat_of(policy, snat, conn));
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

/// The SNAT port a connection holds, as `(tenant, protocol, port)`.
fn snat_binding(policy: &Policy, conn: &Connection) -> Option<(TenantId, u8, u16)> {
    let (orig, reply) = (conn.orig(), conn.reply());
    (policy.is_snat_address(reply.dst_ip) == Some(conn.zone()) && reply.dst_ip != orig.src_ip)
        .then(|| (conn.zone(), orig.proto, nat_of_reply(&reply).1))
}

/// The translated address and port a SNATed connection's reply tuple is addressed to. For ICMP
/// the "port" is the query identifier, which the key carries in its source port (the
/// destination port holds the reply's type and code).
fn nat_of_reply(reply: &FlowKey) -> (IpAddr16, u16) {
    let port = match reply.icmp_type() {
        Some(_) => reply.src_port,
        None => reply.dst_port,
    };
    (reply.dst_ip, port)
}

/// Whether a packet that matched no connection may open one, and if not, why it is dropped:
/// as in nf_conntrack, an ICMP reply that answers no tracked request, an ICMP error (here it
/// could not be matched to a connection as related) and any other ICMP message that is not a
/// query are invalid, and never reach the security groups.
fn opens_connection(key: &FlowKey) -> Result<(), DropReason> {
    match key.icmp_kind() {
        None | Some(IcmpKind::Request) => Ok(()),
        Some(IcmpKind::Reply) => Err(DropReason::IcmpUnsolicitedReply),
        Some(IcmpKind::Error) => Err(DropReason::IcmpErrorUnrelated),
        Some(IcmpKind::Other) => Err(DropReason::IcmpUntracked),
    }
}

/// Return the SNAT port of a connection that is going away (expired, or reclaimed by
/// `Conntrack::create` to make room) to its tenant's pool.
fn release_snat_of(
    policy: &Policy,
    snat: &mut BTreeMap<TenantId, (SnatRange, SnatPools)>,
    conn: &Connection,
) {
    if let Some((tenant, proto, port)) = snat_binding(policy, conn)
        && let Some(pool) = snat.get_mut(&tenant).and_then(|p| p.1.for_protocol(proto))
    {
        let _ = pool.release(port);
    }
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

/// The 5-tuple of an IP frame; non-IP frames and fragments are dropped with their reason.
fn l3_key(h: &Headers) -> Result<FlowKey, DropReason> {
    match h.key {
        None if h.l3 == spillway_wire::L3::Arp => Err(DropReason::ArpNotRouted),
        None => Err(DropReason::UnsupportedEtherType(h.ethertype)),
        // Later fragments are followed before the policy walk; reaching here is a bug's symptom,
        // and dropping is the safe answer.
        Some(_) if h.fragment == Fragment::NonFirst => Err(DropReason::FragmentNoFirst),
        Some(k) => Ok(k),
    }
}

#[inline]
fn tcp_flags(h: &Headers) -> u8 {
    match h.key {
        Some(k) if k.proto == ip_proto::TCP => h.tcp_flags,
        _ => 0,
    }
}

/// The tuple the reply of `orig` carries, given the connection's shape.
fn reply_key(orig: &FlowKey, shape: Shape) -> FlowKey {
    match shape {
        Shape::Internet {
            nat: Some((ip, port)),
            ..
        } => {
            let mut r = orig.reversed();
            r.dst_ip = ip;
            if r.icmp_type().is_some() {
                // The reply carries the translated identifier; its type stays in `dst_port`.
                r.src_port = port;
            } else {
                r.dst_port = port;
            }
            r
        }
        _ => orig.reversed(),
    }
}

fn frag_drop(d: FragDrop) -> DropReason {
    match d {
        FragDrop::NoFirst => DropReason::FragmentNoFirst,
        FragDrop::Overlap => DropReason::FragmentOverlap,
        FragDrop::TooMany => DropReason::FragmentTooMany,
        FragDrop::TableFull => DropReason::FragmentTableFull,
        FragDrop::Timeout => DropReason::FragmentTimeout,
    }
}

fn ct_create_drop(e: CtError) -> DropReason {
    match e {
        CtError::Full => DropReason::ConntrackFull,
        _ => DropReason::NoConnection,
    }
}

/// The conntrack tag of a connection that arrived over the overlay remembers the sender's IPv4
/// VTEP, so its reverse entry can be rebuilt after eviction without a route. Bit 32 marks it.
fn vtep_tag(vtep: IpAddr16) -> u64 {
    match vtep.v4_octets() {
        Some(o) => (1 << 32) | u64::from(u32::from_be_bytes(o)),
        None => 0,
    }
}

fn tag_vtep(tag: u64) -> Option<IpAddr16> {
    (tag >> 32 == 1).then(|| IpAddr16::from_v4((tag as u32).to_be_bytes()))
}
