//! A cross-process single-producer single-consumer ring of variable-length byte records, kept in
//! a sealed memfd that two processes map: the emulated DPU on one side, the host spill plane on
//! the other. It carries the vNIC set's Ethernet frames (up to 64 KiB TSO/GSO super-frames) and
//! small message records. Ring crates that hold heap pointers cannot live in shared memory, so
//! this one is a `#[repr(C)]`-style layout of its own, addressed by offsets only.
//!
//! ## Main types
//!
//! - [`SharedRing`]: the memfd and its mapping. [`SharedRing::create`] makes one,
//!   [`SharedRing::from_fd`] maps one received from a peer (validating it), [`SharedRing::fd`]
//!   hands it over (see [`crate::shm::fdpass`]), [`SharedRing::split`] gives the two ends.
//! - [`Producer`] and [`Consumer`]: the two ends. They are generic over [`RingMemory`], the
//!   shared words and data area, so that the very same index protocol runs on the memfd mapping
//!   in production and on `loom` atomics over a heap buffer in `tests/loom_ring.rs`.
//! - [`Doorbell`]: an eventfd the producer writes to wake a consumer that announced it sleeps.
//! - Errors: [`RingError`] (setup and corruption) and [`PushError`] (full, too long, corrupt).
//!   Both are `Copy`.
//!
//! ## Layout (version 1)
//!
//! All integers are in the host's native byte order: both processes run on the same host.
//!
//! ```text
//! file offset
//!      0 +-----------------------------------------------------------------+
//!        | magic            u64  "SPLWRING" as little-endian bytes          |
//!      8 | version          u32  LAYOUT_VERSION = 1                         |
//!     12 | header_bytes     u32  HEADER_BYTES = 4096: where the data starts |
//!     16 | data_bytes       u64  power of two, 64 KiB ..= 1 GiB             |
//!     24 | record_max       u32  largest payload, <= data_bytes / 2 - 4     |
//!     28 | reserved, zero                                                  |
//!    128 | head             AtomicU64  producer's byte counter              |
//!        |                  (alone in its 128-byte block)                   |
//!    256 | tail             AtomicU64  consumer's byte counter              |
//!        |                  (alone in its 128-byte block)                   |
//!    384 | consumer_waiting AtomicU32  1 while the consumer may sleep       |
//!        |                  (alone in its 128-byte block)                   |
//!    512 | reserved, zero                                                  |
//!   4096 +-----------------------------------------------------------------+
//!        | data area, data_bytes bytes                                     |
//!        +-----------------------------------------------------------------+
//! ```
//!
//! The three shared words sit 128 bytes apart, not just 64, because x86 prefetches cache lines
//! in pairs (the spatial prefetcher): 64-byte spacing would still let the producer's stores to
//! `head` pull the consumer's `tail` line around.
//!
//! `head` and `tail` are monotonically increasing byte counters (they never wrap in practice: 2^64
//! bytes); a counter's index in the data area is `counter & (data_bytes - 1)`. The ring is empty
//! when `head == tail` and holds `head - tail <= data_bytes` bytes of records.
//!
//! Records are 8-byte aligned and laid back to back:
//!
//! ```text
//! data area
//! 0                                                                 data_bytes
//! +--------+-------------+-----+--------+---------+-----+--------+----------+
//! | len u32| payload     | pad | len u32| payload | pad | WRAP   | (unused) |
//! +--------+-------------+-----+--------+---------+-----+--------+----------+
//! ^ tail & mask                                         ^ head & mask before a push that
//!                                                         did not fit: its record went to 0
//! ```
//!
//! A record of an `n`-byte payload takes [`record_bytes`]`(n) = round_up(4 + n, 8)` bytes. If
//! that does not fit in the `c = data_bytes - (head & mask)` bytes before the end of the data
//! area, the producer writes the wrap marker [`WRAP_MARKER`] (`u32::MAX`, never a valid length)
//! at `head & mask` and puts the record at index 0; that push then consumes `c + record_bytes(n)`
//! bytes, and the consumer releases the skipped bytes together with the record after the marker.
//!
//! **Byte accounting rule.** A push of an `n`-byte payload needs `record_bytes(n)` bytes, plus `c`
//! when it has to wrap; it succeeds exactly when that is at most `data_bytes - (head - tail)`,
//! and is otherwise [`PushError::Full`]. Since `record_max <= data_bytes / 2 - 4`, a record
//! never takes more than half the data area, so an empty ring accepts any legal record wherever
//! `head` stands (if it does not fit before the end, the index is past the middle, so it fits
//! after the wrap).
//!
//! ## Memory ordering
//!
//! The producer writes a record's bytes with plain stores, then publishes it by a `Release` store
//! of `head`; the consumer `Acquire`-loads `head` before reading any byte below it. The consumer
//! releases space by a `Release` store of `tail` after its last read; the producer
//! `Acquire`-loads `tail` before writing into that space. Each side keeps its own counter in a
//! local variable (it never reads it back from shared memory) and caches the last value it read
//! of the other side's, reloading it only when the cache says "empty" or "full": a side pulls
//! the other's cache line over only when its cached view runs out, not once per record. Batches
//! publish once: [`Producer::batch`] stores `head` once for all the records it pushed, and
//! [`Consumer::pop_batch`] stores `tail` once for all the records it popped.
//!
//! ## Doorbell protocol (event suppression)
//!
//! A consumer that finds the ring empty may sleep, and a producer should write the eventfd
//! ([`Doorbell::kick`], a syscall) only when the consumer does. Like virtio's event suppression:
//!
//! ```text
//! consumer                                 producer
//! --------                                 --------
//! prepare_sleep():                         push / batch:
//!   waiting = 1            (C1)              head = h        (P1, Release)
//!   fence(SeqCst)          (C2)            needs_kick():
//!   empty = head == tail   (C3)              fence(SeqCst)   (P2)
//!   if !empty { waiting = 0; return false }  return waiting == 1   (P3)
//!   return true                            if needs_kick { doorbell.kick() }
//! poll(doorbell fd, ...); doorbell.drain(); woke(): waiting = 0; pop until empty
//! ```
//!
//! No wake-up is lost. This is Dekker's pattern: each side stores its own word, issues a `SeqCst`
//! fence, then loads the other's. The two fences are totally ordered. If the consumer's fence C2
//! comes first, the producer's load P3 (after its fence P2) must see the store C1 (or a later
//! value, which the consumer writes only once it is awake again or chose not to sleep), so it
//! kicks. If the producer's fence P2 comes first, the consumer's load C3 must see the store P1,
//! so it finds the record and does not sleep. Either the consumer sees the record or the
//! producer sees the flag; both may happen, which costs a spurious kick, never a lost one. A
//! kick made while the consumer is not yet inside `poll` is not lost either: the eventfd counter
//! stays readable. The `loom` model in `tests/loom_ring.rs` checks this, and fails when either
//! fence is removed.
//!
//! ## Trust
//!
//! The peer is another process, so the shared memory is untrusted input. The header's constant
//! fields are validated once in [`SharedRing::from_fd`] and copied into local variables; the
//! memfd must carry `F_SEAL_SHRINK`, so the peer cannot truncate it under our mapping (which
//! would raise `SIGBUS`). Every counter and length read from shared memory afterwards is read
//! exactly once (atomics, or volatile reads for length words) and bounds-checked against local
//! state before use; a bad one is [`RingError::Corrupt`] or [`PushError::Corrupt`], naming what
//! was read, never a panic or an out-of-bounds access. Indices come from local counters masked
//! to the data area, so a write never leaves it either.
//!
//! What the protocol cannot stop is a peer hurting its own side: losing or garbling its
//! records, or writing a record's payload while the consumer's callback holds it as `&[u8]`.
//! The slice stays in bounds whatever happens, but its bytes may then change under the callback
//! (strictly, under Rust's memory model that is a data race on memory lent out as immutable). A
//! consumer facing a peer it must not trust that far copies the record out inside the callback
//! (one `memcpy`, no allocation if the buffer is reused) and parses the copy. Likewise, within
//! one process take each end of a ring once: two producers (or two consumers) of one ring,
//! through two mappings of the same memfd, would race on the same bytes.
//!
//! ## Example
//!
//! ```
//! use spillway_rt::shm::ring::{Doorbell, SharedRing};
//!
//! let ring = SharedRing::create("vnic0-rx", 256 * 1024)?;
//! // ... hand `ring.fd()` and a doorbell's fd to the peer with `fdpass::send_with_fds` ...
//! let bell = Doorbell::new()?;
//! let (mut tx, mut rx) = ring.split()?;
//!
//! let frame = [0u8; 1500];
//! tx.try_push_parts(&[b"hdr:", &frame]).expect("an empty ring has room");
//! if tx.needs_kick() {
//!     bell.kick()?;
//! }
//! let len = rx.pop_with(|record| record.len())?;
//! assert_eq!(len, Some(4 + 1500));
//! // Empty now: announce the sleep, then poll `bell.as_fd()` with the other fds.
//! assert!(rx.prepare_sleep());
//! bell.drain()?;
//! rx.woke();
//! # Ok::<(), spillway_rt::shm::ring::RingError>(())
//! ```
//!
//! ## Why one file
//!
//! About 1,450 lines before its tests, on purpose: it is one lock-free protocol over shared
//! memory. The index rules, the layout the offsets point into and every `unsafe` block's
//! `SAFETY` argument refer to each other; kept together, one argument can be checked without
//! holding several files. The loom model (`tests/loom_ring.rs`) runs the same `Producer` and
//! `Consumer` code through [`RingMemory`].

use std::fmt;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use rustix::fs::{MemfdFlags, SealFlags};
use rustix::io::Errno;
use rustix::mm::{MapFlags, ProtFlags};

/// The value of the header's `magic` field: the bytes `"SPLWRING"` read as a little-endian u64.
pub const MAGIC: u64 = u64::from_le_bytes(*b"SPLWRING");
/// The layout version this module reads and writes.
pub const LAYOUT_VERSION: u32 = 1;
/// Size of the header page; the data area starts at this file offset.
pub const HEADER_BYTES: usize = 4096;
/// Smallest data area [`SharedRing`] accepts.
pub const DATA_BYTES_MIN: usize = 64 * 1024;
/// Largest data area any ring accepts (keeps `record_max` well inside a `u32`).
pub const DATA_BYTES_MAX: usize = 1 << 30;
/// Smallest data area [`Producer::new`] and [`Consumer::new`] accept on any [`RingMemory`]
/// (tiny rings are for models and tests; [`SharedRing`] requires [`DATA_BYTES_MIN`]).
pub const DATA_BYTES_MIN_ANY: usize = 16;
/// Alignment of every record in the data area, and of `head` and `tail`.
pub const RECORD_ALIGN: usize = 8;
/// Size of a record's length prefix.
pub const LEN_PREFIX_BYTES: usize = 4;
/// A length prefix with this value is a wrap marker: the next record starts at index 0.
pub const WRAP_MARKER: u32 = u32::MAX;

/// Byte offsets of the header fields in the memfd (see the module doc for the picture).
pub mod layout {
    /// `magic: u64`.
    pub const MAGIC_OFFSET: usize = 0;
    /// `version: u32`.
    pub const VERSION_OFFSET: usize = 8;
    /// `header_bytes: u32`, the offset of the data area.
    pub const HEADER_BYTES_OFFSET: usize = 12;
    /// `data_bytes: u64`.
    pub const DATA_BYTES_OFFSET: usize = 16;
    /// `record_max: u32`.
    pub const RECORD_MAX_OFFSET: usize = 24;
    /// `head: AtomicU64`, the producer's byte counter.
    pub const HEAD_OFFSET: usize = 128;
    /// `tail: AtomicU64`, the consumer's byte counter.
    pub const TAIL_OFFSET: usize = 256;
    /// `consumer_waiting: AtomicU32`.
    pub const WAITING_OFFSET: usize = 384;

    // The constant fields end before the shared words, and each shared word has its own
    // 128-byte block inside the header page.
    const _: () = {
        assert!(RECORD_MAX_OFFSET + 4 <= HEAD_OFFSET);
        assert!(TAIL_OFFSET - HEAD_OFFSET == 128);
        assert!(WAITING_OFFSET - TAIL_OFFSET == 128);
        assert!(WAITING_OFFSET + 128 <= super::HEADER_BYTES);
    };
}

/// Bytes a record of a `payload_len`-byte payload occupies in the data area: the length prefix
/// plus the payload, rounded up to [`RECORD_ALIGN`]. (A push that wraps also consumes the bytes
/// it skips; see the byte accounting rule in the module doc.) Saturates instead of overflowing.
pub const fn record_bytes(payload_len: usize) -> usize {
    payload_len.saturating_add(LEN_PREFIX_BYTES + RECORD_ALIGN - 1) & !(RECORD_ALIGN - 1)
}

/// The largest `record_max` a data area of `data_bytes` bytes allows: `data_bytes / 2 - 4`, so
/// that a record never needs more than half the ring (which keeps an empty ring able to take any
/// legal record).
pub const fn record_max_limit(data_bytes: usize) -> usize {
    (data_bytes / 2).saturating_sub(LEN_PREFIX_BYTES)
}

/// A field of the shared ring that held a value it must not hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RingField {
    /// The memfd's size; `expected` is the size the header implies (or the nearest bound).
    FileSize,
    /// The header's magic; `expected` is [`MAGIC`].
    Magic,
    /// The header's layout version; `expected` is [`LAYOUT_VERSION`].
    Version,
    /// The header's `header_bytes`; `expected` is [`HEADER_BYTES`].
    HeaderBytes,
    /// The header's `data_bytes`, not a power of two within bounds; `expected` is the data size
    /// the file has room for.
    DataBytes,
    /// The header's `record_max`; `expected` is [`record_max_limit`] of the data size.
    RecordMax,
    /// The producer's `head`: it must be 8-aligned, never move back, and stay within
    /// `tail ..= tail + data_bytes`; `expected` is that upper bound.
    Head,
    /// The consumer's `tail`: it must be 8-aligned, never move back, and not pass the published
    /// `head`; `expected` is the published `head`.
    Tail,
    /// A record's length prefix: at most `record_max`, and the record must lie within the
    /// published bytes and before the end of the data area; `expected` is the largest length
    /// that would have been valid there.
    RecordLen,
    /// A wrap marker with too few published bytes after it for a record; `read` is the number
    /// of published bytes, `expected` the number the skip plus the smallest record need.
    WrapMarker,
}

impl fmt::Display for RingField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RingField::FileSize => "file size",
            RingField::Magic => "magic",
            RingField::Version => "layout version",
            RingField::HeaderBytes => "header size",
            RingField::DataBytes => "data size",
            RingField::RecordMax => "record_max",
            RingField::Head => "head",
            RingField::Tail => "tail",
            RingField::RecordLen => "record length",
            RingField::WrapMarker => "wrap marker",
        })
    }
}

/// Errors of setting up a ring and of reading one the peer wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RingError {
    /// A system call failed.
    #[error("{op} failed: {errno}")]
    Os {
        /// The call, e.g. `"memfd_create"`.
        op: &'static str,
        /// What the kernel said.
        errno: Errno,
    },
    /// The requested data area is not a power of two within `min..=max`.
    #[error("data area of {data_bytes} bytes: need a power of two in {min}..={max}")]
    BadCapacity {
        /// What was asked for.
        data_bytes: usize,
        /// Smallest accepted.
        min: usize,
        /// Largest accepted.
        max: usize,
    },
    /// The requested record_max is larger than the data area allows.
    #[error("record_max {record_max} exceeds {max}, the limit for this data area")]
    BadRecordMax {
        /// What was asked for.
        record_max: usize,
        /// [`record_max_limit`] of the data area.
        max: usize,
    },
    /// The memfd lacks `F_SEAL_SHRINK`: the peer could truncate it under our mapping.
    #[error("ring memfd is not sealed against shrinking (seals {seals:#x})")]
    Unsealed {
        /// The seals it has.
        seals: u32,
    },
    /// Shared memory held a value the protocol forbids (see [`RingField`] for each rule).
    #[error("shared ring corrupt: {field} read {read:#x}, expected {expected:#x}")]
    Corrupt {
        /// Which field.
        field: RingField,
        /// What was read.
        read: u64,
        /// The value, or the bound, it had to respect.
        expected: u64,
    },
}

/// Why a push did not happen. Nothing was written in any case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PushError {
    /// Not enough free space now; retry after the consumer catches up.
    #[error("ring full: the record needs {needed} bytes, {free} are free")]
    Full {
        /// Bytes this push needs, by the byte accounting rule (including a wrap's skip).
        needed: usize,
        /// Bytes free (`data_bytes - (head - tail)`).
        free: usize,
    },
    /// The payload is longer than the ring's `record_max`; it will never fit.
    #[error("record of {len} bytes exceeds record_max {max}")]
    TooLong {
        /// Payload length (saturated at `usize::MAX` if the parts' sum overflowed).
        len: usize,
        /// The ring's `record_max`.
        max: usize,
    },
    /// The consumer's `tail` holds a value the protocol forbids.
    #[error("shared ring corrupt: {field} read {read:#x}, expected {expected:#x}")]
    Corrupt {
        /// Which field ([`RingField::Tail`]).
        field: RingField,
        /// What was read.
        read: u64,
        /// The bound it had to respect.
        expected: u64,
    },
}

pub(crate) fn os(op: &'static str) -> impl FnOnce(Errno) -> RingError {
    move |errno| RingError::Os { op, errno }
}

fn check_data_bytes(data_bytes: usize, min: usize) -> Result<(), RingError> {
    if data_bytes.is_power_of_two() && (min..=DATA_BYTES_MAX).contains(&data_bytes) {
        Ok(())
    } else {
        Err(RingError::BadCapacity {
            data_bytes,
            min,
            max: DATA_BYTES_MAX,
        })
    }
}

fn check_record_max(record_max: usize, data_bytes: usize) -> Result<(), RingError> {
    let max = record_max_limit(data_bytes);
    if record_max <= max {
        Ok(())
    } else {
        Err(RingError::BadRecordMax { record_max, max })
    }
}

// ---------------------------------------------------------------------------------------------
// The memory a ring lives in
// ---------------------------------------------------------------------------------------------

/// The shared words and the data area of one ring: what [`Producer`] and [`Consumer`] run on.
///
/// [`SharedRing`] implements it over a memfd mapping; `tests/loom_ring.rs` implements it over
/// `loom` atomics and a heap buffer, so `loom` checks the same protocol code that runs in
/// production. The `will_read`/`will_write` hooks let such a model also check that no byte of
/// the data area is read and written concurrently.
///
/// # Safety
///
/// An implementation promises that:
/// - `data()` points to `data_bytes()` bytes, 8-byte aligned, valid for reads and writes through
///   that pointer for as long as the value lives (moving the value does not move them), and no
///   Rust reference to those bytes exists outside what [`Producer`] and [`Consumer`] create;
/// - `data()`, `data_bytes()` and `record_max()` return the same values on every call;
/// - the `head`, `tail` and `waiting` methods are atomic loads and stores of three distinct
///   locations, and `fence_seq_cst` is a sequentially consistent fence of the same memory model.
pub unsafe trait RingMemory {
    /// Loads the producer's byte counter.
    fn load_head(&self, order: Ordering) -> u64;
    /// Stores the producer's byte counter.
    fn store_head(&self, value: u64, order: Ordering);
    /// Loads the consumer's byte counter.
    fn load_tail(&self, order: Ordering) -> u64;
    /// Stores the consumer's byte counter.
    fn store_tail(&self, value: u64, order: Ordering);
    /// Loads the `consumer_waiting` flag.
    fn load_waiting(&self, order: Ordering) -> u32;
    /// Stores the `consumer_waiting` flag.
    fn store_waiting(&self, value: u32, order: Ordering);
    /// A `SeqCst` fence.
    fn fence_seq_cst(&self);
    /// Start of the data area.
    fn data(&self) -> NonNull<u8>;
    /// Size of the data area: a power of two.
    fn data_bytes(&self) -> usize;
    /// The largest payload both ends agree on.
    fn record_max(&self) -> usize;
    /// Called before the ring reads `len` bytes of the data area at `offset` (a model's hook;
    /// does nothing by default).
    #[inline]
    fn will_read(&self, offset: usize, len: usize) {
        let _ = (offset, len);
    }
    /// Called before the ring writes `len` bytes of the data area at `offset` (a model's hook;
    /// does nothing by default).
    #[inline]
    fn will_write(&self, offset: usize, len: usize) {
        let _ = (offset, len);
    }
}

// SAFETY: every method forwards to `T`, which upholds the contract; an `Arc` never moves its
// pointee, so `data()` stays valid while any clone lives.
unsafe impl<T: RingMemory + ?Sized> RingMemory for Arc<T> {
    #[inline]
    fn load_head(&self, order: Ordering) -> u64 {
        (**self).load_head(order)
    }
    #[inline]
    fn store_head(&self, value: u64, order: Ordering) {
        (**self).store_head(value, order)
    }
    #[inline]
    fn load_tail(&self, order: Ordering) -> u64 {
        (**self).load_tail(order)
    }
    #[inline]
    fn store_tail(&self, value: u64, order: Ordering) {
        (**self).store_tail(value, order)
    }
    #[inline]
    fn load_waiting(&self, order: Ordering) -> u32 {
        (**self).load_waiting(order)
    }
    #[inline]
    fn store_waiting(&self, value: u32, order: Ordering) {
        (**self).store_waiting(value, order)
    }
    #[inline]
    fn fence_seq_cst(&self) {
        (**self).fence_seq_cst()
    }
    #[inline]
    fn data(&self) -> NonNull<u8> {
        (**self).data()
    }
    #[inline]
    fn data_bytes(&self) -> usize {
        (**self).data_bytes()
    }
    #[inline]
    fn record_max(&self) -> usize {
        (**self).record_max()
    }
    #[inline]
    fn will_read(&self, offset: usize, len: usize) {
        (**self).will_read(offset, len)
    }
    #[inline]
    fn will_write(&self, offset: usize, len: usize) {
        (**self).will_write(offset, len)
    }
}

/// Geometry both ends read once from the memory and then trust.
#[derive(Debug, Clone, Copy)]
struct Geometry {
    data_bytes: u64,
    mask: u64,
    record_max: usize,
}

impl Geometry {
    fn of<M: RingMemory>(mem: &M) -> Result<Self, RingError> {
        let data_bytes = mem.data_bytes();
        check_data_bytes(data_bytes, DATA_BYTES_MIN_ANY)?;
        check_record_max(mem.record_max(), data_bytes)?;
        Ok(Geometry {
            data_bytes: data_bytes as u64,
            mask: data_bytes as u64 - 1,
            record_max: mem.record_max(),
        })
    }

    /// Validates `head` and `tail` as read when an end attaches to a ring that may be in use.
    fn check_counters(&self, head: u64, tail: u64) -> Result<(), RingError> {
        if !tail.is_multiple_of(RECORD_ALIGN as u64) {
            return Err(RingError::Corrupt {
                field: RingField::Tail,
                read: tail,
                expected: head,
            });
        }
        let used = head.wrapping_sub(tail);
        if !head.is_multiple_of(RECORD_ALIGN as u64) || used > self.data_bytes {
            return Err(RingError::Corrupt {
                field: RingField::Head,
                read: head,
                expected: tail.wrapping_add(self.data_bytes),
            });
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Producer
// ---------------------------------------------------------------------------------------------

/// The writing end of a ring: one per ring (see "Trust" in the module doc). It can move to
/// another thread; its methods take `&mut self`.
pub struct Producer<M: RingMemory = SharedRing> {
    mem: M,
    geo: Geometry,
    /// Where the next record goes; ahead of `published` while a batch is open.
    head: u64,
    /// The last value stored to the shared `head`.
    published: u64,
    /// The last valid value loaded from the shared `tail`.
    tail_cache: u64,
}

impl<M: RingMemory> fmt::Debug for Producer<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Producer")
            .field("data_bytes", &self.geo.data_bytes)
            .field("record_max", &self.geo.record_max)
            .field("head", &self.head)
            .field("published", &self.published)
            .field("tail_cache", &self.tail_cache)
            .finish_non_exhaustive()
    }
}

impl<M: RingMemory> Producer<M> {
    /// Takes the producer end of the ring in `mem`, resuming from its current `head` and `tail`
    /// (zero for a new ring). Fails if the geometry or the counters are invalid.
    pub fn new(mem: M) -> Result<Self, RingError> {
        let geo = Geometry::of(&mem)?;
        let tail = mem.load_tail(Ordering::Acquire);
        let head = mem.load_head(Ordering::Acquire);
        geo.check_counters(head, tail)?;
        Ok(Producer {
            mem,
            geo,
            head,
            published: head,
            tail_cache: tail,
        })
    }

    /// Pushes one record and publishes it. `Err` means nothing was written.
    #[inline]
    pub fn try_push(&mut self, record: &[u8]) -> Result<(), PushError> {
        self.try_push_parts(&[record])
    }

    /// Pushes one record made of `parts` back to back (say, a small header and a frame) without
    /// an intermediate copy, and publishes it. `Err` means nothing was written.
    #[inline]
    pub fn try_push_parts(&mut self, parts: &[&[u8]]) -> Result<(), PushError> {
        self.write(parts)?;
        self.publish();
        Ok(())
    }

    /// Opens a batch: records pushed through it become visible to the consumer together, with
    /// one store of `head`, when the batch is dropped.
    #[inline]
    pub fn batch(&mut self) -> PushBatch<'_, M> {
        PushBatch {
            producer: self,
            pushed: 0,
        }
    }

    /// Free bytes, `data_bytes - (head - tail)`, after a fresh load of the consumer's `tail`. A
    /// record of `n` bytes fits if `record_bytes(n)` (plus the skip, if it has to wrap) is at
    /// most this. If the shared `tail` is corrupt, reports the space as of the last valid one;
    /// the next push reports the corruption.
    pub fn free_bytes(&mut self) -> usize {
        let _ = self.refresh_tail();
        self.free_cached() as usize
    }

    /// Whether the consumer announced it may sleep, so the caller should [`Doorbell::kick`].
    /// Call after a push or a batch. Publishes anything pending, then issues the `SeqCst` fence
    /// that pairs with the one in [`Consumer::prepare_sleep`] (see the module doc).
    #[inline]
    pub fn needs_kick(&mut self) -> bool {
        self.publish();
        self.mem.fence_seq_cst();
        self.mem.load_waiting(Ordering::Relaxed) != 0
    }

    /// Size of the data area.
    pub fn data_bytes(&self) -> usize {
        self.geo.data_bytes as usize
    }

    /// The largest payload this ring takes.
    pub fn record_max(&self) -> usize {
        self.geo.record_max
    }

    /// The memory this end works on.
    pub fn memory(&self) -> &M {
        &self.mem
    }

    #[inline]
    fn free_cached(&self) -> u64 {
        // `tail_cache <= published <= head <= tail_cache + data_bytes` holds by construction.
        self.geo.data_bytes - (self.head - self.tail_cache)
    }

    /// Loads the consumer's `tail` and accepts it if it moved forward, is 8-aligned, and does not
    /// pass what was published.
    fn refresh_tail(&mut self) -> Result<(), PushError> {
        let tail = self.mem.load_tail(Ordering::Acquire);
        let advanced = tail.wrapping_sub(self.tail_cache);
        if !tail.is_multiple_of(RECORD_ALIGN as u64)
            || advanced > self.published.wrapping_sub(self.tail_cache)
        {
            return Err(PushError::Corrupt {
                field: RingField::Tail,
                read: tail,
                expected: self.published,
            });
        }
        self.tail_cache = tail;
        Ok(())
    }

    /// Writes one record at `head` without publishing it.
    #[inline]
    fn write(&mut self, parts: &[&[u8]]) -> Result<(), PushError> {
        let Some(len) = parts
            .iter()
            .try_fold(0usize, |sum, part| sum.checked_add(part.len()))
            .filter(|&len| len <= self.geo.record_max)
        else {
            let len = parts
                .iter()
                .fold(0usize, |sum, part| sum.saturating_add(part.len()));
            return Err(PushError::TooLong {
                len,
                max: self.geo.record_max,
            });
        };
        let rec = record_bytes(len) as u64;
        let index = self.head & self.geo.mask;
        let before_end = self.geo.data_bytes - index;
        let skip = if rec > before_end { before_end } else { 0 };
        let needed = skip + rec;
        if needed > self.free_cached() {
            self.refresh_tail()?;
            if needed > self.free_cached() {
                return Err(PushError::Full {
                    needed: needed as usize,
                    free: self.free_cached() as usize,
                });
            }
        }
        // From here on the bytes `index .. index + needed` (mod data_bytes) are free: the
        // consumer released them (Acquire on `tail` above, or earlier) and will not read them
        // before we publish a `head` beyond them.
        let mut at = index as usize;
        if skip != 0 {
            self.write_u32(at, WRAP_MARKER);
            at = 0;
        }
        // `len <= record_max <= u32::MAX / 4`, see `DATA_BYTES_MAX`.
        self.write_u32(at, len as u32);
        let mut off = at + LEN_PREFIX_BYTES;
        for part in parts {
            self.write_bytes(off, part);
            off += part.len();
        }
        self.head += needed;
        Ok(())
    }

    /// Makes everything written so far visible to the consumer: one `Release` store.
    #[inline]
    fn publish(&mut self) {
        if self.head != self.published {
            self.mem.store_head(self.head, Ordering::Release);
            self.published = self.head;
        }
    }

    #[inline]
    fn write_u32(&self, offset: usize, value: u32) {
        debug_assert!(
            offset.is_multiple_of(RECORD_ALIGN) && offset + 4 <= self.geo.data_bytes as usize
        );
        self.mem.will_write(offset, LEN_PREFIX_BYTES);
        // SAFETY: `offset` is a record boundary (8-aligned, from the local `head`) strictly
        // inside the data area, so the 4 bytes are in bounds and aligned (the area is 8-aligned
        // per `RingMemory`). They are free space the consumer does not read (see `write`).
        unsafe {
            self.mem
                .data()
                .as_ptr()
                .add(offset)
                .cast::<u32>()
                .write(value)
        }
    }

    #[inline]
    fn write_bytes(&self, offset: usize, bytes: &[u8]) {
        debug_assert!(offset + bytes.len() <= self.geo.data_bytes as usize);
        if bytes.is_empty() {
            return;
        }
        self.mem.will_write(offset, bytes.len());
        // SAFETY: the record lies within the data area (`index + rec <= data_bytes`, or it
        // starts at 0 after a wrap and `rec <= data_bytes / 2`), and these bytes are free space
        // (see `write`). `ptr::copy` tolerates a source that overlaps the ring, such as a record
        // the caller is forwarding from this ring's own consumer.
        unsafe {
            std::ptr::copy(
                bytes.as_ptr(),
                self.mem.data().as_ptr().add(offset),
                bytes.len(),
            )
        }
    }
}

/// A batch of pushes published together; see [`Producer::batch`]. Dropping it publishes.
pub struct PushBatch<'a, M: RingMemory = SharedRing> {
    producer: &'a mut Producer<M>,
    pushed: usize,
}

impl<M: RingMemory> fmt::Debug for PushBatch<'_, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PushBatch")
            .field("pushed", &self.pushed)
            .field("producer", &self.producer)
            .finish()
    }
}

impl<M: RingMemory> PushBatch<'_, M> {
    /// Writes one record into the batch. `Err` means nothing was written for this record.
    #[inline]
    pub fn try_push(&mut self, record: &[u8]) -> Result<(), PushError> {
        self.try_push_parts(&[record])
    }

    /// Writes one record assembled from `parts` into the batch.
    #[inline]
    pub fn try_push_parts(&mut self, parts: &[&[u8]]) -> Result<(), PushError> {
        self.producer.write(parts)?;
        self.pushed += 1;
        Ok(())
    }

    /// Records written into this batch so far.
    pub fn pushed(&self) -> usize {
        self.pushed
    }

    /// Publishes the batch (as dropping it does) and returns how many records it held.
    pub fn publish(self) -> usize {
        self.pushed
    }
}

impl<M: RingMemory> Drop for PushBatch<'_, M> {
    fn drop(&mut self) {
        self.producer.publish();
    }
}

// ---------------------------------------------------------------------------------------------
// Consumer
// ---------------------------------------------------------------------------------------------

/// The reading end of a ring: one per ring (see "Trust" in the module doc). It can move to
/// another thread; its methods take `&mut self`.
pub struct Consumer<M: RingMemory = SharedRing> {
    mem: M,
    geo: Geometry,
    /// Where the next record starts; ahead of `released` inside a batch.
    tail: u64,
    /// The last value stored to the shared `tail`.
    released: u64,
    /// The last valid value loaded from the shared `head`.
    head_cache: u64,
}

impl<M: RingMemory> fmt::Debug for Consumer<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Consumer")
            .field("data_bytes", &self.geo.data_bytes)
            .field("record_max", &self.geo.record_max)
            .field("tail", &self.tail)
            .field("released", &self.released)
            .field("head_cache", &self.head_cache)
            .finish_non_exhaustive()
    }
}

/// Where a record lies: payload offset and length, and how far `tail` moves past it.
#[derive(Debug, Clone, Copy)]
struct Slot {
    offset: usize,
    len: usize,
    advance: u64,
}

impl<M: RingMemory> Consumer<M> {
    /// Takes the consumer end of the ring in `mem`, resuming from its current `tail` (zero for
    /// a new ring). Fails if the geometry or the counters are invalid.
    pub fn new(mem: M) -> Result<Self, RingError> {
        let geo = Geometry::of(&mem)?;
        let tail = mem.load_tail(Ordering::Relaxed);
        let head = mem.load_head(Ordering::Acquire);
        geo.check_counters(head, tail)?;
        Ok(Consumer {
            mem,
            geo,
            tail,
            released: tail,
            head_cache: head,
        })
    }

    /// Pops one record: calls `f` with its payload, then releases its space. The slice is valid
    /// only during `f`. `Ok(None)` if the ring is empty; `Err` if the producer's side of the
    /// shared memory is corrupt (nothing is consumed then).
    #[inline]
    pub fn pop_with<R>(&mut self, f: impl FnOnce(&[u8]) -> R) -> Result<Option<R>, RingError> {
        let Some(slot) = self.next_slot()? else {
            return Ok(None);
        };
        let out = f(self.payload(slot));
        self.tail += slot.advance;
        self.release();
        Ok(Some(out))
    }

    /// Pops up to `max` records, calling `f` with each payload in order, and releases their
    /// space with one store of `tail` at the end. Returns how many were popped. On corruption,
    /// the records before the bad one are popped and released, and the error is returned.
    pub fn pop_batch(&mut self, max: usize, mut f: impl FnMut(&[u8])) -> Result<usize, RingError> {
        let mut popped = 0;
        let result = loop {
            if popped == max {
                break Ok(());
            }
            match self.next_slot() {
                Ok(Some(slot)) => {
                    f(self.payload(slot));
                    self.tail += slot.advance;
                    popped += 1;
                }
                Ok(None) => break Ok(()),
                Err(e) => break Err(e),
            }
        };
        self.release();
        result.map(|()| popped)
    }

    /// Announces that the consumer is about to sleep on the doorbell. Returns `true` if it may:
    /// the ring was still empty after the flag was set and the `SeqCst` fence issued, so any
    /// later push will see the flag and kick. Returns `false` (with the flag cleared) if records
    /// are there to pop. After the sleep, call [`Consumer::woke`].
    pub fn prepare_sleep(&mut self) -> bool {
        if self.head_cache != self.tail {
            return false;
        }
        self.mem.store_waiting(1, Ordering::Relaxed);
        self.mem.fence_seq_cst();
        // Relaxed suffices: this load only decides whether to sleep; `pop_*` reloads `head` with
        // Acquire before reading records. A corrupt `head` also means "do not sleep": the next
        // pop reports it.
        if self.mem.load_head(Ordering::Relaxed) != self.tail {
            self.mem.store_waiting(0, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// Clears the flag [`Consumer::prepare_sleep`] set: the producer stops kicking.
    pub fn woke(&mut self) {
        self.mem.store_waiting(0, Ordering::Relaxed);
    }

    /// Size of the data area.
    pub fn data_bytes(&self) -> usize {
        self.geo.data_bytes as usize
    }

    /// The largest payload this ring carries.
    pub fn record_max(&self) -> usize {
        self.geo.record_max
    }

    /// The memory this end works on.
    pub fn memory(&self) -> &M {
        &self.mem
    }

    /// Publishes the consumed position: one `Release` store, after the last read of the space.
    #[inline]
    fn release(&mut self) {
        if self.tail != self.released {
            self.mem.store_tail(self.tail, Ordering::Release);
            self.released = self.tail;
        }
    }

    /// Loads the producer's `head` and accepts it if it is 8-aligned, did not move back, and
    /// claims at most `data_bytes` unread bytes.
    fn refresh_head(&mut self) -> Result<(), RingError> {
        let head = self.mem.load_head(Ordering::Acquire);
        let unread = head.wrapping_sub(self.tail);
        if !head.is_multiple_of(RECORD_ALIGN as u64)
            || unread > self.geo.data_bytes
            || unread < self.head_cache - self.tail
        {
            return Err(RingError::Corrupt {
                field: RingField::Head,
                read: head,
                expected: self.tail + self.geo.data_bytes,
            });
        }
        self.head_cache = head;
        Ok(())
    }

    /// Finds and checks the record at `tail`, without consuming it.
    #[inline]
    fn next_slot(&mut self) -> Result<Option<Slot>, RingError> {
        if self.head_cache == self.tail {
            self.refresh_head()?;
            if self.head_cache == self.tail {
                return Ok(None);
            }
        }
        // Published, unread bytes: a positive multiple of 8, at most `data_bytes`.
        let avail = self.head_cache - self.tail;
        let mut index = (self.tail & self.geo.mask) as usize;
        let mut skip = 0u64;
        let mut len = self.read_u32(index);
        if len == WRAP_MARKER {
            skip = self.geo.data_bytes - index as u64;
            if skip + RECORD_ALIGN as u64 > avail {
                return Err(RingError::Corrupt {
                    field: RingField::WrapMarker,
                    read: avail,
                    expected: skip + RECORD_ALIGN as u64,
                });
            }
            index = 0;
            len = self.read_u32(0);
        }
        let len = len as usize;
        // The largest payload that fits both the published bytes and the space before the end.
        let room = (avail - skip).min(self.geo.data_bytes - index as u64) as usize;
        let valid_max = self
            .geo
            .record_max
            .min(room.saturating_sub(LEN_PREFIX_BYTES));
        if len > valid_max {
            return Err(RingError::Corrupt {
                field: RingField::RecordLen,
                read: len as u64,
                expected: valid_max as u64,
            });
        }
        Ok(Some(Slot {
            offset: index + LEN_PREFIX_BYTES,
            len,
            advance: skip + record_bytes(len) as u64,
        }))
    }

    /// Reads a length word exactly once.
    #[inline]
    fn read_u32(&self, offset: usize) -> u32 {
        debug_assert!(
            offset.is_multiple_of(RECORD_ALIGN) && offset + 4 <= self.geo.data_bytes as usize
        );
        self.mem.will_read(offset, LEN_PREFIX_BYTES);
        // SAFETY: `offset` is `tail & mask` (8-aligned because `tail` is: it starts aligned
        // and only moves by aligned amounts) or 0, so the word is in bounds and aligned. The
        // producer published it (Acquire on `head`, and `avail > 0`). The read is volatile so
        // that the value is read exactly once even if a misbehaving peer changes it.
        unsafe {
            self.mem
                .data()
                .as_ptr()
                .add(offset)
                .cast::<u32>()
                .read_volatile()
        }
    }

    #[inline]
    fn payload(&self, slot: Slot) -> &[u8] {
        self.mem.will_read(slot.offset, slot.len);
        // SAFETY: `next_slot` checked `offset + len` against the end of the data area and the
        // published bytes, so the slice is in bounds and the producer finished writing it before
        // its Release store of `head` that we Acquire-loaded. The producer does not write these
        // bytes until we release them, which happens after the borrow of `self` ends.
        unsafe { std::slice::from_raw_parts(self.mem.data().as_ptr().add(slot.offset), slot.len) }
    }
}

// ---------------------------------------------------------------------------------------------
// The memfd mapping
// ---------------------------------------------------------------------------------------------

/// A `MAP_SHARED` mapping of a whole memfd; unmapped on drop. Rings use it, and so does the
/// VM memory of shared-memory ports ([`crate::shm::virtq`]).
pub(crate) struct Mapping {
    pub(crate) base: NonNull<u8>,
    pub(crate) len: usize,
    pub(crate) fd: OwnedFd,
}

// SAFETY: the mapping is plain shared memory with no thread affinity; all concurrent access
// goes through atomics or through the ring protocol, which gives each byte one writer at a time.
unsafe impl Send for Mapping {}
// SAFETY: as above; `&Mapping` only hands out atomics and raw pointers.
unsafe impl Sync for Mapping {}

impl Mapping {
    pub(crate) fn map(fd: OwnedFd, len: usize) -> Result<Self, RingError> {
        // SAFETY: a fresh mapping at an address the kernel chooses touches no existing memory.
        // The memfd is sealed against shrinking (checked by both constructors before calling
        // this), so the pages stay backed for the mapping's life.
        let ptr = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                &fd,
                0,
            )
        }
        .map_err(os("mmap"))?;
        let base = NonNull::new(ptr.cast::<u8>()).ok_or(RingError::Os {
            op: "mmap",
            errno: Errno::NOMEM,
        })?;
        Ok(Mapping { base, len, fd })
    }

    fn atomic_u64(&self, offset: usize) -> &AtomicU64 {
        debug_assert!(offset.is_multiple_of(8) && offset + 8 <= HEADER_BYTES);
        // SAFETY: `offset` is one of the 8-aligned header offsets inside the page-aligned
        // mapping, which lives as long as `&self`. In this process these words are accessed
        // only through atomics.
        unsafe { AtomicU64::from_ptr(self.base.as_ptr().add(offset).cast()) }
    }

    fn atomic_u32(&self, offset: usize) -> &AtomicU32 {
        debug_assert!(offset.is_multiple_of(4) && offset + 4 <= HEADER_BYTES);
        // SAFETY: as in `atomic_u64`, for a 4-aligned header word.
        unsafe { AtomicU32::from_ptr(self.base.as_ptr().add(offset).cast()) }
    }

    /// Reads a constant header field once (volatile: the peer could be writing it).
    fn read_header<T: Copy>(&self, offset: usize) -> T {
        assert!(offset.is_multiple_of(align_of::<T>()) && offset + size_of::<T>() <= HEADER_BYTES);
        // SAFETY: in bounds (asserted; the mapping is at least HEADER_BYTES long) and aligned
        // (the base is page-aligned). Only used for integer types, valid for any bits.
        unsafe { self.base.as_ptr().add(offset).cast::<T>().read_volatile() }
    }

    fn write_header<T: Copy>(&self, offset: usize, value: T) {
        assert!(offset.is_multiple_of(align_of::<T>()) && offset + size_of::<T>() <= HEADER_BYTES);
        // SAFETY: as in `read_header`; only called before the fd is shared.
        unsafe {
            self.base
                .as_ptr()
                .add(offset)
                .cast::<T>()
                .write_volatile(value)
        }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `base`/`len` are exactly what mmap returned; every reference into the mapping
        // borrows an `Arc<Mapping>`, so none outlives this.
        if let Err(errno) = unsafe { rustix::mm::munmap(self.base.as_ptr().cast(), self.len) } {
            tracing::warn!(%errno, "munmap of a ring failed");
        }
    }
}

/// A ring in a sealed memfd, mapped into this process. Split it into a [`Producer`] and a
/// [`Consumer`] (or take one end; a process normally takes one end of a ring, the peer the
/// other). It implements [`RingMemory`].
pub struct SharedRing {
    map: Arc<Mapping>,
    data_bytes: usize,
    record_max: usize,
}

impl fmt::Debug for SharedRing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedRing")
            .field("fd", &self.map.fd)
            .field("data_bytes", &self.data_bytes)
            .field("record_max", &self.record_max)
            .finish()
    }
}

impl SharedRing {
    /// Creates a ring with a data area of `data_bytes` (a power of two in
    /// [`DATA_BYTES_MIN`]`..=`[`DATA_BYTES_MAX`]) and the largest `record_max` it allows,
    /// [`record_max_limit`]`(data_bytes)`. `name` labels the memfd (`/proc/PID/fd`).
    ///
    /// For 64 KiB frames plus a message header, use at least 256 KiB.
    pub fn create(name: &str, data_bytes: usize) -> Result<SharedRing, RingError> {
        Self::create_with_record_max(name, data_bytes, record_max_limit(data_bytes))
    }

    /// Like [`SharedRing::create`], with a smaller `record_max` (at most
    /// [`record_max_limit`]`(data_bytes)`).
    pub fn create_with_record_max(
        name: &str,
        data_bytes: usize,
        record_max: usize,
    ) -> Result<SharedRing, RingError> {
        check_data_bytes(data_bytes, DATA_BYTES_MIN)?;
        check_record_max(record_max, data_bytes)?;
        let flags = MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING;
        // Kernels since 6.3 want memfds to say whether they are executable; older ones reject
        // the flag with EINVAL.
        let fd = match rustix::fs::memfd_create(name, flags | MemfdFlags::NOEXEC_SEAL) {
            Err(Errno::INVAL) => rustix::fs::memfd_create(name, flags),
            other => other,
        }
        .map_err(os("memfd_create"))?;
        let len = HEADER_BYTES + data_bytes;
        rustix::fs::ftruncate(&fd, len as u64).map_err(os("ftruncate"))?;
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)
            .map_err(os("fcntl(F_ADD_SEALS)"))?;
        let map = Mapping::map(fd, len)?;
        // The file is new and zero-filled: head = tail = waiting = 0 already.
        map.write_header(layout::MAGIC_OFFSET, MAGIC);
        map.write_header(layout::VERSION_OFFSET, LAYOUT_VERSION);
        map.write_header(layout::HEADER_BYTES_OFFSET, HEADER_BYTES as u32);
        map.write_header(layout::DATA_BYTES_OFFSET, data_bytes as u64);
        map.write_header(layout::RECORD_MAX_OFFSET, record_max as u32);
        Ok(SharedRing {
            map: Arc::new(map),
            data_bytes,
            record_max,
        })
    }

    /// Maps a ring memfd received from a peer, after checking that it is sealed against
    /// shrinking, that its size matches its header, and that the header is valid (magic,
    /// version, power-of-two data size, record_max). The counters are checked when an end is
    /// taken.
    pub fn from_fd(fd: OwnedFd) -> Result<SharedRing, RingError> {
        let seals = rustix::fs::fcntl_get_seals(&fd).map_err(os("fcntl(F_GET_SEALS)"))?;
        if !seals.contains(SealFlags::SHRINK) {
            return Err(RingError::Unsealed {
                seals: seals.bits(),
            });
        }
        let size = rustix::fs::fstat(&fd).map_err(os("fstat"))?.st_size;
        let size = u64::try_from(size).unwrap_or(0);
        let (min, max) = (
            (HEADER_BYTES + DATA_BYTES_MIN) as u64,
            (HEADER_BYTES + DATA_BYTES_MAX) as u64,
        );
        if !(min..=max).contains(&size) {
            return Err(RingError::Corrupt {
                field: RingField::FileSize,
                read: size,
                expected: size.clamp(min, max),
            });
        }
        let map = Mapping::map(fd, size as usize)?;
        let corrupt = |field, read: u64, expected: u64| {
            Err(RingError::Corrupt {
                field,
                read,
                expected,
            })
        };
        let magic: u64 = map.read_header(layout::MAGIC_OFFSET);
        if magic != MAGIC {
            return corrupt(RingField::Magic, magic, MAGIC);
        }
        let version: u32 = map.read_header(layout::VERSION_OFFSET);
        if version != LAYOUT_VERSION {
            return corrupt(RingField::Version, version.into(), LAYOUT_VERSION.into());
        }
        let header_bytes: u32 = map.read_header(layout::HEADER_BYTES_OFFSET);
        if header_bytes as usize != HEADER_BYTES {
            return corrupt(
                RingField::HeaderBytes,
                header_bytes.into(),
                HEADER_BYTES as u64,
            );
        }
        let data_bytes: u64 = map.read_header(layout::DATA_BYTES_OFFSET);
        let room = size - HEADER_BYTES as u64;
        if !data_bytes.is_power_of_two() || !(DATA_BYTES_MIN as u64..=room).contains(&data_bytes) {
            return corrupt(RingField::DataBytes, data_bytes, room);
        }
        if data_bytes != room {
            return corrupt(RingField::FileSize, size, HEADER_BYTES as u64 + data_bytes);
        }
        let data_bytes = data_bytes as usize;
        let record_max: u32 = map.read_header(layout::RECORD_MAX_OFFSET);
        let limit = record_max_limit(data_bytes);
        if record_max as usize > limit {
            return corrupt(RingField::RecordMax, record_max.into(), limit as u64);
        }
        Ok(SharedRing {
            map: Arc::new(map),
            data_bytes,
            record_max: record_max as usize,
        })
    }

    /// The memfd, to hand to the peer (e.g. with [`crate::shm::fdpass::send_with_fds`]).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.map.fd.as_fd()
    }

    /// Size of the data area.
    pub fn data_bytes(&self) -> usize {
        self.data_bytes
    }

    /// The largest payload the ring carries.
    pub fn record_max(&self) -> usize {
        self.record_max
    }

    /// Both ends, for a ring used within one process (or before handing one end's thread off).
    pub fn split(self) -> Result<(Producer, Consumer), RingError> {
        let other = SharedRing {
            map: Arc::clone(&self.map),
            data_bytes: self.data_bytes,
            record_max: self.record_max,
        };
        Ok((Producer::new(self)?, Consumer::new(other)?))
    }

    /// The producer end only.
    pub fn into_producer(self) -> Result<Producer, RingError> {
        Producer::new(self)
    }

    /// The consumer end only.
    pub fn into_consumer(self) -> Result<Consumer, RingError> {
        Consumer::new(self)
    }
}

impl Producer<SharedRing> {
    /// The ring's memfd (e.g. to hand to a restarted peer).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.mem.fd()
    }

    /// A consumer of this ring of the producer's own, resuming where the ring's consumer
    /// stopped: to take back the records a consumer that is gone (its process killed and
    /// reaped) never popped. Only then: while the consumer runs, both would pop the same
    /// records. Fails if the consumer left the counters invalid.
    pub fn reclaimer(&self) -> Result<Consumer, RingError> {
        Consumer::new(SharedRing {
            map: Arc::clone(&self.mem.map),
            data_bytes: self.mem.data_bytes,
            record_max: self.mem.record_max,
        })
    }
}

impl Consumer<SharedRing> {
    /// The ring's memfd (e.g. to hand to a restarted peer).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.mem.fd()
    }
}

// SAFETY: `data()` is the mapping's data area, `data_bytes` long, page-aligned, kept mapped by the
// `Arc` for as long as any `SharedRing` holding it lives; the geometry fields never change; the
// three words are distinct atomics in the header page.
unsafe impl RingMemory for SharedRing {
    #[inline]
    fn load_head(&self, order: Ordering) -> u64 {
        self.map.atomic_u64(layout::HEAD_OFFSET).load(order)
    }
    #[inline]
    fn store_head(&self, value: u64, order: Ordering) {
        self.map.atomic_u64(layout::HEAD_OFFSET).store(value, order)
    }
    #[inline]
    fn load_tail(&self, order: Ordering) -> u64 {
        self.map.atomic_u64(layout::TAIL_OFFSET).load(order)
    }
    #[inline]
    fn store_tail(&self, value: u64, order: Ordering) {
        self.map.atomic_u64(layout::TAIL_OFFSET).store(value, order)
    }
    #[inline]
    fn load_waiting(&self, order: Ordering) -> u32 {
        self.map.atomic_u32(layout::WAITING_OFFSET).load(order)
    }
    #[inline]
    fn store_waiting(&self, value: u32, order: Ordering) {
        self.map
            .atomic_u32(layout::WAITING_OFFSET)
            .store(value, order)
    }
    #[inline]
    fn fence_seq_cst(&self) {
        std::sync::atomic::fence(Ordering::SeqCst)
    }
    #[inline]
    fn data(&self) -> NonNull<u8> {
        // SAFETY: the mapping is `HEADER_BYTES + data_bytes` long, so this stays inside it.
        unsafe { self.map.base.add(HEADER_BYTES) }
    }
    #[inline]
    fn data_bytes(&self) -> usize {
        self.data_bytes
    }
    #[inline]
    fn record_max(&self) -> usize {
        self.record_max
    }
}

// ---------------------------------------------------------------------------------------------
// Doorbell
// ---------------------------------------------------------------------------------------------

/// An eventfd the producer writes to wake a sleeping consumer (see the module doc for the
/// protocol). The consumer polls [`Doorbell::as_fd`] together with its other fds.
#[derive(Debug)]
pub struct Doorbell {
    fd: OwnedFd,
}

impl Doorbell {
    /// A new non-blocking, close-on-exec eventfd.
    pub fn new() -> Result<Doorbell, RingError> {
        let fd = rustix::event::eventfd(
            0,
            rustix::event::EventfdFlags::NONBLOCK | rustix::event::EventfdFlags::CLOEXEC,
        )
        .map_err(os("eventfd"))?;
        Ok(Doorbell { fd })
    }

    /// Wraps an eventfd received from the peer, making it non-blocking if it is not (so that
    /// [`Doorbell::drain`] never blocks).
    pub fn from_fd(fd: OwnedFd) -> Result<Doorbell, RingError> {
        let flags = rustix::fs::fcntl_getfl(&fd).map_err(os("fcntl(F_GETFL)"))?;
        if !flags.contains(rustix::fs::OFlags::NONBLOCK) {
            rustix::fs::fcntl_setfl(&fd, flags | rustix::fs::OFlags::NONBLOCK)
                .map_err(os("fcntl(F_SETFL)"))?;
        }
        Ok(Doorbell { fd })
    }

    /// The eventfd, to poll for readability or to hand to the peer.
    pub fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Rings: adds 1 to the eventfd counter, making it readable.
    pub fn kick(&self) -> Result<(), RingError> {
        loop {
            match rustix::io::write(&self.fd, &1u64.to_ne_bytes()) {
                Ok(_) => return Ok(()),
                Err(Errno::INTR) => continue,
                // The counter is at its maximum: it is readable already, the wake-up is pending.
                Err(Errno::AGAIN) => return Ok(()),
                Err(errno) => {
                    return Err(RingError::Os {
                        op: "write(eventfd)",
                        errno,
                    });
                }
            }
        }
    }

    /// Resets the counter after a wake-up; returns how many kicks it had counted (0 if none).
    pub fn drain(&self) -> Result<u64, RingError> {
        let mut buf = [0u8; 8];
        loop {
            match rustix::io::read(&self.fd, &mut buf) {
                Ok(8) => return Ok(u64::from_ne_bytes(buf)),
                Ok(_) => {
                    return Err(RingError::Os {
                        op: "read(eventfd)",
                        errno: Errno::INVAL,
                    });
                }
                Err(Errno::INTR) => continue,
                Err(Errno::AGAIN) => return Ok(0),
                Err(errno) => {
                    return Err(RingError::Os {
                        op: "read(eventfd)",
                        errno,
                    });
                }
            }
        }
    }
}

impl AsFd for Doorbell {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_bytes_rounds_prefix_and_payload_to_eight() {
        assert_eq!(record_bytes(0), 8);
        assert_eq!(record_bytes(4), 8);
        assert_eq!(record_bytes(5), 16);
        assert_eq!(record_bytes(12), 16);
        assert_eq!(record_bytes(usize::MAX), usize::MAX & !7);
    }

    #[test]
    fn record_max_limit_keeps_a_record_within_half_the_ring() {
        for data_bytes in [16usize, 64 * 1024, 1 << 30] {
            let max = record_max_limit(data_bytes);
            assert_eq!(record_bytes(max), data_bytes / 2);
            assert!(record_bytes(max + 1) > data_bytes / 2);
        }
    }

    #[test]
    fn create_rejects_bad_sizes() {
        assert!(matches!(
            SharedRing::create("t", 1000),
            Err(RingError::BadCapacity { .. })
        ));
        assert!(matches!(
            SharedRing::create("t", 32 * 1024),
            Err(RingError::BadCapacity { .. })
        ));
        assert!(matches!(
            SharedRing::create_with_record_max("t", 64 * 1024, 32 * 1024),
            Err(RingError::BadRecordMax { .. })
        ));
    }

    #[test]
    fn push_then_pop_round_trips_and_parts_concatenate() {
        let ring = SharedRing::create("unit", 64 * 1024).unwrap();
        let (mut tx, mut rx) = ring.split().unwrap();
        tx.try_push(b"hello").unwrap();
        tx.try_push_parts(&[b"ab", b"", b"cd"]).unwrap();
        assert_eq!(rx.pop_with(|r| r.to_vec()).unwrap().unwrap(), b"hello");
        assert_eq!(rx.pop_with(|r| r.to_vec()).unwrap().unwrap(), b"abcd");
        assert_eq!(rx.pop_with(|r| r.len()).unwrap(), None);
        assert_eq!(tx.free_bytes(), 64 * 1024);
    }

    #[test]
    fn too_long_is_not_full() {
        let ring = SharedRing::create("unit", 64 * 1024).unwrap();
        let max = ring.record_max();
        let (mut tx, _rx) = ring.split().unwrap();
        let big = vec![0u8; max + 1];
        assert_eq!(
            tx.try_push(&big),
            Err(PushError::TooLong { len: max + 1, max })
        );
        tx.try_push(&big[..max]).unwrap();
    }

    #[test]
    fn doorbell_counts_kicks_and_drains_to_zero() {
        let bell = Doorbell::new().unwrap();
        assert_eq!(bell.drain().unwrap(), 0);
        bell.kick().unwrap();
        bell.kick().unwrap();
        assert_eq!(bell.drain().unwrap(), 2);
        assert_eq!(bell.drain().unwrap(), 0);
    }
}
