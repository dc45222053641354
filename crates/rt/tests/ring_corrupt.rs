//! Proves that the ring treats shared memory as untrusted input: whatever a misbehaving peer
//! writes into the header or the data area, the consumer's pops and the producer's pushes return
//! a typed `Corrupt` error naming the field and the value read, and never panic or touch memory
//! outside the ring; and `SharedRing::from_fd` refuses memfds that are unsealed, truncated, or
//! carry a bad magic, version, size or record_max. The "peer" writes with `pwrite` on the memfd,
//! which lands in the same pages the ring has mapped, so the test needs no `unsafe`. Targeted
//! cases check each rule with its exact error; a proptest throws random garbage at random offsets
//! and checks that every outcome is `Ok` or `Corrupt`.

use std::os::fd::{AsFd, OwnedFd};

use proptest::prelude::*;
use rustix::fs::{MemfdFlags, SealFlags};
use spillway_rt::shm::ring::{
    Consumer, HEADER_BYTES, LAYOUT_VERSION, Producer, PushError, RingError, RingField, SharedRing,
    WRAP_MARKER, layout,
};

const DATA: usize = 64 * 1024;

fn dup(fd: impl AsFd) -> OwnedFd {
    rustix::io::fcntl_dupfd_cloexec(fd, 0).expect("dup")
}

/// Writes `bytes` at file offset `offset` of the ring's memfd, as a peer would.
fn poke(fd: impl AsFd, offset: usize, bytes: &[u8]) {
    let n = rustix::io::pwrite(fd, bytes, offset as u64).expect("pwrite");
    assert_eq!(n, bytes.len());
}

fn peek_u64(fd: impl AsFd, offset: usize) -> u64 {
    let mut buf = [0u8; 8];
    rustix::io::pread(fd, &mut buf, offset as u64).expect("pread");
    u64::from_ne_bytes(buf)
}

/// A fresh ring, its two ends, and an fd for poking at it.
fn ring() -> (Producer, Consumer, OwnedFd) {
    let ring = SharedRing::create("ring-corrupt", DATA).unwrap();
    let fd = dup(ring.fd());
    let (p, c) = ring.split().unwrap();
    (p, c, fd)
}

fn corrupt_field(result: Result<impl std::fmt::Debug, RingError>) -> RingField {
    match result {
        Err(RingError::Corrupt { field, .. }) => field,
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

#[test]
fn head_past_the_ring_is_corrupt() {
    let (_p, mut c, fd) = ring();
    let bad = (DATA + 8) as u64;
    poke(&fd, layout::HEAD_OFFSET, &bad.to_ne_bytes());
    assert_eq!(
        c.pop_with(|_| ()),
        Err(RingError::Corrupt {
            field: RingField::Head,
            read: bad,
            expected: DATA as u64,
        })
    );
    // The error is sticky while the peer keeps the bad value, and pop_batch reports it too.
    assert_eq!(corrupt_field(c.pop_batch(8, |_| ())), RingField::Head);
}

#[test]
fn unaligned_or_backward_head_is_corrupt() {
    let (mut p, mut c, fd) = ring();
    poke(&fd, layout::HEAD_OFFSET, &4u64.to_ne_bytes());
    assert_eq!(corrupt_field(c.pop_with(|_| ())), RingField::Head);
    poke(&fd, layout::HEAD_OFFSET, &0u64.to_ne_bytes());
    p.try_push(b"abc").unwrap();
    p.try_push(b"def").unwrap();
    assert_eq!(c.pop_with(|r| r.to_vec()).unwrap().unwrap(), b"abc");
    assert_eq!(c.pop_with(|r| r.to_vec()).unwrap().unwrap(), b"def");
    // head goes back below tail: claims 2^64 - 8 unread bytes.
    poke(&fd, layout::HEAD_OFFSET, &8u64.to_ne_bytes());
    assert_eq!(corrupt_field(c.pop_with(|_| ())), RingField::Head);
}

#[test]
fn length_over_record_max_is_corrupt() {
    let (mut p, mut c, fd) = ring();
    p.try_push(&[7u8; 100]).unwrap();
    let bad = (c.record_max() + 1) as u32;
    poke(&fd, HEADER_BYTES, &bad.to_ne_bytes());
    assert_eq!(
        c.pop_with(|_| ()),
        Err(RingError::Corrupt {
            field: RingField::RecordLen,
            read: bad.into(),
            // 104 bytes published: the largest payload that fits is 100.
            expected: 100,
        })
    );
}

#[test]
fn length_past_the_published_bytes_is_corrupt() {
    let (mut p, mut c, fd) = ring();
    p.try_push(b"").unwrap();
    poke(&fd, HEADER_BYTES, &100u32.to_ne_bytes());
    assert_eq!(
        c.pop_with(|_| ()),
        Err(RingError::Corrupt {
            field: RingField::RecordLen,
            read: 100,
            expected: 4,
        })
    );
    // Nothing was consumed: fixing the length lets the record through.
    poke(&fd, HEADER_BYTES, &0u32.to_ne_bytes());
    assert_eq!(c.pop_with(|r| r.len()).unwrap(), Some(0));
}

#[test]
fn wrap_marker_without_a_record_after_it_is_corrupt() {
    let (mut p, mut c, fd) = ring();
    p.try_push(b"12345678").unwrap();
    // A wrap marker at index 0 would skip the whole ring.
    poke(&fd, HEADER_BYTES, &WRAP_MARKER.to_ne_bytes());
    assert_eq!(
        c.pop_with(|_| ()),
        Err(RingError::Corrupt {
            field: RingField::WrapMarker,
            read: 16,
            expected: DATA as u64 + 8,
        })
    );
}

#[test]
fn record_running_past_the_end_is_corrupt() {
    // Start both counters 16 bytes before the end, as if the ring had been in use.
    let ring = SharedRing::create("ring-corrupt", DATA).unwrap();
    let fd = dup(ring.fd());
    let start = (DATA - 16) as u64;
    poke(&fd, layout::HEAD_OFFSET, &start.to_ne_bytes());
    poke(&fd, layout::TAIL_OFFSET, &start.to_ne_bytes());
    let (mut p, mut c) = ring.split().unwrap();
    // 40 bytes do not fit in the last 16: wrap marker there, record at index 0.
    p.try_push(&[1u8; 36]).unwrap();
    p.try_push(&[2u8; 4]).unwrap();
    assert_eq!(c.pop_with(|r| r.to_vec()).unwrap().unwrap(), [1u8; 36]);
    assert_eq!(peek_u64(&fd, layout::TAIL_OFFSET), start + 16 + 40);
    assert_eq!(c.pop_with(|r| r.to_vec()).unwrap().unwrap(), [2u8; 4]);
    // tail is now DATA + 48 (index 48). Forge a record right before the end whose length runs
    // past it, and publish well beyond it: 16 bytes remain there, so at most 12 bytes of payload
    // are possible, however many bytes head claims.
    let head = 2 * DATA as u64 + 32;
    poke(&fd, layout::HEAD_OFFSET, &head.to_ne_bytes());
    let index = 48;
    for offset in (index..DATA - 16).step_by(8) {
        // Fill the gap with empty records so the consumer walks up to the forged one.
        poke(&fd, HEADER_BYTES + offset, &0u32.to_ne_bytes());
    }
    poke(&fd, HEADER_BYTES + DATA - 16, &20u32.to_ne_bytes());
    let mut popped = 0;
    let err = c.pop_batch(usize::MAX, |_| popped += 1).unwrap_err();
    assert_eq!(popped, (DATA - 16 - index) / 8);
    assert_eq!(
        err,
        RingError::Corrupt {
            field: RingField::RecordLen,
            read: 20,
            expected: 12,
        }
    );
    // The good records before the bad one were released.
    assert_eq!(
        peek_u64(&fd, layout::TAIL_OFFSET) % DATA as u64,
        (DATA - 16) as u64
    );
}

#[test]
fn tail_past_head_or_unaligned_is_corrupt_for_the_producer() {
    let (mut p, mut c, fd) = ring();
    // Fill the ring so the producer must reload tail.
    let big = vec![0u8; p.record_max()];
    p.try_push(&big).unwrap();
    p.try_push(&big).unwrap();
    assert!(matches!(p.try_push(b"x"), Err(PushError::Full { .. })));
    let published = peek_u64(&fd, layout::HEAD_OFFSET);
    poke(&fd, layout::TAIL_OFFSET, &(published + 8).to_ne_bytes());
    assert_eq!(
        p.try_push(b"x"),
        Err(PushError::Corrupt {
            field: RingField::Tail,
            read: published + 8,
            expected: published,
        })
    );
    poke(&fd, layout::TAIL_OFFSET, &12u64.to_ne_bytes());
    assert!(matches!(
        p.try_push(b"x"),
        Err(PushError::Corrupt {
            field: RingField::Tail,
            ..
        })
    ));
    // free_bytes does not panic either; it reports the last valid view.
    assert_eq!(p.free_bytes(), 0);
    poke(&fd, layout::TAIL_OFFSET, &0u64.to_ne_bytes());
    assert_eq!(c.pop_with(|r| r.len()).unwrap(), Some(big.len()));
    p.try_push(b"x").unwrap();
}

#[test]
fn taking_an_end_of_a_ring_with_bad_counters_fails() {
    let ring = SharedRing::create("ring-corrupt", DATA).unwrap();
    poke(
        ring.fd(),
        layout::HEAD_OFFSET,
        &(DATA as u64 + 8).to_ne_bytes(),
    );
    assert_eq!(corrupt_field(ring.split()), RingField::Head);
    let ring = SharedRing::create("ring-corrupt", DATA).unwrap();
    poke(ring.fd(), layout::TAIL_OFFSET, &3u64.to_ne_bytes());
    assert_eq!(corrupt_field(ring.into_consumer()), RingField::Tail);
}

/// `from_fd` of a copy of a good ring's memfd after `poke`s to its header.
fn from_fd_after(pokes: &[(usize, &[u8])]) -> Result<SharedRing, RingError> {
    let ring = SharedRing::create("ring-corrupt", DATA).unwrap();
    for (offset, bytes) in pokes {
        poke(ring.fd(), *offset, bytes);
    }
    SharedRing::from_fd(dup(ring.fd()))
}

#[test]
fn from_fd_checks_every_header_field() {
    let good = from_fd_after(&[]).unwrap();
    assert_eq!((good.data_bytes(), good.record_max()), (DATA, DATA / 2 - 4));

    let cases: [(usize, Vec<u8>, RingField); 6] = [
        (layout::MAGIC_OFFSET, b"NOTARING".to_vec(), RingField::Magic),
        (
            layout::VERSION_OFFSET,
            (LAYOUT_VERSION + 1).to_ne_bytes().to_vec(),
            RingField::Version,
        ),
        (
            layout::HEADER_BYTES_OFFSET,
            8192u32.to_ne_bytes().to_vec(),
            RingField::HeaderBytes,
        ),
        (
            layout::DATA_BYTES_OFFSET,
            (DATA as u64 - 8).to_ne_bytes().to_vec(),
            RingField::DataBytes,
        ),
        (
            layout::DATA_BYTES_OFFSET,
            (2 * DATA as u64).to_ne_bytes().to_vec(),
            RingField::DataBytes,
        ),
        (
            layout::RECORD_MAX_OFFSET,
            (DATA as u32 / 2).to_ne_bytes().to_vec(),
            RingField::RecordMax,
        ),
    ];
    for (offset, bytes, field) in cases {
        assert_eq!(
            corrupt_field(from_fd_after(&[(offset, &bytes)])),
            field,
            "poke at {offset}"
        );
    }
}

fn sealed_memfd(len: u64, seals: SealFlags) -> OwnedFd {
    let fd = rustix::fs::memfd_create(
        "ring-corrupt",
        MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
    )
    .unwrap();
    rustix::fs::ftruncate(&fd, len).unwrap();
    rustix::fs::fcntl_add_seals(&fd, seals).unwrap();
    fd
}

#[test]
fn from_fd_refuses_truncated_or_mis_sized_files() {
    // Too small for even a header page.
    let fd = sealed_memfd(1000, SealFlags::SHRINK);
    assert_eq!(
        SharedRing::from_fd(fd).unwrap_err(),
        RingError::Corrupt {
            field: RingField::FileSize,
            read: 1000,
            expected: (HEADER_BYTES + DATA) as u64,
        }
    );
    // A good header whose file was cut short (copied into a smaller memfd).
    let ring = SharedRing::create("ring-corrupt", 2 * DATA).unwrap();
    let mut header = vec![0u8; HEADER_BYTES];
    rustix::io::pread(ring.fd(), &mut header[..], 0).unwrap();
    let fd = sealed_memfd((HEADER_BYTES + DATA) as u64, SealFlags::SHRINK);
    poke(&fd, 0, &header);
    assert_eq!(
        SharedRing::from_fd(fd).unwrap_err(),
        RingError::Corrupt {
            field: RingField::DataBytes,
            read: 2 * DATA as u64,
            expected: DATA as u64,
        }
    );
    // Room for more than the header says.
    let fd = sealed_memfd((HEADER_BYTES + 3 * DATA) as u64, SealFlags::SHRINK);
    poke(&fd, 0, &header);
    assert_eq!(
        SharedRing::from_fd(fd).unwrap_err(),
        RingError::Corrupt {
            field: RingField::FileSize,
            read: (HEADER_BYTES + 3 * DATA) as u64,
            expected: (HEADER_BYTES + 2 * DATA) as u64,
        }
    );
}

#[test]
fn from_fd_refuses_a_file_the_peer_could_shrink() {
    let fd = sealed_memfd((HEADER_BYTES + DATA) as u64, SealFlags::GROW);
    assert!(matches!(
        SharedRing::from_fd(fd),
        Err(RingError::Unsealed { .. })
    ));
    // A plain file cannot be sealed at all.
    let file = tempfile::tempfile().unwrap();
    file.set_len((HEADER_BYTES + DATA) as u64).unwrap();
    assert!(SharedRing::from_fd(file.into()).is_err());
}

#[test]
fn created_rings_carry_all_three_seals() {
    let ring = SharedRing::create("ring-corrupt", DATA).unwrap();
    let seals = rustix::fs::fcntl_get_seals(ring.fd()).unwrap();
    assert!(seals.contains(SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL));
    assert!(rustix::fs::ftruncate(ring.fd(), 4096).is_err());
}

#[derive(Debug, Clone)]
enum Garbage {
    Data(usize, Vec<u8>),
    Head(u64),
    Tail(u64),
}

fn garbage() -> impl Strategy<Value = Garbage> {
    prop_oneof![
        4 => (0..DATA, prop::collection::vec(any::<u8>(), 1..64))
            .prop_map(|(at, bytes)| Garbage::Data(at, bytes)),
        // Small values and aligned values near the real counters are the interesting ones.
        1 => prop_oneof![any::<u64>(), (0u64..4 * DATA as u64)].prop_map(Garbage::Head),
        1 => prop_oneof![any::<u64>(), (0u64..4 * DATA as u64)].prop_map(Garbage::Tail),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]
    #[test]
    fn garbage_anywhere_never_panics(
        lens in prop::collection::vec(0usize..3000, 0..40),
        junk in prop::collection::vec(garbage(), 1..8),
    ) {
        let (mut p, mut c, fd) = ring();
        for (i, len) in lens.iter().enumerate() {
            let _ = p.try_push(&vec![i as u8; *len]);
        }
        for g in &junk {
            match g {
                Garbage::Data(at, bytes) => {
                    let n = bytes.len().min(DATA - at);
                    poke(&fd, HEADER_BYTES + at, &bytes[..n]);
                }
                Garbage::Head(v) => poke(&fd, layout::HEAD_OFFSET, &v.to_ne_bytes()),
                Garbage::Tail(v) => poke(&fd, layout::TAIL_OFFSET, &v.to_ne_bytes()),
            }
        }
        // Whatever the peer wrote, every call ends in a value or a typed error.
        for round in 0..200 {
            let r = if round % 2 == 0 {
                c.pop_with(|r| r.len()).map(|o| o.map_or(0, |_| 1))
            } else {
                c.pop_batch(4, |_| ())
            };
            match r {
                Ok(0) => break,
                Ok(_) => {}
                Err(RingError::Corrupt { .. }) => break,
                Err(e) => prop_assert!(false, "unexpected error {e}"),
            }
        }
        for _ in 0..4 {
            match p.try_push(b"after") {
                Ok(()) | Err(PushError::Full { .. }) | Err(PushError::Corrupt { .. }) => {}
                Err(e) => prop_assert!(false, "unexpected error {e}"),
            }
        }
        let _ = p.free_bytes();
        let _ = c.prepare_sleep();
    }
}
