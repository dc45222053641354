//! Proves that the ring behaves exactly like a queue of byte strings with the byte accounting
//! rule documented in `shm/ring.rs`: a differential test (proptest) runs arbitrary sequences of
//! pushes (single, from parts, and batched; lengths from 0 to past `record_max`, biased towards
//! sizes that force wrap-around), pops and batch pops against a reference model, a
//! `VecDeque<Vec<u8>>` plus head/tail byte counters that apply the rule, and checks after every
//! step that both return the same records, that `Full` and `TooLong` come exactly when the model
//! says so (with the same `needed`/`free` figures), and that `free_bytes` agrees. It runs on tiny
//! heap rings (16 bytes to 4 KiB, so nearly every sequence wraps many times) through the same
//! generic `Producer`/`Consumer` code, and on real memfd rings.

use std::cell::UnsafeCell;
use std::collections::VecDeque;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use proptest::prelude::*;
use spillway_rt::shm::ring::{
    Consumer, Producer, PushError, RingMemory, SharedRing, record_bytes, record_max_limit,
};

/// A ring in heap memory with std atomics, for small capacities.
struct HeapRing {
    head: AtomicU64,
    tail: AtomicU64,
    waiting: AtomicU32,
    bytes: Box<[UnsafeCell<u64>]>,
    record_max: usize,
}

// SAFETY: `bytes` is only accessed through the ring protocol (one producer, one consumer).
unsafe impl Sync for HeapRing {}

// SAFETY: `data()` is the boxed, 8-aligned buffer of `data_bytes()` bytes, which never moves;
// geometry is fixed; the words are three distinct atomics.
unsafe impl RingMemory for HeapRing {
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
        std::sync::atomic::fence(Ordering::SeqCst)
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
}

fn heap_ring(data_bytes: usize, record_max: usize) -> Arc<HeapRing> {
    Arc::new(HeapRing {
        head: AtomicU64::new(0),
        tail: AtomicU64::new(0),
        waiting: AtomicU32::new(0),
        bytes: (0..data_bytes / 8).map(|_| UnsafeCell::new(0)).collect(),
        record_max,
    })
}

/// The reference: a queue of records plus the byte counters of the accounting rule.
struct Model {
    data_bytes: u64,
    record_max: usize,
    head: u64,
    tail: u64,
    queue: VecDeque<(Vec<u8>, u64)>,
}

impl Model {
    fn new(data_bytes: usize, record_max: usize) -> Self {
        Model {
            data_bytes: data_bytes as u64,
            record_max,
            head: 0,
            tail: 0,
            queue: VecDeque::new(),
        }
    }

    fn free(&self) -> u64 {
        self.data_bytes - (self.head - self.tail)
    }

    /// The documented rule: `record_bytes(n)`, plus the bytes up to the end of the data area
    /// when the record does not fit before it; full when that exceeds the free bytes.
    fn push(&mut self, record: Vec<u8>) -> Result<(), PushError> {
        if record.len() > self.record_max {
            return Err(PushError::TooLong {
                len: record.len(),
                max: self.record_max,
            });
        }
        let rec = record_bytes(record.len()) as u64;
        let before_end = self.data_bytes - self.head % self.data_bytes;
        let needed = if rec > before_end {
            before_end + rec
        } else {
            rec
        };
        if needed > self.free() {
            return Err(PushError::Full {
                needed: needed as usize,
                free: self.free() as usize,
            });
        }
        self.head += needed;
        self.queue.push_back((record, needed));
        Ok(())
    }

    fn pop(&mut self) -> Option<Vec<u8>> {
        let (record, bytes) = self.queue.pop_front()?;
        self.tail += bytes;
        Some(record)
    }
}

#[derive(Debug, Clone)]
enum Op {
    Push(usize, u8),
    PushParts(Vec<usize>, u8),
    Batch(Vec<(usize, u8)>),
    Pop,
    PopBatch(usize),
}

fn payload(len: usize, fill: u8) -> Vec<u8> {
    (0..len)
        .map(|i| fill.wrapping_add((i * 7) as u8) ^ (i >> 8) as u8)
        .collect()
}

/// Lengths from empty to a little past `record_max`, with extra weight on the large end, where
/// records wrap and the ring fills.
fn len_strategy(record_max: usize) -> impl Strategy<Value = usize> {
    prop_oneof![
        3 => 0..=16usize,
        3 => 0..=record_max,
        2 => record_max.saturating_sub(16)..=record_max,
        1 => record_max..=record_max + 8,
    ]
}

fn op_strategy(record_max: usize) -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (len_strategy(record_max), any::<u8>()).prop_map(|(l, f)| Op::Push(l, f)),
        1 => (prop::collection::vec(0..=record_max / 2 + 1, 1..4), any::<u8>())
            .prop_map(|(l, f)| Op::PushParts(l, f)),
        1 => prop::collection::vec((len_strategy(record_max), any::<u8>()), 0..5)
            .prop_map(Op::Batch),
        3 => Just(Op::Pop),
        1 => (0usize..5).prop_map(Op::PopBatch),
    ]
}

fn run<M: RingMemory>(
    mut producer: Producer<M>,
    mut consumer: Consumer<M>,
    mut model: Model,
    ops: &[Op],
) -> Result<(), TestCaseError> {
    for (step, op) in ops.iter().enumerate() {
        match op {
            Op::Push(len, fill) => {
                let record = payload(*len, *fill);
                prop_assert_eq!(
                    producer.try_push(&record),
                    model.push(record),
                    "step {}",
                    step
                );
            }
            Op::PushParts(lens, fill) => {
                let parts: Vec<Vec<u8>> = lens
                    .iter()
                    .enumerate()
                    .map(|(i, &l)| payload(l, fill.wrapping_add(i as u8)))
                    .collect();
                let slices: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
                prop_assert_eq!(
                    producer.try_push_parts(&slices),
                    model.push(parts.concat()),
                    "step {}",
                    step
                );
            }
            Op::Batch(records) => {
                let mut batch = producer.batch();
                for (len, fill) in records {
                    let record = payload(*len, *fill);
                    let want = model.push(record.clone());
                    prop_assert_eq!(batch.try_push(&record), want, "step {}", step);
                    if want.is_err() {
                        break;
                    }
                }
            }
            Op::Pop => {
                let got = consumer.pop_with(|r| r.to_vec()).expect("no corruption");
                prop_assert_eq!(got, model.pop(), "step {}", step);
            }
            Op::PopBatch(max) => {
                let mut got = Vec::new();
                let n = consumer
                    .pop_batch(*max, |r| got.push(r.to_vec()))
                    .expect("no corruption");
                let want: Vec<Vec<u8>> = (0..*max).map_while(|_| model.pop()).collect();
                prop_assert_eq!(n, want.len(), "step {}", step);
                prop_assert_eq!(got, want, "step {}", step);
            }
        }
        prop_assert_eq!(producer.free_bytes() as u64, model.free(), "step {}", step);
    }
    // Drain: what is left comes out in order too.
    while let Some(want) = model.pop() {
        let got = consumer.pop_with(|r| r.to_vec()).expect("no corruption");
        prop_assert_eq!(got, Some(want));
    }
    prop_assert_eq!(consumer.pop_with(|_| ()).expect("no corruption"), None);
    Ok(())
}

/// A heap ring's size and record_max, and a sequence of operations sized for it.
fn tiny_case() -> impl Strategy<Value = (usize, usize, Vec<Op>)> {
    (4u32..=12)
        .prop_flat_map(|shift| {
            let data_bytes = 1usize << shift;
            let limit = record_max_limit(data_bytes);
            (Just(data_bytes), prop_oneof![Just(limit), 0..=limit])
        })
        .prop_flat_map(|(data_bytes, record_max)| {
            (
                Just(data_bytes),
                Just(record_max),
                prop::collection::vec(op_strategy(record_max), 0..120),
            )
        })
}

proptest! {
    #[test]
    fn heap_ring_matches_the_reference_queue((data_bytes, record_max, ops) in tiny_case()) {
        let ring = heap_ring(data_bytes, record_max);
        let producer = Producer::new(Arc::clone(&ring)).unwrap();
        let consumer = Consumer::new(ring).unwrap();
        run(producer, consumer, Model::new(data_bytes, record_max), &ops)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn memfd_ring_matches_the_reference_queue(
        ops in prop::collection::vec(op_strategy(record_max_limit(64 * 1024)), 0..80)
    ) {
        let ring = SharedRing::create("ring-model", 64 * 1024).unwrap();
        let record_max = ring.record_max();
        let (producer, consumer) = ring.split().unwrap();
        run(producer, consumer, Model::new(64 * 1024, record_max), &ops)?;
    }
}

#[test]
fn empty_ring_accepts_a_largest_record_wherever_head_stands() {
    // The liveness argument of the accounting rule, checked at every 8-byte position.
    let data_bytes = 256;
    let record_max = record_max_limit(data_bytes);
    let ring = heap_ring(data_bytes, record_max);
    let mut producer = Producer::new(Arc::clone(&ring)).unwrap();
    let mut consumer = Consumer::new(ring).unwrap();
    let big = payload(record_max, 1);
    for _ in 0..data_bytes / 8 {
        producer.try_push(&big).unwrap();
        assert_eq!(consumer.pop_with(|r| r == big).unwrap(), Some(true));
        // Move head on by one 8-byte slot.
        producer.try_push(&[]).unwrap();
        assert_eq!(consumer.pop_with(|r| r.len()).unwrap(), Some(0));
    }
}
