//! Security-group evaluation: the compiled classifier and its decision type.
//!
//! # Semantics
//!
//! A port's rules are those of all its groups, ordered by precedence `(priority, group id, rule
//! index)`, lower first. The first rule of the packet's direction that matches wins. With no
//! match, ingress is denied and egress allowed. A rule matches when the protocol is equal (or the
//! rule says any), the remote address is inside the rule's prefix (the source for ingress, the
//! destination for egress; an IPv4 prefix never matches an IPv6 address and vice versa) and the
//! destination port is in the rule's range (rules for protocols other than TCP and UDP carry the
//! full range, so ICMP rules match any type and id).
//!
//! # The classifier: bit-vector intersection over elementary intervals
//!
//! For each (direction, family) the rules are sorted by precedence and numbered; a set of rules
//! is a bit vector of `W = ceil(n / 64)` words where bit `i` is the `i`-th rule. Each dimension
//! is cut into elementary intervals on which the set of matching rules is constant, and that set
//! is precomputed per interval:
//! - protocol: one slot per protocol number that some rule names, plus one for all others (only
//!   the any-protocol rules), via a 256-entry slot index;
//! - destination port: at most `2n + 1` intervals of the 16-bit port line, found by binary search;
//! - remote address: at most `2n + 1` intervals of the 32- or 128-bit address line, found by
//!   binary search.
//!
//! A lookup ANDs the three vectors word by word and stops at the first non-zero word; the lowest
//! set bit is the winning rule, because bits are in precedence order. For 1,000 rules that is two
//! binary searches of about 11 steps and at most 16 three-way ANDs: no allocation, no branch per
//! rule, and the same cost whatever the rule contents.
//!
//! Memory: `(slots + port intervals + remote intervals) * W * 8` bytes per table, at most
//! `(257 + 2 * (2n + 1)) * ceil(n / 64) * 8`; about 0.5 MB for 1,000 rules and 2.2 MB for the
//! limit [`RULES_PER_PORT_MAX`] = 2,048. The compiler enforces that limit per port and shares one
//! classifier between all ports with the same list of groups, so memory is bounded by
//! (distinct group lists) x 2.2 MB.

use super::prefix::{Family, Prefix, addr_bits};
use crate::ids::{Direction, SecurityGroupId};
use crate::verdict::DropReason;
use spillway_wire::FlowKey;

/// The most rules (all groups, both directions) one port may carry; bounds classifier memory.
pub const RULES_PER_PORT_MAX: usize = 2048;

/// What a rule does when it matches.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SgAction {
    /// Let the connection through.
    Allow,
    /// Drop the connection's first packet.
    Deny,
}

/// One compiled security-group rule.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct SgRule {
    /// The group holding the rule.
    pub group: SecurityGroupId,
    /// The rule's index within its group, as written in the config.
    pub index: u32,
    /// Lower is evaluated first.
    pub priority: u32,
    /// Direction relative to the VM.
    pub direction: Direction,
    /// What a match does.
    pub action: SgAction,
    /// IP protocol number; `None` matches any.
    pub protocol: Option<u8>,
    /// The remote end's prefix (source for ingress, destination for egress).
    pub remote: Prefix,
    /// Inclusive destination-port range; `(0, 65535)` when unrestricted.
    pub ports: (u16, u16),
}

impl SgRule {
    /// Precedence key: lower evaluates first.
    pub fn precedence(&self) -> (u32, SecurityGroupId, u32) {
        (self.priority, self.group, self.index)
    }

    /// Whether the rule matches a packet, by direct comparison (the oracle for the classifier).
    pub fn matches(&self, dir: Direction, key: &FlowKey) -> bool {
        let remote = match dir {
            Direction::Ingress => key.src_ip,
            Direction::Egress => key.dst_ip,
        };
        self.direction == dir
            && self.protocol.is_none_or(|p| p == key.proto)
            && self.remote.contains(remote)
            && (self.ports.0..=self.ports.1).contains(&key.dst_port)
    }
}

/// The outcome of evaluating a port's security groups for the first packet of a connection.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum SgDecision {
    /// A rule allowed it.
    Allow {
        /// The group holding the rule.
        group: SecurityGroupId,
        /// The rule's index within its group.
        rule: u32,
    },
    /// A rule denied it.
    Deny {
        /// The group holding the rule.
        group: SecurityGroupId,
        /// The rule's index within its group.
        rule: u32,
    },
    /// No rule matched an egress packet: allowed by default.
    DefaultAllow,
    /// No rule matched an ingress packet (or the port is unknown): denied by default.
    DefaultDeny,
}

impl SgDecision {
    /// True for `Allow` and `DefaultAllow`.
    pub fn is_allow(self) -> bool {
        matches!(self, SgDecision::Allow { .. } | SgDecision::DefaultAllow)
    }

    /// The drop reason for a denial, `None` when allowed.
    pub fn drop_reason(self) -> Option<DropReason> {
        match self {
            SgDecision::Allow { .. } | SgDecision::DefaultAllow => None,
            SgDecision::Deny { group, rule } => Some(DropReason::SecurityGroupDeny { group, rule }),
            SgDecision::DefaultDeny => Some(DropReason::SecurityGroupDefaultDeny),
        }
    }

    /// The default for a direction when no rule matches.
    pub fn default_for(dir: Direction) -> SgDecision {
        match dir {
            Direction::Ingress => SgDecision::DefaultDeny,
            Direction::Egress => SgDecision::DefaultAllow,
        }
    }

    fn of_rule(rule: &SgRule) -> SgDecision {
        match rule.action {
            SgAction::Allow => SgDecision::Allow {
                group: rule.group,
                rule: rule.index,
            },
            SgAction::Deny => SgDecision::Deny {
                group: rule.group,
                rule: rule.index,
            },
        }
    }
}

/// One (direction, family) slice of a port's rules, indexed for lookup.
#[derive(Clone, Debug, Default)]
struct SgTable {
    /// Rules in precedence order; bit `i` of every vector is `rules[i]`.
    rules: Vec<SgRule>,
    /// Words per bit vector.
    words: usize,
    /// Protocol number to slot in `proto_bits`; slot 0 is "a protocol no rule names".
    proto_slot: Vec<u16>,
    proto_bits: Vec<u64>,
    port_starts: Vec<u16>,
    port_bits: Vec<u64>,
    remote_starts: Vec<u128>,
    remote_bits: Vec<u64>,
}

impl SgTable {
    fn build(mut rules: Vec<SgRule>) -> SgTable {
        rules.sort_by_key(SgRule::precedence);
        let n = rules.len();
        let words = n.div_ceil(64);
        let set_of = |pred: &dyn Fn(&SgRule) -> bool, out: &mut Vec<u64>| {
            let base = out.len();
            out.resize(base + words, 0);
            for (i, r) in rules.iter().enumerate() {
                if pred(r) {
                    out[base + i / 64] |= 1 << (i % 64);
                }
            }
        };

        // Protocol slots, in ascending protocol order so the layout is deterministic.
        let mut protos: Vec<u8> = rules.iter().filter_map(|r| r.protocol).collect();
        protos.sort_unstable();
        protos.dedup();
        let mut proto_slot = vec![0u16; 256];
        let mut proto_bits = Vec::new();
        set_of(&|r| r.protocol.is_none(), &mut proto_bits);
        for (slot, &p) in protos.iter().enumerate() {
            proto_slot[usize::from(p)] = u16::try_from(slot + 1).expect("at most 256 protocols");
            set_of(&|r| r.protocol.is_none_or(|q| q == p), &mut proto_bits);
        }

        // Destination-port elementary intervals.
        let mut cuts: Vec<u32> = vec![0];
        for r in &rules {
            cuts.push(u32::from(r.ports.0));
            cuts.push(u32::from(r.ports.1) + 1);
        }
        cuts.retain(|&c| c <= u32::from(u16::MAX));
        cuts.sort_unstable();
        cuts.dedup();
        let port_starts: Vec<u16> = cuts
            .iter()
            .map(|&c| u16::try_from(c).expect("cuts filtered to the port range"))
            .collect();
        let mut port_bits = Vec::new();
        for &s in &port_starts {
            set_of(&|r| r.ports.0 <= s && s <= r.ports.1, &mut port_bits);
        }

        // Remote-address elementary intervals in the family's integer space.
        let mut cuts: Vec<u128> = vec![0];
        for r in &rules {
            let (lo, hi) = r.remote.range();
            cuts.push(lo);
            if let Some(next) = hi.checked_add(1) {
                cuts.push(next);
            }
        }
        cuts.sort_unstable();
        cuts.dedup();
        let mut remote_bits = Vec::new();
        for &s in &cuts {
            set_of(
                &|r| {
                    let (lo, hi) = r.remote.range();
                    lo <= s && s <= hi
                },
                &mut remote_bits,
            );
        }
        SgTable {
            rules,
            words,
            proto_slot,
            proto_bits,
            port_starts,
            port_bits,
            remote_starts: cuts,
            remote_bits,
        }
    }

    #[inline]
    fn first_match(&self, proto: u8, dst_port: u16, remote: u128) -> Option<&SgRule> {
        if self.rules.is_empty() {
            return None;
        }
        let w = self.words;
        let slot = usize::from(self.proto_slot[usize::from(proto)]);
        // Both start arrays begin at 0, so the partition point is at least 1.
        let pi = self.port_starts.partition_point(|&s| s <= dst_port) - 1;
        let ri = self.remote_starts.partition_point(|&s| s <= remote) - 1;
        let a = &self.proto_bits[slot * w..(slot + 1) * w];
        let b = &self.port_bits[pi * w..(pi + 1) * w];
        let c = &self.remote_bits[ri * w..(ri + 1) * w];
        for (i, ((x, y), z)) in a.iter().zip(b).zip(c).enumerate() {
            let m = x & y & z;
            if m != 0 {
                return Some(&self.rules[i * 64 + m.trailing_zeros() as usize]);
            }
        }
        None
    }

    fn memory_bytes(&self) -> usize {
        8 * (self.proto_bits.len() + self.port_bits.len() + self.remote_bits.len())
            + 2 * (self.proto_slot.len() + self.port_starts.len())
            + 16 * self.remote_starts.len()
            + core::mem::size_of::<SgRule>() * self.rules.len()
    }
}

/// The compiled security groups of one port (or of every port with the same list of groups).
#[derive(Clone, Debug)]
pub struct SgClassifier {
    /// Indexed by `[direction][family]`.
    tables: [[SgTable; 2]; 2],
}

fn dir_index(dir: Direction) -> usize {
    match dir {
        Direction::Ingress => 0,
        Direction::Egress => 1,
    }
}

impl SgClassifier {
    /// Compile a port's rules (all its groups, any order).
    pub fn build(rules: &[SgRule]) -> SgClassifier {
        let slice = |dir: Direction, family: Family| {
            SgTable::build(
                rules
                    .iter()
                    .filter(|r| r.direction == dir && r.remote.family() == family)
                    .copied()
                    .collect(),
            )
        };
        SgClassifier {
            tables: [
                [
                    slice(Direction::Ingress, Family::V4),
                    slice(Direction::Ingress, Family::V6),
                ],
                [
                    slice(Direction::Egress, Family::V4),
                    slice(Direction::Egress, Family::V6),
                ],
            ],
        }
    }

    /// Evaluate the first packet of a connection. No allocation.
    #[inline]
    pub fn evaluate(&self, dir: Direction, key: &FlowKey) -> SgDecision {
        let remote = match dir {
            Direction::Ingress => key.src_ip,
            Direction::Egress => key.dst_ip,
        };
        let family = match Family::of(remote) {
            Family::V4 => 0,
            Family::V6 => 1,
        };
        let table = &self.tables[dir_index(dir)][family];
        match table.first_match(key.proto, key.dst_port, addr_bits(remote)) {
            Some(rule) => SgDecision::of_rule(rule),
            None => SgDecision::default_for(dir),
        }
    }

    /// Bytes of heap held by the index (for the memory bound in the module doc).
    pub fn memory_bytes(&self) -> usize {
        self.tables
            .iter()
            .flatten()
            .map(SgTable::memory_bytes)
            .sum()
    }
}

/// The linear-scan oracle: the matching rule of least precedence, else the default.
#[cfg(test)]
pub(crate) fn reference_evaluate(rules: &[SgRule], dir: Direction, key: &FlowKey) -> SgDecision {
    rules
        .iter()
        .filter(|r| r.matches(dir, key))
        .min_by_key(|r| r.precedence())
        .map_or(SgDecision::default_for(dir), SgDecision::of_rule)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use spillway_wire::{IpAddr16, ip_proto};

    fn rule(group: u32, index: u32, priority: u32, action: SgAction) -> SgRule {
        SgRule {
            group: SecurityGroupId(group),
            index,
            priority,
            direction: Direction::Ingress,
            action,
            protocol: Some(ip_proto::TCP),
            remote: "0.0.0.0/0".parse().expect("prefix"),
            ports: (0, u16::MAX),
        }
    }

    fn key(src: [u8; 4], dst: [u8; 4], proto: u8, dport: u16) -> FlowKey {
        FlowKey {
            src_ip: IpAddr16::from_v4(src),
            dst_ip: IpAddr16::from_v4(dst),
            src_port: 40000,
            dst_port: dport,
            proto,
        }
    }

    #[test]
    fn lower_priority_number_wins_then_group_then_index() {
        let rules = [
            rule(2, 0, 100, SgAction::Allow),
            rule(1, 1, 100, SgAction::Deny),
            rule(1, 0, 200, SgAction::Allow),
            rule(1, 2, 100, SgAction::Allow),
        ];
        let c = SgClassifier::build(&rules);
        let k = key([1, 2, 3, 4], [10, 0, 0, 1], ip_proto::TCP, 22);
        // Priority 100 ties between group 1 and 2; group 1 is lower; within it rule 1 < rule 2.
        let d = c.evaluate(Direction::Ingress, &k);
        assert_eq!(
            d,
            SgDecision::Deny {
                group: SecurityGroupId(1),
                rule: 1
            }
        );
        assert_eq!(
            d.drop_reason(),
            Some(DropReason::SecurityGroupDeny {
                group: SecurityGroupId(1),
                rule: 1
            })
        );
    }

    #[test]
    fn defaults_deny_ingress_and_allow_egress() {
        let c = SgClassifier::build(&[]);
        let k = key([1, 2, 3, 4], [10, 0, 0, 1], ip_proto::UDP, 53);
        assert_eq!(c.evaluate(Direction::Ingress, &k), SgDecision::DefaultDeny);
        assert_eq!(c.evaluate(Direction::Egress, &k), SgDecision::DefaultAllow);
        assert_eq!(
            SgDecision::DefaultDeny.drop_reason(),
            Some(DropReason::SecurityGroupDefaultDeny)
        );
        assert_eq!(SgDecision::DefaultAllow.drop_reason(), None);
    }

    #[test]
    fn ingress_matches_source_and_egress_matches_destination() {
        let mut r = rule(1, 0, 1, SgAction::Allow);
        r.remote = "192.0.2.0/24".parse().expect("prefix");
        r.ports = (443, 443);
        let mut e = r;
        e.direction = Direction::Egress;
        e.action = SgAction::Deny;
        let c = SgClassifier::build(&[r, e]);
        let inbound = key([192, 0, 2, 7], [10, 0, 0, 1], ip_proto::TCP, 443);
        assert!(c.evaluate(Direction::Ingress, &inbound).is_allow());
        let wrong_port = key([192, 0, 2, 7], [10, 0, 0, 1], ip_proto::TCP, 444);
        assert_eq!(
            c.evaluate(Direction::Ingress, &wrong_port),
            SgDecision::DefaultDeny
        );
        let outbound = key([10, 0, 0, 1], [192, 0, 2, 7], ip_proto::TCP, 443);
        assert!(!c.evaluate(Direction::Egress, &outbound).is_allow());
        // The same addresses with the remote on the wrong side do not match.
        let reversed = key([10, 0, 0, 1], [192, 0, 2, 7], ip_proto::TCP, 443);
        assert_eq!(
            c.evaluate(Direction::Ingress, &reversed),
            SgDecision::DefaultDeny
        );
    }

    #[test]
    fn v4_rules_never_match_v6_packets() {
        let c = SgClassifier::build(&[rule(1, 0, 1, SgAction::Allow)]);
        let k = FlowKey {
            src_ip: IpAddr16::from_v6([0xfd; 16]),
            dst_ip: IpAddr16::from_v6([0xfe; 16]),
            src_port: 1,
            dst_port: 80,
            proto: ip_proto::TCP,
        };
        assert_eq!(c.evaluate(Direction::Ingress, &k), SgDecision::DefaultDeny);
    }

    #[test]
    fn icmp_rules_match_any_type() {
        let mut r = rule(1, 0, 1, SgAction::Allow);
        r.protocol = Some(ip_proto::ICMP);
        let c = SgClassifier::build(&[r]);
        for dport in [0u16, 0x0800, 0x0300, 12345] {
            let k = key([1, 1, 1, 1], [10, 0, 0, 1], ip_proto::ICMP, dport);
            assert!(c.evaluate(Direction::Ingress, &k).is_allow());
        }
        let k = key([1, 1, 1, 1], [10, 0, 0, 1], ip_proto::UDP, 0);
        assert_eq!(c.evaluate(Direction::Ingress, &k), SgDecision::DefaultDeny);
    }

    fn arb_rule() -> impl Strategy<Value = SgRule> {
        (
            (0u32..4, 0u32..8, 0u32..6),
            any::<bool>(),
            any::<bool>(),
            prop_oneof![
                Just(None),
                Just(Some(ip_proto::TCP)),
                Just(Some(ip_proto::UDP)),
                Just(Some(ip_proto::ICMP)),
                Just(Some(ip_proto::ICMPV6)),
            ],
            (any::<bool>(), any::<[u8; 4]>(), 0u8..=32, 0u8..=128),
            (any::<bool>(), 0u16..100, 0u16..100),
        )
            .prop_map(
                |((g, i, pr), ingress, allow, protocol, (v4, a, l4, l6), (anyp, lo, span))| {
                    let remote = if v4 {
                        Prefix::new(IpAddr16::from_v4([10, a[1] & 3, a[2], a[3]]), l4)
                    } else {
                        let mut o = [0u8; 16];
                        o[0] = 0xfd;
                        o[1] = a[1] & 3;
                        o[14] = a[2];
                        o[15] = a[3];
                        Prefix::new(IpAddr16::from_v6(o), l6)
                    }
                    .expect("length in range");
                    let tcp_udp = matches!(protocol, Some(ip_proto::TCP | ip_proto::UDP));
                    SgRule {
                        group: SecurityGroupId(g),
                        index: i,
                        priority: pr * 10,
                        direction: if ingress {
                            Direction::Ingress
                        } else {
                            Direction::Egress
                        },
                        action: if allow {
                            SgAction::Allow
                        } else {
                            SgAction::Deny
                        },
                        protocol,
                        remote,
                        ports: if anyp || !tcp_udp {
                            (0, u16::MAX)
                        } else {
                            (lo, lo + span)
                        },
                    }
                },
            )
    }

    fn arb_key() -> impl Strategy<Value = FlowKey> {
        (
            any::<bool>(),
            any::<[u8; 4]>(),
            any::<[u8; 4]>(),
            prop_oneof![
                Just(ip_proto::TCP),
                Just(ip_proto::UDP),
                Just(ip_proto::ICMP),
                Just(ip_proto::ICMPV6),
                Just(47u8)
            ],
            prop_oneof![0u16..200, any::<u16>()],
        )
            .prop_map(|(v4, s, d, proto, dport)| {
                let ip = |o: [u8; 4]| {
                    if v4 {
                        IpAddr16::from_v4([10, o[1] & 3, o[2], o[3]])
                    } else {
                        let mut b = [0u8; 16];
                        b[0] = 0xfd;
                        b[1] = o[1] & 3;
                        b[14] = o[2];
                        b[15] = o[3];
                        IpAddr16::from_v6(b)
                    }
                };
                FlowKey {
                    src_ip: ip(s),
                    dst_ip: ip(d),
                    src_port: 1000,
                    dst_port: dport,
                    proto,
                }
            })
    }

    proptest! {
        #[test]
        fn classifier_matches_linear_scan(
            rules in proptest::collection::vec(arb_rule(), 0..150),
            keys in proptest::collection::vec(arb_key(), 1..64),
        ) {
            // Precedence keys must be unique, as the compiler guarantees (one index per rule).
            let mut rules = rules;
            let mut seen = std::collections::BTreeSet::new();
            rules.retain(|r| seen.insert((r.group, r.index)));
            let c = SgClassifier::build(&rules);
            for k in &keys {
                for dir in [Direction::Ingress, Direction::Egress] {
                    prop_assert_eq!(c.evaluate(dir, k), reference_evaluate(&rules, dir, k),
                        "dir {:?} key {}", dir, k);
                }
            }
        }
    }
}
