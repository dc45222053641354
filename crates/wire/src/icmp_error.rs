//! The packet an ICMP or ICMPv6 error quotes (RFC 792; RFC 4443 section 2.4), read as a flow
//! key: how an error is matched to the connection whose packet caused it. It sits apart from
//! [`crate::icmp`] (message types, leaf) and [`crate::key`] (the flow key, which classifies ICMP
//! types) because it needs both.

use crate::icmp::{HEADER_LEN, is_query};

use crate::key::{FlowKey, IpAddr16, ip_proto};

/// The packet an ICMP error carries: its flow key as its sender sent it, and where its IP and
/// transport headers start, relative to the first byte of the ICMP message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Embedded {
    /// The embedded packet's key, with the same port convention as any [`FlowKey`].
    pub key: FlowKey,
    /// Offset of the embedded IP header (always [`HEADER_LEN`]).
    pub ip_offset: usize,
    /// Offset of the embedded transport header.
    pub l4_offset: usize,
}

/// The header an ICMP (`v6 == false`) or ICMPv6 error message `msg` carries (RFC 792: the IP
/// header and the first 64 bits of the datagram; RFC 4443 section 2.4: as much of the packet as
/// fits). `None` when it is not there in full: an IP header of the other family or cut short,
/// fewer than 8 transport bytes, a non-first IPv4 fragment (no ports), or IPv6 extension headers
/// (the embedded packet is then not matched to a connection). Does not check the embedded
/// lengths or checksums, which describe the whole original datagram.
pub fn embedded(v6: bool, msg: &[u8]) -> Option<Embedded> {
    let ip = msg.get(HEADER_LEN..)?;
    let (key, ihl) = if v6 {
        let h: &[u8; 40] = ip.first_chunk()?;
        if h[0] >> 4 != 6 {
            return None;
        }
        let mut src = [0u8; 16];
        src.copy_from_slice(&h[8..24]);
        let mut dst = [0u8; 16];
        dst.copy_from_slice(&h[24..40]);
        let proto = h[6];
        if !matches!(proto, ip_proto::TCP | ip_proto::UDP | ip_proto::ICMPV6) {
            return None;
        }
        let key = FlowKey {
            src_ip: IpAddr16(src),
            dst_ip: IpAddr16(dst),
            src_port: 0,
            dst_port: 0,
            proto,
        };
        (key, 40)
    } else {
        let h: &[u8; 20] = ip.first_chunk()?;
        let ihl = usize::from(h[0] & 0x0f) * 4;
        if h[0] >> 4 != 4 || ihl < 20 || u16::from_be_bytes([h[6], h[7]]) & 0x1fff != 0 {
            return None;
        }
        let key = FlowKey {
            src_ip: IpAddr16::from_v4([h[12], h[13], h[14], h[15]]),
            dst_ip: IpAddr16::from_v4([h[16], h[17], h[18], h[19]]),
            src_port: 0,
            dst_port: 0,
            proto: h[9],
        };
        (key, ihl)
    };
    let l4: &[u8; 8] = ip.get(ihl..)?.first_chunk()?;
    let mut key = key;
    let own_icmp = if v6 { ip_proto::ICMPV6 } else { ip_proto::ICMP };
    match key.proto {
        ip_proto::TCP | ip_proto::UDP => {
            key.src_port = u16::from_be_bytes([l4[0], l4[1]]);
            key.dst_port = u16::from_be_bytes([l4[2], l4[3]]);
        }
        p if p == own_icmp => {
            key.dst_port = u16::from_be_bytes([l4[0], l4[1]]);
            if is_query(v6, l4[0]) {
                key.src_port = u16::from_be_bytes([l4[4], l4[5]]);
            }
        }
        _ => {}
    }
    Some(Embedded {
        key,
        ip_offset: HEADER_LEN,
        l4_offset: HEADER_LEN + ihl,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_reads_the_offending_packets_key() {
        // Port unreachable carrying 10.0.0.1:5353 -> 10.0.0.2:53 UDP (IP header + 8 bytes).
        let mut m = [0u8; 8 + 20 + 8];
        m[0] = 3;
        m[1] = 3;
        m[8] = 0x45;
        m[8 + 9] = 17;
        m[8 + 12..8 + 16].copy_from_slice(&[10, 0, 0, 1]);
        m[8 + 16..8 + 20].copy_from_slice(&[10, 0, 0, 2]);
        m[28..32].copy_from_slice(&[0x14, 0xe9, 0x00, 0x35]);
        let e = embedded(false, &m).expect("embedded header");
        assert_eq!((e.ip_offset, e.l4_offset), (8, 28));
        assert_eq!(
            (e.key.proto, e.key.src_port, e.key.dst_port),
            (17, 5353, 53)
        );
        assert_eq!(e.key.src_ip, crate::IpAddr16::from_v4([10, 0, 0, 1]));
        // Cut short, or a later fragment: nothing to match.
        assert_eq!(embedded(false, &m[..35]), None);
        m[8 + 7] = 1;
        assert_eq!(embedded(false, &m), None);
        assert_eq!(embedded(true, &m), None);
    }
}
