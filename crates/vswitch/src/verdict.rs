//! What happens to a packet: forwarded to a port, or dropped for a named, counted reason.
//!
//! A drop is a value, not an error: the pipeline returns it, counts it by [`DropKind`], and the
//! caller decides whether to log it. Errors (`thiserror` enums) are for things the caller must act
//! on (bad config, full table on insert); a dropped packet is ordinary data-plane behaviour.

use crate::ids::{PortId, SecurityGroupId};
use core::fmt;

/// The fate of one packet.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Verdict {
    /// Transmit the (possibly rewritten) frame on this port.
    Forward(PortId),
    /// Drop it, counted under `reason.kind()`.
    Drop(DropReason),
}

/// Why a packet was dropped, naming the layer and, where there is one, the rule.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum DropReason {
    /// The frame did not parse; the wire error says which header and field.
    Malformed(spillway_wire::WireError),
    /// A frame arrived on a port the policy does not know.
    UnknownPort(PortId),
    /// A VXLAN packet carried a VNI no tenant owns.
    UnknownVni(u32),
    /// Anti-spoofing: the source MAC is not the port's MAC.
    SpoofedMac,
    /// Anti-spoofing: the source IP is not one of the port's addresses.
    SpoofedIp,
    /// ARP on the uplink: the host's underlay neighbours are not the vSwitch's business (ARP
    /// from a VM goes to the neighbour responder, [`crate::neigh`]).
    ArpNotRouted,
    /// ARP or IPv6 neighbour discovery / MLD from a VM that the neighbour responder took
    /// without answering: an announcement of the port's own address, a probe or DAD for it, a
    /// request for an address nobody answers for, MLD, RS, or RA/redirect (a VM is not a
    /// router). Not an error; `vswitch.neigh.*` says which.
    NeighConsumed,
    /// ARP or neighbour discovery that fails its RFC's validity checks (RFC 4861 section 7.1.1:
    /// hop limit 255, checksum, lengths, options; RFC 6980: no fragmented ND).
    NeighMalformed,
    /// Neither IPv4 nor IPv6 nor ARP.
    UnsupportedEtherType(u16),
    /// A fragment the vSwitch does not forward: an outer-fragmented VXLAN packet addressed to
    /// our VTEP (overlay packets are not reassembled; see `crate::frag`).
    Fragment,
    /// A later IP fragment whose first fragment was not admitted (never seen, arrived after it,
    /// or dropped): it cannot be checked against any rule, so it is not forwarded.
    FragmentNoFirst,
    /// A fragment overlapping bytes of its datagram already seen (RFC 1858, RFC 5722): the whole
    /// datagram is dropped.
    FragmentOverlap,
    /// More fragments than `FragConfig::fragments_max` for one datagram.
    FragmentTooMany,
    /// No room to track a new fragmented datagram (table or zone budget full).
    FragmentTableFull,
    /// A later fragment arrived after its datagram's tracking timed out.
    FragmentTimeout,
    /// A frame on the uplink that is neither our VXLAN nor addressed to a SNAT address.
    NotForUs,
    /// The router would forward it but its IPv4 TTL / IPv6 hop limit is spent; counted when no
    /// ICMP time-exceeded goes back instead (see [`crate::router`] for when none does).
    TtlExpired,
    /// Longer than the next link's MTU; counted when no ICMP fragmentation-needed /
    /// packet-too-big goes back instead (see [`crate::router`]).
    PacketTooBig {
        /// The MTU it exceeded.
        mtu: u16,
    },
    /// A security group rule denied the first packet of a connection.
    SecurityGroupDeny {
        /// The group holding the rule.
        group: SecurityGroupId,
        /// The rule's index in the group, as written in the config.
        rule: u32,
    },
    /// No security group rule matched an inbound connection (default deny inbound).
    SecurityGroupDefaultDeny,
    /// No route for the destination.
    NoRoute,
    /// The route says blackhole.
    Blackhole,
    /// The destination is in a local subnet but no VM port has that address.
    NoSuchVm,
    /// A packet that does not start a connection and belongs to none (e.g. a TCP ACK without
    /// state, or an inbound SNAT packet without a mapping).
    NoConnection,
    /// A TCP packet invalid for the connection's state.
    ConntrackInvalid,
    /// A packet of an established connection that a policy change revoked: its tenant rechecks
    /// connections (`on_policy_change = "recheck"`) and the new security groups would not admit
    /// it; the connection was cut.
    PolicyRevoked,
    /// An ICMP/ICMPv6 reply (echo reply and the like) that answers no tracked request.
    IcmpUnsolicitedReply,
    /// An ICMP/ICMPv6 error whose embedded header matches no tracked connection (or whose
    /// destination is not the embedded packet's sender).
    IcmpErrorUnrelated,
    /// An ICMP/ICMPv6 message that is neither a query, a reply nor an error (router or neighbour
    /// discovery, MLD, unassigned types): it can neither open nor join a connection.
    IcmpUntracked,
    /// The conntrack table is full; new connections are dropped, established ones keep working.
    ConntrackFull,
    /// No free SNAT port for this tenant.
    SnatExhausted,
    /// The route or action list asked for a drop.
    PolicyDrop,
}

/// The counter index of a [`DropReason`], without its payload.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
#[repr(u8)]
pub enum DropKind {
    /// [`DropReason::Malformed`]
    Malformed,
    /// [`DropReason::UnknownPort`]
    UnknownPort,
    /// [`DropReason::UnknownVni`]
    UnknownVni,
    /// [`DropReason::SpoofedMac`]
    SpoofedMac,
    /// [`DropReason::SpoofedIp`]
    SpoofedIp,
    /// [`DropReason::ArpNotRouted`]
    ArpNotRouted,
    /// [`DropReason::NeighConsumed`]
    NeighConsumed,
    /// [`DropReason::NeighMalformed`]
    NeighMalformed,
    /// [`DropReason::UnsupportedEtherType`]
    UnsupportedEtherType,
    /// [`DropReason::Fragment`]
    Fragment,
    /// [`DropReason::FragmentNoFirst`]
    FragmentNoFirst,
    /// [`DropReason::FragmentOverlap`]
    FragmentOverlap,
    /// [`DropReason::FragmentTooMany`]
    FragmentTooMany,
    /// [`DropReason::FragmentTableFull`]
    FragmentTableFull,
    /// [`DropReason::FragmentTimeout`]
    FragmentTimeout,
    /// [`DropReason::NotForUs`]
    NotForUs,
    /// [`DropReason::TtlExpired`]
    TtlExpired,
    /// [`DropReason::PacketTooBig`]
    PacketTooBig,
    /// [`DropReason::SecurityGroupDeny`]
    SecurityGroupDeny,
    /// [`DropReason::SecurityGroupDefaultDeny`]
    SecurityGroupDefaultDeny,
    /// [`DropReason::NoRoute`]
    NoRoute,
    /// [`DropReason::Blackhole`]
    Blackhole,
    /// [`DropReason::NoSuchVm`]
    NoSuchVm,
    /// [`DropReason::NoConnection`]
    NoConnection,
    /// [`DropReason::ConntrackInvalid`]
    ConntrackInvalid,
    /// [`DropReason::PolicyRevoked`]
    PolicyRevoked,
    /// [`DropReason::IcmpUnsolicitedReply`]
    IcmpUnsolicitedReply,
    /// [`DropReason::IcmpErrorUnrelated`]
    IcmpErrorUnrelated,
    /// [`DropReason::IcmpUntracked`]
    IcmpUntracked,
    /// [`DropReason::ConntrackFull`]
    ConntrackFull,
    /// [`DropReason::SnatExhausted`]
    SnatExhausted,
    /// [`DropReason::PolicyDrop`]
    PolicyDrop,
}

impl DropKind {
    /// Number of kinds; the length of a counter array.
    pub const COUNT: usize = 32;

    /// Every kind, in counter order.
    pub const ALL: [DropKind; DropKind::COUNT] = [
        DropKind::Malformed,
        DropKind::UnknownPort,
        DropKind::UnknownVni,
        DropKind::SpoofedMac,
        DropKind::SpoofedIp,
        DropKind::ArpNotRouted,
        DropKind::NeighConsumed,
        DropKind::NeighMalformed,
        DropKind::UnsupportedEtherType,
        DropKind::Fragment,
        DropKind::FragmentNoFirst,
        DropKind::FragmentOverlap,
        DropKind::FragmentTooMany,
        DropKind::FragmentTableFull,
        DropKind::FragmentTimeout,
        DropKind::NotForUs,
        DropKind::TtlExpired,
        DropKind::PacketTooBig,
        DropKind::SecurityGroupDeny,
        DropKind::SecurityGroupDefaultDeny,
        DropKind::NoRoute,
        DropKind::Blackhole,
        DropKind::NoSuchVm,
        DropKind::NoConnection,
        DropKind::ConntrackInvalid,
        DropKind::PolicyRevoked,
        DropKind::IcmpUnsolicitedReply,
        DropKind::IcmpErrorUnrelated,
        DropKind::IcmpUntracked,
        DropKind::ConntrackFull,
        DropKind::SnatExhausted,
        DropKind::PolicyDrop,
    ];

    /// The reason of a kind that carries no detail; `None` for kinds with a payload
    /// (malformed, unknown port or VNI, unsupported EtherType, security-group deny, too big).
    pub fn payload_free_reason(self) -> Option<DropReason> {
        Some(match self {
            DropKind::Malformed
            | DropKind::UnknownPort
            | DropKind::UnknownVni
            | DropKind::UnsupportedEtherType
            | DropKind::SecurityGroupDeny
            | DropKind::PacketTooBig => return None,
            DropKind::SpoofedMac => DropReason::SpoofedMac,
            DropKind::SpoofedIp => DropReason::SpoofedIp,
            DropKind::ArpNotRouted => DropReason::ArpNotRouted,
            DropKind::NeighConsumed => DropReason::NeighConsumed,
            DropKind::NeighMalformed => DropReason::NeighMalformed,
            DropKind::Fragment => DropReason::Fragment,
            DropKind::FragmentNoFirst => DropReason::FragmentNoFirst,
            DropKind::FragmentOverlap => DropReason::FragmentOverlap,
            DropKind::FragmentTooMany => DropReason::FragmentTooMany,
            DropKind::FragmentTableFull => DropReason::FragmentTableFull,
            DropKind::FragmentTimeout => DropReason::FragmentTimeout,
            DropKind::NotForUs => DropReason::NotForUs,
            DropKind::TtlExpired => DropReason::TtlExpired,
            DropKind::SecurityGroupDefaultDeny => DropReason::SecurityGroupDefaultDeny,
            DropKind::NoRoute => DropReason::NoRoute,
            DropKind::Blackhole => DropReason::Blackhole,
            DropKind::NoSuchVm => DropReason::NoSuchVm,
            DropKind::NoConnection => DropReason::NoConnection,
            DropKind::ConntrackInvalid => DropReason::ConntrackInvalid,
            DropKind::PolicyRevoked => DropReason::PolicyRevoked,
            DropKind::IcmpUnsolicitedReply => DropReason::IcmpUnsolicitedReply,
            DropKind::IcmpErrorUnrelated => DropReason::IcmpErrorUnrelated,
            DropKind::IcmpUntracked => DropReason::IcmpUntracked,
            DropKind::ConntrackFull => DropReason::ConntrackFull,
            DropKind::SnatExhausted => DropReason::SnatExhausted,
            DropKind::PolicyDrop => DropReason::PolicyDrop,
        })
    }

    /// The dotted metric name, e.g. `vswitch.drop.sg_deny`.
    pub fn metric(self) -> &'static str {
        match self {
            DropKind::Malformed => "vswitch.drop.malformed",
            DropKind::UnknownPort => "vswitch.drop.unknown_port",
            DropKind::UnknownVni => "vswitch.drop.unknown_vni",
            DropKind::SpoofedMac => "vswitch.drop.spoofed_mac",
            DropKind::SpoofedIp => "vswitch.drop.spoofed_ip",
            DropKind::ArpNotRouted => "vswitch.drop.arp_not_routed",
            DropKind::NeighConsumed => "vswitch.drop.neigh_consumed",
            DropKind::NeighMalformed => "vswitch.drop.neigh_malformed",
            DropKind::UnsupportedEtherType => "vswitch.drop.unsupported_ethertype",
            DropKind::Fragment => "vswitch.drop.fragment",
            DropKind::FragmentNoFirst => "vswitch.drop.fragment_no_first",
            DropKind::FragmentOverlap => "vswitch.drop.fragment_overlap",
            DropKind::FragmentTooMany => "vswitch.drop.fragment_too_many",
            DropKind::FragmentTableFull => "vswitch.drop.fragment_table_full",
            DropKind::FragmentTimeout => "vswitch.drop.fragment_timeout",
            DropKind::NotForUs => "vswitch.drop.not_for_us",
            DropKind::TtlExpired => "vswitch.drop.ttl_expired",
            DropKind::PacketTooBig => "vswitch.drop.too_big",
            DropKind::SecurityGroupDeny => "vswitch.drop.sg_deny",
            DropKind::SecurityGroupDefaultDeny => "vswitch.drop.sg_default_deny",
            DropKind::NoRoute => "vswitch.drop.no_route",
            DropKind::Blackhole => "vswitch.drop.blackhole",
            DropKind::NoSuchVm => "vswitch.drop.no_such_vm",
            DropKind::NoConnection => "vswitch.drop.no_connection",
            DropKind::ConntrackInvalid => "vswitch.drop.ct_invalid",
            DropKind::PolicyRevoked => "vswitch.drop.policy_revoked",
            DropKind::IcmpUnsolicitedReply => "vswitch.drop.icmp_unsolicited_reply",
            DropKind::IcmpErrorUnrelated => "vswitch.drop.icmp_error_unrelated",
            DropKind::IcmpUntracked => "vswitch.drop.icmp_untracked",
            DropKind::ConntrackFull => "vswitch.drop.ct_full",
            DropKind::SnatExhausted => "vswitch.drop.snat_exhausted",
            DropKind::PolicyDrop => "vswitch.drop.policy",
        }
    }
}

impl DropReason {
    /// The counter this drop is counted under.
    pub fn kind(&self) -> DropKind {
        match self {
            DropReason::Malformed(_) => DropKind::Malformed,
            DropReason::UnknownPort(_) => DropKind::UnknownPort,
            DropReason::UnknownVni(_) => DropKind::UnknownVni,
            DropReason::SpoofedMac => DropKind::SpoofedMac,
            DropReason::SpoofedIp => DropKind::SpoofedIp,
            DropReason::ArpNotRouted => DropKind::ArpNotRouted,
            DropReason::NeighConsumed => DropKind::NeighConsumed,
            DropReason::NeighMalformed => DropKind::NeighMalformed,
            DropReason::UnsupportedEtherType(_) => DropKind::UnsupportedEtherType,
            DropReason::Fragment => DropKind::Fragment,
            DropReason::FragmentNoFirst => DropKind::FragmentNoFirst,
            DropReason::FragmentOverlap => DropKind::FragmentOverlap,
            DropReason::FragmentTooMany => DropKind::FragmentTooMany,
            DropReason::FragmentTableFull => DropKind::FragmentTableFull,
            DropReason::FragmentTimeout => DropKind::FragmentTimeout,
            DropReason::NotForUs => DropKind::NotForUs,
            DropReason::TtlExpired => DropKind::TtlExpired,
            DropReason::PacketTooBig { .. } => DropKind::PacketTooBig,
            DropReason::SecurityGroupDeny { .. } => DropKind::SecurityGroupDeny,
            DropReason::SecurityGroupDefaultDeny => DropKind::SecurityGroupDefaultDeny,
            DropReason::NoRoute => DropKind::NoRoute,
            DropReason::Blackhole => DropKind::Blackhole,
            DropReason::NoSuchVm => DropKind::NoSuchVm,
            DropReason::NoConnection => DropKind::NoConnection,
            DropReason::ConntrackInvalid => DropKind::ConntrackInvalid,
            DropReason::PolicyRevoked => DropKind::PolicyRevoked,
            DropReason::IcmpUnsolicitedReply => DropKind::IcmpUnsolicitedReply,
            DropReason::IcmpErrorUnrelated => DropKind::IcmpErrorUnrelated,
            DropReason::IcmpUntracked => DropKind::IcmpUntracked,
            DropReason::ConntrackFull => DropKind::ConntrackFull,
            DropReason::SnatExhausted => DropKind::SnatExhausted,
            DropReason::PolicyDrop => DropKind::PolicyDrop,
        }
    }
}

impl fmt::Display for DropReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DropReason::Malformed(e) => write!(f, "malformed: {e}"),
            DropReason::UnknownPort(p) => write!(f, "unknown ingress {p}"),
            DropReason::UnknownVni(v) => write!(f, "unknown vni {v}"),
            DropReason::SecurityGroupDeny { group, rule } => {
                write!(f, "denied by {group} rule {rule}")
            }
            DropReason::UnsupportedEtherType(t) => write!(f, "unsupported ethertype {t:#06x}"),
            DropReason::PacketTooBig { mtu } => write!(f, "too big for mtu {mtu}"),
            other => {
                let name = other.kind().metric();
                f.write_str(name.trim_start_matches("vswitch.drop."))
            }
        }
    }
}

/// Drop counters, one per [`DropKind`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DropCounters([u64; DropKind::COUNT]);

impl DropCounters {
    /// Count one drop.
    #[inline]
    pub fn add(&mut self, reason: &DropReason) {
        self.0[reason.kind() as usize] += 1;
    }

    /// The count of one kind.
    pub fn get(&self, kind: DropKind) -> u64 {
        self.0[kind as usize]
    }

    /// Adds every count of `other` to this one's (totals over several pipelines).
    pub fn merge(&mut self, other: &DropCounters) {
        for (a, b) in self.0.iter_mut().zip(other.0) {
            *a += b;
        }
    }

    /// Sum over all kinds.
    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }

    /// `(metric name, count)` for every kind, in a stable order.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        DropKind::ALL
            .iter()
            .map(|k| (k.metric(), self.0[*k as usize]))
    }
}
