//! The Prometheus `/metrics` endpoint of a running process (an emulated DPU, a spill plane): the
//! HTTP/1.1 server (connections, their limits, request parsing, responses). What it serves, the
//! samples, the snapshot the data plane publishes and the text format, is the (private)
//! `ops::exposition` module's, re-exported here so that `ops::metrics` stays the one path for
//! both.
//!
//! [`MetricsServer`] serves `GET /metrics` from a background thread with a deliberately tiny
//! HTTP/1.1 implementation on `std::net`: one request per connection, `Connection: close`, a size
//! limit and one deadline for the whole request head (a client dribbling a byte at a time gets
//! no more time than one sending nothing), one deadline for the whole response, a cap on
//! concurrent connections and a smaller cap per client, so that one client holding idle
//! connections cannot take every slot. A client is the local user owning the connecting socket
//! for a loopback peer (asked from the kernel with `NETLINK_SOCK_DIAG`: a local user cannot
//! pass for another, and cannot evade the cap by connecting from 127.0.0.2, 127.0.0.3, ...), and
//! the source address otherwise. It refuses to listen on a non-loopback address unless
//! [`MetricsConfig::allow_remote`] is set, because the endpoint has no authentication. Shutting it
//! down (or dropping it) wakes every thread through a pipe and joins them, so nothing outlives the
//! server.
//!
//! ```no_run
//! use spillway_rt::ops::metrics::{MetricsServer, Sample, Snapshot};
//!
//! let snapshot = Snapshot::new("dpu");
//! let mut publisher = snapshot.publisher();
//! let server = MetricsServer::bind("127.0.0.1:9464".parse().unwrap(), snapshot).unwrap();
//! // In the data-plane loop, every ~100 ms:
//! let hw_packets = 42;
//! publisher.publish(|out| out.push(Sample::counter("dpu.hw.packets", hw_packets)));
//! # drop(server);
//! ```

pub use crate::ops::exposition::{
    CONTENT_TYPE, Exposition, MetricsSource, PREFIX, Sample, SampleKind, SampleValue, Snapshot,
    SnapshotPublisher, exposed_name,
};

use std::fmt::{self, Write as _};
use std::io::{self, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::OwnedFd;
use std::thread::JoinHandle;

use crate::ops::service::{Readiness, ServiceThread, StopWatch};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Errors starting the metrics endpoint.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// The address is not loopback and remote scrapes were not allowed.
    #[error(
        "metrics endpoint {addr} is not a loopback address; the endpoint has no authentication, \
         so serving other hosts needs allow_remote"
    )]
    NotLoopback {
        /// The refused address.
        addr: SocketAddr,
    },
    /// Binding the listening socket failed (port in use, permission).
    #[error("cannot listen for metrics scrapes on {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// The OS error.
        source: io::Error,
    },
    /// Creating the wake-up pipe or the server thread failed.
    #[error("cannot start the metrics server thread: {source}")]
    Start {
        /// The OS error.
        source: io::Error,
    },
}

impl From<MetricsError> for io::Error {
    fn from(e: MetricsError) -> Self {
        let kind = match &e {
            MetricsError::NotLoopback { .. } => io::ErrorKind::PermissionDenied,
            MetricsError::Bind { source, .. } | MetricsError::Start { source } => source.kind(),
        };
        io::Error::new(kind, e)
    }
}

/// Settings of a [`MetricsServer`]. Every resource the server uses has a limit here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetricsConfig {
    /// Where to listen; port 0 picks a free port (see [`MetricsServer::local_addr`]).
    pub addr: SocketAddr,
    /// Allow a non-loopback `addr`. Off by default: the endpoint is unauthenticated.
    pub allow_remote: bool,
    /// Connections served at once; further ones get `503` and are closed.
    pub connections_max: usize,
    /// Connections served at once for one client (a local user for a loopback peer, else a
    /// source address); further ones from that client get `503` and are closed. Below
    /// `connections_max`, so one client cannot deny the endpoint to the others.
    pub connections_per_client_max: usize,
    /// Longest accepted request head (request line and headers), in bytes; longer gets `431`.
    pub request_head_max: usize,
    /// Time a client has, in total, to send its request head; then it gets `408`.
    pub head_timeout: Duration,
    /// Time the whole response may take to write; then the connection is closed.
    pub write_timeout: Duration,
}

impl MetricsConfig {
    /// Defaults for `addr`: loopback only, 16 connections of which 4 per client, 8 KiB heads
    /// sent within 2 s, responses written within 5 s.
    pub fn new(addr: SocketAddr) -> Self {
        MetricsConfig {
            addr,
            allow_remote: false,
            connections_max: 16,
            connections_per_client_max: 4,
            request_head_max: 8 * 1024,
            head_timeout: Duration::from_secs(2),
            write_timeout: Duration::from_secs(5),
        }
    }
}

/// A running `/metrics` endpoint. Dropping it stops and joins its threads.
#[derive(Debug)]
pub struct MetricsServer {
    local_addr: SocketAddr,
    service: ServiceThread,
}

impl MetricsServer {
    /// Serves `source` on `addr` (loopback only) with default limits.
    pub fn bind(addr: SocketAddr, source: impl MetricsSource) -> Result<Self, MetricsError> {
        Self::bind_with(MetricsConfig::new(addr), source)
    }

    /// Serves `source` with explicit settings.
    pub fn bind_with(
        config: MetricsConfig,
        source: impl MetricsSource,
    ) -> Result<Self, MetricsError> {
        let addr = config.addr;
        if !addr.ip().is_loopback() && !config.allow_remote {
            return Err(MetricsError::NotLoopback { addr });
        }
        let bind_error = |source| MetricsError::Bind { addr, source };
        let listener = TcpListener::bind(addr).map_err(bind_error)?;
        // Created here, in the listener's network namespace: sock_diag answers for sockets of
        // its own namespace only.
        let owners = SocketOwners::new();
        let local_addr = listener.local_addr().map_err(bind_error)?;
        // Nonblocking so that a connection that vanishes between poll and accept cannot block
        // the accept thread (and with it, shutdown).
        listener.set_nonblocking(true).map_err(bind_error)?;
        let counters = Arc::new(ServerCounters::default());
        let exposition = Arc::new(Exposition::from_arc(Arc::new(WithServerCounters {
            source,
            counters: Arc::clone(&counters),
        })));
        let service = ServiceThread::spawn("spillway-metrics", "metrics server", move |watch| {
            accept_loop(listener, exposition, watch, config, owners, counters)
        })
        .map_err(|source| MetricsError::Start { source })?;
        tracing::info!(%local_addr, "metrics endpoint listening");
        Ok(MetricsServer {
            local_addr,
            service,
        })
    }

    /// The address actually bound (with the real port when 0 was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Stops accepting, wakes connections in progress, and joins every thread.
    pub fn shutdown(mut self) {
        self.service.stop_and_join();
    }
}

/// The server's own counters, exposed with the source's samples.
#[derive(Debug, Default)]
struct ServerCounters {
    /// Refused because `connections_max` connections were open.
    busy: AtomicU64,
    /// Refused because the client had `connections_per_client_max` open.
    client_busy: AtomicU64,
    /// Request heads not complete within `head_timeout`.
    head_timeout: AtomicU64,
    /// Responses not written within `write_timeout`.
    write_timeout: AtomicU64,
}

/// A source plus the server's counters.
struct WithServerCounters<S> {
    source: S,
    counters: Arc<ServerCounters>,
}

impl<S: MetricsSource> MetricsSource for WithServerCounters<S> {
    fn collect(&self, out: &mut Vec<Sample>) {
        self.source.collect(out);
        let c = &self.counters;
        for (reason, n) in [
            ("busy", &c.busy),
            ("client_busy", &c.client_busy),
            ("head_timeout", &c.head_timeout),
            ("write_timeout", &c.write_timeout),
        ] {
            out.push(
                Sample::counter("metrics.refused", n.load(Ordering::Relaxed))
                    .with_help("Scrape connections the metrics endpoint refused or cut, by reason")
                    .with_label("reason", reason),
            );
        }
    }
}

/// Who is on the other end of a connection, for [`MetricsConfig::connections_per_client_max`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Client {
    /// The local user owning the peer's socket (a loopback peer).
    Uid(u32),
    /// The peer's address (a remote peer, or a loopback one whose owner was not found).
    Addr(IpAddr),
}

/// Asks the kernel who owns a local TCP socket: one `SOCK_DIAG_BY_FAMILY` request for the exact
/// 4-tuple over a `NETLINK_SOCK_DIAG` socket (no privilege needed, answered synchronously, no
/// scan of `/proc/net/tcp`). Without the socket, every client is its address.
#[derive(Debug)]
struct SocketOwners {
    socket: Option<OwnedFd>,
    seq: u32,
}

/// `SOCK_DIAG_BY_FAMILY` from `linux/sock_diag.h`.
const SOCK_DIAG_BY_FAMILY: u16 = 20;
/// `NLM_F_REQUEST` from `linux/netlink.h`.
const NLM_F_REQUEST: u16 = 1;
/// `struct nlmsghdr` (16 bytes) + `struct inet_diag_req_v2` (56 bytes).
const DIAG_REQUEST_LEN: usize = 72;
/// Offset of `idiag_uid` in a reply: `struct nlmsghdr` (16) + `struct inet_diag_msg` up to it
/// (family, state, timer, retrans: 4; `inet_diag_sockid`: 48; expires, rqueue, wqueue: 12).
const DIAG_UID_OFFSET: usize = 16 + 4 + 48 + 12;

impl SocketOwners {
    fn new() -> Self {
        let socket = rustix::net::socket_with(
            rustix::net::AddressFamily::NETLINK,
            rustix::net::SocketType::DGRAM,
            rustix::net::SocketFlags::CLOEXEC,
            Some(rustix::net::netlink::SOCK_DIAG),
        );
        if let Err(error) = &socket {
            tracing::warn!(%error, "metrics endpoint: no sock_diag socket; clients are told apart by address only");
        }
        SocketOwners {
            socket: socket.ok(),
            seq: 0,
        }
    }

    /// The client behind a connection accepted on `local` from `peer`.
    fn client(&mut self, local: SocketAddr, peer: SocketAddr) -> Client {
        if peer.ip().is_loopback()
            && let Some(uid) = self.owner(peer, local)
        {
            return Client::Uid(uid);
        }
        Client::Addr(peer.ip())
    }

    /// The uid owning the TCP socket bound to `sock` and connected to `remote`.
    fn owner(&mut self, sock: SocketAddr, remote: SocketAddr) -> Option<u32> {
        let fd = self.socket.as_ref()?;
        self.seq = self.seq.wrapping_add(1);
        let mut req = [0u8; DIAG_REQUEST_LEN];
        req[0..4].copy_from_slice(&(DIAG_REQUEST_LEN as u32).to_ne_bytes());
        req[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
        req[6..8].copy_from_slice(&NLM_F_REQUEST.to_ne_bytes());
        req[8..12].copy_from_slice(&self.seq.to_ne_bytes());
        // inet_diag_req_v2: family, protocol, no extensions, every TCP state.
        req[16] = match sock {
            SocketAddr::V4(_) => libc::AF_INET as u8,
            SocketAddr::V6(_) => libc::AF_INET6 as u8,
        };
        req[17] = libc::IPPROTO_TCP as u8;
        req[20..24].copy_from_slice(&u32::MAX.to_ne_bytes());
        // inet_diag_sockid: ports and addresses in network order, any interface, no cookie.
        req[24..26].copy_from_slice(&sock.port().to_be_bytes());
        req[26..28].copy_from_slice(&remote.port().to_be_bytes());
        let octets = |a: IpAddr| -> [u8; 16] {
            let mut out = [0u8; 16];
            match a {
                IpAddr::V4(v4) => out[..4].copy_from_slice(&v4.octets()),
                IpAddr::V6(v6) => out = v6.octets(),
            }
            out
        };
        req[28..44].copy_from_slice(&octets(sock.ip()));
        req[44..60].copy_from_slice(&octets(remote.ip()));
        req[64..72].fill(0xff); // INET_DIAG_NOCOOKIE
        rustix::net::send(fd, &req, rustix::net::SendFlags::empty()).ok()?;
        // The kernel answers within the send; a reply with another sequence number is a late
        // answer to an earlier request and is skipped.
        let mut reply = [0u8; 512];
        for _ in 0..8 {
            let (n, _) =
                rustix::net::recv(fd, &mut reply[..], rustix::net::RecvFlags::DONTWAIT).ok()?;
            let msg = reply.get(..n)?;
            let word = |at: usize| -> Option<u32> {
                Some(u32::from_ne_bytes(msg.get(at..at + 4)?.try_into().ok()?))
            };
            if word(8)? != self.seq {
                continue;
            }
            let kind = u16::from_ne_bytes(msg.get(4..6)?.try_into().ok()?);
            return if kind == SOCK_DIAG_BY_FAMILY {
                word(DIAG_UID_OFFSET)
            } else {
                None // NLMSG_ERROR: no such socket (it closed meanwhile)
            };
        }
        None
    }
}

fn accept_loop(
    listener: TcpListener,
    exposition: Arc<Exposition>,
    watch: StopWatch,
    config: MetricsConfig,
    mut owners: SocketOwners,
    counters: Arc<ServerCounters>,
) {
    let local = listener.local_addr().ok();
    let mut connections: Vec<(JoinHandle<()>, Client)> = Vec::new();
    loop {
        if !watch.wait_listener(&listener, "metrics endpoint") {
            break;
        }
        let (stream, peer) = match listener.accept() {
            Ok(accepted) => accepted,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(error) => {
                // Typically EMFILE: back off instead of spinning on a listener that stays
                // readable.
                tracing::warn!(%error, "metrics endpoint: accept failed");
                if !matches!(
                    watch.sleep_until(Instant::now() + Duration::from_millis(100)),
                    Ok(false)
                ) {
                    break;
                }
                continue;
            }
        };
        connections.retain(|(c, _)| !c.is_finished());
        let client = match local {
            Some(local) => owners.client(local, peer),
            None => Client::Addr(peer.ip()),
        };
        let same_client = connections.iter().filter(|(_, c)| *c == client).count();
        if same_client >= config.connections_per_client_max {
            tracing::debug!(%peer, ?client, "metrics endpoint: too many connections from one client");
            counters.client_busy.fetch_add(1, Ordering::Relaxed);
            reject_busy(stream, "too many concurrent scrapes from this client\n");
            continue;
        }
        if connections.len() >= config.connections_max {
            tracing::debug!(%peer, "metrics endpoint: too many connections");
            counters.busy.fetch_add(1, Ordering::Relaxed);
            reject_busy(stream, "too many concurrent scrapes\n");
            continue;
        }
        let exposition = Arc::clone(&exposition);
        let conn_watch = watch.clone();
        let conn_config = config.clone();
        let conn_counters = Arc::clone(&counters);
        let spawned = std::thread::Builder::new()
            .name("spillway-metrics-conn".into())
            .spawn(move || {
                serve_connection(
                    stream,
                    &exposition,
                    &conn_watch,
                    &conn_config,
                    &conn_counters,
                )
            });
        match spawned {
            Ok(handle) => connections.push((handle, client)),
            Err(error) => tracing::warn!(%error, "metrics endpoint: cannot spawn a thread"),
        }
    }
    for (connection, _) in connections {
        if connection.join().is_err() {
            tracing::error!("metrics connection thread panicked");
        }
    }
}

/// Answers `503` from the accept thread without ever waiting on the client, so a client opening
/// connections as fast as it can does not slow accepting for the others: the answer is written
/// only if the socket takes it at once (a fresh socket's buffer does), what the client already
/// sent is discarded (closing with unread input would send RST, which can destroy the answer
/// before the client read it), and the socket is closed.
fn reject_busy(mut stream: TcpStream, why: &str) {
    if stream.set_nonblocking(true).is_err() {
        return;
    }
    let _ = stream.write_all(&Response::text(503, why).bytes(false));
    let _ = stream.shutdown(Shutdown::Write);
    let mut sink = [0u8; 1024];
    for _ in 0..16 {
        match stream.read(&mut sink) {
            Ok(n) if n > 0 => {}
            _ => break,
        }
    }
}

/// An HTTP response about to be written.
#[derive(Debug)]
struct Response {
    status: u16,
    content_type: &'static str,
    extra_header: Option<&'static str>,
    body: String,
}

impl Response {
    fn text(status: u16, body: &str) -> Self {
        Response {
            status,
            content_type: "text/plain; charset=utf-8",
            extra_header: None,
            body: body.to_owned(),
        }
    }

    fn reason(&self) -> &'static str {
        match self.status {
            200 => "OK",
            400 => "Bad Request",
            404 => "Not Found",
            405 => "Method Not Allowed",
            408 => "Request Timeout",
            431 => "Request Header Fields Too Large",
            500 => "Internal Server Error",
            503 => "Service Unavailable",
            _ => "Unknown",
        }
    }

    /// The response as sent (head, and the body unless `head_only`).
    fn bytes(&self, head_only: bool) -> Vec<u8> {
        let mut head = String::with_capacity(160 + self.body.len());
        // Writing into a String cannot fail.
        let _ = write!(
            head,
            "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n",
            self.status,
            self.reason(),
            self.content_type,
            self.body.len()
        );
        if let Some(extra) = self.extra_header {
            head.push_str(extra);
            head.push_str("\r\n");
        }
        head.push_str("\r\n");
        if !head_only {
            head.push_str(&self.body);
        }
        head.into_bytes()
    }

    /// Writes the response, all of it by `deadline` (one deadline for the whole response, not
    /// per write: a client reading a byte at a time cannot hold the connection longer).
    fn write_to(
        &self,
        stream: &mut TcpStream,
        head_only: bool,
        deadline: Instant,
    ) -> io::Result<()> {
        let bytes = self.bytes(head_only);
        let mut rest = &bytes[..];
        while !rest.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::ErrorKind::TimedOut.into());
            }
            stream.set_write_timeout(Some(left))?;
            match stream.write(rest) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => rest = &rest[n..],
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    return Err(io::ErrorKind::TimedOut.into());
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// What reading a request head produced.
enum Head {
    /// A complete head (without the blank line).
    Complete(Vec<u8>),
    /// The client closed or the server is stopping: nothing to answer.
    Gone,
    /// An answer is due without parsing (too large, too slow).
    Reject(Response),
}

fn serve_connection(
    mut stream: TcpStream,
    exposition: &Exposition,
    watch: &StopWatch,
    config: &MetricsConfig,
    counters: &ServerCounters,
) {
    // Accepted sockets do not inherit the listener's nonblocking flag on Linux, but make sure:
    // reads are gated by poll, writes by the write timeout set before each write.
    if stream.set_nonblocking(false).is_err() {
        return;
    }
    let head = match read_head(&mut stream, watch, config) {
        Ok(Head::Complete(head)) => head,
        Ok(Head::Gone) => return,
        Ok(Head::Reject(response)) => {
            if response.status == 408 {
                counters.head_timeout.fetch_add(1, Ordering::Relaxed);
            }
            let deadline = Instant::now() + config.write_timeout;
            let _ = response.write_to(&mut stream, false, deadline);
            linger_close(stream, watch, Duration::from_millis(200));
            return;
        }
        Err(error) => {
            tracing::debug!(%error, "metrics endpoint: reading request failed");
            return;
        }
    };
    let (response, head_only) = respond(&head, exposition);
    let deadline = Instant::now() + config.write_timeout;
    if let Err(error) = response.write_to(&mut stream, head_only, deadline) {
        if error.kind() == io::ErrorKind::TimedOut {
            counters.write_timeout.fetch_add(1, Ordering::Relaxed);
        }
        tracing::debug!(%error, "metrics endpoint: writing response failed");
        return;
    }
    linger_close(stream, watch, Duration::from_millis(200));
}

/// Reads until the blank line that ends the request head, within the size limit and deadline.
fn read_head(
    stream: &mut TcpStream,
    watch: &StopWatch,
    config: &MetricsConfig,
) -> io::Result<Head> {
    let deadline = Instant::now() + config.head_timeout;
    let mut head = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    loop {
        match watch.wait_readable(&*stream, Some(deadline))? {
            Readiness::Stopped => return Ok(Head::Gone),
            Readiness::TimedOut => {
                return Ok(Head::Reject(Response::text(408, "request head too slow\n")));
            }
            Readiness::Ready => {}
        }
        // Never read past the limit (plus one byte to tell "exactly full" from "too long").
        let room = (config.request_head_max + 1 - head.len()).min(chunk.len());
        let n = match stream.read(&mut chunk[..room]) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if n == 0 {
            // EOF before the end of the head: an empty connection (health checks, port scans)
            // gets nothing; a truncated head gets 400 in case the client still reads.
            return Ok(if head.is_empty() {
                Head::Gone
            } else {
                Head::Reject(Response::text(400, "incomplete request head\n"))
            });
        }
        // Search only where a terminator could newly appear.
        let search_from = head.len().saturating_sub(3);
        head.extend_from_slice(&chunk[..n]);
        if let Some(end) = find_head_end(&head[search_from..]) {
            head.truncate(search_from + end);
            return Ok(Head::Complete(head));
        }
        if head.len() > config.request_head_max {
            return Ok(Head::Reject(Response::text(
                431,
                "request head too large\n",
            )));
        }
    }
}

/// Index of the end of the head (start of the blank line) within `bytes`: `\r\n\r\n`, or a
/// bare `\n\n` from lenient clients.
fn find_head_end(bytes: &[u8]) -> Option<usize> {
    (0..bytes.len())
        .find(|&i| bytes[i..].starts_with(b"\r\n\r\n") || bytes[i..].starts_with(b"\n\n"))
}

/// Routes a complete request head. Returns the response and whether to omit the body (`HEAD`).
fn respond(head: &[u8], exposition: &Exposition) -> (Response, bool) {
    let Some((method, target)) = parse_head(head) else {
        return (Response::text(400, "malformed request\n"), false);
    };
    let head_only = match method {
        "GET" => false,
        "HEAD" => true,
        _ => {
            let mut response = Response::text(405, "only GET and HEAD are served\n");
            response.extra_header = Some("Allow: GET, HEAD");
            return (response, false);
        }
    };
    let path = target.split_once('?').map_or(target, |(path, _query)| path);
    if path != "/metrics" {
        return (Response::text(404, "not found; try /metrics\n"), head_only);
    }
    match exposition.render() {
        Ok(body) => (
            Response {
                status: 200,
                content_type: CONTENT_TYPE,
                extra_header: None,
                body,
            },
            head_only,
        ),
        Err(fmt::Error) => (
            Response::text(500, "encoding the metrics failed\n"),
            head_only,
        ),
    }
}

/// Checks the request line (`METHOD SP /target SP HTTP/1.x`) and the header syntax; returns the
/// method and target, or `None` for anything malformed.
fn parse_head(head: &[u8]) -> Option<(&str, &str)> {
    let head = std::str::from_utf8(head).ok()?;
    let mut lines = head.split('\n').map(|l| l.strip_suffix('\r').unwrap_or(l));
    let request_line = lines.next()?;
    let mut parts = request_line.split(' ');
    let (method, target, version) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some()
        || method.is_empty()
        || !method.bytes().all(|b| b.is_ascii_uppercase())
        || !target.starts_with('/')
        || !(version == "HTTP/1.1" || version == "HTTP/1.0")
    {
        return None;
    }
    for line in lines {
        let (name, _value) = line.split_once(':')?;
        if name.is_empty()
            || name
                .bytes()
                .any(|b| b.is_ascii_whitespace() || b.is_ascii_control())
        {
            return None;
        }
    }
    Some((method, target))
}

/// Closes gracefully: send FIN, then discard what the client still sends for a short while.
/// Closing a socket with unread input makes the kernel send RST, which can destroy the response
/// before the client read it (the classic lost-400 problem).
fn linger_close(mut stream: TcpStream, watch: &StopWatch, linger: Duration) {
    if stream.shutdown(Shutdown::Write).is_err() {
        return;
    }
    let deadline = Instant::now() + linger;
    let mut sink = [0u8; 1024];
    let mut drained = 0usize;
    while drained < 64 * 1024 {
        match watch.wait_readable(&stream, Some(deadline)) {
            Ok(Readiness::Ready) => match stream.read(&mut sink) {
                Ok(0) | Err(_) => return,
                Ok(n) => drained += n,
            },
            _ => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_heads_parse_strictly() {
        assert_eq!(
            parse_head(b"GET /metrics HTTP/1.1\r\nHost: x"),
            Some(("GET", "/metrics"))
        );
        assert_eq!(
            parse_head(b"GET /metrics HTTP/1.0"),
            Some(("GET", "/metrics"))
        );
        assert_eq!(parse_head(b"garbage"), None);
        assert_eq!(parse_head(b"GET metrics HTTP/1.1"), None);
        assert_eq!(parse_head(b"GET /metrics HTTP/2"), None);
        assert_eq!(parse_head(b"GET  /metrics HTTP/1.1"), None);
        assert_eq!(parse_head(b"GET /metrics HTTP/1.1\r\nno colon"), None);
        assert_eq!(parse_head(b"GET /metrics HTTP/1.1\r\nbad name: 1"), None);
        assert_eq!(parse_head(b"\xff\xfe /metrics HTTP/1.1"), None);
    }

    #[test]
    fn head_end_accepts_crlf_and_lf() {
        assert_eq!(find_head_end(b"GET / HTTP/1.1\r\n\r\n"), Some(14));
        assert_eq!(find_head_end(b"GET / HTTP/1.1\n\n"), Some(14));
        assert_eq!(find_head_end(b"GET / HTTP/1.1\r\n"), None);
    }
}
