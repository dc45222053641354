//! Batched TAP I/O on io_uring for the DPU process (docs/adr/0005-tap-io.md).
//!
//! Every TAP has one **multishot read** (`IORING_OP_READ_MULTISHOT`, Linux 6.7) over a ring of
//! provided buffers of its own: the read waits on the TAP, and each frame that arrives completes
//! into the next buffer its ring offers, with no new submission per frame; a loop turn hands
//! the frames that arrived to the caller in those buffers ([`TapUring::drain_frames`]), queues
//! its writes ([`TapTx::send_in_place`] for the frame being handled, [`TapTx::write`] for any
//! other), and ends with one `io_uring_enter` ([`TapUring::enter`]) that submits the writes and
//! collects what completed meanwhile. A turn of dozens of frames costs one system call instead
//! of two per frame and a `poll`. On an older kernel (no multishot read, or no buffer rings)
//! the ring falls back to reads armed one buffer each: one read per TAP waits for a frame and,
//! while frames come, more that do not wait (`RWF_NOWAIT`), twice as many as its last
//! completions brought, up to `reads_per_tap` ([`TapUring::read_mode`] says which).
//!
//! **No copy in user space for a forwarded frame.** A frame is read into the headroom-led
//! buffer the vSwitch then rewrites in place (`DpuSwitch::process_in_place`), and
//! [`TapTx::send_in_place`] writes it out of that same buffer, its virtio-net header put in the
//! headroom in front of it: for a 64 KiB TSO frame that saves two 64 KiB copies (into the
//! vSwitch's buffer, then into a transmit buffer). The buffer goes back to its TAP when the
//! write completes.
//!
//! **With multishot reads each TAP reads into its own buffers** (`2 * reads_per_tap` of them;
//! the fallback shares one pool, re-armed round robin): a tenant that floods
//! its TAP, or whose frames wait long in flight, exhausts its own buffers and no other TAP's.
//! A TAP whose buffers are all taken stops reading (its frames wait in the TAP's queue, which
//! the kernel bounds and drops from when full) until a buffer comes back; its multishot read
//! then ends for want of one (counted in `rt.uring.reads_no_buffer`) and is re-armed.
//!
//! The ring is set up single-issuer with deferred task work, so completions are posted only
//! inside `enter`, on this thread: the loop sees a consistent batch per turn, and the process
//! must use the ring from the thread that made it (each forwarding thread has its own).
//! Waking up still goes through `poll` on the TAP fds: a frame arriving at a TAP with a read
//! waiting makes the fd readable as before.
//!
//! Limits: `2 * reads_per_tap` receive buffers per TAP, `tx_bufs` copy buffers in all; a write
//! with no free copy buffer is refused (the caller counts it, as it counts a failed `write`); a
//! write that fails in the kernel is counted when its completion comes, in
//! [`TapUringCounters::write_errors`].

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::atomic::{AtomicU16, Ordering};

use io_uring::{IoUring, Probe, cqueue, opcode, squeue, types};
use spillway_vswitch::PacketBuf;
use spillway_vswitch::packet::HEADROOM;

/// A completion's `user_data`: bit 63 marks a write, bit 62 one from a receive buffer (in
/// place); bits 16..32 the file, 0..16 the buffer (a multishot read's buffer comes in the
/// completion's flags instead).
const WRITE: u64 = 1 << 63;
const IN_PLACE: u64 = 1 << 62;
/// Bit 61 of an armed read's `user_data`: the read that waits for a frame (see `arm_read`).
const PARKED: u64 = 1 << 61;

/// How a [`TapUring`] reads its TAPs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadMode {
    /// One multishot read per TAP over a provided-buffer ring of the TAP's own (Linux 6.7+).
    Multishot,
    /// Reads armed one buffer each, from one pool (any kernel with io_uring).
    Armed,
}

spillway_vswitch::counters! {
    /// What the ring counted.
    #[derive(Copy, PartialEq, Eq)]
    pub struct TapUringCounters {
        /// `io_uring_enter` calls (at most one per loop turn: none when nothing is due).
        enters => "rt.uring.enters",
        /// Frames read.
        reads => "rt.uring.reads",
        /// Frames written.
        writes => "rt.uring.writes",
        /// Of those, written from the buffer they were read into (no copy).
        writes_in_place => "rt.uring.writes_in_place",
        /// Reads that failed (other than "try again"), or shorter than their metadata;
        /// re-armed.
        read_errors => "rt.uring.read_errors",
        /// Writes the kernel refused (the VM's queue full, or it is gone).
        write_errors => "rt.uring.write_errors",
        /// Writes refused for want of a free transmit buffer.
        tx_full => "rt.uring.tx_full",
        /// Armed reads (beyond each TAP's one waiting read) that found the TAP empty.
        reads_empty => "rt.uring.reads_empty",
        /// Reads submitted: one per frame or fewer with armed reads, one per TAP and per
        /// re-arm with multishot reads.
        reads_armed => "rt.uring.reads_armed",
        /// Multishot reads that ended because every buffer of their TAP was taken (the TAP's
        /// frames wait in its queue until a buffer comes back and the read is re-armed).
        reads_no_buffer => "rt.uring.reads_no_buffer",
    }
}

/// Reads armed one buffer each (the fallback where the kernel has no multishot read).
struct Armed {
    /// Receive buffers neither armed, nor lent out, nor in flight as a write.
    free: Vec<u16>,
    /// Reads armed per file.
    armed: Vec<u16>,
    reads_per_tap: u16,
    /// Reads to keep armed per file: twice the frames its last completions brought, at least
    /// one, at most `reads_per_tap` (see `arm_read`).
    want: Vec<u16>,
    /// Frames each file gave in this `enter`'s completions, and whether any read of it
    /// completed.
    got: Vec<u16>,
    seen: Vec<bool>,
    /// Whether the file has its one waiting read outstanding.
    parked: Vec<bool>,
    /// The next file [`TapTx::top_up`] looks at first.
    next_file: usize,
}

/// One provided-buffer ring per TAP (buffer group = file index), in one anonymous mapping
/// that the kernel reads: each ring's entries lie in a page-aligned slot of their own.
struct BufRings {
    map: *mut u8,
    map_len: usize,
    /// Bytes from one ring to the next (a multiple of the page size).
    slot: usize,
    /// Entries per ring (a power of two, at least the buffers per TAP).
    entries: u16,
    /// Receive buffers per TAP: file `f` owns buffers `f * per .. (f + 1) * per`.
    per: u16,
    /// Each ring's tail as this side last wrote it.
    tails: Vec<u16>,
    /// Buffers in each ring that the kernel has not yet taken.
    offered: Vec<u16>,
    /// Whether the file's multishot read is outstanding.
    live: Vec<bool>,
}

/// How the TAPs are read.
enum Reads {
    Multishot(BufRings),
    Armed(Armed),
}

/// The transmit side and the ring itself: what a frame handler needs to send.
pub struct TapTx {
    ring: IoUring,
    /// The copy buffers, `tx_bufs * tx_len` bytes, after the receive buffers in the
    /// registered table.
    tx: Box<[u8]>,
    tx_free: Vec<u16>,
    tx_len: usize,
    /// Where each receive buffer's reads go (its [`PacketBuf::receive_area`]) and how long
    /// that is; the buffers themselves are [`TapUring`]'s.
    rx_areas: Vec<(*mut u8, u32)>,
    reads: Reads,
    /// The receive buffer whose frame [`TapUring::drain_frames`] is handing out, until
    /// [`TapTx::send_in_place`] takes it.
    lent: Option<u16>,
    /// Metadata bytes read in front of every frame (the virtio-net header, or 0).
    prefix: usize,
    /// Operations submitted or queued whose last completion has not been seen.
    inflight: usize,
    /// The completions of one `enter`, copied out of the queue (room for a full queue).
    cqes: Vec<cqueue::Entry>,
    counters: TapUringCounters,
}

/// Batched reads and writes on a set of TAP fds (see the module doc).
pub struct TapUring {
    /// The ring; closed (after `Drop for TapUring` drained it) before the buffers are freed.
    tx: TapTx,
    rx: Vec<PacketBuf>,
    /// Reads completed and not yet handed out: (file, buffer, length).
    ready: Vec<(u16, u16, u32)>,
}

impl std::fmt::Debug for TapTx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TapTx")
            .field("read_mode", &self.read_mode())
            .field("tx_free", &self.tx_free.len())
            .field("inflight", &self.inflight)
            .finish()
    }
}

impl std::fmt::Debug for TapUring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TapUring")
            .field("rx_bufs", &self.rx.len())
            .field("tx", &self.tx)
            .field("counters", &self.tx.counters)
            .finish()
    }
}

impl TapUring {
    /// A ring over `fds` (file `i` is `fds[i]`, which must stay open as long as the ring),
    /// with `2 * reads_per_tap` receive buffers per TAP and `tx_bufs` copy buffers for frames
    /// that were not read here, reading with multishot reads where the kernel has them. Every
    /// frame is read with `prefix` bytes of metadata in front (the virtio-net header, or 0) and
    /// is at most `frame_max` bytes without them.
    pub fn new(
        fds: &[BorrowedFd<'_>],
        reads_per_tap: usize,
        tx_bufs: usize,
        prefix: usize,
        frame_max: usize,
    ) -> io::Result<TapUring> {
        Self::with_mode(
            fds,
            reads_per_tap,
            tx_bufs,
            prefix,
            frame_max,
            ReadMode::Multishot,
        )
    }

    /// [`TapUring::new`] with the read mode chosen: [`ReadMode::Multishot`] falls back to
    /// [`ReadMode::Armed`] where the kernel lacks it ([`TapUring::read_mode`] says which runs).
    pub fn with_mode(
        fds: &[BorrowedFd<'_>],
        reads_per_tap: usize,
        tx_bufs: usize,
        prefix: usize,
        frame_max: usize,
        mode: ReadMode,
    ) -> io::Result<TapUring> {
        let rx_bufs = fds.len() * reads_per_tap * 2;
        let total = rx_bufs + tx_bufs;
        if fds.is_empty()
            || reads_per_tap == 0
            || tx_bufs == 0
            || total > usize::from(u16::MAX)
            || prefix > HEADROOM
            || prefix + frame_max > u32::MAX as usize
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "io_uring TAP I/O: {} TAPs x {reads_per_tap} reads + {tx_bufs} transmit buffers, \
                     {prefix} metadata bytes (expected at least one of each, at most 65535 \
                     buffers, at most {HEADROOM} metadata bytes)",
                    fds.len()
                ),
            ));
        }
        let entries = (total as u32).next_power_of_two();
        let cq_entries = entries as usize * 2;
        let ring: IoUring = IoUring::builder()
            .setup_single_issuer()
            .setup_defer_taskrun()
            .setup_taskrun_flag()
            .setup_cqsize(cq_entries as u32)
            .build(entries)?;
        let tx_len = prefix + frame_max;
        let mut rx: Vec<PacketBuf> = (0..rx_bufs)
            .map(|_| PacketBuf::with_capacity(HEADROOM + frame_max))
            .collect();
        let mut tx = vec![0u8; tx_bufs * tx_len].into_boxed_slice();
        let rx_areas: Vec<(*mut u8, u32)> = rx
            .iter_mut()
            .map(|p| {
                let a = p.receive_area(prefix);
                (a.as_mut_ptr(), a.len() as u32)
            })
            .collect();
        // A receive buffer is registered whole, headroom included: reads go to its receive
        // area, but a frame written out in place may start anywhere in the headroom (an
        // encapsulation or an ICMP error grows it at the front, and its virtio-net header goes
        // in front of that), and a fixed write must lie inside its registered buffer.
        let iovecs: Vec<libc::iovec> = rx
            .iter_mut()
            .map(|p| {
                let whole = p.receive_area(HEADROOM);
                libc::iovec {
                    iov_base: whole.as_mut_ptr().cast(),
                    iov_len: whole.len(),
                }
            })
            .chain(tx.chunks_exact_mut(tx_len).map(|b| libc::iovec {
                iov_base: b.as_mut_ptr().cast(),
                iov_len: b.len(),
            }))
            .collect();
        // SAFETY: every iovec points into a receive buffer's heap storage or into `tx`, which
        // never move (a `PacketBuf` owns a boxed slice) and which `TapUring` frees only after
        // cancelling and draining every operation using them, or never (see
        // `Drop for TapUring`).
        unsafe { ring.submitter().register_buffers(&iovecs)? };
        let raw: Vec<i32> = fds.iter().map(AsRawFd::as_raw_fd).collect();
        ring.submitter().register_files(&raw)?;
        let per = (reads_per_tap * 2) as u16;
        let reads = match mode {
            ReadMode::Multishot => BufRings::new(&ring, fds.len(), per)?.map(Reads::Multishot),
            ReadMode::Armed => None,
        }
        .unwrap_or_else(|| {
            Reads::Armed(Armed {
                free: (0..rx_bufs as u16).rev().collect(),
                armed: vec![0; fds.len()],
                reads_per_tap: reads_per_tap as u16,
                want: vec![1; fds.len()],
                got: vec![0; fds.len()],
                seen: vec![false; fds.len()],
                parked: vec![false; fds.len()],
                next_file: 0,
            })
        });
        let mut u = TapUring {
            tx: TapTx {
                ring,
                tx,
                tx_free: (rx_bufs as u16..total as u16).rev().collect(),
                tx_len,
                rx_areas,
                reads,
                lent: None,
                prefix,
                inflight: 0,
                cqes: Vec::with_capacity(cq_entries),
                counters: TapUringCounters::default(),
            },
            rx,
            ready: Vec::with_capacity(rx_bufs),
        };
        if matches!(u.tx.reads, Reads::Multishot(_)) {
            for b in 0..rx_bufs as u16 {
                u.tx.release(b);
            }
        }
        u.tx.top_up()?;
        u.enter()?;
        Ok(u)
    }

    /// How the TAPs are read.
    pub fn read_mode(&self) -> ReadMode {
        self.tx.read_mode()
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
    /// one system call that does not wait, or in none when there is nothing to submit and the
    /// kernel has flagged no completion work: a loop spinning between frames then reads a flag
    /// in shared memory rather than enter the kernel. (With deferred task work, a read that
    /// found its frame completes only inside an `enter` asking for events; the ring's
    /// `IORING_SQ_TASKRUN` flag says one is due. Asking with `min_complete` 1 and a zero
    /// timeout, as this did before, set up and tore down a timed wait on every call: 14% of
    /// the DPU process's samples under an iperf3 TCP stream.)
    pub fn enter(&mut self) -> io::Result<()> {
        let due = {
            let mut sq = self.tx.ring.submission();
            sq.sync();
            !sq.is_empty() || sq.taskrun() || sq.cq_overflow()
        };
        if due {
            self.tx.counters.enters += 1;
            // `submit` asks for events (runs the deferred completions) when the flag is up.
            match self.tx.ring.submitter().submit() {
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::EINTR | libc::EBUSY | libc::EAGAIN)
                    ) => {}
                Err(e) => return Err(e),
            }
        }
        let TapUring { tx, ready, .. } = self;
        // The batch is copied out of the queue in one look (one load of its tail, one store
        // of its head), then handled: handling a completion may hand a buffer back, which
        // borrows `tx` and so not while the queue is borrowed.
        let mut cqes = std::mem::take(&mut tx.cqes);
        cqes.extend(tx.ring.completion());
        for cqe in cqes.drain(..) {
            tx.complete(cqe, ready);
        }
        tx.cqes = cqes;
        // Reads re-armed now are submitted by the next `enter`, with that turn's writes.
        tx.top_up()
    }

    /// Hands every frame read since the last call to `f`: its file, the buffer it was read
    /// into (the frame after the headroom, its metadata right in front: see
    /// [`PacketBuf::prefix`]), and the transmit side for the writes it causes. The buffer
    /// returns to its TAP after `f`, unless `f` sent it out with [`TapTx::send_in_place`];
    /// the TAPs' reads are then re-armed.
    pub fn drain_frames(
        &mut self,
        mut f: impl FnMut(usize, &mut PacketBuf, &mut TapTx),
    ) -> io::Result<usize> {
        let TapUring { tx, rx, ready } = self;
        let n = ready.len();
        for (file, buf, len) in ready.drain(..) {
            let pkt = &mut rx[usize::from(buf)];
            tx.lent = Some(buf);
            if pkt.set_received(tx.prefix, len as usize).is_ok() {
                f(usize::from(file), pkt, tx);
            } else {
                tx.counters.read_errors += 1;
            }
            if let Some(b) = tx.lent.take() {
                tx.release(b);
            }
        }
        tx.top_up()?;
        Ok(n)
    }

    /// The transmit side, for writes outside [`TapUring::drain_frames`].
    pub fn tx(&mut self) -> &mut TapTx {
        &mut self.tx
    }
}

impl TapTx {
    /// How the TAPs are read.
    pub fn read_mode(&self) -> ReadMode {
        match self.reads {
            Reads::Multishot(_) => ReadMode::Multishot,
            Reads::Armed(_) => ReadMode::Armed,
        }
    }

    /// Gives receive buffer `buf` back to be read into: to its TAP's ring, or to the pool.
    fn release(&mut self, buf: u16) {
        match &mut self.reads {
            Reads::Armed(a) => a.free.push(buf),
            Reads::Multishot(r) => {
                let (addr, len) = self.rx_areas[usize::from(buf)];
                r.offer(buf, addr, len);
            }
        }
    }

    /// Takes in one completion: a write's buffer goes back, a read's frame goes to `ready`.
    fn complete(&mut self, cqe: cqueue::Entry, ready: &mut Vec<(u16, u16, u32)>) {
        let ud = cqe.user_data();
        let (file, buf) = (((ud >> 16) & 0xffff) as u16, (ud & 0xffff) as u16);
        let res = cqe.result();
        let flags = cqe.flags();
        if ud & WRITE != 0 {
            self.inflight -= 1;
            if ud & IN_PLACE != 0 {
                self.release(buf);
            } else {
                self.tx_free.push(buf);
            }
            if res < 0 {
                self.counters.write_errors += 1;
            } else {
                self.counters.writes += 1;
                self.counters.writes_in_place += u64::from(ud & IN_PLACE != 0);
            }
            return;
        }
        let f = usize::from(file);
        let buf = match &mut self.reads {
            Reads::Armed(a) => {
                self.inflight -= 1;
                a.armed[f] -= 1;
                a.seen[f] = true;
                if ud & PARKED != 0 {
                    a.parked[f] = false;
                }
                if res > 0 {
                    a.got[f] += 1;
                }
                Some(buf)
            }
            Reads::Multishot(r) => {
                if !cqueue::more(flags) {
                    self.inflight -= 1;
                    r.live[f] = false;
                }
                let taken = cqueue::buffer_select(flags);
                if taken.is_some() {
                    r.offered[f] -= 1;
                }
                if res == -libc::ENOBUFS {
                    self.counters.reads_no_buffer += 1;
                }
                taken
            }
        };
        if res > 0 {
            if let Some(b) = buf {
                self.counters.reads += 1;
                ready.push((file, b, res as u32));
                return;
            }
            // A frame read into no buffer the kernel named: nothing to hand out.
            self.counters.read_errors += 1;
            return;
        }
        if res == -libc::EAGAIN {
            self.counters.reads_empty += 1;
        } else if res != 0 && !matches!(-res, libc::EINTR | libc::ECANCELED | libc::ENOBUFS) {
            self.counters.read_errors += 1;
        }
        if let Some(b) = buf {
            self.release(b);
        }
    }

    /// Keeps the TAPs read: re-arms a multishot read that ended, if its TAP has a buffer on
    /// offer; or arms reads from the pool's free buffers until every file has the reads it
    /// wants or the pool is empty, one read per file in turn, starting one file further every
    /// call.
    fn top_up(&mut self) -> io::Result<()> {
        let TapTx {
            ring,
            inflight,
            reads,
            rx_areas,
            counters,
            ..
        } = self;
        match reads {
            Reads::Multishot(r) => {
                for f in 0..r.live.len() {
                    if r.live[f] || r.offered[f] == 0 {
                        continue;
                    }
                    // Length 0: each read takes the whole of the buffer its ring offers.
                    let e = opcode::ReadMulti::new(types::Fixed(f as u32), 0, f as u16)
                        .build()
                        .user_data((f as u64) << 16);
                    push(ring, inflight, &e)?;
                    r.live[f] = true;
                    counters.reads_armed += 1;
                }
                Ok(())
            }
            Reads::Armed(a) => a.top_up(ring, inflight, rx_areas, counters),
        }
    }

    /// Queues a write of the frame being handed out by [`TapUring::drain_frames`], `pkt`,
    /// with `prefix` (its virtio-net header) in front, to file `file`, from the buffer it is
    /// in: no copy. False (nothing queued, `pkt` untouched but for its headroom) if `pkt` is
    /// not that frame's buffer, was already sent, or has too little headroom left for
    /// `prefix`; the caller then copies it with [`TapTx::write`].
    pub fn send_in_place(&mut self, file: usize, prefix: &[u8], pkt: &mut PacketBuf) -> bool {
        let Some(buf) = self.lent else {
            return false;
        };
        // A different `PacketBuf` (the caller's own) has its storage elsewhere.
        if pkt.receive_area(self.prefix).as_mut_ptr() != self.rx_areas[usize::from(buf)].0 {
            return false;
        }
        let Ok(bytes) = pkt.framed(prefix) else {
            return false;
        };
        let e = opcode::WriteFixed::new(
            types::Fixed(file as u32),
            bytes.as_ptr(),
            bytes.len() as u32,
            buf,
        )
        .build()
        .user_data(WRITE | IN_PLACE | ((file as u64) << 16) | u64::from(buf));
        if push(&mut self.ring, &mut self.inflight, &e).is_err() {
            self.counters.write_errors += 1;
            return false;
        }
        self.lent = None;
        true
    }

    /// Queues a write of `parts`, one after the other, as one frame to file `file`, copied
    /// into a transmit buffer; false if no transmit buffer was free or the frame does not fit
    /// one (counted).
    pub fn write(&mut self, file: usize, parts: [&[u8]; 2]) -> bool {
        let len = parts[0].len() + parts[1].len();
        if len > self.tx_len {
            self.counters.write_errors += 1;
            return false;
        }
        let Some(buf) = self.tx_free.pop() else {
            self.counters.tx_full += 1;
            return false;
        };
        let at = (usize::from(buf) - self.rx_areas.len()) * self.tx_len;
        let dst = &mut self.tx[at..at + len];
        dst[..parts[0].len()].copy_from_slice(parts[0]);
        dst[parts[0].len()..].copy_from_slice(parts[1]);
        let e = opcode::WriteFixed::new(types::Fixed(file as u32), dst.as_ptr(), len as u32, buf)
            .build()
            .user_data(WRITE | ((file as u64) << 16) | u64::from(buf));
        if push(&mut self.ring, &mut self.inflight, &e).is_err() {
            self.tx_free.push(buf);
            self.counters.write_errors += 1;
            return false;
        }
        true
    }

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
            for cqe in self.ring.completion() {
                // A multishot read's last completion is the one without "more".
                if cqe.user_data() & WRITE != 0 || !cqueue::more(cqe.flags()) {
                    self.inflight = self.inflight.saturating_sub(1);
                }
            }
            if self.inflight == 0 {
                return true;
            }
            let _ = self.ring.submitter().submit_with_args(1, &args);
        }
        false
    }
}

/// Pushes `e` onto `ring`'s submission queue, submitting first if it is full, and counts it
/// in `inflight`.
fn push(ring: &mut IoUring, inflight: &mut usize, e: &squeue::Entry) -> io::Result<()> {
    // SAFETY: `e` refers only to registered files and to a registered buffer (or a buffer
    // group) that no other queued operation uses (the free lists, the rings' offered buffers,
    // the armed reads and the lent buffer are disjoint), and that buffer outlives the
    // operation (see `Drop for TapUring`).
    if unsafe { ring.submission().push(e) }.is_err() {
        ring.submit()?;
        // SAFETY: as above.
        unsafe { ring.submission().push(e) }
            .map_err(|_| io::Error::other("io_uring submission queue full after a submit"))?;
    }
    *inflight += 1;
    Ok(())
}

impl Armed {
    /// Arms reads from the free buffers until every file has the reads it wants or the pool
    /// is empty, one read per file in turn, starting one file further every call.
    fn top_up(
        &mut self,
        ring: &mut IoUring,
        inflight: &mut usize,
        rx_areas: &[(*mut u8, u32)],
        counters: &mut TapUringCounters,
    ) -> io::Result<()> {
        let files = self.armed.len();
        for f in 0..files {
            if std::mem::take(&mut self.seen[f]) {
                let got = std::mem::take(&mut self.got[f]);
                self.want[f] = got.saturating_mul(2).clamp(1, self.reads_per_tap);
            }
        }
        loop {
            let mut armed_any = false;
            for k in 0..files {
                let file = (self.next_file + k) % files;
                if self.armed[file] >= self.want[file] {
                    continue;
                }
                let Some(buf) = self.free.pop() else {
                    self.next_file = file;
                    return Ok(());
                };
                self.arm(ring, inflight, rx_areas, file as u16, buf)?;
                counters.reads_armed += 1;
                armed_any = true;
            }
            if !armed_any {
                self.next_file = (self.next_file + 1) % files;
                return Ok(());
            }
        }
    }

    /// Queues a read of file `file` into receive buffer `buf`.
    fn arm(
        &mut self,
        ring: &mut IoUring,
        inflight: &mut usize,
        rx_areas: &[(*mut u8, u32)],
        file: u16,
        buf: u16,
    ) -> io::Result<()> {
        let (ptr, len) = rx_areas[usize::from(buf)];
        // One read per TAP waits for a frame (io_uring parks it on the TAP's queue, and its
        // completion needs no system call to be noticed); the others are RWF_NOWAIT: one that
        // finds the TAP empty completes at once with EAGAIN instead of waiting beside it, where
        // a frame's arrival would wake every waiting read to find one frame (a herd that cost
        // about a tenth of the DPU process's CPU under TCP with 32 waiting reads per TAP).
        let f = usize::from(file);
        let park = !self.parked[f];
        let (flags, tag) = if park {
            (0, PARKED)
        } else {
            (libc::RWF_NOWAIT, 0)
        };
        let e = opcode::ReadFixed::new(types::Fixed(u32::from(file)), ptr, len, buf)
            .rw_flags(flags)
            .build()
            .user_data(tag | (u64::from(file) << 16) | u64::from(buf));
        if let Err(err) = push(ring, inflight, &e) {
            self.free.push(buf);
            return Err(err);
        }
        self.armed[f] += 1;
        self.parked[f] |= park;
        Ok(())
    }
}

impl BufRings {
    /// A provided-buffer ring of `per` buffers (rounded up to a power of two entries) for
    /// each of `files` TAPs, registered with `ring` as buffer groups `0..files`; `None` if
    /// the kernel has no multishot read or no buffer rings (then the caller arms reads).
    fn new(ring: &IoUring, files: usize, per: u16) -> io::Result<Option<BufRings>> {
        let mut probe = Probe::new();
        if ring.submitter().register_probe(&mut probe).is_err()
            || !probe.is_supported(opcode::ReadMulti::CODE)
        {
            return Ok(None);
        }
        let entries = per.checked_next_power_of_two().ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidInput, "too many buffers per TAP")
        })?;
        // SAFETY: sysconf has no memory-safety preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
        let bytes = usize::from(entries) * std::mem::size_of::<types::BufRingEntry>();
        let slot = bytes.div_ceil(page) * page;
        let map_len = slot * files;
        // SAFETY: an anonymous private mapping at an address of the kernel's choosing touches
        // no memory of ours; the result is checked before use.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        if map == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let r = BufRings {
            map: map.cast(),
            map_len,
            slot,
            entries,
            per,
            tails: vec![0; files],
            offered: vec![0; files],
            live: vec![false; files],
        };
        for f in 0..files {
            // SAFETY: the slot is page-aligned, zeroed (an anonymous mapping) and `entries`
            // entries long; it stays mapped until `Drop for BufRings` unregisters it first, and
            // after the ring is gone (the kernel drops its groups with the ring) or never.
            let reg = unsafe {
                ring.submitter().register_buf_ring_with_flags(
                    r.map.add(f * slot) as u64,
                    entries,
                    f as u16,
                    0,
                )
            };
            if let Err(e) = reg {
                if e.raw_os_error() == Some(libc::EINVAL) && f == 0 {
                    // A kernel without buffer rings: arm reads instead.
                    return Ok(None);
                }
                return Err(e);
            }
        }
        Ok(Some(r))
    }

    /// Puts buffer `buf` (its read area at `addr`, `len` bytes) back on its TAP's ring.
    fn offer(&mut self, buf: u16, addr: *mut u8, len: u32) {
        let f = usize::from(buf / self.per);
        let tail = self.tails[f];
        let base = self.ring_base(f);
        // SAFETY: `base` is the start of file `f`'s ring, `entries` entries long, and the index
        // is masked into it. The kernel reads entries only up to the tail published below, and
        // a ring holds at most `per <= entries` buffers, so this entry is not one it may still
        // read.
        unsafe {
            let e = &mut *base.add(usize::from(tail & (self.entries - 1)));
            e.set_addr(addr as u64);
            e.set_len(len);
            e.set_bid(buf);
        }
        self.tails[f] = tail.wrapping_add(1);
        self.offered[f] += 1;
        // SAFETY: the tail field of the ring's first entry, which the kernel reads and this
        // side alone writes; published with release so the entry above is visible before it.
        unsafe {
            AtomicU16::from_ptr(types::BufRingEntry::tail(base).cast_mut())
                .store(self.tails[f], Ordering::Release);
        }
    }

    fn ring_base(&self, f: usize) -> *mut types::BufRingEntry {
        // SAFETY: `f` is a file of the set, so its slot lies inside the mapping.
        unsafe { self.map.add(f * self.slot).cast() }
    }
}

impl Drop for BufRings {
    fn drop(&mut self) {
        // SAFETY: the mapping is ours; by the time `BufRings` drops the ring that read it has
        // been closed (see `Drop for TapUring`), or the mapping is leaked instead.
        unsafe { libc::munmap(self.map.cast(), self.map_len) };
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
            if let Reads::Multishot(r) = &mut self.tx.reads {
                // The kernel may still take buffers from the rings: keep them mapped.
                r.map_len = 0;
            }
        }
    }
}
