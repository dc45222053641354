//! A core model's control part on one thread and its shards on others (ADR 0011): the
//! plumbing the DPU process's forwarding threads and the spill plane's threads share.
//!
//! - [`Shared`]: the one budget every shard charges (the DPU's [`Resources`], the plane's
//!   [`PlaneResources`]) behind a lock; a shard takes it for one charge at a time, so the
//!   limits hold in aggregate, not per thread.
//! - [`ThreadShards`] (on the control thread) and a [`ShardEnd`] (on each shard's thread):
//!   the core's transport between the control part and its shards ([`Shards`] for the DPU,
//!   [`PlaneShards`] for the plane) over channels. `call` sends one request to a shard's
//!   thread, wakes it and waits for the reply; the thread answers what is waiting at its next
//!   batch boundary ([`ShardEnd::serve`]). Lifecycle steps are rare (a window, a placement
//!   tick, a transition now and then), so a round trip per request costs the control thread
//!   microseconds now and then and the shards' threads nothing per frame. The core decides
//!   what to ask and what the replies mean; this module only carries them.
//! - [`Published`]: the control part's view of the lifecycle, which every shard's thread picks
//!   up at its next turn; [`Bell`]: how one thread wakes another that sleeps in `poll`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, Sender, SyncSender, TryRecvError, channel, sync_channel};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::shm::ring::Doorbell;

use spillway_fabric::dpu::{Resources, ResourcesHandle, ShardReply, ShardRequest, Shards};
use spillway_fabric::spill::{
    PlaneReply, PlaneRequest, PlaneResources, PlaneResourcesHandle, PlaneShards,
};

/// A thread's handle to a budget every shard's thread charges.
#[derive(Debug)]
pub struct Shared<T>(Arc<Mutex<T>>);

impl<T> Shared<T> {
    /// The first handle to `res`.
    pub fn new(res: T) -> Shared<T> {
        Shared(Arc::new(Mutex::new(res)))
    }

    /// Another handle to the same budget, for another shard.
    pub fn share(&self) -> Shared<T> {
        Shared(Arc::clone(&self.0))
    }

    /// The budget, locked.
    pub fn lock(&self) -> MutexGuard<'_, T> {
        // A shard that panicked while charging leaves the budget as it was between two
        // charges (every charge is one call under the guard): keep forwarding on it.
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The DPU's limits shared by its forwarding threads.
pub type SharedResources = Shared<Resources>;

impl ResourcesHandle for Shared<Resources> {
    type Read<'a> = MutexGuard<'a, Resources>;
    type Write<'a> = MutexGuard<'a, Resources>;
    // Other threads' shards hold records this one does not.
    const EXCLUSIVE: bool = false;
    fn read(&self) -> MutexGuard<'_, Resources> {
        self.lock()
    }
    fn write(&mut self) -> MutexGuard<'_, Resources> {
        self.lock()
    }
}

impl PlaneResourcesHandle for Shared<PlaneResources> {
    type Read<'a> = MutexGuard<'a, PlaneResources>;
    type Write<'a> = MutexGuard<'a, PlaneResources>;
    fn read(&self) -> MutexGuard<'_, PlaneResources> {
        self.lock()
    }
    fn write(&mut self) -> MutexGuard<'_, PlaneResources> {
        self.lock()
    }
}

/// A shard thread's end of the control part's requests `Q`, answered with `P`.
#[derive(Debug)]
pub struct ShardEnd<Q, P> {
    requests: Receiver<Q>,
    replies: SyncSender<P>,
}

impl<Q, P> ShardEnd<Q, P> {
    /// Answers every request waiting, in order, with `answer`; returns how many. Call it at a
    /// batch boundary, and when woken.
    pub fn serve(&self, mut answer: impl FnMut(Q) -> P) -> usize {
        let mut n = 0;
        loop {
            match self.requests.try_recv() {
                Ok(req) => {
                    n += 1;
                    // The control thread waits for this reply; if it is gone, so is the
                    // process's lifecycle, and the shard thread's own exit follows.
                    if self.replies.send(answer(req)).is_err() {
                        return n;
                    }
                }
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => return n,
            }
        }
    }
}

/// The control thread's end: one channel pair and one waker per shard thread.
pub struct ThreadShards<Q, P> {
    ends: Vec<ControlEnd<Q, P>>,
}

struct ControlEnd<Q, P> {
    requests: Sender<Q>,
    replies: Receiver<P>,
    wake: Box<dyn Fn() + Send>,
}

impl<Q, P> std::fmt::Debug for ThreadShards<Q, P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadShards")
            .field("shards", &self.ends.len())
            .finish()
    }
}

impl<Q, P> Default for ThreadShards<Q, P> {
    fn default() -> Self {
        ThreadShards::new()
    }
}

impl<Q, P> ThreadShards<Q, P> {
    /// No shards yet.
    pub fn new() -> ThreadShards<Q, P> {
        ThreadShards { ends: Vec::new() }
    }

    /// The next shard (its index is the number added before it): the end its thread serves
    /// requests from. `wake` gets that thread to its next batch boundary if it sleeps (an
    /// eventfd its poll set or ring watches, a thread unpark).
    pub fn add(&mut self, wake: impl Fn() + Send + 'static) -> ShardEnd<Q, P> {
        let (req_tx, req_rx) = channel();
        // One request is outstanding at a time: a reply never waits for room.
        let (rep_tx, rep_rx) = sync_channel(1);
        self.ends.push(ControlEnd {
            requests: req_tx,
            replies: rep_rx,
            wake: Box::new(wake),
        });
        ShardEnd {
            requests: req_rx,
            replies: rep_tx,
        }
    }

    fn count(&self) -> usize {
        self.ends.len()
    }

    /// # Panics
    ///
    /// If shard `shard`'s thread is gone: the model cannot take a lifecycle step without one
    /// of its shards, and the process must stop (on the DPU; a plane that stops fails open).
    fn call(&mut self, shard: usize, req: Q) -> P {
        let end = &self.ends[shard];
        let gone = || panic!("the thread of shard {shard} is gone");
        if end.requests.send(req).is_err() {
            gone();
        }
        (end.wake)();
        end.replies.recv().unwrap_or_else(|_| gone())
    }
}

impl Shards for ThreadShards<ShardRequest, ShardReply> {
    fn count(&self) -> usize {
        ThreadShards::count(self)
    }
    fn call(&mut self, shard: usize, req: ShardRequest) -> ShardReply {
        ThreadShards::call(self, shard, req)
    }
}

impl PlaneShards for ThreadShards<PlaneRequest, PlaneReply> {
    fn count(&self) -> usize {
        ThreadShards::count(self)
    }
    fn call(&mut self, shard: usize, req: PlaneRequest) -> PlaneReply {
        ThreadShards::call(self, shard, req)
    }
}

/// A thread's wake-up: an eventfd it polls while asleep, rung by a sender that finds it so.
#[derive(Debug)]
pub struct Bell {
    bell: Doorbell,
    asleep: AtomicBool,
}

impl Bell {
    /// A new bell, for a thread that is awake.
    pub fn new() -> std::io::Result<Bell> {
        Ok(Bell {
            bell: Doorbell::new().map_err(|e| std::io::Error::other(e.to_string()))?,
            asleep: AtomicBool::new(false),
        })
    }
    /// Wakes the thread if it sleeps (or is about to).
    pub fn ring_if_asleep(&self) {
        if self.asleep.swap(false, Ordering::SeqCst) {
            let _ = self.bell.kick();
        }
    }
    /// Wakes the thread whatever it is doing (a request waits for it, or it must stop).
    pub fn ring(&self) {
        self.asleep.store(false, Ordering::SeqCst);
        let _ = self.bell.kick();
    }
    /// The owning thread, before it checks its inputs a last time and sleeps.
    pub fn mark_asleep(&self) {
        self.asleep.store(true, Ordering::SeqCst);
    }
    /// The owning thread, after waking (or deciding not to sleep).
    pub fn woke(&self) {
        self.asleep.store(false, Ordering::SeqCst);
        let _ = self.bell.drain();
    }
    /// How many times it was rung since the last drain (and drains it).
    pub fn drain(&self) -> Result<u64, crate::shm::ring::RingError> {
        self.bell.drain()
    }
    /// The eventfd to poll.
    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        std::os::fd::AsFd::as_fd(&self.bell)
    }
}

/// A value one thread publishes (the control part's view of the lifecycle) and the others
/// pick up at their next turn, each when it changed.
#[derive(Debug)]
pub struct Published<T> {
    value: Mutex<T>,
    generation: AtomicU64,
}

impl<T: Copy> Published<T> {
    /// `value`, generation 0.
    pub fn new(value: T) -> Published<T> {
        Published {
            value: Mutex::new(value),
            generation: AtomicU64::new(0),
        }
    }

    /// The value now.
    pub fn get(&self) -> T {
        *self
            .value
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Replaces the value (a new generation).
    pub fn publish(&self, value: T) {
        *self
            .value
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = value;
        self.generation.fetch_add(1, Ordering::Release);
    }

    /// The value, if it was published since generation `seen` (which moves on).
    pub fn newer(&self, seen: &mut u64) -> Option<T> {
        let g = self.generation.load(Ordering::Acquire);
        (g != *seen).then(|| {
            *seen = g;
            self.get()
        })
    }
}

/// The shard threads of a process, as the thread that started them holds them: their stop
/// flag, their bells and their handles. Stopping (or dropping) sets the flag, rings every
/// bell and joins them.
#[derive(Debug)]
pub struct Crew {
    stop: Arc<AtomicBool>,
    bells: Vec<Arc<Bell>>,
    threads: Vec<std::thread::JoinHandle<()>>,
    /// What the threads are, for the log.
    what: &'static str,
}

impl Crew {
    /// No threads yet; `what` names them in the log.
    pub fn new(what: &'static str) -> Crew {
        Crew {
            stop: Arc::new(AtomicBool::new(false)),
            bells: Vec::new(),
            threads: Vec::new(),
            what,
        }
    }

    /// The flag the threads watch.
    pub fn stop_flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.stop)
    }

    /// A started thread and the bell that wakes it.
    pub fn add(&mut self, thread: std::thread::JoinHandle<()>, bell: Arc<Bell>) {
        self.threads.push(thread);
        self.bells.push(bell);
    }

    /// Stops and joins every thread.
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for b in &self.bells {
            b.ring();
        }
        for t in self.threads.drain(..) {
            if t.join().is_err() {
                tracing::error!(target: "spillway::run", threads = self.what, "a thread panicked");
            }
        }
    }
}

impl Drop for Crew {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Turns without work before a forwarding loop sleeps in `poll`: a sleep and a wake-up cost
/// more than the frames of a steady stream that arrive meanwhile (context switches dominated a
/// profile of 64-byte UDP), and `poll` wakes a loop only after the queue has filled.
const SPIN_TURNS: u32 = 64;
/// How often a forwarding loop publishes its counters, ns.
pub const PUBLISH_NS: u64 = 100_000_000;

/// A forwarding loop's count of turns without work: every loop of both processes that spins
/// before it sleeps (the DPU process's threads, the plane's shard threads).
#[derive(Debug, Default)]
pub struct Spin(u32);

impl Spin {
    /// After a turn that found work (`busy`) or none: true once `SPIN_TURNS` idle turns in a
    /// row have passed, when the loop should sleep (the count starts again).
    pub fn sleep_due(&mut self, busy: bool) -> bool {
        if busy {
            self.0 = 0;
            return false;
        }
        self.0 += 1;
        if self.0 > SPIN_TURNS {
            self.0 = 0;
            return true;
        }
        false
    }
}
