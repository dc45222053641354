//! Proves, with `loom`'s exhaustive exploration of interleavings and weak-memory outcomes, that
//! the virtqueue notification handshake (`virtq::announce_sleep` on the side about to sleep,
//! `virtq::peer_wants_notice` on the side that published) never loses a wake-up: whenever the
//! sleeper decides to sleep, the publisher decides to notify. It runs the production functions
//! themselves over `loom` atomics (they are generic over `NoticeWords`), for both directions the
//! queues use them in (driver publishes avail / device sleeps; device publishes used / driver
//! sleeps; same code, other words). A variant without the fences must fail, which shows the model
//! can see the bug the fences prevent.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use loom::sync::atomic::{AtomicBool, AtomicU16, fence};
use loom::thread;
use spillway_rt::shm::virtq::{NoticeWords, USED_F_NO_NOTIFY, announce_sleep, peer_wants_notice};

/// Two words: the sleeper's flags (offset 0) and the publisher's index (offset 2).
struct Words {
    flags: AtomicU16,
    idx: AtomicU16,
    fences: bool,
}

impl NoticeWords for Words {
    fn load_u16(&self, off: usize, order: Ordering) -> u16 {
        if off == 0 { &self.flags } else { &self.idx }.load(order)
    }
    fn store_u16(&self, off: usize, value: u16, order: Ordering) {
        if off == 0 { &self.flags } else { &self.idx }.store(value, order);
    }
    fn fence_seq_cst(&self) {
        if self.fences {
            fence(Ordering::SeqCst);
        }
    }
}

/// One publish racing one decision to sleep; panics if the sleeper sleeps un-notified.
fn model(fences: bool) {
    let w = Arc::new(Words {
        // The sleeper starts busy: it asked not to be notified.
        flags: AtomicU16::new(USED_F_NO_NOTIFY),
        idx: AtomicU16::new(0),
        fences,
    });
    let notified = Arc::new(AtomicBool::new(false));
    let publisher = {
        let (w, notified) = (w.clone(), notified.clone());
        thread::spawn(move || {
            w.store_u16(2, 1, Ordering::Release);
            if peer_wants_notice(&*w, 0, USED_F_NO_NOTIFY) {
                notified.store(true, Ordering::Relaxed);
            }
        })
    };
    let sleeps = announce_sleep(&*w, 0, USED_F_NO_NOTIFY, 2, 0);
    publisher.join().unwrap();
    assert!(
        !sleeps || notified.load(Ordering::Relaxed),
        "the sleeper slept and nobody notified it"
    );
}

#[test]
fn loom_announce_sleep_and_notify_never_lose_a_wakeup() {
    loom::model(|| model(true));
}

#[test]
fn loom_without_the_fences_a_wakeup_is_lost() {
    let lost = std::panic::catch_unwind(|| loom::model(|| model(false)));
    assert!(
        lost.is_err(),
        "loom found no lost wake-up without the fences"
    );
}
