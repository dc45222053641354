//! The tenant router's ICMP errors: time exceeded, fragmentation needed / packet too big, and
//! destination unreachable, written in place of the packet that caused them.
//!
//! Every path through the vSwitch crosses the tenant's router: frames leave with the router's MAC
//! as their source, and the neighbour responder answers for every peer with it. So a packet from a
//! VM port, or from the internet to a SNAT address, is *routed*: the [`crate::action::Action::Route`]
//! step at the head of its flow entry checks and decrements the TTL / hop limit and checks the
//! packet against the next link's MTU (the destination port's `mtu`; the overlay's, which is the
//! underlay MTU less the VXLAN overhead; or the underlay's). Packets arriving over VXLAN were
//! routed by the sending host and are delivered as they are.
//!
//! When the router refuses a packet, or the slow path finds no route or no VM for it, the
//! pipeline asks [`IcmpErrors::answer`] to turn the frame into the ICMP error a router would send
//! (RFC 792, RFC 1812 section 4.3, RFC 4443) and forward it back out of the port it came in on.
//! The original datagram is quoted as its sender sent it (TTL not yet decremented, no NAT yet): as
//! much as fits in 576 bytes for IPv4 (RFC 1812 section 4.3.2.3) and 1280 for IPv6 (RFC 4443
//! section 2.4 (c)), so its sender can match the error to its socket and the sender's
//! conntrack can match it as related.
//!
//! No error is sent, and the packet is dropped with its reason counted, for: an ICMP error or
//! other non-query ICMP message, a non-first fragment, a packet from an unspecified, loopback,
//! multicast or broadcast source, to a multicast or broadcast address or link-layer group
//! address (RFC 1812 section 4.3.2.7, RFC 4443 section 2.4 (e)), a tenant without a router
//! address of the packet's family, or when the ingress port's error budget is spent.
//!
//! **The budget.** ICMP errors are rate limited per ingress port with a token bucket
//! ([`IcmpErrorLimit`], checked as GCRA on the pipeline's clock), so one tenant's traceroute or a
//! flood of oversized packets cannot make the router reflect unbounded traffic, and one port's
//! flood does not spend another port's budget. Unlike Linux, fragmentation-needed and
//! packet-too-big are limited too (Linux exempts them to keep PMTU discovery snappy); the default
//! budget is far above what PMTU discovery needs (one error per connection and path).
//!
//! **IPv4 without DF.** A router would fragment a too-big IPv4 packet whose DF bit is clear.
//! The pipeline returns one verdict per frame and does not fragment; it answers with
//! fragmentation-needed, as OVN's `check_pkt_larger` flows do. Linux guests (and the others we
//! know) lower their route's path MTU on that error whatever DF was, and fragment their next
//! datagrams to fit, so one datagram is lost per path, not every one.

use std::collections::BTreeMap;

use spillway_wire::icmp::{self, IcmpKind};
use spillway_wire::{Fragment, Headers, IpAddr16, MacAddr, checksum, ip_proto, nd};

use crate::ids::PortId;
use crate::packet::PacketBuf;
use crate::policy::Tenant;
use crate::time::Instant;
use crate::verdict::DropReason;

/// Rate of ICMP errors the router sends back through one port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IcmpErrorLimit {
    /// Sustained errors per second per ingress port; 0 sends none.
    pub per_sec: u32,
    /// Errors that may be sent back to back after a quiet period (at least 1).
    pub burst: u32,
}

impl Default for IcmpErrorLimit {
    fn default() -> Self {
        // A traceroute sends tens of probes at once; PMTU discovery needs one error per
        // connection. Linux's global default is 1,000/s with a burst of 50, per host.
        IcmpErrorLimit {
            per_sec: 1000,
            burst: 50,
        }
    }
}

/// An ICMP error the router sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IcmpError {
    /// Time exceeded in transit (ICMP 11/0, ICMPv6 3/0).
    TimeExceeded,
    /// Fragmentation needed (ICMP 3/4 with the next-hop MTU, RFC 1191) or packet too big
    /// (ICMPv6 2/0, RFC 8201).
    TooBig {
        /// The MTU of the link the packet did not fit.
        mtu: u16,
    },
    /// No route: network unreachable (ICMP 3/0), no route to destination (ICMPv6 1/0).
    NetUnreachable,
    /// In a local subnet, but no VM has the address: host unreachable (ICMP 3/1), address
    /// unreachable (ICMPv6 1/3), as a router whose neighbour resolution failed says.
    HostUnreachable,
}

impl IcmpError {
    /// The error a drop calls for, if any.
    pub fn for_drop(reason: &DropReason) -> Option<IcmpError> {
        Some(match *reason {
            DropReason::TtlExpired => IcmpError::TimeExceeded,
            DropReason::PacketTooBig { mtu } => IcmpError::TooBig { mtu },
            DropReason::NoRoute => IcmpError::NetUnreachable,
            DropReason::NoSuchVm => IcmpError::HostUnreachable,
            _ => return None,
        })
    }

    /// Type, code and the 32-bit field after the checksum.
    fn header(self, v6: bool) -> (u8, u8, u32) {
        match (self, v6) {
            (IcmpError::TimeExceeded, false) => (icmp::V4_TIME_EXCEEDED, 0, 0),
            (IcmpError::TimeExceeded, true) => (icmp::V6_TIME_EXCEEDED, 0, 0),
            (IcmpError::TooBig { mtu }, false) => (icmp::V4_DEST_UNREACHABLE, 4, u32::from(mtu)),
            (IcmpError::TooBig { mtu }, true) => (icmp::V6_PACKET_TOO_BIG, 0, u32::from(mtu)),
            (IcmpError::NetUnreachable, false) => (icmp::V4_DEST_UNREACHABLE, 0, 0),
            (IcmpError::NetUnreachable, true) => (icmp::V6_DEST_UNREACHABLE, 0, 0),
            (IcmpError::HostUnreachable, false) => (icmp::V4_DEST_UNREACHABLE, 1, 0),
            (IcmpError::HostUnreachable, true) => (icmp::V6_DEST_UNREACHABLE, 3, 0),
        }
    }
}

/// Who the error comes from and where it goes on the wire.
#[derive(Clone, Copy, Debug)]
pub struct ErrorOrigin {
    /// Ethernet source of the error.
    pub src_mac: MacAddr,
    /// Ethernet destination (the sender, or the underlay gateway).
    pub dst_mac: MacAddr,
    /// The router address the error comes from, of the packet's family.
    pub src_ip: IpAddr16,
}

crate::counters! {
    /// Counters of the router's ICMP errors (dotted names in [`IcmpErrorCounters::iter`]).
    #[derive(PartialEq, Eq)]
    pub struct IcmpErrorCounters {
        /// Time-exceeded errors sent.
        time_exceeded => "vswitch.icmp_error.time_exceeded",
        /// Fragmentation-needed / packet-too-big errors sent.
        too_big => "vswitch.icmp_error.too_big",
        /// Destination-unreachable errors sent.
        unreachable => "vswitch.icmp_error.unreachable",
        /// Errors not sent because the port's budget was spent.
        rate_limited => "vswitch.icmp_error.rate_limited",
        /// Errors not sent because the packet may not be answered (see the module doc) or its
        /// tenant has no router address of its family.
        suppressed => "vswitch.icmp_error.suppressed",
    }
}

/// The router's error generator: the per-port budgets and the counters.
#[derive(Debug)]
pub struct IcmpErrors {
    limit: IcmpErrorLimit,
    /// Per port, the GCRA's theoretical arrival time of the next error, in nanoseconds. One
    /// entry per port that ever caused an error; [`IcmpErrors::retain`] drops removed ports.
    next_at: BTreeMap<PortId, u64>,
    counters: IcmpErrorCounters,
}

impl IcmpErrors {
    /// A generator with `limit` per port.
    pub fn new(limit: IcmpErrorLimit) -> IcmpErrors {
        IcmpErrors {
            limit,
            next_at: BTreeMap::new(),
            counters: IcmpErrorCounters::default(),
        }
    }

    /// Counters.
    pub fn counters(&self) -> &IcmpErrorCounters {
        &self.counters
    }

    /// Forget the budgets of ports `keep` rejects (after a policy change removed them).
    pub fn retain(&mut self, mut keep: impl FnMut(PortId) -> bool) {
        self.next_at.retain(|p, _| keep(*p));
    }

    /// Rewrite `pkt` (whose IP packet `h` describes; `h.key` is `Some`) into `error` from
    /// `origin` to the packet's source, if it may be answered and `port`'s budget allows.
    /// Returns whether it did; when not, the frame is unchanged and the caller drops it.
    pub fn answer(
        &mut self,
        now: Instant,
        port: PortId,
        pkt: &mut PacketBuf,
        h: &Headers,
        error: IcmpError,
        origin: Option<ErrorOrigin>,
    ) -> bool {
        let (Some(origin), true) = (origin, may_answer(h)) else {
            self.counters.suppressed += 1;
            return false;
        };
        if !self.allow(now, port) {
            self.counters.rate_limited += 1;
            return false;
        }
        if !self.write(pkt, h, error, &origin) {
            self.counters.suppressed += 1;
            return false;
        }
        let c = match error {
            IcmpError::TimeExceeded => &mut self.counters.time_exceeded,
            IcmpError::TooBig { .. } => &mut self.counters.too_big,
            IcmpError::NetUnreachable | IcmpError::HostUnreachable => {
                &mut self.counters.unreachable
            }
        };
        *c += 1;
        true
    }

    /// GCRA: an error may go if `now` is no earlier than the next one's theoretical arrival
    /// time less the burst tolerance.
    fn allow(&mut self, now: Instant, port: PortId) -> bool {
        if self.limit.per_sec == 0 {
            return false;
        }
        let interval = 1_000_000_000 / u64::from(self.limit.per_sec);
        let tolerance = interval * u64::from(self.limit.burst.max(1) - 1);
        let now = now.as_nanos();
        let tat = self.next_at.entry(port).or_insert(now);
        if now.saturating_add(tolerance) < *tat {
            return false;
        }
        *tat = (*tat).max(now) + interval;
        true
    }

    fn write(
        &mut self,
        pkt: &mut PacketBuf,
        h: &Headers,
        error: IcmpError,
        o: &ErrorOrigin,
    ) -> bool {
        let Some(key) = h.key else { return false };
        let v6 = !key.src_ip.is_v4();
        if o.src_ip.is_v4() == v6 {
            return false;
        }
        let ip_hdr = if v6 { 40 } else { 20 };
        // The whole error within 576 bytes (IPv4) or the IPv6 minimum MTU.
        let quote_max = if v6 { 1280 - 48 } else { 576 - 28 };
        let quote = usize::from(h.l3_len).min(quote_max);
        let l3 = usize::from(h.l3_offset);
        let head = 14 + ip_hdr + icmp::HEADER_LEN;
        // Move the frame's start so the quoted packet, which stays where it is, follows the
        // new headers.
        let moved = if l3 < head {
            pkt.push_front(head - l3).map(drop)
        } else {
            pkt.pull_front(l3 - head)
        };
        if moved.is_err() {
            return false;
        }
        pkt.truncate(head + quote);
        pkt.mark_generated();
        let d = pkt.data_mut();
        d[0..6].copy_from_slice(&o.dst_mac.0);
        d[6..12].copy_from_slice(&o.src_mac.0);
        let icmp_len = icmp::HEADER_LEN + quote;
        let (ty, code, rest) = error.header(v6);
        let l4 = 14 + ip_hdr;
        d[l4] = ty;
        d[l4 + 1] = code;
        d[l4 + 2..l4 + 4].copy_from_slice(&[0, 0]);
        d[l4 + 4..l4 + 8].copy_from_slice(&rest.to_be_bytes());
        if v6 {
            d[12..14].copy_from_slice(&0x86ddu16.to_be_bytes());
            let ip = &mut d[14..54];
            ip[0..4].copy_from_slice(&0x6000_0000u32.to_be_bytes());
            ip[4..6].copy_from_slice(&(icmp_len as u16).to_be_bytes());
            ip[6] = ip_proto::ICMPV6;
            ip[7] = 64;
            ip[8..24].copy_from_slice(&o.src_ip.0);
            ip[24..40].copy_from_slice(&key.src_ip.0);
            let c =
                checksum::l4_checksum_v6(&o.src_ip.0, &key.src_ip.0, ip_proto::ICMPV6, &d[l4..]);
            d[l4 + 2..l4 + 4].copy_from_slice(&c.to_be_bytes());
        } else {
            let (Some(src), Some(dst)) = (o.src_ip.v4_octets(), key.src_ip.v4_octets()) else {
                return false;
            };
            d[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
            let ip = &mut d[14..34];
            ip[0] = 0x45;
            // Precedence "internetwork control", as routers mark their ICMP errors.
            ip[1] = 0xc0;
            ip[2..4].copy_from_slice(&((20 + icmp_len) as u16).to_be_bytes());
            // An atomic datagram (DF, never fragmented: at most 576 bytes), so its
            // identification may be anything (RFC 6864 section 4.1): 0, which keeps the error a
            // function of the packet that caused it.
            ip[4..6].copy_from_slice(&[0, 0]);
            ip[6..8].copy_from_slice(&0x4000u16.to_be_bytes());
            ip[8] = 64;
            ip[9] = ip_proto::ICMP;
            ip[10..12].copy_from_slice(&[0, 0]);
            ip[12..16].copy_from_slice(&src);
            ip[16..20].copy_from_slice(&dst);
            let hc = checksum::ipv4_header_checksum(ip);
            ip[10..12].copy_from_slice(&hc.to_be_bytes());
            let c = checksum::checksum(&d[l4..]);
            d[l4 + 2..l4 + 4].copy_from_slice(&c.to_be_bytes());
        }
        true
    }
}

/// Whether a router may answer this packet with an ICMP error (see the module doc).
fn may_answer(h: &Headers) -> bool {
    let Some(key) = h.key else { return false };
    if h.fragment == Fragment::NonFirst || h.dst_mac.is_multicast() {
        return false;
    }
    if matches!(key.icmp_kind(), Some(IcmpKind::Error | IcmpKind::Other)) {
        return false;
    }
    !unanswerable(key.src_ip) && !is_group(key.dst_ip)
}

/// A source no error can go back to: unspecified, loopback, multicast or limited broadcast.
fn unanswerable(ip: IpAddr16) -> bool {
    match ip.v4_octets() {
        Some(o) => o[0] == 0 || o[0] == 127 || o == [255; 4] || o[0] >= 224,
        None => {
            ip == IpAddr16::UNSPECIFIED
                || ip.0 == std::net::Ipv6Addr::LOCALHOST.octets()
                || ip.0[0] == 0xff
        }
    }
}

/// A multicast or limited-broadcast destination.
fn is_group(ip: IpAddr16) -> bool {
    match ip.v4_octets() {
        Some(o) => o[0] >= 224,
        None => ip.0[0] == 0xff,
    }
}

/// The address the router answers a VM at `sender` from: a router address of the tenant in a
/// subnet holding the sender, else any of the family, else (IPv6) the router's link-local
/// address, which is on-link for every VM of the tenant.
pub fn router_source(t: &Tenant, sender: IpAddr16) -> Option<IpAddr16> {
    let v4 = sender.is_v4();
    let same = |r: &&IpAddr16| r.is_v4() == v4;
    t.router_ips
        .iter()
        .filter(same)
        .find(|r| {
            t.subnets
                .iter()
                .any(|n| n.contains(**r) && n.contains(sender))
        })
        .or_else(|| t.router_ips.iter().find(same))
        .copied()
        .or_else(|| (!v4).then(|| IpAddr16::from_v6(nd::link_local_of(t.router_mac))))
}
