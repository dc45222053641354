//! The backend against a frontend written here by hand, which sends what QEMU sends (in QEMU
//! 7.2's order) and what QEMU never would; the guest's side of the rings is written straight
//! into its memory.

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{Ordering, fence};
use std::time::{Duration, Instant};

use rustix::fs::{MemfdFlags, SealFlags};
use vhost::vhost_user::message::FrontendReq;
use vm_memory::{Bytes, FileOffset, GuestAddress, GuestMemoryMmap, GuestRegionMmap, MmapRegion};

use spillway_fabric::atc::{Atc, AtcConfig, Iova, RegionTable, VmId};

use super::conn::{Backend, SocketMode};
use super::device::{self, BadChain, ChainError, FEATURES, NET_HDR_LEN, PROTOCOL_FEATURES, RX, TX};
use super::lend;
use super::msg::{self, FLAG_NEED_REPLY, le_u32, le_u64};
use crate::dpu::vmport::DirectRefused;
use virtio_bindings::virtio_net::VIRTIO_NET_F_MRG_RXBUF;
use virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;

const GUEST_BYTES: u64 = 1 << 20;
/// Where the frontend says the guest's memory is in its own address space (QEMU's virtual
/// address of the region), as `SET_MEM_TABLE` and `SET_VRING_ADDR` carry it.
const UADDR: u64 = 0x7f00_0000_0000;
const QSIZE: u16 = 256;
const NEXT: u16 = 1;
const WRITE: u16 = 2;
const INDIRECT: u16 = 4;

struct Guest {
    mem: GuestMemoryMmap,
    fd: OwnedFd,
}

fn guest(seal: bool) -> Guest {
    let fd = rustix::fs::memfd_create(
        "vhost-test",
        MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
    )
    .unwrap();
    rustix::fs::ftruncate(&fd, GUEST_BYTES).unwrap();
    if seal {
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW).unwrap();
    }
    let file = std::fs::File::from(fd.try_clone().unwrap());
    let region = MmapRegion::from_file(FileOffset::new(file, 0), GUEST_BYTES as usize).unwrap();
    let region = GuestRegionMmap::new(region, GuestAddress(0)).unwrap();
    Guest {
        mem: GuestMemoryMmap::from_regions(vec![region]).unwrap(),
        fd,
    }
}

/// The guest's side of one split ring.
struct Ring {
    desc: u64,
    avail: u64,
    used: u64,
    avail_idx: u16,
    used_seen: u16,
}

impl Ring {
    fn at(base: u64) -> Ring {
        Ring {
            desc: base,
            avail: base + 0x1000,
            used: base + 0x2000,
            avail_idx: 0,
            used_seen: 0,
        }
    }

    fn desc(&self, g: &Guest, i: u16, addr: u64, len: u32, flags: u16, next: u16) {
        let mut d = [0u8; 16];
        d[0..8].copy_from_slice(&addr.to_le_bytes());
        d[8..12].copy_from_slice(&len.to_le_bytes());
        d[12..14].copy_from_slice(&flags.to_le_bytes());
        d[14..16].copy_from_slice(&next.to_le_bytes());
        g.mem
            .write_slice(&d, GuestAddress(self.desc + 16 * u64::from(i)))
            .unwrap();
    }

    /// Makes chain `head` available (the driver's side of the protocol).
    fn post(&mut self, g: &Guest, head: u16) {
        let slot = self.avail + 4 + 2 * u64::from(self.avail_idx % QSIZE);
        g.mem.write_obj(head.to_le(), GuestAddress(slot)).unwrap();
        self.avail_idx = self.avail_idx.wrapping_add(1);
        fence(Ordering::SeqCst);
        g.mem
            .write_obj(self.avail_idx.to_le(), GuestAddress(self.avail + 2))
            .unwrap();
    }

    /// The next used entry, `(id, len)`.
    fn used(&mut self, g: &Guest) -> Option<(u32, u32)> {
        let idx: u16 = g.mem.read_obj(GuestAddress(self.used + 2)).unwrap();
        if idx == self.used_seen {
            return None;
        }
        let e = self.used + 4 + 8 * u64::from(self.used_seen % QSIZE);
        self.used_seen = self.used_seen.wrapping_add(1);
        let id: u32 = g.mem.read_obj(GuestAddress(e)).unwrap();
        let len: u32 = g.mem.read_obj(GuestAddress(e + 4)).unwrap();
        Some((id, len))
    }
}

/// A frontend that speaks the protocol by hand.
struct Fe {
    s: UnixStream,
}

impl Fe {
    fn send(&self, req: FrontendReq, flags: u32, body: &[u8], fds: &[std::os::fd::BorrowedFd<'_>]) {
        msg::write_request(&self.s, req.into(), flags, body, fds).unwrap();
    }

    fn reply(&self) -> (u32, Vec<u8>) {
        use std::io::Read;
        let mut h = [0u8; 12];
        (&self.s).read_exact(&mut h).unwrap();
        let mut body = vec![0u8; le_u32(&h, 8) as usize];
        (&self.s).read_exact(&mut body).unwrap();
        (le_u32(&h, 0), body)
    }

    fn get_u64(&self, req: FrontendReq) -> u64 {
        self.send(req, 0, &[], &[]);
        let (code, body) = self.reply();
        assert_eq!(code, u32::from(req));
        le_u64(&body, 0)
    }

    /// Sends `req` asking for an acknowledgement; returns it (0 is success).
    fn set(&self, req: FrontendReq, body: &[u8], fds: &[std::os::fd::BorrowedFd<'_>]) -> u64 {
        self.send(req, FLAG_NEED_REPLY, body, fds);
        let (code, body) = self.reply();
        assert_eq!(code, u32::from(req));
        le_u64(&body, 0)
    }

    fn state(&self, req: FrontendReq, index: u32, num: u32) -> u64 {
        let mut b = index.to_le_bytes().to_vec();
        b.extend_from_slice(&num.to_le_bytes());
        self.set(req, &b, &[])
    }

    fn mem_table(&self, g: &Guest, size: u64) -> u64 {
        let mut b = 1u32.to_le_bytes().to_vec();
        b.extend_from_slice(&0u32.to_le_bytes());
        for v in [0, size, UADDR, 0] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        self.set(FrontendReq::SET_MEM_TABLE, &b, &[g.fd.as_fd()])
    }

    fn vring_addr(&self, i: u32, r: &Ring) -> u64 {
        let mut b = i.to_le_bytes().to_vec();
        b.extend_from_slice(&0u32.to_le_bytes());
        for v in [r.desc, r.used, r.avail, 0] {
            b.extend_from_slice(&(UADDR + v).to_le_bytes());
        }
        self.set(FrontendReq::SET_VRING_ADDR, &b, &[])
    }

    fn vring_fd(&self, req: FrontendReq, i: u64, fd: &OwnedFd) -> u64 {
        self.set(req, &i.to_le_bytes(), &[fd.as_fd()])
    }
}

struct Bed {
    backend: Backend,
    fe: Fe,
    guest: Guest,
    rx: Ring,
    tx: Ring,
    call: [OwnedFd; 2],
    kick: [OwnedFd; 2],
    _dir: tempfile::TempDir,
}

fn eventfd() -> OwnedFd {
    rustix::event::eventfd(
        0,
        rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
    )
    .unwrap()
}

fn connect() -> (Backend, Fe, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("vm.sock");
    let l = UnixListener::bind(&path).unwrap();
    let backend = Backend::start("t", SocketMode::Listen(l), 0).unwrap();
    let s = UnixStream::connect(&path).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    (backend, Fe { s }, dir)
}

/// Sets the device up as QEMU 7.2 does, `SET_VRING_ENABLE` before `SET_FEATURES` included.
fn bed() -> Bed {
    bed_with(FEATURES)
}

/// [`bed`] with the guest's driver acking `features` of those offered.
fn bed_with(features: u64) -> Bed {
    let (backend, fe, dir) = connect();
    let guest = guest(true);
    assert_eq!(fe.get_u64(FrontendReq::GET_FEATURES), FEATURES);
    assert_eq!(
        fe.get_u64(FrontendReq::GET_PROTOCOL_FEATURES),
        PROTOCOL_FEATURES
    );
    // Acknowledgements start once REPLY_ACK is set: QEMU asks for none here.
    fe.send(
        FrontendReq::SET_PROTOCOL_FEATURES,
        0,
        &PROTOCOL_FEATURES.to_le_bytes(),
        &[],
    );
    assert_eq!(fe.set(FrontendReq::SET_OWNER, &[], &[]), 0);
    // What QEMU 7.2's virtio-net does when the guest's driver sets its queue pairs, before the
    // device starts: the `vhost` crate's own handler refuses this.
    assert_eq!(fe.state(FrontendReq::SET_VRING_ENABLE, 0, 1), 0);
    assert_eq!(fe.state(FrontendReq::SET_VRING_ENABLE, 1, 1), 0);
    assert_eq!(
        fe.set(FrontendReq::SET_FEATURES, &features.to_le_bytes(), &[]),
        0
    );
    assert_eq!(fe.mem_table(&guest, GUEST_BYTES), 0);
    let (rx, tx) = (Ring::at(0x0), Ring::at(0x4000));
    let (call, kick) = ([eventfd(), eventfd()], [eventfd(), eventfd()]);
    for (i, r) in [(0u32, &rx), (1, &tx)] {
        assert_eq!(fe.state(FrontendReq::SET_VRING_NUM, i, u32::from(QSIZE)), 0);
        assert_eq!(fe.vring_addr(i, r), 0);
        assert_eq!(fe.state(FrontendReq::SET_VRING_BASE, i, 0), 0);
        assert_eq!(
            fe.vring_fd(FrontendReq::SET_VRING_CALL, u64::from(i), &call[i as usize]),
            0
        );
        assert_eq!(
            fe.vring_fd(FrontendReq::SET_VRING_KICK, u64::from(i), &kick[i as usize]),
            0
        );
    }
    assert!(backend.dev.vring(RX).live() && backend.dev.vring(TX).live());
    Bed {
        backend,
        fe,
        guest,
        rx,
        tx,
        call,
        kick,
        _dir: dir,
    }
}

const BUF: u64 = 0x10000;

fn frame(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| seed.wrapping_add(i as u8)).collect()
}

fn readable(fd: &OwnedFd) -> bool {
    let mut b = [0u8; 8];
    rustix::io::read(fd, &mut b).is_ok()
}

#[test]
fn frames_cross_both_ways_after_qemu_72s_setup() {
    let mut b = bed();
    let g = &b.guest;
    // The guest sends: the header in one descriptor, the frame in the next.
    let f = frame(60, 7);
    g.mem
        .write_slice(&[0u8; NET_HDR_LEN], GuestAddress(BUF))
        .unwrap();
    g.mem.write_slice(&f, GuestAddress(BUF + 0x100)).unwrap();
    b.tx.desc(g, 0, BUF, NET_HDR_LEN as u32, NEXT, 1);
    b.tx.desc(g, 1, BUF + 0x100, 60, 0, 0);
    b.tx.post(g, 0);
    let mut area = vec![0u8; 2048];
    assert_eq!(
        device::recv(&b.backend.dev, &mut 0, &mut area),
        Ok(Some(NET_HDR_LEN + 60))
    );
    assert_eq!(&area[NET_HDR_LEN..NET_HDR_LEN + 60], &f[..]);
    assert_eq!(device::recv(&b.backend.dev, &mut 0, &mut area), Ok(None));
    assert_eq!(b.tx.used(g), Some((0, 0)));
    device::flush_irq(&b.backend.dev, TX);
    assert!(
        readable(&b.call[TX]),
        "the guest is interrupted for its used transmit buffer"
    );

    // The guest posts a receive buffer; a frame goes in, header first.
    b.rx.desc(g, 5, BUF + 0x1000, 1526, WRITE, 0);
    b.rx.post(g, 5);
    let hdr = [0u8; NET_HDR_LEN];
    let f = frame(100, 9);
    assert_eq!(device::send(&b.backend.dev, &hdr, &f), Ok(1));
    assert_eq!(b.rx.used(g), Some((5, (NET_HDR_LEN + 100) as u32)));
    let mut got = vec![0u8; 100];
    g.mem
        .read_slice(&mut got, GuestAddress(BUF + 0x1000 + NET_HDR_LEN as u64))
        .unwrap();
    assert_eq!(got, f);
    assert_eq!(
        device::send(&b.backend.dev, &hdr, &f),
        Ok(0),
        "no buffer posted"
    );
    device::flush_irq(&b.backend.dev, RX);
    assert!(readable(&b.call[RX]));

    // A receive chain of two small buffers takes a frame across both.
    b.rx.desc(g, 6, BUF + 0x2000, 40, WRITE | NEXT, 7);
    b.rx.desc(g, 7, BUF + 0x3000, 200, WRITE, 0);
    b.rx.post(g, 6);
    assert_eq!(device::send(&b.backend.dev, &hdr, &f), Ok(1));
    assert_eq!(b.rx.used(g), Some((6, 112)));
    let mut got = vec![0u8; 72];
    g.mem
        .read_slice(&mut got, GuestAddress(BUF + 0x3000))
        .unwrap();
    assert_eq!(got, f[28..]);

    // Sleeping: with nothing posted the data path may sleep; a chain posted meanwhile keeps it
    // awake.
    assert!(device::prepare_sleep(&b.backend.dev));
    b.tx.desc(g, 2, BUF, 80, 0, 0);
    b.tx.post(g, 2);
    assert!(!device::prepare_sleep(&b.backend.dev));
    device::woke(&b.backend.dev);
    let _ = &b.kick;
}

#[test]
fn bad_chains_are_refused_counted_and_returned() {
    let mut b = bed();
    let g = &b.guest;
    let dev = &b.backend.dev;
    let mut area = vec![0u8; 2048];
    // Outside the guest's 1 MiB, where another guest's memory might be.
    b.tx.desc(g, 0, GUEST_BYTES + 0x1000, 64, 0, 0);
    b.tx.post(g, 0);
    assert_eq!(
        device::recv(dev, &mut 0, &mut area),
        Err(ChainError::Bad(BadChain::Address))
    );
    assert_eq!(
        b.tx.used(g),
        Some((0, 0)),
        "returned to the guest, length 0"
    );
    // A loop: 1 -> 2 -> 1.
    b.tx.desc(g, 1, BUF, 64, NEXT, 2);
    b.tx.desc(g, 2, BUF, 64, NEXT, 1);
    b.tx.post(g, 1);
    let t = Instant::now();
    // (32 descriptors of 64 bytes fill the 2 KiB area first.)
    assert_eq!(
        device::recv(dev, &mut 0, &mut area),
        Err(ChainError::Bad(BadChain::Size))
    );
    assert!(t.elapsed() < Duration::from_secs(1));
    assert_eq!(b.tx.used(g), Some((1, 0)));
    // A loop of small descriptors that fit the area: ends by the queue size, still refused.
    b.tx.desc(g, 3, BUF, 4, NEXT, 4);
    b.tx.desc(g, 4, BUF, 4, NEXT, 3);
    b.tx.post(g, 3);
    assert_eq!(
        device::recv(dev, &mut 0, &mut area),
        Err(ChainError::Bad(BadChain::Address))
    );
    // A writable descriptor in a transmit chain.
    b.tx.desc(g, 5, BUF, 64, WRITE, 0);
    b.tx.post(g, 5);
    assert_eq!(
        device::recv(dev, &mut 0, &mut area),
        Err(ChainError::Bad(BadChain::Direction))
    );
    // A head beyond the queue: nothing to return.
    b.tx.post(g, QSIZE + 3);
    assert_eq!(
        device::recv(dev, &mut 0, &mut area),
        Err(ChainError::Bad(BadChain::Head))
    );
    // An indirect table inside an indirect table.
    b.tx.desc(g, 6, BUF + 0x8000, 32, INDIRECT, 0);
    let nested = [(BUF + 0x9000, 16u32, INDIRECT), (BUF, 64, 0)];
    for (k, (addr, len, flags)) in nested.iter().enumerate() {
        let mut d = [0u8; 16];
        d[0..8].copy_from_slice(&addr.to_le_bytes());
        d[8..12].copy_from_slice(&len.to_le_bytes());
        d[12..14].copy_from_slice(&flags.to_le_bytes());
        g.mem
            .write_slice(&d, GuestAddress(BUF + 0x8000 + 16 * k as u64))
            .unwrap();
    }
    b.tx.post(g, 6);
    assert!(matches!(
        device::recv(dev, &mut 0, &mut area),
        Err(ChainError::Bad(_))
    ));
    // A good frame after all that still goes.
    b.tx.desc(g, 7, BUF, 80, 0, 0);
    b.tx.post(g, 7);
    assert_eq!(device::recv(dev, &mut 0, &mut area), Ok(Some(80)));

    // An available index more than a queue ahead: the queue is broken.
    b.tx.avail_idx = b.tx.avail_idx.wrapping_add(QSIZE + 1);
    b.tx.post(g, 0);
    assert_eq!(
        device::recv(dev, &mut 0, &mut area),
        Err(ChainError::Broken)
    );
}

/// Without mergeable buffers a receive chain too small for the frame is refused; with them
/// the frame waits for more buffers, and a readable chain or one outside the guest's memory
/// among those it would take refuses the frame and returns every chain taken for it.
#[test]
fn small_and_bad_receive_chains_are_refused_with_and_without_merging() {
    let hdr = [0; NET_HDR_LEN];
    let whole = bed_with(FEATURES & !(1 << VIRTIO_NET_F_MRG_RXBUF));
    let (g, dev, mut rx) = (&whole.guest, &whole.backend.dev, Ring::at(0x0));
    rx.desc(g, 0, BUF + 0x1000, 20, WRITE, 0);
    rx.post(g, 0);
    assert_eq!(
        device::send(dev, &hdr, &frame(100, 1)),
        Err(ChainError::Bad(BadChain::Size))
    );
    assert_eq!(rx.used(g), Some((0, 0)));
    rx.desc(g, 1, BUF + 0x1000, 2000, 0, 0);
    rx.post(g, 1);
    assert_eq!(
        device::send(dev, &hdr, &frame(100, 1)),
        Err(ChainError::Bad(BadChain::Direction))
    );
    assert_eq!(rx.used(g), Some((1, 0)));

    let merged = bed();
    let (g, dev, mut rx) = (&merged.guest, &merged.backend.dev, Ring::at(0x0));
    rx.desc(g, 0, BUF + 0x1000, 20, WRITE, 0);
    rx.post(g, 0);
    assert_eq!(device::send(dev, &hdr, &frame(100, 1)), Ok(0));
    assert_eq!(
        rx.used(g),
        None,
        "nothing taken while too few buffers are posted"
    );
    rx.desc(g, 1, BUF + 0x1000, 2000, 0, 0);
    rx.post(g, 1);
    assert_eq!(
        device::send(dev, &hdr, &frame(100, 1)),
        Err(ChainError::Bad(BadChain::Direction))
    );
    assert_eq!((rx.used(g), rx.used(g)), (Some((0, 0)), Some((1, 0))));
    // Outside the guest's memory, in the second buffer: both returned.
    rx.desc(g, 2, BUF + 0x1000, 40, WRITE, 0);
    rx.desc(g, 3, GUEST_BYTES + 0x1000, 2000, WRITE, 0);
    rx.post(g, 2);
    rx.post(g, 3);
    assert_eq!(
        device::send(dev, &hdr, &frame(100, 1)),
        Err(ChainError::Bad(BadChain::Address))
    );
    assert_eq!((rx.used(g), rx.used(g)), (Some((2, 0)), Some((3, 0))));
    assert_eq!(rx.used(g), None);
}

/// With mergeable buffers a frame larger than one buffer spans as many as it needs, the
/// header's `num_buffers` says how many, and their used entries appear together; a frame that
/// fits one takes one.
#[test]
fn mergeable_buffers_take_a_frame_across_chains_published_together() {
    let b = bed();
    let (g, dev, mut rx) = (&b.guest, &b.backend.dev, Ring::at(0x0));
    for i in 0..4u16 {
        rx.desc(g, i, BUF + 0x1000 * u64::from(i), 1000, WRITE, 0);
        rx.post(g, i);
    }
    let f = frame(2500, 5);
    assert_eq!(device::send(dev, &[0; NET_HDR_LEN], &f), Ok(3));
    // The three entries at once: the used index moved by three.
    let idx: u16 = g.mem.read_obj(GuestAddress(rx.used + 2)).unwrap();
    assert_eq!(idx, 3);
    assert_eq!(
        [rx.used(g), rx.used(g), rx.used(g)],
        [Some((0, 1000)), Some((1, 1000)), Some((2, 512))]
    );
    let mut hdr = [0u8; NET_HDR_LEN];
    g.mem.read_slice(&mut hdr, GuestAddress(BUF)).unwrap();
    assert_eq!(u16::from_le_bytes([hdr[10], hdr[11]]), 3, "num_buffers");
    let mut got = vec![0u8; 2500];
    g.mem
        .read_slice(&mut got[..988], GuestAddress(BUF + NET_HDR_LEN as u64))
        .unwrap();
    g.mem
        .read_slice(&mut got[988..1988], GuestAddress(BUF + 0x1000))
        .unwrap();
    g.mem
        .read_slice(&mut got[1988..], GuestAddress(BUF + 0x2000))
        .unwrap();
    assert_eq!(got, f);
    // A small frame takes the one buffer left.
    assert_eq!(device::send(dev, &[0; NET_HDR_LEN], &frame(60, 1)), Ok(1));
    assert_eq!(rx.used(g), Some((3, 72)));
    g.mem
        .read_slice(&mut hdr, GuestAddress(BUF + 0x3000))
        .unwrap();
    assert_eq!(u16::from_le_bytes([hdr[10], hdr[11]]), 1);
    // More buffers than a frame may take: refused, and the ones taken returned.
    for i in 0..=device::MERGE_MAX as u16 {
        rx.desc(g, 10 + i, BUF + 0x1000, 16, WRITE, 0);
        rx.post(g, 10 + i);
    }
    assert_eq!(
        device::send(dev, &[0; NET_HDR_LEN], &frame(1500, 1)),
        Err(ChainError::Bad(BadChain::Size))
    );
    for i in 0..device::MERGE_MAX as u16 {
        assert_eq!(rx.used(g), Some((u32::from(10 + i), 0)));
    }
    assert_eq!(rx.used(g), None);
}

/// Event indices: the guest is interrupted once the used index passes the `used_event` it wrote
/// (and always the first time), and a data path about to sleep asks for a kick at the next
/// available entry by writing `avail_event`; without them, the flags rule.
#[test]
fn event_indices_time_interrupts_and_kicks() {
    let mut b = bed();
    let g = &b.guest;
    let dev = &b.backend.dev;
    let used_event = GuestAddress(b.tx.avail + 4 + 2 * u64::from(QSIZE));
    let avail_event = GuestAddress(b.tx.used + 4 + 8 * u64::from(QSIZE));
    for i in 0..3u16 {
        b.tx.desc(g, i, BUF + 0x100 * u64::from(i), 80, 0, 0);
        b.tx.post(g, i);
    }
    // Interrupt me once the third entry (index 2) is used.
    g.mem.write_obj(2u16.to_le(), used_event).unwrap();
    let mut area = vec![0u8; 2048];
    let mut take_and_flush = || {
        assert_eq!(device::recv(dev, &mut 0, &mut area), Ok(Some(80)));
        device::flush_irq(dev, TX);
        readable(&b.call[TX])
    };
    assert!(take_and_flush(), "the first decision interrupts");
    assert!(!take_and_flush(), "used index 2: not past used_event 2 yet");
    assert!(take_and_flush(), "used index 3: past used_event 2");
    // Before sleeping: a kick is asked for at the next available entry (3).
    assert!(device::prepare_sleep(dev));
    let ev: u16 = g.mem.read_obj(avail_event).unwrap();
    assert_eq!(u16::from_le(ev), 3);
    device::woke(dev);

    // Without event indices the guest's flag decides.
    let mut b = bed_with(FEATURES & !(1 << VIRTIO_RING_F_EVENT_IDX));
    let g = &b.guest;
    let dev = &b.backend.dev;
    for i in 0..2u16 {
        b.tx.desc(g, i, BUF, 80, 0, 0);
        b.tx.post(g, i);
    }
    g.mem
        .write_obj(1u16.to_le(), GuestAddress(b.tx.avail))
        .unwrap();
    assert_eq!(device::recv(dev, &mut 0, &mut area), Ok(Some(80)));
    device::flush_irq(dev, TX);
    assert!(!readable(&b.call[TX]), "VRING_AVAIL_F_NO_INTERRUPT is set");
    g.mem
        .write_obj(0u16.to_le(), GuestAddress(b.tx.avail))
        .unwrap();
    assert_eq!(device::recv(dev, &mut 0, &mut area), Ok(Some(80)));
    device::flush_irq(dev, TX);
    assert!(readable(&b.call[TX]));
}

#[test]
fn get_vring_base_stops_the_ring_and_a_reconnect_starts_over() {
    let mut b = bed();
    let g = &b.guest;
    for i in 0..3 {
        b.tx.desc(g, i, BUF, 64, 0, 0);
        b.tx.post(g, i);
    }
    let mut area = vec![0u8; 2048];
    for _ in 0..3 {
        assert_eq!(
            device::recv(&b.backend.dev, &mut 0, &mut area),
            Ok(Some(64))
        );
    }
    let mut q = 1u32.to_le_bytes().to_vec();
    q.extend_from_slice(&0u32.to_le_bytes());
    b.fe.send(FrontendReq::GET_VRING_BASE, 0, &q, &[]);
    let (_, body) = b.fe.reply();
    assert_eq!((le_u32(&body, 0), le_u32(&body, 4)), (1, 3));
    b.tx.desc(g, 3, BUF, 64, 0, 0);
    b.tx.post(g, 3);
    assert_eq!(
        device::recv(&b.backend.dev, &mut 0, &mut area),
        Ok(None),
        "stopped"
    );
    // The frontend goes; the device is reset; a new one is served from scratch.
    drop(b.fe);
    let t = Instant::now();
    while b.backend.connected() && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(!b.backend.dev.vring(TX).live());
    let generation = b.backend.dev.generation.load(Ordering::Relaxed);
    assert!(generation > 0);
}

/// Connects and takes the protocol's opening as QEMU does.
fn opened() -> (Backend, Fe, tempfile::TempDir) {
    let (backend, fe, dir) = connect();
    // Acknowledgements start once REPLY_ACK is set: QEMU asks for none here.
    fe.send(
        FrontendReq::SET_PROTOCOL_FEATURES,
        0,
        &PROTOCOL_FEATURES.to_le_bytes(),
        &[],
    );
    assert_eq!(
        fe.set(FrontendReq::SET_FEATURES, &FEATURES.to_le_bytes(), &[]),
        0
    );
    (backend, fe, dir)
}

fn closed(fe: &Fe) -> bool {
    use std::io::Read;
    let mut b = [0u8; 1];
    matches!((&fe.s).read(&mut b), Ok(0) | Err(_))
}

#[test]
fn bad_requests_are_refused_and_close_the_connection() {
    // A memfd that is not sealed: the VMM could shrink it under the mapping.
    let (backend, fe, _d) = opened();
    assert_eq!(fe.mem_table(&guest(false), GUEST_BYTES), 1);
    assert!(closed(&fe));
    assert_eq!(backend.dev.counters.refused.load(Ordering::Relaxed), 1);

    // A region larger than its file.
    let (_backend, fe, _d) = opened();
    assert_eq!(fe.mem_table(&guest(true), 2 * GUEST_BYTES), 1);

    // A tiny memory table: the rings are not in it.
    let (_backend, fe, _d) = opened();
    assert_eq!(fe.mem_table(&guest(true), 0x1000), 0);
    assert_eq!(fe.state(FrontendReq::SET_VRING_NUM, 1, 256), 0);
    assert_eq!(fe.vring_addr(1, &Ring::at(0x4000)), 1);

    // Features not offered; a ring that does not exist; a size that is not a power of two.
    let (_backend, fe, _d) = connect();
    fe.send(
        FrontendReq::SET_PROTOCOL_FEATURES,
        0,
        &PROTOCOL_FEATURES.to_le_bytes(),
        &[],
    );
    assert_eq!(
        fe.set(
            FrontendReq::SET_FEATURES,
            &(FEATURES | 1 << 5).to_le_bytes(),
            &[]
        ),
        1
    );
    let (_backend, fe, _d) = opened();
    assert_eq!(fe.state(FrontendReq::SET_VRING_NUM, 4, 256), 1);
    let (_backend, fe, _d) = opened();
    assert_eq!(fe.state(FrontendReq::SET_VRING_NUM, 0, 300), 1);

    // A body larger than the protocol allows, and garbage: the connection closes.
    let (backend, fe, _d) = connect();
    let mut h = 5u32.to_le_bytes().to_vec();
    h.extend_from_slice(&1u32.to_le_bytes());
    h.extend_from_slice(&(1u32 << 20).to_le_bytes());
    use std::io::Write;
    (&fe.s).write_all(&h).unwrap();
    assert!(closed(&fe));
    assert_eq!(
        backend.dev.counters.refused.load(Ordering::Relaxed),
        0,
        "not a request at all"
    );
}

#[test]
fn offloads_reach_only_guests_that_took_them() {
    use super::device::{ToGuest, to_guest};
    use crate::host::vnet::VnetHdr;
    let tso = VnetHdr {
        flags: VnetHdr::F_NEEDS_CSUM,
        gso_type: VnetHdr::GSO_TCPV4,
        hdr_len: 66,
        gso_size: 1448,
        csum_start: 34,
        csum_offset: 16,
        num_buffers: 0,
    };
    let one = |h: VnetHdr| VnetHdr {
        num_buffers: 1,
        ..h
    };
    // A guest that took everything gets the super-frame whole, num_buffers 1.
    assert_eq!(to_guest(FEATURES, &tso), ToGuest::As(one(tso)));
    let ecn = VnetHdr {
        gso_type: VnetHdr::GSO_TCPV4 | VnetHdr::GSO_ECN,
        ..tso
    };
    assert_eq!(to_guest(FEATURES, &ecn), ToGuest::As(one(ecn)));
    // Not TSO over IPv4, or UDP fragmentation (never offered): refused.
    assert_eq!(to_guest(FEATURES & !(1 << 7), &tso), ToGuest::Refuse);
    let ufo = VnetHdr {
        gso_type: VnetHdr::GSO_UDP,
        ..tso
    };
    assert_eq!(to_guest(FEATURES, &ufo), ToGuest::Refuse);
    // A partial checksum for a guest without GUEST_CSUM is completed first; DATA_VALID is
    // not passed to it.
    let bare = 1u64 << 32;
    let partial = VnetHdr {
        gso_type: VnetHdr::GSO_NONE,
        gso_size: 0,
        ..tso
    };
    assert_eq!(to_guest(bare, &partial), ToGuest::CompleteChecksum);
    assert_eq!(to_guest(FEATURES, &partial), ToGuest::As(one(partial)));
    let valid = VnetHdr {
        flags: VnetHdr::F_DATA_VALID,
        ..VnetHdr::NONE
    };
    assert_eq!(to_guest(bare, &valid), ToGuest::As(one(VnetHdr::NONE)));
    assert_eq!(to_guest(FEATURES, &valid), ToGuest::As(one(valid)));
}

#[test]
fn a_frontend_in_a_loop_is_held_to_its_request_rate() {
    use super::conn::{REQUESTS_BURST, REQUESTS_PER_S};
    let (backend, fe, _d) = connect();
    let extra = 300;
    let t = Instant::now();
    for _ in 0..REQUESTS_BURST + extra {
        fe.send(FrontendReq::GET_FEATURES, 0, &[], &[]);
        assert_eq!(le_u64(&fe.reply().1, 0), FEATURES);
    }
    // Beyond the burst the requests come at most at the rate: however fast the frontend, the
    // last `extra` take at least `extra / rate` (a lower bound, which a slow machine only
    // exceeds).
    let floor = Duration::from_secs_f64(f64::from(extra) / f64::from(REQUESTS_PER_S));
    let took = t.elapsed();
    let c = &backend.dev.counters;
    eprintln!(
        "{took:?}, {} requests waited",
        c.throttled.load(Ordering::Relaxed)
    );
    assert!(took >= floor.mul_f64(0.95), "{took:?} < {floor:?}");
    assert_eq!(
        c.requests.load(Ordering::Relaxed),
        u64::from(REQUESTS_BURST + extra)
    );
}

/// The second queue pair: QEMU learns there are two (`GET_QUEUE_NUM`), sets its rings up like
/// the first pair's, and the data path reads both transmit queues in turn, so a guest that
/// keeps one full does not starve the other; a fifth ring is refused.
#[test]
fn both_transmit_queues_are_read_in_turn() {
    let b = bed();
    let g = &b.guest;
    assert_eq!(b.fe.get_u64(FrontendReq::GET_QUEUE_NUM), 2);
    let mut tx2 = Ring::at(0x8000);
    let (call, kick) = (eventfd(), eventfd());
    let i = device::TX2 as u32;
    assert_eq!(b.fe.state(FrontendReq::SET_VRING_ENABLE, i, 1), 0);
    assert_eq!(
        b.fe.state(FrontendReq::SET_VRING_NUM, i, u32::from(QSIZE)),
        0
    );
    assert_eq!(b.fe.vring_addr(i, &tx2), 0);
    assert_eq!(b.fe.state(FrontendReq::SET_VRING_BASE, i, 0), 0);
    assert_eq!(
        b.fe.vring_fd(FrontendReq::SET_VRING_CALL, u64::from(i), &call),
        0
    );
    assert_eq!(
        b.fe.vring_fd(FrontendReq::SET_VRING_KICK, u64::from(i), &kick),
        0
    );
    assert!(b.backend.dev.vring(device::TX2).live());

    // Four frames on the first transmit queue, two on the second: every other frame read is
    // from the second while it has any.
    let mut tx = Ring::at(0x4000);
    for k in 0..4u16 {
        let a = BUF + 0x1000 * u64::from(k);
        g.mem
            .write_slice(&frame(NET_HDR_LEN + 60, 1), GuestAddress(a))
            .unwrap();
        tx.desc(g, k, a, (NET_HDR_LEN + 60) as u32, 0, 0);
        tx.post(g, k);
    }
    for k in 0..2u16 {
        let a = BUF + 0x8000 + 0x1000 * u64::from(k);
        g.mem
            .write_slice(&frame(NET_HDR_LEN + 90, 2), GuestAddress(a))
            .unwrap();
        tx2.desc(g, k, a, (NET_HDR_LEN + 90) as u32, 0, 0);
        tx2.post(g, k);
    }
    let mut area = vec![0u8; 2048];
    let mut turn = 0;
    let mut lens = Vec::new();
    while let Ok(Some(n)) = device::recv(&b.backend.dev, &mut turn, &mut area) {
        lens.push(n - NET_HDR_LEN);
    }
    assert_eq!(lens, [60, 90, 60, 90, 60, 60]);
    assert_eq!(tx2.used(g), Some((0, 0)));
    assert_eq!(tx2.used(g), Some((1, 0)));

    // Both transmit queues are armed before the loop sleeps.
    assert!(device::prepare_sleep(&b.backend.dev));
    tx2.desc(g, 2, BUF, 80, 0, 0);
    tx2.post(g, 2);
    assert!(!device::prepare_sleep(&b.backend.dev));
    assert_eq!(device::tx_kicks(&b.backend.dev).iter().flatten().count(), 2);

    assert_ne!(
        b.fe.state(FrontendReq::SET_VRING_NUM, 4, u32::from(QSIZE)),
        0
    );
}

/// Sets up ring `i` at `r` with a fresh call and kick fd; returns the call fd.
fn start_ring(b: &Bed, i: usize, r: &Ring) -> OwnedFd {
    let (call, kick) = (eventfd(), eventfd());
    let i = i as u32;
    assert_eq!(b.fe.state(FrontendReq::SET_VRING_ENABLE, i, 1), 0);
    assert_eq!(
        b.fe.state(FrontendReq::SET_VRING_NUM, i, u32::from(QSIZE)),
        0
    );
    assert_eq!(b.fe.vring_addr(i, r), 0);
    assert_eq!(b.fe.state(FrontendReq::SET_VRING_BASE, i, 0), 0);
    assert_eq!(
        b.fe.vring_fd(FrontendReq::SET_VRING_CALL, u64::from(i), &call),
        0
    );
    assert_eq!(
        b.fe.vring_fd(FrontendReq::SET_VRING_KICK, u64::from(i), &kick),
        0
    );
    call
}

/// The plane's end of a lend of ring 2, as the DPU process would send it, with a vATC filled
/// from an authority that holds the memory table end to end from host address 0.
fn plane_end(b: &Bed, number: u32) -> (lend::PlaneGuest, Atc, RegionTable) {
    let dev = &b.backend.dev;
    let table = dev.table();
    let (ring, call) = dev.plane_ring().expect("ring 2 runs");
    let regions: Vec<lend::GuestRegion> = table.iter().map(|t| t.region).collect();
    let vm = VmId(9);
    let mut authority = RegionTable::new();
    for m in lend::authority_mappings(&regions) {
        authority.map(vm, m).unwrap();
    }
    let epoch = authority.epoch(vm);
    let mut fds = vec![
        dev.lease.fd().try_clone_to_owned().unwrap(),
        call.as_fd().try_clone_to_owned().unwrap(),
    ];
    fds.extend(table.iter().map(|t| t.fd.try_clone().unwrap()));
    let spec = lend::LendSpec {
        number,
        features: FEATURES,
        ring,
        regions,
    };
    let g = lend::PlaneGuest::new(vm, epoch, &spec, fds, std::process::id()).unwrap();
    let atc = Atc::new(AtcConfig::default()).unwrap();
    (g, atc, authority)
}

/// The plane writes into the guest's receive queue 1 through its vATC while the DPU process
/// lends it: a miss leaves the chain for the retry after the fill, a buffer outside the
/// guest's memory is refused and returned, and a request of the frontend takes the queue back
/// (the plane is refused from then on) with the ring's index where the plane left it.
#[test]
fn the_plane_fills_a_lent_receive_queue_through_its_vatc() {
    let b = bed();
    let g = &b.guest;
    let mut rx2 = Ring::at(0xc000);
    let call = start_ring(&b, device::PLANE_RX, &rx2);
    let dev = &b.backend.dev;
    // Not lent yet: the plane is refused.
    let (mut plane, mut atc, authority) = plane_end(&b, 1);
    let vnet = [0u8; NET_HDR_LEN];
    let f = frame(300, 3);
    assert_eq!(
        plane.deliver(&mut atc, &vnet, &f),
        Err(DirectRefused::NotLent)
    );
    assert!(dev.lend_plane(dev.generation.load(Ordering::Acquire), 1));

    // Two chains: a good one, then one outside the guest's memory.
    rx2.desc(g, 0, BUF + 0x4000, 2048, WRITE, 0);
    rx2.post(g, 0);
    rx2.desc(g, 1, GUEST_BYTES + 0x1000, 2048, WRITE, 0);
    rx2.post(g, 1);
    // Nothing cached: a miss, and the chain stays posted.
    let miss = match plane.deliver(&mut atc, &vnet, &f) {
        Err(DirectRefused::Miss(m)) => m,
        other => panic!("expected a miss, got {other:?}"),
    };
    assert_eq!(rx2.used(g), None);
    let (iova, len) = plane.span();
    assert_eq!((iova, len), (Iova(0), GUEST_BYTES));
    assert!(miss.missing().iter().all(|r| r.start.0 < GUEST_BYTES));
    let vm = plane.vm;
    atc.fill_map(vm, plane.epoch, authority.regions(vm), iova, len)
        .unwrap();
    assert_eq!(plane.deliver(&mut atc, &vnet, &f), Ok(()));
    assert_eq!(rx2.used(g), Some((0, (NET_HDR_LEN + 300) as u32)));
    let mut got = vec![0u8; 300];
    g.mem
        .read_slice(&mut got, GuestAddress(BUF + 0x4000 + NET_HDR_LEN as u64))
        .unwrap();
    assert_eq!(got, f);
    plane.flush_irq();
    assert!(readable(&call), "the guest is interrupted on its queue 1");

    // The chain outside memory: a miss, then (the authority's answer says nothing is there)
    // refused and returned with length 0.
    let miss = match plane.deliver(&mut atc, &vnet, &f) {
        Err(DirectRefused::Miss(m)) => m,
        other => panic!("expected a miss, got {other:?}"),
    };
    let r = miss.missing()[0];
    atc.fill_map(vm, plane.epoch, authority.regions(vm), r.start, r.len)
        .unwrap();
    assert_eq!(
        plane.deliver(&mut atc, &vnet, &f),
        Err(DirectRefused::BadDesc)
    );
    assert_eq!(rx2.used(g), Some((1, 0)));
    assert_eq!(
        plane.deliver(&mut atc, &vnet, &f),
        Err(DirectRefused::NoBuffer)
    );

    // The frontend stops the ring: the queue is taken back first, and its base is where the
    // plane left it (two chains taken).
    rx2.desc(g, 2, BUF + 0x5000, 2048, WRITE, 0);
    rx2.post(g, 2);
    b.fe.send(
        FrontendReq::GET_VRING_BASE,
        0,
        &[2, 0, 0, 0, 0, 0, 0, 0],
        &[],
    );
    let (_, body) = b.fe.reply();
    assert_eq!(le_u32(&body, 4), 2);
    assert_eq!(
        plane.deliver(&mut atc, &vnet, &f),
        Err(DirectRefused::NotLent)
    );
    assert_eq!(rx2.used(g), None, "nothing written after the revocation");
}

/// The plane merges receive buffers as the DPU process does: a frame across two chains; a vATC
/// miss leaves both posted, nothing used, until the fill.
#[test]
fn the_plane_spans_mergeable_buffers_and_a_miss_takes_none() {
    let b = bed();
    let g = &b.guest;
    let mut rx2 = Ring::at(0xc000);
    let _call = start_ring(&b, device::PLANE_RX, &rx2);
    let dev = &b.backend.dev;
    let (mut plane, mut atc, authority) = plane_end(&b, 1);
    assert!(dev.lend_plane(dev.generation.load(Ordering::Acquire), 1));
    rx2.desc(g, 0, BUF + 0x4000, 1000, WRITE, 0);
    rx2.desc(g, 1, BUF + 0x8000, 1000, WRITE, 0);
    rx2.post(g, 0);
    rx2.post(g, 1);
    let vm = plane.vm;
    let f = frame(1500, 8);
    let vnet = [0u8; NET_HDR_LEN];
    let r = plane.deliver(&mut atc, &vnet, &f);
    assert!(matches!(r, Err(DirectRefused::Miss(_))), "{r:?}");
    assert_eq!(rx2.used(g), None);
    let (iova, len) = plane.span();
    atc.fill_map(vm, plane.epoch, authority.regions(vm), iova, len)
        .unwrap();
    assert_eq!(plane.deliver(&mut atc, &vnet, &f), Ok(()));
    assert_eq!(
        (rx2.used(g), rx2.used(g)),
        (Some((0, 1000)), Some((1, 512)))
    );
    let mut hdr = [0u8; NET_HDR_LEN];
    g.mem
        .read_slice(&mut hdr, GuestAddress(BUF + 0x4000))
        .unwrap();
    assert_eq!(u16::from_le_bytes([hdr[10], hdr[11]]), 2, "num_buffers");
    let mut got = vec![0u8; 512];
    g.mem
        .read_slice(&mut got, GuestAddress(BUF + 0x8000))
        .unwrap();
    assert_eq!(got, f[988..]);
}

/// The lease: one holder at a time, only under the current lend number, none after a
/// revocation; a holder that is no longer a process is cleared by the revocation.
#[test]
fn the_lease_admits_one_plane_under_the_current_lend() {
    let l = lend::Lease::create().unwrap();
    assert!(!l.enter(1, 100));
    l.lend(1);
    assert!(!l.enter(2, 100), "a stale lend number");
    assert!(l.enter(1, 100));
    assert!(!l.enter(1, 200), "another plane while one holds it");
    l.exit(100);
    assert!(l.enter(1, 200));
    l.exit(200);
    // A holder that died inside: the revocation clears it at once.
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    assert!(l.enter(1, dead));
    let start = Instant::now();
    assert_eq!(l.revoke(Duration::from_secs(5)), lend::Revoked::Free);
    assert!(start.elapsed() < Duration::from_secs(1));
    assert!(!l.enter(1, 100), "revoked");
    // A live holder is waited for, then reported.
    l.lend(2);
    let me = std::process::id();
    assert!(l.enter(2, me));
    assert_eq!(l.revoke(Duration::from_millis(20)), lend::Revoked::Held(me));
    l.exit(me);
    assert!(!l.busy());
}
