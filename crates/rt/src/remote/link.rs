//! The plane link over TCP: a vNIC set's records, framed, between a relay's end of one set and
//! the pool service's end of another.
//!
//! A frame is `kind:u8 lane:u8 len:u32le` and `len` bytes: a phy or flow ring record of lane
//! `lane`, a control record (its kind byte and body), or, before the pump runs, one JSON
//! document each way (the hello and its answer). Records are moved as they are: the ends that
//! decode them are the DPU process and the plane, which check them as they check records from
//! shared memory. The pump checks only the framing, and bounds every length.
//!
//! What the pump does not move: a control record about a VM's memory (`CONTROL_VM`: the
//! vATC's attach, regions and translation requests). A VM's memory cannot be mapped on another
//! host, so a remote plane delivers every frame the DPU way (its vATC finds no VM), and those
//! records are dropped and counted (`link.vm_dropped`).

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::shm::vnic::{CONTROL_BUF_MAX, RingKind, VnicError, VnicSet};

/// Frame kinds.
const KIND_PHY: u8 = 1;
const KIND_FLOW: u8 = 2;
const KIND_CONTROL: u8 = 3;
const KIND_JSON: u8 = 4;

/// Bytes of a frame's header.
const HEADER: usize = 6;

/// The largest record a frame may carry: a control record's bound (larger than any ring
/// record: a 64 KiB TSO frame with its message).
pub const RECORD_MAX: usize = CONTROL_BUF_MAX;

/// The largest hello (it carries a testbed's text).
pub const HELLO_MAX: usize = 1 << 20;

/// Bytes queued towards the peer before the pump stops taking records from the rings (they
/// wait there, and a ring that fills drops and counts, as it would for a slow local plane).
const OUT_HIGH: usize = 8 << 20;

/// Records taken from each ring per turn.
const BATCH: usize = 256;

/// What the link could not do.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    /// The peer closed the connection (or reset it).
    #[error("the peer closed the link")]
    Closed,
    /// A socket error.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The error.
        source: io::Error,
    },
    /// The peer broke the framing.
    #[error("bad frame from the peer: {0}")]
    Frame(String),
    /// The local vNIC set failed.
    #[error("vNIC set: {0}")]
    Vnic(#[from] VnicError),
    /// No answer in time.
    #[error("no {0} from the peer in time")]
    Timeout(&'static str),
}

/// What the pump moved (`link.*` in the owner's stats).
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct LinkCounters {
    /// Records sent to the peer.
    pub records_out: u64,
    /// Records received from the peer.
    pub records_in: u64,
    /// Bytes sent.
    pub bytes_out: u64,
    /// Bytes received.
    pub bytes_in: u64,
    /// VM-memory control records dropped (both ways).
    pub vm_dropped: u64,
    /// Ring records from the peer dropped on a full local ring.
    pub ring_full: u64,
}

/// One end of a plane link: the TCP stream and its buffers.
#[derive(Debug)]
pub struct Pump {
    tcp: TcpStream,
    out: Vec<u8>,
    out_at: usize,
    input: Vec<u8>,
    /// Where reads land before they join `input` (kept: not zeroed again every turn).
    scratch: Box<[u8]>,
    /// What moved.
    pub counters: LinkCounters,
}

fn io_err(what: &'static str) -> impl Fn(io::Error) -> LinkError {
    move |source| match source.kind() {
        io::ErrorKind::ConnectionReset
        | io::ErrorKind::BrokenPipe
        | io::ErrorKind::UnexpectedEof => LinkError::Closed,
        _ => LinkError::Io { what, source },
    }
}

fn push_frame(out: &mut Vec<u8>, kind: u8, lane: u8, rec: &[u8]) {
    out.push(kind);
    out.push(lane);
    out.extend_from_slice(&(rec.len() as u32).to_le_bytes());
    out.extend_from_slice(rec);
}

/// Sends one JSON document (blocking, bounded by the socket's write timeout).
pub fn send_json(tcp: &mut TcpStream, doc: &serde_json::Value) -> Result<(), LinkError> {
    let body = serde_json::to_vec(doc).expect("a JSON value serialises");
    if body.len() > HELLO_MAX {
        return Err(LinkError::Frame(format!(
            "a JSON document of {} bytes, more than {HELLO_MAX}",
            body.len()
        )));
    }
    let mut f = Vec::with_capacity(HEADER + body.len());
    push_frame(&mut f, KIND_JSON, 0, &body);
    tcp.write_all(&f).map_err(io_err("sending a JSON document"))
}

/// Receives one JSON document of at most [`HELLO_MAX`] bytes within `within`.
pub fn recv_json(tcp: &mut TcpStream, within: Duration) -> Result<serde_json::Value, LinkError> {
    tcp.set_read_timeout(Some(within))
        .map_err(io_err("setting a read timeout"))?;
    let mut h = [0u8; HEADER];
    let read = |tcp: &mut TcpStream, buf: &mut [u8]| {
        tcp.read_exact(buf).map_err(|e| match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => LinkError::Timeout("hello"),
            _ => io_err("receiving a JSON document")(e),
        })
    };
    read(tcp, &mut h)?;
    let len = u32::from_le_bytes(h[2..6].try_into().expect("four bytes")) as usize;
    if h[0] != KIND_JSON || len > HELLO_MAX {
        return Err(LinkError::Frame(format!(
            "expected a JSON document of at most {HELLO_MAX} bytes, got kind {} of {len} bytes",
            h[0]
        )));
    }
    let mut body = vec![0u8; len];
    read(tcp, &mut body)?;
    tcp.set_read_timeout(None)
        .map_err(io_err("clearing the read timeout"))?;
    serde_json::from_slice(&body).map_err(|e| LinkError::Frame(format!("a bad JSON document: {e}")))
}

impl Pump {
    /// A pump over a connected stream (set non-blocking, without Nagle's delay).
    pub fn new(tcp: TcpStream) -> Result<Pump, LinkError> {
        tcp.set_nonblocking(true)
            .map_err(io_err("making the link non-blocking"))?;
        tcp.set_nodelay(true)
            .map_err(io_err("turning Nagle's algorithm off"))?;
        Ok(Pump {
            tcp,
            out: Vec::with_capacity(1 << 20),
            out_at: 0,
            input: Vec::with_capacity(1 << 20),
            scratch: vec![0u8; 64 << 10].into_boxed_slice(),
            counters: LinkCounters::default(),
        })
    }

    fn pending(&self) -> usize {
        self.out.len() - self.out_at
    }

    /// One turn: records from `vnic` to the peer, then from the peer to `vnic`. Returns how
    /// many records moved (0: nothing to do; sleep in [`Pump::wait`]).
    pub fn turn(&mut self, vnic: &mut VnicSet) -> Result<usize, LinkError> {
        let mut moved = 0;
        if self.pending() < OUT_HIGH {
            for lane in vnic.lanes_mut() {
                let k = lane.index() as u8;
                let out = &mut self.out;
                moved += lane.relay_pop(BATCH, |kind, rec| {
                    let kind = match kind {
                        RingKind::Phy => KIND_PHY,
                        RingKind::Flow => KIND_FLOW,
                    };
                    push_frame(out, kind, k, rec);
                })?;
            }
            let out = &mut self.out;
            let (n, vm) = vnic.relay_control_in(|rec| push_frame(out, KIND_CONTROL, 0, rec))?;
            moved += n;
            self.counters.vm_dropped += vm as u64;
        }
        self.counters.records_out += moved as u64;
        self.flush()?;
        moved += self.receive(vnic)?;
        vnic.flush_control()?;
        Ok(moved)
    }

    /// Writes what is queued, as far as the socket takes it.
    fn flush(&mut self) -> Result<(), LinkError> {
        while self.pending() > 0 {
            match self.tcp.write(&self.out[self.out_at..]) {
                Ok(0) => return Err(LinkError::Closed),
                Ok(n) => {
                    self.out_at += n;
                    self.counters.bytes_out += n as u64;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io_err("writing the link")(e)),
            }
        }
        if self.out_at == self.out.len() {
            self.out.clear();
            self.out_at = 0;
        } else if self.out_at > (1 << 20) {
            self.out.drain(..self.out_at);
            self.out_at = 0;
        }
        Ok(())
    }

    /// Reads what the peer sent and hands every complete record to `vnic`.
    fn receive(&mut self, vnic: &mut VnicSet) -> Result<usize, LinkError> {
        // Bounded per turn, so that a fast peer cannot keep this end from sending.
        for _ in 0..64 {
            match self.tcp.read(&mut self.scratch) {
                Ok(0) => return Err(LinkError::Closed),
                Ok(n) => {
                    self.input.extend_from_slice(&self.scratch[..n]);
                    self.counters.bytes_in += n as u64;
                    if self.input.len() > 4 * RECORD_MAX {
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io_err("reading the link")(e)),
            }
        }
        let (mut at, mut n) = (0, 0);
        while self.input.len() - at >= HEADER {
            let h = &self.input[at..at + HEADER];
            let (kind, lane) = (h[0], h[1]);
            let len = u32::from_le_bytes(h[2..6].try_into().expect("four bytes")) as usize;
            if len > RECORD_MAX {
                return Err(LinkError::Frame(format!(
                    "a record of {len} bytes, more than {RECORD_MAX}"
                )));
            }
            if self.input.len() - at - HEADER < len {
                break;
            }
            let rec = &self.input[at + HEADER..at + HEADER + len];
            match kind {
                KIND_PHY | KIND_FLOW => {
                    let ring = if kind == KIND_PHY {
                        RingKind::Phy
                    } else {
                        RingKind::Flow
                    };
                    let Some(l) = vnic.lanes_mut().find(|l| l.index() == usize::from(lane)) else {
                        return Err(LinkError::Frame(format!(
                            "a record for lane {lane}, which this set has not"
                        )));
                    };
                    if !l.relay_push(ring, rec) {
                        self.counters.ring_full += 1;
                    }
                }
                KIND_CONTROL => {
                    if !vnic.relay_control_out(rec)? {
                        self.counters.vm_dropped += 1;
                    }
                }
                k => return Err(LinkError::Frame(format!("a frame of kind {k}"))),
            }
            at += HEADER + len;
            n += 1;
        }
        self.input.drain(..at);
        for l in vnic.lanes_mut() {
            l.kick();
        }
        self.counters.records_in += n as u64;
        Ok(n)
    }

    /// Sleeps until the peer sends, the vNIC set has records, or `timeout` passes.
    pub fn wait(&mut self, vnic: &mut VnicSet, timeout: Duration) -> Result<(), LinkError> {
        let mut asleep = true;
        for l in vnic.lanes_mut() {
            asleep &= l.prepare_sleep();
        }
        if asleep {
            let mut tcp_events = rustix::event::PollFlags::IN;
            if self.pending() > 0 {
                tcp_events |= rustix::event::PollFlags::OUT;
            }
            let mut fds = Vec::with_capacity(2 + vnic.lanes());
            fds.push(rustix::event::PollFd::new(&self.tcp, tcp_events));
            let control = vnic.control_fd();
            fds.push(rustix::event::PollFd::from_borrowed_fd(
                control,
                rustix::event::PollFlags::IN,
            ));
            for b in vnic.bell_fds() {
                fds.push(rustix::event::PollFd::from_borrowed_fd(
                    b,
                    rustix::event::PollFlags::IN,
                ));
            }
            let ts = rustix::time::Timespec::try_from(timeout).unwrap_or(rustix::time::Timespec {
                tv_sec: 1,
                tv_nsec: 0,
            });
            match rustix::event::poll(&mut fds, Some(&ts)) {
                Ok(_) | Err(rustix::io::Errno::INTR) => {}
                Err(e) => {
                    return Err(LinkError::Io {
                        what: "waiting on the link",
                        source: e.into(),
                    });
                }
            }
        }
        for l in vnic.lanes_mut() {
            l.woke();
        }
        Ok(())
    }

    /// Pumps until `stop` says so or either side fails; the error says which.
    pub fn run(&mut self, vnic: &mut VnicSet, stop: impl Fn() -> bool) -> Result<(), LinkError> {
        let mut idle_since = Instant::now();
        while !stop() {
            if self.turn(vnic)? > 0 {
                idle_since = Instant::now();
                continue;
            }
            // Spin briefly before sleeping: a frame that follows within microseconds skips
            // the wake-up.
            if idle_since.elapsed() < Duration::from_micros(50) {
                std::hint::spin_loop();
                continue;
            }
            self.wait(vnic, Duration::from_millis(100))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shm::codec::VatcMsg;
    use crate::shm::vnic::FlowRecord;
    use spillway_fabric::types::{ConnId, Msg};
    use std::net::TcpListener;
    use std::os::unix::net::UnixStream;

    /// A DPU end, and a plane end two relays away: DPU ==set 1== relay A ==TCP== relay P
    /// ==set 2== plane. The relays' pumps run on a thread of their own each.
    struct Chain {
        dpu: VnicSet,
        plane: VnicSet,
        stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
        pumps: Vec<std::thread::JoinHandle<(Result<(), LinkError>, LinkCounters)>>,
    }

    fn chain(lanes: usize) -> Chain {
        let (a, b) = UnixStream::pair().unwrap();
        let dpu = VnicSet::create(a, "workers=1", lanes).unwrap();
        let (relay_a, _) = VnicSet::accept(b).unwrap();
        let (c, d) = UnixStream::pair().unwrap();
        let relay_p = VnicSet::create(c, "workers=1", lanes).unwrap();
        let (plane, _) = VnicSet::accept(d).unwrap();
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let to = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (from, _) = l.accept().unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let pumps = [(relay_a, to), (relay_p, from)]
            .into_iter()
            .map(|(mut v, tcp)| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let mut p = Pump::new(tcp).unwrap();
                    let r = p.run(&mut v, || stop.load(std::sync::atomic::Ordering::Relaxed));
                    (r, p.counters)
                })
            })
            .collect();
        Chain {
            dpu,
            plane,
            stop,
            pumps,
        }
    }

    fn within<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if let Some(t) = f() {
                return t;
            }
            assert!(Instant::now() < deadline, "{what}: not within 5 s");
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    #[test]
    fn records_cross_both_ways_on_their_lanes_and_vm_memory_stays_home() {
        let mut c = chain(2);
        let msg = |conn| Msg::Adopted { conn: ConnId(conn) };
        // DPU to plane: a frame on lane 1, a flow record on lane 0, a control message, and a
        // VM record (which names this host's memory).
        assert!(
            c.dpu
                .lane_mut(1)
                .unwrap()
                .send_frame(&msg(1), 9, &[0; 12], b"frame")
        );
        c.dpu.lane_mut(1).unwrap().kick();
        c.dpu.lane0().send_flow(&msg(2), None);
        c.dpu.kick();
        c.dpu.send_msg(true, &msg(3), None).unwrap();
        let detach = VatcMsg::Detach {
            vm: spillway_fabric::atc::VmId(4),
            epoch: spillway_fabric::atc::AtcEpoch(1),
        };
        c.dpu.send_vm(&detach, &[]).unwrap();
        c.dpu
            .send_json(
                crate::shm::vnic::CONTROL_COMMAND,
                &serde_json::json!({"vatc": true}),
            )
            .unwrap();
        let mut got = Vec::new();
        within("the records at the plane", || {
            if let Some(l) = c.plane.lane_mut(1) {
                l.recv_frames(8, |r| {
                    got.push(format!("phy1 {:?} {}", r.msg.conn(), r.port))
                })
                .unwrap();
            }
            c.plane
                .lane0()
                .recv_flow(8, |r| {
                    if let FlowRecord::Msg(m, _) = r {
                        got.push(format!("flow0 {:?}", m.conn()));
                    }
                })
                .unwrap();
            c.plane
                .recv_control(|ctl| got.push(format!("control {ctl:?}")))
                .unwrap();
            (got.len() >= 4).then_some(())
        });
        assert_eq!(got[0], "phy1 Some(ConnId(1)) 9", "{got:?}");
        assert_eq!(got[1], "flow0 Some(ConnId(2))", "{got:?}");
        assert!(got[2].contains("Adopted"), "{got:?}");
        assert!(got[3].contains("vatc"), "{got:?}");
        // And back: the plane's frame reaches the DPU on the lane it was sent on.
        assert!(c.plane.lane0().send_frame(&msg(5), 2, &[0; 12], b"back"));
        c.plane.kick();
        let back = within("the frame at the DPU", || {
            let mut b = None;
            c.dpu
                .lane0()
                .recv_frames(8, |r| b = Some((r.port, r.frame.to_vec())))
                .unwrap();
            b
        });
        assert_eq!(back, (2, b"back".to_vec()));
        c.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let counters: Vec<LinkCounters> = c
            .pumps
            .into_iter()
            .map(|p| {
                let (r, k) = p.join().unwrap();
                r.unwrap();
                k
            })
            .collect();
        // Relay A dropped the VM record; nothing else was lost.
        assert_eq!(counters[0].vm_dropped, 1, "{counters:?}");
        assert_eq!(counters[0].records_out, 4, "{counters:?}");
        assert_eq!(counters[1].records_in, 4, "{counters:?}");
        assert_eq!(counters[1].ring_full, 0, "{counters:?}");
    }

    #[test]
    fn a_peer_that_breaks_the_framing_or_goes_away_ends_the_pump_with_why() {
        let (a, b) = UnixStream::pair().unwrap();
        let _dpu = VnicSet::create(a, "workers=1", 1).unwrap();
        let (mut v, _) = VnicSet::accept(b).unwrap();
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut peer = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (tcp, _) = l.accept().unwrap();
        let mut p = Pump::new(tcp).unwrap();
        // A record longer than any the link carries: refused before it is read.
        let mut bad = vec![KIND_PHY, 0];
        bad.extend_from_slice(&((RECORD_MAX + 1) as u32).to_le_bytes());
        peer.write_all(&bad).unwrap();
        let e = within("the bad frame seen", || p.turn(&mut v).err());
        assert!(matches!(e, LinkError::Frame(_)), "{e}");
        // A lane the set does not have, and an unknown kind, are refused too.
        for (kind, lane) in [(KIND_FLOW, 7u8), (9u8, 0u8)] {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let mut peer = TcpStream::connect(l.local_addr().unwrap()).unwrap();
            let mut p = Pump::new(l.accept().unwrap().0).unwrap();
            let mut f = Vec::new();
            push_frame(&mut f, kind, lane, b"x");
            peer.write_all(&f).unwrap();
            let e = within("the bad frame seen", || p.turn(&mut v).err());
            assert!(matches!(e, LinkError::Frame(_)), "{e}");
        }
        // A peer that closes: `Closed`.
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let peer = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let mut p = Pump::new(l.accept().unwrap().0).unwrap();
        drop(peer);
        let e = within("the close seen", || p.turn(&mut v).err());
        assert!(matches!(e, LinkError::Closed), "{e}");
    }

    #[test]
    fn a_hello_is_bounded_in_size_and_time() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut peer = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut tcp, _) = l.accept().unwrap();
        send_json(&mut peer, &serde_json::json!({"host": "a"})).unwrap();
        let v = recv_json(&mut tcp, Duration::from_secs(1)).unwrap();
        assert_eq!(v["host"], "a");
        // Nothing comes: a timeout, not a hang.
        let t = Instant::now();
        assert!(matches!(
            recv_json(&mut tcp, Duration::from_millis(100)),
            Err(LinkError::Timeout(_))
        ));
        assert!(t.elapsed() < Duration::from_secs(1));
        // A header announcing more than a hello may be: refused without reading it.
        let mut h = vec![KIND_JSON, 0];
        h.extend_from_slice(&((HELLO_MAX + 1) as u32).to_le_bytes());
        peer.write_all(&h).unwrap();
        assert!(matches!(
            recv_json(&mut tcp, Duration::from_secs(1)),
            Err(LinkError::Frame(_))
        ));
    }
}
