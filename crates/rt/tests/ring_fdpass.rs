//! Proves that a ring and its doorbell can be handed to another process and used there: the
//! ring's memfd and an eventfd travel over a `UnixStream::pair()` with `SCM_RIGHTS`
//! (`fdpass::send_with_fds` / `recv_with_fds`), the receiver maps the ring with
//! `SharedRing::from_fd` and wraps the eventfd with `Doorbell::from_fd`, and records pushed on
//! one side pop out, intact and in order, on the other, with the consumer sleeping on the
//! doorbell when the ring is empty. The first test does it between two threads; the second
//! between two real processes: it re-runs this test binary as a child (the
//! `fdpass_child_consumer` test, which does nothing unless the parent set its environment
//! variable), hands it one end of the socket pair, and checks the child's report and exit
//! status.

use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::process::{Command, Stdio};

use rustix::event::{PollFd, PollFlags, Timespec};
use spillway_rt::shm::fdpass::{recv_with_fds, send_with_fds};
use spillway_rt::shm::ring::{Consumer, Doorbell, Producer, PushError, SharedRing};

const RECORDS: u32 = 20_000;
const CHILD_FD_VAR: &str = "SPILLWAY_RING_FDPASS_CHILD_FD";

fn record(seq: u32) -> Vec<u8> {
    let len = (seq as usize * 37) % 1500;
    let mut r = seq.to_le_bytes().to_vec();
    r.extend((0..len).map(|i| (seq as usize + i) as u8));
    r
}

/// Pushes `RECORDS` records, kicking the doorbell when the consumer sleeps.
fn produce(producer: &mut Producer, bell: &Doorbell) {
    for seq in 0..RECORDS {
        let r = record(seq);
        loop {
            match producer.try_push(&r) {
                Ok(()) => break,
                Err(PushError::Full { .. }) => std::thread::yield_now(),
                Err(e) => panic!("push {seq}: {e}"),
            }
        }
        if producer.needs_kick() {
            bell.kick().unwrap();
        }
    }
}

/// Pops `RECORDS` records and checks each; sleeps on the doorbell when the ring is empty.
/// Returns how many times it slept.
fn consume(consumer: &mut Consumer, bell: &Doorbell) -> u32 {
    let (mut seq, mut sleeps) = (0u32, 0u32);
    while seq < RECORDS {
        let popped = consumer
            .pop_with(|r| assert_eq!(r, record(seq), "record {seq}"))
            .unwrap();
        if popped.is_some() {
            seq += 1;
        } else if consumer.prepare_sleep() {
            sleeps += 1;
            let mut fds = [PollFd::new(bell, PollFlags::IN)];
            let timeout = Timespec {
                tv_sec: 10,
                tv_nsec: 0,
            };
            let ready = rustix::event::poll(&mut fds, Some(&timeout)).unwrap();
            assert_eq!(ready, 1, "lost wake-up before record {seq}");
            bell.drain().unwrap();
            consumer.woke();
        }
    }
    assert_eq!(consumer.pop_with(|_| ()).unwrap(), None);
    sleeps
}

/// Receives the ring and the doorbell from `sock`.
fn receive_ring(sock: &UnixStream) -> (Consumer, Doorbell) {
    let mut buf = [0u8; 16];
    let (n, mut fds) = recv_with_fds(sock, &mut buf, 2).unwrap();
    assert_eq!(&buf[..n], b"ring+bell");
    assert_eq!(fds.len(), 2);
    let bell = Doorbell::from_fd(fds.pop().expect("two fds")).unwrap();
    let ring = SharedRing::from_fd(fds.pop().expect("two fds")).unwrap();
    (ring.into_consumer().unwrap(), bell)
}

#[test]
fn ring_and_doorbell_handed_over_a_socket_work_between_threads() {
    let ring = SharedRing::create("ring-fdpass", 256 * 1024).unwrap();
    let bell = Doorbell::new().unwrap();
    let (a, b) = UnixStream::pair().unwrap();
    send_with_fds(&a, b"ring+bell", &[ring.fd(), bell.as_fd()]).unwrap();
    let consumer = std::thread::spawn(move || {
        let (mut consumer, bell) = receive_ring(&b);
        consume(&mut consumer, &bell)
    });
    let mut producer = ring.into_producer().unwrap();
    produce(&mut producer, &bell);
    let sleeps = consumer.join().unwrap();
    eprintln!("{RECORDS} records across threads, consumer slept {sleeps} times");
}

#[test]
fn ring_and_doorbell_handed_over_a_socket_work_between_processes() {
    let ring = SharedRing::create("ring-fdpass", 256 * 1024).unwrap();
    let bell = Doorbell::new().unwrap();
    let (mut parent, child) = UnixStream::pair().unwrap();
    // Let the child inherit its end of the socket (and only through this fd number).
    rustix::io::fcntl_setfd(&child, rustix::io::FdFlags::empty()).unwrap();
    let proc = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "fdpass_child_consumer",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_FD_VAR, child.as_raw_fd().to_string())
        // Keep the child's own test-harness lines out of this run's output.
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child);
    send_with_fds(&parent, b"ring+bell", &[ring.fd(), bell.as_fd()]).unwrap();
    let mut producer = ring.into_producer().unwrap();
    produce(&mut producer, &bell);
    let mut report = String::new();
    parent.read_to_string(&mut report).unwrap();
    let out = proc.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "child failed: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(report.starts_with("popped 20000"), "child said {report:?}");
    eprintln!("{RECORDS} records across processes; child: {report}");
}

/// The child half of the test above; does nothing unless run by it.
#[test]
fn fdpass_child_consumer() {
    let Ok(fd) = std::env::var(CHILD_FD_VAR) else {
        return;
    };
    let fd: i32 = fd.parse().unwrap();
    // SAFETY: the parent cleared close-on-exec on its end of the socket pair and passed its
    // number; nothing else in this process owns that fd.
    let sock = UnixStream::from(unsafe { OwnedFd::from_raw_fd(fd) });
    let (mut consumer, bell) = receive_ring(&sock);
    let sleeps = consume(&mut consumer, &bell);
    send_with_fds(
        &sock,
        format!("popped {RECORDS} records, slept {sleeps} times").as_bytes(),
        &[],
    )
    .unwrap();
}
