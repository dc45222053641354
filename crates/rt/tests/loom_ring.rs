//! Proves, with `loom`'s exhaustive exploration of thread interleavings and weak-memory outcomes,
//! that the ring's index protocol is right: the consumer sees exactly the pushed records, in
//! order, including across a wrap-around; no byte of the data area is ever read while it is being
//! written (or written while it is being read); and the sleep/kick handshake never loses a
//! wake-up. It runs the production `Producer`/`Consumer` code itself, not a copy: they are
//! generic over `RingMemory`, which this file implements with `loom` atomics and fences over a
//! heap buffer, plus one `loom` `UnsafeCell` per 8-byte slot that the ring's `will_read` /
//! `will_write` hooks touch, so that `loom` flags any unsynchronised access to a slot. The
//! eventfd is modelled by `loom::sync::Notify` (a sticky permit, like the eventfd counter); a
//! lost wake-up shows up as a deadlock, which `loom` reports. The models are tiny (a 32-byte
//! ring, two or three records) so that they finish in seconds in a debug build. No `--cfg loom`
//! rebuild is needed.

use std::cell::UnsafeCell;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use loom::cell::UnsafeCell as LoomUnsafeCell;
use loom::sync::Notify;
use loom::sync::atomic::{AtomicU32, AtomicU64, fence};
use loom::thread;
use spillway_rt::shm::ring::{Consumer, Producer, PushError, RingMemory};

/// A ring in heap memory whose shared words are `loom` atomics.
struct LoomRing {
    head: AtomicU64,
    tail: AtomicU64,
    waiting: AtomicU32,
    /// The data area, as `u64`s for 8-byte alignment.
    bytes: Box<[UnsafeCell<u64>]>,
    /// One race detector per 8-byte slot of `bytes`.
    slots: Box<[LoomUnsafeCell<()>]>,
    record_max: usize,
}

// SAFETY: `bytes` is only accessed through the ring protocol, whose exclusive access to each slot
// the `slots` race detectors check; everything else is `loom` atomics.
unsafe impl Sync for LoomRing {}
// SAFETY: as above; nothing in it is tied to a thread.
unsafe impl Send for LoomRing {}

impl LoomRing {
    fn new(data_bytes: usize, record_max: usize) -> Arc<LoomRing> {
        let words = data_bytes / 8;
        Arc::new(LoomRing {
            head: AtomicU64::new(0),
            tail: AtomicU64::new(0),
            waiting: AtomicU32::new(0),
            bytes: (0..words).map(|_| UnsafeCell::new(0)).collect(),
            slots: (0..words).map(|_| LoomUnsafeCell::new(())).collect(),
            record_max,
        })
    }

    fn slot_range(offset: usize, len: usize) -> std::ops::Range<usize> {
        if len == 0 {
            0..0
        } else {
            offset / 8..(offset + len - 1) / 8 + 1
        }
    }
}

// SAFETY: `data()` is the boxed buffer of `data_bytes()` bytes, 8-aligned, which never moves and
// lives as long as the value; geometry is fixed; the words are three distinct loom atomics and
// the fence is loom's.
unsafe impl RingMemory for LoomRing {
    fn load_head(&self, order: Ordering) -> u64 {
        self.head.load(order)
    }
    fn store_head(&self, value: u64, order: Ordering) {
        self.head.store(value, order)
    }
    fn load_tail(&self, order: Ordering) -> u64 {
        self.tail.load(order)
    }
    fn store_tail(&self, value: u64, order: Ordering) {
        self.tail.store(value, order)
    }
    fn load_waiting(&self, order: Ordering) -> u32 {
        self.waiting.load(order)
    }
    fn store_waiting(&self, value: u32, order: Ordering) {
        self.waiting.store(value, order)
    }
    fn fence_seq_cst(&self) {
        fence(Ordering::SeqCst)
    }
    fn data(&self) -> NonNull<u8> {
        NonNull::new(self.bytes.as_ptr().cast::<u8>().cast_mut()).expect("a Box is never null")
    }
    fn data_bytes(&self) -> usize {
        self.bytes.len() * 8
    }
    fn record_max(&self) -> usize {
        self.record_max
    }
    fn will_read(&self, offset: usize, len: usize) {
        for slot in Self::slot_range(offset, len) {
            self.slots[slot].with(|_| ());
        }
    }
    fn will_write(&self, offset: usize, len: usize) {
        for slot in Self::slot_range(offset, len) {
            self.slots[slot].with_mut(|_| ());
        }
    }
}

fn builder() -> loom::model::Builder {
    let mut builder = loom::model::Builder::new();
    // Four preemptions take ~3 s here and already catch every ordering bug we planted (a missing
    // fence on either side, Relaxed instead of Release/Acquire on head or tail). The unbounded
    // search also passes but takes ~30 s; set LOOM_MAX_PREEMPTIONS to search deeper.
    if std::env::var_os("LOOM_MAX_PREEMPTIONS").is_none() {
        builder.preemption_bound = Some(4);
    }
    builder
}

/// Pushes `record`, yielding while the ring is full.
fn push_spinning(producer: &mut Producer<Arc<LoomRing>>, record: &[u8]) {
    loop {
        match producer.try_push(record) {
            Ok(()) => return,
            Err(PushError::Full { .. }) => thread::yield_now(),
            Err(e) => panic!("push failed: {e}"),
        }
    }
}

/// Pops `n` records with `pop_with`, yielding while the ring is empty.
fn pop_spinning(consumer: &mut Consumer<Arc<LoomRing>>, n: usize) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    while out.len() < n {
        match consumer.pop_with(|r| r.to_vec()).expect("no corruption") {
            Some(r) => out.push(r),
            None => thread::yield_now(),
        }
    }
    out
}

#[test]
fn loom_three_records_arrive_in_order() {
    builder().check(|| {
        let ring = LoomRing::new(32, 12);
        let mut producer = Producer::new(Arc::clone(&ring)).unwrap();
        let mut consumer = Consumer::new(ring).unwrap();
        let t = thread::spawn(move || {
            push_spinning(&mut producer, b"a");
            push_spinning(&mut producer, b"bcdefg");
            push_spinning(&mut producer, b"");
        });
        // Pop with batches (one tail store per batch) to check batch release too.
        let mut got: Vec<Vec<u8>> = Vec::new();
        while got.len() < 3 {
            let n = consumer
                .pop_batch(3, |r| got.push(r.to_vec()))
                .expect("no corruption");
            if n == 0 {
                thread::yield_now();
            }
        }
        t.join().unwrap();
        assert_eq!(got, [&b"a"[..], b"bcdefg", b""]);
        assert_eq!(consumer.pop_with(|_| ()).unwrap(), None);
    });
}

#[test]
fn loom_batch_publishes_all_records_at_once() {
    builder().check(|| {
        let ring = LoomRing::new(32, 12);
        let mut producer = Producer::new(Arc::clone(&ring)).unwrap();
        let mut consumer = Consumer::new(ring).unwrap();
        let t = thread::spawn(move || {
            let mut batch = producer.batch();
            batch.try_push(b"xy").unwrap();
            batch.try_push_parts(&[b"1", b"23"]).unwrap();
            assert_eq!(batch.publish(), 2);
        });
        let got = pop_spinning(&mut consumer, 2);
        t.join().unwrap();
        assert_eq!(got, [&b"xy"[..], b"123"]);
    });
}

#[test]
fn loom_wrap_around_keeps_order_and_never_overwrites_unread_bytes() {
    builder().check(|| {
        // Records take 8, 16 and 16 bytes of a 32-byte ring: the third must wait until both
        // others are consumed, then skips the last 8 bytes with a wrap marker and lands at 0,
        // over the slots the first two used.
        let ring = LoomRing::new(32, 12);
        let mut producer = Producer::new(Arc::clone(&ring)).unwrap();
        let mut consumer = Consumer::new(ring).unwrap();
        let t = thread::spawn(move || {
            push_spinning(&mut producer, b"abcd");
            push_spinning(&mut producer, b"0123456789ab");
            push_spinning(&mut producer, b"ABCDEFGHIJKL");
        });
        let got = pop_spinning(&mut consumer, 3);
        t.join().unwrap();
        assert_eq!(got, [&b"abcd"[..], b"0123456789ab", b"ABCDEFGHIJKL"]);
    });
}

#[test]
fn loom_sleep_and_kick_never_lose_a_wakeup() {
    builder().check(|| {
        let ring = LoomRing::new(32, 12);
        let bell = Arc::new(Notify::new());
        let mut producer = Producer::new(Arc::clone(&ring)).unwrap();
        let mut consumer = Consumer::new(ring).unwrap();
        let kicker = Arc::clone(&bell);
        let t = thread::spawn(move || {
            for record in [&b"one"[..], b"two"] {
                producer.try_push(record).unwrap();
                if producer.needs_kick() {
                    kicker.notify();
                }
            }
        });
        // The consumer never spins: when the ring is empty it sleeps until kicked. If a kick
        // were lost, it would sleep forever and loom would report a deadlock.
        let mut got = Vec::new();
        while got.len() < 2 {
            match consumer.pop_with(|r| r.to_vec()).unwrap() {
                Some(r) => got.push(r),
                None => {
                    if consumer.prepare_sleep() {
                        bell.wait();
                        consumer.woke();
                    }
                }
            }
        }
        t.join().unwrap();
        assert_eq!(got, [&b"one"[..], b"two"]);
    });
}
