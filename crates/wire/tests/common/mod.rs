//! Shared proptest strategies: a `FrameSpec` describes a frame in plain fields, builds it with
//! `FrameBuilder`, and predicts every `Headers` field the parser must report for it.
#![allow(dead_code)]

use proptest::prelude::*;
use spillway_wire::build::{FrameBuilder, Ipv6Ext};
use spillway_wire::{FlowKey, Fragment, FragmentFields, Headers, IpAddr16, L3, MacAddr, ip_proto};

/// The transport layer of a generated frame.
#[derive(Debug, Clone)]
pub enum L4 {
    Tcp {
        src: u16,
        dst: u16,
        flags: u8,
        seq: u32,
        ack: u32,
    },
    Udp {
        src: u16,
        dst: u16,
    },
    Echo {
        ident: u16,
        seq: u16,
        reply: bool,
    },
    Raw(u8),
}

/// The network layer of a generated frame.
#[derive(Debug, Clone)]
pub enum Net {
    V4 {
        src: [u8; 4],
        dst: [u8; 4],
        ttl: u8,
        ident: u16,
        options: Vec<u8>,
        frag: (u16, bool),
    },
    V6 {
        src: [u8; 16],
        dst: [u8; 16],
        hop: u8,
        ext: Vec<Ipv6Ext>,
    },
}

#[derive(Debug, Clone)]
pub struct FrameSpec {
    pub src_mac: [u8; 6],
    pub dst_mac: [u8; 6],
    pub vlans: Vec<(u16, u16)>,
    pub net: Net,
    pub l4: L4,
    pub payload: Vec<u8>,
}

/// Ports that are never 4789, so a generated UDP frame is not mistaken for VXLAN.
fn port() -> impl Strategy<Value = u16> {
    any::<u16>().prop_map(|p| if p == 4789 { 4790 } else { p })
}

pub fn l4() -> impl Strategy<Value = L4> {
    prop_oneof![
        (port(), port(), any::<u8>(), any::<u32>(), any::<u32>()).prop_map(
            |(src, dst, flags, seq, ack)| L4::Tcp {
                src,
                dst,
                flags,
                seq,
                ack
            }
        ),
        (port(), port()).prop_map(|(src, dst)| L4::Udp { src, dst }),
        (any::<u16>(), any::<u16>(), any::<bool>()).prop_map(|(ident, seq, reply)| L4::Echo {
            ident,
            seq,
            reply
        }),
        prop::sample::select(vec![47u8, 132, 253]).prop_map(L4::Raw),
    ]
}

fn frag_v4() -> impl Strategy<Value = (u16, bool)> {
    prop_oneof![
        6 => Just((0u16, false)),
        1 => Just((0u16, true)),
        1 => (1u16..0x2000, any::<bool>()),
    ]
}

/// IPv6 extension headers in a valid order: optional hop-by-hop first, then up to three of
/// routing / destination options / fragment. With `with_ah` an AH may end the chain.
pub fn ipv6_exts() -> impl Strategy<Value = Vec<Ipv6Ext>> {
    let opt_data = prop::collection::vec(any::<u8>(), 0..14).prop_map(|v| {
        // Valid option TLVs are not needed by either parser, but keep them Pad1 (0) or PadN-free
        // zeros so etherparse reads them as padding.
        vec![0u8; v.len()]
    });
    let mid = prop_oneof![
        opt_data.clone().prop_map(Ipv6Ext::DestOpts),
        (any::<u8>(), prop::collection::vec(any::<u8>(), 0..20)).prop_map(|(t, data)| {
            Ipv6Ext::Routing {
                routing_type: t,
                segments_left: 0,
                data,
            }
        }),
        prop_oneof![
            4 => Just((0u16, true)),
            1 => Just((0u16, false)),
            2 => (1u16..0x2000, any::<bool>()),
        ]
        .prop_flat_map(|(offset, more)| {
            any::<u32>().prop_map(move |ident| Ipv6Ext::Fragment {
                offset,
                more,
                ident,
            })
        }),
    ];
    (
        prop::option::of(opt_data.prop_map(Ipv6Ext::HopByHop)),
        prop::collection::vec(mid, 0..4),
    )
        .prop_map(|(hbh, rest)| {
            let mut v: Vec<Ipv6Ext> = hbh.into_iter().collect();
            // At most one fragment header.
            let mut seen = false;
            for e in rest {
                if matches!(e, Ipv6Ext::Fragment { .. }) {
                    if seen {
                        continue;
                    }
                    seen = true;
                }
                v.push(e);
            }
            v
        })
}

pub fn net() -> impl Strategy<Value = Net> {
    prop_oneof![
        (
            any::<[u8; 4]>(),
            any::<[u8; 4]>(),
            any::<u8>(),
            any::<u16>(),
            prop::collection::vec(any::<u8>(), 0..=40),
            frag_v4()
        )
            .prop_map(|(src, dst, ttl, ident, mut options, frag)| {
                options.truncate(options.len() / 4 * 4);
                Net::V4 {
                    src,
                    dst,
                    ttl,
                    ident,
                    options,
                    frag,
                }
            }),
        (
            any::<[u8; 16]>(),
            any::<[u8; 16]>(),
            any::<u8>(),
            ipv6_exts()
        )
            .prop_map(|(src, dst, hop, ext)| Net::V6 { src, dst, hop, ext }),
    ]
}

pub fn vlans() -> impl Strategy<Value = Vec<(u16, u16)>> {
    prop::collection::vec(
        (
            prop::sample::select(vec![0x8100u16, 0x88a8, 0x9100]),
            any::<u16>(),
        ),
        0..=2,
    )
}

pub fn frame_spec() -> impl Strategy<Value = FrameSpec> {
    (
        any::<[u8; 6]>(),
        any::<[u8; 6]>(),
        vlans(),
        net(),
        l4(),
        prop::collection::vec(any::<u8>(), 0..64),
    )
        .prop_map(|(src_mac, dst_mac, vlans, net, l4, payload)| FrameSpec {
            src_mac,
            dst_mac,
            vlans,
            net,
            l4,
            payload,
        })
}

fn ext_len(e: &Ipv6Ext) -> usize {
    match e {
        Ipv6Ext::HopByHop(d) | Ipv6Ext::DestOpts(d) => (2 + d.len()).max(8).div_ceil(8) * 8,
        Ipv6Ext::Routing { data, .. } => (4 + data.len()).max(8).div_ceil(8) * 8,
        Ipv6Ext::Fragment { .. } => 8,
        Ipv6Ext::Ah => 24,
    }
}

fn ip_hdr_full(net: &Net) -> usize {
    match net {
        Net::V4 { options, .. } => 20 + options.len(),
        Net::V6 { ext, .. } => 40 + ext.iter().map(ext_len).sum::<usize>(),
    }
}

trait ProtoNumber {
    fn proto_number(&self) -> u8;
}

impl ProtoNumber for Ipv6Ext {
    fn proto_number(&self) -> u8 {
        match self {
            Ipv6Ext::HopByHop(_) => 0,
            Ipv6Ext::DestOpts(_) => 60,
            Ipv6Ext::Routing { .. } => 43,
            Ipv6Ext::Fragment { .. } => 44,
            Ipv6Ext::Ah => 51,
        }
    }
}

impl FrameSpec {
    /// The extension headers the parser walks: all, or up to a non-first fragment header.
    fn v6_walked<'a>(&self, ext: &'a [Ipv6Ext]) -> &'a [Ipv6Ext] {
        match ext
            .iter()
            .position(|e| matches!(e, Ipv6Ext::Fragment { offset, .. } if *offset != 0))
        {
            Some(i) => &ext[..=i],
            None => ext,
        }
    }

    pub fn builder(&self) -> FrameBuilder {
        let mut b = FrameBuilder::new().eth(MacAddr(self.src_mac), MacAddr(self.dst_mac));
        for (tpid, tci) in &self.vlans {
            b = b.vlan_tpid(*tpid, *tci);
        }
        b = match &self.net {
            Net::V4 {
                src,
                dst,
                ttl,
                ident,
                options,
                frag,
            } => b
                .ipv4(*src, *dst)
                .ttl(*ttl)
                .ident(*ident)
                .ipv4_options(options)
                .fragment(frag.0, frag.1),
            Net::V6 { src, dst, hop, ext } => {
                let mut b = b.ipv6(*src, *dst).ttl(*hop);
                for e in ext {
                    b = b.ipv6_ext(e.clone());
                }
                b
            }
        };
        b = match self.l4 {
            L4::Tcp {
                src,
                dst,
                flags,
                seq,
                ack,
            } => b.tcp(src, dst).tcp_flags(flags).seq(seq).ack(ack),
            L4::Udp { src, dst } => b.udp(src, dst),
            L4::Echo { ident, seq, reply } => b.icmp_echo(ident, seq, reply),
            L4::Raw(p) => b.raw(p),
        };
        b.payload(&self.payload)
    }

    pub fn build(&self) -> Vec<u8> {
        self.builder().build()
    }

    fn v6(&self) -> bool {
        matches!(self.net, Net::V6 { .. })
    }

    pub fn fragment(&self) -> Fragment {
        let (off, more) = match &self.net {
            Net::V4 { frag, .. } => *frag,
            Net::V6 { ext, .. } => ext
                .iter()
                .find_map(|e| match e {
                    Ipv6Ext::Fragment { offset, more, .. } => Some((*offset, *more)),
                    _ => None,
                })
                .unwrap_or((0, false)),
        };
        match (off, more) {
            (0, false) => Fragment::None,
            (0, true) => Fragment::First,
            _ => Fragment::NonFirst,
        }
    }

    pub fn proto(&self) -> u8 {
        match self.l4 {
            L4::Tcp { .. } => ip_proto::TCP,
            L4::Udp { .. } => ip_proto::UDP,
            L4::Echo { .. } if self.v6() => ip_proto::ICMPV6,
            L4::Echo { .. } => ip_proto::ICMP,
            L4::Raw(p) => p,
        }
    }

    fn l4_header_len(&self) -> usize {
        match self.l4 {
            L4::Tcp { .. } => 20,
            L4::Udp { .. } | L4::Echo { .. } => 8,
            L4::Raw(_) => 0,
        }
    }

    /// The headers the parser must report.
    pub fn expected(&self) -> Headers {
        let mut vlans = [0u16; 2];
        for (i, (_, tci)) in self.vlans.iter().enumerate() {
            vlans[i] = *tci;
        }
        let l3_offset = 14 + 4 * self.vlans.len();
        let (l3, ethertype, ttl, ip_hdr, src_ip, dst_ip) = match &self.net {
            Net::V4 {
                src,
                dst,
                ttl,
                options,
                ..
            } => (
                L3::Ipv4,
                0x0800,
                *ttl,
                20 + options.len(),
                IpAddr16::from_v4(*src),
                IpAddr16::from_v4(*dst),
            ),
            Net::V6 { src, dst, hop, ext } => (
                L3::Ipv6,
                0x86dd,
                *hop,
                40 + self.v6_walked(ext).iter().map(ext_len).sum::<usize>(),
                IpAddr16(*src),
                IpAddr16(*dst),
            ),
        };
        let mut proto = self.proto();
        if let Net::V6 { ext, .. } = &self.net {
            // After a non-first fragment the walk stops: the key carries the fragment header's
            // next header, and the bytes after it (further headers included) are payload.
            let walked = self.v6_walked(ext).len();
            if walked < ext.len() {
                proto = ext[walked].proto_number();
            }
        }
        let l4_len = self.l4_header_len() + self.payload.len();
        let l4_len = l4_len + (ip_hdr_full(&self.net) - ip_hdr);
        let l4_offset = l3_offset + ip_hdr;
        let fragment = self.fragment();
        let nonfirst = fragment == Fragment::NonFirst;
        let (src_port, dst_port) = match self.l4 {
            _ if nonfirst => (0, 0),
            L4::Tcp { src, dst, .. } | L4::Udp { src, dst } => (src, dst),
            // The identifier, and the echo type (code 0) in the high byte.
            L4::Echo { ident, reply, .. } => (
                ident,
                match (self.v6(), reply) {
                    (false, false) => 8 << 8,
                    (false, true) => 0,
                    (true, false) => 128 << 8,
                    (true, true) => 129 << 8,
                },
            ),
            L4::Raw(_) => (0, 0),
        };
        let hdr = if nonfirst { 0 } else { self.l4_header_len() };
        let tcp_flags = match self.l4 {
            L4::Tcp { flags, .. } if !nonfirst => flags,
            _ => 0,
        };
        let frag = match &self.net {
            Net::V4 {
                ident,
                options,
                frag,
                ..
            } => FragmentFields {
                id: u32::from(*ident),
                offset: frag.0,
                more: frag.1,
                data_offset: (l3_offset + 20 + options.len()) as u16,
            },
            Net::V6 { ext, .. } => {
                let mut at = l3_offset + 40;
                let mut f = FragmentFields::default();
                for e in ext {
                    at += ext_len(e);
                    if let Ipv6Ext::Fragment {
                        offset,
                        more,
                        ident,
                    } = e
                    {
                        f = FragmentFields {
                            id: *ident,
                            offset: *offset,
                            more: *more,
                            data_offset: at as u16,
                        };
                        break;
                    }
                }
                f
            }
        };
        Headers {
            frag,
            src_mac: MacAddr(self.src_mac),
            dst_mac: MacAddr(self.dst_mac),
            vlans,
            vlan_count: self.vlans.len() as u8,
            ethertype,
            l3,
            l3_offset: l3_offset as u16,
            l3_len: (ip_hdr + l4_len) as u16,
            key: Some(FlowKey {
                src_ip,
                dst_ip,
                src_port,
                dst_port,
                proto,
            }),
            fragment,
            l4_offset: l4_offset as u16,
            payload_offset: (l4_offset + hdr) as u16,
            payload_len: (l4_len - hdr) as u16,
            tcp_flags,
            ttl,
        }
    }
}
