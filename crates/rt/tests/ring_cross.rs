//! Proves that two separate mappings of one ring memfd, driven by two threads exactly as two
//! processes would drive them, carry a long stream intact: the producer maps the ring it
//! created, the consumer thread maps a `dup` of the fd with `SharedRing::from_fd`, and 1,000,000
//! records of varying size (mostly small, every 1024th up to 60 KiB, so the ring fills and
//! wraps constantly) each carry a sequence number and a checksum of their payload that the
//! consumer verifies. The second test runs the same stream with the doorbell: the consumer
//! sleeps in `poll` on the eventfd whenever the ring is empty (the producer pauses now and then
//! to make sure it does), the producer kicks only when `needs_kick` says so, and a poll that
//! times out counts as a lost wake-up. Both print their throughput and retry counts with
//! `--nocapture`.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec};
use spillway_rt::shm::ring::{Doorbell, PushError, SharedRing};

const RECORDS: u64 = 1_000_000;
const HEADER: usize = 16;

/// A fixed pseudo-random pool that payloads are cut from, so making a record costs no
/// per-byte work on the producer beyond the checksum.
fn pool() -> Vec<u8> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    (0..128 * 1024)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Payload length of record `seq`: 0..512 bytes, and every 1024th record 0..60 KiB.
fn payload_len(seq: u64) -> usize {
    let h = seq.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40;
    if seq % 1024 == 1023 {
        (h % (60 * 1024)) as usize
    } else {
        (h % 512) as usize
    }
}

fn payload(pool: &[u8], seq: u64) -> &[u8] {
    let len = payload_len(seq);
    let start = (seq.wrapping_mul(7919) % (pool.len() - len) as u64) as usize;
    &pool[start..start + len]
}

/// Word-at-a-time mixing checksum (cheap in a debug build).
fn checksum(bytes: &[u8]) -> u64 {
    let mut h = bytes.len() as u64;
    let mut words = bytes.chunks_exact(8);
    for w in &mut words {
        let w = u64::from_le_bytes(w.try_into().expect("8 bytes"));
        h = (h ^ w).wrapping_mul(0x100_0000_01b3).rotate_left(29);
    }
    for &b in words.remainder() {
        h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
    }
    h
}

fn header(seq: u64, body: &[u8]) -> [u8; HEADER] {
    let mut h = [0u8; HEADER];
    h[..8].copy_from_slice(&seq.to_le_bytes());
    h[8..].copy_from_slice(&checksum(body).to_le_bytes());
    h
}

/// Checks one record against the expected sequence number; returns the payload length.
fn check(record: &[u8], expected_seq: u64) -> usize {
    assert!(record.len() >= HEADER, "record {expected_seq} too short");
    let seq = u64::from_le_bytes(record[..8].try_into().expect("8 bytes"));
    assert_eq!(seq, expected_seq, "records out of order");
    let sum = u64::from_le_bytes(record[8..16].try_into().expect("8 bytes"));
    let body = &record[HEADER..];
    assert_eq!(
        body.len(),
        payload_len(seq),
        "record {seq} has the wrong length"
    );
    assert_eq!(checksum(body), sum, "record {seq} corrupted");
    body.len()
}

fn dup(fd: impl AsFd) -> OwnedFd {
    rustix::io::fcntl_dupfd_cloexec(fd, 0).expect("dup")
}

#[test]
fn two_mappings_carry_a_million_records_intact() {
    let ring = SharedRing::create("ring-cross", 1 << 20).unwrap();
    let peer_fd = dup(ring.fd());
    let mut producer = ring.into_producer().unwrap();
    let pool = pool();
    let started = Instant::now();

    let consumer = std::thread::spawn(move || {
        let mut consumer = SharedRing::from_fd(peer_fd)
            .unwrap()
            .into_consumer()
            .unwrap();
        let (mut seq, mut bytes) = (0u64, 0u64);
        while seq < RECORDS {
            // Alternate single pops and batches to cover both release paths.
            let got = if seq % 2 == 0 {
                consumer
                    .pop_with(|r| bytes += check(r, seq) as u64)
                    .unwrap()
                    .map_or(0, |()| 1)
            } else {
                let base = seq;
                let mut i = 0;
                consumer
                    .pop_batch(64, |r| {
                        bytes += check(r, base + i) as u64;
                        i += 1;
                    })
                    .unwrap() as u64
            };
            if got == 0 {
                std::thread::yield_now();
            }
            seq += got;
        }
        assert_eq!(consumer.pop_with(|_| ()).unwrap(), None);
        bytes
    });

    let mut full = 0u64;
    for seq in 0..RECORDS {
        let body = payload(&pool, seq);
        let head = header(seq, body);
        loop {
            match producer.try_push_parts(&[&head, body]) {
                Ok(()) => break,
                Err(PushError::Full { .. }) => {
                    full += 1;
                    std::thread::yield_now();
                }
                Err(e) => panic!("push {seq}: {e}"),
            }
        }
    }
    let bytes = consumer.join().unwrap();
    eprintln!(
        "{RECORDS} records, {} MiB of payload, {full} full pushes retried, in {:?}",
        bytes >> 20,
        started.elapsed()
    );
}

#[test]
fn doorbell_wakes_a_sleeping_consumer_for_every_record() {
    let ring = SharedRing::create("ring-bell", 1 << 20).unwrap();
    let bell = Doorbell::new().unwrap();
    let peer_ring = dup(ring.fd());
    let peer_bell = dup(bell.as_fd());
    let mut producer = ring.into_producer().unwrap();
    let pool = pool();
    let sleeps = std::sync::Arc::new(AtomicU64::new(0));
    let consumer_sleeps = std::sync::Arc::clone(&sleeps);
    let started = Instant::now();

    let consumer = std::thread::spawn(move || {
        let mut consumer = SharedRing::from_fd(peer_ring)
            .unwrap()
            .into_consumer()
            .unwrap();
        let bell = Doorbell::from_fd(peer_bell).unwrap();
        let mut seq = 0u64;
        while seq < RECORDS {
            let base = seq;
            let mut i = 0;
            let got = consumer
                .pop_batch(32, |r| {
                    check(r, base + i);
                    i += 1;
                })
                .unwrap() as u64;
            seq += got;
            if got == 0 && consumer.prepare_sleep() {
                consumer_sleeps.fetch_add(1, Ordering::Relaxed);
                let mut fds = [PollFd::new(&bell, PollFlags::IN)];
                let timeout = Timespec {
                    tv_sec: 10,
                    tv_nsec: 0,
                };
                let ready = rustix::event::poll(&mut fds, Some(&timeout)).unwrap();
                assert_eq!(
                    ready, 1,
                    "lost wake-up: slept 10 s with record {seq} pending"
                );
                bell.drain().unwrap();
                consumer.woke();
            }
        }
        assert_eq!(consumer.pop_with(|_| ()).unwrap(), None);
    });

    let (mut kicks, mut seq, mut next_pause) = (0u64, 0u64, 0u64);
    while seq < RECORDS {
        // Batches of 1 to 16 records, one head store and at most one kick each.
        let want = 1 + seq % 16;
        let mut batch = producer.batch();
        while (batch.pushed() as u64) < want && seq < RECORDS {
            let body = payload(&pool, seq);
            let head = header(seq, body);
            match batch.try_push_parts(&[&head, body]) {
                Ok(()) => seq += 1,
                Err(PushError::Full { .. }) => break,
                Err(e) => panic!("push {seq}: {e}"),
            }
        }
        let pushed = batch.publish();
        if producer.needs_kick() {
            bell.kick().unwrap();
            kicks += 1;
        }
        if pushed == 0 {
            std::thread::yield_now();
        }
        if seq >= next_pause {
            // Let the consumer run dry and go to sleep.
            std::thread::sleep(Duration::from_millis(2));
            next_pause += RECORDS / 10;
        }
    }
    consumer.join().unwrap();
    let sleeps = sleeps.load(Ordering::Relaxed);
    eprintln!(
        "{RECORDS} records, {sleeps} sleeps, {kicks} kicks, in {:?}",
        started.elapsed()
    );
    assert!(
        sleeps > 0,
        "the consumer never slept: the test proved nothing"
    );
    assert!(kicks > 0);
}
