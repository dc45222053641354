//! ICMP and ICMPv6 connection tracking against the rules of Linux `nf_conntrack`
//! (`nf_conntrack_proto_icmp.c`, `nf_conntrack_proto_icmpv6.c`): only a query (ICMP echo,
//! timestamp, information and address-mask requests; ICMPv6 echo request and node-information
//! query) opens a connection; its reply direction expects the answering type with the same
//! identifier; a reply that answers nothing is invalid; a request from the other side with the
//! same identifier is a connection of its own and must pass its own security groups.
//!
//! The scenario tests drive real frames through `Pipeline::process` with the fast path on and
//! off, one for each of the three bypasses the old flow key allowed (it carried the identifier in
//! both ports and no type): an unsolicited reply forwarded and opening state, a request riding
//! that state past the receiver's ingress rules, and a VM pinging back a peer with the peer's
//! identifier treated as a reply. The property test runs random security groups (three VMs,
//! ingress ICMP allowed from all, from one peer or from none; egress ICMP allowed or denied) and
//! random ICMP/ICMPv6 traffic among them through both pipelines and a tiny reference model of
//! nf_conntrack's ICMP rules written from the kernel's `valid_new` and `invmap` tables, and
//! requires the same verdict for every packet.

mod common;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::{Ipv4Addr, Ipv6Addr};

use common::{routed, run, secs};
use proptest::prelude::*;
use spillway_vswitch::conntrack::{Conntrack, ConntrackConfig, CtError};
use spillway_vswitch::flow_table::FlowTableConfig;
use spillway_vswitch::pipeline::{Pipeline, PipelineConfig};
use spillway_vswitch::policy::Policy;
use spillway_vswitch::{DropKind, DropReason, Instant, PortId, TenantId, Verdict};
use spillway_wire::build::FrameBuilder;
use spillway_wire::{FlowKey, IpAddr16, MacAddr, checksum, ip_proto};

const ROUTER: MacAddr = MacAddr([2, 0, 0, 0, 1, 1]);

/// A VM's ICMP security groups (both families alike).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ingress {
    /// No ingress ICMP rule: default deny.
    Deny,
    /// ICMP from anywhere.
    All,
    /// ICMP from VM `j` only.
    From(usize),
}

#[derive(Clone, Copy, Debug)]
struct VmSg {
    ingress: Ingress,
    /// An egress rule denies ICMP to anywhere (egress is allowed by default).
    egress_deny: bool,
}

fn port(i: usize) -> PortId {
    PortId(1 + i as u32)
}
fn mac(i: usize) -> MacAddr {
    MacAddr([2, 0, 0, 0, 0, 0x10 + i as u8])
}
fn ip4(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 0, 0, 10 + i as u8)
}
fn ip6(i: usize) -> Ipv6Addr {
    Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 0x10 + i as u16)
}

/// One tenant with a VM per entry of `vms`, each in its own security group.
fn policy(vms: &[VmSg]) -> Policy {
    let mut t = String::from(
        r#"
[host]
uplink_port = 0
uplink_mac = "02:00:00:00:00:01"
vtep_ip = "192.0.2.1"
gateway_mac = "02:00:00:00:00:fe"
vxlan_port = 4789

[[tenant]]
id = 1
name = "t"
vni = 100
router_mac = "02:00:00:00:01:01"
subnets = ["10.0.0.0/24", "fd00::/64"]
"#,
    );
    for i in 0..vms.len() {
        writeln!(
            t,
            "[[port]]\nid = {}\ntenant = 1\nmac = \"{}\"\nips = [\"{}\", \"{}\"]\nsecurity_groups = [{}]",
            port(i).0,
            mac(i),
            ip4(i),
            ip6(i),
            100 + i
        )
        .unwrap();
    }
    let rule = |t: &mut String, dir: &str, prio: u32, action: &str, proto: &str, remote: &str| {
        writeln!(
            t,
            "[[security_group.rule]]\ndirection = \"{dir}\"\npriority = {prio}\naction = \"{action}\"\nprotocol = \"{proto}\"\nremote = \"{remote}\""
        )
        .unwrap();
    };
    for (i, vm) in vms.iter().enumerate() {
        writeln!(t, "[[security_group]]\nid = {}\ntenant = 1", 100 + i).unwrap();
        // Keeps every group non-empty.
        rule(&mut t, "ingress", 900, "allow", "tcp", "0.0.0.0/0");
        match vm.ingress {
            Ingress::Deny => {}
            Ingress::All => {
                rule(&mut t, "ingress", 100, "allow", "icmp", "0.0.0.0/0");
                rule(&mut t, "ingress", 100, "allow", "icmpv6", "::/0");
            }
            Ingress::From(j) => {
                rule(
                    &mut t,
                    "ingress",
                    100,
                    "allow",
                    "icmp",
                    &format!("{}/32", ip4(j)),
                );
                rule(
                    &mut t,
                    "ingress",
                    100,
                    "allow",
                    "icmpv6",
                    &format!("{}/128", ip6(j)),
                );
            }
        }
        if vm.egress_deny {
            rule(&mut t, "egress", 100, "deny", "icmp", "0.0.0.0/0");
            rule(&mut t, "egress", 100, "deny", "icmpv6", "::/0");
        }
    }
    Policy::from_toml_str(&t, "icmp_state.toml").expect("the test policy compiles")
}

fn pipeline(vms: &[VmSg], fast_path: bool) -> Pipeline {
    Pipeline::new(
        policy(vms),
        // Small tables: `common::run` checks every table's invariants after each packet.
        PipelineConfig {
            fast_path,
            flow_table: FlowTableConfig {
                capacity: 256,
                ..FlowTableConfig::default()
            },
            conntrack: ConntrackConfig {
                capacity: 256,
                ..ConntrackConfig::default()
            },
            ..PipelineConfig::default()
        },
    )
    .expect("valid pipeline config")
}

/// An ICMP (or ICMPv6 when `v6`) message from VM `from` to VM `to`, with the identifier in
/// bytes 4..6 (zero bytes 6..8) and a valid checksum.
fn icmp(from: usize, to: usize, v6: bool, msg_type: u8, code: u8, id: u16) -> Vec<u8> {
    let b = FrameBuilder::new().eth(mac(from), ROUTER);
    let b = if v6 {
        b.ipv6(ip6(from), ip6(to))
    } else {
        b.ipv4(ip4(from), ip4(to))
    };
    let mut f = b.icmp(msg_type, code).payload(b"icmp").build();
    let l4 = if v6 { 54 } else { 34 };
    f[l4 + 4..l4 + 6].copy_from_slice(&id.to_be_bytes());
    let c = u16::from_be_bytes([f[l4 + 2], f[l4 + 3]]);
    f[l4 + 2..l4 + 4].copy_from_slice(&checksum::update16(c, 0, id).to_be_bytes());
    f
}

fn echo(from: usize, to: usize, v6: bool, reply: bool, id: u16) -> Vec<u8> {
    let t = match (v6, reply) {
        (false, false) => 8,
        (false, true) => 0,
        (true, false) => 128,
        (true, true) => 129,
    };
    icmp(from, to, v6, t, 0, id)
}

const OPEN: VmSg = VmSg {
    ingress: Ingress::All,
    egress_deny: false,
};
const CLOSED: VmSg = VmSg {
    ingress: Ingress::Deny,
    egress_deny: false,
};

fn each_mode(mut f: impl FnMut(bool, bool)) {
    for v6 in [false, true] {
        for fast in [true, false] {
            f(v6, fast);
        }
    }
}

#[test]
fn unsolicited_echo_reply_is_dropped_and_opens_no_state() {
    each_mode(|v6, fast| {
        let mut p = pipeline(&[OPEN, OPEN], fast);
        let (v, _, _) = run(&mut p, secs(1), port(0), &echo(0, 1, v6, true, 9));
        assert_eq!(
            v,
            Verdict::Drop(DropReason::IcmpUnsolicitedReply),
            "v6 {v6}"
        );
        assert!(p.conntrack().is_empty(), "no state opened");
        assert_eq!(p.drops().get(DropKind::IcmpUnsolicitedReply), 1);
        assert!(
            p.drops()
                .iter()
                .any(|(n, c)| n == "vswitch.drop.icmp_unsolicited_reply" && c == 1)
        );
    });
}

#[test]
fn echo_request_does_not_ride_state_of_an_unsolicited_reply() {
    // VM 0 denies ICMP in; VM 1 admits it. VM 0 "answers" a ping that never reached it.
    each_mode(|v6, fast| {
        let mut p = pipeline(&[CLOSED, OPEN], fast);
        let (reply, _, _) = run(&mut p, secs(1), port(0), &echo(0, 1, v6, true, 9));
        for t in [2, 3] {
            let (v, _, _) = run(&mut p, secs(t), port(1), &echo(1, 0, v6, false, 9));
            assert_eq!(
                v,
                Verdict::Drop(DropReason::SecurityGroupDefaultDeny),
                "v6 {v6} fast {fast}: the request meets VM 0's ingress rules"
            );
        }
        assert_eq!(reply, Verdict::Drop(DropReason::IcmpUnsolicitedReply));
    });
}

#[test]
fn pinging_back_with_the_peers_identifier_meets_the_peers_ingress_rules() {
    // VM 0 denies ICMP in and pings VM 1; VM 1 answers, then pings VM 0 with the same identifier.
    each_mode(|v6, fast| {
        let mut p = pipeline(&[CLOSED, OPEN], fast);
        let (v, _, _) = run(&mut p, secs(1), port(0), &echo(0, 1, v6, false, 42));
        assert_eq!(v, Verdict::Forward(port(1)));
        let (v, _, hit) = run(&mut p, secs(1), port(1), &echo(1, 0, v6, true, 42));
        assert_eq!(v, Verdict::Forward(port(0)), "the real reply passes");
        assert_eq!(hit, fast, "on the reverse entry when the fast path is on");
        for t in [2, 3] {
            let (v, _, _) = run(&mut p, secs(t), port(1), &echo(1, 0, v6, false, 42));
            assert_eq!(
                v,
                Verdict::Drop(DropReason::SecurityGroupDefaultDeny),
                "v6 {v6} fast {fast}: a request is not the reply of VM 0's ping"
            );
        }
        assert_eq!(p.conntrack().len(), 1);
    });
}

#[test]
fn a_reply_never_hits_the_entry_of_a_request_with_its_identifier() {
    each_mode(|v6, fast| {
        let mut p = pipeline(&[OPEN, OPEN], fast);
        let (v, _, _) = run(&mut p, secs(1), port(0), &echo(0, 1, v6, false, 5));
        assert_eq!(v, Verdict::Forward(port(1)));
        let (v, _, hit) = run(&mut p, secs(1), port(0), &echo(0, 1, v6, false, 5));
        assert_eq!(
            (v, hit),
            (Verdict::Forward(port(1)), fast),
            "repeat request"
        );
        // The same sender, the same identifier, but a reply: no entry and no state is its own.
        let (v, _, hit) = run(&mut p, secs(1), port(0), &echo(0, 1, v6, true, 5));
        assert_eq!(
            (v, hit),
            (Verdict::Drop(DropReason::IcmpUnsolicitedReply), false)
        );
    });
}

#[test]
fn only_queries_open_icmp_state_as_in_nf_conntrack() {
    // (v6, type, what happens to it as the first packet of a flow)
    use DropReason::{
        IcmpErrorUnrelated as Err_, IcmpUnsolicitedReply as Rep, IcmpUntracked as Oth,
    };
    let cases: &[(bool, u8, Option<DropReason>)] = &[
        (false, 8, None),
        (false, 13, None),
        (false, 15, None),
        (false, 17, None),
        (false, 0, Some(Rep)),
        (false, 14, Some(Rep)),
        (false, 16, Some(Rep)),
        (false, 18, Some(Rep)),
        (false, 3, Some(Err_)),
        (false, 4, Some(Err_)),
        (false, 5, Some(Err_)),
        (false, 11, Some(Err_)),
        (false, 12, Some(Err_)),
        (false, 9, Some(Oth)),
        (false, 10, Some(Oth)),
        (false, 42, Some(Oth)),
        (true, 128, None),
        (true, 139, None),
        (true, 129, Some(Rep)),
        (true, 140, Some(Rep)),
        (true, 1, Some(Err_)),
        (true, 2, Some(Err_)),
        (true, 3, Some(Err_)),
        (true, 4, Some(Err_)),
        // Neighbour discovery and MLD from a VM go to the responder (tests/neigh.rs); the
        // other non-query types stay untracked: inverse ND, multicast router discovery.
        (true, 141, Some(Oth)),
        (true, 151, Some(Oth)),
        (true, 200, Some(Oth)),
    ];
    for &(v6, t, want) in cases {
        let mut p = pipeline(&[OPEN, OPEN], true);
        let (v, _, _) = run(&mut p, secs(1), port(0), &icmp(0, 1, v6, t, 0, 3));
        let want_v = match want {
            None => Verdict::Forward(port(1)),
            Some(r) => Verdict::Drop(r),
        };
        assert_eq!(v, want_v, "v6 {v6} type {t}");
        assert_eq!(
            p.conntrack().len(),
            usize::from(want.is_none()),
            "v6 {v6} type {t}"
        );
    }
}

#[test]
fn conntrack_refuses_to_open_icmp_state_with_anything_but_a_query() {
    let mut t = Conntrack::new(ConntrackConfig::default()).expect("valid config");
    let key = |v6: bool, ty: u8, id: u16| {
        let (src_ip, dst_ip, proto) = if v6 {
            (
                IpAddr16::from(ip6(0)),
                IpAddr16::from(ip6(1)),
                ip_proto::ICMPV6,
            )
        } else {
            (
                IpAddr16::from(ip4(0)),
                IpAddr16::from(ip4(1)),
                ip_proto::ICMP,
            )
        };
        FlowKey {
            src_ip,
            dst_ip,
            src_port: id,
            dst_port: u16::from(ty) << 8,
            proto,
        }
    };
    let z = TenantId(1);
    let now = Instant(1);
    let mut invalid = 0;
    for (v6, ty) in [
        (false, 0),
        (false, 3),
        (false, 9),
        (true, 129),
        (true, 1),
        (true, 135),
    ] {
        let k = key(v6, ty, 7);
        assert_eq!(
            t.create(now, z, k, k.reversed(), 0, 0, |_| {}),
            Err(CtError::Invalid),
            "v6 {v6} type {ty}"
        );
        invalid += 1;
        assert_eq!(t.counters().invalid, invalid);
    }
    for v6 in [false, true] {
        let req = key(v6, if v6 { 128 } else { 8 }, 7);
        let h = t
            .create(now, z, req, req.reversed(), 0, 0, |_| {})
            .expect("a request opens");
        let reply = req.reversed();
        assert_eq!(reply.dst_port >> 8, if v6 { 129 } else { 0 });
        assert_eq!(t.lookup(now, z, &reply).map(|(h, _)| h), Some(h));
        // The other side's request with the same identifier is not the reply direction ...
        let back = FlowKey {
            src_ip: req.dst_ip,
            dst_ip: req.src_ip,
            ..req
        };
        assert_eq!(t.lookup(now, z, &back), None);
        // ... and opens a connection of its own.
        t.create(now, z, back, back.reversed(), 0, 0, |_| {})
            .expect("a request from the other side is a new connection");
    }
    assert_eq!(t.len(), 4);
    t.check_invariants().expect("invariants");
}

// ---- differential test against a reference model of nf_conntrack's ICMP rules ----

/// A message type the property test sends, per family.
#[derive(Clone, Copy, Debug)]
enum Msg {
    EchoRequest,
    EchoReply,
    /// Timestamp (ICMP) or node-information (ICMPv6) query.
    OtherRequest,
    OtherReply,
    /// Destination unreachable with no embedded header.
    Error,
    /// Destination unreachable carrying an echo request (`true`) or reply the receiver of the
    /// error could have sent to its sender with the same identifier.
    ErrorAbout(bool),
    /// Router advertisement (ICMP 9) or inverse neighbour discovery solicitation (ICMPv6 141;
    /// ND proper goes to the neighbour responder).
    Other,
}

impl Msg {
    fn wire_type(self, v6: bool) -> u8 {
        match (self, v6) {
            (Msg::EchoRequest, false) => 8,
            (Msg::EchoReply, false) => 0,
            (Msg::OtherRequest, false) => 13,
            (Msg::OtherReply, false) => 14,
            (Msg::Error | Msg::ErrorAbout(_), false) => 3,
            (Msg::Other, false) => 9,
            (Msg::EchoRequest, true) => 128,
            (Msg::EchoReply, true) => 129,
            (Msg::OtherRequest, true) => 139,
            (Msg::OtherReply, true) => 140,
            (Msg::Error | Msg::ErrorAbout(_), true) => 1,
            (Msg::Other, true) => 141,
        }
    }
}

/// The kernel's tables, written out here rather than taken from the code under test:
/// `valid_new` (types that may open a connection) and `invmap` (request <-> reply).
fn nf_valid_new(v6: bool, t: u8) -> bool {
    if v6 {
        matches!(t, 128 | 139)
    } else {
        matches!(t, 8 | 13 | 15 | 17)
    }
}
fn nf_invert(v6: bool, t: u8) -> Option<u8> {
    let pairs: &[(u8, u8)] = if v6 {
        &[(128, 129), (139, 140)]
    } else {
        &[(8, 0), (13, 14), (15, 16), (17, 18)]
    };
    pairs.iter().find_map(|&(a, b)| {
        if t == a {
            Some(b)
        } else if t == b {
            Some(a)
        } else {
            None
        }
    })
}

/// An nf_conntrack ICMP tuple: (family, src VM, dst VM, identifier, type).
type Tuple = (bool, usize, usize, u16, u8);

/// What became of a packet, coarsely enough that the reference model need not name rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fate {
    Forward(PortId),
    SecurityGroup,
    Invalid,
}

fn fate(v: Verdict) -> Fate {
    match v {
        Verdict::Forward(p) => Fate::Forward(p),
        Verdict::Drop(
            DropReason::SecurityGroupDeny { .. } | DropReason::SecurityGroupDefaultDeny,
        ) => Fate::SecurityGroup,
        Verdict::Drop(
            DropReason::IcmpUnsolicitedReply
            | DropReason::IcmpErrorUnrelated
            | DropReason::IcmpUntracked,
        ) => Fate::Invalid,
        Verdict::Drop(other) => panic!("unexpected drop {other:?}"),
    }
}

/// nf_conntrack with an nftables forward chain `ct state established,related accept; ct state
/// invalid drop; <egress rules of the sender> <ingress rules of the receiver>; drop`.
struct Model {
    vms: Vec<VmSg>,
    /// Live connections: original tuple -> (reply tuple, last seen in seconds).
    conns: BTreeMap<Tuple, (Tuple, u64)>,
}

impl Model {
    const ICMP_TIMEOUT: u64 = 30;

    fn packet(&mut self, now: u64, v6: bool, from: usize, to: usize, t: u8, id: u16) -> Fate {
        self.conns
            .retain(|_, (_, seen)| now - *seen < Self::ICMP_TIMEOUT);
        if t == if v6 { 1 } else { 3 } {
            // An error without an embedded header is never related.
            return Fate::Invalid;
        }
        let tuple = (v6, from, to, id, t);
        let hit = self
            .conns
            .iter_mut()
            .find_map(|(orig, (reply, seen))| (*orig == tuple || *reply == tuple).then_some(seen));
        if let Some(seen) = hit {
            *seen = now;
            return Fate::Forward(port(to));
        }
        if !nf_valid_new(v6, t) {
            return Fate::Invalid;
        }
        let egress_ok = !self.vms[from].egress_deny;
        let ingress_ok = match self.vms[to].ingress {
            Ingress::Deny => false,
            Ingress::All => true,
            Ingress::From(j) => j == from,
        };
        if !(egress_ok && ingress_ok) {
            return Fate::SecurityGroup;
        }
        let inv = nf_invert(v6, t).expect("valid_new types invert");
        self.conns.insert(tuple, ((v6, to, from, id, inv), now));
        Fate::Forward(port(to))
    }

    /// An error from `from` to `to` about a packet `to` sent to `from` with type `t`:
    /// `nf_conntrack_inet_error` inverts the embedded tuple and looks it up; a hit (whose
    /// destination is then `to` by construction) makes it related. It neither steps nor
    /// refreshes the connection.
    fn error_about(&mut self, now: u64, v6: bool, from: usize, to: usize, t: u8, id: u16) -> Fate {
        self.conns
            .retain(|_, (_, seen)| now - *seen < Self::ICMP_TIMEOUT);
        let Some(inv) = nf_invert(v6, t) else {
            return Fate::Invalid;
        };
        let want = (v6, from, to, id, inv);
        if self
            .conns
            .iter()
            .any(|(o, (r, _))| *o == want || *r == want)
        {
            Fate::Forward(port(to))
        } else {
            Fate::Invalid
        }
    }
}

#[derive(Clone, Debug)]
enum Op {
    Packet {
        v6: bool,
        from: usize,
        to: usize,
        msg: Msg,
        id: u16,
    },
    Advance(u64),
}

const VMS: usize = 3;

fn vm_sg() -> impl Strategy<Value = VmSg> {
    (
        prop_oneof![
            Just(Ingress::Deny),
            Just(Ingress::All),
            (0..VMS).prop_map(Ingress::From)
        ],
        prop::bool::weighted(0.2),
    )
        .prop_map(|(ingress, egress_deny)| VmSg {
            ingress,
            egress_deny,
        })
}

fn op() -> impl Strategy<Value = Op> {
    let msg = prop_oneof![
        4 => Just(Msg::EchoRequest),
        4 => Just(Msg::EchoReply),
        1 => Just(Msg::OtherRequest),
        1 => Just(Msg::OtherReply),
        1 => Just(Msg::Error),
        3 => any::<bool>().prop_map(Msg::ErrorAbout),
        1 => Just(Msg::Other),
    ];
    prop_oneof![
        10 => (any::<bool>(), 0..VMS, 1..VMS, msg, 0u16..3).prop_map(|(v6, from, d, msg, id)| {
            Op::Packet { v6, from, to: (from + d) % VMS, msg, id }
        }),
        1 => (0u64..40).prop_map(Op::Advance),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn icmp_admission_matches_nf_conntrack(
        vms in prop::collection::vec(vm_sg(), VMS),
        ops in prop::collection::vec(op(), 1..120),
    ) {
        let mut fast = pipeline(&vms, true);
        let mut slow = pipeline(&vms, false);
        let mut model = Model { vms: vms.clone(), conns: BTreeMap::new() };
        let mut now = 1u64;
        for (step, op) in ops.into_iter().enumerate() {
            match op {
                Op::Advance(dt) => now += dt,
                Op::Packet { v6, from, to, msg, id } => {
                    let t = msg.wire_type(v6);
                    let (frame, want) = match msg {
                        Msg::ErrorAbout(request) => {
                            let about = echo(to, from, v6, !request, id);
                            let et = if v6 { if request { 128 } else { 129 } } else if request { 8 } else { 0 };
                            (error(from, to, v6, t, 3, &about), model.error_about(now, v6, from, to, et, id))
                        }
                        _ => (icmp(from, to, v6, t, 0, id), model.packet(now, v6, from, to, t, id)),
                    };
                    for (name, p) in [("fast", &mut fast), ("slow", &mut slow)] {
                        let (v, _, _) = run(p, secs(now), port(from), &frame);
                        prop_assert_eq!(
                            fate(v), want,
                            "step {} {}: {:?} {} -> {} type {} id {} at {} s ({:?})",
                            step, name, msg, from, to, t, id, now, v
                        );
                    }
                }
            }
        }
    }
}

// ---- ICMP errors: related to a tracked connection, or dropped ----

/// An ICMP (or ICMPv6) error of `msg_type`/`code` from VM `from` to VM `to` carrying the IP packet
/// of `offending` (an Ethernet frame).
fn error(from: usize, to: usize, v6: bool, msg_type: u8, code: u8, offending: &[u8]) -> Vec<u8> {
    let b = FrameBuilder::new().eth(mac(from), ROUTER);
    let b = if v6 {
        b.ipv6(ip6(from), ip6(to))
    } else {
        b.ipv4(ip4(from), ip4(to))
    };
    b.icmp(msg_type, code).payload(&offending[14..]).build()
}

#[test]
fn an_error_about_a_tracked_packet_is_related_and_passes_closed_ingress() {
    // VM 0 admits no ICMP; it pings VM 1, and VM 1 answers with an error about that ping.
    each_mode(|v6, fast| {
        let mut p = pipeline(&[CLOSED, OPEN], fast);
        let ping = echo(0, 1, v6, false, 7);
        let (v, _, _) = run(&mut p, secs(1), port(0), &ping);
        assert_eq!(v, Verdict::Forward(port(1)));
        let unreachable = if v6 { 1 } else { 3 };
        let err = error(1, 0, v6, unreachable, 3, &ping);
        for t in [1, 2] {
            let (v, out, hit) = run(&mut p, secs(t), port(1), &err);
            assert_eq!(
                (v, hit),
                (Verdict::Forward(port(0)), false),
                "v6 {v6} fast {fast}"
            );
            assert_eq!(
                &out[14..],
                &routed(&err)[14..],
                "forwarded unchanged but for the MACs and the TTL"
            );
        }
        assert_eq!(p.counters().icmp_related, 2);
        // The error neither steps nor opens anything.
        assert_eq!(p.conntrack().len(), 1);
        // A TCP connection's error is related in the same way.
        let syn = FrameBuilder::new()
            .eth(mac(0), ROUTER)
            .ipv4(ip4(0), ip4(1))
            .tcp(40000, 22)
            .tcp_flags(0x02)
            .build();
        let (v, _, _) = run(&mut p, secs(3), port(0), &syn);
        assert_eq!(v, Verdict::Forward(port(1)));
        let (v, _, _) = run(&mut p, secs(3), port(1), &error(1, 0, false, 3, 3, &syn));
        assert_eq!(v, Verdict::Forward(port(0)));
    });
}

#[test]
fn errors_that_match_no_connection_or_the_wrong_host_are_dropped() {
    each_mode(|v6, fast| {
        let mut p = pipeline(&[OPEN, OPEN, OPEN], fast);
        let unreachable = if v6 { 1 } else { 3 };
        let ping = echo(0, 1, v6, false, 7);
        // No connection yet: unrelated, although VM 0 admits ICMP.
        let (v, _, _) = run(
            &mut p,
            secs(1),
            port(1),
            &error(1, 0, v6, unreachable, 3, &ping),
        );
        assert_eq!(v, Verdict::Drop(DropReason::IcmpErrorUnrelated));
        run(&mut p, secs(1), port(0), &ping);
        // Addressed to VM 2, not to the embedded packet's sender: unrelated.
        let (v, _, _) = run(
            &mut p,
            secs(1),
            port(1),
            &error(1, 2, v6, unreachable, 3, &ping),
        );
        assert_eq!(v, Verdict::Drop(DropReason::IcmpErrorUnrelated));
        // An error without the offending header is never related.
        let (v, _, _) = run(&mut p, secs(1), port(1), &icmp(1, 0, v6, unreachable, 3, 0));
        assert_eq!(v, Verdict::Drop(DropReason::IcmpErrorUnrelated));
        // After the connection expired, its errors are unrelated too.
        let (v, _, _) = run(
            &mut p,
            secs(40),
            port(1),
            &error(1, 0, v6, unreachable, 3, &ping),
        );
        assert_eq!(v, Verdict::Drop(DropReason::IcmpErrorUnrelated));
        assert_eq!(p.drops().get(DropKind::IcmpErrorUnrelated), 4);
        assert_eq!(p.counters().icmp_related, 0);
    });
}
