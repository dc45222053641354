//! Shared-memory VM ports: the attach handshake, the DPU's end of a port, the spill plane's
//! vATC delivery into a VM's receive queue, and the VM's side (`spillway vm-endpoint`).
//!
//! ## Attach
//!
//! The DPU process listens on one Unix socket per shared-memory VM
//! ([`port_socket`]). The VM's endpoint creates its memory ([`VmMemory`], see [`crate::virtq`]
//! for the layout) and two eventfds, and sends [`HELLO`], a JSON line `{"vm": NAME}` and the
//! three fds (memory, kick, interrupt) in one message; the DPU maps the memory, checks it and
//! answers `ok` (or `error: ...`). The connection stays open: its end is the port's end, as a
//! vhost-user socket's is. The DPU then registers the VM's three buffer areas with its vATC
//! authority ([`regions`]): the transmit buffers readable, the two receive areas writable.
//!
//! ## Who writes where
//!
//! - The DPU process reads the transmit queue and fills receive queue 1 ([`ShmPort`]); it checks
//!   each descriptor against the VM's memory map itself ([`crate::virtq::check_desc`]).
//! - The spill plane fills receive queue 2 ([`PlaneVm::deliver`]): it translates the buffer's
//!   IOVA through its [`Atc`] (write permission needed: only receive areas grant it), at the
//!   epoch the DPU last announced for the VM, and copies into the mapping at the translated
//!   offsets, which are bounds-checked against that VM's own memfd as well. A miss is returned
//!   to the caller (who sends the packet the DPU way and asks the DPU for the translation);
//!   nothing waits.

use std::io::{self, Read, Write};
use std::os::fd::BorrowedFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use spillway_fabric::atc::{Atc, AtcEpoch, AtcError, AtcMiss, HostAddr, Iova, Mapping, Perm, VmId};

use crate::fdpass;
use crate::ring::Doorbell;
use crate::testbed::Testbed;
use crate::virtq::{
    self, DESC_F_INDIRECT, DESC_F_NEXT, DESC_F_WRITE, DeviceQueue, NET_HDR_BYTES, QUEUE_RX_DPU,
    QUEUE_RX_PLANE, QUEUE_TX, VirtqError, VmLayout, VmMemory,
};

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
        }),
        vm,
    ))
}

impl ShmPort {
    /// Copies the next frame the VM transmitted (virtio-net header + frame) into `buf` and
    /// returns its length. A bad descriptor is returned to the VM unread and counted, and the
    /// next one tried; an error is a broken queue (the port must be dropped).
    pub fn recv(&mut self, buf: &mut [u8]) -> Result<Option<usize>, VirtqError> {
        loop {
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
                _ => self.bad_desc += 1,
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
            Filled::BadDesc => self.bad_desc += 1,
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

    /// Whether the endpoint has gone (its socket reached end of file or failed).
    pub fn endpoint_gone(&mut self) -> bool {
        let mut b = [0u8; 64];
        loop {
            match self.stream.read(&mut b) {
                Ok(0) => return true,
                Ok(_) => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return false,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return true,
            }
        }
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
    let msg = format!("{HELLO} {}\n", serde_json::json!({ "vm": vm }));
    fdpass::send_with_fds(
        &stream,
        msg.as_bytes(),
        &[mem.fd(), kick.as_fd(), irq.as_fd()],
    )
    .map_err(|e| format!("attaching: {e}"))?;
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    while line.len() < 512 {
        match (&stream).read(&mut b) {
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
    Ok(stream)
}
