//! `spillway traffic gen|sink`: a UDP flood generator and sink on plain sockets, meant to run
//! inside a VM's network namespace (`ip netns exec swvs-a spillway traffic gen ...`) and to be
//! faster than the switch it measures. iperf3's UDP mode sends one datagram per syscall and tops
//! out near 200 kpps on this machine's cores, which hides any switch faster than that.
//!
//! What makes it fast: `sendmmsg`/`recvmmsg` move a whole batch of datagrams (default 64) per
//! syscall, and nothing is allocated per packet: the datagram buffers, the `iovec`s and the
//! `mmsghdr`s are allocated once per run ([`MsgBatch`]) and reused for every batch.
//!
//! The datagram: `--size` is the UDP payload in bytes, 18..=1472. Over IPv4 on Ethernet the
//! frame is 42 bytes more (14 Ethernet + 20 IPv4 + 8 UDP), so 60..=1514 bytes without the FCS,
//! 64..=1518 with it: `--size 18` is the classic 64-byte frame, `--size 1472` fills a 1500-byte
//! MTU. IPv6 adds 20 bytes more, so there `--size` is at most 1452. The payload starts with a
//! 16-byte header ([`HEADER_LEN`]): a magic word, the flow index and the flow's sequence number,
//! little-endian; the rest is zeros.
//!
//! Flows: the generator opens one UDP socket per flow, each bound to its own ephemeral source
//! port and connected to `--dst` (so the kernel resolves the route once, and each flow is a
//! distinct 5-tuple for the switch). Batches go to the flows in turn: batch 1 to flow 0, batch
//! 2 to flow 1, ... Each flow numbers its datagrams from 0, so the sink can count loss and
//! reordering per flow from sequence numbers alone.
//!
//! Pacing (`--rate`): a token bucket on the monotonic clock, checked before every batch. It
//! starts empty, gains `rate` tokens per second, holds at most four batches, and a batch of `n`
//! datagrams goes only once `n` tokens are there, so after `t` seconds at most `rate * t`
//! datagrams have been sent: the pacer can fall short of the rate (a sender descheduled for
//! longer than four batches does not catch up) but never exceeds it. Paced batches hold at most
//! one millisecond of datagrams (`ceil(rate / 1000)`, within `--batch`), so that a low rate is
//! not sent as a few large bursts. Without `--rate` the generator sends flat out.
//!
//! The generator reports `sent` (datagrams the kernel took), `bytes` (their UDP payload),
//! `seconds` (from the start to the end of sending) and `pps`; `send_errors` counts sendmmsg
//! calls that failed outright (an interrupted call is retried, not counted) and `short_sends`
//! calls where the kernel took only part of the batch: it stops at the first datagram it
//! cannot send, which is how a missing sink's ICMP port unreachable shows.
//!
//! The sink counts every datagram it receives (`received`, `bytes`: UDP payload bytes); ours
//! (magic right, flow index below 1000) also per flow: `lost` is, summed over flows, the
//! highest sequence number seen plus one less the datagrams received, so loss after a flow's
//! last received datagram is not seen (compare `received` with the generator's `sent` for
//! that); `reordered` counts datagrams older than one already seen (a duplicate counts too).
//! Its `seconds` run from the first batch received to the last, and `pps` is `received` over
//! them. One generator per sink: flow indices of two generators would mix.

use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::json;
use spillway_rt::host::signals;
use spillway_vswitch::policy::echo;

use crate::flags::{Seconds, ranged};

/// First bytes of every datagram: tells the sink's datagrams from strays.
const MAGIC: u32 = 0x5350_5759; // "SPWY"
/// Payload bytes the header takes: magic (4), flow index (4), sequence number (8).
const HEADER_LEN: usize = 16;
/// Smallest `--size`: the header plus 2, so that the smallest payload makes a 64-byte frame
/// (FCS included) over IPv4.
const SIZE_MIN: u64 = 18;
/// Largest `--size` over IPv4: a 1500-byte MTU less 20 bytes of IPv4 and 8 of UDP.
const SIZE_MAX_V4: u64 = 1472;
/// Largest `--size` over IPv6: a 1500-byte MTU less 40 bytes of IPv6 and 8 of UDP.
const SIZE_MAX_V6: usize = 1452;
/// Most flows (sockets) of a generator, and the sink's per-flow table size.
const FLOWS_MAX: u64 = 1000;
/// Most datagrams per syscall: the kernel's `UIO_MAXIOV`, the cap on `vlen` for
/// `sendmmsg`/`recvmmsg`.
const BATCH_MAX: u64 = 1024;
/// Receive buffer per datagram at the sink: larger than any datagram the generator sends, so
/// none is cut short (a longer stray is counted as foreign anyway).
const SLOT_BYTES: usize = 2048;
/// How long a sink's `recvmmsg` blocks before it checks its deadlines and the stop flag.
const POLL: Duration = Duration::from_millis(50);
/// Batches the pacer's bucket holds at most: enough that a sleep which overshoots by a few
/// milliseconds does not lose the tokens (the rate is still never exceeded: the bucket starts
/// empty), few enough that a stalled sender catches up with at most a short burst.
const PACER_BATCHES: usize = 4;
/// The sink's nap after a short batch (fewer datagrams than `--batch` were queued): a sink that
/// blocks in `recvmmsg` is woken by every datagram that arrives and, on a shared core, preempts
/// the generator per datagram (measured on loopback: 125,000 involuntary context switches of
/// the generator in 3 s, one every 3.4 datagrams). Napping on a timer lets a batch queue up;
/// 200 us fill at most 400 slots of the 8 MB receive buffer at 2 Mpps.
const SINK_NAP: Duration = Duration::from_micros(200);
/// Longest sleep of the pacer before it checks the deadline and the stop flag again.
const PACER_SLEEP_MAX: Duration = Duration::from_millis(50);

/// `spillway traffic gen|sink`.
#[derive(clap::Subcommand, Debug)]
pub enum TrafficCommand {
    /// Send UDP datagrams to IP:PORT from several flows, batched with sendmmsg, paced or flat
    /// out; print what was sent.
    Gen(GenArgs),
    /// Receive UDP datagrams with recvmmsg and count them, per flow: received, lost (from
    /// sequence numbers), reordered.
    Sink(SinkArgs),
}

/// Arguments of `spillway traffic gen`.
#[derive(clap::Args, Debug)]
pub struct GenArgs {
    /// Where to send: IP:PORT (IPv4, or IPv6 as [ADDR]:PORT).
    #[arg(long, value_name = "IP:PORT", value_parser = socket_addr)]
    pub dst: SocketAddr,
    /// Flows, 1..=1000: one socket per flow, each on its own ephemeral source port.
    #[arg(long, default_value_t = 4, value_parser = ranged(1, FLOWS_MAX))]
    pub flows: usize,
    /// UDP payload bytes per datagram, 18..=1472 (at most 1452 over IPv6). The IPv4 frame on
    /// Ethernet is 42 bytes more (64 with the FCS at --size 18; 1514 without it at 1472).
    #[arg(long, value_name = "BYTES", default_value_t = 64, value_parser = ranged(SIZE_MIN, SIZE_MAX_V4))]
    pub size: usize,
    /// Datagrams per second, 1..=100000000, never exceeded (a token bucket checked per batch);
    /// without it, flat out.
    #[arg(long, value_name = "PPS", value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub rate: Option<u64>,
    /// Seconds to send, 0.001..=2592000.
    #[arg(long, value_name = "SECS", default_value = "10", value_parser = Seconds::TRAFFIC_DURATION)]
    pub duration: Duration,
    /// Datagrams per sendmmsg call, 1..=1024 (with --rate at most one millisecond's worth).
    #[arg(long, default_value_t = 64, value_parser = ranged(1, BATCH_MAX))]
    pub batch: usize,
    /// Print one JSON object instead of a sentence.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `spillway traffic sink`.
#[derive(clap::Args, Debug)]
pub struct SinkArgs {
    /// Address to receive on: IP:PORT (IPv4, or IPv6 as [ADDR]:PORT).
    #[arg(long, value_name = "IP:PORT", value_parser = socket_addr)]
    pub bind: SocketAddr,
    /// Stop this many seconds after start, 0.001..=2592000, whatever else happens.
    #[arg(long, value_name = "SECS", value_parser = Seconds::TRAFFIC_DURATION)]
    pub duration: Option<Duration>,
    /// Stop once this many seconds pass without a datagram after the first one, 0.001..=3600.
    #[arg(long, value_name = "SECS", default_value = "2", value_parser = Seconds::TRAFFIC_WAIT)]
    pub idle: Duration,
    /// Stop if no datagram at all has come this many seconds after start, 0.001..=3600.
    #[arg(long, value_name = "SECS", default_value = "60", value_parser = Seconds::TRAFFIC_WAIT)]
    pub wait: Duration,
    /// Datagrams per recvmmsg call at most, 1..=1024.
    #[arg(long, default_value_t = 64, value_parser = ranged(1, BATCH_MAX))]
    pub batch: usize,
    /// SO_RCVBUF to ask for, bytes, 4096..=1073741824; if net.core.rmem_max caps it, the sink
    /// tries SO_RCVBUFFORCE (root) and says what it got.
    #[arg(long, value_name = "BYTES", default_value_t = 8 << 20, value_parser = ranged(4096, 1 << 30))]
    pub rcvbuf: usize,
    /// Create this file once the socket is bound (for scripts: start the generator after it).
    #[arg(long, value_name = "PATH")]
    pub ready_file: Option<PathBuf>,
    /// Print one JSON object instead of a sentence.
    #[arg(long)]
    pub json: bool,
}

/// `IP:PORT` with a port other than 0; the error shows what was expected and (bounded) what came.
fn socket_addr(s: &str) -> Result<SocketAddr, String> {
    let addr: SocketAddr = s.trim().parse().map_err(|_| {
        format!(
            "expected IP:PORT (e.g. 10.77.0.2:9000 or [fd00::2]:9000), got {}",
            echo(s)
        )
    })?;
    if addr.port() == 0 {
        return Err(format!("the port must be 1..=65535, got {}", echo(s)));
    }
    Ok(addr)
}

/// Runs `spillway traffic gen|sink`.
pub fn run(cmd: &TrafficCommand) -> Result<()> {
    signals::install().context("installing signal handlers")?;
    match cmd {
        TrafficCommand::Gen(args) => gen_run(args),
        TrafficCommand::Sink(args) => sink_run(args),
    }
}

/// Preallocated `sendmmsg`/`recvmmsg` state: `n` slots of `slot` bytes, one `iovec` and one
/// `mmsghdr` each. Allocated once per run; the pointers inside the headers are set again from
/// the buffer before every call ([`MsgBatch::arm`]), so they are always derived from the current
/// borrow of the buffer and nothing depends on them staying valid between calls.
struct MsgBatch {
    bufs: Box<[u8]>,
    slot: usize,
    iovs: Box<[libc::iovec]>,
    hdrs: Box<[libc::mmsghdr]>,
}

impl MsgBatch {
    fn new(n: usize, slot: usize) -> MsgBatch {
        // SAFETY: `iovec` and `mmsghdr` are plain C structs of integers and raw pointers, for
        // which all-zero bytes are a valid value (null pointers, zero lengths).
        let zero_iov: libc::iovec = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let zero_hdr: libc::mmsghdr = unsafe { std::mem::zeroed() };
        MsgBatch {
            bufs: vec![0u8; n * slot].into_boxed_slice(),
            slot,
            iovs: vec![zero_iov; n].into_boxed_slice(),
            hdrs: vec![zero_hdr; n].into_boxed_slice(),
        }
    }

    /// The payload of slot `i`.
    fn slot_mut(&mut self, i: usize) -> &mut [u8] {
        &mut self.bufs[i * self.slot..(i + 1) * self.slot]
    }

    fn slot(&self, i: usize, len: usize) -> &[u8] {
        &self.bufs[i * self.slot..i * self.slot + len.min(self.slot)]
    }

    /// Points the first `n` headers at their slots, `len` bytes each, no address (connected or
    /// not wanted), no control data; returns the header array for the syscall.
    fn arm(&mut self, n: usize, len: usize) -> *mut libc::mmsghdr {
        let base = self.bufs.as_mut_ptr();
        for i in 0..n {
            // `wrapping_add` keeps this safe code; the offset is within the buffer (i < n).
            self.iovs[i].iov_base = base.wrapping_add(i * self.slot).cast();
            self.iovs[i].iov_len = len;
        }
        let iovs = self.iovs.as_mut_ptr();
        for (i, h) in self.hdrs[..n].iter_mut().enumerate() {
            h.msg_hdr.msg_name = std::ptr::null_mut();
            h.msg_hdr.msg_namelen = 0;
            h.msg_hdr.msg_iov = iovs.wrapping_add(i);
            h.msg_hdr.msg_iovlen = 1;
            h.msg_hdr.msg_control = std::ptr::null_mut();
            h.msg_hdr.msg_controllen = 0;
            h.msg_hdr.msg_flags = 0;
            h.msg_len = 0;
        }
        self.hdrs.as_mut_ptr()
    }
}

/// The token bucket of `--rate` (see the module comment): it starts empty and holds at most
/// `cap` tokens, so the datagrams sent by time `t` never exceed `rate * t`.
struct Pacer {
    rate: f64,
    cap: f64,
    tokens: f64,
    last: Instant,
}

impl Pacer {
    fn new(rate: u64, cap: usize, now: Instant) -> Pacer {
        Pacer {
            rate: rate as f64,
            cap: cap as f64,
            tokens: 0.0,
            last: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        let dt = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + self.rate * dt).min(self.cap);
        self.last = now;
    }

    /// Waits until `n` tokens are there and takes them; false if `deadline` or a stop signal
    /// came first.
    fn take(&mut self, n: usize, deadline: Instant) -> bool {
        let need = n as f64;
        loop {
            let now = Instant::now();
            self.refill(now);
            if self.tokens >= need {
                self.tokens -= need;
                return true;
            }
            if now >= deadline || signals::stop_requested() {
                return false;
            }
            let wait = Duration::from_secs_f64((need - self.tokens) / self.rate);
            std::thread::sleep(wait.min(deadline - now).min(PACER_SLEEP_MAX));
        }
    }

    /// Gives back tokens of datagrams the kernel did not take.
    fn refund(&mut self, n: usize) {
        self.tokens = (self.tokens + n as f64).min(self.cap);
    }
}

/// Writes the datagram header: magic, flow index, sequence number.
fn put_header(buf: &mut [u8], flow: u32, seq: u64) {
    buf[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    buf[4..8].copy_from_slice(&flow.to_le_bytes());
    buf[8..16].copy_from_slice(&seq.to_le_bytes());
}

/// The flow index and sequence number of one of our datagrams, or None for anything else.
fn read_header(buf: &[u8]) -> Option<(u32, u64)> {
    let magic = u32::from_le_bytes(buf.get(0..4)?.try_into().ok()?);
    if magic != MAGIC {
        return None;
    }
    let flow = u32::from_le_bytes(buf.get(4..8)?.try_into().ok()?);
    let seq = u64::from_le_bytes(buf.get(8..HEADER_LEN)?.try_into().ok()?);
    Some((flow, seq))
}

fn gen_run(args: &GenArgs) -> Result<()> {
    if args.dst.is_ipv6() && args.size > SIZE_MAX_V6 {
        bail!(
            "--size {} does not fit a 1500-byte MTU over IPv6 (--dst {}): at most {SIZE_MAX_V6}",
            args.size,
            args.dst
        );
    }
    let local: SocketAddr = if args.dst.is_ipv4() {
        "0.0.0.0:0".parse()?
    } else {
        "[::]:0".parse()?
    };
    let mut socks = Vec::with_capacity(args.flows);
    for f in 0..args.flows {
        let s = UdpSocket::bind(local).with_context(|| {
            format!("binding the socket of flow {f} (of --flows {})", args.flows)
        })?;
        s.connect(args.dst)
            .with_context(|| format!("--dst {}: connecting flow {f}", args.dst))?;
        socks.push(s);
    }
    let fds: Vec<i32> = socks.iter().map(AsRawFd::as_raw_fd).collect();
    let per_batch = match args.rate {
        Some(r) => usize::try_from(r.div_ceil(1000))
            .unwrap_or(usize::MAX)
            .clamp(1, args.batch),
        None => args.batch,
    };
    let mut batch = MsgBatch::new(per_batch, args.size);
    let mut seqs = vec![0u64; args.flows];

    let start = Instant::now();
    let deadline = start + args.duration;
    let mut pacer = args
        .rate
        .map(|r| Pacer::new(r, PACER_BATCHES * per_batch, start));
    let (mut sent, mut send_errors, mut short_sends, mut calls) = (0u64, 0u64, 0u64, 0u64);
    let mut last_error: Option<io::Error> = None;
    let mut flow = 0usize;
    loop {
        if signals::stop_requested() || Instant::now() >= deadline {
            break;
        }
        if let Some(p) = pacer.as_mut()
            && !p.take(per_batch, deadline)
        {
            break;
        }
        let seq0 = seqs[flow];
        for i in 0..per_batch {
            // Flow indices are < FLOWS_MAX, which fits u32.
            put_header(batch.slot_mut(i), flow as u32, seq0 + i as u64);
        }
        let hdrs = batch.arm(per_batch, args.size);
        // SAFETY: `hdrs` points at `per_batch` initialised `mmsghdr`s whose iovecs point into
        // `batch.bufs`, each `args.size` bytes within its slot; `batch` is not touched until
        // the call returns; the socket is connected, so no address is passed. `per_batch` is
        // at most 1024 and fits `c_uint`.
        let rc = unsafe { libc::sendmmsg(fds[flow], hdrs, per_batch as libc::c_uint, 0) };
        calls += 1;
        if rc < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                send_errors += 1;
                last_error = Some(e);
            }
            if let Some(p) = pacer.as_mut() {
                p.refund(per_batch);
            }
        } else {
            let k = rc as usize;
            // The kernel stops a batch at the first datagram it cannot send and reports the
            // ones before (an ICMP port unreachable from a missing sink shows up this way).
            short_sends += u64::from(k < per_batch);
            sent += k as u64;
            seqs[flow] += k as u64;
            if let Some(p) = pacer.as_mut() {
                p.refund(per_batch - k);
            }
        }
        flow = (flow + 1) % args.flows;
    }
    let seconds = start.elapsed().as_secs_f64();
    let pps = if seconds > 0.0 {
        sent as f64 / seconds
    } else {
        0.0
    };
    let bytes = sent * args.size as u64;
    if args.json {
        println!(
            "{}",
            json!({
                "sent": sent,
                "seconds": seconds,
                "pps": pps,
                "bytes": bytes,
                "flows": args.flows,
                "size": args.size,
                "batch": per_batch,
                "rate": args.rate,
                "calls": calls,
                "send_errors": send_errors,
                "short_sends": short_sends,
                "last_send_error": last_error.as_ref().map(ToString::to_string),
            })
        );
    } else {
        println!(
            "sent {sent} datagrams of {} payload bytes in {seconds:.3} s: {pps:.0} pps \
             ({} flows, {per_batch} per sendmmsg, {send_errors} failed and {short_sends} short \
             sends)",
            args.size, args.flows
        );
    }
    if sent == 0 {
        match last_error {
            Some(e) => bail!(
                "nothing was sent to {}: {send_errors} sendmmsg calls failed, the last with: {e}",
                args.dst
            ),
            None => bail!("nothing was sent to {} in {seconds:.3} s", args.dst),
        }
    }
    Ok(())
}

/// Per-flow counters of the sink.
#[derive(Clone, Copy, Default)]
struct FlowRx {
    /// Datagrams received.
    received: u64,
    /// Highest sequence number seen plus one: the datagrams the flow had sent by then.
    next: u64,
}

/// Sets SO_RCVBUF to `want` bytes, and SO_RCVBUFFORCE if net.core.rmem_max capped it; returns
/// what the kernel reports afterwards (its figure is twice the request: bookkeeping included).
fn set_rcvbuf(fd: i32, want: usize) -> Result<usize> {
    let set = |opt: libc::c_int| -> io::Result<()> {
        let v = libc::c_int::try_from(want).unwrap_or(libc::c_int::MAX);
        // SAFETY: `v` is a live c_int and the length passed is its size.
        let rc = unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                opt,
                (&raw const v).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    };
    let get = || -> io::Result<usize> {
        let mut v: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: `v` and `len` are live and `len` holds `v`'s size.
        let rc = unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_RCVBUF,
                (&raw mut v).cast(),
                &raw mut len,
            )
        };
        if rc == 0 {
            Ok(usize::try_from(v).unwrap_or(0))
        } else {
            Err(io::Error::last_os_error())
        }
    };
    set(libc::SO_RCVBUF).with_context(|| format!("setting SO_RCVBUF to --rcvbuf {want}"))?;
    let mut got = get().context("reading SO_RCVBUF back")?;
    if got < want.saturating_mul(2) {
        // Needs CAP_NET_ADMIN; without it the capped value stands and is reported.
        if set(libc::SO_RCVBUFFORCE).is_ok() {
            got = get().context("reading SO_RCVBUF back")?;
        }
    }
    Ok(got)
}

fn sink_run(args: &SinkArgs) -> Result<()> {
    let sock = UdpSocket::bind(args.bind).with_context(|| format!("--bind {}", args.bind))?;
    let fd = sock.as_raw_fd();
    let rcvbuf = set_rcvbuf(fd, args.rcvbuf)?;
    let capped = rcvbuf < args.rcvbuf.saturating_mul(2);
    if capped {
        eprintln!(
            "warning: the kernel capped SO_RCVBUF: asked for {} bytes, got {} (it reports twice \
             the usable size; raise net.core.rmem_max or run as root)",
            args.rcvbuf, rcvbuf
        );
    }
    sock.set_read_timeout(Some(POLL))
        .context("setting the receive timeout")?;
    if let Some(path) = &args.ready_file {
        std::fs::write(path, b"")
            .with_context(|| format!("--ready-file {}: creating it", path.display()))?;
    }

    let mut batch = MsgBatch::new(args.batch, SLOT_BYTES);
    let mut flows = vec![FlowRx::default(); FLOWS_MAX as usize];
    let (mut received, mut bytes, mut reordered, mut foreign) = (0u64, 0u64, 0u64, 0u64);
    let start = Instant::now();
    let (mut first, mut last): (Option<Instant>, Instant) = (None, start);
    let why_stopped = loop {
        if signals::stop_requested() {
            break "signal";
        }
        let now = Instant::now();
        if args.duration.is_some_and(|d| now - start >= d) {
            break "duration";
        }
        match first {
            Some(_) if now - last >= args.idle => break "idle",
            None if now - start >= args.wait => break "wait",
            _ => {}
        }
        let hdrs = batch.arm(args.batch, SLOT_BYTES);
        // SAFETY: `hdrs` points at `args.batch` initialised `mmsghdr`s whose iovecs cover
        // disjoint `SLOT_BYTES` slots of `batch.bufs`, which is not touched until the call
        // returns; no address or control buffer is asked for; the timeout pointer is null
        // (SO_RCVTIMEO bounds the wait). `args.batch` is at most 1024 and fits `c_uint`.
        let rc = unsafe {
            libc::recvmmsg(
                fd,
                hdrs,
                args.batch as libc::c_uint,
                libc::MSG_WAITFORONE,
                std::ptr::null_mut(),
            )
        };
        if rc < 0 {
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::WouldBlock
                | io::ErrorKind::TimedOut
                | io::ErrorKind::Interrupted => {
                    continue;
                }
                _ => return Err(e).with_context(|| format!("recvmmsg on {}", args.bind)),
            }
        }
        let n = rc as usize;
        last = Instant::now();
        first.get_or_insert(last);
        for i in 0..n {
            let len = batch.hdrs[i].msg_len as usize;
            received += 1;
            bytes += len as u64;
            let Some((flow, seq)) = read_header(batch.slot(i, len)) else {
                foreign += 1;
                continue;
            };
            let Some(f) = flows.get_mut(flow as usize) else {
                foreign += 1;
                continue;
            };
            f.received += 1;
            if seq >= f.next {
                f.next = seq + 1;
            } else {
                reordered += 1;
            }
        }
        if n < args.batch {
            std::thread::sleep(SINK_NAP);
        }
    };
    let seconds = first.map_or(0.0, |f| (last - f).as_secs_f64());
    let pps = if seconds > 0.0 {
        received as f64 / seconds
    } else {
        0.0
    };
    let lost: u64 = flows
        .iter()
        .map(|f| f.next.saturating_sub(f.received))
        .sum();
    let active = flows.iter().filter(|f| f.received > 0).count();
    if args.json {
        println!(
            "{}",
            json!({
                "received": received,
                "seconds": seconds,
                "pps": pps,
                "bytes": bytes,
                "lost": lost,
                "reordered": reordered,
                "flows": active,
                "foreign": foreign,
                "rcvbuf": rcvbuf,
                "rcvbuf_capped": capped,
                "stopped_by": why_stopped,
            })
        );
    } else {
        println!(
            "received {received} datagrams ({bytes} payload bytes) in {seconds:.3} s: \
             {pps:.0} pps; {active} flows, {lost} lost, {reordered} reordered, \
             {foreign} foreign; stopped by {why_stopped}"
        );
    }
    if received == 0 && why_stopped == "wait" {
        eprintln!(
            "note: nothing arrived on {} within --wait {:?}",
            args.bind, args.wait
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips_and_strays_are_refused() {
        let mut b = [0u8; 18];
        put_header(&mut b, 7, 0x0102_0304_0506_0708);
        assert_eq!(read_header(&b), Some((7, 0x0102_0304_0506_0708)));
        assert_eq!(read_header(&b[..15]), None);
        b[0] ^= 1;
        assert_eq!(read_header(&b), None);
    }

    #[test]
    fn pacer_never_exceeds_the_rate() {
        let start = Instant::now();
        let mut p = Pacer::new(1000, 10, start);
        let deadline = start + Duration::from_millis(100);
        let mut sent = 0u64;
        while p.take(10, deadline) {
            sent += 10;
            let allowed = 1000.0 * start.elapsed().as_secs_f64();
            assert!(sent as f64 <= allowed + 1e-6, "{sent} > {allowed}");
        }
        assert!(sent <= 100, "{sent}");
    }

    #[test]
    fn addresses_must_be_ip_port_with_a_port() {
        assert!(socket_addr("10.0.0.1:9").is_ok());
        assert!(socket_addr("[fd00::1]:9").is_ok());
        assert!(socket_addr("nonsense").unwrap_err().contains("IP:PORT"));
        assert!(socket_addr("10.0.0.1").unwrap_err().contains("IP:PORT"));
        assert!(socket_addr("10.0.0.1:0").unwrap_err().contains("port"));
    }
}
