//! The vNIC set between the DPU process and the spill-plane process, one end per process.
//!
//! ```text
//!   DPU process                                     spill-plane process
//!   phy  tx ==== memfd ring "phy.d2h"  =========>  phy  rx   frames steered to the plane
//!   phy  rx <=== memfd ring "phy.h2d"  ==========  phy  tx   frames processed (or punted)
//!   flow tx ==== memfd ring "flow.d2h" =========>  flow rx   state sync (mirror, handover)
//!   flow rx <=== memfd ring "flow.h2d" ==========  flow tx   recalls (inserts), sync back
//!   bell(dpu)  <--- eventfd kicked by the plane when the DPU's rings get records
//!   bell(plane) <-- eventfd kicked by the DPU when the plane's rings get records
//!   control ====== Unix stream socket (length-prefixed records) ======  deletes + acks,
//!                                                                       lifecycle, heartbeats
//! ```
//!
//! The rings and doorbells come in *lanes*, one per forwarding thread (`fabric.dpu.shards`):
//! lane k carries shard k's frames and flow records (and the end markers naming shard k,
//! behind them), so that DPU thread k and the plane's shard k talk with no thread between
//! them ([`VnicLane`], handed to its thread with [`VnicSet::take_lanes`]). The control socket
//! is one per set and stays with whoever holds the set (thread 0 at both ends).
//!
//! Inserts ride the data path (the flow ring), deletions the reliable control channel, as the
//! design asks: a lost delete would leave a stale rule forwarding traffic. The DPU process
//! creates the rings and eventfds and hands them over the control socket with `SCM_RIGHTS`
//! ([`crate::shm::fdpass`]); the plane maps them. A full ring drops the record and counts it (the
//! fabric model has already charged the vNIC's rate; a full ring means the plane is not keeping
//! up, which is the phy vNIC's overflow); a control socket that stays blocked past its buffer
//! means the peer is stalled, which the caller treats as a failed plane.
//!
//! Who may connect: the DPU process starts the plane with a fresh [`SECRET_LEN`]-byte secret
//! on the plane's standard input (a pipe: never in argv or the environment, which other users
//! can read). The DPU process accepts a connection on the vNIC socket only from the pid it
//! started (`SO_PEERCRED`); the plane then sends [`AUTH`] and the secret ([`send_auth`]),
//! which the DPU process compares in constant time ([`check_auth`]) before it hands over any
//! ring. The plane in turn connects only to a listener run by its parent.
//!
//! Handshake: after the secret, the DPU process sends [`HELLO`] `lanes=N` and lane 0's six
//! descriptors, then one record `lane K` with each other lane's.
//!
//! Records: phy = `msg port:u32 vnet:12B frame`, flow = `msg snapshot`, control =
//! `len:u32 kind:u8 body` where the body is `msg snapshot` or a JSON document (see
//! [`crate::shm::codec`]).

use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;

use spillway_fabric::frame::Outgoing;
use spillway_fabric::types::{Channel, Msg};
use spillway_vswitch::conntrack::CtSnapshot;

use crate::shm::codec::{self, CodecError, Reader, VatcMsg};
use crate::shm::fdpass;
use crate::shm::ring::{Consumer, Doorbell, Producer, SharedRing};

/// Bytes of each phy ring: room for a few hundred 64 KiB TSO frames or tens of thousands of
/// small ones.
pub const PHY_RING_BYTES: usize = 32 << 20;
/// Bytes of each flow ring.
pub const FLOW_RING_BYTES: usize = 4 << 20;
/// Control bytes buffered towards a peer that is not reading before it counts as stalled.
pub const CONTROL_BUF_MAX: usize = 4 << 20;

/// How often a busy loop reads the control socket ([`VnicSet::recv_control_paced`]), ns.
pub const CONTROL_READ_EVERY_NS: u64 = 200_000;

/// What one `recvmsg` on the control socket reads at most, and what one read of it takes at
/// most, in bytes.
const CONTROL_READ_CHUNK: usize = 16 << 10;
const CONTROL_READ_MAX: usize = 256 << 10;
/// The handshake's greeting.
pub const HELLO: &[u8] = b"spillway-vnic-v2";

/// The plane's first bytes on the vNIC socket, followed by the secret.
pub const AUTH: &[u8] = b"spillway-vnic-auth-v1 ";
/// Bytes of the handshake secret.
pub const SECRET_LEN: usize = 32;

/// A fresh handshake secret from the kernel's random source.
pub fn new_secret() -> io::Result<[u8; SECRET_LEN]> {
    let mut s = [0u8; SECRET_LEN];
    io::Read::read_exact(&mut std::fs::File::open("/dev/urandom")?, &mut s)?;
    Ok(s)
}

/// The plane's side of the handshake: [`AUTH`] and the secret.
pub fn send_auth(control: &UnixStream, secret: &[u8; SECRET_LEN]) -> Result<(), VnicError> {
    let mut msg = AUTH.to_vec();
    msg.extend_from_slice(secret);
    let mut w = control;
    w.write_all(&msg)
        .map_err(io_err("sending the handshake secret"))
}

/// The DPU's side: reads [`AUTH`] and the secret (waiting at most `timeout`) and compares the
/// secret with `secret` in constant time. Any mismatch is a [`VnicError::Handshake`] that says
/// what was wrong but not what was expected.
pub fn check_auth(
    control: &UnixStream,
    secret: &[u8; SECRET_LEN],
    timeout: std::time::Duration,
) -> Result<(), VnicError> {
    let mut got = [0u8; AUTH.len() + SECRET_LEN];
    control
        .set_read_timeout(Some(timeout))
        .map_err(io_err("setting the handshake timeout"))?;
    let r = io::Read::read_exact(&mut &*control, &mut got);
    control
        .set_read_timeout(None)
        .map_err(io_err("clearing the handshake timeout"))?;
    r.map_err(io_err("reading the handshake secret"))?;
    let (greeting, theirs) = got.split_at(AUTH.len());
    if greeting != AUTH {
        return Err(VnicError::Handshake("not a spillway vNIC greeting".into()));
    }
    if !secrets_equal(theirs, secret) {
        return Err(VnicError::Handshake("wrong secret".into()));
    }
    Ok(())
}

/// Whether two secrets are equal, comparing every byte whatever the earlier ones were: the
/// time taken says nothing about how much of a guess was right (only whether the lengths
/// differ).
pub fn secrets_equal(a: &[u8], b: &[u8]) -> bool {
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    a.len() == b.len() && std::hint::black_box(diff) == 0
}

/// Control record kind: a fabric message (+ snapshot).
pub const CONTROL_MSG: u8 = 0;
/// Control record kind: the plane's statistics (JSON), plane to DPU.
pub const CONTROL_STATS: u8 = 1;
/// Control record kind: an operator's command for the plane (JSON), DPU to plane.
pub const CONTROL_COMMAND: u8 = 2;

/// Control record kind: a shared-memory VM port's life and its vATC traffic (attach with the
/// VM's memory and interrupt fds, detach, translation requests and answers), a
/// [`VatcMsg`] in the binary codec.
pub const CONTROL_VM: u8 = 3;

/// Flow-ring record kind byte of a conntrack update (fabric messages start with their own tag,
/// which is never this value).
pub const FLOW_CT: u8 = 0xff;

/// The two kinds of ring of a lane, for a relay that moves their records as they are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RingKind {
    /// Frames (`phy.*`).
    Phy,
    /// State sync and recalls (`flow.*`).
    Flow,
}

/// A record from the flow ring.
#[derive(Debug)]
pub enum FlowRecord {
    /// A fabric message and the conntrack snapshot riding on it.
    Msg(Msg, Option<CtSnapshot>),
    /// The owner's conntrack entry after a TCP state change ([`VnicSet::send_ct`]).
    Ct(CtSnapshot),
}

/// A record from the control socket.
#[derive(Debug)]
pub enum Control {
    /// A fabric message and the conntrack snapshot riding on it.
    Msg(Msg, Option<CtSnapshot>),
    /// A JSON document of the given kind.
    Json(u8, serde_json::Value),
    /// A [`CONTROL_VM`] message and the fds that came with it ([`VatcMsg::fds`] of them).
    Vm(VatcMsg, Vec<OwnedFd>),
}

/// Which end of the set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// The DPU process (creates the rings).
    Dpu,
    /// The spill-plane process.
    Plane,
}

/// Errors on the vNIC set.
#[derive(Debug, thiserror::Error)]
pub enum VnicError {
    /// I/O on the control socket or setting up the rings.
    #[error("vnic {what}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The error.
        source: io::Error,
    },
    /// A ring failed (corrupt header or record).
    #[error("vnic ring {ring}: {detail}")]
    Ring {
        /// Which ring.
        ring: &'static str,
        /// What went wrong.
        detail: String,
    },
    /// A record did not decode.
    #[error("vnic record on {channel}: {source}")]
    Codec {
        /// Which channel.
        channel: &'static str,
        /// The error.
        source: CodecError,
    },
    /// The peer closed the control socket.
    #[error("vnic control socket closed by the peer")]
    Closed,
    /// The peer does not read its control socket.
    #[error("vnic control socket: {0} bytes queued towards a peer that is not reading")]
    Stalled(usize),
    /// The handshake went wrong.
    #[error("vnic handshake: {0}")]
    Handshake(String),
}

fn io_err(what: &'static str) -> impl FnOnce(io::Error) -> VnicError {
    move |source| VnicError::Io { what, source }
}

/// Counters of one end.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VnicCounters {
    /// `vnic.phy.tx`: frames pushed.
    pub phy_tx: u64,
    /// `vnic.phy.rx`: frames popped.
    pub phy_rx: u64,
    /// `vnic.phy.full`: frames dropped on a full phy ring.
    pub phy_full: u64,
    /// `vnic.flow.tx`: flow records pushed.
    pub flow_tx: u64,
    /// `vnic.flow.rx`: flow records popped.
    pub flow_rx: u64,
    /// `vnic.flow.full`: flow records dropped on a full ring.
    pub flow_full: u64,
    /// `vnic.control.tx`: control records sent.
    pub control_tx: u64,
    /// `vnic.control.rx`: control records received.
    pub control_rx: u64,
    /// `vnic.kicks`: doorbell kicks sent.
    pub kicks: u64,
}

/// Lanes a vNIC set may have: one per forwarding thread of the DPU process (and thread of the
/// plane), so that a connection's frames and state travel between the two threads that own
/// it and no other thread relays them.
pub const LANES_MAX: usize = 64;

/// Descriptors of one lane: four rings and two doorbells.
const LANE_FDS: usize = 6;

/// One lane of the set: the phy and flow rings in both directions and the two doorbells. Lane
/// `k` carries what concerns shard `k`'s connections (and the lifecycle's end markers naming
/// shard `k`, behind that shard's records); a lane is moved to the thread that serves its
/// shard ([`VnicSet::take_lanes`]).
#[derive(Debug)]
pub struct VnicLane {
    index: usize,
    phy_tx: Producer,
    phy_rx: Consumer,
    flow_tx: Producer,
    flow_rx: Consumer,
    /// Kicked when the peer's rings get records.
    peer_bell: Doorbell,
    /// Waited on for this end's rings.
    my_bell: Doorbell,
    scratch: Vec<u8>,
    kick_pending: bool,
    counters: VnicCounters,
}

/// One end of the vNIC set: its lanes (lane 0 always here, the others until taken) and the
/// control socket, which stays with whoever holds the set.
#[derive(Debug)]
pub struct VnicSet {
    lane: VnicLane,
    /// Lanes `1..` until [`VnicSet::take_lanes`].
    others: Vec<VnicLane>,
    lanes: usize,
    control: UnixStream,
    control_in: Vec<u8>,
    /// What one `recvmsg` on the control socket reads into (kept, so that a loop turn does not
    /// clear 16 KiB on its stack to find the socket empty).
    control_buf: Box<[u8]>,
    /// When [`VnicSet::recv_control_paced`] last read the control socket, ns, and whether the
    /// loop slept since (then it reads at once: the socket may be what woke it).
    control_read_at: u64,
    control_woke: bool,
    /// Fds received on the control socket, in order, until their record takes them.
    control_fds: std::collections::VecDeque<OwnedFd>,
    control_out: Vec<u8>,
    scratch: Vec<u8>,
    counters: VnicCounters,
}

/// A receive batch's outcome: the records popped, or the ring's error, or the first record that
/// did not decode (the batch's other records were handed over; a bad record means a broken
/// peer, which the caller treats as a failed plane).
fn popped(
    ring: &'static str,
    n: Result<usize, crate::shm::ring::RingError>,
    bad: Option<CodecError>,
) -> Result<usize, VnicError> {
    let n = n.map_err(|e| VnicError::Ring {
        ring,
        detail: e.to_string(),
    })?;
    match bad {
        Some(source) => Err(VnicError::Codec {
            channel: ring,
            source,
        }),
        None => Ok(n),
    }
}

/// The sending half of the phy ring, lent to a receive callback.
#[derive(Debug)]
pub struct PhyTx<'a> {
    phy_tx: &'a mut Producer,
    scratch: &'a mut Vec<u8>,
    counters: &'a mut VnicCounters,
    kick_pending: &'a mut bool,
}

impl PhyTx<'_> {
    /// Pushes a frame with its message; false (and counted) if the ring is full.
    pub fn send_frame(&mut self, msg: &Msg, port: u32, vnet: &[u8; 12], frame: &[u8]) -> bool {
        self.scratch.clear();
        codec::encode_msg(self.scratch, msg);
        codec::encode_port(self.scratch, port);
        self.scratch.extend_from_slice(vnet);
        match self
            .phy_tx
            .try_push_parts(&[self.scratch.as_slice(), frame])
        {
            Ok(()) => {
                self.counters.phy_tx += 1;
                *self.kick_pending |= self.phy_tx.needs_kick();
                true
            }
            Err(_) => {
                self.counters.phy_full += 1;
                false
            }
        }
    }
}

/// A phy-vNIC record as received.
#[derive(Debug)]
pub struct PhyRecord<'a> {
    /// `Packets` or `Punt`.
    pub msg: Msg,
    /// Port the frame entered on (DPU to plane) or leaves by (plane to DPU).
    pub port: u32,
    /// The virtio-net header bytes.
    pub vnet: &'a [u8; 12],
    /// The Ethernet frame.
    pub frame: &'a [u8],
}

/// A phy-ring record: the message, the port, the virtio-net header, the frame.
fn parse_phy(rec: &[u8]) -> Result<PhyRecord<'_>, CodecError> {
    let mut r = Reader::new(rec);
    let msg = codec::decode_msg(&mut r)?;
    let port = r.u32("phy.port")?;
    let rest = r.rest();
    let Some((vnet, frame)) = rest.split_first_chunk::<12>() else {
        return Err(CodecError::Truncated {
            field: "phy.vnet",
            need: 12,
            have: rest.len(),
        });
    };
    Ok(PhyRecord {
        msg,
        port,
        vnet,
        frame,
    })
}

fn ring_err(ring: &'static str) -> impl Fn(crate::shm::ring::RingError) -> VnicError {
    move |e| VnicError::Ring {
        ring,
        detail: e.to_string(),
    }
}

/// The DPU end's half of a new lane, and the six descriptors the plane maps.
struct NewLane {
    phy_d2h: SharedRing,
    phy_h2d: SharedRing,
    flow_d2h: SharedRing,
    flow_h2d: SharedRing,
    bell_dpu: Doorbell,
    bell_plane: Doorbell,
}

impl NewLane {
    fn create() -> Result<NewLane, VnicError> {
        let ring = |name: &'static str, bytes| {
            SharedRing::create(name, bytes).map_err(|e| VnicError::Ring {
                ring: name,
                detail: e.to_string(),
            })
        };
        let bell = |name: &'static str| {
            Doorbell::new().map_err(|e| VnicError::Ring {
                ring: name,
                detail: e.to_string(),
            })
        };
        Ok(NewLane {
            phy_d2h: ring("phy.d2h", PHY_RING_BYTES)?,
            phy_h2d: ring("phy.h2d", PHY_RING_BYTES)?,
            flow_d2h: ring("flow.d2h", FLOW_RING_BYTES)?,
            flow_h2d: ring("flow.h2d", FLOW_RING_BYTES)?,
            bell_dpu: bell("doorbell of the DPU")?,
            bell_plane: bell("doorbell of the plane")?,
        })
    }

    fn fds(&self) -> [BorrowedFd<'_>; LANE_FDS] {
        [
            self.phy_d2h.fd(),
            self.phy_h2d.fd(),
            self.flow_d2h.fd(),
            self.flow_h2d.fd(),
            self.bell_dpu.as_fd(),
            self.bell_plane.as_fd(),
        ]
    }

    fn into_dpu_end(self, index: usize) -> Result<VnicLane, VnicError> {
        Ok(VnicLane::new(
            index,
            self.phy_d2h.into_producer().map_err(ring_err("phy.d2h"))?,
            self.phy_h2d.into_consumer().map_err(ring_err("phy.h2d"))?,
            self.flow_d2h
                .into_producer()
                .map_err(ring_err("flow.d2h"))?,
            self.flow_h2d
                .into_consumer()
                .map_err(ring_err("flow.h2d"))?,
            self.bell_plane,
            self.bell_dpu,
        ))
    }
}

impl VnicSet {
    /// Creates `lanes` lanes (four rings and two doorbells each; DPU end) and hands the
    /// plane's halves over `control`: the greeting [`HELLO`] `lanes=N` and `hello_extra` with
    /// lane 0's descriptors, then one record `lane K` with each other lane's.
    pub fn create(
        control: UnixStream,
        hello_extra: &str,
        lanes: usize,
    ) -> Result<VnicSet, VnicError> {
        if !(1..=LANES_MAX).contains(&lanes) {
            return Err(VnicError::Handshake(format!(
                "{lanes} lanes asked for; a set has 1 to {LANES_MAX}"
            )));
        }
        let mut ends = Vec::with_capacity(lanes);
        for k in 0..lanes {
            let lane = NewLane::create()?;
            let text = match k {
                0 => format!(
                    "{} lanes={lanes} {hello_extra}",
                    std::str::from_utf8(HELLO).expect("ascii")
                ),
                k => format!("lane {k}"),
            };
            fdpass::send_with_fds(&control, text.as_bytes(), &lane.fds())
                .map_err(io_err("handing the rings to the plane"))?;
            ends.push(lane.into_dpu_end(k)?);
        }
        VnicSet::assemble(control, ends)
    }

    /// The plane's end: receives the lanes over `control`; returns the set and the greeting's
    /// extra text.
    pub fn accept(control: UnixStream) -> Result<(VnicSet, String), VnicError> {
        let mut buf = vec![0u8; 4096];
        let (lane0, text) = accept_lane(&control, &mut buf, 0)?;
        let Some(rest) = text.strip_prefix(std::str::from_utf8(HELLO).expect("ascii")) else {
            return Err(VnicError::Handshake(format!(
                "unexpected greeting {text:?}"
            )));
        };
        let rest = rest.trim_start();
        let (count, extra) = rest.split_once(' ').unwrap_or((rest, ""));
        let lanes = count
            .strip_prefix("lanes=")
            .and_then(|n| n.parse::<usize>().ok())
            .filter(|n| (1..=LANES_MAX).contains(n))
            .ok_or_else(|| {
                VnicError::Handshake(format!(
                    "greeting {text:?}: expected lanes=N with N from 1 to {LANES_MAX}"
                ))
            })?;
        let mut ends = vec![lane0];
        for k in 1..lanes {
            let (lane, text) = accept_lane(&control, &mut buf, k)?;
            if text != format!("lane {k}") {
                return Err(VnicError::Handshake(format!(
                    "expected lane {k}'s record, got {text:?}"
                )));
            }
            ends.push(lane);
        }
        Ok((VnicSet::assemble(control, ends)?, extra.trim().to_string()))
    }

    fn assemble(control: UnixStream, mut lanes: Vec<VnicLane>) -> Result<VnicSet, VnicError> {
        control
            .set_nonblocking(true)
            .map_err(io_err("setting the control socket non-blocking"))?;
        let n = lanes.len();
        let others = lanes.split_off(1);
        let lane = lanes.pop().expect("a set has lane 0");
        Ok(VnicSet {
            lane,
            others,
            lanes: n,
            control,
            control_in: Vec::with_capacity(64 << 10),
            control_buf: vec![0; CONTROL_READ_CHUNK].into_boxed_slice(),
            control_read_at: 0,
            control_woke: true,
            control_fds: std::collections::VecDeque::new(),
            control_out: Vec::with_capacity(64 << 10),
            scratch: Vec::with_capacity(256),
            counters: VnicCounters::default(),
        })
    }

    /// How many lanes the set was made with.
    pub fn lanes(&self) -> usize {
        self.lanes
    }

    /// Lane 0, which stays with the set.
    pub fn lane0(&mut self) -> &mut VnicLane {
        &mut self.lane
    }

    /// Lane 0 alone; the control socket closes.
    pub fn into_lane0(self) -> VnicLane {
        self.lane
    }

    /// Lane `k` while the set still holds it.
    pub fn lane_mut(&mut self, k: usize) -> Option<&mut VnicLane> {
        match k {
            0 => Some(&mut self.lane),
            k => self.others.iter_mut().find(|l| l.index == k),
        }
    }

    /// Lanes `1..`, in order, for the threads that serve their shards; the set keeps lane 0
    /// and the control socket.
    pub fn take_lanes(&mut self) -> Vec<VnicLane> {
        std::mem::take(&mut self.others)
    }

    /// Counters: lane 0's rings and the control socket.
    pub fn counters(&self) -> VnicCounters {
        VnicCounters {
            control_tx: self.counters.control_tx,
            control_rx: self.counters.control_rx,
            ..self.lane.counters
        }
    }

    /// The fds to poll for input: lane 0's doorbell and the control socket.
    pub fn poll_fds(&self) -> [BorrowedFd<'_>; 2] {
        [self.lane.my_bell.as_fd(), self.control.as_fd()]
    }

    /// Pushes a frame with its message on lane 0's phy ring; false (and counted) if the ring
    /// is full.
    pub fn send_frame(&mut self, msg: &Msg, port: u32, vnet: &[u8; 12], frame: &[u8]) -> bool {
        self.lane.send_frame(msg, port, vnet, frame)
    }

    /// Sends a message (with the conntrack snapshot of its connection, if any) on lane 0's
    /// flow ring or the control socket.
    pub fn send_msg(
        &mut self,
        control: bool,
        msg: &Msg,
        snap: Option<&CtSnapshot>,
    ) -> Result<bool, VnicError> {
        if !control {
            return Ok(self.lane.send_flow(msg, snap));
        }
        self.scratch.clear();
        codec::encode_msg(&mut self.scratch, msg);
        codec::encode_snapshot(&mut self.scratch, snap);
        let len = self.scratch.len() as u32 + 1;
        self.control_out.extend_from_slice(&len.to_le_bytes());
        self.control_out.push(CONTROL_MSG);
        self.control_out.extend_from_slice(&self.scratch);
        self.counters.control_tx += 1;
        self.flush_control()?;
        Ok(true)
    }

    /// Sends a JSON document on the control socket: the plane's statistics, or an operator's
    /// command for the plane (records of kind [`CONTROL_STATS`] / [`CONTROL_COMMAND`]).
    pub fn send_json(&mut self, kind: u8, doc: &serde_json::Value) -> Result<(), VnicError> {
        let body = serde_json::to_vec(doc).expect("a JSON value serialises");
        let len = body.len() as u32 + 1;
        self.control_out.extend_from_slice(&len.to_le_bytes());
        self.control_out.push(kind);
        self.control_out.extend_from_slice(&body);
        self.counters.control_tx += 1;
        self.flush_control()
    }

    /// Sends a [`CONTROL_VM`] message with `fds` (as many as [`VatcMsg::fds`] says) attached to
    /// its first byte. Rare (a port attaches): with fds, the buffered control bytes are written
    /// out first, blocking, so that the fds ride on this record's bytes and no other.
    pub fn send_vm(&mut self, msg: &VatcMsg, fds: &[BorrowedFd<'_>]) -> Result<(), VnicError> {
        // The receiver takes as many fds as the variant says: more would be handed to a later
        // record, fewer would break the channel.
        debug_assert_eq!(fds.len(), msg.fds(), "{msg:?}");
        self.scratch.clear();
        codec::encode_vatc(&mut self.scratch, msg);
        let len = self.scratch.len() as u32 + 1;
        if fds.is_empty() {
            self.control_out.extend_from_slice(&len.to_le_bytes());
            self.control_out.push(CONTROL_VM);
            self.control_out.extend_from_slice(&self.scratch);
            self.counters.control_tx += 1;
            return self.flush_control();
        }
        let mut rec = Vec::with_capacity(5 + self.scratch.len());
        rec.extend_from_slice(&len.to_le_bytes());
        rec.push(CONTROL_VM);
        rec.extend_from_slice(&self.scratch);
        self.control
            .set_nonblocking(false)
            .map_err(io_err("control socket"))?;
        let r = (|| {
            let pending = std::mem::take(&mut self.control_out);
            self.control
                .write_all(&pending)
                .map_err(io_err("writing the control socket"))?;
            crate::shm::fdpass::send_with_fds(&self.control, &rec, fds)
                .map_err(io_err("handing a VM's memory to the peer"))
        })();
        self.control
            .set_nonblocking(true)
            .map_err(io_err("control socket"))?;
        self.counters.control_tx += 1;
        r
    }

    /// Writes buffered control bytes; an error if the peer is gone or stalled.
    pub fn flush_control(&mut self) -> Result<(), VnicError> {
        while !self.control_out.is_empty() {
            match self.control.write(&self.control_out) {
                Ok(0) => return Err(VnicError::Closed),
                Ok(n) => {
                    self.control_out.drain(..n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::BrokenPipe => return Err(VnicError::Closed),
                Err(e) => return Err(io_err("writing the control socket")(e)),
            }
        }
        if self.control_out.len() > CONTROL_BUF_MAX {
            return Err(VnicError::Stalled(self.control_out.len()));
        }
        Ok(())
    }

    /// Kicks the peer if a push on lane 0 since the last call found it asleep.
    pub fn kick(&mut self) {
        self.lane.kick();
    }

    /// [`VnicLane::reclaim_frames`] of lane 0.
    pub fn reclaim_frames(
        &mut self,
        max: usize,
        f: impl FnMut(PhyRecord<'_>),
    ) -> Result<usize, VnicError> {
        self.lane.reclaim_frames(max, f)
    }

    /// Pops up to `max` phy records of lane 0.
    pub fn recv_frames(
        &mut self,
        max: usize,
        f: impl FnMut(PhyRecord<'_>),
    ) -> Result<usize, VnicError> {
        self.lane.recv_frames(max, f)
    }

    /// Pops up to `max` phy records of lane 0; see [`VnicLane::recv_frames_tx`].
    pub fn recv_frames_tx(
        &mut self,
        max: usize,
        f: impl FnMut(PhyRecord<'_>, &mut PhyTx<'_>),
    ) -> Result<usize, VnicError> {
        self.lane.recv_frames_tx(max, f)
    }

    /// Pops up to `max` flow records of lane 0.
    pub fn recv_flow(&mut self, max: usize, f: impl FnMut(FlowRecord)) -> Result<usize, VnicError> {
        self.lane.recv_flow(max, f)
    }

    /// Sends what a frame node has for the other side: a fabric message with its snapshot (on
    /// the control channel, or lane `lane`'s flow ring, as the node says), or a conntrack
    /// change (on that flow ring; a full ring drops it, counted, as [`VnicLane::send_ct`]
    /// says). A lane the set no longer holds is lane 0.
    pub fn send_outgoing_on(&mut self, lane: usize, o: &Outgoing) -> Result<(), VnicError> {
        if let Outgoing::Msg {
            channel: Channel::Control,
            msg,
            snapshot,
        } = o
        {
            self.send_msg(true, msg, snapshot.as_ref())?;
            return Ok(());
        }
        let l = match lane {
            0 => &mut self.lane,
            k => match self.others.iter_mut().find(|l| l.index == k) {
                Some(l) => l,
                None => &mut self.lane,
            },
        };
        l.send_outgoing_flow(o);
        Ok(())
    }

    /// [`VnicSet::send_outgoing_on`] lane 0.
    pub fn send_outgoing(&mut self, o: &Outgoing) -> Result<(), VnicError> {
        self.send_outgoing_on(0, o)
    }

    /// Sends the owner's conntrack entry on lane 0; see [`VnicLane::send_ct`].
    pub fn send_ct(&mut self, snap: &CtSnapshot) -> bool {
        self.lane.send_ct(snap)
    }

    /// Reads what the control socket has into `control_in`, and the fds that came with it
    /// (kept for their records, or closed: a relay forwards no fds).
    fn read_control(&mut self, keep_fds: bool) -> Result<(), VnicError> {
        // At most CONTROL_READ_MAX bytes a call: a peer that writes without pause does not hold
        // the loop (the rest waits in the socket for the next turn).
        let mut read = 0;
        while read < CONTROL_READ_MAX {
            // recvmsg, not read: a VM attach record carries fds, which a plain read would close.
            let buf = &mut self.control_buf;
            match crate::shm::fdpass::recv_with_fds(&self.control, buf, codec::VATC_FDS_MAX) {
                Ok((0, _)) => return Err(VnicError::Closed),
                Ok((n, fds)) => {
                    read += n;
                    self.control_in.extend_from_slice(&buf[..n]);
                    if keep_fds {
                        self.control_fds.extend(fds);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {
                    return Err(VnicError::Closed);
                }
                Err(e) => return Err(io_err("reading the control socket")(e)),
            }
        }
        Ok(())
    }

    /// Hands `f` every complete record read so far (its kind byte and body, never empty), with
    /// the fds queued for the records, and drops them; returns how many. A length past
    /// [`CONTROL_BUF_MAX`] or of 0 breaks the channel, as does an error from `f`.
    fn each_control_record(
        &mut self,
        mut f: impl FnMut(&[u8], &mut std::collections::VecDeque<OwnedFd>) -> Result<(), VnicError>,
    ) -> Result<usize, VnicError> {
        let input = std::mem::take(&mut self.control_in);
        let (mut at, mut n) = (0, 0);
        let r = (|| {
            while input.len() - at >= 4 {
                let len =
                    u32::from_le_bytes(input[at..at + 4].try_into().expect("four bytes")) as usize;
                let source = match len {
                    0 => CodecError::Truncated {
                        field: "control.kind",
                        need: 1,
                        have: 0,
                    },
                    l if l > CONTROL_BUF_MAX => CodecError::BadValue {
                        field: "control.len",
                        value: l as u64,
                    },
                    _ if input.len() - at - 4 < len => break,
                    _ => {
                        f(&input[at + 4..at + 4 + len], &mut self.control_fds)?;
                        at += 4 + len;
                        n += 1;
                        continue;
                    }
                };
                return Err(VnicError::Codec {
                    channel: "control",
                    source,
                });
            }
            Ok(())
        })();
        self.control_in = input;
        self.control_in.drain(..at);
        self.counters.control_rx += n as u64;
        r.map(|()| n)
    }

    /// [`VnicSet::recv_control`] for a loop that runs many turns a millisecond: reads the
    /// socket on the first turn after the loop's `poll` found it readable
    /// ([`VnicSet::polled`]) or once [`CONTROL_READ_EVERY_NS`] have passed since the last
    /// read, and hands over nothing otherwise. The control socket has no shared-memory index to look at, so each look is a
    /// system call; looking every turn cost the spill plane about a tenth of its CPU under a
    /// 64-byte flood. Whatever arrives meanwhile waits at most that long (the loop's sleep
    /// wakes on the socket as before).
    pub fn recv_control_paced(
        &mut self,
        now_ns: u64,
        f: impl FnMut(Control),
    ) -> Result<usize, VnicError> {
        if !self.control_woke && now_ns.saturating_sub(self.control_read_at) < CONTROL_READ_EVERY_NS
        {
            return Ok(0);
        }
        self.control_woke = false;
        self.control_read_at = now_ns;
        self.recv_control(f)
    }

    /// After the loop's `poll` over `set`, which holds this set's control socket among its
    /// entries: if `poll` found the socket readable (or closed), the next
    /// [`VnicSet::recv_control_paced`] reads it.
    pub fn polled(&mut self, set: &[libc::pollfd]) {
        let fd = self.control.as_raw_fd();
        if set.iter().any(|p| p.fd == fd && p.revents != 0) {
            self.control_woke = true;
        }
    }

    /// Reads the control socket and hands every complete record to `f`.
    pub fn recv_control(&mut self, mut f: impl FnMut(Control)) -> Result<usize, VnicError> {
        self.read_control(true)?;
        let codec_err = |source| VnicError::Codec {
            channel: "control",
            source,
        };
        self.each_control_record(|rec, fds| {
            let (&kind, body) = rec.split_first().expect("records are never empty");
            match kind {
                CONTROL_MSG => {
                    let mut r = Reader::new(body);
                    let (m, s) = codec::decode_msg(&mut r)
                        .and_then(|m| codec::decode_snapshot(&mut r).map(|s| (m, s)))
                        .map_err(codec_err)?;
                    f(Control::Msg(m, s));
                }
                CONTROL_VM => {
                    let msg = codec::decode_vatc(body).map_err(codec_err)?;
                    let want = msg.fds();
                    if want > fds.len() {
                        return Err(codec_err(CodecError::BadValue {
                            field: "control.fds",
                            value: want as u64,
                        }));
                    }
                    let fds = fds.drain(..want).collect();
                    f(Control::Vm(msg, fds));
                }
                CONTROL_STATS | CONTROL_COMMAND => {
                    let doc = serde_json::from_slice(body).map_err(|_| {
                        codec_err(CodecError::BadValue {
                            field: "control.json",
                            value: body.len() as u64,
                        })
                    })?;
                    f(Control::Json(kind, doc));
                }
                kind => {
                    return Err(codec_err(CodecError::BadValue {
                        field: "control.kind",
                        value: u64::from(kind),
                    }));
                }
            }
            Ok(())
        })
    }

    /// Every lane of the set (lane 0 first), for a relay that serves them all on one thread.
    pub fn lanes_mut(&mut self) -> impl Iterator<Item = &mut VnicLane> {
        std::iter::once(&mut self.lane).chain(self.others.iter_mut())
    }

    /// For a relay (`crate::remote`): reads the control socket and hands `f` every complete
    /// record as it is (its kind byte and body, without the length), undecoded, except
    /// [`CONTROL_VM`] records: a VM's memory (the fds some carry) cannot leave this host, so
    /// they and any fds that came are dropped, and counted in the returned second figure.
    pub fn relay_control_in(
        &mut self,
        mut f: impl FnMut(&[u8]),
    ) -> Result<(usize, usize), VnicError> {
        self.read_control(false)?;
        let mut vm = 0;
        let n = self.each_control_record(|rec, _| {
            if rec[0] == CONTROL_VM {
                vm += 1;
            } else {
                f(rec);
            }
            Ok(())
        })?;
        Ok((n - vm, vm))
    }

    /// For a relay: sends `rec` (a kind byte and body, as [`VnicSet::relay_control_in`] gave
    /// it on the other side) on the control socket. [`CONTROL_VM`] records are refused
    /// (false): they name memory of the other host.
    pub fn relay_control_out(&mut self, rec: &[u8]) -> Result<bool, VnicError> {
        if rec.is_empty() || rec[0] == CONTROL_VM || rec.len() > CONTROL_BUF_MAX {
            return Ok(false);
        }
        self.control_out
            .extend_from_slice(&(rec.len() as u32).to_le_bytes());
        self.control_out.extend_from_slice(rec);
        self.counters.control_tx += 1;
        self.flush_control()?;
        Ok(true)
    }

    /// The control socket's fd, to poll.
    pub fn control_fd(&self) -> BorrowedFd<'_> {
        self.control.as_fd()
    }

    /// Every lane's doorbell fd (this end's), to poll.
    pub fn bell_fds(&self) -> impl Iterator<Item = BorrowedFd<'_>> {
        std::iter::once(&self.lane)
            .chain(self.others.iter())
            .map(|l| l.my_bell.as_fd())
    }

    /// Before sleeping in `poll`: arms lane 0's doorbell. False if records arrived meanwhile
    /// (do not sleep).
    pub fn prepare_sleep(&mut self) -> bool {
        self.lane.prepare_sleep()
    }

    /// After waking: disarms lane 0's doorbell and clears its count.
    pub fn woke(&mut self) {
        self.lane.woke();
    }
}

/// Receives lane `index`'s record (its text and six descriptors) and maps the lane.
fn accept_lane(
    control: &UnixStream,
    buf: &mut [u8],
    index: usize,
) -> Result<(VnicLane, String), VnicError> {
    let (n, fds) =
        fdpass::recv_with_fds(control, buf, LANE_FDS).map_err(io_err("receiving the rings"))?;
    let text = String::from_utf8_lossy(&buf[..n]).to_string();
    let [phy_d2h, phy_h2d, flow_d2h, flow_h2d, bell_dpu, bell_plane]: [OwnedFd; LANE_FDS] =
        fds.try_into().map_err(|v: Vec<OwnedFd>| {
            VnicError::Handshake(format!(
                "lane {index}: expected {LANE_FDS} descriptors, got {}",
                v.len()
            ))
        })?;
    let map = |name: &'static str, fd| SharedRing::from_fd(fd).map_err(ring_err(name));
    let lane = VnicLane::new(
        index,
        map("phy.h2d", phy_h2d)?
            .into_producer()
            .map_err(ring_err("phy.h2d"))?,
        map("phy.d2h", phy_d2h)?
            .into_consumer()
            .map_err(ring_err("phy.d2h"))?,
        map("flow.h2d", flow_h2d)?
            .into_producer()
            .map_err(ring_err("flow.h2d"))?,
        map("flow.d2h", flow_d2h)?
            .into_consumer()
            .map_err(ring_err("flow.d2h"))?,
        Doorbell::from_fd(bell_dpu).map_err(ring_err("doorbell of the DPU"))?,
        Doorbell::from_fd(bell_plane).map_err(ring_err("doorbell of the plane"))?,
    );
    Ok((lane, text))
}

impl VnicLane {
    fn new(
        index: usize,
        phy_tx: Producer,
        phy_rx: Consumer,
        flow_tx: Producer,
        flow_rx: Consumer,
        peer_bell: Doorbell,
        my_bell: Doorbell,
    ) -> VnicLane {
        VnicLane {
            index,
            phy_tx,
            phy_rx,
            flow_tx,
            flow_rx,
            peer_bell,
            my_bell,
            scratch: Vec::with_capacity(256),
            kick_pending: false,
            counters: VnicCounters::default(),
        }
    }

    /// Which lane this is (the shard it carries).
    pub fn index(&self) -> usize {
        self.index
    }

    /// Counters of this lane's rings.
    pub fn counters(&self) -> &VnicCounters {
        &self.counters
    }

    /// This end's doorbell, to poll while asleep.
    pub fn bell_fd(&self) -> BorrowedFd<'_> {
        self.my_bell.as_fd()
    }

    /// Pushes a frame with its message on the phy ring; false (and counted) if the ring is full.
    pub fn send_frame(&mut self, msg: &Msg, port: u32, vnet: &[u8; 12], frame: &[u8]) -> bool {
        PhyTx {
            phy_tx: &mut self.phy_tx,
            scratch: &mut self.scratch,
            counters: &mut self.counters,
            kick_pending: &mut self.kick_pending,
        }
        .send_frame(msg, port, vnet, frame)
    }

    /// Pushes a message (with the conntrack snapshot of its connection, if any) on the flow
    /// ring; false (counted) if the ring is full.
    pub fn send_flow(&mut self, msg: &Msg, snap: Option<&CtSnapshot>) -> bool {
        self.scratch.clear();
        codec::encode_msg(&mut self.scratch, msg);
        codec::encode_snapshot(&mut self.scratch, snap);
        self.push_flow()
    }

    fn push_flow(&mut self) -> bool {
        match self.flow_tx.try_push(&self.scratch) {
            Ok(()) => {
                self.counters.flow_tx += 1;
                self.kick_pending |= self.flow_tx.needs_kick();
                true
            }
            Err(_) => {
                self.counters.flow_full += 1;
                false
            }
        }
    }

    /// Sends a frame node's flow-ring output: a message with its snapshot, or a conntrack
    /// change. A message for the control channel is not this lane's: the caller sends it on
    /// the set's control socket; here it is pushed on the flow ring like any other.
    pub fn send_outgoing_flow(&mut self, o: &Outgoing) -> bool {
        match o {
            Outgoing::Msg { msg, snapshot, .. } => self.send_flow(msg, snapshot.as_ref()),
            Outgoing::Conntrack(s) => self.send_ct(s),
        }
    }

    /// Sends the owner's current conntrack entry of a connection whose real TCP state changed
    /// without a change the fabric core syncs (its phases are coarser than TCP's), so the peer's
    /// copy stays current for a fail-open or a handover. False (counted) if the ring is full.
    pub fn send_ct(&mut self, snap: &CtSnapshot) -> bool {
        self.scratch.clear();
        self.scratch.push(FLOW_CT);
        codec::encode_snapshot(&mut self.scratch, Some(snap));
        self.push_flow()
    }

    /// Kicks the peer if a push since the last call found it asleep.
    pub fn kick(&mut self) {
        if std::mem::take(&mut self.kick_pending) {
            // A failed kick (the peer closed its end) surfaces as a closed control socket.
            let _ = self.peer_bell.kick();
            self.counters.kicks += 1;
        }
    }

    /// Pops up to `max` phy records.
    pub fn recv_frames(
        &mut self,
        max: usize,
        mut f: impl FnMut(PhyRecord<'_>),
    ) -> Result<usize, VnicError> {
        self.recv_frames_tx(max, |rec, _| f(rec))
    }

    /// Pops up to `max` phy records; `f` may send frames back on the phy ring while a record
    /// is borrowed (no copy: a processed frame goes from the receive ring to the send ring).
    pub fn recv_frames_tx(
        &mut self,
        max: usize,
        mut f: impl FnMut(PhyRecord<'_>, &mut PhyTx<'_>),
    ) -> Result<usize, VnicError> {
        let mut bad = None;
        let mut tx = PhyTx {
            phy_tx: &mut self.phy_tx,
            scratch: &mut self.scratch,
            counters: &mut self.counters,
            kick_pending: &mut self.kick_pending,
        };
        let n = self.phy_rx.pop_batch(max, |rec| match parse_phy(rec) {
            Ok(rec) => f(rec, &mut tx),
            Err(e) => {
                bad.get_or_insert(e);
            }
        });
        let n = popped("phy", n, bad)?;
        self.counters.phy_rx += n as u64;
        Ok(n)
    }

    /// Takes back up to `max` frames this end sent on the phy ring that the peer never took:
    /// call it only once the peer's process is dead and reaped (see
    /// [`Producer::reclaimer`](crate::shm::ring::Producer::reclaimer)). Stops at the first
    /// record that does not decode (the peer may have left the ring corrupt).
    pub fn reclaim_frames(
        &mut self,
        max: usize,
        mut f: impl FnMut(PhyRecord<'_>),
    ) -> Result<usize, VnicError> {
        let mut back = self.phy_tx.reclaimer().map_err(ring_err("phy"))?;
        let mut bad = None;
        let n = back.pop_batch(max, |rec| match parse_phy(rec) {
            Ok(rec) if bad.is_none() => f(rec),
            Ok(_) => {}
            Err(e) => {
                bad.get_or_insert(e);
            }
        });
        popped("phy", n, bad)
    }

    /// Pops up to `max` flow records.
    pub fn recv_flow(
        &mut self,
        max: usize,
        mut f: impl FnMut(FlowRecord),
    ) -> Result<usize, VnicError> {
        let mut bad = None;
        let n = self.flow_rx.pop_batch(max, |rec| {
            let parsed = match rec.split_first() {
                Some((&FLOW_CT, rest)) => {
                    codec::decode_snapshot(&mut Reader::new(rest)).and_then(|s| {
                        s.map(FlowRecord::Ct).ok_or(CodecError::BadValue {
                            field: "flow.ct",
                            value: 0,
                        })
                    })
                }
                _ => {
                    let mut r = Reader::new(rec);
                    codec::decode_msg(&mut r)
                        .and_then(|m| codec::decode_snapshot(&mut r).map(|s| FlowRecord::Msg(m, s)))
                }
            };
            match parsed {
                Ok(r) => f(r),
                Err(e) => {
                    bad.get_or_insert(e);
                }
            }
        });
        let n = popped("flow", n, bad)?;
        self.counters.flow_rx += n as u64;
        Ok(n)
    }

    /// For a relay (`crate::remote`): pops up to `max` records of each ring this end reads,
    /// as they are, undecoded: the end the relay hands them to decodes them. Checked only by
    /// the ring (lengths within its memory).
    pub fn relay_pop(
        &mut self,
        max: usize,
        mut f: impl FnMut(RingKind, &[u8]),
    ) -> Result<usize, VnicError> {
        let phy = self
            .phy_rx
            .pop_batch(max, |rec| f(RingKind::Phy, rec))
            .map_err(ring_err("phy"))?;
        let flow = self
            .flow_rx
            .pop_batch(max, |rec| f(RingKind::Flow, rec))
            .map_err(ring_err("flow"))?;
        self.counters.phy_rx += phy as u64;
        self.counters.flow_rx += flow as u64;
        Ok(phy + flow)
    }

    /// For a relay: pushes `rec` as it is on the ring of `kind` this end writes; false
    /// (counted, as any full ring) if the ring is full. Call [`VnicLane::kick`] after a batch.
    pub fn relay_push(&mut self, kind: RingKind, rec: &[u8]) -> bool {
        let (ring, sent, full) = match kind {
            RingKind::Phy => (
                &mut self.phy_tx,
                &mut self.counters.phy_tx,
                &mut self.counters.phy_full,
            ),
            RingKind::Flow => (
                &mut self.flow_tx,
                &mut self.counters.flow_tx,
                &mut self.counters.flow_full,
            ),
        };
        match ring.try_push(rec) {
            Ok(()) => {
                *sent += 1;
                self.kick_pending |= ring.needs_kick();
                true
            }
            Err(_) => {
                *full += 1;
                false
            }
        }
    }

    /// Before sleeping in `poll`: arms this end's doorbell. False if records arrived meanwhile
    /// (do not sleep).
    pub fn prepare_sleep(&mut self) -> bool {
        self.phy_rx.prepare_sleep() && self.flow_rx.prepare_sleep()
    }

    /// After waking: disarms the doorbell and clears its count.
    pub fn woke(&mut self) {
        self.phy_rx.woke();
        self.flow_rx.woke();
        let _ = self.my_bell.drain();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_handshake_accepts_the_secret_and_refuses_anything_else() {
        let secret = new_secret().unwrap();
        assert_ne!(
            secret, [0u8; SECRET_LEN],
            "32 random bytes are not all zero"
        );
        let (a, b) = UnixStream::pair().unwrap();
        send_auth(&a, &secret).unwrap();
        check_auth(&b, &secret, Duration::from_secs(1)).unwrap();
        let mut wrong = secret;
        wrong[SECRET_LEN - 1] ^= 1;
        send_auth(&a, &wrong).unwrap();
        assert!(matches!(
            check_auth(&b, &secret, Duration::from_secs(1)),
            Err(VnicError::Handshake(_))
        ));
        // A peer that says nothing is refused after the timeout.
        let t = std::time::Instant::now();
        assert!(check_auth(&b, &secret, Duration::from_millis(50)).is_err());
        assert!(t.elapsed() < Duration::from_secs(1));
    }

    #[test]
    fn each_lane_carries_its_own_records_and_moves_to_another_thread() {
        use spillway_fabric::types::ConnId;
        let (a, b) = UnixStream::pair().unwrap();
        let mut dpu = VnicSet::create(a, "workers=2", 3).unwrap();
        let (mut plane, extra) = VnicSet::accept(b).unwrap();
        assert_eq!(
            (dpu.lanes(), plane.lanes(), extra.as_str()),
            (3, 3, "workers=2")
        );
        let train = |conn| Msg::Adopted { conn: ConnId(conn) };
        // Lane 2's DPU end on a thread of its own; lane 0 stays with the set.
        let mut lane2 = dpu.take_lanes().pop().unwrap();
        assert_eq!(lane2.index(), 2);
        assert!(dpu.lane_mut(2).is_none());
        let t = std::thread::spawn(move || {
            assert!(lane2.send_frame(&train(2), 7, &[0; 12], b"two"));
            lane2.send_flow(&train(22), None);
            lane2.kick();
            lane2
        });
        assert!(dpu.send_frame(&train(0), 5, &[0; 12], b"zero"));
        let _lane2 = t.join().unwrap();
        let mut got = Vec::new();
        for k in 0..3 {
            let lane = plane.lane_mut(k).unwrap();
            lane.recv_frames(8, |r| got.push((k, r.msg.conn(), r.port, r.frame.to_vec())))
                .unwrap();
            lane.recv_flow(8, |r| match r {
                FlowRecord::Msg(m, _) => got.push((k, m.conn(), 0, Vec::new())),
                FlowRecord::Ct(_) => panic!("no conntrack record was sent"),
            })
            .unwrap();
        }
        assert_eq!(
            got,
            [
                (0, Some(ConnId(0)), 5, b"zero".to_vec()),
                (2, Some(ConnId(2)), 7, b"two".to_vec()),
                (2, Some(ConnId(22)), 0, Vec::new()),
            ]
        );
        // The plane answers on lane 2 through the set; lane 2's DPU end (on the thread
        // above) holds what came back.
        let out = Outgoing::Msg {
            channel: Channel::FlowVnic,
            msg: train(3),
            snapshot: None,
        };
        plane.send_outgoing_on(2, &out).unwrap();
        let mut lane2 = _lane2;
        let mut back = Vec::new();
        lane2
            .recv_flow(8, |r| {
                if let FlowRecord::Msg(m, _) = r {
                    back.push(m.conn());
                }
            })
            .unwrap();
        assert_eq!(back, [Some(ConnId(3))]);
        assert_eq!(
            dpu.lane0()
                .recv_flow(8, |_| panic!("lane 0 got lane 2's record"))
                .unwrap(),
            0
        );
    }

    /// A busy loop reads the control socket (a system call each look) once per
    /// `CONTROL_READ_EVERY_NS`, or on the turn after its `poll` found the socket readable;
    /// nothing sent is lost meanwhile.
    #[test]
    fn a_busy_loop_reads_the_control_socket_when_poll_says_or_once_an_interval() {
        use spillway_fabric::atc::{Iova, VmId};
        let (a, b) = UnixStream::pair().unwrap();
        let mut dpu = VnicSet::create(a, "test", 1).unwrap();
        let (mut plane, _) = VnicSet::accept(b).unwrap();
        let ask = |n| VatcMsg::Translate {
            vm: VmId(n),
            iova: Iova(0x1000),
            len: 64,
        };
        let look = |plane: &mut VnicSet, now: u64| {
            let mut got = Vec::new();
            plane
                .recv_control_paced(now, |c| match c {
                    Control::Vm(VatcMsg::Translate { vm, .. }, _) => got.push(vm.0),
                    other => panic!("unexpected {other:?}"),
                })
                .unwrap();
            got
        };
        let t0 = 5_000_000;
        // The first look reads (nothing there yet); then the interval runs.
        assert!(look(&mut plane, t0).is_empty());
        dpu.send_vm(&ask(1), &[]).unwrap();
        dpu.send_vm(&ask(2), &[]).unwrap();
        assert!(look(&mut plane, t0 + CONTROL_READ_EVERY_NS - 1).is_empty());
        assert_eq!(look(&mut plane, t0 + CONTROL_READ_EVERY_NS), [1, 2]);
        // Poll said the socket is readable: the next turn reads, whenever it comes.
        dpu.send_vm(&ask(3), &[]).unwrap();
        let t1 = t0 + CONTROL_READ_EVERY_NS + 1;
        assert!(look(&mut plane, t1).is_empty());
        let control = plane.poll_fds()[1].as_raw_fd();
        let entry = |fd, revents| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents,
        };
        // Another entry readable, the socket's not: no read.
        plane.polled(&[entry(control, 0), entry(control + 1000, libc::POLLIN)]);
        assert!(look(&mut plane, t1 + 1).is_empty());
        plane.polled(&[entry(control + 1000, 0), entry(control, libc::POLLIN)]);
        assert_eq!(look(&mut plane, t1 + 2), [3]);
        assert!(look(&mut plane, t1 + 3).is_empty());
        // The unpaced read still reads at once.
        dpu.send_vm(&ask(4), &[]).unwrap();
        let mut n = 0;
        plane.recv_control(|_| n += 1).unwrap();
        assert_eq!(n, 1);
    }

    #[test]
    fn the_dpu_takes_back_the_frames_a_plane_that_is_gone_never_took() {
        use spillway_fabric::types::ConnId;
        let (a, b) = UnixStream::pair().unwrap();
        let mut dpu = VnicSet::create(a, "workers=1", 1).unwrap();
        let (mut plane, _) = VnicSet::accept(b).unwrap();
        let msg = |conn| Msg::Adopted { conn: ConnId(conn) };
        for (c, frame) in [(1, b"one"), (2, b"two"), (3, b"thr")] {
            assert!(dpu.send_frame(&msg(c), c as u32, &[c as u8; 12], frame));
        }
        // The plane takes the first, then goes away with the rest in its ring.
        assert_eq!(plane.recv_frames(1, |_| {}).unwrap(), 1);
        drop(plane);
        let mut back = Vec::new();
        let n = dpu
            .reclaim_frames(16, |r| {
                back.push((r.msg.conn(), r.port, r.vnet[0], r.frame.to_vec()));
            })
            .unwrap();
        assert_eq!(n, 2);
        assert_eq!(
            back,
            [
                (Some(ConnId(2)), 2, 2, b"two".to_vec()),
                (Some(ConnId(3)), 3, 3, b"thr".to_vec()),
            ]
        );
        // Taken once: nothing is left.
        assert_eq!(
            dpu.reclaim_frames(16, |_| panic!("taken twice")).unwrap(),
            0
        );
    }

    #[test]
    fn a_greeting_without_a_lane_count_or_with_too_many_is_refused() {
        for hello in [
            "spillway-vnic-v2 workers=1",
            "spillway-vnic-v2 lanes=0",
            "spillway-vnic-v2 lanes=65",
        ] {
            let (a, b) = UnixStream::pair().unwrap();
            let lane = NewLane::create().unwrap();
            fdpass::send_with_fds(&a, hello.as_bytes(), &lane.fds()).unwrap();
            let r = VnicSet::accept(b);
            assert!(matches!(r, Err(VnicError::Handshake(_))), "{hello}: {r:?}");
        }
        let (a, _b) = UnixStream::pair().unwrap();
        assert!(matches!(
            VnicSet::create(a, "", LANES_MAX + 1),
            Err(VnicError::Handshake(_))
        ));
    }

    #[test]
    fn vatc_messages_cross_with_their_fds_and_a_malformed_one_is_a_codec_error() {
        use spillway_fabric::atc::{AtcEpoch, HostAddr, Iova, Mapping, Perm, VmId};
        let (a, b) = UnixStream::pair().unwrap();
        let mut dpu = VnicSet::create(a, "test", 1).unwrap();
        let (mut plane, _) = VnicSet::accept(b).unwrap();
        let (mem, irq) = (Doorbell::new().unwrap(), Doorbell::new().unwrap());
        let attach = VatcMsg::Attach {
            vm: VmId(3),
            port: 3,
            epoch: AtcEpoch(1),
        };
        let regions = VatcMsg::Regions {
            vm: VmId(3),
            epoch: AtcEpoch(1),
            iova: Iova(0x1000),
            len: 0x2000,
            regions: vec![Mapping {
                iova: Iova(0),
                len: 1 << 20,
                host: HostAddr(0),
                perm: Perm {
                    read: true,
                    write: true,
                },
            }],
        };
        let detach = VatcMsg::Detach {
            vm: VmId(3),
            epoch: AtcEpoch(2),
        };
        // A record without fds queued first: the attach's fds must still ride on the attach.
        dpu.send_vm(&regions, &[]).unwrap();
        dpu.send_vm(&attach, &[mem.as_fd(), irq.as_fd()]).unwrap();
        dpu.send_vm(&detach, &[]).unwrap();
        let mut got = Vec::new();
        let n = plane
            .recv_control(|c| match c {
                Control::Vm(m, fds) => got.push((m, fds.len())),
                other => panic!("unexpected record {other:?}"),
            })
            .unwrap();
        assert_eq!(n, 3);
        assert_eq!(got, [(regions, 0), (attach, 2), (detach, 0)]);
        // A VM record this build cannot decode is a typed error on the channel, not a panic
        // and not a record handed on.
        let body = [CONTROL_VM, 9];
        dpu.control
            .write_all(&(body.len() as u32).to_le_bytes())
            .unwrap();
        dpu.control.write_all(&body).unwrap();
        let r = plane.recv_control(|c| panic!("a malformed record was handed on: {c:?}"));
        assert!(
            matches!(
                r,
                Err(VnicError::Codec {
                    channel: "control",
                    source: CodecError::BadValue {
                        field: "vatc.tag",
                        value: 9
                    }
                })
            ),
            "{r:?}"
        );
    }
}
