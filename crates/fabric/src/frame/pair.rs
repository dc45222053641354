//! [`Pair`]: a DPU node and a plane node joined back to back, with no I/O.

use spillway_vswitch::{Instant, PortId};

use super::{DpuSwitch, FrameDrop, Outcome, Outgoing, PlaneSwitch};
use crate::dpu::{Hold, Phase};

/// Rounds of message exchange [`Pair::pump`] allows before it calls the two sides stuck: each
/// round answers what the last one sent, and a hand-over takes a handful.
const PUMP_ROUNDS: usize = 64;

/// Timer steps [`Pair::activate`] allows (prepare, bulk sync, redirect rules going live).
const ACTIVATE_STEPS: usize = 1_000;

/// A DPU node and a plane node joined back to back: every message one side sends reaches the
/// other at once, in order, with no loss. Frames go through it as the real-time driver moves
/// them over its rings: into the DPU, through the plane if steered there, back through the
/// DPU. The simulator's path check and the frame-node tests drive the nodes through it.
#[derive(Debug)]
pub struct Pair {
    /// The DPU side.
    pub dpu: DpuSwitch,
    /// The plane side.
    pub plane: PlaneSwitch,
    /// The frame the plane returned, while the DPU sends it on.
    ret: Vec<u8>,
    /// The last frame's bytes as it left.
    out: Vec<u8>,
}

/// Where a frame sent through a [`Pair`] went.
#[derive(Debug, PartialEq, Eq)]
pub struct Through<'a> {
    /// The port it left by and its bytes, or why it was dropped.
    pub out: Result<(PortId, &'a [u8]), FrameDrop>,
    /// The plane carried it (steered there, then returned, delivered or punted).
    pub via_plane: bool,
}

impl Pair {
    /// Joins `dpu` and `plane`.
    pub fn new(dpu: DpuSwitch, plane: PlaneSwitch) -> Pair {
        Pair {
            dpu,
            plane,
            ret: Vec::with_capacity(super::FRAME_MAX),
            out: Vec::with_capacity(super::FRAME_MAX),
        }
    }

    /// Activates the plane with every redirect bucket live (an operator's `Active` hold):
    /// starts it, runs both sides' timers and messages until the DPU is active. Returns the
    /// time it became so (later calls must not go back before it).
    pub fn activate(&mut self, now: Instant) -> Result<Instant, String> {
        self.dpu.dpu_mut().handle_hold(now, Hold::Active);
        while self.dpu.poll_command().is_some() {}
        let workers = 1;
        self.plane.plane_mut().start(now, workers);
        self.dpu.dpu_mut().handle_plane_up(now);
        let mut t = now;
        for _ in 0..ACTIVATE_STEPS {
            self.pump(t)?;
            if matches!(self.dpu.dpu().phase(), Phase::Active { .. }) {
                return Ok(t);
            }
            let next = [self.dpu.poll_timeout(), self.plane.poll_timeout()]
                .into_iter()
                .flatten()
                .min()
                .ok_or("no timer left before the plane was active")?;
            t = t.max(next);
            self.advance(t)?;
        }
        Err(format!(
            "not active after {ACTIVATE_STEPS} timer steps: {:?}",
            self.dpu.dpu().phase()
        ))
    }

    /// Runs both sides' timers due by `now`, in time order, carrying messages after each.
    pub fn advance(&mut self, now: Instant) -> Result<(), String> {
        loop {
            let d = self.dpu.poll_timeout().filter(|&t| t <= now);
            let p = self.plane.poll_timeout().filter(|&t| t <= now);
            match (d, p) {
                (Some(d), p) if p.is_none_or(|p| d <= p) => self.dpu.dpu_mut().handle_timeout(d),
                (_, Some(p)) => self.plane.plane_mut().handle_timeout(p),
                (None, None) => return Ok(()),
                (Some(_), None) => unreachable!("the first arm takes a DPU timer alone"),
            }
            while self.dpu.poll_command().is_some() {}
            self.pump(now)?;
        }
    }

    /// Carries every message each side has for the other until both are quiet; returns how
    /// many were carried.
    pub fn pump(&mut self, now: Instant) -> Result<usize, String> {
        let mut carried = 0;
        for _ in 0..PUMP_ROUNDS {
            let before = carried;
            while let Some(o) = self.dpu.poll_transmit(now) {
                carried += 1;
                match o {
                    Outgoing::Msg { msg, snapshot, .. } => {
                        self.plane.handle_msg(now, msg, snapshot)
                    }
                    Outgoing::Conntrack(s) => self.plane.handle_conntrack(now, &s),
                }
            }
            while let Some(o) = self.plane.poll_transmit(now) {
                carried += 1;
                match o {
                    Outgoing::Msg { msg, snapshot, .. } => self.dpu.handle_msg(now, msg, snapshot),
                    Outgoing::Conntrack(s) => self.dpu.handle_conntrack(now, &s),
                }
            }
            if carried == before {
                return Ok(carried);
            }
        }
        Err(format!(
            "the two sides still talk after {PUMP_ROUNDS} rounds"
        ))
    }

    /// One frame from `port` (no GSO) into the DPU, through the plane if the DPU steers it
    /// there, and out; then the messages it caused are carried. A frame the plane sends the
    /// vATC way counts as delivered there.
    pub fn process(
        &mut self,
        now: Instant,
        port: PortId,
        frame: &[u8],
    ) -> Result<Through<'_>, String> {
        let (out, via_plane) = self.route(now, port, frame)?;
        self.pump(now)?;
        Ok(Through {
            out: out.map(|p| (p, &self.out[..])),
            via_plane,
        })
    }

    /// The way of one frame: where it left (its bytes in `self.out`), and whether the plane
    /// carried it.
    fn route(
        &mut self,
        now: Instant,
        port: PortId,
        frame: &[u8],
    ) -> Result<(Result<PortId, FrameDrop>, bool), String> {
        let msg = match self.dpu.process(now, port, 0, frame) {
            Outcome::Steer { msg } => msg,
            o => return Ok((ends(o, &mut self.out)?, false)),
        };
        let (msg, at) = match self.plane.process(now, port, msg, 0, frame) {
            Outcome::Return {
                msg, port, bytes, ..
            } => {
                self.ret.clear();
                self.ret.extend_from_slice(bytes);
                (msg, port)
            }
            Outcome::Punt { msg } => {
                self.ret.clear();
                self.ret.extend_from_slice(frame);
                (msg, port)
            }
            o => return Ok((ends(o, &mut self.out)?, true)),
        };
        let o = self.dpu.process_from_plane(now, at, msg, 0, &self.ret);
        Ok((ends(o, &mut self.out)?, true))
    }
}

/// The port an outcome that ends a frame's way leaves by (forwarded, or delivered into a VM),
/// its bytes copied into `out`, or its drop; an error for an outcome that cannot end it.
fn ends(o: Outcome<'_>, out: &mut Vec<u8>) -> Result<Result<PortId, FrameDrop>, String> {
    match o {
        Outcome::Forward { port, bytes, .. } | Outcome::Direct { port, bytes, .. } => {
            out.clear();
            out.extend_from_slice(bytes);
            Ok(Ok(port))
        }
        Outcome::Drop(d) => Ok(Err(d)),
        o => Err(format!("{o:?} does not end a frame's way")),
    }
}
