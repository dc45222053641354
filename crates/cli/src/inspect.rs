//! `spillway pcap inspect`: one JSON object per frame, one per line.
//!
//! Fields: `index` (0-based position in the capture), `malformed` and `error` (the parser's
//! reason), `vni` (for VXLAN on the configured UDP port; then the addresses and ports are those of
//! the inner packet), `src_ip`, `dst_ip`, `proto` (null for non-IP frames such as ARP), and
//! `src_port`/`dst_port` (TCP and UDP only; 0 for other protocols and for non-first fragments),
//! `vlans` (the outer frame's VLAN ids, outermost first) and `inner_vlans` (the VXLAN inner
//! frame's), and for IP fragments (of the inner packet for VXLAN) `frag_id` (IPv4's 16-bit or
//! IPv6's 32-bit identification), `frag_offset` (in bytes; tshark's
//! `ip.frag_offset` field holds 8-octet units) and `frag_more`
//! (the more-fragments flag); these three are null for a packet that is not a fragment.

use serde::Serialize;
use spillway_wire::{Fragment, Headers, L3, ParseOptions, ip_proto, parse_frame};

/// One output line.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct InspectRecord {
    /// 0-based index in the capture.
    pub index: usize,
    /// The frame failed to parse.
    pub malformed: bool,
    /// Why, when malformed.
    pub error: Option<String>,
    /// The VNI of a VXLAN frame.
    pub vni: Option<u32>,
    /// Source address (inner for VXLAN).
    pub src_ip: Option<String>,
    /// Destination address (inner for VXLAN).
    pub dst_ip: Option<String>,
    /// IP protocol number (inner for VXLAN).
    pub proto: Option<u8>,
    /// TCP/UDP source port, else 0.
    pub src_port: u16,
    /// TCP/UDP destination port, else 0.
    pub dst_port: u16,
    /// VLAN ids (the TCI's low 12 bits) of the outer frame, outermost first.
    pub vlans: Vec<u16>,
    /// VLAN ids of the VXLAN inner frame.
    pub inner_vlans: Vec<u16>,
    /// Identification of a fragment.
    pub frag_id: Option<u32>,
    /// Fragment offset in bytes.
    pub frag_offset: Option<u32>,
    /// More-fragments flag of a fragment.
    pub frag_more: Option<bool>,
}

fn vlan_ids(h: &Headers) -> Vec<u16> {
    h.vlans[..usize::from(h.vlan_count)]
        .iter()
        .map(|t| t & 0x0fff)
        .collect()
}

/// Inspect one frame.
pub fn inspect(index: usize, frame: &[u8], opts: &ParseOptions) -> InspectRecord {
    let mut rec = InspectRecord {
        index,
        malformed: false,
        error: None,
        vni: None,
        src_ip: None,
        dst_ip: None,
        proto: None,
        src_port: 0,
        dst_port: 0,
        vlans: Vec::new(),
        inner_vlans: Vec::new(),
        frag_id: None,
        frag_offset: None,
        frag_more: None,
    };
    match parse_frame(frame, opts) {
        Err(e) => {
            rec.malformed = true;
            rec.error = Some(e.to_string());
        }
        Ok(parsed) => {
            rec.vlans = vlan_ids(&parsed.outer);
            let headers: &Headers = match (&parsed.vxlan, &parsed.inner) {
                (Some(v), Some(inner)) => {
                    rec.vni = Some(v.vni.get());
                    rec.inner_vlans = vlan_ids(inner);
                    inner
                }
                _ => &parsed.outer,
            };
            if let Some(key) = headers.key {
                rec.src_ip = Some(key.src_ip.to_string());
                rec.dst_ip = Some(key.dst_ip.to_string());
                rec.proto = Some(key.proto);
                let has_ports = matches!(key.proto, ip_proto::TCP | ip_proto::UDP)
                    && headers.fragment != Fragment::NonFirst;
                if has_ports {
                    rec.src_port = key.src_port;
                    rec.dst_port = key.dst_port;
                }
                // An IPv6 atomic fragment (offset 0, M clear; RFC 6946) is not a fragment to the
                // parser, but it does carry a fragment header, whose fields tshark shows too.
                let atomic = headers.l3 == L3::Ipv6 && headers.frag.data_offset != 0;
                if headers.fragment != Fragment::None || atomic {
                    rec.frag_id = Some(headers.frag.id);
                    rec.frag_offset = Some(u32::from(headers.frag.offset) * 8);
                    rec.frag_more = Some(headers.frag.more);
                }
            }
        }
    }
    rec
}
