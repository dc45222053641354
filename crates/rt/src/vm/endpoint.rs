//! `spillway vm-endpoint`: the tenant side of a shared-memory VM port. It owns the VM's memory
//! ([`VmMemory`]), drives its queues as a virtio-net driver would, and either bridges them to a
//! TAP inside the VM's namespace (so real applications run over the port) or runs a built-in
//! generator, sink or echo.
//!
//! Per loop turn: used receive buffers of both receive queues (the DPU's and the spill plane's)
//! are handed to the mode and posted again; used transmit buffers are reclaimed; the mode
//! transmits. When there is nothing to do it sleeps in `poll` on its interrupt eventfd (and the
//! TAP), after the race-free announcement of [`crate::shm::virtq`].
//!
//! The generator stamps every UDP payload with a magic word, a sequence number, the flow and the
//! `CLOCK_MONOTONIC` time of sending; the sink (another endpoint on the same host, so the same
//! clock) turns that into one-way latency and loss, and counts which receive queue each packet
//! came by: queue 2 is the spill plane's direct (vATC) delivery.

use std::net::Ipv4Addr;
use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use serde::Serialize;
use spillway_wire::build::FrameBuilder;

use crate::dpu::vmport;
use crate::host::signals;
use crate::shm::ring::Doorbell;
use crate::shm::virtq::{
    DriverQueue, NET_HDR_BYTES, QUEUE_RX_DPU, QUEUE_RX_PLANE, QUEUE_TX, VmLayout, VmMemory,
};
use crate::testbed::{Testbed, VmSpec};

/// What the endpoint does with its queues.
#[derive(Clone, Debug, PartialEq)]
pub enum Mode {
    /// Bridge the queues to the TAP with this fd (inherited from the DPU process), inside the
    /// VM's namespace.
    Bridge(RawFd),
    /// Count what arrives, measure its latency.
    Sink,
    /// Send UDP to `dst`.
    Gen(GenOptions),
    /// Send every UDP datagram back to where it came from.
    Echo,
}

/// The generator's knobs.
#[derive(Clone, Debug, PartialEq)]
pub struct GenOptions {
    /// Destination address (a VM of the same tenant).
    pub dst: Ipv4Addr,
    /// Packets per second (0: as fast as the transmit queue takes them).
    pub pps: u64,
    /// Distinct flows (source ports), sent round-robin.
    pub flows: u16,
    /// Frame size in bytes (at least 64).
    pub size: usize,
    /// Source port of the first flow (flow `i` uses `sport_base + i`): a fresh base makes the
    /// flows new connections again.
    pub sport_base: u16,
}

/// Options of `spillway vm-endpoint`.
#[derive(Clone, Debug)]
pub struct EndpointOptions {
    /// The testbed.
    pub testbed: Testbed,
    /// The VM's name.
    pub vm: String,
    /// The mode.
    pub mode: Mode,
    /// Descriptors per queue.
    pub queue_size: u16,
    /// Bytes per buffer.
    pub buf_bytes: u32,
    /// Stop after this long (None: until SIGTERM/SIGINT or the DPU goes away).
    pub duration: Option<Duration>,
}

/// What the endpoint reports when it stops (JSON).
#[derive(Clone, Debug, Default, Serialize)]
pub struct EndpointReport {
    /// The VM.
    pub vm: String,
    /// The mode.
    pub mode: String,
    /// Frames transmitted.
    pub tx_frames: u64,
    /// Frames received on queue 1 (from the DPU).
    pub rx_dpu: u64,
    /// Frames received on queue 2 (the spill plane's direct delivery).
    pub rx_plane: u64,
    /// Seconds from the first to the last generator packet received (sink).
    pub rx_window_s: f64,
    /// Generator packets received per second over that window (sink).
    pub rx_pps: f64,
    /// Generator packets the sink never saw (highest sequence + 1 - received).
    pub lost: u64,
    /// One-way latency percentiles of generator packets, microseconds (sink).
    pub latency_us: Option<Percentiles>,
    /// Times the transmit queue was full (generator, bridge).
    pub tx_full: u64,
    /// Frames the bridge could not write to or read from the TAP.
    pub tap_errors: u64,
}

/// Latency percentiles.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Percentiles {
    /// Samples.
    pub samples: u64,
    /// Median.
    pub p50: f64,
    /// 99th.
    pub p99: f64,
    /// 99.9th.
    pub p999: f64,
}

const GEN_MAGIC: u32 = 0x5350_4c57;
/// Idle loop turns before an endpoint sleeps.
const SPIN_TURNS: u32 = 64;
const PAYLOAD_AT: usize = 14 + 20 + 8;
/// Latency samples kept (the first ones; later ones are sampled 1 in 8 once full).
const SAMPLES_MAX: usize = 4 << 20;

fn mono_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

struct Endpoint {
    mem: VmMemory,
    tx: DriverQueue,
    rx: [DriverQueue; 2],
    kick: Doorbell,
    irq: Doorbell,
    stream: std::os::unix::net::UnixStream,
    report: EndpointReport,
    /// Bytes of one receive or transmit buffer.
    buf: Vec<u8>,
}

impl Endpoint {
    fn post_rx(&mut self) {
        let len = self.mem.layout().buf_bytes;
        for q in &mut self.rx {
            while let Some(id) = q.take_free() {
                q.post(&self.mem, id, len);
            }
        }
    }

    /// Transmits `hdr` + `frame`; false if the transmit queue is full.
    fn send(&mut self, hdr: &[u8; NET_HDR_BYTES], frame: &[u8]) -> bool {
        while let Ok(Some((id, _))) = self.tx.reclaim(&self.mem) {
            self.tx.put_free(id);
        }
        if hdr.len() + frame.len() > self.mem.layout().buf_bytes as usize {
            return true; // cannot happen with our layouts; dropped rather than truncated
        }
        let Some(id) = self.tx.take_free() else {
            self.report.tx_full += 1;
            return false;
        };
        let off = self.tx.buf_off(&self.mem, id);
        self.mem.write_bytes(off, hdr);
        self.mem.write_bytes(off + NET_HDR_BYTES, frame);
        self.tx
            .post(&self.mem, id, (NET_HDR_BYTES + frame.len()) as u32);
        self.report.tx_frames += 1;
        true
    }

    fn kick_if_needed(&mut self) {
        if self.tx.needs_kick(&self.mem) {
            let _ = self.kick.kick();
        }
    }

    /// Hands each used receive buffer (header + frame, and its queue) to `f`, then reposts it.
    fn drain_rx(&mut self, mut f: impl FnMut(&mut Self, usize, usize)) -> Result<usize, String> {
        let mut n = 0;
        for qi in 0..2 {
            loop {
                let got = self.rx[qi].reclaim(&self.mem).map_err(|e| e.to_string())?;
                let Some((id, len)) = got else { break };
                n += 1;
                let len = (len as usize).min(self.buf.len());
                let off = self.rx[qi].buf_off(&self.mem, id);
                let mut buf = std::mem::take(&mut self.buf);
                let ok = len >= NET_HDR_BYTES && self.mem.read_bytes(off, &mut buf[..len]);
                self.buf = buf;
                if qi == 0 {
                    self.report.rx_dpu += 1;
                } else {
                    self.report.rx_plane += 1;
                }
                if ok {
                    f(self, qi, len);
                }
                let blen = self.mem.layout().buf_bytes;
                self.rx[qi].post(&self.mem, id, blen);
            }
        }
        Ok(n)
    }

    /// Sleeps until an interrupt (or `extra` is readable, or 10 ms), unless work arrived.
    fn sleep(&mut self, extra: Option<BorrowedFd<'_>>) {
        let armed = self.rx[0].prepare_sleep(&self.mem) && self.rx[1].prepare_sleep(&self.mem);
        if armed {
            let mut fds = vec![
                rustix::event::PollFd::new(&self.irq, rustix::event::PollFlags::IN),
                rustix::event::PollFd::new(&self.stream, rustix::event::PollFlags::IN),
            ];
            if let Some(fd) = extra.as_ref() {
                fds.push(rustix::event::PollFd::new(fd, rustix::event::PollFlags::IN));
            }
            let ts = rustix::event::Timespec {
                tv_sec: 0,
                tv_nsec: 10_000_000,
            };
            let _ = rustix::event::poll(&mut fds, Some(&ts));
        }
        let _ = self.irq.drain();
        for q in &mut self.rx {
            q.woke(&self.mem);
        }
    }

    /// After a loop turn: spins `SPIN_TURNS` idle turns, then sleeps (waking on an interrupt
    /// or `extra`). False once the DPU process has closed the port.
    fn idle(&mut self, busy: bool, turns: &mut u32, extra: Option<BorrowedFd<'_>>) -> bool {
        if busy {
            *turns = 0;
            return true;
        }
        *turns += 1;
        if *turns > SPIN_TURNS {
            *turns = 0;
            if self.dpu_gone() {
                return false;
            }
            self.sleep(extra);
        }
        true
    }

    /// Whether the DPU process closed the port.
    fn dpu_gone(&self) -> bool {
        let mut b = [0u8; 16];
        match rustix::net::recv(&self.stream, &mut b, rustix::net::RecvFlags::DONTWAIT) {
            Ok((0, _)) => true,
            Ok(_) => false,
            Err(rustix::io::Errno::AGAIN) => false,
            Err(_) => true,
        }
    }
}

/// Runs the endpoint until its duration ends, a signal arrives or the DPU process goes away.
pub fn run(opts: EndpointOptions) -> Result<EndpointReport, String> {
    let spec = opts
        .testbed
        .vms
        .iter()
        .find(|v| v.name == opts.vm)
        .cloned()
        .ok_or_else(|| {
            format!(
                "{}: no [[vm]] named {:?}",
                opts.testbed.file.display(),
                opts.vm
            )
        })?;
    let layout = VmLayout {
        queue_size: opts.queue_size,
        buf_bytes: opts.buf_bytes,
        // A distinct device address space per port, so an IOVA never means the same thing for
        // two VMs by accident.
        iova_base: (u64::from(spec.port.0) + 1) << 36,
    };
    let mem = VmMemory::create(&format!("vm-{}", opts.vm), layout).map_err(|e| e.to_string())?;
    let kick = Doorbell::new().map_err(|e| e.to_string())?;
    let irq = Doorbell::new().map_err(|e| e.to_string())?;
    let path = vmport::port_socket(&opts.testbed, &opts.vm);
    let stream = vmport::attach(&path, &opts.vm, &mem, &kick, &irq)?;
    let mut ep = Endpoint {
        tx: DriverQueue::new(&mem, QUEUE_TX),
        rx: [
            DriverQueue::new(&mem, QUEUE_RX_DPU),
            DriverQueue::new(&mem, QUEUE_RX_PLANE),
        ],
        buf: vec![0u8; layout.buf_bytes as usize],
        mem,
        kick,
        irq,
        stream,
        report: EndpointReport {
            vm: opts.vm.clone(),
            ..EndpointReport::default()
        },
    };
    ep.post_rx();
    tracing::info!(target: "spillway::endpoint", vm = %opts.vm, mode = ?opts.mode, "attached");
    let deadline = opts.duration.map(|d| mono_ns() + d.as_nanos() as u64);
    let done = |deadline: Option<u64>| {
        signals::stop_requested() || deadline.is_some_and(|d| mono_ns() >= d)
    };
    match opts.mode.clone() {
        Mode::Bridge(fd) => {
            ep.report.mode = "bridge".into();
            // SAFETY: the DPU process passed this fd to us for our exclusive use (it closed its
            // copy after spawning us); nothing else in this process owns it.
            let tap = unsafe { OwnedFd::from_raw_fd(fd) };
            bridge(&mut ep, &tap, deadline, &done)?;
        }
        Mode::Sink => {
            ep.report.mode = "sink".into();
            sink(&mut ep, deadline, &done)?;
        }
        Mode::Gen(g) => {
            ep.report.mode = "gen".into();
            generate(&mut ep, &spec, &g, deadline, &done)?;
        }
        Mode::Echo => {
            ep.report.mode = "echo".into();
            echo(&mut ep, deadline, &done)?;
        }
    }
    Ok(ep.report)
}

fn bridge(
    ep: &mut Endpoint,
    tap: &OwnedFd,
    deadline: Option<u64>,
    done: &dyn Fn(Option<u64>) -> bool,
) -> Result<(), String> {
    rustix::fs::fcntl_setfl(tap, rustix::fs::OFlags::NONBLOCK).map_err(|e| e.to_string())?;
    let mut frame = vec![0u8; ep.mem.layout().buf_bytes as usize];
    let mut turns = 0u32;
    while !done(deadline) {
        let mut busy = ep.drain_rx(|ep, _q, len| {
            // Header and frame as the TAP (IFF_VNET_HDR) takes them.
            if rustix::io::write(tap, &ep.buf[..len]).is_err() {
                ep.report.tap_errors += 1;
            }
        })? > 0;
        for _ in 0..64 {
            match rustix::io::read(tap, &mut frame) {
                Ok(n) if n >= NET_HDR_BYTES => {
                    busy = true;
                    let hdr: [u8; NET_HDR_BYTES] = frame[..NET_HDR_BYTES].try_into().expect("12");
                    if !ep.send(&hdr, &frame[NET_HDR_BYTES..n]) {
                        // The DPU is behind: drop as a full NIC queue would (TCP retransmits).
                        break;
                    }
                }
                Ok(_) => ep.report.tap_errors += 1,
                Err(rustix::io::Errno::AGAIN) => break,
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(format!("reading the TAP: {e}")),
            }
        }
        ep.kick_if_needed();
        if !ep.idle(busy, &mut turns, Some(tap.as_fd())) {
            break;
        }
    }
    Ok(())
}

/// One generator packet's fields, read back by the sink.
fn stamp(payload: &mut [u8], seq: u64, flow: u16, now: u64) {
    payload[0..4].copy_from_slice(&GEN_MAGIC.to_le_bytes());
    payload[4..12].copy_from_slice(&seq.to_le_bytes());
    payload[12..20].copy_from_slice(&now.to_le_bytes());
    payload[20..22].copy_from_slice(&flow.to_le_bytes());
}

fn generate(
    ep: &mut Endpoint,
    spec: &VmSpec,
    g: &GenOptions,
    deadline: Option<u64>,
    done: &dyn Fn(Option<u64>) -> bool,
) -> Result<(), String> {
    let size = g.size.max(64);
    let payload = size - PAYLOAD_AT;
    let flows = g.flows.max(1);
    let templates: Vec<Vec<u8>> = (0..flows)
        .map(|f| {
            let mut t = FrameBuilder::new()
                .eth(spec.mac, spec.router_mac)
                .ipv4(spec.ip, g.dst)
                .udp(g.sport_base.wrapping_add(f), 9)
                .payload(&vec![0u8; payload])
                .build();
            // No UDP checksum (allowed for IPv4): the stamp changes per packet.
            t[14 + 20 + 6] = 0;
            t[14 + 20 + 7] = 0;
            t
        })
        .collect();
    let hdr = [0u8; NET_HDR_BYTES];
    let mut frame = vec![0u8; size];
    let start = mono_ns();
    let mut seq = 0u64;
    while !done(deadline) {
        if seq.is_multiple_of(4096) && ep.dpu_gone() {
            break;
        }
        // Pace: packet `seq` is due at start + seq / pps.
        if let Some(offset) = (seq * 1_000_000_000).checked_div(g.pps) {
            let due = start + offset;
            let now = mono_ns();
            if now < due {
                // Ahead of the schedule: sleep rather than spin (the endpoint shares the host's
                // cores with the fabric it measures); the packets due meanwhile go as a burst.
                ep.kick_if_needed();
                std::thread::sleep(Duration::from_nanos((due - now).max(20_000)));
                continue;
            }
        }
        let f = (seq % u64::from(flows)) as u16;
        let t = &templates[usize::from(f)];
        frame[..t.len()].copy_from_slice(t);
        stamp(&mut frame[PAYLOAD_AT..], seq, f, mono_ns());
        if ep.send(&hdr, &frame[..t.len()]) {
            seq += 1;
            if seq.is_multiple_of(32) {
                ep.kick_if_needed();
            }
        } else {
            ep.kick_if_needed();
            std::hint::spin_loop();
        }
        // Whatever comes back (echoes) is counted and dropped.
        ep.drain_rx(|_, _, _| {})?;
    }
    ep.kick_if_needed();
    Ok(())
}

fn sink(
    ep: &mut Endpoint,
    deadline: Option<u64>,
    done: &dyn Fn(Option<u64>) -> bool,
) -> Result<(), String> {
    let mut samples: Vec<u32> = Vec::with_capacity(SAMPLES_MAX);
    let (mut first, mut last, mut got, mut max_seq) = (0u64, 0u64, 0u64, None::<u64>);
    let mut skip = 0u32;
    let mut turns = 0u32;
    while !done(deadline) {
        let n = ep.drain_rx(|ep, _q, len| {
            let frame = &ep.buf[NET_HDR_BYTES..len];
            if frame.len() < PAYLOAD_AT + 22 {
                return;
            }
            let p = &frame[PAYLOAD_AT..];
            if p[0..4] != GEN_MAGIC.to_le_bytes() {
                return;
            }
            let now = mono_ns();
            let seq = u64::from_le_bytes(p[4..12].try_into().expect("8"));
            let sent = u64::from_le_bytes(p[12..20].try_into().expect("8"));
            if got == 0 {
                first = now;
            }
            last = now;
            got += 1;
            max_seq = Some(max_seq.map_or(seq, |m: u64| m.max(seq)));
            let lat = now.saturating_sub(sent).min(u64::from(u32::MAX)) as u32;
            if samples.len() < SAMPLES_MAX {
                samples.push(lat);
            } else {
                skip += 1;
                if skip.is_multiple_of(8) {
                    let i = (skip as usize / 8) % SAMPLES_MAX;
                    samples[i] = lat;
                }
            }
        })?;
        if !ep.idle(n > 0, &mut turns, None) {
            break;
        }
    }
    let window = last.saturating_sub(first) as f64 / 1e9;
    ep.report.rx_window_s = window;
    ep.report.rx_pps = if window > 0.0 {
        got as f64 / window
    } else {
        0.0
    };
    ep.report.lost = max_seq.map_or(0, |m| (m + 1).saturating_sub(got));
    if !samples.is_empty() {
        samples.sort_unstable();
        let pct = |p: f64| {
            let i = ((samples.len() as f64 - 1.0) * p).round() as usize;
            f64::from(samples[i]) / 1e3
        };
        ep.report.latency_us = Some(Percentiles {
            samples: samples.len() as u64,
            p50: pct(0.50),
            p99: pct(0.99),
            p999: pct(0.999),
        });
    }
    Ok(())
}

fn echo(
    ep: &mut Endpoint,
    deadline: Option<u64>,
    done: &dyn Fn(Option<u64>) -> bool,
) -> Result<(), String> {
    let mut out = vec![0u8; ep.buf.len()];
    let mut turns = 0u32;
    while !done(deadline) {
        let n = ep.drain_rx(|ep, _q, len| {
            let f = &ep.buf[NET_HDR_BYTES..len];
            // Ethernet + IPv4 (no options) + UDP only.
            if f.len() < PAYLOAD_AT || f[12..14] != [0x08, 0x00] || f[14] != 0x45 || f[23] != 17 {
                return;
            }
            let o = &mut out[..f.len()];
            o.copy_from_slice(f);
            // Back where it came from: swap the MACs, the addresses and the ports.
            o[0..6].copy_from_slice(&f[6..12]);
            o[6..12].copy_from_slice(&f[0..6]);
            o[26..30].copy_from_slice(&f[30..34]);
            o[30..34].copy_from_slice(&f[26..30]);
            o[34..36].copy_from_slice(&f[36..38]);
            o[36..38].copy_from_slice(&f[34..36]);
            let n = f.len();
            ep.send(&[0u8; NET_HDR_BYTES], &out[..n]);
        })?;
        ep.kick_if_needed();
        if !ep.idle(n > 0, &mut turns, None) {
            break;
        }
    }
    Ok(())
}
