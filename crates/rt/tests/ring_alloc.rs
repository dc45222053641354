//! Proves that the ring's hot paths allocate nothing per record: a counting global allocator
//! tallies allocations made by the test's own thread (so the harness's threads cannot disturb
//! the count) while it pushes and pops thousands of records through every data-path call,
//! single pushes, pushes from parts, batches, single pops, batch pops, the sleep/kick handshake
//! and the doorbell itself, across many wrap-arounds, after one warm-up round. The count must
//! stay at zero.

use spillway_rt::shm::ring::{Doorbell, SharedRing};

#[global_allocator]
static GLOBAL: spillway_testkit::CountingAlloc = spillway_testkit::CountingAlloc;

use spillway_testkit::allocations;

#[test]
fn push_pop_and_doorbell_do_not_allocate() {
    let ring = SharedRing::create("ring-alloc", 64 * 1024).unwrap();
    let (mut producer, mut consumer) = ring.split().unwrap();
    let bell = Doorbell::new().unwrap();
    let frame = vec![0xa5u8; 9000];
    let header = [1u8; 12];
    let mut sum = 0usize;

    let mut round = |producer: &mut spillway_rt::shm::ring::Producer,
                     consumer: &mut spillway_rt::shm::ring::Consumer| {
        for i in 0..2_000usize {
            let len = (i * 131) % frame.len();
            producer.try_push(&frame[..len]).unwrap();
            producer
                .try_push_parts(&[&header, &frame[..len / 2]])
                .unwrap();
            {
                let mut batch = producer.batch();
                for j in 0..4 {
                    batch.try_push(&frame[..j * 100]).unwrap();
                }
            }
            if producer.needs_kick() {
                bell.kick().unwrap();
            }
            let _ = producer.free_bytes();
            sum += consumer.pop_with(<[u8]>::len).unwrap().unwrap();
            sum += consumer.pop_with(<[u8]>::len).unwrap().unwrap();
            let n = consumer.pop_batch(8, |r| sum += r.len()).unwrap();
            assert_eq!(n, 4);
            if consumer.prepare_sleep() {
                bell.kick().unwrap();
                bell.drain().unwrap();
                consumer.woke();
            }
        }
    };

    // The counter works: a Box allocates.
    let probe = allocations();
    drop(std::hint::black_box(Box::new(1u64)));
    assert_eq!(allocations(), probe + 1);

    round(&mut producer, &mut consumer); // warm-up
    let before = allocations();
    round(&mut producer, &mut consumer);
    let after = allocations();
    assert!(sum > 0);
    assert_eq!(after - before, 0, "the data path allocated");
}
