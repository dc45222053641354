//! The `vm_port` fuzz target's decoder and checker, shared with the replay test
//! (`tests/vm_port_fuzz.rs`). Arbitrary bytes play a hostile VM against the DPU's end of a
//! shared-memory port ([`ShmPort`]): the VM writes whatever it likes into its descriptor tables,
//! available rings, flag words and even the device's used rings, publishes any index, and writes
//! any bytes on its port socket; the DPU takes turns (`begin_turn` + `recv`, as its loop does),
//! sends frames into receive queue 1 (`fill_rx`), reads the socket (`endpoint_gone`) and does
//! its notification handshakes. After every DPU step the checker asserts:
//!
//! - nothing panicked, and the DPU wrote only where a device may: the used rings of queues 0 and
//!   1 and the buffers of receive queue 1, those only by a send that reported `Written`, and then
//!   the header and frame appear in one buffer-sized window inside that area. Every other byte of
//!   the VM's memory is as the VM left it (a shadow copy);
//! - the budgets hold: at most `BAD_DESC_PER_TURN` bad transmit descriptors per turn, at most
//!   `SOCKET_READ_PER_TURN` bytes read per `endpoint_gone`; the port is judged misbehaving exactly
//!   when a reference count says so (more than `BAD_DESC_WINDOW_MAX` bad descriptors in a window,
//!   more than `SOCKET_BYTES_MAX` socket bytes), and once it is, `recv` takes nothing more;
//! - a `VirtqError` ends the run (the loop detaches such a port), as does the socket's end.

use std::io::Write;
use std::os::unix::net::UnixStream;

use spillway_rt::dpu::vmport::{
    self, Accepted, BAD_DESC_PER_TURN, BAD_DESC_WINDOW_MAX, BAD_DESC_WINDOW_NS, Misbehaviour,
    SOCKET_BYTES_MAX, SOCKET_READ_PER_TURN, ShmPort,
};
use spillway_rt::shm::ring::Doorbell;
use spillway_rt::shm::virtq::{QUEUE_RX_DPU, QUEUE_TX, VmLayout, VmMemory};

/// What a run saw (for the replay test's coverage check).
#[derive(Clone, Copy, Debug, Default)]
pub struct Outcomes {
    /// Frames the DPU took from the transmit queue.
    pub frames: u64,
    /// Bad descriptors refused (both queues).
    pub bad: u64,
    /// Turns that hit the bad-descriptor budget.
    pub turn_budget: u64,
    /// Frames written into receive queue 1.
    pub written: u64,
    /// Runs ended by a broken queue.
    pub broken: u64,
    /// Runs judged misbehaving for bad descriptors.
    pub bad_desc_detach: u64,
    /// Runs judged misbehaving for a socket flood.
    pub flood_detach: u64,
}

impl Outcomes {
    /// Adds another run's.
    pub fn add(&mut self, o: &Outcomes) {
        self.frames += o.frames;
        self.bad += o.bad;
        self.turn_budget += o.turn_budget;
        self.written += o.written;
        self.broken += o.broken;
        self.bad_desc_detach += o.bad_desc_detach;
        self.flood_detach += o.flood_detach;
    }
}

struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((b, rest)) => {
                self.0 = rest;
                *b
            }
            None => 0,
        }
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }
    fn u32(&mut self) -> u32 {
        u32::from(self.u16()) | (u32::from(self.u16()) << 16)
    }
    fn u64(&mut self) -> u64 {
        u64::from(self.u32()) | (u64::from(self.u32()) << 32)
    }
}

struct Harness {
    mem: VmMemory,
    vm: UnixStream,
    port: ShmPort,
    shadow: Vec<u8>,
    avail: [u16; 3],
    now: u64,
    /// The reference count of bad descriptors in the current window, and its start.
    bad_window: u64,
    window_start: u64,
    /// What the reference says the port did wrong first.
    expect: Option<Misbehaviour>,
    out: Outcomes,
    buf: Vec<u8>,
}

impl Harness {
    fn vm_write(&mut self, off: usize, bytes: &[u8]) {
        let off = off.min(self.shadow.len() - bytes.len());
        assert!(self.mem.write_bytes(off, bytes));
        self.shadow[off..off + bytes.len()].copy_from_slice(bytes);
    }

    fn layout(&self) -> VmLayout {
        *self.mem.layout()
    }

    /// Compares the memory with the shadow: bytes outside `allowed` must be the VM's. Returns
    /// the changed ranges inside `allowed`, then takes them into the shadow.
    fn check_writes(&mut self, allowed: &[(usize, usize)]) -> Vec<(usize, usize)> {
        let mut now = vec![0u8; self.shadow.len()];
        assert!(self.mem.read_bytes(0, &mut now));
        let mut changed = Vec::new();
        let mut i = 0;
        while i < now.len() {
            if now[i] == self.shadow[i] {
                i += 1;
                continue;
            }
            let start = i;
            while i < now.len() && now[i] != self.shadow[i] {
                i += 1;
            }
            let ok = allowed.iter().any(|&(a, b)| start >= a && i <= b);
            assert!(
                ok,
                "the DPU wrote [{start:#x}, {i:#x}) of the VM's memory, outside {allowed:x?}"
            );
            changed.push((start, i));
        }
        self.shadow = now;
        changed
    }

    fn used_area(&self, q: usize) -> (usize, usize) {
        let l = self.layout();
        let n = usize::from(l.queue_size);
        (l.used_off(q), l.used_off(q) + 4 + 8 * n)
    }

    fn note_bad(&mut self, n: u64) {
        self.bad_window += n;
        self.out.bad += n;
        if self.bad_window > BAD_DESC_WINDOW_MAX && self.expect.is_none() {
            self.expect = Some(Misbehaviour::BadDescriptors);
        }
    }

    fn check_judgement(&self) {
        assert_eq!(
            self.port.misbehaving(),
            self.expect,
            "bad in window {}, socket bytes {}",
            self.bad_window,
            self.port.socket_bytes
        );
    }
}

/// Runs `data` against a fresh port. Panics on any violation.
pub fn run(data: &[u8]) -> Outcomes {
    let mut d = Bytes(data);
    let g = d.u8();
    let layout = VmLayout {
        queue_size: 8 << (g & 3),
        buf_bytes: if g & 4 == 0 { 256 } else { 2048 },
        iova_base: 1 << 36,
    };
    let mem = VmMemory::create("fuzz-vm", layout).expect("memfd");
    let (kick, irq) = (
        Doorbell::new().expect("eventfd"),
        Doorbell::new().expect("eventfd"),
    );
    let (vm, dpu) = UnixStream::pair().expect("socketpair");
    vmport::send_attach(&vm, "fuzz", &mem, &kick, &irq).expect("attach message");
    let port = match vmport::accept(dpu).expect("attach accepted") {
        Accepted::Attached(p, _) => *p,
        Accepted::NotYet(_) => panic!("the attach message was sent before accept"),
    };
    vmport::await_answer(&vm).expect("ok");
    vm.set_nonblocking(true).expect("nonblocking");
    let mut shadow = vec![0u8; layout.total_bytes()];
    assert!(mem.read_bytes(0, &mut shadow));
    let mut h = Harness {
        mem,
        vm,
        port,
        shadow,
        avail: [0; 3],
        now: 0,
        bad_window: 0,
        window_start: 0,
        expect: None,
        out: Outcomes::default(),
        buf: vec![0u8; 4096],
    };
    let n = usize::from(layout.queue_size);
    let mut steps = 0;
    while !d.0.is_empty() && steps < 4096 {
        steps += 1;
        let l = h.layout();
        match d.u8() % 10 {
            // A descriptor, whatever the VM likes.
            0 => {
                let q = usize::from(d.u8()) % 3;
                let id = usize::from(d.u8()) % n;
                let kind = d.u8();
                let own = l.iova(l.buf_off(q, id as u16));
                let addr = match kind % 5 {
                    0 => own,
                    1 => d.u64(),
                    2 => l.iova(l.bufs_off(usize::from(d.u8()) % 3)),
                    3 => l
                        .iova(l.bufs_off(q) + l.bufs_len())
                        .wrapping_sub(u64::from(d.u8())),
                    _ => own.wrapping_add(u64::from(d.u16())),
                };
                let len = if kind & 0x80 != 0 {
                    d.u32()
                } else {
                    u32::from(d.u16() % 4096)
                };
                let flags = u16::from(d.u8() % 8);
                let next = d.u16();
                let mut b = [0u8; 16];
                b[..8].copy_from_slice(&addr.to_le_bytes());
                b[8..12].copy_from_slice(&len.to_le_bytes());
                b[12..14].copy_from_slice(&flags.to_le_bytes());
                b[14..].copy_from_slice(&next.to_le_bytes());
                h.vm_write(l.desc_off(q) + 16 * id, &b);
            }
            // Make `k` descriptors available (ids as given, in range or not).
            1 => {
                let q = usize::from(d.u8()) % 3;
                let k = d.u8() % 8 + 1;
                for _ in 0..k {
                    let b = d.u8();
                    let id = if b & 0xf0 == 0xf0 {
                        d.u16()
                    } else {
                        u16::from(b) % l.queue_size
                    };
                    let slot = usize::from(h.avail[q] % l.queue_size);
                    h.vm_write(l.avail_off(q) + 4 + 2 * slot, &id.to_le_bytes());
                    h.avail[q] = h.avail[q].wrapping_add(1);
                }
                let idx = h.avail[q];
                h.vm_write(l.avail_off(q) + 2, &idx.to_le_bytes());
            }
            // Any available index.
            2 => {
                let q = usize::from(d.u8()) % 3;
                h.avail[q] = d.u16();
                let idx = h.avail[q];
                h.vm_write(l.avail_off(q) + 2, &idx.to_le_bytes());
            }
            // Any flag or index word the VM can reach, the device's included.
            3 => {
                let q = usize::from(d.u8()) % 3;
                let off = match d.u8() % 3 {
                    0 => l.avail_off(q),
                    1 => l.used_off(q),
                    _ => l.used_off(q) + 2,
                };
                let v = d.u16();
                h.vm_write(off, &v.to_le_bytes());
            }
            // A DPU turn: time moves on, then up to 64 frames, as the loop takes them.
            4 => {
                h.now += u64::from(d.u16()) * 10_000;
                h.port.begin_turn(h.now);
                if h.now - h.window_start >= BAD_DESC_WINDOW_NS {
                    h.window_start = h.now;
                    h.bad_window = 0;
                }
                let before = (h.port.bad_desc, h.port.turn_budget_hits);
                let judged = h.port.misbehaving().is_some();
                let mut broken = false;
                for _ in 0..64 {
                    let mut buf = std::mem::take(&mut h.buf);
                    let r = h.port.recv(&mut buf);
                    h.buf = buf;
                    match r {
                        Ok(Some(len)) => {
                            assert!((12..=h.buf.len()).contains(&len));
                            h.out.frames += 1;
                        }
                        Ok(None) => break,
                        Err(_) => {
                            broken = true;
                            break;
                        }
                    }
                }
                let bad = h.port.bad_desc - before.0;
                assert!(bad <= u64::from(BAD_DESC_PER_TURN), "{bad} bad in one turn");
                if judged {
                    assert_eq!(bad, 0, "a misbehaving port is not read");
                }
                h.out.turn_budget += h.port.turn_budget_hits - before.1;
                h.note_bad(bad);
                let allowed = [h.used_area(QUEUE_TX), h.used_area(QUEUE_RX_DPU)];
                h.check_writes(&allowed);
                if broken {
                    h.out.broken += 1;
                    break;
                }
                h.check_judgement();
            }
            // The DPU sends a frame into receive queue 1.
            5 => {
                let len = usize::from(d.u16() % 3000);
                let fill = d.u8();
                let hdr = [fill ^ 0xff; 12];
                let frame: Vec<u8> = (0..len).map(|i| fill.wrapping_add(i as u8)).collect();
                let before = (h.port.bad_desc, h.port.rx_no_buffer);
                let r = h.port.send(&hdr, &frame);
                let rx_bufs = (
                    l.bufs_off(QUEUE_RX_DPU),
                    l.bufs_off(QUEUE_RX_DPU) + l.bufs_len(),
                );
                let mut allowed = vec![h.used_area(QUEUE_TX), h.used_area(QUEUE_RX_DPU)];
                let written = matches!(r, Ok(true));
                if written {
                    allowed.push(rx_bufs);
                }
                let changed = h.check_writes(&allowed);
                if written {
                    h.out.written += 1;
                    // The frame lies in one window of at most a descriptor's length inside
                    // the area: every changed byte is within the header + frame just written.
                    let inside: Vec<_> = changed
                        .iter()
                        .filter(|c| c.0 >= rx_bufs.0 && c.1 <= rx_bufs.1)
                        .collect();
                    if let (Some(first), Some(last)) = (inside.first(), inside.last()) {
                        assert!(last.1 - first.0 <= 12 + len, "{inside:x?}");
                    }
                }
                let bad = h.port.bad_desc - before.0;
                assert!(bad <= 1);
                h.note_bad(bad);
                if r.is_err() {
                    h.out.broken += 1;
                    break;
                }
                h.check_judgement();
            }
            // The VM writes on its socket; the DPU checks it.
            6 => {
                let k = usize::from(d.u16() % 8192);
                let chunk = vec![0x5au8; k];
                let _ = (&h.vm).write(&chunk);
                let before = h.port.socket_bytes;
                let gone = h.port.endpoint_gone();
                assert!(!gone, "the VM's end is open");
                let read = h.port.socket_bytes - before;
                assert!(
                    read <= SOCKET_READ_PER_TURN as u64,
                    "{read} bytes in one call"
                );
                if h.port.socket_bytes > SOCKET_BYTES_MAX && h.expect.is_none() {
                    h.expect = Some(Misbehaviour::SocketFlood);
                }
                h.check_writes(&[]);
                h.check_judgement();
            }
            // Notification handshakes.
            7 => {
                h.port.flush_irq();
                let _ = h.port.prepare_sleep();
                if d.u8() & 1 == 0 {
                    h.port.woke();
                }
                let allowed = [h.used_area(QUEUE_TX), h.used_area(QUEUE_RX_DPU)];
                h.check_writes(&allowed);
            }
            // A valid frame on the transmit queue, so good and bad ones mix.
            8 => {
                let id = usize::from(d.u8()) % n;
                let len = 12 + u32::from(d.u8()) * 4;
                let mut b = [0u8; 16];
                b[..8].copy_from_slice(&l.iova(l.buf_off(QUEUE_TX, id as u16)).to_le_bytes());
                b[8..12].copy_from_slice(&len.min(l.buf_bytes).to_le_bytes());
                h.vm_write(l.desc_off(QUEUE_TX) + 16 * id, &b);
                let slot = usize::from(h.avail[0] % l.queue_size);
                h.vm_write(
                    l.avail_off(QUEUE_TX) + 4 + 2 * slot,
                    &(id as u16).to_le_bytes(),
                );
                h.avail[0] = h.avail[0].wrapping_add(1);
                let idx = h.avail[0];
                h.vm_write(l.avail_off(QUEUE_TX) + 2, &idx.to_le_bytes());
            }
            // The VM leaves.
            _ => {
                if d.u8() == 0xee {
                    let _ = h.vm.shutdown(std::net::Shutdown::Both);
                    // What the VM wrote before is read first, a bounded amount per call.
                    let mut calls = 0;
                    while !h.port.endpoint_gone() {
                        calls += 1;
                        assert!(calls < 1000, "the closed end is never seen");
                    }
                    break;
                }
            }
        }
    }
    match h.port.misbehaving() {
        Some(Misbehaviour::BadDescriptors) => h.out.bad_desc_detach += 1,
        Some(Misbehaviour::SocketFlood) => h.out.flood_detach += 1,
        None => {}
    }
    h.out
}
