//! The port's service thread: it holds the vhost-user socket, either listening for the VMM
//! (QEMU `-chardev socket,path=P,reconnect=1`: QEMU connects, and again after the DPU process
//! restarts) or connecting to it (QEMU `-chardev socket,path=P,server=on,wait=off`, as OVS's
//! `dpdkvhostuserclient` ports do: the DPU process connects, and again after QEMU restarts),
//! and runs one [`Session`] per connection. The data path never waits for it: requests change
//! the shared [`Device`], which the loop reads.
//!
//! A peer whose uid is not the VM's (`[[vm]] uid`, root allowed) is refused before it says
//! anything. A request the session refuses closes the connection (with a negative
//! acknowledgement first when one was asked for); the device is reset at every disconnect, so a
//! frontend that connects again starts from nothing. After [`Backend::disconnect`] (the data
//! path found the guest breaking a queue), no new connection is served for
//! [`super::QUARANTINE`].

use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use super::device::{Answer, Device, Session};
use super::msg;

/// How the socket is used.
#[derive(Debug)]
pub enum SocketMode {
    /// The DPU process listens (bound by the caller with its mode and owner); the VMM connects.
    Listen(UnixListener),
    /// The VMM listens at this path; the DPU process connects, and retries every
    /// [`RETRY`] while it is not there.
    Connect(PathBuf),
}

/// How often a connecting backend retries, and a listening one looks for a connection.
pub const RETRY: Duration = Duration::from_millis(50);

/// Requests a frontend may send at once (a set-up is about 30, a guest's driver restart about
/// as many again) before [`REQUESTS_PER_S`] applies.
pub const REQUESTS_BURST: u32 = 1000;
/// Requests per second a frontend may send beyond [`REQUESTS_BURST`]. Each request may take a
/// ring's lock the data path takes per frame and wakes the DPU process's loop, which serves
/// every tenant; beyond this rate the port's own service thread waits (counted in
/// `SessionCounters::throttled`), so a VMM in a loop slows only its own port.
pub const REQUESTS_PER_S: u32 = 1000;

/// A token bucket over the requests of one connection.
#[derive(Debug)]
struct Bucket {
    tokens: f64,
    at: std::time::Instant,
}

impl Bucket {
    fn new() -> Bucket {
        Bucket {
            tokens: f64::from(REQUESTS_BURST),
            at: std::time::Instant::now(),
        }
    }

    /// Takes a token, first waiting for one if there is none; returns whether it waited.
    fn take(&mut self) -> bool {
        let now = std::time::Instant::now();
        let rate = f64::from(REQUESTS_PER_S);
        self.tokens = (self.tokens + now.duration_since(self.at).as_secs_f64() * rate)
            .min(f64::from(REQUESTS_BURST));
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            return false;
        }
        std::thread::sleep(Duration::from_secs_f64((1.0 - self.tokens) / rate));
        self.tokens = 0.0;
        self.at = std::time::Instant::now();
        true
    }
}

/// A vhost-user port's service thread.
#[derive(Debug)]
pub struct Backend {
    pub dev: Arc<Device>,
    stop: Arc<AtomicBool>,
    quarantine: Arc<AtomicBool>,
    conn: Arc<Mutex<Option<UnixStream>>>,
    thread: Option<JoinHandle<()>>,
}

impl Backend {
    /// Starts the thread for VM `vm`; peers must have uid `uid` (or be root).
    pub fn start(vm: &str, mode: SocketMode, uid: u32) -> Result<Backend, String> {
        let dev = Device::new()?;
        let stop = Arc::new(AtomicBool::new(false));
        let quarantine = Arc::new(AtomicBool::new(false));
        let conn = Arc::new(Mutex::new(None));
        let ctx = Ctx {
            vm: vm.to_string(),
            dev: dev.clone(),
            stop: stop.clone(),
            quarantine: quarantine.clone(),
            conn: conn.clone(),
            uid,
        };
        if let SocketMode::Listen(l) = &mode {
            l.set_nonblocking(true)
                .map_err(|e| format!("vhost-user socket of vm {vm}: {e}"))?;
        }
        let thread = std::thread::Builder::new()
            .name(format!("vhost-{vm}"))
            .spawn(move || ctx.run(mode))
            .map_err(|e| format!("starting the vhost-user thread of vm {vm}: {e}"))?;
        Ok(Backend {
            dev,
            stop,
            quarantine,
            conn,
            thread: Some(thread),
        })
    }

    /// Whether a frontend is connected now.
    pub fn connected(&self) -> bool {
        self.conn.lock().is_ok_and(|c| c.is_some())
    }

    /// Drops the frontend's connection (the device is reset) and serves no new one for
    /// [`super::QUARANTINE`].
    pub fn disconnect(&self) {
        self.quarantine.store(true, Ordering::Relaxed);
        self.hang_up();
    }

    /// Shuts the current connection down, which ends the service thread's blocking read.
    fn hang_up(&self) {
        if let Ok(c) = self.conn.lock()
            && let Some(s) = c.as_ref()
        {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.hang_up();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

struct Ctx {
    vm: String,
    dev: Arc<Device>,
    stop: Arc<AtomicBool>,
    quarantine: Arc<AtomicBool>,
    conn: Arc<Mutex<Option<UnixStream>>>,
    uid: u32,
}

impl Ctx {
    fn run(self, mode: SocketMode) {
        let mut refused = 0u64;
        while !self.stop.load(Ordering::Relaxed) {
            if self.quarantine.swap(false, Ordering::Relaxed) {
                self.sleep(super::QUARANTINE);
                continue;
            }
            let stream = match &mode {
                SocketMode::Listen(l) => match l.accept() {
                    Ok((s, _)) => s,
                    Err(_) => {
                        std::thread::sleep(RETRY);
                        continue;
                    }
                },
                SocketMode::Connect(path) => match UnixStream::connect(path) {
                    Ok(s) => s,
                    Err(_) => {
                        std::thread::sleep(RETRY);
                        continue;
                    }
                },
            };
            match crate::host::unixsock::peer_cred(&stream) {
                Ok(c) if c.uid == self.uid || c.uid == 0 => {}
                peer => {
                    refused += 1;
                    if crate::dpu::worth_logging(refused) {
                        let (pid, uid) = peer.map_or((0, u32::MAX), |c| (c.pid, c.uid));
                        tracing::warn!(target: "spillway::run", vm = %self.vm, pid, uid, allowed_uid = self.uid, refused, "refused a vhost-user peer of another uid");
                    }
                    self.sleep(RETRY);
                    continue;
                }
            }
            if stream.set_nonblocking(false).is_err() {
                continue;
            }
            if let (Ok(mut c), Ok(clone)) = (self.conn.lock(), stream.try_clone()) {
                *c = Some(clone);
            }
            tracing::info!(target: "spillway::run", vm = %self.vm, "vhost-user frontend connected");
            let why = self.serve(&stream);
            if let Ok(mut c) = self.conn.lock() {
                *c = None;
            }
            self.dev.reset();
            tracing::info!(target: "spillway::run", vm = %self.vm, reason = %why, "vhost-user frontend disconnected");
        }
    }

    /// Sleeps `d`, waking early to stop.
    fn sleep(&self, d: Duration) {
        let mut left = d;
        while !left.is_zero() && !self.stop.load(Ordering::Relaxed) {
            let step = left.min(RETRY);
            std::thread::sleep(step);
            left -= step;
        }
    }

    /// Serves one connection until it ends; returns why it ended.
    fn serve(&self, s: &UnixStream) -> String {
        let mut session = Session::new(self.dev.clone());
        let mut bucket = Bucket::new();
        loop {
            let mut m = match msg::read(s) {
                Ok(Some(m)) => m,
                Ok(None) => return "closed".into(),
                Err(e) => return format!("unreadable message: {e}"),
            };
            if bucket.take() {
                let n = self.dev.counters.throttled.fetch_add(1, Ordering::Relaxed) + 1;
                if crate::dpu::worth_logging(n) {
                    tracing::warn!(target: "spillway::run", vm = %self.vm, throttled = n, "vhost-user frontend over its request rate; its requests wait");
                }
            }
            let ack = session.wants_ack(&m);
            match session.handle(&mut m) {
                Ok(answer) => {
                    let sent = match answer {
                        Answer::Reply(body) => msg::reply(s, m.req, &body),
                        Answer::None if ack => msg::reply(s, m.req, &0u64.to_le_bytes()),
                        Answer::None => Ok(()),
                    };
                    if let Err(e) = sent {
                        return format!("writing a reply: {e}");
                    }
                }
                Err(e) => {
                    if ack {
                        let _ = msg::reply(s, m.req, &1u64.to_le_bytes());
                    }
                    tracing::warn!(target: "spillway::run", vm = %self.vm, request = m.req, error = %e, "vhost-user request refused; closing the connection");
                    return format!("request {} refused: {e}", m.req);
                }
            }
        }
    }
}
