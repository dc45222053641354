//! `spillway pcap inspect`: one JSON object per frame, one per line.
//!
//! Fields: `index` (0-based position in the capture), `malformed` and `error` (the parser's
//! reason), `vni` (for VXLAN on the configured UDP port; then the addresses and ports are those of
//! the inner packet), `src_ip`, `dst_ip`, `proto` (null for non-IP frames such as ARP), and
//! `src_port`/`dst_port` (TCP and UDP only; 0 for other protocols and for non-first fragments).

use serde::Serialize;
use spillway_wire::{Fragment, Headers, ParseOptions, ip_proto, parse_frame};

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
    };
    match parse_frame(frame, opts) {
        Err(e) => {
            rec.malformed = true;
            rec.error = Some(e.to_string());
        }
        Ok(parsed) => {
            let headers: &Headers = match (&parsed.vxlan, &parsed.inner) {
                (Some(v), Some(inner)) => {
                    rec.vni = Some(v.vni.get());
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
            }
        }
    }
    rec
}
