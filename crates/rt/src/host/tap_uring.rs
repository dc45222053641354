//! Batched TAP I/O on io_uring for the DPU process (docs/adr/0005-tap-io.md).
//!
//! Every TAP keeps `reads_per_tap` reads outstanding into registered buffers; a loop turn
//! hands the frames that arrived to the caller ([`TapUring::drain_frames`]), queues its writes
//! into registered transmit buffers ([`TapTx::write`]), and ends with one `io_uring_enter`
//! ([`TapUring::enter`]) that submits the writes and the re-armed reads together and collects
//! what completed meanwhile. That is the whole gain: the reads and writes still run in the
//! kernel as before (inline at submission, on non-blocking fds), but a turn of dozens of frames
//! costs one system call instead of two per frame and a `poll`.
//!
//! The ring is set up single-issuer with deferred task work, so completions are posted only
//! inside `enter`, on this thread: the loop sees a consistent batch per turn, and the process
//! must use the ring from the thread that made it (the DPU process's loop is one thread).
//! Waking up still goes through `poll` on the TAP fds: a frame arriving at a TAP with a read
//! armed makes the fd readable as before.
//!
//! Limits: `reads_per_tap` buffers per TAP, `tx_bufs` transmit buffers in all; a write with no
//! free transmit buffer is refused (the caller counts it, as it counts a failed `write`); a
//! write that fails in the kernel is counted when its completion comes, in
//! [`TapUringCounters::write_errors`].

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

use io_uring::{IoUring, opcode, squeue, types};

/// A completion's `user_data`: bit 63 marks a write; bits 16..32 the file, 0..16 the buffer.
const WRITE: u64 = 1 << 63;

spillway_vswitch::counters! {
    /// What the ring counted.
    #[derive(Copy, PartialEq, Eq)]
    pub struct TapUringCounters {
        /// `io_uring_enter` calls (one per loop turn).
        enters => "rt.uring.enters",
        /// Frames read.
        reads => "rt.uring.reads",
        /// Frames written.
        writes => "rt.uring.writes",
        /// Reads that failed (other than "try again"); re-armed.
        read_errors => "rt.uring.read_errors",
        /// Writes the kernel refused (the VM's queue full, or it is gone).
        write_errors => "rt.uring.write_errors",
        /// Writes refused for want of a free transmit buffer.
        tx_full => "rt.uring.tx_full",
    }
}

/// The transmit side and the ring itself: what a frame handler needs to send.
pub struct TapTx {
    ring: IoUring,
    /// The registered transmit buffers, `tx_bufs * buf_len` bytes, after the receive buffers
    /// in the registered table.
    tx: Box<[u8]>,
    tx_free: Vec<u16>,
    /// The receive buffers' base (for re-arming reads into them).
    rx_base: *mut u8,
    rx_bufs: u16,
    buf_len: usize,
    /// Operations submitted or queued whose completion has not been seen.
    inflight: usize,
    counters: TapUringCounters,
}

/// Batched reads and writes on a set of TAP fds (see the module doc).
pub struct TapUring {
    /// The ring; closed (after `Drop for TapUring` drained it) before the buffers are freed.
    tx: TapTx,
    rx: Box<[u8]>,
    /// Reads completed and not yet handed out: (file, buffer, length).
    ready: Vec<(u16, u16, u32)>,
}

impl std::fmt::Debug for TapTx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TapTx")
            .field("tx_free", &self.tx_free.len())
            .field("inflight", &self.inflight)
            .finish()
    }
}

impl std::fmt::Debug for TapUring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TapUring")
            .field("rx_bufs", &self.tx.rx_bufs)
            .field("tx_free", &self.tx.tx_free.len())
            .field("inflight", &self.tx.inflight)
            .field("counters", &self.tx.counters)
            .finish()
    }
}

impl TapUring {
    /// A ring over `fds` (file `i` is `fds[i]`, which must stay open as long as the ring),
    /// with `reads_per_tap` reads armed on each and `tx_bufs` transmit buffers, every buffer
    /// `buf_len` bytes (the largest frame, with its virtio-net header).
    pub fn new(
        fds: &[BorrowedFd<'_>],
        reads_per_tap: usize,
        tx_bufs: usize,
        buf_len: usize,
    ) -> io::Result<TapUring> {
        let rx_bufs = fds.len() * reads_per_tap;
        let total = rx_bufs + tx_bufs;
        if fds.is_empty() || reads_per_tap == 0 || tx_bufs == 0 || total > usize::from(u16::MAX) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "io_uring TAP I/O: {} TAPs x {reads_per_tap} reads + {tx_bufs} transmit buffers \
                     (expected at least one of each, at most 65535 buffers)",
                    fds.len()
                ),
            ));
        }
        let entries = (total as u32).next_power_of_two();
        let ring: IoUring = IoUring::builder()
            .setup_single_issuer()
            .setup_defer_taskrun()
            .setup_cqsize(entries * 2)
            .build(entries)?;
        let mut rx = vec![0u8; rx_bufs * buf_len].into_boxed_slice();
        let mut tx = vec![0u8; tx_bufs * buf_len].into_boxed_slice();
        let iovecs: Vec<libc::iovec> = rx
            .chunks_exact_mut(buf_len)
            .chain(tx.chunks_exact_mut(buf_len))
            .map(|b| libc::iovec {
                iov_base: b.as_mut_ptr().cast(),
                iov_len: b.len(),
            })
            .collect();
        // SAFETY: every iovec points into `rx` or `tx`, heap buffers that never move and that
        // `TapUring` frees only after cancelling and draining every operation using them, or
        // never (see `Drop for TapUring`).
        unsafe { ring.submitter().register_buffers(&iovecs)? };
        let raw: Vec<i32> = fds.iter().map(AsRawFd::as_raw_fd).collect();
        ring.submitter().register_files(&raw)?;
        let rx_base = rx.as_mut_ptr();
        let mut u = TapUring {
            tx: TapTx {
                ring,
                tx,
                tx_free: (rx_bufs as u16..total as u16).rev().collect(),
                rx_base,
                rx_bufs: rx_bufs as u16,
                buf_len,
                inflight: 0,
                counters: TapUringCounters::default(),
            },
            rx,
            ready: Vec::with_capacity(rx_bufs),
        };
        for b in 0..rx_bufs {
            u.tx.arm_read((b / reads_per_tap) as u16, b as u16)?;
        }
        u.enter()?;
        Ok(u)
    }

    /// Counters.
    pub fn counters(&self) -> &TapUringCounters {
        &self.tx.counters
    }

    /// Whether frames are waiting for [`TapUring::drain_frames`].
    pub fn has_frames(&self) -> bool {
        !self.ready.is_empty()
    }

    /// Submits everything queued (writes, re-armed reads) and collects what has completed, in
    /// one system call that does not wait.
    pub fn enter(&mut self) -> io::Result<()> {
        let zero = types::Timespec::new();
        let args = types::SubmitArgs::new().timespec(&zero);
        self.tx.counters.enters += 1;
        match self.tx.ring.submitter().submit_with_args(1, &args) {
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ETIME | libc::EINTR | libc::EBUSY | libc::EAGAIN)
                ) => {}
            Err(e) => return Err(e),
        }
        let TapUring { tx, ready, .. } = self;
        let mut rearm = Vec::new();
        for cqe in tx.ring.completion() {
            tx.inflight -= 1;
            let ud = cqe.user_data();
            let (file, buf) = (((ud >> 16) & 0xffff) as u16, (ud & 0xffff) as u16);
            let res = cqe.result();
            if ud & WRITE != 0 {
                tx.tx_free.push(buf);
                if res < 0 {
                    tx.counters.write_errors += 1;
                } else {
                    tx.counters.writes += 1;
                }
            } else if res > 0 {
                tx.counters.reads += 1;
                ready.push((file, buf, res as u32));
            } else {
                if res != -libc::EAGAIN && res != -libc::EINTR && res != -libc::ECANCELED {
                    tx.counters.read_errors += 1;
                }
                rearm.push((file, buf));
            }
        }
        for (file, buf) in rearm {
            tx.arm_read(file, buf)?;
        }
        Ok(())
    }

    /// Hands every frame read since the last call to `f` (its file, its bytes, and the
    /// transmit side for the writes it causes), then re-arms its buffer.
    pub fn drain_frames(
        &mut self,
        mut f: impl FnMut(usize, &[u8], &mut TapTx),
    ) -> io::Result<usize> {
        let TapUring { tx, rx, ready } = self;
        let n = ready.len();
        for (file, buf, len) in ready.drain(..) {
            let at = usize::from(buf) * tx.buf_len;
            f(usize::from(file), &rx[at..at + len as usize], tx);
            tx.arm_read(file, buf)?;
        }
        Ok(n)
    }

    /// The transmit side, for writes outside [`TapUring::drain_frames`].
    pub fn tx(&mut self) -> &mut TapTx {
        &mut self.tx
    }
}

impl TapTx {
    /// Queues a read of file `file` into receive buffer `buf`.
    fn arm_read(&mut self, file: u16, buf: u16) -> io::Result<()> {
        debug_assert!(buf < self.rx_bufs);
        // SAFETY: `buf` is a receive buffer index, so the pointer stays inside the registered
        // receive area; no other operation uses that buffer until this read completes.
        let ptr = unsafe { self.rx_base.add(usize::from(buf) * self.buf_len) };
        let e =
            opcode::ReadFixed::new(types::Fixed(u32::from(file)), ptr, self.buf_len as u32, buf)
                .build()
                .user_data((u64::from(file) << 16) | u64::from(buf));
        self.push(&e)
    }

    /// Queues a write of `parts`, one after the other, as one frame to file `file`; false if
    /// no transmit buffer was free or the frame does not fit one (counted).
    pub fn write(&mut self, file: usize, parts: [&[u8]; 2]) -> bool {
        let len = parts[0].len() + parts[1].len();
        if len > self.buf_len {
            self.counters.write_errors += 1;
            return false;
        }
        let Some(buf) = self.tx_free.pop() else {
            self.counters.tx_full += 1;
            return false;
        };
        let at = usize::from(buf - self.rx_bufs) * self.buf_len;
        let dst = &mut self.tx[at..at + len];
        dst[..parts[0].len()].copy_from_slice(parts[0]);
        dst[parts[0].len()..].copy_from_slice(parts[1]);
        let e = opcode::WriteFixed::new(types::Fixed(file as u32), dst.as_ptr(), len as u32, buf)
            .build()
            .user_data(WRITE | ((file as u64) << 16) | u64::from(buf));
        if self.push(&e).is_err() {
            self.tx_free.push(buf);
            self.counters.write_errors += 1;
            return false;
        }
        true
    }

    /// Pushes `e`, submitting first if the submission queue is full.
    fn push(&mut self, e: &squeue::Entry) -> io::Result<()> {
        // SAFETY: `e` refers only to registered files and to a registered buffer that no
        // other queued operation uses (the free lists and the armed reads are disjoint), and
        // that buffer outlives the operation (see `Drop for TapUring`).
        if unsafe { self.ring.submission().push(e) }.is_err() {
            self.ring.submit()?;
            // SAFETY: as above.
            unsafe { self.ring.submission().push(e) }
                .map_err(|_| io::Error::other("io_uring submission queue full after a submit"))?;
        }
        self.inflight += 1;
        Ok(())
    }
}

impl TapTx {
    /// Cancels every operation and waits for their completions; true when none is left, so
    /// the kernel writes into no buffer any more.
    fn cancel_all(&mut self) -> bool {
        let _ = self
            .ring
            .submitter()
            .register_sync_cancel(None, types::CancelBuilder::any());
        let ts = types::Timespec::new().nsec(10_000_000);
        let args = types::SubmitArgs::new().timespec(&ts);
        for _ in 0..100 {
            self.inflight -= self.ring.completion().count().min(self.inflight);
            if self.inflight == 0 {
                return true;
            }
            let _ = self.ring.submitter().submit_with_args(1, &args);
        }
        false
    }
}

impl Drop for TapUring {
    /// Cancels and drains every operation before the buffers go; if that cannot be
    /// confirmed, the buffers are leaked rather than freed under an operation.
    fn drop(&mut self) {
        if !self.tx.cancel_all() {
            tracing::error!(target: "spillway::run", inflight = self.tx.inflight, "io_uring operations still in flight at exit; leaking their buffers");
            std::mem::forget(std::mem::take(&mut self.rx));
            std::mem::forget(std::mem::take(&mut self.tx.tx));
        }
    }
}
