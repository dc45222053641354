//! Reading and writing captures: classic pcap and pcapng in, classic pcap out. Only Ethernet link
//! types are accepted; anything else is a clear error naming the file.

use anyhow::{Context, Result, bail};
use pcap_file::DataLink;
use pcap_file::pcap::{PcapHeader, PcapPacket, PcapReader, PcapWriter};
use pcap_file::pcapng::{Block, PcapNgReader};
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

/// Read every frame of a pcap or pcapng file.
pub fn read_frames(path: &Path) -> Result<Vec<Frame>> {
    let mut magic = [0u8; 4];
    File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .with_context(|| format!("{}: cannot read a capture header", path.display()))?;
    let file = BufReader::new(
        File::open(path).with_context(|| format!("{}: cannot open", path.display()))?,
    );
    let mut frames = Vec::new();
    if magic == [0x0a, 0x0d, 0x0d, 0x0a] {
        let mut reader = PcapNgReader::new(file)
            .with_context(|| format!("{}: not a valid pcapng file", path.display()))?;
        while let Some(block) = reader.next_block() {
            let block = block.with_context(|| format!("{}: bad pcapng block", path.display()))?;
            match block {
                Block::InterfaceDescription(idb) if idb.linktype != DataLink::ETHERNET => {
                    bail!("{}: link type {:?} is not Ethernet", path.display(), idb.linktype)
                }
                Block::EnhancedPacket(epb) => frames
                    .push(Frame { ts: epb.timestamp, data: epb.data.into_owned() }),
                Block::SimplePacket(spb) => {
                    frames.push(Frame { ts: Duration::ZERO, data: spb.data.into_owned() })
                }
                _ => {}
            }
        }
    } else {
        let mut reader = PcapReader::new(file)
            .with_context(|| format!("{}: not a pcap or pcapng file", path.display()))?;
        let link = reader.header().datalink;
        if link != DataLink::ETHERNET {
            bail!("{}: link type {link:?} is not Ethernet", path.display());
        }
        while let Some(pkt) = reader.next_packet() {
            let pkt = pkt.with_context(|| format!("{}: bad pcap record", path.display()))?;
            frames.push(Frame { ts: pkt.timestamp, data: pkt.data.into_owned() });
        }
    }
    Ok(frames)
}

/// Write frames as a classic little-endian, microsecond pcap with Ethernet link type.
pub fn write_frames<'a>(path: &Path, frames: impl IntoIterator<Item = (Duration, &'a [u8])>) -> Result<()> {
    let file = BufWriter::new(
        File::create(path).with_context(|| format!("{}: cannot create", path.display()))?,
    );
    let header = PcapHeader { datalink: DataLink::ETHERNET, ..Default::default() };
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
