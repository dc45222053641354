//! A synthetic, seeded data-path workload at DPU scale, shared by `spillway bench datapath`, the
//! criterion benches and the allocation tests.
//!
//! # What it builds
//!
//! - **Policy** ([`Workload::policy_config`]): one tenant (id 1, VNI 1001, local subnet
//!   `10.0.0.0/8`) with `vm_ports` VM ports (ids `1..=vm_ports`, addresses `10.0.x.y`). Every port
//!   has its own security group of `sg_rules` rules (default 1,000): `sg_rules - 1` rules that never
//!   match the bench traffic (TCP rules, UDP rules for other remotes, egress rules), and last in
//!   precedence the one rule that admits it (`ingress allow udp from 172.16.0.0/12 ports
//!   5000-5999`). The tenant has `routes` routes (default 10,000): distinct **/26** prefixes
//!   `172.16.0.0/26, 172.16.0.64/26, ...` under `172.16.0.0/12`, each tunnelled to one of
//!   `remote_vteps` remote VTEPs `198.51.100.1..` (round robin). /26 and not /24 because the /12
//!   holds only 4,096 /24s; the route count, not the prefix length, is what the LPM cost depends on.
//! - **Flows** (default 1,000,000): flow `f` is UDP from remote sender
//!   `route(f % routes).host(1 + k % 62)`, port `10000 + k / 62` (with `k = f / routes`), to VM
//!   `f % vm_ports`, port `5000 + (f / 7) % 1000`. The (sender address, sender port) pair alone is
//!   distinct per flow, so all 5-tuples are distinct.
//! - **Frames**: every inner frame is **60 bytes** (Ethernet 14 + IPv4 20 + UDP 8 + 18 bytes of
//!   payload), the 64-byte minimum Ethernet frame on the wire once the 4-byte FCS, which NICs strip
//!   and buffers never hold, is added. Uplink frames ([`Workload::uplink`]) carry the sender's
//!   frame VXLAN-encapsulated (IPv4 outer, 50 bytes) from the route's VTEP to our VTEP
//!   (110 bytes). Reply frames ([`Workload::replies`]) are the VM's 60-byte answer on its VM port,
//!   which the pipeline encapsulates toward the remote VTEP.
//!
//! Frames are stored in one flat `Vec<u8>` per direction with a fixed stride, **already in visit
//! order**: uplink frames in a seeded shuffle of all flows, reply frames grouped by VM port and
//! shuffled within each port. Reading them is then a sequential stream (like a NIC writing fresh
//! packets into its ring) while the flow-table accesses they cause are random. Everything is a
//! pure function of [`WorkloadConfig`], seed included (SplitMix64, no other randomness).

use crate::conntrack::ConntrackConfig;
use crate::flow_table::{FlowTableConfig, FullPolicy};
use crate::ids::{Direction, PortId};
use crate::pipeline::PipelineConfig;
use crate::policy::sg::SgAction;
use crate::policy::{
    HostSection, PolicyConfig, PortSection, PortsSection, ProtocolSection, RouteSection,
    RouteTargetSection, RuleSection, SecurityGroupSection, TenantSection,
};
use core::time::Duration;
use spillway_wire::build::{FrameBuilder, VxlanOuter, vxlan_encap};
use spillway_wire::{MacAddr, Vni};

/// Length of every inner frame: the 64-byte minimum Ethernet frame without its 4-byte FCS.
pub const INNER_FRAME_LEN: usize = 60;
/// On-the-wire size the figures are quoted for (inner frame plus FCS).
pub const WIRE_PACKET_BYTES: usize = INNER_FRAME_LEN + 4;
/// Length of an uplink frame: the inner frame behind a 50-byte IPv4 VXLAN outer header.
pub const UPLINK_FRAME_LEN: usize = INNER_FRAME_LEN + spillway_wire::build::VXLAN_V4_OVERHEAD;

/// The uplink's port id.
pub const UPLINK_PORT: PortId = PortId(0);
/// The tenant's VNI.
pub const VNI: u32 = 1001;
/// Our VTEP address.
pub const LOCAL_VTEP: [u8; 4] = [192, 0, 2, 1];
/// Usable sender addresses per /26 route prefix.
const HOSTS_PER_PREFIX: usize = 62;
/// First UDP source port of remote senders.
const SENDER_PORT_BASE: usize = 10_000;
/// The router MAC of the tenant.
const ROUTER_MAC: MacAddr = MacAddr([0x02, 0, 0, 0, 0x01, 0x01]);
const UPLINK_MAC: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 0x01]);
const GATEWAY_MAC: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 0xfe]);
const SENDER_MAC: MacAddr = MacAddr([0x02, 0, 0, 0xee, 0, 0x01]);

/// Workload shape. Everything, including the visit order, follows from these values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkloadConfig {
    /// Number of flows (connections), each with a distinct 5-tuple.
    pub flows: usize,
    /// VM ports on this host, `1..=60_000`.
    pub vm_ports: u32,
    /// Security-group rules per VM port (one group per port), `1..=RULES_PER_PORT_MAX`.
    pub sg_rules: usize,
    /// Routes of the tenant (distinct /26 prefixes under 172.16.0.0/12), `1..=16_384`.
    pub routes: usize,
    /// Remote VTEPs the routes tunnel to, `1..=250`.
    pub remote_vteps: u32,
    /// Seed of the visit order.
    pub seed: u64,
}

impl Default for WorkloadConfig {
    fn default() -> Self {
        WorkloadConfig {
            flows: 1_000_000,
            vm_ports: 64,
            sg_rules: 1_000,
            routes: 10_000,
            remote_vteps: 100,
            seed: 0x5eed,
        }
    }
}

/// Frames of one direction: `count` frames of `frame_len` bytes back to back.
#[derive(Clone, Debug)]
pub struct FrameSet {
    bytes: Vec<u8>,
    frame_len: usize,
}

impl FrameSet {
    fn with_capacity(count: usize, frame_len: usize) -> FrameSet {
        FrameSet {
            bytes: Vec::with_capacity(count * frame_len),
            frame_len,
        }
    }

    fn push(&mut self, frame: &[u8]) {
        assert_eq!(
            frame.len(),
            self.frame_len,
            "all frames of a set have one length"
        );
        self.bytes.extend_from_slice(frame);
    }

    /// Number of frames.
    pub fn len(&self) -> usize {
        self.bytes.len() / self.frame_len
    }

    /// True when the set holds no frame.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// Length of every frame (also the stride).
    pub fn frame_len(&self) -> usize {
        self.frame_len
    }

    /// Frame `i`. Panics when out of range.
    #[inline]
    pub fn get(&self, i: usize) -> &[u8] {
        &self.bytes[i * self.frame_len..(i + 1) * self.frame_len]
    }
}

/// The generated workload. See the module doc.
#[derive(Clone, Debug)]
pub struct Workload {
    config: WorkloadConfig,
    uplink: FrameSet,
    replies: FrameSet,
    /// `reply_ports[p]` is the VM port of reply segment `p`; its frames are
    /// `reply_starts[p]..reply_starts[p + 1]` of `replies`.
    reply_ports: Vec<PortId>,
    reply_starts: Vec<usize>,
}

/// SplitMix64 (Steele, Lea, Flood 2014): the seeded generator of the visit order.
#[derive(Clone, Debug)]
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (Lemire's multiply-shift; the tiny bias is irrelevant for shuffling).
    pub fn below(&mut self, n: usize) -> usize {
        ((u128::from(self.next_u64()) * n as u128) >> 64) as usize
    }

    /// Fisher-Yates shuffle.
    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.below(i + 1);
            v.swap(i, j);
        }
    }
}

/// The five-tuple of flow `f` as `(sender ip, sender port, vm index, vm port)`, plus its route.
#[derive(Clone, Copy, Debug)]
struct FlowSpec {
    route: usize,
    sender_ip: [u8; 4],
    sender_port: u16,
    vm: u32,
    vm_port: u16,
}

impl WorkloadConfig {
    /// Checks the limits documented on the fields.
    pub fn validate(&self) -> Result<(), String> {
        let max_flows =
            self.routes * HOSTS_PER_PREFIX * (usize::from(u16::MAX) - SENDER_PORT_BASE + 1);
        if self.flows == 0 || self.flows > max_flows {
            return Err(format!("flows must be 1..={max_flows}, got {}", self.flows));
        }
        if !(1..=60_000).contains(&self.vm_ports) {
            return Err(format!("vm_ports must be 1..=60000, got {}", self.vm_ports));
        }
        if !(1..=crate::policy::RULES_PER_PORT_MAX).contains(&self.sg_rules) {
            return Err(format!("sg_rules must be 1..=2048, got {}", self.sg_rules));
        }
        if !(1..=16_384).contains(&self.routes) {
            return Err(format!("routes must be 1..=16384, got {}", self.routes));
        }
        if !(1..=250).contains(&self.remote_vteps) {
            return Err(format!(
                "remote_vteps must be 1..=250, got {}",
                self.remote_vteps
            ));
        }
        Ok(())
    }

    fn vm_ip(i: u32) -> [u8; 4] {
        [10, 0, (i / 250) as u8, (i % 250 + 2) as u8]
    }

    fn vm_mac(i: u32) -> MacAddr {
        MacAddr([0x02, 0, 0, 0x01, (i >> 8) as u8, i as u8])
    }

    fn route_base(r: usize) -> [u8; 4] {
        let v = u32::from_be_bytes([172, 16, 0, 0]) + (r as u32) * 64;
        v.to_be_bytes()
    }

    fn vtep_of(&self, r: usize) -> [u8; 4] {
        [198, 51, 100, 1 + (r % self.remote_vteps as usize) as u8]
    }

    fn flow(&self, f: usize) -> FlowSpec {
        let route = f % self.routes;
        let k = f / self.routes;
        let mut sender_ip = Self::route_base(route);
        sender_ip[3] += 1 + (k % HOSTS_PER_PREFIX) as u8;
        FlowSpec {
            route,
            sender_ip,
            sender_port: (SENDER_PORT_BASE + k / HOSTS_PER_PREFIX) as u16,
            vm: (f % self.vm_ports as usize) as u32,
            vm_port: (5000 + (f / 7) % 1000) as u16,
        }
    }

    /// The policy described in the module doc, ready for [`crate::policy::Policy::compile`].
    pub fn policy_config(&self) -> PolicyConfig {
        let ip = |o: [u8; 4]| format!("{}.{}.{}.{}", o[0], o[1], o[2], o[3]);
        let routes = (0..self.routes)
            .map(|r| RouteSection {
                prefix: format!("{}/26", ip(Self::route_base(r))),
                target: RouteTargetSection::Tunnel(ip(self.vtep_of(r))),
            })
            .collect();
        let tenant = TenantSection {
            id: 1,
            name: "bench".into(),
            vni: VNI,
            router_mac: ROUTER_MAC.to_string(),
            subnets: vec!["10.0.0.0/8".into()],
            snat: None,
            router_ips: None,
            routes,
            on_policy_change: None,
        };
        let mut ports = Vec::new();
        let mut groups = Vec::new();
        for i in 0..self.vm_ports {
            ports.push(PortSection {
                id: 1 + i,
                tenant: 1,
                mac: Self::vm_mac(i).to_string(),
                ips: vec![ip(Self::vm_ip(i))],
                security_groups: vec![1 + i],
                mtu: None,
            });
            groups.push(SecurityGroupSection {
                id: 1 + i,
                tenant: 1,
                rules: self.sg_rules(),
            });
        }
        PolicyConfig {
            host: HostSection {
                uplink_port: UPLINK_PORT.0,
                uplink_mac: UPLINK_MAC.to_string(),
                vtep_ip: ip(LOCAL_VTEP),
                gateway_mac: GATEWAY_MAC.to_string(),
                vxlan_port: 4789,
                underlay_mtu: None,
            },
            tenants: vec![tenant],
            ports,
            security_groups: groups,
        }
    }

    /// `sg_rules` rules: all but the last never match the bench traffic; the last admits it.
    fn sg_rules(&self) -> Vec<RuleSection> {
        let name = |s: &str| ProtocolSection::Name(s.into());
        let mut rules: Vec<RuleSection> = (0..self.sg_rules - 1)
            .map(|j| {
                let priority = 1 + j as u32;
                match j % 4 {
                    // TCP from the bench senders' block: wrong protocol.
                    0 => RuleSection {
                        direction: Direction::Ingress,
                        priority,
                        action: SgAction::Deny,
                        protocol: name("tcp"),
                        remote: "172.16.0.0/12".into(),
                        ports: Some(PortsSection::Number(1 + (j % 5000) as i64)),
                    },
                    // UDP from other remotes: wrong source.
                    1 => RuleSection {
                        direction: Direction::Ingress,
                        priority,
                        action: SgAction::Deny,
                        protocol: name("udp"),
                        remote: format!("192.168.{}.0/24", j % 256),
                        ports: None,
                    },
                    // UDP from the senders' block to ports the bench never uses: wrong port.
                    2 => RuleSection {
                        direction: Direction::Ingress,
                        priority,
                        action: SgAction::Deny,
                        protocol: name("udp"),
                        remote: "172.16.0.0/12".into(),
                        ports: Some(PortsSection::Text(format!(
                            "{}-{}",
                            20_000 + j,
                            20_000 + j + 7
                        ))),
                    },
                    // Egress rules: the wrong direction for a connection opened from outside.
                    _ => RuleSection {
                        direction: Direction::Egress,
                        priority,
                        action: SgAction::Allow,
                        protocol: name("udp"),
                        remote: format!("203.0.113.{}/32", j % 256),
                        ports: Some(PortsSection::Number(53)),
                    },
                }
            })
            .collect();
        rules.push(RuleSection {
            direction: Direction::Ingress,
            priority: self.sg_rules as u32 + 1,
            action: SgAction::Allow,
            protocol: name("udp"),
            remote: "172.16.0.0/12".into(),
            ports: Some(PortsSection::Text("5000-5999".into())),
        });
        rules
    }
}

/// A pipeline configuration sized for `flows` connections: a flow table of `2 * flows` entries
/// (forward and reverse) that rejects rather than evicts at the limit (the bench must never
/// evict), conntrack for `flows` connections, and idle timeouts far beyond a bench run.
pub fn pipeline_config(flows: usize) -> PipelineConfig {
    PipelineConfig {
        flow_table: FlowTableConfig {
            capacity: 2 * flows,
            idle_timeout: Duration::from_secs(3_600),
            full: FullPolicy::Reject,
            ..FlowTableConfig::default()
        },
        conntrack: ConntrackConfig {
            capacity: flows,
            timeouts: crate::conntrack::Timeouts {
                udp_unreplied: Duration::from_secs(3_600),
                udp_replied: Duration::from_secs(3_600),
                ..Default::default()
            },
            ..ConntrackConfig::default()
        },
        ..PipelineConfig::default()
    }
}

impl Workload {
    /// Generates the workload; `Err` when the configuration is out of range.
    pub fn new(config: WorkloadConfig) -> Result<Workload, String> {
        config.validate()?;
        let mut rng = SplitMix64(config.seed);
        let payload = [0u8; INNER_FRAME_LEN - 42];
        let vni = Vni::new(VNI).expect("1001 is a valid VNI");

        let mut order: Vec<u32> = (0..config.flows as u32).collect();
        rng.shuffle(&mut order);
        let mut uplink = FrameSet::with_capacity(config.flows, UPLINK_FRAME_LEN);
        for &f in &order {
            let s = config.flow(f as usize);
            let inner = FrameBuilder::new()
                .eth(SENDER_MAC, ROUTER_MAC)
                .ipv4(s.sender_ip, WorkloadConfig::vm_ip(s.vm))
                .udp(s.sender_port, s.vm_port)
                .payload(&payload)
                .build();
            debug_assert_eq!(inner.len(), INNER_FRAME_LEN);
            let outer = VxlanOuter {
                src_mac: GATEWAY_MAC,
                dst_mac: UPLINK_MAC,
                src_ip: config.vtep_of(s.route).into(),
                dst_ip: LOCAL_VTEP.into(),
                src_port: 49152 | (f as u16 & 0x3fff),
                dst_port: 4789,
                vni,
                ttl: 64,
            };
            uplink.push(&vxlan_encap(&inner, &outer));
        }

        // Replies: grouped by VM port, shuffled within the port.
        rng.shuffle(&mut order);
        let n = config.vm_ports as usize;
        let mut by_port: Vec<Vec<u32>> = vec![Vec::new(); n];
        for &f in &order {
            by_port[f as usize % n].push(f);
        }
        let mut replies = FrameSet::with_capacity(config.flows, INNER_FRAME_LEN);
        let mut reply_ports = Vec::with_capacity(n);
        let mut reply_starts = Vec::with_capacity(n + 1);
        for (vm, flows) in by_port.iter().enumerate() {
            reply_ports.push(PortId(1 + vm as u32));
            reply_starts.push(replies.len());
            for &f in flows {
                let s = config.flow(f as usize);
                let frame = FrameBuilder::new()
                    .eth(WorkloadConfig::vm_mac(s.vm), ROUTER_MAC)
                    .ipv4(WorkloadConfig::vm_ip(s.vm), s.sender_ip)
                    .udp(s.vm_port, s.sender_port)
                    .payload(&payload)
                    .build();
                replies.push(&frame);
            }
        }
        reply_starts.push(replies.len());
        Ok(Workload {
            config,
            uplink,
            replies,
            reply_ports,
            reply_starts,
        })
    }

    /// The configuration this workload was built from.
    pub fn config(&self) -> &WorkloadConfig {
        &self.config
    }

    /// The policy (see [`WorkloadConfig::policy_config`]).
    pub fn policy_config(&self) -> PolicyConfig {
        self.config.policy_config()
    }

    /// A pipeline configuration sized for this workload (see [`pipeline_config`]).
    pub fn pipeline_config(&self) -> PipelineConfig {
        pipeline_config(self.config.flows)
    }

    /// Uplink frames (VXLAN to our VTEP, arriving on [`UPLINK_PORT`]) in visit order; the first
    /// packet of each opens its flow's connection.
    pub fn uplink(&self) -> &FrameSet {
        &self.uplink
    }

    /// Reply frames of all VM ports; see [`Workload::reply_segments`] for which port each
    /// arrives on.
    pub fn replies(&self) -> &FrameSet {
        &self.replies
    }

    /// `(port, first frame, end frame)` for each VM port's contiguous run in [`Workload::replies`].
    pub fn reply_segments(&self) -> impl Iterator<Item = (PortId, usize, usize)> + '_ {
        self.reply_ports
            .iter()
            .enumerate()
            .map(|(i, &p)| (p, self.reply_starts[i], self.reply_starts[i + 1]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Verdict;
    use crate::packet::PacketBuf;
    use crate::pipeline::Pipeline;
    use crate::policy::Policy;
    use crate::time::Instant;

    fn small() -> Workload {
        Workload::new(WorkloadConfig {
            flows: 2_000,
            sg_rules: 50,
            routes: 300,
            ..Default::default()
        })
        .unwrap()
    }

    #[test]
    fn workload_is_a_pure_function_of_its_config() {
        let (a, b) = (small(), small());
        assert_eq!(a.uplink.bytes, b.uplink.bytes);
        assert_eq!(a.replies.bytes, b.replies.bytes);
        let c = Workload::new(WorkloadConfig {
            seed: 7,
            ..*a.config()
        })
        .unwrap();
        assert_ne!(
            a.uplink.bytes, c.uplink.bytes,
            "the seed changes the visit order"
        );
    }

    #[test]
    fn every_flow_opens_a_connection_and_its_reply_hits_the_fast_path() {
        let w = small();
        let policy = Policy::compile(w.policy_config(), "workload").unwrap();
        let mut p = Pipeline::new(policy, w.pipeline_config()).unwrap();
        let now = Instant(1);
        for i in 0..w.uplink().len() {
            let mut b = PacketBuf::from_frame(w.uplink().get(i));
            let v = p.process(now, UPLINK_PORT, &mut b);
            assert!(matches!(v, Verdict::Forward(_)), "uplink frame {i}: {v:?}");
            assert_eq!(b.len(), INNER_FRAME_LEN);
        }
        assert_eq!(p.counters().new_connections, 2_000);
        assert_eq!(p.counters().flows_installed, 4_000);
        let before = p.counters().fast_path_hits;
        for (port, start, end) in w.reply_segments() {
            for i in start..end {
                let mut b = PacketBuf::from_frame(w.replies().get(i));
                let v = p.process(now, port, &mut b);
                assert_eq!(v, Verdict::Forward(UPLINK_PORT));
                assert_eq!(b.len(), UPLINK_FRAME_LEN);
            }
        }
        assert_eq!(p.counters().fast_path_hits - before, 2_000);
        assert_eq!(p.counters().slow_path_packets, 2_000);
    }
}
