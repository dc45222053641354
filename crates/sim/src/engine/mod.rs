//! The discrete-event driver: a virtual clock and the loop that takes the next event from the
//! queue, hands it to the unit it concerns, routes what the nodes emit, and runs the checkers.
//!
//! The driver has no policy: it carries messages with the PCIe latency, starts and stops the
//! plane's "process" when the DPU commands it (after the plane start latency), and feeds the
//! nodes their timeouts. Everything random comes from SplitMix64 streams seeded from `--seed`:
//! the run's own, and one per long flow (seed and connection id) for random arrivals and
//! lifetimes and the non-steady shapes ([`crate::shape`]), so a flow's trajectory does not
//! depend on event order or placement.
//!
//! # Units
//!
//! [`Sim`] owns the DPU node and one instance of each unit below, and is the only place where
//! they meet: a unit imports no other, except where noted.
//!
//! - `queue`: the event queue (`(time, sequence)` order) and each node's armed timeout.
//! - `sources`: the long flows and short connections, as trains (schedules its own steps on
//!   the queue).
//! - `links`: the messages between the nodes: FIFO channels, latency, link faults, losses.
//! - `plane`: the spill plane's node, its process and the process's generations.
//! - `checkers`: the invariants checked during and at the end of a run.
//! - `sampling`: the time series, lifecycle events and measure-window totals.
//! - `summary`: the [`RunReport`] at the end (reads `checkers` and `sampling`).

mod checkers;
pub mod explain;
mod links;
mod plane;
mod queue;
mod sampling;
mod sources;
mod summary;

use spillway_fabric::dpu::{Command, DpuNode, Hold, ShardCell, Warm};
use spillway_fabric::params::FabricParams;
use spillway_fabric::stats::{Drops, FabricDrop};
use spillway_fabric::types::{ConnId, PlaneSlot, Role, Train};
use spillway_vswitch::Instant;
use spillway_vswitch::workload::SplitMix64;

use crate::report::RunReport;
use crate::scenario::{FaultKind, HoldSpec, Scenario};
use checkers::{Checkers, InTransit};
use links::{Dir, InFlight, Links};
use plane::Planes;
use queue::{Ev, EvKind, EventQueue};
use sampling::{Sampler, Totals};
use sources::Sources;

/// The simulator's DPU: its connections over `dpu.shards` shards, served in turn.
pub(crate) type SimDpu = DpuNode<ShardCell>;

/// Events between full invariant sweeps.
const FULL_CHECK_EVERY: u64 = 2_000_000;
/// Virtual time after `duration` for in-flight packets to drain.
const DRAIN_NS: u64 = 100_000_000;

/// Options of one run.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// The seed.
    pub seed: u64,
    /// No spill plane (the DPU-only baseline).
    pub dpu_only: bool,
    /// Print every train and message of this connection to stderr (debugging a failed seed).
    pub trace_conn: Option<ConnId>,
    /// Tell this connection's story in the report (`RunReport::explain`).
    pub explain_conn: Option<ConnId>,
}

/// A checker failed: the run is not valid. The scenario and `seed` replay it (the CLI prints
/// the command).
#[derive(Clone, Debug, thiserror::Error)]
#[error("invariant violated at {at}: {message}")]
pub struct SimFailure {
    /// Virtual time of the failure.
    pub at: Instant,
    /// What was violated.
    pub message: String,
    /// The seed.
    pub seed: u64,
}

/// One simulation run.
#[derive(Debug)]
pub struct Sim<'a> {
    scenario: &'a Scenario,
    /// The scenario's fabric parameters, with `dpu_only` from the options applied.
    params: FabricParams,
    options: RunOptions,
    /// Virtual time of the event being processed.
    now: Instant,
    /// The end of the workload (`duration`); the run drains for `DRAIN_NS` after it.
    end: Instant,
    queue: EventQueue,
    /// The run's random stream (see the module's documentation).
    rng: SplitMix64,
    dpu: SimDpu,
    planes: Planes,
    links: Links,
    sources: Sources<'a>,
    checkers: Checkers,
    sampler: Sampler,
    /// Events processed.
    events: u64,
    /// The story of `options.explain_conn`.
    story: Option<explain::Story>,
}

impl<'a> Sim<'a> {
    /// A run of `scenario` with `options`.
    pub fn new(scenario: &'a Scenario, options: RunOptions) -> Sim<'a> {
        let mut params = scenario.fabric.clone();
        params.dpu_only = params.dpu_only || options.dpu_only;
        let mut rng = SplitMix64(options.seed ^ 0x5711_1a7e_5eed_0001);
        let mut queue = EventQueue::new();
        let dpu = DpuNode::sharded(&params);
        let planes = Planes::new(&params);
        // The order of the first events fixes their sequence numbers: the sources' (flows,
        // then CPS groups), host load, faults, the first sample, the DPU's first timeout.
        let sources = Sources::new(scenario, options.seed, &mut rng, &mut queue);
        for (i, h) in scenario.host_load.iter().enumerate() {
            queue.push(Instant(h.at.ns()), EvKind::HostLoad(i as u16));
        }
        for (i, f) in scenario.faults.iter().enumerate() {
            queue.push(Instant(f.at.ns()), EvKind::Fault(i as u16));
        }
        queue.push(Instant(scenario.sample.ns()), EvKind::Sample);
        queue.arm_dpu_initial(dpu.poll_timeout());
        let mut sim = Sim {
            scenario,
            now: Instant::ZERO,
            end: Instant(scenario.duration.ns()),
            queue,
            rng,
            dpu,
            planes,
            links: Links::new(&params),
            sources,
            checkers: Checkers::new(options.seed),
            sampler: Sampler::new(scenario),
            events: 0,
            story: options
                .explain_conn
                .map(|c| explain::Story::new(c, params.placement.policy.name())),
            params,
            options,
        };
        if scenario.hold == HoldSpec::Active && !sim.params.dpu_only {
            sim.dpu.handle_hold(Instant::ZERO, Hold::Active);
        }
        sim
    }

    /// Offers a train from the sources to the DPU.
    fn offer(&mut self, t: Option<Train>) {
        if let Some(t) = t {
            self.dpu.handle_train(self.now, &t);
            self.checkers.offered(self.now, &t);
        }
    }

    /// Carries what the nodes emitted: messages onto the links, the DPU's commands to the
    /// plane's process, lifecycle events into the record (each followed by a full check).
    fn route_outputs(&mut self) -> Result<(), SimFailure> {
        // The active slot after the input: a failover in it moved the outboxes with it.
        let active = self.dpu.active_slot();
        let to = (active, self.planes.get(active).generation());
        while let Some(t) = self.dpu.poll_transmit() {
            let (at, parked) = self.links.send(Dir::ToPlane, t, self.now, to);
            self.queue.push(at, EvKind::ToSpill(parked));
        }
        let warm = (active.other(), self.planes.get(active.other()).generation());
        while let Some(t) = self.dpu.poll_warm_transmit() {
            let (at, parked) = self.links.send(Dir::ToPlane, t, self.now, warm);
            self.queue.push(at, EvKind::ToSpill(parked));
        }
        while let Some(c) = self.dpu.poll_command() {
            match c {
                // A plane on the remote pool is modelled as a local one (same start time,
                // same links to the DPU): the simulator never reports a pool grant
                // (`DpuNode::set_remote_grant`), so URSched never asks for one here, and a
                // pool host's extra network hop is not in its cost model.
                Command::StartPlane {
                    slot,
                    workers,
                    remote: _,
                } => {
                    let plane = self.planes.get_mut(slot).begin_start();
                    let at = self.now + self.params.host.plane_start;
                    let slot = slot.0;
                    self.queue.push(
                        at,
                        EvKind::PlaneUp {
                            slot,
                            plane,
                            workers,
                        },
                    );
                }
                Command::StopPlane { slot, .. } => {
                    self.planes.get_mut(slot).stop(self.now);
                    self.lose_deferred(slot);
                }
            }
        }
        while let Some(e) = self.dpu.poll_event() {
            // A traced run prints the lifecycle too: a connection's fate depends on it.
            if self.options.trace_conn.is_some() {
                eprintln!("{} event {}: {}", e.at, e.what.name(), e.reason);
            }
            if let Some(s) = &mut self.story {
                s.lifecycle(e.at, e.what.name(), &e.reason);
            }
            self.sampler.phase(e);
            self.full_check()?;
        }
        for slot in [PlaneSlot(0), PlaneSlot(1)] {
            let from = (slot, self.planes.get(slot).generation());
            if let Some(spill) = self.planes.get_mut(slot).running_node() {
                while let Some(t) = spill.poll_transmit() {
                    let (at, parked) = self.links.send(Dir::ToDpu, t, self.now, from);
                    self.queue.push(at, EvKind::ToDpu(parked));
                }
            }
        }
        Ok(())
    }

    /// A message for a plane arrives (or, after a stall, is read): lost if its process is
    /// gone, else handled.
    fn deliver_to_plane(&mut self, now: Instant, parked: u32) {
        let InFlight {
            msg, slot, plane, ..
        } = self.links.receive(parked);
        let process = self.planes.get_mut(slot);
        if !process.is_current(plane) {
            self.links.lose(&msg);
        } else if let Some(spill) = process.running_node() {
            spill.handle_msg(now, msg);
        }
    }

    /// What waited in a stalled process's vNIC set when it was stopped or killed: lost with it.
    fn lose_deferred(&mut self, slot: PlaneSlot) {
        for parked in self.planes.get_mut(slot).take_deferred() {
            let m = self.links.receive(parked);
            self.links.lose(&m.msg);
        }
    }

    fn timers(&mut self) {
        self.queue.arm_dpu(self.dpu.poll_timeout(), self.now);
        for (slot, p) in self.planes.each() {
            // A stalled plane's timers wait for its `Thaw`.
            if p.running() && !p.frozen(self.now) {
                self.queue
                    .arm_spill(slot.index(), p.node().poll_timeout(), self.now);
            }
        }
    }

    /// Prints the event to stderr if it concerns the traced connection.
    fn trace(&self, ev: &Ev) {
        let Some(c) = self.options.trace_conn else {
            return;
        };
        let conn = match ev.kind {
            EvKind::ToSpill(i) | EvKind::ToDpu(i) => {
                let msg = self.links.msg(i);
                // `Msg::conn` also names the connection of delete acks, adoptions and
                // offload statistics; the trace has always shown only trains and the
                // handover messages, so it keeps that set.
                if msg.train().is_some() {
                    msg.conn()
                } else {
                    checkers::handover_conn(msg)
                }
            }
            EvKind::Flow(i) => Some(self.sources.flow_conn(i)),
            EvKind::Short(i) => Some(self.sources.short_conn(i)),
            _ => None,
        };
        if conn == Some(c) {
            let what = match ev.kind {
                EvKind::ToSpill(i) => format!("to plane {:?}", self.links.msg(i)),
                EvKind::ToDpu(i) => format!("to dpu {:?}", self.links.msg(i)),
                k => format!("{k:?}"),
            };
            let plane = |slot| {
                self.planes
                    .get(slot)
                    .node()
                    .conn(c)
                    .map(|r| (r.role, r.recalling, r.state.version))
            };
            eprintln!(
                "{} {what} | dpu {:?} | plane {:?} | slot 1 {:?}",
                ev.at,
                self.dpu
                    .conn(c)
                    .map(|r| (r.role, r.hw_live, r.inserts_pending, r.state.version)),
                plane(PlaneSlot(0)),
                plane(PlaneSlot(1)),
            );
        }
    }

    fn step(&mut self, ev: Ev) -> Result<(), SimFailure> {
        self.now = ev.at;
        self.events += 1;
        self.trace(&ev);
        self.note_story(&ev);
        let now = self.now;
        match ev.kind {
            EvKind::Flow(i) => {
                let t = self
                    .sources
                    .flow_step(i, now, &mut self.rng, &mut self.queue);
                self.offer(t);
            }
            EvKind::Short(s) => {
                let t = self.sources.short_step(s, now, &mut self.queue);
                self.offer(t);
            }
            EvKind::CpsArrival(g) => {
                let t = self
                    .sources
                    .cps_arrival(g, now, &mut self.rng, &mut self.queue);
                self.offer(t);
            }
            EvKind::ToSpill(parked) if self.planes.get(self.links.slot_of(parked)).frozen(now) => {
                // A stopped process reads nothing: the message waits in its vNIC set, in order,
                // until the stall ends (`Thaw`) or the process is stopped for good.
                self.planes
                    .get_mut(self.links.slot_of(parked))
                    .defer(parked);
            }
            EvKind::ToSpill(parked) => self.deliver_to_plane(now, parked),
            EvKind::ToDpu(parked) => {
                let InFlight {
                    msg,
                    slot,
                    plane,
                    depart,
                } = self.links.receive(parked);
                let process = self.planes.get(slot);
                if process.died_before(plane, depart) {
                    self.links.lose(&msg);
                } else if self.links.control_loss_drops(&msg, now, &mut self.rng) {
                    // A lost delete: the plane retransmits it.
                } else if process.generation() == plane {
                    self.dpu.handle_msg_from(now, slot, msg);
                } else {
                    // Sent before its process was stopped, arriving after: the DPU fences it.
                    self.dpu.handle_fenced_msg(now, msg);
                }
            }
            EvKind::DpuTimer => {
                if self.queue.fire_dpu(ev.at) {
                    self.dpu.handle_timeout(now);
                }
            }
            EvKind::SpillTimer(i) => {
                let slot = PlaneSlot(i);
                if self.queue.fire_spill(slot.index(), ev.at)
                    && !self.planes.get(slot).frozen(now)
                    && let Some(spill) = self.planes.get_mut(slot).running_node()
                {
                    spill.handle_timeout(now);
                }
            }
            EvKind::PlaneUp {
                slot,
                plane,
                workers,
            } => {
                let slot = PlaneSlot(slot);
                if self.planes.get_mut(slot).up(now, plane, workers) {
                    self.queue.disarm_spill(slot.index());
                    self.dpu.handle_plane_up_in(now, slot);
                }
            }
            EvKind::Sample => self.sample(),
            EvKind::Thaw(i) => {
                // The messages that waited, in order; then `timers` arms its timers again.
                let slot = PlaneSlot(i);
                for parked in self.planes.get_mut(slot).thaw(now) {
                    self.deliver_to_plane(now, parked);
                }
            }
            EvKind::HostLoad(i) => {
                let h = &self.scenario.host_load[i as usize];
                self.dpu.set_tenant_cores(h.tenant_cores);
            }
            EvKind::Fault(i) => {
                let fault = &self.scenario.faults[i as usize];
                match fault.kind {
                    FaultKind::KillPlane => {
                        let slot = self.dpu.active_slot();
                        if self.planes.get_mut(slot).kill(now) {
                            self.lose_deferred(slot);
                            self.dpu
                                .handle_plane_failed_in(now, slot, "plane process killed");
                        }
                    }
                    FaultKind::StallPlane => {
                        let slot = self.dpu.active_slot();
                        let until = now + fault.duration.0;
                        if self.planes.get_mut(slot).freeze(until) {
                            self.queue.push(until, EvKind::Thaw(slot.0));
                        }
                    }
                    FaultKind::KillWarm => {
                        let slot = self.dpu.active_slot().other();
                        if self.dpu.warm() != Warm::Off && self.planes.get_mut(slot).kill(now) {
                            self.lose_deferred(slot);
                            self.dpu
                                .handle_plane_failed_in(now, slot, "warm plane process killed");
                        }
                    }
                    FaultKind::Upgrade => self.dpu.handle_upgrade(now),
                    FaultKind::ControlLoss => {
                        self.links
                            .start_control_loss(now, fault.probability, fault.duration.0);
                    }
                    FaultKind::Delay => self.links.start_delay(now, fault.duration.0),
                }
            }
        }
        self.route_outputs()?;
        self.story_after();
        self.timers();
        self.check_cheap()?;
        if self.events.is_multiple_of(FULL_CHECK_EVERY) {
            self.full_check()?;
        }
        Ok(())
    }

    fn fail(&self, message: String) -> SimFailure {
        SimFailure {
            at: self.now,
            message,
            seed: self.options.seed,
        }
    }

    /// Every drop of the fabric: both nodes' and the links'.
    fn drops(&self) -> Drops {
        self.dpu
            .drops()
            .merged(&self.planes.drops())
            .merged(self.links.lost())
    }

    fn totals(&self) -> Totals {
        Totals::read(
            &self.dpu,
            &self.planes.counters(),
            self.sources.offered(),
            &self.drops(),
        )
    }

    fn check_cheap(&mut self) -> Result<(), SimFailure> {
        let links = InTransit {
            offered: self.sources.offered(),
            in_flight: self.links.in_flight(),
            lost: self.links.lost(),
        };
        let r = self.checkers.cheap(&self.dpu, &self.planes, links);
        r.map_err(|e| self.fail(e))
    }

    fn full_check(&mut self) -> Result<(), SimFailure> {
        let r = self.checkers.full(&self.dpu, &self.planes.running());
        r.map_err(|e| self.fail(e))
    }

    /// Liveness of ownership at the end of a run: every connection either plane knows has
    /// exactly one owner, or a message that hands it over is still in flight.
    fn final_ownership_check(&self) -> Result<(), SimFailure> {
        let running = self.planes.running();
        if running.is_empty() {
            return Ok(()); // the DPU alone: every record it has is its own
        }
        let in_transit: Vec<ConnId> = self
            .queue
            .pending()
            .filter_map(|kind| match *kind {
                EvKind::ToSpill(i) | EvKind::ToDpu(i) => checkers::handover_conn(self.links.msg(i)),
                _ => None,
            })
            .collect();
        self.checkers
            .final_ownership(&self.dpu, &running, in_transit)
            .map_err(|e| self.fail(e))
    }

    fn sample(&mut self) {
        let t = self.totals();
        let workers = self.planes.workers();
        let inserts = self.sampler.sample(
            self.now,
            t,
            self.sources.new_conn_offered(),
            &mut self.dpu,
            workers,
        );
        self.checkers.insert_budget(
            inserts,
            self.sampler.step_secs(),
            self.params.dpu.insert_rate_limit,
        );
        let next = self.now + self.scenario.sample.0;
        if next <= Instant(self.end.0 + DRAIN_NS) {
            self.queue.push(next, EvKind::Sample);
        }
    }

    /// Runs to the end; `progress` is called with the fraction of virtual time done.
    pub fn run(mut self, progress: &mut dyn FnMut(f64)) -> Result<RunReport, SimFailure> {
        let stop = Instant(self.end.0 + DRAIN_NS);
        let mut next_progress = 0u64;
        // A hold set at time zero has commands and events to route before the first event.
        self.route_outputs()?;
        while let Some(ev) = self.queue.pop() {
            if ev.at > stop {
                break;
            }
            self.step(ev)?;
            if let Some(v) = self.checkers.take_violation() {
                return Err(self.fail(v));
            }
            if self.events >= next_progress {
                next_progress = self.events + 65_536;
                progress((self.now.0 as f64 / stop.0 as f64).min(1.0));
            }
        }
        self.now = self.now.max(self.end);
        self.full_check()?;
        self.final_ownership_check()?;
        let no_state = self.drops().get(FabricDrop::NoState);
        let opens_lost = self.dpu.counters().open_dropped
            + self.planes.counters().open_dropped
            + self.links.opens_lost();
        self.checkers
            .state_continuity(no_state, opens_lost, &self.dpu, &self.planes)
            .map_err(|e| self.fail(e))?;
        progress(1.0);
        Ok(self.report())
    }

    /// What `ev` says about the explained connection, before it is handled.
    fn note_story(&mut self, ev: &Ev) {
        let Some(s) = &mut self.story else {
            return;
        };
        let c = s.conn();
        match ev.kind {
            EvKind::ToSpill(i) | EvKind::ToDpu(i) => {
                let msg = self.links.msg(i);
                if msg.conn() == Some(c) {
                    s.note_msg(msg, matches!(ev.kind, EvKind::ToSpill(_)));
                }
            }
            EvKind::Flow(i) if self.sources.flow_conn(i) == c => s.note_offer(),
            EvKind::Short(i) if self.sources.short_conn(i) == c => s.note_offer(),
            _ => {}
        }
    }

    /// Where the explained connection is served after the event.
    fn story_after(&mut self) {
        let Some(s) = &mut self.story else {
            return;
        };
        let c = s.conn();
        let plane = [PlaneSlot(0), PlaneSlot(1)]
            .into_iter()
            .filter_map(|slot| self.planes.get(slot).node().conn(c).map(|r| r.role))
            .max_by_key(|r| matches!(r, Role::Owner));
        s.after(self.now, self.dpu.owner_view(c), plane);
    }

    fn report(mut self) -> RunReport {
        let story = self.story.take().map(|s| s.finish(self.now));
        let mut r = self.report_without_story();
        r.explain = story;
        r
    }

    fn report_without_story(self) -> RunReport {
        let totals = self.totals();
        let drops = self.drops();
        summary::run_report(summary::Ending {
            scenario: self.scenario,
            seed: self.options.seed,
            dpu_only: self.params.dpu_only,
            dpu: &self.dpu,
            planes: &self.planes,
            checkers: &self.checkers,
            events: self.events,
            totals,
            drops,
            record: self.sampler.finish(),
        })
    }
}

/// The highest rate of completed connections in a sample of the window `[from, to]` before the
/// first sample with a lost packet (completed, not offered: a queue that is filling up delivers
/// less than it is offered for a while before it drops); `None` if the first sample lost
/// packets.
pub fn zero_loss_cps(r: &RunReport, from_s: f64, to_s: f64) -> Option<f64> {
    let mut best = None;
    for s in &r.series {
        if s.t_s <= from_s || s.t_s > to_s + 1e-9 {
            continue;
        }
        if s.lost_mpps > 0.0 {
            break;
        }
        let cps = s.done_mcps * 1e6;
        best = Some(best.map_or(cps, |b: f64| b.max(cps)));
    }
    best
}
