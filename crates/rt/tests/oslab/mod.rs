//! Shared helpers for the OS-level tests (TAP, netns, cgroup): the root check, names unique per
//! test and process, a ledger-backed lab that removes everything on drop (also on panic),
//! running code inside a namespace on a helper thread, and tiny frame builders/parsers with
//! their own checksum code (independent of `spillway_rt::host::vnet`, so they can check it).

// Each test binary includes this module and uses a different part of it.
#![allow(dead_code)]

use std::fs::File;
use std::net::Ipv4Addr;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use spillway_rt::host::ledger::Ledger;
use spillway_rt::host::tap::TapQueue;
use spillway_rt::host::vnet::VnetHdr;
use spillway_wire::MacAddr;

/// True when the test can run. Without root it panics under `CI=true` (a CI job that cannot
/// run these must say so loudly) and otherwise prints a skip note and returns false.
pub fn require_root(what: &str) -> bool {
    if rustix::process::geteuid().is_root() {
        return true;
    }
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("needs root: {what}");
    }
    eprintln!("skipping (needs root): {what}");
    false
}

/// A name unique per process and call: `<tag><pid>x<n>`. With a tag of at most 3 bytes it fits
/// an interface name (15 bytes) for any pid up to the kernel's limit of 4194304.
pub fn unique(tag: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    assert!(
        tag.len() <= 3,
        "tag {tag:?} would make interface names too long"
    );
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let name = format!("{tag}{}x{n}", std::process::id());
    assert!(name.len() <= 15, "{name} too long for an interface name");
    name
}

/// A ledger in a private temporary directory: dropping the lab (also while unwinding from a
/// failed assertion) removes everything recorded in it.
pub struct Lab {
    // Declared before `dir` so it is dropped (and cleans up) before the directory goes.
    pub ledger: Ledger,
    pub dir: tempfile::TempDir,
}

impl Lab {
    pub fn new() -> Lab {
        let dir = tempfile::tempdir().expect("temporary directory");
        let ledger = Ledger::open(dir.path(), &unique("lab")).expect("open ledger");
        Lab { ledger, dir }
    }
}

/// Runs `f` on a fresh thread that has entered network namespace `ns`, and returns its result.
/// A thread of its own, because `setns` changes only the calling thread and that thread must
/// not go back to running other tests.
pub fn in_netns<T: Send>(ns: &str, f: impl FnOnce() -> T + Send) -> T {
    let path = Path::new("/run/netns").join(ns);
    std::thread::scope(|s| {
        s.spawn(|| {
            let fd = File::open(&path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
            rustix::thread::move_into_link_name_space(
                std::os::fd::AsFd::as_fd(&fd),
                Some(rustix::thread::LinkNameSpaceType::Network),
            )
            .expect("setns into the test namespace");
            f()
        })
        .join()
        .expect("namespace thread panicked")
    })
}

/// Like [`in_netns`] but returns the thread's handle so the caller can interact with it.
pub fn spawn_in_netns<T: Send + 'static>(
    ns: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> std::thread::JoinHandle<T> {
    let path = Path::new("/run/netns").join(ns);
    std::thread::spawn(move || {
        let fd = File::open(&path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
        rustix::thread::move_into_link_name_space(
            std::os::fd::AsFd::as_fd(&fd),
            Some(rustix::thread::LinkNameSpaceType::Network),
        )
        .expect("setns into the test namespace");
        f()
    })
}

// ---- Frames --------------------------------------------------------------------------------

pub const ETH_LEN: usize = 14;
pub const IPV4_LEN: usize = 20;

/// The RFC 1071 checksum (complemented) of `data`, starting from partial sum `seed`.
pub fn checksum(seed: u32, data: &[u8]) -> u16 {
    let mut sum = seed;
    for chunk in data.chunks(2) {
        let word = if chunk.len() == 2 {
            u16::from_be_bytes([chunk[0], chunk[1]])
        } else {
            u16::from_be_bytes([chunk[0], 0])
        };
        sum += u32::from(word);
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// The IPv4 pseudo-header sum for an L4 segment of `len` bytes.
pub fn pseudo_sum(src: Ipv4Addr, dst: Ipv4Addr, proto: u8, len: usize) -> u32 {
    let mut s = 0u32;
    for o in [src.octets(), dst.octets()] {
        s += u32::from(u16::from_be_bytes([o[0], o[1]]))
            + u32::from(u16::from_be_bytes([o[2], o[3]]));
    }
    s + u32::from(proto) + len as u32
}

/// Ethernet + IPv4 header around an L4 segment whose checksum field is at `csum_at` (relative
/// to the segment) and is filled in here.
pub fn ipv4_frame(
    src_mac: MacAddr,
    dst_mac: MacAddr,
    src: Ipv4Addr,
    dst: Ipv4Addr,
    proto: u8,
    mut l4: Vec<u8>,
    csum_at: usize,
) -> Vec<u8> {
    l4[csum_at..csum_at + 2].fill(0);
    let c = checksum(pseudo_sum(src, dst, proto, l4.len()), &l4);
    l4[csum_at..csum_at + 2].copy_from_slice(&c.to_be_bytes());

    let mut f = Vec::with_capacity(ETH_LEN + IPV4_LEN + l4.len());
    f.extend_from_slice(&dst_mac.0);
    f.extend_from_slice(&src_mac.0);
    f.extend_from_slice(&0x0800u16.to_be_bytes());
    let total = u16::try_from(IPV4_LEN + l4.len()).expect("test frames are small");
    let mut ip = [0u8; IPV4_LEN];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&total.to_be_bytes());
    ip[6] = 0x40; // DF
    ip[8] = 64;
    ip[9] = proto;
    ip[12..16].copy_from_slice(&src.octets());
    ip[16..20].copy_from_slice(&dst.octets());
    let c = checksum(0, &ip);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    f.extend_from_slice(&ip);
    f.extend_from_slice(&l4);
    f
}

/// An Ethernet/IPv4/UDP frame with valid checksums.
#[allow(clippy::too_many_arguments)]
pub fn udp_frame(
    src_mac: MacAddr,
    dst_mac: MacAddr,
    src: Ipv4Addr,
    dst: Ipv4Addr,
    sport: u16,
    dport: u16,
    payload: &[u8],
) -> Vec<u8> {
    let len = u16::try_from(8 + payload.len()).expect("test payloads are small");
    let mut l4 = Vec::new();
    l4.extend_from_slice(&sport.to_be_bytes());
    l4.extend_from_slice(&dport.to_be_bytes());
    l4.extend_from_slice(&len.to_be_bytes());
    l4.extend_from_slice(&[0, 0]);
    l4.extend_from_slice(payload);
    ipv4_frame(src_mac, dst_mac, src, dst, 17, l4, 6)
}

/// A TCP segment with an MSS option (header 24 bytes) and no payload, e.g. a SYN-ACK.
#[allow(clippy::too_many_arguments)]
pub fn tcp_frame(
    src_mac: MacAddr,
    dst_mac: MacAddr,
    src: Ipv4Addr,
    dst: Ipv4Addr,
    sport: u16,
    dport: u16,
    seq: u32,
    ack: u32,
    flags: u8,
    mss: u16,
) -> Vec<u8> {
    let mut l4 = Vec::new();
    l4.extend_from_slice(&sport.to_be_bytes());
    l4.extend_from_slice(&dport.to_be_bytes());
    l4.extend_from_slice(&seq.to_be_bytes());
    l4.extend_from_slice(&ack.to_be_bytes());
    l4.push(6 << 4); // data offset: 6 words
    l4.push(flags);
    l4.extend_from_slice(&65535u16.to_be_bytes()); // window
    l4.extend_from_slice(&[0, 0, 0, 0]); // checksum, urgent pointer
    l4.extend_from_slice(&[2, 4]); // MSS option
    l4.extend_from_slice(&mss.to_be_bytes());
    ipv4_frame(src_mac, dst_mac, src, dst, 6, l4, 16)
}

/// The fields of an Ethernet/IPv4 frame the tests look at.
#[derive(Debug)]
pub struct Ipv4View<'a> {
    pub dst_mac: MacAddr,
    pub src_mac: MacAddr,
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    pub proto: u8,
    /// The IPv4 header (for its checksum).
    pub ip_header: &'a [u8],
    /// The L4 segment, as long as the IPv4 total length says.
    pub l4: &'a [u8],
}

/// Parses an Ethernet frame carrying IPv4 without options; `None` for anything else.
pub fn parse_ipv4(frame: &[u8]) -> Option<Ipv4View<'_>> {
    if frame.len() < ETH_LEN + IPV4_LEN || frame[12..14] != [0x08, 0x00] || frame[14] != 0x45 {
        return None;
    }
    let ip = &frame[ETH_LEN..];
    let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
    if total < IPV4_LEN || total > ip.len() {
        return None;
    }
    let addr = |i: usize| Ipv4Addr::new(ip[i], ip[i + 1], ip[i + 2], ip[i + 3]);
    Some(Ipv4View {
        dst_mac: MacAddr(frame[0..6].try_into().ok()?),
        src_mac: MacAddr(frame[6..12].try_into().ok()?),
        src: addr(12),
        dst: addr(16),
        proto: ip[9],
        ip_header: &ip[..IPV4_LEN],
        l4: &ip[IPV4_LEN..total],
    })
}

impl Ipv4View<'_> {
    /// Destination port of a TCP or UDP segment.
    pub fn dport(&self) -> u16 {
        u16::from_be_bytes([self.l4[2], self.l4[3]])
    }

    /// Source port of a TCP or UDP segment.
    pub fn sport(&self) -> u16 {
        u16::from_be_bytes([self.l4[0], self.l4[1]])
    }

    /// Whether the L4 checksum verifies (sum over pseudo-header and segment is all ones).
    pub fn l4_checksum_ok(&self) -> bool {
        checksum(
            pseudo_sum(self.src, self.dst, self.proto, self.l4.len()),
            self.l4,
        ) == 0
    }

    /// Whether the IPv4 header checksum verifies.
    pub fn ip_checksum_ok(&self) -> bool {
        checksum(0, self.ip_header) == 0
    }
}

/// Reads frames from `queue` until `want` accepts one (returning it, vnet header included) or
/// `timeout` passes (panicking with what was seen).
pub fn read_until(
    queue: &TapQueue,
    timeout: Duration,
    mut want: impl FnMut(&VnetHdr, &[u8]) -> bool,
) -> Vec<u8> {
    let deadline = Instant::now() + timeout;
    let mut buf = vec![0u8; spillway_rt::host::tap::Tap::FRAME_LEN_MAX];
    let mut seen = 0;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(
            !left.is_zero(),
            "no matching frame within {timeout:?} ({seen} others seen)"
        );
        if !queue.wait_readable(Some(left)).expect("poll") {
            continue;
        }
        match queue.read(&mut buf) {
            Ok(n) => {
                let hdr = VnetHdr::parse(&buf[..n]).expect("frame longer than the vnet header");
                if want(&hdr, &buf[VnetHdr::LEN..n]) {
                    return buf[..n].to_vec();
                }
                seen += 1;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => panic!("TAP read: {e}"),
        }
    }
}
