//! The links between the DPU and the spill plane: the message simulator.
//!
//! It owns every message on its way between the two nodes (parked in slots so that the event
//! queue carries only a slot number), the FIFO order of each channel in each direction, the
//! PCIe latency, the link faults (extra delay, lost deletes), and the packets lost because the
//! plane they were sent to or from died. It knows nothing of events: [`Links::send`] says when
//! and in which slot a message arrives, and the driver schedules it.

use spillway_fabric::params::FabricParams;
use spillway_fabric::stats::{Drops, FabricDrop};
use spillway_fabric::types::{Channel, Kind, Msg, PlaneSlot, Transmit};
use spillway_vswitch::Instant;
use spillway_vswitch::workload::SplitMix64;

use crate::shape::unit;

/// The direction of a message.
#[derive(Clone, Copy, Debug)]
pub(super) enum Dir {
    /// From the DPU to the spill plane.
    ToPlane = 0,
    /// From the spill plane to the DPU.
    ToDpu = 1,
}

/// A message between the nodes, on its way.
#[derive(Clone, Copy, Debug)]
pub(super) struct InFlight {
    pub(super) msg: Msg,
    /// The plane slot (vNIC set) it travels on.
    pub(super) slot: PlaneSlot,
    /// The plane generation it was sent to or from.
    pub(super) plane: u32,
    /// When it left its sender.
    pub(super) depart: Instant,
}

/// The two directions of every channel, their messages in flight and their faults.
#[derive(Debug)]
pub(super) struct Links {
    /// One-way PCIe latency, ns.
    latency_ns: u64,
    /// Messages on their way, by slot; `free_slots` lists the reusable ones.
    msgs: Vec<InFlight>,
    free_slots: Vec<u32>,
    /// The latest arrival scheduled per slot, direction and channel (FIFO order: each slot
    /// is a vNIC set of its own).
    last_arrival: [[[Instant; 3]; 2]; 2],
    /// Packets inside messages on their way.
    in_flight: u64,
    /// Packets lost with a dead plane (`SpillFailed`).
    lost: Drops,
    /// Opening packets among `lost`.
    opens_lost: u64,
    /// Probability of losing a delete until `control_loss_until`.
    control_loss: f64,
    control_loss_until: Instant,
    /// Extra latency of the data channels until `delay_until`, ns.
    delay_ns: u64,
    delay_until: Instant,
}

impl Links {
    pub(super) fn new(params: &FabricParams) -> Links {
        Links {
            latency_ns: u64::try_from(params.pcie.latency.as_nanos()).unwrap_or(u64::MAX),
            msgs: Vec::new(),
            free_slots: Vec::new(),
            last_arrival: [[[Instant::ZERO; 3]; 2]; 2],
            in_flight: 0,
            lost: Drops::default(),
            opens_lost: 0,
            control_loss: 0.0,
            control_loss_until: Instant::ZERO,
            delay_ns: 0,
            delay_until: Instant::ZERO,
        }
    }

    /// Puts `t` on its way in direction `dir` on the vNIC set of `slot`, to or from plane
    /// generation `plane`; returns when it arrives and where it is parked until then.
    pub(super) fn send(
        &mut self,
        dir: Dir,
        t: Transmit,
        now: Instant,
        (slot, plane): (PlaneSlot, u32),
    ) -> (Instant, u32) {
        let lat = self.latency(t.channel, now);
        let depart = Instant(t.at.0.max(now.0));
        let at = self.fifo(slot, dir, t.channel, Instant(depart.0 + lat));
        self.in_flight += t.packets();
        let parked = self.park(InFlight {
            msg: t.msg,
            slot,
            plane,
            depart,
        });
        (at, parked)
    }

    /// Takes the message out of `slot` on its arrival.
    pub(super) fn receive(&mut self, slot: u32) -> InFlight {
        self.free_slots.push(slot);
        let m = self.msgs[slot as usize];
        if let Some(t) = m.msg.train() {
            self.in_flight -= u64::from(t.packets);
        }
        m
    }

    /// The plane slot of the message parked in `parked` (still on its way).
    pub(super) fn slot_of(&self, parked: u32) -> PlaneSlot {
        self.msgs[parked as usize].slot
    }

    /// The message parked in `slot` (still on its way).
    pub(super) fn msg(&self, slot: u32) -> &Msg {
        &self.msgs[slot as usize].msg
    }

    /// Counts the packets of `msg` as lost with its plane.
    pub(super) fn lose(&mut self, msg: &Msg) {
        if let Some(t) = msg.train() {
            self.lost.add(FabricDrop::SpillFailed, u64::from(t.packets));
            if t.kind == Kind::Open {
                self.opens_lost += 1;
            }
        }
    }

    /// Whether the control-loss fault drops `msg` arriving now. Only deletes are lost (the
    /// plane retransmits them), and the run's stream is drawn only for a delete while the
    /// fault lasts, so runs without the fault draw exactly what they always did.
    pub(super) fn control_loss_drops(&self, msg: &Msg, now: Instant, rng: &mut SplitMix64) -> bool {
        let lossy = self.control_loss > 0.0
            && now < self.control_loss_until
            && matches!(msg, Msg::Delete { .. });
        lossy && unit(rng) < self.control_loss
    }

    /// Starts the control-loss fault: deletes are lost with `probability` for `duration`.
    pub(super) fn start_control_loss(
        &mut self,
        now: Instant,
        probability: f64,
        duration: core::time::Duration,
    ) {
        self.control_loss = probability;
        self.control_loss_until = now + duration;
    }

    /// Starts the delay fault: the data channels take `duration` longer for four times as long.
    pub(super) fn start_delay(&mut self, now: Instant, duration: core::time::Duration) {
        self.delay_ns = u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX);
        self.delay_until = now + duration * 4;
    }

    /// Packets inside messages on their way.
    pub(super) fn in_flight(&self) -> u64 {
        self.in_flight
    }

    /// Packets lost with a dead plane, by reason.
    pub(super) fn lost(&self) -> &Drops {
        &self.lost
    }

    /// Opening packets lost with a dead plane.
    pub(super) fn opens_lost(&self) -> u64 {
        self.opens_lost
    }

    /// Every channel is FIFO in each direction (a ring, a socket): a message never arrives
    /// before one sent earlier on the same channel, whatever delay a fault adds.
    fn fifo(&mut self, slot: PlaneSlot, dir: Dir, channel: Channel, at: Instant) -> Instant {
        let slot = &mut self.last_arrival[slot.index()][dir as usize][channel as usize];
        let at = at.max(*slot);
        *slot = at;
        at
    }

    fn latency(&self, channel: Channel, now: Instant) -> u64 {
        if self.delay_ns > 0 && now < self.delay_until && channel != Channel::Control {
            // Extra delay, the same for the whole channel at a time so a channel stays FIFO.
            self.latency_ns + self.delay_ns
        } else {
            self.latency_ns
        }
    }

    fn park(&mut self, m: InFlight) -> u32 {
        match self.free_slots.pop() {
            Some(i) => {
                self.msgs[i as usize] = m;
                i
            }
            None => {
                self.msgs.push(m);
                (self.msgs.len() - 1) as u32
            }
        }
    }
}
