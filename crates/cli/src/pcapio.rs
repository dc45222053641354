//! Reading and writing captures: classic pcap and pcapng in, classic pcap out. Only Ethernet link
//! types are accepted; anything else is a clear error naming the file.

use anyhow::{Context, Result, bail};
use pcap_file::pcap::{PcapHeader, PcapPacket, PcapParser, PcapWriter};
use pcap_file::pcapng::{Block, PcapNgParser};
use pcap_file::{DataLink, Endianness};
use std::fs::File;
use std::io::{BufReader, BufWriter, Read};
use std::path::Path;
use std::time::Duration;

/// One captured frame.
#[derive(Debug, Clone)]
pub struct Frame {
    /// Capture timestamp since the epoch of the capture.
    pub ts: Duration,
    /// The bytes captured (possibly fewer than on the wire).
    pub data: Vec<u8>,
}

/// Largest captured frame a record may hold, in bytes: libpcap's largest snapshot length
/// (`MAXIMUM_SNAPLEN`), well above any Ethernet frame (a 9,216-byte jumbo frame, a 64 KiB
/// offloaded segment). A record announcing more is an error naming this limit rather than a
/// buffer of that size.
pub const RECORD_BYTES_MAX: u32 = 262_144;

/// Largest pcapng block: a packet of [`RECORD_BYTES_MAX`] plus room for its header and options.
const BLOCK_BYTES_MAX: u32 = RECORD_BYTES_MAX + 65_536;

/// Reads `buf.len()` bytes; `Ok(false)` at a clean end of file (no byte read), an error naming
/// `what` if the file ends part way.
fn read_all(r: &mut impl Read, buf: &mut [u8], what: impl Fn() -> String) -> Result<bool> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) if got == 0 => return Ok(false),
            Ok(0) => bail!(
                "{}: the file ends after {got} of its {} bytes",
                what(),
                buf.len()
            ),
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e).with_context(what),
        }
    }
    Ok(true)
}

fn u32_at(b: &[u8], at: usize, big: bool) -> u32 {
    let v: [u8; 4] = b[at..at + 4].try_into().expect("4 bytes");
    if big {
        u32::from_be_bytes(v)
    } else {
        u32::from_le_bytes(v)
    }
}

/// Read every frame of a pcap or pcapng file.
///
/// Records are read one at a time with their length checked against [`RECORD_BYTES_MAX`]
/// before anything is allocated for them, then parsed by `pcap-file`: its own streaming readers
/// hold an 8 MB buffer and report a larger, complete record as "unexpected end of file".
pub fn read_frames(path: &Path) -> Result<Vec<Frame>> {
    let file = File::open(path).with_context(|| format!("{}: cannot open", path.display()))?;
    let mut r = BufReader::new(file);
    let mut magic = [0u8; 4];
    if !read_all(&mut r, &mut magic, || {
        format!("{}: capture header", path.display())
    })? {
        bail!(
            "{}: empty file, expected a pcap or pcapng capture",
            path.display()
        );
    }
    if magic == [0x0a, 0x0d, 0x0d, 0x0a] {
        read_pcapng(path, r, magic)
    } else {
        read_pcap(path, r, magic)
    }
}

fn read_pcap(path: &Path, mut r: impl Read, magic: [u8; 4]) -> Result<Vec<Frame>> {
    let mut header = [0u8; 24];
    header[..4].copy_from_slice(&magic);
    read_all(&mut r, &mut header[4..], || {
        format!("{}: pcap file header", path.display())
    })?;
    let (_, parser) = PcapParser::new(&header)
        .with_context(|| format!("{}: not a pcap or pcapng file", path.display()))?;
    let link = parser.header().datalink;
    if link != DataLink::ETHERNET {
        bail!("{}: link type {link:?} is not Ethernet", path.display());
    }
    let big = parser.header().endianness == Endianness::Big;
    let mut frames = Vec::new();
    let mut record = Vec::new();
    let mut offset = header.len() as u64;
    loop {
        let n = frames.len();
        let what = || format!("{}: record {n} at byte {offset}", path.display());
        record.resize(16, 0);
        if !read_all(&mut r, &mut record[..16], what)? {
            return Ok(frames);
        }
        let incl_len = u32_at(&record, 8, big);
        if incl_len > RECORD_BYTES_MAX {
            bail!(
                "{}: captured length {incl_len} bytes is larger than the limit of {RECORD_BYTES_MAX} bytes (libpcap's largest snapshot length)",
                what()
            );
        }
        record.resize(16 + incl_len as usize, 0);
        read_all(&mut r, &mut record[16..], what)?;
        let (_, pkt) = parser
            .next_packet(&record)
            .with_context(|| format!("{}: bad pcap record", what()))?;
        frames.push(Frame {
            ts: pkt.timestamp,
            data: pkt.data.into_owned(),
        });
        offset += record.len() as u64;
    }
}

fn read_pcapng(path: &Path, mut r: impl Read, magic: [u8; 4]) -> Result<Vec<Frame>> {
    const SECTION_HEADER: u32 = 0x0a0d_0d0a;
    let mut frames = Vec::new();
    let mut block = Vec::new();
    let mut parser: Option<PcapNgParser> = None;
    let mut big = false;
    let mut offset = 0u64;
    let mut first = Some(magic);
    loop {
        let what = || format!("{}: block at byte {offset}", path.display());
        // Type and total length, and for a section header its byte-order magic, which decides
        // how this and the following blocks' lengths read.
        block.resize(12, 0);
        let start = match first.take() {
            Some(m) => {
                block[..4].copy_from_slice(&m);
                4
            }
            None => 0,
        };
        if !read_all(&mut r, &mut block[start..12], what)? {
            return Ok(frames);
        }
        if u32_at(&block, 0, false) == SECTION_HEADER {
            big = match block[8..12] {
                [0x1a, 0x2b, 0x3c, 0x4d] => true,
                [0x4d, 0x3c, 0x2b, 0x1a] => false,
                _ => bail!("{}: section header without a byte-order magic", what()),
            };
        }
        let total = u32_at(&block, 4, big);
        if total > BLOCK_BYTES_MAX {
            bail!(
                "{}: block length {total} bytes is larger than the limit of {BLOCK_BYTES_MAX} bytes (a packet of at most {RECORD_BYTES_MAX} bytes, libpcap's largest snapshot length, plus its options)",
                what()
            );
        }
        if total < 12 || !total.is_multiple_of(4) {
            bail!(
                "{}: block length {total}, expected a multiple of 4 of at least 12",
                what()
            );
        }
        block.resize(total as usize, 0);
        read_all(&mut r, &mut block[12..], what)?;
        let parsed = match &mut parser {
            None => {
                let (_, p) = PcapNgParser::new(&block)
                    .with_context(|| format!("{}: not a valid pcapng file", path.display()))?;
                parser = Some(p);
                None
            }
            Some(p) => Some(
                p.next_block(&block)
                    .with_context(|| format!("{}: bad pcapng block", what()))?
                    .1,
            ),
        };
        match parsed {
            Some(Block::InterfaceDescription(idb)) if idb.linktype != DataLink::ETHERNET => {
                bail!(
                    "{}: link type {:?} is not Ethernet",
                    path.display(),
                    idb.linktype
                )
            }
            Some(Block::EnhancedPacket(epb)) if epb.data.len() > RECORD_BYTES_MAX as usize => {
                bail!(
                    "{}: captured length {} bytes is larger than the limit of {RECORD_BYTES_MAX} bytes (libpcap's largest snapshot length)",
                    what(),
                    epb.data.len()
                )
            }
            Some(Block::EnhancedPacket(epb)) => frames.push(Frame {
                ts: epb.timestamp,
                data: epb.data.into_owned(),
            }),
            Some(Block::SimplePacket(spb)) => frames.push(Frame {
                ts: Duration::ZERO,
                data: spb.data.into_owned(),
            }),
            _ => {}
        }
        offset += u64::from(total);
    }
}

/// Write frames as a classic little-endian, microsecond pcap with Ethernet link type.
pub fn write_frames<'a>(
    path: &Path,
    frames: impl IntoIterator<Item = (Duration, &'a [u8])>,
) -> Result<()> {
    let file = BufWriter::new(
        File::create(path).with_context(|| format!("{}: cannot create", path.display()))?,
    );
    let header = PcapHeader {
        datalink: DataLink::ETHERNET,
        ..Default::default()
    };
    let mut writer = PcapWriter::with_header(file, header)
        .with_context(|| format!("{}: cannot write pcap header", path.display()))?;
    for (ts, data) in frames {
        let len = u32::try_from(data.len()).context("frame longer than 4 GiB")?;
        writer
            .write_packet(&PcapPacket::new(ts, len, data))
            .with_context(|| format!("{}: cannot write a packet", path.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use pcap_file::pcapng::PcapNgWriter;
    use pcap_file::pcapng::blocks::enhanced_packet::EnhancedPacketBlock;
    use pcap_file::pcapng::blocks::interface_description::InterfaceDescriptionBlock;
    use std::borrow::Cow;

    /// A pcapng file in `endianness` with an Ethernet interface and one packet per length.
    fn pcapng(endianness: Endianness, lens: &[usize]) -> Vec<u8> {
        let mut w = PcapNgWriter::with_endianness(Vec::new(), endianness).unwrap();
        w.write_pcapng_block(InterfaceDescriptionBlock {
            linktype: DataLink::ETHERNET,
            snaplen: 0,
            options: vec![],
        })
        .unwrap();
        for (i, &len) in lens.iter().enumerate() {
            w.write_pcapng_block(EnhancedPacketBlock {
                interface_id: 0,
                timestamp: Duration::from_micros(i as u64 + 1),
                original_len: len as u32,
                data: Cow::Owned(vec![i as u8; len]),
                options: vec![],
            })
            .unwrap();
        }
        w.into_inner()
    }

    #[test]
    fn pcapng_of_either_byte_order_reads_every_packet_and_names_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.pcapng");
        for e in [Endianness::Little, Endianness::Big] {
            std::fs::write(&path, pcapng(e, &[60, 1514, RECORD_BYTES_MAX as usize])).unwrap();
            let frames = read_frames(&path).unwrap();
            let lens: Vec<usize> = frames.iter().map(|f| f.data.len()).collect();
            assert_eq!(lens, [60, 1514, RECORD_BYTES_MAX as usize], "{e:?}");
            assert_eq!(frames[1].ts, Duration::from_micros(2));
            assert!(frames[1].data.iter().all(|&b| b == 1));

            std::fs::write(&path, pcapng(e, &[60, 16 << 20])).unwrap();
            let err = format!("{:#}", read_frames(&path).unwrap_err());
            assert!(
                err.contains("is larger than the limit of 327680 bytes"),
                "{e:?}: {err}"
            );
        }
    }
}
