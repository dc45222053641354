//! The `spillway ctl` control socket: line-delimited JSON over a Unix stream socket.
//!
//! A client writes one [`CtlRequest`] per line and reads one [`CtlResponse`] line back; a
//! connection may carry several requests in turn. The wire form is plain serde JSON:
//!
//! ```text
//! -> {"cmd":"flows","limit":10,"owner":"spill"}
//! <- {"ok":true,"body":[...]}
//! -> {"cmd":"frobnicate"}
//! <- {"ok":false,"error":"bad request: unknown variant `frobnicate`, expected one of ...","body":null}
//! ```
//!
//! Threads and ownership: the data-plane loop owns all fabric state, so the socket threads never
//! touch it. [`CtlServer`] runs an accept thread and one thread per connection; a connection
//! thread parses each line and hands a [`CtlCall`] (the request plus a one-shot reply channel)
//! to a bounded queue that the loop drains with [`CtlServer::try_recv`] between batches. The
//! loop answers with [`CtlCall::respond`], which never blocks. Requests that fail to parse are
//! answered by the connection thread itself, and a loop that does not answer within
//! [`CtlConfig::reply_timeout`] yields `ok:false, error:"timed out: ..."`, so a stuck daemon
//! cannot hang `spillway ctl`.
//!
//! Exclusivity: the server holds an exclusive `flock` on `PATH.lock` for its lifetime, and before
//! binding it removes a leftover socket file only if nothing answers on it. Two daemons on one
//! path therefore fail cleanly ("another instance is running"), even when they start at the same
//! moment next to a stale socket file. A file that is not a socket is never removed or replaced.
//! The socket is created with mode 0600 whatever the umask ([`crate::host::unixsock::bind`]: it
//! appears at its path only with that mode), and every connection's peer is checked with
//! `SO_PEERCRED`: only root and the socket's owner (our effective uid) are served; anyone else
//! is closed at once and logged.
//!
//! ```no_run
//! use std::time::Duration;
//! use spillway_rt::ops::ctl::{ctl_call, CtlRequest, CtlResponse, CtlServer};
//!
//! let server = CtlServer::bind("/run/spillway/ctl.sock".as_ref()).unwrap();
//! // In the data-plane loop, between batches:
//! while let Some(call) = server.try_recv() {
//!     let response = match call.request {
//!         CtlRequest::Status => CtlResponse::ok(serde_json::json!({"phase": "idle"})),
//!         _ => CtlResponse::error("not supported yet"),
//!     };
//!     call.respond(response);
//! }
//! // In `spillway ctl status`:
//! let status = ctl_call(server.path(), &CtlRequest::Status, Duration::from_secs(10));
//! ```

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::ops::service::{Readiness, ServiceThread, StopWatch};

/// Longest response line [`ctl_call`] accepts (flow dumps can be large, but not unbounded).
pub const RESPONSE_LINE_MAX: usize = 64 * 1024 * 1024;

/// Most rows a flow dump answers (`limit` above it is capped to it).
pub const FLOWS_LIMIT_MAX: usize = 100_000;
/// Rows a flow dump answers when the request gives no `limit`.
pub const FLOWS_LIMIT_DEFAULT: usize = 1_000;

/// Who serves a connection, as a flow dump names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FlowOwner {
    /// The DPU owns it and it has live entries in the hardware fast path.
    DpuHw,
    /// The DPU owns it and its SoC slow path serves it (no hardware entry).
    DpuSoc,
    /// The spill plane owns it.
    Spill,
}

impl FlowOwner {
    /// Every owner, in the order a dump lists them in help texts.
    pub const ALL: [FlowOwner; 3] = [FlowOwner::DpuHw, FlowOwner::DpuSoc, FlowOwner::Spill];

    /// The name on the wire and in the dump (`dpu-hw`, `dpu-soc`, `spill`).
    pub fn name(self) -> &'static str {
        match self {
            FlowOwner::DpuHw => "dpu-hw",
            FlowOwner::DpuSoc => "dpu-soc",
            FlowOwner::Spill => "spill",
        }
    }

    /// The owner called `name`, if any.
    pub fn from_name(name: &str) -> Option<FlowOwner> {
        FlowOwner::ALL.into_iter().find(|o| o.name() == name)
    }
}

/// A command sent to the daemon. Serialised internally tagged: `{"cmd":"set_policy",
/// "placement":"spill"}`. Unknown fields are rejected so that a typo is an error, not a
/// silently ignored option.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case", deny_unknown_fields)]
pub enum CtlRequest {
    /// The daemon's state: phase, owners, table occupancy.
    Status,
    /// A dump of flow entries.
    Flows {
        /// At most this many rows ([`FLOWS_LIMIT_DEFAULT`] if absent; capped to
        /// [`FLOWS_LIMIT_MAX`]).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        limit: Option<usize>,
        /// Only flows with this owner; an unknown name is a request error.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        owner: Option<FlowOwner>,
    },
    /// Start spilling: bring up the spill plane and install redirect rules.
    Activate,
    /// Stop spilling: recall flows to the DPU and release the plane.
    Release,
    /// Clear a forced activation or release: the scheduler decides again.
    Auto,
    /// Pre-warm: bring a plane up and keep it synced in shadow, not active.
    Prepare,
    /// Re-read the vSwitch policy from the testbed file and apply it (bumps the policy epoch).
    Reload,
    /// Change the placement policy.
    SetPolicy {
        /// The policy's name, interpreted by the daemon.
        placement: String,
    },
    /// The current metrics.
    Metrics,
    /// Switch the spill plane's delivery into shared-memory VMs (vATC on or off).
    Vatc {
        /// Deliver straight into VM memory.
        on: bool,
    },
    /// The host cores its tenants' VMs use now (what the host's VM scheduler reports): URSched
    /// isolates plane cores only from the rest.
    TenantCores {
        /// Cores, at most the host's.
        cores: u32,
    },
    /// Replace the active spill plane under load: a plane started in the warm slot (running
    /// `binary` if given, which every later plane then runs) is synced, the active plane hands
    /// its connections back, the redirect rules flip to the new one and the old one retires.
    Upgrade {
        /// An absolute path to the binary the new plane runs.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        binary: Option<String>,
    },
}

/// The answer to one request. `body` is the daemon's business (status JSON, flow rows, ...);
/// on failure `ok` is false, `error` says why and `body` is usually `null`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CtlResponse {
    /// Whether the request succeeded.
    pub ok: bool,
    /// What went wrong, when `ok` is false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The result.
    #[serde(default)]
    pub body: serde_json::Value,
}

impl CtlResponse {
    /// A success carrying `body`.
    pub fn ok(body: serde_json::Value) -> Self {
        CtlResponse {
            ok: true,
            error: None,
            body,
        }
    }

    /// A failure with a message.
    pub fn error(message: impl Into<String>) -> Self {
        CtlResponse {
            ok: false,
            error: Some(message.into()),
            body: serde_json::Value::Null,
        }
    }

    /// The response as one JSON line, newline included.
    fn to_line(&self) -> Vec<u8> {
        let mut line = serde_json::to_vec(self)
            .expect("a CtlResponse always serialises: its body is a serde_json::Value");
        line.push(b'\n');
        line
    }
}

/// One request waiting for the application, with the channel its answer goes back on.
#[derive(Debug)]
pub struct CtlCall {
    /// The parsed request.
    pub request: CtlRequest,
    /// Where the answer goes (capacity 1). Prefer [`CtlCall::respond`].
    pub reply: SyncSender<CtlResponse>,
}

impl CtlCall {
    /// Sends the answer. Never blocks; if the client has timed out or gone, the answer is
    /// dropped, which is the right outcome for a control command's reply.
    pub fn respond(self, response: CtlResponse) {
        let _ = self.reply.try_send(response);
    }
}

/// Errors of the control socket, server and client side.
#[derive(Debug, thiserror::Error)]
pub enum CtlError {
    /// Another daemon holds the socket.
    #[error("another instance is running at {}", path.display())]
    AlreadyRunning {
        /// The socket path.
        path: PathBuf,
    },
    /// Something other than a socket is in the way; it is not ours to delete.
    #[error("{} exists and is not a socket; refusing to replace it", path.display())]
    NotASocket {
        /// The path.
        path: PathBuf,
    },
    /// Creating, locking or binding the socket failed.
    #[error("cannot listen on control socket {}: {source}", path.display())]
    Bind {
        /// The socket path (or its lock file).
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// Creating the wake-up pipe or the accept thread failed.
    #[error("cannot start the control socket thread: {source}")]
    Start {
        /// The OS error.
        source: io::Error,
    },
    /// The client could not connect. The OS error is the `source`, not part of the message:
    /// a reporter that prints the cause chain (`{:#}`) would print it twice.
    #[error(
        "cannot connect to control socket {} (is the spillway daemon running?)",
        path.display()
    )]
    Connect {
        /// The socket path.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// Sending or receiving failed after connecting (the OS error is the `source`).
    #[error("control socket {}", path.display())]
    Io {
        /// The socket path.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// No complete answer arrived in time.
    #[error("no answer on control socket {} within {timeout:?}", path.display())]
    TimedOut {
        /// The socket path.
        path: PathBuf,
        /// The time allowed.
        timeout: Duration,
    },
    /// The daemon closed the connection without a complete answer.
    #[error("the daemon closed control socket {} without answering", path.display())]
    Closed {
        /// The socket path.
        path: PathBuf,
    },
    /// The answer was not a valid response line.
    #[error("invalid answer on control socket {}: {source}", path.display())]
    BadResponse {
        /// The socket path.
        path: PathBuf,
        /// What did not parse.
        source: serde_json::Error,
    },
    /// The answer exceeded [`RESPONSE_LINE_MAX`].
    #[error("answer on control socket {} exceeds {limit} bytes", path.display())]
    ResponseTooLong {
        /// The socket path.
        path: PathBuf,
        /// The limit.
        limit: usize,
    },
}

impl From<CtlError> for io::Error {
    fn from(e: CtlError) -> Self {
        let kind = match &e {
            CtlError::AlreadyRunning { .. } => io::ErrorKind::AddrInUse,
            CtlError::NotASocket { .. } => io::ErrorKind::AlreadyExists,
            CtlError::TimedOut { .. } => io::ErrorKind::TimedOut,
            CtlError::Closed { .. } => io::ErrorKind::UnexpectedEof,
            CtlError::BadResponse { .. } | CtlError::ResponseTooLong { .. } => {
                io::ErrorKind::InvalidData
            }
            CtlError::Bind { source, .. }
            | CtlError::Start { source }
            | CtlError::Connect { source, .. }
            | CtlError::Io { source, .. } => source.kind(),
        };
        io::Error::new(kind, e)
    }
}

/// Settings of a [`CtlServer`]; every resource has a limit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CtlConfig {
    /// How long a request may wait for the application's answer.
    pub reply_timeout: Duration,
    /// Longest request line in bytes; a longer one gets an error and the connection is closed.
    pub line_max: usize,
    /// Connections served at once; further ones get an error line and are closed.
    pub connections_max: usize,
    /// Requests queued for the application (at least 1); beyond that, requests are answered
    /// "busy".
    pub queue_max: usize,
    /// A connection with no request for this long is closed.
    pub idle_timeout: Duration,
    /// Write timeout for responses, so a client that stops reading cannot pin a thread.
    pub write_timeout: Duration,
}

impl Default for CtlConfig {
    /// 5 s replies, 64 KiB lines, 16 connections, 64 queued requests, 60 s idle, 5 s writes.
    fn default() -> Self {
        CtlConfig {
            reply_timeout: Duration::from_secs(5),
            line_max: 64 * 1024,
            connections_max: 16,
            queue_max: 64,
            idle_timeout: Duration::from_secs(60),
            write_timeout: Duration::from_secs(5),
        }
    }
}

/// A listening control socket. Dropping it removes the socket file and stops its threads.
#[derive(Debug)]
pub struct CtlServer {
    path: PathBuf,
    calls: Receiver<CtlCall>,
    refused: Arc<Refusals>,
    service: ServiceThread,
    /// Held for the server's lifetime; the lock is what makes the path ours. Never deleted, so
    /// that no second daemon can lock a fresh file while the first still holds the old inode.
    _lock: File,
}

impl CtlServer {
    /// Listens at `path` with default settings.
    pub fn bind(path: &Path) -> Result<Self, CtlError> {
        Self::bind_with(path, CtlConfig::default())
    }

    /// Listens at `path` with explicit settings.
    pub fn bind_with(path: &Path, config: CtlConfig) -> Result<Self, CtlError> {
        // A path that names something other than a socket is refused before the lock file is
        // created next to it: a mistaken `ctl_socket` then leaves no trace at all.
        if std::fs::symlink_metadata(path).is_ok_and(|m| !m.file_type().is_socket()) {
            return Err(CtlError::NotASocket {
                path: path.to_owned(),
            });
        }
        let lock = acquire_lock(path)?;
        remove_stale_socket(path)?;
        let bind_error = |source| CtlError::Bind {
            path: path.to_owned(),
            source,
        };
        // Mode 0600 from the moment it has its name; never replaces a file that appeared since.
        let listener = crate::host::unixsock::bind(path, 0o600, None).map_err(bind_error)?;
        // From here on the socket file exists; remove it again if the rest of the setup fails.
        let refused = Arc::new(Refusals::default());
        match start(listener, path, config, refused.clone()) {
            Ok((service, calls)) => {
                tracing::info!(path = %path.display(), "control socket listening");
                Ok(CtlServer {
                    path: path.to_owned(),
                    calls,
                    refused,
                    service,
                    _lock: lock,
                })
            }
            Err(e) => {
                let _ = std::fs::remove_file(path);
                Err(e)
            }
        }
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The next waiting request, if any. Call from the loop that owns the state.
    pub fn try_recv(&self) -> Option<CtlCall> {
        self.calls.try_recv().ok()
    }

    /// Connections refused so far, by reason, under their metric names: `ctl.refused.peer`
    /// (neither root nor our uid, or credentials unreadable) and `ctl.refused.busy`
    /// (`connections_max` reached).
    pub fn refused(&self) -> [(&'static str, u64); 2] {
        [
            (
                "ctl.refused.peer",
                self.refused.peer.load(Ordering::Relaxed),
            ),
            (
                "ctl.refused.busy",
                self.refused.busy.load(Ordering::Relaxed),
            ),
        ]
    }

    /// The request queue itself, for a loop that wants to block on it (`recv_timeout`).
    pub fn calls(&self) -> &Receiver<CtlCall> {
        &self.calls
    }

    /// Removes the socket file, stops accepting, and joins every thread.
    pub fn shutdown(mut self) {
        self.stop_and_join();
    }

    fn stop_and_join(&mut self) {
        if !self.service.is_running() {
            return;
        }
        // Remove the file first, so that new clients fail fast with "not running" rather than
        // queueing on a listener that is about to close.
        if let Err(error) = std::fs::remove_file(&self.path)
            && error.kind() != io::ErrorKind::NotFound
        {
            tracing::warn!(path = %self.path.display(), %error, "cannot remove control socket");
        }
        self.service.stop_and_join();
    }
}

impl Drop for CtlServer {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}

/// Restricts the socket's mode, creates the queue and starts the accept thread.
fn start(
    listener: UnixListener,
    path: &Path,
    config: CtlConfig,
    refused: Arc<Refusals>,
) -> Result<(ServiceThread, Receiver<CtlCall>), CtlError> {
    let bind_error = |source| CtlError::Bind {
        path: path.to_owned(),
        source,
    };
    // Nonblocking so that a client vanishing between poll and accept cannot block the accept
    // thread (and with it, shutdown).
    listener.set_nonblocking(true).map_err(bind_error)?;
    // Capacity 0 would make a rendezvous channel that `try_send` can never fill while the loop
    // is busy, i.e. every request "busy"; one slot is the least that works.
    let (calls_tx, calls_rx) = mpsc::sync_channel(config.queue_max.max(1));
    let service = ServiceThread::spawn("spillway-ctl", "control socket", move |watch| {
        accept_loop(listener, calls_tx, watch, config, &refused)
    })
    .map_err(|source| CtlError::Start { source })?;
    Ok((service, calls_rx))
}

/// Connections the accept thread refused, by reason (read by [`CtlServer::refused`]).
#[derive(Debug, Default)]
struct Refusals {
    peer: AtomicU64,
    busy: AtomicU64,
}

impl Refusals {
    /// Counts one refusal; true for the 1st, 2nd, 4th, 8th, ... of its kind, the ones worth
    /// a log line (a local user connecting in a loop must not fill the log).
    fn count(counter: &AtomicU64) -> bool {
        (counter.fetch_add(1, Ordering::Relaxed) + 1).is_power_of_two()
    }
}

/// `PATH.lock`, the file whose `flock` owns the socket path.
fn lock_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".lock");
    PathBuf::from(name)
}

fn acquire_lock(path: &Path) -> Result<File, CtlError> {
    let lock_path = lock_path(path);
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(&lock_path)
        .map_err(|source| CtlError::Bind {
            path: lock_path.clone(),
            source,
        })?;
    match lock.try_lock() {
        Ok(()) => Ok(lock),
        Err(TryLockError::WouldBlock) => Err(CtlError::AlreadyRunning {
            path: path.to_owned(),
        }),
        Err(TryLockError::Error(source)) => Err(CtlError::Bind {
            path: lock_path,
            source,
        }),
    }
}

/// Removes a socket file nobody listens on. Someone answering (a daemon that does not use the
/// lock file, e.g. an older version) means the path is taken; a non-socket is left alone.
fn remove_stale_socket(path: &Path) -> Result<(), CtlError> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(CtlError::Bind {
                path: path.to_owned(),
                source,
            });
        }
    };
    if !meta.file_type().is_socket() {
        return Err(CtlError::NotASocket {
            path: path.to_owned(),
        });
    }
    match UnixStream::connect(path) {
        Ok(_) => Err(CtlError::AlreadyRunning {
            path: path.to_owned(),
        }),
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
            tracing::info!(path = %path.display(), "removing stale control socket");
            std::fs::remove_file(path).map_err(|source| CtlError::Bind {
                path: path.to_owned(),
                source,
            })
        }
        Err(source) => Err(CtlError::Bind {
            path: path.to_owned(),
            source,
        }),
    }
}

fn accept_loop(
    listener: UnixListener,
    calls: SyncSender<CtlCall>,
    watch: StopWatch,
    config: CtlConfig,
    refused: &Refusals,
) {
    let mut connections: Vec<JoinHandle<()>> = Vec::new();
    loop {
        if !watch.wait_listener(&listener, "control socket") {
            break;
        }
        let stream = match listener.accept() {
            Ok((stream, _addr)) => stream,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(error) => {
                // Typically EMFILE: back off instead of spinning on a readable listener.
                tracing::warn!(%error, "control socket: accept failed");
                if !matches!(
                    watch.sleep_until(Instant::now() + Duration::from_millis(100)),
                    Ok(false)
                ) {
                    break;
                }
                continue;
            }
        };
        // Root and the socket's owner only: the mode already keeps others out, this holds
        // even if the mode is changed or the socket is reached through an inherited fd.
        let euid = rustix::process::geteuid().as_raw();
        match crate::host::unixsock::peer_cred(&stream) {
            Ok(c) if c.uid == 0 || c.uid == euid => {}
            Ok(c) => {
                if Refusals::count(&refused.peer) {
                    tracing::warn!(
                        pid = c.pid,
                        uid = c.uid,
                        refused = refused.peer.load(Ordering::Relaxed),
                        "control socket: refused a peer that is neither root nor our uid"
                    );
                }
                continue;
            }
            Err(error) => {
                if Refusals::count(&refused.peer) {
                    tracing::warn!(%error, "control socket: cannot read the peer's credentials; refused");
                }
                continue;
            }
        }
        connections.retain(|c| !c.is_finished());
        if connections.len() >= config.connections_max {
            if Refusals::count(&refused.busy) {
                tracing::warn!(
                    refused = refused.busy.load(Ordering::Relaxed),
                    connections_max = config.connections_max,
                    "control socket: too many connections; refused"
                );
            }
            reject_busy(stream, &watch, config.connections_max);
            continue;
        }
        let conn = Connection {
            calls: calls.clone(),
            watch: watch.clone(),
            config: config.clone(),
        };
        let spawned = std::thread::Builder::new()
            .name("spillway-ctl-conn".into())
            .spawn(move || conn.serve(stream));
        match spawned {
            Ok(handle) => connections.push(handle),
            Err(error) => tracing::warn!(%error, "control socket: cannot spawn a thread"),
        }
    }
    for connection in connections {
        if connection.join().is_err() {
            tracing::error!("control connection thread panicked");
        }
    }
}

/// Answers from the accept thread, with a short write timeout and a short drain, so that a
/// slow client cannot stall accepting for long.
fn reject_busy(mut stream: UnixStream, watch: &StopWatch, connections_max: usize) {
    if stream.set_nonblocking(false).is_err()
        || stream
            .set_write_timeout(Some(Duration::from_millis(200)))
            .is_err()
    {
        return;
    }
    let response = CtlResponse::error(format!(
        "too many control connections (limit {connections_max}); try again"
    ));
    if stream.write_all(&response.to_line()).is_ok() {
        linger_close(stream, watch, Duration::from_millis(100));
    }
}

/// One connection's thread state.
struct Connection {
    calls: SyncSender<CtlCall>,
    watch: StopWatch,
    config: CtlConfig,
}

impl Connection {
    fn serve(self, mut stream: UnixStream) {
        if stream.set_nonblocking(false).is_err()
            || stream
                .set_write_timeout(Some(self.config.write_timeout))
                .is_err()
        {
            return;
        }
        // `pending` holds bytes read but not yet consumed as lines; it never grows beyond
        // `line_max` plus one read chunk.
        let mut pending: Vec<u8> = Vec::new();
        let mut chunk = [0u8; 4096];
        let mut idle_deadline = Instant::now() + self.config.idle_timeout;
        loop {
            // Answer every complete line already received, in order.
            while let Some(newline) = pending.iter().position(|&b| b == b'\n') {
                let too_long = newline > self.config.line_max;
                let response = if too_long {
                    Some(self.too_long())
                } else {
                    self.handle_line(&pending[..newline])
                };
                pending.drain(..=newline);
                if let Some(response) = response {
                    if stream.write_all(&response.to_line()).is_err() {
                        return;
                    }
                    idle_deadline = Instant::now() + self.config.idle_timeout;
                }
                if too_long {
                    self.close(stream);
                    return;
                }
            }
            if pending.len() > self.config.line_max {
                let _ = stream.write_all(&self.too_long().to_line());
                self.close(stream);
                return;
            }
            match self.watch.wait_readable(&stream, Some(idle_deadline)) {
                Ok(Readiness::Ready) => {}
                Ok(Readiness::Stopped | Readiness::TimedOut) | Err(_) => return,
            }
            match stream.read(&mut chunk) {
                Ok(0) => {
                    // EOF: a last request without a trailing newline still gets its answer.
                    if let Some(response) = self.handle_line(&pending) {
                        let _ = stream.write_all(&response.to_line());
                    }
                    return;
                }
                Ok(n) => pending.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return,
            }
        }
    }

    fn too_long(&self) -> CtlResponse {
        CtlResponse::error(format!(
            "request line longer than {} bytes; closing the connection",
            self.config.line_max
        ))
    }

    fn close(&self, stream: UnixStream) {
        linger_close(stream, &self.watch, Duration::from_millis(200));
    }

    /// The answer to one line, or `None` for a blank line (ignored, so `\r\n` and stray blank
    /// lines from hand-typed sessions do not produce errors).
    fn handle_line(&self, line: &[u8]) -> Option<CtlResponse> {
        let line = line.trim_ascii();
        if line.is_empty() {
            return None;
        }
        let request: CtlRequest = match serde_json::from_slice(line) {
            Ok(request) => request,
            Err(e) => return Some(CtlResponse::error(format!("bad request: {e}"))),
        };
        Some(self.dispatch(request))
    }

    /// Queues the request for the application and waits for its answer.
    fn dispatch(&self, request: CtlRequest) -> CtlResponse {
        let (reply, answer) = mpsc::sync_channel(1);
        match self.calls.try_send(CtlCall { request, reply }) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                return CtlResponse::error(format!(
                    "busy: {} requests already queued; try again",
                    self.config.queue_max
                ));
            }
            Err(TrySendError::Disconnected(_)) => {
                return CtlResponse::error("the daemon is shutting down");
            }
        }
        let deadline = Instant::now() + self.config.reply_timeout;
        loop {
            // Wait in short slices so that a server shutdown does not wait out the full reply
            // timeout of every connection.
            let left = deadline.saturating_duration_since(Instant::now());
            match answer.recv_timeout(left.min(Duration::from_millis(100))) {
                Ok(response) => return response,
                Err(RecvTimeoutError::Disconnected) => {
                    return CtlResponse::error("the daemon dropped the request without answering");
                }
                Err(RecvTimeoutError::Timeout) => {
                    if Instant::now() >= deadline {
                        return CtlResponse::error(format!(
                            "timed out: no answer from the daemon within {:?}",
                            self.config.reply_timeout
                        ));
                    }
                    if self.watch.is_stopped() {
                        return CtlResponse::error("the daemon is shutting down");
                    }
                }
            }
        }
    }
}

/// Sends FIN, then discards what the client still sends for up to `linger` (at most 1 MiB):
/// closing a socket with unread input makes the kernel reset the connection, and the client
/// could lose the error line it has not read yet.
fn linger_close(mut stream: UnixStream, watch: &StopWatch, linger: Duration) {
    if stream.shutdown(Shutdown::Write).is_err() {
        return;
    }
    let deadline = Instant::now() + linger;
    let mut sink = [0u8; 4096];
    let mut drained = 0usize;
    while drained < 1024 * 1024 {
        match watch.wait_readable(&stream, Some(deadline)) {
            Ok(Readiness::Ready) => match stream.read(&mut sink) {
                Ok(0) | Err(_) => return,
                Ok(n) => drained += n,
            },
            Ok(Readiness::Stopped | Readiness::TimedOut) | Err(_) => return,
        }
    }
}

/// Sends one request to the daemon at `path` and waits up to `timeout` in total for the answer.
///
/// The server's own reply timeout is 5 s by default; pick `timeout` longer than that so a slow
/// daemon is reported as the server's `ok:false, "timed out"` answer rather than a client-side
/// [`CtlError::TimedOut`].
pub fn ctl_call(
    path: &Path,
    request: &CtlRequest,
    timeout: Duration,
) -> Result<CtlResponse, CtlError> {
    let deadline = Instant::now() + timeout;
    let timed_out = || CtlError::TimedOut {
        path: path.to_owned(),
        timeout,
    };
    let io_error = |source: io::Error| match source.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => timed_out(),
        _ => CtlError::Io {
            path: path.to_owned(),
            source,
        },
    };
    let mut stream = UnixStream::connect(path).map_err(|source| CtlError::Connect {
        path: path.to_owned(),
        source,
    })?;
    // A zero timeout means "block forever" to the socket API, so keep at least 1 ms.
    let at_least_1ms = |d: Duration| d.max(Duration::from_millis(1));
    stream
        .set_write_timeout(Some(at_least_1ms(timeout)))
        .map_err(io_error)?;
    let mut line = serde_json::to_vec(request).expect("a CtlRequest always serialises");
    line.push(b'\n');
    // A server that refuses the connection (too many clients) answers and closes at once, so
    // the write can fail with a broken pipe while its answer already waits to be read: read
    // first, and report the write error only if there is no answer.
    let write_error = match stream.write_all(&line) {
        Ok(()) => None,
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
            ) =>
        {
            Some(e)
        }
        Err(e) => return Err(io_error(e)),
    };
    let closed = |write_error: Option<io::Error>| match write_error {
        Some(source) => CtlError::Io {
            path: path.to_owned(),
            source,
        },
        None => CtlError::Closed {
            path: path.to_owned(),
        },
    };

    let mut answer: Vec<u8> = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(timed_out());
        }
        stream
            .set_read_timeout(Some(at_least_1ms(left)))
            .map_err(io_error)?;
        let n = match stream.read(&mut chunk) {
            Ok(0) => return Err(closed(write_error)),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) if write_error.is_some() && e.kind() == io::ErrorKind::ConnectionReset => {
                return Err(closed(write_error));
            }
            Err(e) => return Err(io_error(e)),
        };
        let scan_from = answer.len();
        answer.extend_from_slice(&chunk[..n]);
        if let Some(newline) = answer[scan_from..].iter().position(|&b| b == b'\n') {
            let end = scan_from + newline;
            return serde_json::from_slice(&answer[..end]).map_err(|source| {
                CtlError::BadResponse {
                    path: path.to_owned(),
                    source,
                }
            });
        }
        if answer.len() > RESPONSE_LINE_MAX {
            return Err(CtlError::ResponseTooLong {
                path: path.to_owned(),
                limit: RESPONSE_LINE_MAX,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_use_the_documented_wire_form() {
        let cases = [
            (CtlRequest::Status, r#"{"cmd":"status"}"#),
            (
                CtlRequest::Flows {
                    limit: Some(10),
                    owner: Some(FlowOwner::Spill),
                },
                r#"{"cmd":"flows","limit":10,"owner":"spill"}"#,
            ),
            (
                CtlRequest::Flows {
                    limit: None,
                    owner: None,
                },
                r#"{"cmd":"flows"}"#,
            ),
            (CtlRequest::Activate, r#"{"cmd":"activate"}"#),
            (CtlRequest::Release, r#"{"cmd":"release"}"#),
            (
                CtlRequest::SetPolicy {
                    placement: "dpu_only".into(),
                },
                r#"{"cmd":"set_policy","placement":"dpu_only"}"#,
            ),
            (CtlRequest::Metrics, r#"{"cmd":"metrics"}"#),
        ];
        for (request, json) in cases {
            assert_eq!(serde_json::to_string(&request).unwrap(), json);
            assert_eq!(serde_json::from_str::<CtlRequest>(json).unwrap(), request);
        }
    }

    #[test]
    fn unknown_fields_and_commands_are_rejected_with_the_expected_names() {
        let typo = serde_json::from_str::<CtlRequest>(r#"{"cmd":"flows","limt":3}"#)
            .unwrap_err()
            .to_string();
        assert!(typo.contains("limt"), "{typo}");
        let unknown = serde_json::from_str::<CtlRequest>(r#"{"cmd":"frob"}"#)
            .unwrap_err()
            .to_string();
        assert!(unknown.contains("expected one of"), "{unknown}");
        assert!(unknown.contains("set_policy"), "{unknown}");
        let missing = serde_json::from_str::<CtlRequest>(r#"{"cmd":"set_policy"}"#)
            .unwrap_err()
            .to_string();
        assert!(missing.contains("placement"), "{missing}");
    }

    #[test]
    fn flow_owners_have_one_name_each_on_the_wire_and_in_the_dump() {
        for owner in FlowOwner::ALL {
            let wire = serde_json::to_string(&owner).unwrap();
            assert_eq!(wire, format!("\"{}\"", owner.name()));
            assert_eq!(FlowOwner::from_name(owner.name()), Some(owner));
        }
        assert_eq!(FlowOwner::from_name("dpu"), None);
        let bad = serde_json::from_str::<CtlRequest>(r#"{"cmd":"flows","owner":"nobody"}"#)
            .unwrap_err()
            .to_string();
        assert!(bad.contains("nobody") && bad.contains("dpu-soc"), "{bad}");
    }

    #[test]
    fn responses_omit_absent_error() {
        let ok = CtlResponse::ok(serde_json::json!({"phase": "idle"}));
        assert_eq!(
            serde_json::to_string(&ok).unwrap(),
            r#"{"ok":true,"body":{"phase":"idle"}}"#
        );
        let err: CtlResponse = serde_json::from_str(r#"{"ok":false,"error":"x"}"#).unwrap();
        assert_eq!(err, CtlResponse::error("x"));
    }

    #[test]
    fn lock_path_appends_suffix() {
        assert_eq!(
            lock_path(Path::new("/run/spillway/ctl.sock")),
            Path::new("/run/spillway/ctl.sock.lock")
        );
    }
}
