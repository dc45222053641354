//! The discrete-event driver: a virtual clock, one event queue ordered by `(time, sequence)`,
//! the workload sources, the links between the DPU node and the spill plane, fault injection,
//! the invariant checkers and the time series.
//!
//! The driver has no policy: it carries messages with the PCIe latency, starts and stops the
//! plane's "process" when the DPU commands it (after the plane start latency), and feeds the
//! nodes their timeouts. Everything random comes from SplitMix64 streams seeded from `--seed`:
//! the run's own, and one per long flow (seed and connection id) for random arrivals and
//! lifetimes and the non-steady shapes ([`crate::shape`]), so a flow's trajectory does not
//! depend on event order or placement.
//!
//! # Checkers
//!
//! After every event (O(1)): packet conservation (offered = delivered + dropped + in flight),
//! the DPU's table within capacity. Every sample: inserts within the insertion budget. At every
//! 1,024th train: path equivalence through the real frame nodes ([`crate::pathcheck`]). At every
//! lifecycle event and every `FULL_CHECK_EVERY` events: each node's full invariants and
//! ownership across the planes (no connection owned by both). At the end: state continuity (no
//! packet of a connection whose opening packet was delivered found its plane without state).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use spillway_fabric::dpu::{Command, DpuNode, EventKind, FabricEvent, Hold, Role};
use spillway_fabric::metrics::{Drops, FabricDrop, LatencyHist};
use spillway_fabric::params::FabricParams;
use spillway_fabric::spill::SpillPlane;
use spillway_fabric::types::{Channel, ConnId, Dest, Kind, Msg, Side, Train, Transmit};
use spillway_vswitch::workload::SplitMix64;
use spillway_vswitch::{Instant, TenantId};

use crate::report::{LatencyUs, PhaseEvent, RunReport, Sample, WindowFigures};
use crate::scenario::{Arrivals, DestSpec, FaultKind, HoldSpec, Lifetimes, Scenario};
use crate::shape::{self, ShapeState};

/// Events between full invariant sweeps.
const FULL_CHECK_EVERY: u64 = 2_000_000;
/// Trains between two path-equivalence checks on the real pipeline.
const PATH_CHECK_EVERY: u64 = 1024;
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
}

/// A checker failed: the run is not valid. `repro` is the command that replays it.
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

#[derive(Clone, Copy, Debug)]
enum EvKind {
    Flow(u32),
    Short(u32),
    CpsArrival(u16),
    /// A message to the plane, in `Sim::msgs[slot]` (kept out of the heap so that heap
    /// entries stay small: the heap is the simulator's hottest structure).
    ToSpill(u32),
    /// A message to the DPU, in `Sim::msgs[slot]`.
    ToDpu(u32),
    DpuTimer,
    SpillTimer,
    PlaneUp {
        plane: u32,
        workers: u32,
    },
    Sample,
    HostLoad(u16),
    Fault(u16),
}

/// A message between the nodes, on its way.
#[derive(Clone, Copy, Debug)]
struct InFlight {
    msg: Msg,
    /// The plane generation it was sent to or from.
    plane: u32,
    /// When it left its sender.
    depart: Instant,
}

#[derive(Clone, Copy, Debug)]
struct Ev {
    at: Instant,
    seq: u64,
    kind: EvKind,
}

impl PartialEq for Ev {
    fn eq(&self, o: &Ev) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for Ev {}
impl PartialOrd for Ev {
    fn partial_cmp(&self, o: &Ev) -> Option<core::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Ev {
    fn cmp(&self, o: &Ev) -> core::cmp::Ordering {
        (self.at, self.seq).cmp(&(o.at, o.seq))
    }
}

#[derive(Clone, Copy, Debug)]
struct LongFlow {
    conn: ConnId,
    tenant: TenantId,
    dest: Dest,
    bytes: u32,
    /// Packets per train at the nominal rate.
    per_train: f64,
    acc: f64,
    jitter: f64,
    on_ns: u64,
    period_ns: u64,
    end: Instant,
    /// Spacing of the handshake and teardown packets (one RTT leg), ns.
    gap_ns: u64,
    step: u8,
    /// How its rate varies (`Steady` uses `on_ns`/`period_ns` above).
    shape: ShapeState,
    /// Its own random stream (SplitMix64 state) for the shapes other than `steady`.
    rng: u64,
}

#[derive(Clone, Copy, Debug)]
struct ShortConn {
    conn: ConnId,
    tenant: TenantId,
    dest: Dest,
    denied: bool,
    /// Spacing of its packets (its group's `gap`), ns.
    gap_ns: u64,
    step: u8,
}

/// The six packets of a short connection: (side, kind).
const SHORT_STEPS: [(Side, Kind); 6] = [
    (Side::Orig, Kind::Open),     // SYN
    (Side::Reply, Kind::Control), // SYN-ACK
    (Side::Orig, Kind::Data),     // ACK (carries no state change)
    (Side::Orig, Kind::Control),  // FIN
    (Side::Reply, Kind::Control), // FIN-ACK
    (Side::Orig, Kind::Close),    // last ACK
];

fn dest(d: DestSpec) -> Dest {
    match d {
        DestSpec::Vm => Dest::Vm,
        DestSpec::Wire => Dest::Wire,
    }
}

fn unit(rng: &mut SplitMix64) -> f64 {
    (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64
}

#[derive(Clone, Copy, Debug, Default)]
struct Totals {
    offered: u64,
    dpu: u64,
    host: u64,
    lost: u64,
    new_conn: u64,
    closed: u64,
    inserts: u64,
    /// Delivered by the hardware fast path (part of `dpu`).
    hw: u64,
    deletes: u64,
    deletes_to_host: u64,
    recalls: u64,
    demotes: u64,
    sheds: u64,
    flaps: u64,
    /// Spill-plane worker core-nanoseconds.
    busy_ns: u64,
}

impl Totals {
    /// Adds the change from `last` to `now` of every field.
    fn add_delta(&mut self, now: &Totals, last: &Totals) {
        self.offered += now.offered - last.offered;
        self.dpu += now.dpu - last.dpu;
        self.host += now.host - last.host;
        self.lost += now.lost - last.lost;
        self.new_conn += now.new_conn - last.new_conn;
        self.closed += now.closed - last.closed;
        self.inserts += now.inserts - last.inserts;
        self.hw += now.hw - last.hw;
        self.deletes += now.deletes - last.deletes;
        self.deletes_to_host += now.deletes_to_host - last.deletes_to_host;
        self.recalls += now.recalls - last.recalls;
        self.demotes += now.demotes - last.demotes;
        self.sheds += now.sheds - last.sheds;
        self.flaps += now.flaps - last.flaps;
        self.busy_ns += now.busy_ns - last.busy_ns;
    }
}

/// One simulation run.
#[derive(Debug)]
pub struct Sim<'a> {
    sc: &'a Scenario,
    f: FabricParams,
    opts: RunOptions,
    now: Instant,
    end: Instant,
    heap: BinaryHeap<Reverse<Ev>>,
    seq: u64,
    rng: SplitMix64,
    dpu: DpuNode,
    spill: SpillPlane,
    plane_gen: u32,
    plane_running: bool,
    killed_at: Vec<Option<Instant>>,
    dpu_timer: Option<Instant>,
    spill_timer: Option<Instant>,
    flows: Vec<LongFlow>,
    shorts: Vec<ShortConn>,
    free_shorts: Vec<u32>,
    cps_next_tenant: Vec<u32>,
    next_conn: u64,
    offered: u64,
    in_flight: u64,
    driver_drops: Drops,
    open_lost_driver: u64,
    control_loss: f64,
    control_loss_until: Instant,
    delay_ns: u64,
    delay_until: Instant,
    events: u64,
    checks: u64,
    last: Totals,
    new_conn_offered: u64,
    last_new_conn_offered: u64,
    samples: Vec<Sample>,
    phases: Vec<FabricEvent>,
    measure: Totals,
    measure_secs: f64,
    /// Fast-path packets of recalled connections at the measure window's start and end
    /// (`DpuNode::recalled_hw_packets` is a scan, so it is read only there).
    recalled_hw: [Option<u64>; 2],
    latency: LatencyHist,
    violation: Option<String>,
    last_arrival: [[Instant; 3]; 2],
    msgs: Vec<InFlight>,
    free_msgs: Vec<u32>,
    path: crate::pathcheck::PathCheck,
    trains: u64,
}

impl<'a> Sim<'a> {
    /// A run of `sc` with `opts`.
    pub fn new(sc: &'a Scenario, opts: RunOptions) -> Sim<'a> {
        let mut f = sc.fabric.clone();
        f.dpu_only = f.dpu_only || opts.dpu_only;
        let mut sim = Sim {
            dpu: DpuNode::new(&f),
            spill: SpillPlane::new(&f),
            sc,
            now: Instant::ZERO,
            end: Instant(sc.duration.ns()),
            heap: BinaryHeap::with_capacity(1 << 16),
            seq: 0,
            rng: SplitMix64(opts.seed ^ 0x5711_1a7e_5eed_0001),
            plane_gen: 0,
            plane_running: false,
            killed_at: vec![None],
            dpu_timer: None,
            spill_timer: None,
            flows: Vec::new(),
            shorts: Vec::new(),
            free_shorts: Vec::new(),
            cps_next_tenant: vec![0; sc.cps.len()],
            next_conn: 1,
            offered: 0,
            in_flight: 0,
            driver_drops: Drops::default(),
            open_lost_driver: 0,
            control_loss: 0.0,
            control_loss_until: Instant::ZERO,
            delay_ns: 0,
            delay_until: Instant::ZERO,
            events: 0,
            checks: 0,
            last: Totals::default(),
            new_conn_offered: 0,
            last_new_conn_offered: 0,
            samples: Vec::new(),
            phases: Vec::new(),
            measure: Totals::default(),
            measure_secs: 0.0,
            recalled_hw: [(sc.measure[0].ns() < sc.sample.ns()).then_some(0), None],
            latency: LatencyHist::default(),
            violation: None,
            last_arrival: [[Instant::ZERO; 3]; 2],
            msgs: Vec::new(),
            free_msgs: Vec::new(),
            path: crate::pathcheck::PathCheck::new(opts.seed),
            trains: 0,
            f,
            opts,
        };
        sim.build_sources();
        if sc.hold == HoldSpec::Active && !sim.f.dpu_only {
            sim.dpu.handle_hold(Instant::ZERO, Hold::Active);
        }
        sim
    }

    fn push(&mut self, at: Instant, kind: EvKind) {
        self.seq += 1;
        self.heap.push(Reverse(Ev {
            at,
            seq: self.seq,
            kind,
        }));
    }

    fn build_sources(&mut self) {
        let sc = self.sc;
        let train_ns = sc.train.ns();
        for g in &sc.flows {
            let per_train = g.pps * train_ns as f64 / 1e9;
            for i in 0..g.count {
                let conn = ConnId(self.next_conn);
                self.next_conn += 1;
                // Random arrivals and the shapes other than steady draw from the flow's own
                // stream, never from the run's: scenarios without them draw exactly what they
                // always did.
                let mut rng = shape::flow_rng(self.opts.seed, conn.0);
                let offset = match g.arrivals {
                    Arrivals::Even if g.count > 1 => {
                        (g.spread.ns() as u128 * u128::from(i) / u128::from(g.count)) as u64
                    }
                    Arrivals::Even => 0,
                    Arrivals::Random => (shape::unit(&mut rng) * g.spread.ns() as f64) as u64,
                };
                let open = Instant(g.start.ns() + offset);
                let lifetime = match g.lifetimes {
                    Lifetimes::Fixed => g.lifetime.ns(),
                    Lifetimes::Exponential => shape::exp_ns(&mut rng, g.lifetime.ns() as f64),
                };
                let idx = self.flows.len() as u32;
                let state = ShapeState::new(g, open.0, &mut rng);
                let steady = state == ShapeState::Steady;
                self.flows.push(LongFlow {
                    conn,
                    tenant: TenantId(g.tenant + i % g.tenants),
                    dest: dest(g.dest),
                    bytes: g.bytes,
                    per_train,
                    // A random phase, so equal flows do not send in lockstep.
                    acc: unit(&mut self.rng),
                    jitter: g.jitter,
                    on_ns: if steady { g.on.ns() } else { 0 },
                    period_ns: if steady { g.on.ns() + g.off.ns() } else { 0 },
                    end: Instant(open.0.saturating_add(lifetime)),
                    gap_ns: g.gap.ns().max(1),
                    step: 0,
                    shape: state,
                    rng: rng.0,
                });
                if open < self.end {
                    self.push(open, EvKind::Flow(idx));
                }
            }
        }
        for (i, c) in sc.cps.iter().enumerate() {
            let at = Instant(c.start.ns());
            self.push(at, EvKind::CpsArrival(i as u16));
        }
        for (i, h) in sc.host_load.iter().enumerate() {
            self.push(Instant(h.at.ns()), EvKind::HostLoad(i as u16));
        }
        for (i, f) in sc.faults.iter().enumerate() {
            self.push(Instant(f.at.ns()), EvKind::Fault(i as u16));
        }
        self.push(Instant(sc.sample.ns()), EvKind::Sample);
        self.dpu_timer = self.dpu.poll_timeout();
        if let Some(t) = self.dpu_timer {
            self.push(t, EvKind::DpuTimer);
        }
    }

    fn offer(&mut self, t: &Train) {
        self.offered += u64::from(t.packets);
        self.dpu.handle_train(self.now, t);
        self.trains += 1;
        if self.trains.is_multiple_of(PATH_CHECK_EVERY)
            && !t.denied
            && let Err(e) = self.path.check(self.now, t.conn)
        {
            self.violation.get_or_insert(e);
        }
    }

    fn flow_step(&mut self, idx: u32) {
        let now = self.now;
        let f = self.flows[idx as usize];
        let gap_ns = f.gap_ns;
        let base = Train {
            conn: f.conn,
            tenant: f.tenant,
            side: Side::Orig,
            dest: f.dest,
            kind: Kind::Open,
            packets: 1,
            packet_bytes: f.bytes,
            born: now,
            denied: false,
        };
        let (train, next) = match f.step {
            0 => (base, Some((1, Instant(now.0 + gap_ns)))),
            1 => (
                Train {
                    side: Side::Reply,
                    kind: Kind::Control,
                    ..base
                },
                Some((2, Instant(now.0 + gap_ns))),
            ),
            2 => {
                if now >= f.end {
                    (
                        Train {
                            kind: Kind::Control,
                            ..base
                        },
                        Some((3, Instant(now.0 + gap_ns))),
                    )
                } else {
                    let mut n = 0;
                    if f.shape == ShapeState::Steady {
                        let on = f.period_ns == 0 || now.0 % f.period_ns < f.on_ns;
                        if on {
                            let j = if f.jitter > 0.0 {
                                1.0 + f.jitter * (2.0 * unit(&mut self.rng) - 1.0)
                            } else {
                                1.0
                            };
                            let acc = f.acc + f.per_train * j;
                            n = acc.floor() as u32;
                            self.flows[idx as usize].acc = acc - f64::from(n);
                        }
                    } else {
                        n = self.shaped_train(idx, now);
                    }
                    let next = Some((2, Instant(now.0 + self.sc.train.ns())));
                    if n == 0 {
                        self.reschedule_flow(idx, next);
                        return;
                    }
                    (
                        Train {
                            kind: Kind::Data,
                            packets: n,
                            ..base
                        },
                        next,
                    )
                }
            }
            3 => (
                Train {
                    side: Side::Reply,
                    kind: Kind::Control,
                    ..base
                },
                Some((4, Instant(now.0 + gap_ns))),
            ),
            _ => (
                Train {
                    kind: Kind::Close,
                    ..base
                },
                None,
            ),
        };
        self.offer(&train);
        self.reschedule_flow(idx, next);
    }

    /// Packets of the next data train of a flow whose shape is not `steady`: its rate factor
    /// now times the nominal train, with the group's jitter, all drawn from its own stream.
    fn shaped_train(&mut self, idx: u32, now: Instant) -> u32 {
        let fl = &mut self.flows[idx as usize];
        let mut rng = SplitMix64(fl.rng);
        let mut n = 0;
        if let Some(factor) = fl.shape.factor(now.0, &mut rng) {
            let j = if fl.jitter > 0.0 {
                1.0 + fl.jitter * (2.0 * shape::unit(&mut rng) - 1.0)
            } else {
                1.0
            };
            let acc = fl.acc + fl.per_train * factor * j;
            n = acc.floor() as u32;
            fl.acc = acc - f64::from(n);
        }
        fl.rng = rng.0;
        n
    }

    fn reschedule_flow(&mut self, idx: u32, next: Option<(u8, Instant)>) {
        if let Some((step, at)) = next
            && at < self.end
        {
            self.flows[idx as usize].step = step;
            self.push(at, EvKind::Flow(idx));
        }
    }

    fn cps_arrival(&mut self, g: u16) {
        let c = &self.sc.cps[g as usize];
        let now = self.now;
        if now >= Instant(c.end.ns()) || now >= self.end {
            return;
        }
        // The connection arriving now.
        let tenant = TenantId(c.tenant + self.cps_next_tenant[g as usize] % c.tenants);
        self.cps_next_tenant[g as usize] += 1;
        let denied = c.denied_fraction > 0.0 && unit(&mut self.rng) < c.denied_fraction;
        let conn = ConnId(self.next_conn);
        self.next_conn += 1;
        self.new_conn_offered += 1;
        let sc = ShortConn {
            conn,
            tenant,
            dest: dest(c.dest),
            denied,
            gap_ns: c.gap.ns().max(1),
            step: 0,
        };
        let slot = match self.free_shorts.pop() {
            Some(s) => {
                self.shorts[s as usize] = sc;
                s
            }
            None => {
                self.shorts.push(sc);
                (self.shorts.len() - 1) as u32
            }
        };
        self.short_step(slot);
        // The next arrival: Poisson at the rate of the ramp now.
        let span = (c.end.ns() - c.start.ns()) as f64;
        let x = ((now.0 - c.start.ns()) as f64 / span).clamp(0.0, 1.0);
        let rate = c.rate_from + (c.rate_to - c.rate_from) * x;
        let dt = if rate > 0.0 {
            let u = unit(&mut self.rng).max(1e-12);
            (-u.ln() / rate * 1e9).max(1.0) as u64
        } else {
            1_000_000
        };
        self.push(Instant(now.0 + dt), EvKind::CpsArrival(g));
    }

    fn short_step(&mut self, slot: u32) {
        let s = self.shorts[slot as usize];
        let (side, kind) = SHORT_STEPS[s.step as usize];
        let t = Train {
            conn: s.conn,
            tenant: s.tenant,
            side,
            dest: s.dest,
            kind,
            packets: 1,
            packet_bytes: 64,
            born: self.now,
            denied: s.denied,
        };
        self.offer(&t);
        if s.denied || s.step as usize + 1 == SHORT_STEPS.len() {
            // A denied connection's SYN is its only packet.
            self.free_shorts.push(slot);
            return;
        }
        self.shorts[slot as usize].step += 1;
        self.push(Instant(self.now.0 + s.gap_ns), EvKind::Short(slot));
    }

    /// Every channel is FIFO in each direction (a ring, a socket): a message never arrives
    /// before one sent earlier on the same channel, whatever delay a fault adds.
    fn fifo(&mut self, dir: usize, channel: Channel, at: Instant) -> Instant {
        let slot = &mut self.last_arrival[dir][channel as usize];
        let at = at.max(*slot);
        *slot = at;
        at
    }

    fn link_latency(&mut self, channel: Channel) -> u64 {
        let base = u64::try_from(self.f.pcie.latency.as_nanos()).unwrap_or(u64::MAX);
        if self.delay_ns > 0 && self.now < self.delay_until && channel != Channel::Control {
            // Extra delay, the same for the whole channel at a time so a channel stays FIFO.
            base + self.delay_ns
        } else {
            base
        }
    }

    fn route_outputs(&mut self) -> Result<(), SimFailure> {
        while let Some(t) = self.dpu.poll_transmit() {
            let lat = self.link_latency(t.channel);
            let at = self.fifo(0, t.channel, Instant(t.at.0.max(self.now.0) + lat));
            self.in_flight += t.packets();
            let plane = self.plane_gen;
            let slot = self.park(t.msg, plane, Instant(t.at.0.max(self.now.0)));
            self.push(at, EvKind::ToSpill(slot));
        }
        while let Some(c) = self.dpu.poll_command() {
            match c {
                Command::StartPlane { workers } => {
                    self.plane_gen += 1;
                    self.killed_at.push(None);
                    let at = self.now + self.f.host.plane_start;
                    let plane = self.plane_gen;
                    self.push(at, EvKind::PlaneUp { plane, workers });
                }
                Command::StopPlane => self.stop_plane(),
            }
        }
        while let Some(e) = self.dpu.poll_event() {
            self.phases.push(e);
            self.full_check()?;
        }
        if self.plane_running {
            while let Some(t) = self.spill.poll_transmit() {
                self.send_to_dpu(t);
            }
        }
        Ok(())
    }

    fn send_to_dpu(&mut self, t: Transmit) {
        let lat = self.link_latency(t.channel);
        let depart = Instant(t.at.0.max(self.now.0));
        self.in_flight += t.packets();
        let plane = self.plane_gen;
        let at = self.fifo(1, t.channel, Instant(depart.0 + lat));
        let slot = self.park(t.msg, plane, depart);
        self.push(at, EvKind::ToDpu(slot));
    }

    /// Stores an in-flight message; returns its slot.
    fn park(&mut self, msg: Msg, plane: u32, depart: Instant) -> u32 {
        let m = InFlight { msg, plane, depart };
        match self.free_msgs.pop() {
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

    /// Takes the message out of `slot`.
    fn unpark(&mut self, slot: u32) -> InFlight {
        self.free_msgs.push(slot);
        self.msgs[slot as usize]
    }

    fn stop_plane(&mut self) {
        if self.plane_running {
            self.spill.stop(self.now);
        }
        self.plane_running = false;
        let g = self.plane_gen as usize;
        if self.killed_at[g].is_none() {
            self.killed_at[g] = Some(self.now);
        }
        // A plane still starting is cancelled: its PlaneUp is for an older generation.
        self.plane_gen += 1;
        self.killed_at.push(Some(self.now));
    }

    fn lose(&mut self, msg: &Msg) {
        if let Some(t) = msg.train() {
            self.driver_drops
                .add(FabricDrop::SpillFailed, u64::from(t.packets));
            if t.kind == Kind::Open {
                self.open_lost_driver += 1;
            }
        }
    }

    fn timers(&mut self) {
        if let Some(t) = self.dpu.poll_timeout()
            && self.dpu_timer.is_none_or(|s| t < s)
        {
            self.dpu_timer = Some(t);
            self.push(t.max(self.now), EvKind::DpuTimer);
        }
        if self.plane_running
            && let Some(t) = self.spill.poll_timeout()
            && self.spill_timer.is_none_or(|s| t < s)
        {
            self.spill_timer = Some(t);
            self.push(t.max(self.now), EvKind::SpillTimer);
        }
    }

    fn trace(&self, ev: &Ev) {
        let Some(c) = self.opts.trace_conn else {
            return;
        };
        let conn = match ev.kind {
            EvKind::ToSpill(i) | EvKind::ToDpu(i) => match self.msgs[i as usize].msg {
                Msg::Packets(t) | Msg::Punt(t) => Some(t.conn),
                Msg::Sync { state, .. } | Msg::Recall { state, .. } => Some(state.conn),
                Msg::RecallDone { conn, .. } | Msg::Delete { conn, .. } => Some(conn),
                _ => None,
            },
            EvKind::Flow(i) => Some(self.flows[i as usize].conn),
            EvKind::Short(i) => Some(self.shorts[i as usize].conn),
            _ => None,
        };
        if conn == Some(c) {
            let what = match ev.kind {
                EvKind::ToSpill(i) => format!("to plane {:?}", self.msgs[i as usize].msg),
                EvKind::ToDpu(i) => format!("to dpu {:?}", self.msgs[i as usize].msg),
                k => format!("{k:?}"),
            };
            eprintln!(
                "{} {what} | dpu {:?} | plane {:?}",
                ev.at,
                self.dpu
                    .conn(c)
                    .map(|r| (r.role, r.hw_live, r.inserts_pending, r.state.version)),
                self.spill
                    .conn(c)
                    .map(|r| (r.role, r.recalling, r.state.version))
            );
        }
    }

    fn step(&mut self, ev: Ev) -> Result<(), SimFailure> {
        self.now = ev.at;
        self.events += 1;
        self.trace(&ev);
        match ev.kind {
            EvKind::Flow(i) => self.flow_step(i),
            EvKind::Short(s) => self.short_step(s),
            EvKind::CpsArrival(g) => self.cps_arrival(g),
            EvKind::ToSpill(slot) => {
                let InFlight { msg, plane, .. } = self.unpark(slot);
                if let Some(t) = msg.train() {
                    self.in_flight -= u64::from(t.packets);
                }
                if plane != self.plane_gen || !self.plane_running {
                    self.lose(&msg);
                } else {
                    self.spill.handle_msg(self.now, msg);
                }
            }
            EvKind::ToDpu(slot) => {
                let InFlight { msg, plane, depart } = self.unpark(slot);
                if let Some(t) = msg.train() {
                    self.in_flight -= u64::from(t.packets);
                }
                let dead = self.killed_at.get(plane as usize).copied().flatten();
                let lost_in_plane = dead.is_some_and(|k| depart > k);
                let lossy = self.control_loss > 0.0
                    && self.now < self.control_loss_until
                    && matches!(msg, Msg::Delete { .. });
                if lost_in_plane {
                    self.lose(&msg);
                } else if lossy && unit(&mut self.rng) < self.control_loss {
                    // A lost delete: the plane retransmits it.
                } else {
                    self.dpu.handle_msg(self.now, msg);
                }
            }
            EvKind::DpuTimer => {
                if self.dpu_timer == Some(ev.at) {
                    self.dpu_timer = None;
                    self.dpu.handle_timeout(self.now);
                }
            }
            EvKind::SpillTimer => {
                if self.spill_timer == Some(ev.at) {
                    self.spill_timer = None;
                    if self.plane_running {
                        self.spill.handle_timeout(self.now);
                    }
                }
            }
            EvKind::PlaneUp { plane, workers } => {
                if plane == self.plane_gen {
                    self.spill.start(self.now, workers);
                    self.plane_running = true;
                    self.spill_timer = None;
                    self.dpu.handle_plane_up(self.now);
                }
            }
            EvKind::Sample => self.sample(),
            EvKind::HostLoad(i) => {
                let h = &self.sc.host_load[i as usize];
                self.dpu.set_tenant_cores(h.tenant_cores);
            }
            EvKind::Fault(i) => {
                let fault = self.sc.faults[i as usize].clone();
                match fault.kind {
                    FaultKind::KillPlane => {
                        if self.plane_running {
                            self.spill.stop(self.now);
                            self.plane_running = false;
                            let g = self.plane_gen as usize;
                            self.killed_at[g] = Some(self.now);
                            self.dpu
                                .handle_plane_failed(self.now, "plane process killed");
                        }
                    }
                    FaultKind::ControlLoss => {
                        self.control_loss = fault.probability;
                        self.control_loss_until = self.now + fault.duration.0;
                    }
                    FaultKind::Delay => {
                        self.delay_ns = fault.duration.ns();
                        self.delay_until = self.now + fault.duration.0 * 4;
                    }
                }
            }
        }
        self.route_outputs()?;
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
            seed: self.opts.seed,
        }
    }

    fn totals(&self) -> Totals {
        let d = self.dpu.counters();
        let s = self.spill_counters_total();
        Totals {
            offered: self.offered,
            dpu: d.hw_delivered + d.soc_delivered,
            host: d.host_out + s.0,
            lost: self.drops().lost(),
            new_conn: d.soc_new_conn + s.1,
            closed: d.closed + s.2,
            inserts: self.dpu.inserts_total(),
            hw: d.hw_delivered,
            deletes: d.deletes,
            deletes_to_host: d.deletes_to_host,
            recalls: d.recalls_ok,
            demotes: d.demotes,
            sheds: d.shed,
            flaps: d.flaps,
            busy_ns: self.spill.counters().busy_ns,
        }
    }

    /// (direct deliveries, new connections, closes delivered directly) of the plane. The
    /// plane's counters survive restarts (they are the plane's metrics, not its state).
    fn spill_counters_total(&self) -> (u64, u64, u64) {
        let c = self.spill.counters();
        (c.direct, c.new_conn, c.closed_direct)
    }

    fn drops(&self) -> Drops {
        self.dpu
            .drops()
            .merged(self.spill.drops())
            .merged(&self.driver_drops)
    }

    fn check_cheap(&mut self) -> Result<(), SimFailure> {
        self.checks += 1;
        // Only the sums conservation needs: this runs after every event.
        let d = self.dpu.counters();
        let delivered =
            d.hw_delivered + d.soc_delivered + d.host_out + self.spill.counters().direct;
        let dropped =
            self.dpu.drops().total() + self.spill.drops().total() + self.driver_drops.total();
        if self.offered != delivered + dropped + self.in_flight {
            let t = self.totals();
            return Err(self.fail(format!(
                "conservation: offered {} != dpu {} + host {} + dropped {} + in flight {}",
                t.offered, t.dpu, t.host, dropped, self.in_flight
            )));
        }
        self.dpu.check_cheap().map_err(|e| self.fail(e))
    }

    fn full_check(&mut self) -> Result<(), SimFailure> {
        self.checks += 1;
        self.dpu.check_invariants().map_err(|e| self.fail(e))?;
        if self.plane_running {
            self.spill.check_invariants().map_err(|e| self.fail(e))?;
            // No connection owned by both planes.
            let d = self.dpu.conns_sorted();
            let s = self.spill.conns_sorted();
            let (mut i, mut j) = (0, 0);
            while i < d.len() && j < s.len() {
                match d[i].0.cmp(&s[j].0) {
                    core::cmp::Ordering::Less => i += 1,
                    core::cmp::Ordering::Greater => j += 1,
                    core::cmp::Ordering::Equal => {
                        if d[i].1.role == Role::Owner && s[j].1.role == Role::Owner {
                            return Err(self.fail(format!(
                                "ownership: {} is owned by the DPU and the plane",
                                d[i].0
                            )));
                        }
                        i += 1;
                        j += 1;
                    }
                }
            }
        }
        Ok(())
    }

    /// Liveness of ownership at the end of a run: every connection either plane knows has
    /// exactly one owner, or a message that hands it over is still in flight.
    fn final_ownership_check(&mut self) -> Result<(), SimFailure> {
        if !self.plane_running {
            return Ok(()); // the DPU alone: every record it has is its own
        }
        let mut in_transit: Vec<ConnId> = self
            .heap
            .iter()
            .filter_map(|Reverse(e)| match e.kind {
                EvKind::ToSpill(i) | EvKind::ToDpu(i) => match self.msgs[i as usize].msg {
                    Msg::Sync { state, .. } | Msg::Recall { state, .. } => Some(state.conn),
                    Msg::RecallDone { conn, .. } | Msg::Delete { conn, .. } => Some(conn),
                    _ => None,
                },
                _ => None,
            })
            .collect();
        in_transit.sort_unstable();
        let d = self.dpu.conns_sorted();
        let s = self.spill.conns_sorted();
        let owned = |v: &[(ConnId, Role)], c: ConnId| {
            v.binary_search_by_key(&c, |x| x.0)
                .is_ok_and(|i| v[i].1 == Role::Owner)
        };
        // A recall whose inserts are still queued at the DPU is a handover in progress.
        for (c, r) in &d {
            if r.recalled && r.inserts_pending > 0 {
                in_transit.push(*c);
            }
        }
        in_transit.sort_unstable();
        let dv: Vec<(ConnId, Role)> = d.iter().map(|(c, r)| (*c, r.role)).collect();
        let sv: Vec<(ConnId, Role)> = s.iter().map(|(c, r)| (*c, r.role)).collect();
        for (c, _) in dv.iter().chain(sv.iter()) {
            let n = u32::from(owned(&dv, *c)) + u32::from(owned(&sv, *c));
            if n == 0 && in_transit.binary_search(c).is_err() {
                return Err(self.fail(format!(
                    "ownership: {c} has no owner and no handover in flight at the end (dpu {:?}, plane {:?})",
                    self.dpu.conn(*c),
                    self.spill.conn(*c)
                )));
            }
            if n == 2 {
                return Err(self.fail(format!("ownership: {c} has two owners at the end")));
            }
        }
        Ok(())
    }

    fn sample(&mut self) {
        let secs = self.sc.sample.0.as_secs_f64();
        let t = self.totals();
        let d = |a: u64, b: u64| (a - b) as f64 / secs;
        let lat = self.dpu.take_window_latency();
        self.latency.merge(&lat);
        let load = *self.dpu.last_load();
        let s = Sample {
            t_s: self.now.0 as f64 / 1e9,
            offered_mpps: d(t.offered, self.last.offered) / 1e6,
            dpu_mpps: d(t.dpu, self.last.dpu) / 1e6,
            host_mpps: d(t.host, self.last.host) / 1e6,
            lost_mpps: d(t.lost, self.last.lost) / 1e6,
            new_conn_mcps: d(t.new_conn, self.last.new_conn) / 1e6,
            offered_mcps: (self.new_conn_offered - self.last_new_conn_offered) as f64 / secs / 1e6,
            done_mcps: d(t.closed, self.last.closed) / 1e6,
            p50_us: lat.quantile(0.5) as f64 / 1e3,
            p99_us: lat.quantile(0.99) as f64 / 1e3,
            hw_table_util: self.dpu.hw_entries() as f64 / self.dpu.hw_capacity() as f64,
            hw_util: load.hw_util,
            soc_util: load.soc_util,
            workers: if self.plane_running {
                self.spill.workers()
            } else {
                0
            },
            phase: self.dpu.phase().name(),
        };
        let inserts = t.inserts - self.last.inserts;
        let budget = self.f.dpu.insert_rate_limit * secs + 2.0;
        if inserts as f64 > budget {
            self.violation = Some(format!(
                "insertion budget: {inserts} inserts in {secs} s > {budget:.0}"
            ));
        }
        let from = self.sc.measure[0].ns();
        let to = self.sc.measure[1].ns();
        if self.now.0 > from && self.now.0 <= to {
            let last = self.last;
            self.measure.add_delta(&t, &last);
            self.measure_secs += secs;
        }
        // The window's first delta starts at the last sample at or before `from`, its last
        // delta ends at the last sample at or before `to`.
        let step = self.sc.sample.ns();
        if self.now.0 <= from && self.now.0 + step > from {
            self.recalled_hw[0] = Some(self.dpu.recalled_hw_packets());
        }
        if self.now.0 > from && self.now.0 <= to && self.now.0 + step > to {
            self.recalled_hw[1] = Some(self.dpu.recalled_hw_packets());
        }
        self.last_new_conn_offered = self.new_conn_offered;
        self.last = t;
        // Samples are kept in every run: the sweep's zero-loss search reads them too.
        self.samples.push(s);
        let next = self.now + self.sc.sample.0;
        if next <= Instant(self.end.0 + DRAIN_NS) {
            self.push(next, EvKind::Sample);
        }
    }
}

impl Sim<'_> {
    /// Runs to the end; `progress` is called with the fraction of virtual time done.
    pub fn run(mut self, progress: &mut dyn FnMut(f64)) -> Result<RunReport, SimFailure> {
        let stop = Instant(self.end.0 + DRAIN_NS);
        let mut next_progress = 0u64;
        // A hold set at time zero has commands and events to route before the first event.
        self.route_outputs()?;
        while let Some(Reverse(ev)) = self.heap.pop() {
            if ev.at > stop {
                break;
            }
            self.step(ev)?;
            if let Some(v) = self.violation.take() {
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
        // State continuity: a packet may find no state only if its connection's opening packet
        // was lost (then the connection never existed for the fabric).
        let no_state = self.drops().get(FabricDrop::NoState);
        let opens_lost = self.dpu.counters().open_dropped
            + self.spill.counters().open_dropped
            + self.open_lost_driver;
        if no_state > 0 && opens_lost == 0 {
            return Err(self.fail(format!(
                "state continuity: {no_state} packets found no connection state, but no opening packet was lost (first: dpu {:?}, plane {:?})",
                self.dpu.first_no_state(),
                self.spill.first_no_state()
            )));
        }
        progress(1.0);
        Ok(self.report())
    }

    fn report(self) -> RunReport {
        let t = self.totals();
        let drops = self.drops();
        let secs = self.measure_secs.max(1e-9);
        let m = self.measure;
        let ev = |k: EventKind| self.phases.iter().find(|e| e.what == k).map(|e| e.at);
        let ms = |a: Option<Instant>, b: Option<Instant>| match (a, b) {
            (Some(a), Some(b)) if b >= a => Some((b.0 - a.0) as f64 / 1e6),
            _ => None,
        };
        let absorbing_ev = self.phases.iter().find(|e| e.what == EventKind::Absorbing);
        let prepare = absorbing_ev.and_then(|e| e.since);
        let absorbing = absorbing_ev.map(|e| e.at);
        let activating = ev(EventKind::Activating);
        let active = ev(EventKind::Active);
        let release = self
            .phases
            .iter()
            .find(|e| e.what == EventKind::Draining && e.reason.starts_with("release"))
            .map(|e| e.at);
        let idle_after = release.and_then(|r| {
            self.phases
                .iter()
                .find(|e| e.what == EventKind::Idle && e.at >= r)
                .map(|e| e.at)
        });
        let mut latency = self.latency.clone();
        latency.merge(self.spill.latency());
        let d = self.dpu.counters();
        let delivered = t.dpu + t.host;
        let mut counters = std::collections::BTreeMap::new();
        for (k, v) in d.iter().chain(self.spill.counters().iter()) {
            counters.insert(k, v);
        }
        counters.insert("dpu.hw.packets.recalled", self.dpu.recalled_hw_packets());
        counters.insert("sim.events", self.events);
        counters.insert("sim.path_checks", self.path.checks());
        counters.insert("sim.path_checks.hw_hits", self.path.hw_fast_path_hits());
        RunReport {
            kind: "model",
            scenario: self.sc.name.clone(),
            seed: self.opts.seed,
            baseline: if self.f.dpu_only {
                "dpu-only"
            } else {
                "spillway"
            },
            placement: if self.f.dpu_only {
                "none"
            } else {
                self.spill.policy_name()
            },
            measure_s: [
                self.sc.measure[0].0.as_secs_f64(),
                self.sc.measure[1].0.as_secs_f64(),
            ],
            offered_mpps: m.offered as f64 / secs / 1e6,
            delivered_mpps: (m.dpu + m.host) as f64 / secs / 1e6,
            dpu_mpps: m.dpu as f64 / secs / 1e6,
            host_mpps: m.host as f64 / secs / 1e6,
            cps: m.closed as f64 / secs,
            offered_packets: t.offered,
            delivered_packets: delivered,
            lost_packets: t.offered - delivered - drops.get(FabricDrop::Policy),
            drops: drops.iter().collect(),
            activation_ms: ms(prepare, absorbing),
            rule_injection_ms: ms(activating, active),
            release_ms: ms(release, idle_after),
            latency_us: LatencyUs {
                p50: latency.quantile(0.5) as f64 / 1e3,
                p99: latency.quantile(0.99) as f64 / 1e3,
                mean: latency.mean() / 1e3,
            },
            offload_ratio: if delivered > 0 {
                d.hw_delivered as f64 / delivered as f64
            } else {
                0.0
            },
            pcie_crossings_per_packet: if delivered > 0 {
                d.pcie_crossings as f64 / delivered as f64
            } else {
                0.0
            },
            window: {
                let per_s = |n: u64| n as f64 / secs;
                let hw_recalled = match self.recalled_hw {
                    [Some(a), Some(b)] => b.saturating_sub(a),
                    _ => 0,
                };
                let plane = hw_recalled + m.host;
                WindowFigures {
                    offload_ratio: if m.dpu + m.host > 0 {
                        m.hw as f64 / (m.dpu + m.host) as f64
                    } else {
                        0.0
                    },
                    plane_offload_ratio: (plane > 0).then(|| hw_recalled as f64 / plane as f64),
                    inserts_per_s: per_s(m.inserts),
                    deletes_per_s: per_s(m.deletes),
                    deletes_to_host_per_s: per_s(m.deletes_to_host),
                    recalls: m.recalls,
                    demotions: m.demotes,
                    sheds: m.sheds,
                    flaps: m.flaps,
                    host_cpu_cores: m.busy_ns as f64 / 1e9 / secs,
                }
            },
            phases: self
                .phases
                .iter()
                .map(|e| PhaseEvent {
                    phase: e.what.name(),
                    t_s: e.at.0 as f64 / 1e9,
                    reason: e.reason.clone(),
                })
                .collect(),
            counters,
            checks: self.checks,
            events: self.events,
            zero_loss_cps: None,
            series: self.samples,
        }
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
