//! Shared-memory VM ports: the attach handshake, the DPU's end of a port, the spill plane's
//! vATC delivery into a VM's receive queue, and the VM's side (`spillway vm-endpoint`).
//!
//! ## Attach
//!
//! The DPU process listens on one Unix socket per shared-memory VM
//! ([`port_socket`]). The VM's endpoint creates its memory ([`VmMemory`], see [`crate::shm::virtq`]
//! for the layout) and two eventfds, and sends [`HELLO`], a JSON line `{"vm": NAME}` and the
//! three fds (memory, kick, interrupt) in one message; the DPU maps the memory, checks it and
//! answers `ok` (or `error: ...`). The connection stays open: its end is the port's end, as a
//! vhost-user socket's is. The DPU then registers the VM's three buffer areas with its vATC
//! authority ([`regions`]): the transmit buffers readable, the two receive areas writable.
//!
//! ## Who writes where
//!
//! - The DPU process reads the transmit queue and fills receive queue 1 ([`ShmPort`]); it checks
//!   each descriptor against the VM's memory map itself ([`crate::shm::virtq::check_desc`]).
//! - The spill plane fills receive queue 2 ([`PlaneVm::deliver`]): it translates the buffer's
//!   IOVA through its [`Atc`] (write permission needed: only receive areas grant it), at the
//!   epoch the DPU last announced for the VM, and copies into the mapping at the translated
//!   offsets, which are bounds-checked against that VM's own memfd as well. A miss is returned
//!   to the caller (who sends the packet the DPU way and asks the DPU for the translation);
//!   nothing waits.
//!
//! ## Budgets: what one VM may cost the DPU's loop
//!
//! A VM controls its queues and its socket, and the DPU's one loop serves every tenant, so each
//! thing a VM can make the loop do is bounded per turn and a VM that keeps misbehaving is
//! detached with a counted reason ([`Misbehaviour`]); the other ports keep forwarding.
//!
//! - **Bad descriptors.** [`ShmPort::recv`] refuses at most [`BAD_DESC_PER_TURN`] bad transmit
//!   descriptors per loop turn ([`ShmPort::begin_turn`] opens a turn), then stops taking from the
//!   queue until the next turn. Every bad descriptor (transmit, or a receive buffer
//!   [`fill_rx`] could not use) counts in a window of [`BAD_DESC_WINDOW_NS`]; more than
//!   [`BAD_DESC_WINDOW_MAX`] in one window is [`Misbehaviour::BadDescriptors`]. A driver that
//!   follows the protocol posts none.
//! - **The socket.** After the attach the VM has nothing to say on its socket: its end is the
//!   port's end. [`ShmPort::endpoint_gone`] reads at most [`SOCKET_READ_PER_TURN`] bytes per
//!   call, so a VM writing without pause cannot hold the loop; more than [`SOCKET_BYTES_MAX`]
//!   bytes in all is [`Misbehaviour::SocketFlood`].

use std::io::{self, Read, Write};
use std::os::fd::BorrowedFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use spillway_fabric::atc::{Atc, AtcEpoch, AtcError, AtcMiss, HostAddr, Iova, Mapping, Perm, VmId};

use crate::shm::fdpass;
use crate::shm::ring::Doorbell;
use crate::shm::virtq::{
    self, DESC_F_INDIRECT, DESC_F_NEXT, DESC_F_WRITE, DeviceQueue, NET_HDR_BYTES, QUEUE_RX_DPU,
    QUEUE_RX_PLANE, QUEUE_TX, VirtqError, VmLayout, VmMemory,
};
use crate::testbed::Testbed;

/// The first bytes of an attach message.
pub const HELLO: &str = "spillway-vm-v1";

/// The socket the DPU process listens on for VM `vm`'s endpoint.
pub fn port_socket(tb: &Testbed, vm: &str) -> PathBuf {
    tb.state_dir.join(format!("{}-vm-{vm}.sock", tb.name))
}

/// The regions the vATC authority holds for a VM with `layout`: the transmit buffers (the
/// device reads them) and the two receive buffer areas (the device writes them). Host
/// addresses are offsets in the VM's memfd.
pub fn regions(layout: &VmLayout) -> [Mapping; 3] {
    let area = |q, perm| Mapping {
        iova: Iova(layout.iova(layout.bufs_off(q))),
        len: layout.bufs_len() as u64,
        host: HostAddr(layout.bufs_off(q) as u64),
        perm,
    };
    [
        area(QUEUE_TX, Perm::READ),
        area(QUEUE_RX_DPU, Perm::WRITE),
        area(QUEUE_RX_PLANE, Perm::WRITE),
    ]
}

/// Bad transmit descriptors [`ShmPort::recv`] refuses per loop turn before it leaves the
/// queue to the next turn: at about 50 ns each, 32 cost the other ports under 2 µs a turn.
pub const BAD_DESC_PER_TURN: u32 = 32;
/// The window bad descriptors are counted in, ns.
pub const BAD_DESC_WINDOW_NS: u64 = 100_000_000;
/// Bad descriptors (both queues) one VM may post within one [`BAD_DESC_WINDOW_NS`] window; one
/// more detaches the port ([`Misbehaviour::BadDescriptors`]). At this rate (41,000 a second)
/// a VM costs the loop about 2 ms a second.
pub const BAD_DESC_WINDOW_MAX: u64 = 4096;
/// Bytes [`ShmPort::endpoint_gone`] reads from a VM's socket per call.
pub const SOCKET_READ_PER_TURN: usize = 4096;
/// Bytes a VM may write on its socket after the attach, in all, before it is detached
/// ([`Misbehaviour::SocketFlood`]); the protocol has it write none.
pub const SOCKET_BYTES_MAX: u64 = 64 << 10;

/// Why a VM's port is detached for what the VM did (counted as `rt.vm.detached.<name>`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Misbehaviour {
    /// More than [`BAD_DESC_WINDOW_MAX`] bad descriptors within [`BAD_DESC_WINDOW_NS`].
    BadDescriptors,
    /// More than [`SOCKET_BYTES_MAX`] bytes written on the port socket after the attach.
    SocketFlood,
}

impl Misbehaviour {
    /// Short name (metrics and logs).
    pub fn name(self) -> &'static str {
        match self {
            Misbehaviour::BadDescriptors => "bad_desc",
            Misbehaviour::SocketFlood => "socket_flood",
        }
    }
}

/// Where a port's turn budget stands ([`DescBudget::turn`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Turn {
    /// Bad descriptors may still be refused this turn.
    Open,
    /// The budget is spent, found so for the first time this turn (count it once).
    JustSpent,
    /// The budget is spent.
    Spent,
}

/// The bad-descriptor budget of one VM port, shared by every kind of port that reads a VM's
/// queues (see the module doc): at most [`BAD_DESC_PER_TURN`] refused per loop turn, and more
/// than [`BAD_DESC_WINDOW_MAX`] within [`BAD_DESC_WINDOW_NS`] judges the VM misbehaving
/// ([`Misbehaviour`]), which sticks until the port is reset.
#[derive(Debug, Default)]
pub struct DescBudget {
    /// Bad transmit descriptors refused in this turn.
    bad_turn: u32,
    /// Bad descriptors in the window that started at `window_start` (ns).
    bad_window: u64,
    window_start: u64,
    misbehaving: Option<Misbehaviour>,
}

impl DescBudget {
    /// Opens a loop turn at `now_ns` (the DPU's clock): the per-turn budget starts again, and
    /// the window moves on once it is [`BAD_DESC_WINDOW_NS`] old.
    pub fn begin_turn(&mut self, now_ns: u64) {
        self.bad_turn = 0;
        if now_ns.saturating_sub(self.window_start) >= BAD_DESC_WINDOW_NS {
            self.window_start = now_ns;
            self.bad_window = 0;
        }
    }

    /// Whether the turn's budget is spent.
    pub fn turn(&mut self) -> Turn {
        match self.bad_turn.cmp(&BAD_DESC_PER_TURN) {
            std::cmp::Ordering::Less => Turn::Open,
            std::cmp::Ordering::Equal => {
                self.bad_turn += 1;
                Turn::JustSpent
            }
            std::cmp::Ordering::Greater => Turn::Spent,
        }
    }

    /// A bad descriptor refused from the queue the loop reads this turn (it spends the turn's
    /// budget); count it in the window with [`DescBudget::note_bad`] too.
    pub fn note_bad_in_turn(&mut self) {
        self.bad_turn += 1;
    }

    /// A bad descriptor, either queue: counted in the window.
    pub fn note_bad(&mut self) {
        self.bad_window += 1;
        if self.bad_window > BAD_DESC_WINDOW_MAX {
            self.judge(Misbehaviour::BadDescriptors);
        }
    }

    /// Judges the VM misbehaving for `why`, unless it already was for something else.
    pub fn judge(&mut self, why: Misbehaviour) {
        self.misbehaving.get_or_insert(why);
    }

    /// What the VM did that should detach its port, if anything.
    pub fn misbehaving(&self) -> Option<Misbehaviour> {
        self.misbehaving
    }
}

/// The DPU's end of a shared-memory port.
#[derive(Debug)]
pub struct ShmPort {
    /// The VM's memory.
    pub mem: VmMemory,
    tx: DeviceQueue,
    rx: DeviceQueue,
    kick: Doorbell,
    irq: Doorbell,
    stream: UnixStream,
    irq_pending: bool,
    /// Frames dropped because the VM had no receive buffer posted (`vm.rx.no_buffer`).
    pub rx_no_buffer: u64,
    /// Descriptors refused (`vm.desc.bad`).
    pub bad_desc: u64,
    /// Turns in which [`BAD_DESC_PER_TURN`] stopped [`ShmPort::recv`] (`vm.desc.turn_budget`).
    pub turn_budget_hits: u64,
    /// Bytes read from the socket after the attach (`vm.socket.bytes`).
    pub socket_bytes: u64,
    /// What the VM may still cost the loop (bad descriptors, socket bytes).
    budget: DescBudget,
}

/// What [`accept`] made of a connection.
#[derive(Debug)]
pub enum Accepted {
    /// The endpoint attached: the port and the VM name it gave.
    Attached(Box<ShmPort>, String),
    /// Its attach message has not arrived yet: try again later (the DPU's loop must not wait
    /// for an endpoint).
    NotYet(UnixStream),
}

/// Takes the attach message on `stream` if it has arrived (never blocks) and answers it.
pub fn accept(stream: UnixStream) -> Result<Accepted, String> {
    stream
        .set_nonblocking(true)
        .map_err(|e| format!("attach socket: {e}"))?;
    let mut buf = [0u8; 512];
    let (n, mut fds) = match fdpass::recv_with_fds(&stream, &mut buf, 3) {
        Ok(got) => got,
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Accepted::NotYet(stream)),
        Err(e) => return Err(format!("attach: {e}")),
    };
    let text = String::from_utf8_lossy(&buf[..n]).to_string();
    let reply = |s: &UnixStream, msg: &str| {
        let mut w = s;
        let _ = w.write_all(format!("{msg}\n").as_bytes());
    };
    let Some(doc) = text.strip_prefix(HELLO).map(str::trim) else {
        reply(&stream, "error: not a spillway VM attach message");
        return Err(format!("attach: not {HELLO}: {text:?}"));
    };
    let vm = serde_json::from_str::<serde_json::Value>(doc)
        .ok()
        .and_then(|v| v["vm"].as_str().map(str::to_string))
        .ok_or_else(|| format!("attach: expected {{\"vm\": NAME}}, got {doc:?}"))?;
    if fds.len() != 3 {
        reply(&stream, "error: expected 3 fds (memory, kick, interrupt)");
        return Err(format!("attach of {vm}: {} fds, expected 3", fds.len()));
    }
    let irq = fds.pop().expect("3 fds");
    let kick = fds.pop().expect("3 fds");
    let memfd = fds.pop().expect("3 fds");
    let mem = match VmMemory::from_fd(memfd) {
        Ok(m) => m,
        Err(e) => {
            reply(&stream, &format!("error: {e}"));
            return Err(format!("attach of {vm}: {e}"));
        }
    };
    let bell = |fd| Doorbell::from_fd(fd).map_err(|e| format!("attach of {vm}: {e}"));
    let (kick, irq) = (bell(kick)?, bell(irq)?);
    reply(&stream, "ok");
    let mut tx = DeviceQueue::attach(&mem, QUEUE_TX);
    tx.woke(&mem);
    let rx = DeviceQueue::attach(&mem, QUEUE_RX_DPU);
    Ok(Accepted::Attached(
        Box::new(ShmPort {
            mem,
            tx,
            rx,
            kick,
            irq,
            stream,
            irq_pending: false,
            rx_no_buffer: 0,
            bad_desc: 0,
            turn_budget_hits: 0,
            socket_bytes: 0,
            budget: DescBudget::default(),
        }),
        vm,
    ))
}

impl ShmPort {
    /// Opens a loop turn at `now_ns` (the DPU's clock): the per-turn budget starts again, and
    /// the bad-descriptor window moves on once it is [`BAD_DESC_WINDOW_NS`] old.
    pub fn begin_turn(&mut self, now_ns: u64) {
        self.budget.begin_turn(now_ns);
    }

    /// What the VM did that should detach its port, if anything (sticky: once misbehaving,
    /// always).
    pub fn misbehaving(&self) -> Option<Misbehaviour> {
        self.budget.misbehaving()
    }

    fn note_bad(&mut self) {
        self.bad_desc += 1;
        self.budget.note_bad();
    }

    /// Copies the next frame the VM transmitted (virtio-net header + frame) into `buf` and
    /// returns its length. A bad descriptor is returned to the VM unread and counted, and the
    /// next one tried, up to [`BAD_DESC_PER_TURN`] per turn: then `None`, as if the queue were
    /// empty, until [`ShmPort::begin_turn`] (and always `None` once the VM is
    /// [`ShmPort::misbehaving`]). An error is a broken queue (the port must be
    /// dropped).
    pub fn recv(&mut self, buf: &mut [u8]) -> Result<Option<usize>, VirtqError> {
        if self.misbehaving().is_some() {
            return Ok(None); // about to be detached: take nothing more from it
        }
        loop {
            match self.budget.turn() {
                Turn::Open => {}
                Turn::JustSpent => {
                    self.turn_budget_hits += 1;
                    return Ok(None);
                }
                Turn::Spent => return Ok(None),
            }
            let Some(d) = self.tx.peek(&self.mem)? else {
                return Ok(None);
            };
            let len = d.len as usize;
            let ok = (NET_HDR_BYTES..=buf.len()).contains(&len);
            let off = virtq::check_desc(self.mem.layout(), QUEUE_TX, &d, len);
            self.tx.complete(&self.mem, d.id, 0);
            self.irq_pending = true;
            match off {
                Ok(off) if ok && self.mem.read_bytes(off, &mut buf[..len]) => return Ok(Some(len)),
                _ => {
                    self.budget.note_bad_in_turn();
                    self.note_bad();
                    if self.misbehaving().is_some() {
                        return Ok(None);
                    }
                }
            }
        }
    }

    /// Writes a frame into the VM's next receive buffer of queue 1. False (counted) when the
    /// VM has none posted or posted a bad one.
    pub fn send(&mut self, hdr: &[u8], frame: &[u8]) -> Result<bool, VirtqError> {
        let filled = fill_rx(&self.mem, &mut self.rx, hdr, frame)?;
        match filled {
            Filled::Written => {}
            Filled::NoBuffer => self.rx_no_buffer += 1,
            Filled::BadDesc => self.note_bad(),
        }
        if filled != Filled::NoBuffer {
            self.irq_pending = true;
        }
        Ok(filled == Filled::Written)
    }

    /// Interrupts the VM if anything was completed since the last call and it asked for it.
    pub fn flush_irq(&mut self) {
        if std::mem::take(&mut self.irq_pending)
            && (self.tx.needs_interrupt(&self.mem) || self.rx.needs_interrupt(&self.mem))
        {
            let _ = self.irq.kick();
        }
    }

    /// Before sleeping: asks the VM for kicks; false if frames arrived meanwhile.
    pub fn prepare_sleep(&mut self) -> bool {
        self.tx.prepare_sleep(&self.mem)
    }

    /// After waking.
    pub fn woke(&mut self) {
        self.tx.woke(&self.mem);
        let _ = self.kick.drain();
    }

    /// The kick eventfd, to poll.
    pub fn kick_fd(&self) -> BorrowedFd<'_> {
        self.kick.as_fd()
    }

    /// The interrupt eventfd (handed to the spill plane with the memory).
    pub fn irq_fd(&self) -> BorrowedFd<'_> {
        self.irq.as_fd()
    }

    /// Whether the endpoint has gone (its socket reached end of file or failed). Reads at most
    /// [`SOCKET_READ_PER_TURN`] bytes: the VM has nothing to say after the attach, and a VM
    /// that writes without pause must not hold the loop here; past [`SOCKET_BYTES_MAX`] bytes
    /// it is [`Misbehaviour::SocketFlood`].
    pub fn endpoint_gone(&mut self) -> bool {
        let mut b = [0u8; 1024];
        let mut read = 0usize;
        while read < SOCKET_READ_PER_TURN {
            match self.stream.read(&mut b) {
                Ok(0) => return true,
                Ok(n) => {
                    read += n;
                    self.socket_bytes += n as u64;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return true,
            }
        }
        if self.socket_bytes > SOCKET_BYTES_MAX {
            self.budget.judge(Misbehaviour::SocketFlood);
        }
        false
    }
}

/// What [`fill_rx`] did with a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Filled {
    /// Written into the VM's next receive buffer and published.
    Written,
    /// The VM has no receive buffer posted.
    NoBuffer,
    /// The buffer's descriptor was unusable; returned to the VM empty.
    BadDesc,
}

/// The DPU's write into a VM's receive queue 1 (`dev`): takes the next posted buffer, checks its
/// descriptor against the VM's memory map ([`virtq::check_desc`]), writes `hdr` + `frame` and
/// publishes it. Allocates nothing.
pub fn fill_rx(
    mem: &VmMemory,
    dev: &mut DeviceQueue,
    hdr: &[u8],
    frame: &[u8],
) -> Result<Filled, VirtqError> {
    let Some(d) = dev.peek(mem)? else {
        return Ok(Filled::NoBuffer);
    };
    let need = hdr.len() + frame.len();
    let written = match virtq::check_desc(mem.layout(), dev.queue(), &d, need) {
        Ok(off) => mem.write_bytes(off, hdr) && mem.write_bytes(off + hdr.len(), frame),
        Err(_) => false,
    };
    dev.complete(mem, d.id, if written { need as u32 } else { 0 });
    Ok(if written {
        Filled::Written
    } else {
        Filled::BadDesc
    })
}

/// Why the spill plane could not deliver a frame into VM memory itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DirectRefused {
    /// The VM has no receive buffer posted on the plane's queue.
    NoBuffer,
    /// The buffer's IOVA has no fresh translation; fill these ranges and retry.
    Miss(AtcMiss),
    /// The descriptor or its translation is unusable (returned to the VM, counted).
    BadDesc,
    /// The queue is broken (the VM published nonsense); the port must be detached.
    Broken,
    /// The frame's offloads need what only the DPU way does (a checksum completed for a guest
    /// that takes none), or the guest cannot take it at all.
    Offload,
    /// The DPU process has not lent the guest's queue (it is being reconfigured), or another
    /// plane is in it.
    NotLent,
}

/// A VM's memory as the spill plane holds it: its receive queue 2, the interrupt eventfd and
/// the VM's epoch as the DPU (the vATC authority) last announced it.
#[derive(Debug)]
pub struct PlaneVm {
    /// The vATC's name for the VM.
    pub vm: VmId,
    /// The VM's memory.
    pub mem: VmMemory,
    rx: DeviceQueue,
    irq: Doorbell,
    /// The VM's current epoch.
    pub epoch: AtcEpoch,
    irq_pending: bool,
}

impl PlaneVm {
    /// Attaches to `mem`'s plane receive queue.
    pub fn new(vm: VmId, mem: VmMemory, irq: Doorbell, epoch: AtcEpoch) -> PlaneVm {
        let rx = DeviceQueue::attach(&mem, QUEUE_RX_PLANE);
        PlaneVm {
            vm,
            mem,
            rx,
            irq,
            epoch,
            irq_pending: false,
        }
    }

    /// Copies `hdr` + `frame` into the VM's next receive buffer of queue 2 through `atc`, and
    /// publishes it. Allocates nothing.
    pub fn deliver(
        &mut self,
        atc: &mut Atc,
        hdr: &[u8],
        frame: &[u8],
    ) -> Result<(), DirectRefused> {
        let d = match self.rx.peek(&self.mem) {
            Ok(Some(d)) => d,
            Ok(None) => return Err(DirectRefused::NoBuffer),
            Err(_) => return Err(DirectRefused::Broken),
        };
        let need = hdr.len() + frame.len();
        if d.flags & (DESC_F_NEXT | DESC_F_INDIRECT) != 0
            || d.flags & DESC_F_WRITE == 0
            || (d.len as usize) < need
        {
            self.rx.complete(&self.mem, d.id, 0);
            self.irq_pending = true;
            return Err(DirectRefused::BadDesc);
        }
        let t = match atc.translate_at(self.epoch, self.vm, Iova(d.addr), need as u64, Perm::WRITE)
        {
            Ok(t) => t,
            // Not taken: the buffer stays posted for the retry after the fill.
            Err(AtcError::Miss(m)) => return Err(DirectRefused::Miss(m)),
            // Final at this epoch (a known-unmapped gap, no write permission, ...): the buffer
            // goes back to the VM unused, so it cannot miss again with every packet.
            Err(_) => {
                self.rx.complete(&self.mem, d.id, 0);
                self.irq_pending = true;
                return Err(DirectRefused::BadDesc);
            }
        };
        // The translation's segments cover [addr, addr + need) in order: copy header and frame
        // across them.
        let mut at = 0usize;
        let mut ok = true;
        for s in t.segments() {
            let (mut off, mut left) = (s.host.0 as usize, s.len as usize);
            while left > 0 && ok {
                let (src, from) = if at < hdr.len() {
                    (&hdr[at..], at)
                } else {
                    (&frame[at - hdr.len()..], at)
                };
                let n = left.min(src.len());
                ok &= self.mem.write_bytes(off, &src[..n]);
                at = from + n;
                off += n;
                left -= n;
            }
        }
        let len = if ok && at == need { need as u32 } else { 0 };
        self.rx.complete(&self.mem, d.id, len);
        self.irq_pending = true;
        if len == 0 {
            return Err(DirectRefused::BadDesc);
        }
        Ok(())
    }

    /// Interrupts the VM if anything was delivered since the last call and it asked for it.
    pub fn flush_irq(&mut self) {
        if std::mem::take(&mut self.irq_pending) && self.rx.needs_interrupt(&self.mem) {
            let _ = self.irq.kick();
        }
    }
}

/// Connects to the DPU process at `path` and attaches `mem` as VM `vm` (the endpoint's side).
pub fn attach(
    path: &Path,
    vm: &str,
    mem: &VmMemory,
    kick: &Doorbell,
    irq: &Doorbell,
) -> Result<UnixStream, String> {
    let stream =
        UnixStream::connect(path).map_err(|e| format!("connecting to {}: {e}", path.display()))?;
    send_attach(&stream, vm, mem, kick, irq)?;
    await_answer(&stream)?;
    Ok(stream)
}

/// Sends the attach message for `mem` as VM `vm` on `stream` (the first half of [`attach`]).
pub fn send_attach(
    stream: &UnixStream,
    vm: &str,
    mem: &VmMemory,
    kick: &Doorbell,
    irq: &Doorbell,
) -> Result<(), String> {
    let msg = format!("{HELLO} {}\n", serde_json::json!({ "vm": vm }));
    fdpass::send_with_fds(
        stream,
        msg.as_bytes(),
        &[mem.fd(), kick.as_fd(), irq.as_fd()],
    )
    .map_err(|e| format!("attaching: {e}"))
}

/// Waits (up to 5 s) for the DPU's answer to an attach message: `Ok` if it said `ok`.
pub fn await_answer(stream: &UnixStream) -> Result<(), String> {
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    while line.len() < 512 {
        match (&*stream).read(&mut b) {
            Ok(0) => break,
            Ok(_) if b[0] == b'\n' => break,
            Ok(_) => line.push(b[0]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("waiting for the DPU's answer: {e}")),
        }
    }
    let line = String::from_utf8_lossy(&line).to_string();
    if line != "ok" {
        return Err(format!("the DPU refused the port: {line}"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shm::virtq::DriverQueue;
    use std::time::Instant;

    /// A VM's memory and doorbells, attached to a [`ShmPort`] over a socket pair.
    fn attached(queue_size: u16) -> (VmMemory, UnixStream, ShmPort) {
        let layout = VmLayout {
            queue_size,
            buf_bytes: 2048,
            iova_base: 1 << 36,
        };
        let mem = VmMemory::create("t", layout).unwrap();
        let (kick, irq) = (Doorbell::new().unwrap(), Doorbell::new().unwrap());
        let (vm_end, dpu_end) = UnixStream::pair().unwrap();
        send_attach(&vm_end, "t", &mem, &kick, &irq).unwrap();
        let port = match accept(dpu_end).unwrap() {
            Accepted::Attached(p, name) => {
                assert_eq!(name, "t");
                *p
            }
            Accepted::NotYet(_) => panic!("the attach message was sent first"),
        };
        await_answer(&vm_end).unwrap();
        (mem, vm_end, port)
    }

    /// Posts every free transmit buffer as a chained descriptor (refused as bad).
    fn post_bad(mem: &VmMemory, tx: &mut DriverQueue) -> usize {
        while let Ok(Some((id, _))) = tx.reclaim(mem) {
            tx.put_free(id);
        }
        let mut n = 0;
        while let Some(id) = tx.take_free() {
            // Flags are read when the device takes the descriptor, after this write.
            tx.post(mem, id, 64);
            let d = mem.layout().desc_off(QUEUE_TX) + 16 * usize::from(id);
            assert!(mem.write_bytes(d + 12, &DESC_F_NEXT.to_le_bytes()));
            n += 1;
        }
        n
    }

    #[test]
    fn bad_transmit_descriptors_cost_one_budget_a_turn_and_a_persistent_vm_is_detached() {
        let (mem, _vm, mut port) = attached(256);
        let mut tx = DriverQueue::new(&mem, QUEUE_TX);
        assert_eq!(post_bad(&mem, &mut tx), 256);
        let mut buf = vec![0u8; 4096];
        port.begin_turn(0);
        assert_eq!(port.recv(&mut buf).unwrap(), None);
        assert_eq!(
            port.bad_desc,
            u64::from(BAD_DESC_PER_TURN),
            "one turn refuses at most the budget; the rest waits for the next turn"
        );
        assert_eq!(port.recv(&mut buf).unwrap(), None);
        assert_eq!(port.bad_desc, u64::from(BAD_DESC_PER_TURN));
        assert_eq!(port.turn_budget_hits, 1);
        assert_eq!(port.misbehaving(), None);
        // The VM keeps them posted, turn after turn, within one window: detached.
        let mut turns = 1u64;
        while port.misbehaving().is_none() {
            post_bad(&mem, &mut tx);
            port.begin_turn(turns * 1000);
            port.recv(&mut buf).unwrap();
            turns += 1;
            assert!(turns < 1000, "never judged misbehaving");
        }
        assert_eq!(port.misbehaving(), Some(Misbehaviour::BadDescriptors));
        assert_eq!(port.bad_desc, BAD_DESC_WINDOW_MAX + 1);
    }

    #[test]
    fn a_few_bad_descriptors_per_window_are_refused_but_not_punished() {
        let (mem, _vm, mut port) = attached(64);
        let mut tx = DriverQueue::new(&mem, QUEUE_TX);
        let mut buf = vec![0u8; 4096];
        // 64 a window for 100 windows: 6,400 in all, more than one window allows.
        for w in 0..100u64 {
            post_bad(&mem, &mut tx);
            for t in 0..4 {
                port.begin_turn(w * BAD_DESC_WINDOW_NS + t);
                port.recv(&mut buf).unwrap();
            }
        }
        assert_eq!(port.bad_desc, 6400);
        assert_eq!(port.misbehaving(), None);
    }

    #[test]
    fn a_socket_flood_is_read_a_bounded_amount_per_call_and_detaches_the_vm() {
        let (_mem, vm, mut port) = attached(8);
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writer = {
            let stop = stop.clone();
            let mut vm = vm.try_clone().unwrap();
            std::thread::spawn(move || {
                let chunk = [0x55u8; 4096];
                let deadline = Instant::now() + Duration::from_secs(3);
                while !stop.load(std::sync::atomic::Ordering::Relaxed) && Instant::now() < deadline
                {
                    if vm.write_all(&chunk).is_err() {
                        break;
                    }
                }
            })
        };
        std::thread::sleep(Duration::from_millis(50));
        // The old drain read 64 bytes at a time for as long as the VM wrote: seconds.
        let t = Instant::now();
        assert!(!port.endpoint_gone());
        let took = t.elapsed();
        assert!(
            took < Duration::from_millis(100),
            "one call took {took:?} under a flood"
        );
        assert!(port.socket_bytes <= SOCKET_READ_PER_TURN as u64);
        let mut calls = 1;
        while port.misbehaving().is_none() {
            assert!(!port.endpoint_gone());
            calls += 1;
            assert!(calls < 1000, "a flood is never judged misbehaving");
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(port.misbehaving(), Some(Misbehaviour::SocketFlood));
        assert!(port.socket_bytes > SOCKET_BYTES_MAX);
        drop(port);
        writer.join().unwrap();
    }
}
