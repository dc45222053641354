//! The workload: the long flows and the short connections of the scenario, as trains.
//!
//! The sources own every flow's and connection's progress (handshake, data, teardown), the
//! connection ids they hand out, and the count of what they offered. Each step returns the
//! train to offer now (if any) and schedules the source's next step on the event queue. The
//! run's random stream is lent to them for the draws they have always made from it (a flow's
//! phase and jitter, a connection's denial and its group's next arrival); flows with random
//! arrivals or a non-steady shape draw from their own stream ([`crate::shape`]), so their
//! trajectory does not depend on event order or placement.

use spillway_fabric::types::{ConnId, Dest, Kind, Side, Train};
use spillway_vswitch::workload::SplitMix64;
use spillway_vswitch::{Instant, TenantId};

use super::queue::{EvKind, EventQueue};
use crate::scenario::{Arrivals, DestSpec, Lifetimes, Scenario};
use crate::shape::{self, ShapeState, unit};

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

/// The flows and connections of a run.
#[derive(Debug)]
pub(super) struct Sources<'a> {
    scenario: &'a Scenario,
    /// The end of the workload (`duration`): no step is scheduled at or after it.
    end: Instant,
    flows: Vec<LongFlow>,
    /// Short connections by slot; `free_shorts` lists the reusable slots.
    shorts: Vec<ShortConn>,
    free_shorts: Vec<u32>,
    /// Per CPS group, the number of connections it opened (they cycle through its tenants).
    cps_opened: Vec<u32>,
    next_conn: u64,
    /// Packets offered.
    offered: u64,
    /// Short connections opened.
    new_conn_offered: u64,
}

impl<'a> Sources<'a> {
    /// The sources of `scenario`: every long flow, its first step and each CPS group's first
    /// arrival scheduled (in that order, which fixes their sequence numbers).
    pub(super) fn new(
        scenario: &'a Scenario,
        seed: u64,
        rng: &mut SplitMix64,
        queue: &mut EventQueue,
    ) -> Sources<'a> {
        let mut s = Sources {
            scenario,
            end: Instant(scenario.duration.ns()),
            flows: Vec::new(),
            shorts: Vec::new(),
            free_shorts: Vec::new(),
            cps_opened: vec![0; scenario.cps.len()],
            next_conn: 1,
            offered: 0,
            new_conn_offered: 0,
        };
        s.build(seed, rng, queue);
        s
    }

    fn build(&mut self, seed: u64, run_rng: &mut SplitMix64, queue: &mut EventQueue) {
        let sc = self.scenario;
        let train_ns = sc.train.ns();
        for g in &sc.flows {
            let per_train = g.pps * train_ns as f64 / 1e9;
            for i in 0..g.count {
                let conn = ConnId(self.next_conn);
                self.next_conn += 1;
                // Random arrivals and the shapes other than steady draw from the flow's own
                // stream, never from the run's: scenarios without them draw exactly what they
                // always did.
                let mut rng = shape::flow_rng(seed, conn.0);
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
                    acc: unit(run_rng),
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
                    queue.push(open, EvKind::Flow(idx));
                }
            }
        }
        for (i, c) in sc.cps.iter().enumerate() {
            let at = Instant(c.start.ns());
            queue.push(at, EvKind::CpsArrival(i as u16));
        }
    }

    /// Packets offered so far.
    pub(super) fn offered(&self) -> u64 {
        self.offered
    }

    /// Short connections opened so far.
    pub(super) fn new_conn_offered(&self) -> u64 {
        self.new_conn_offered
    }

    /// The connection of long flow `idx`.
    pub(super) fn flow_conn(&self, idx: u32) -> ConnId {
        self.flows[idx as usize].conn
    }

    /// The connection in short slot `slot`.
    pub(super) fn short_conn(&self, slot: u32) -> ConnId {
        self.shorts[slot as usize].conn
    }

    /// Counts `t` as offered and hands it back.
    fn emit(&mut self, t: Train) -> Option<Train> {
        self.offered += u64::from(t.packets);
        Some(t)
    }

    /// The next step of long flow `idx` at `now`: its train (none when a data step rounds to
    /// zero packets), its next step scheduled.
    pub(super) fn flow_step(
        &mut self,
        idx: u32,
        now: Instant,
        rng: &mut SplitMix64,
        queue: &mut EventQueue,
    ) -> Option<Train> {
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
                                1.0 + f.jitter * (2.0 * unit(rng) - 1.0)
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
                    let next = Some((2, Instant(now.0 + self.scenario.train.ns())));
                    if n == 0 {
                        self.reschedule_flow(idx, next, queue);
                        return None;
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
        // Offering the train schedules nothing, so scheduling the next step first keeps the
        // sequence numbers of the original order (offer, then reschedule).
        self.reschedule_flow(idx, next, queue);
        self.emit(train)
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

    fn reschedule_flow(&mut self, idx: u32, next: Option<(u8, Instant)>, queue: &mut EventQueue) {
        if let Some((step, at)) = next
            && at < self.end
        {
            self.flows[idx as usize].step = step;
            queue.push(at, EvKind::Flow(idx));
        }
    }

    /// A connection of CPS group `g` arrives at `now`: its first packet's train; its next
    /// packet and the group's next arrival scheduled.
    pub(super) fn cps_arrival(
        &mut self,
        g: u16,
        now: Instant,
        rng: &mut SplitMix64,
        queue: &mut EventQueue,
    ) -> Option<Train> {
        let scenario = self.scenario;
        let c = &scenario.cps[g as usize];
        if now >= Instant(c.end.ns()) || now >= self.end {
            return None;
        }
        // The connection arriving now.
        let tenant = TenantId(c.tenant + self.cps_opened[g as usize] % c.tenants);
        self.cps_opened[g as usize] += 1;
        let denied = c.denied_fraction > 0.0 && unit(rng) < c.denied_fraction;
        let conn = ConnId(self.next_conn);
        self.next_conn += 1;
        self.new_conn_offered += 1;
        let short = ShortConn {
            conn,
            tenant,
            dest: dest(c.dest),
            denied,
            gap_ns: c.gap.ns().max(1),
            step: 0,
        };
        let slot = match self.free_shorts.pop() {
            Some(s) => {
                self.shorts[s as usize] = short;
                s
            }
            None => {
                self.shorts.push(short);
                (self.shorts.len() - 1) as u32
            }
        };
        let train = self.short_step(slot, now, queue);
        // The next arrival: Poisson at the rate of the ramp now.
        let span = (c.end.ns() - c.start.ns()) as f64;
        let x = ((now.0 - c.start.ns()) as f64 / span).clamp(0.0, 1.0);
        let rate = c.rate_from + (c.rate_to - c.rate_from) * x;
        let dt = if rate > 0.0 {
            let u = unit(rng).max(1e-12);
            (-u.ln() / rate * 1e9).max(1.0) as u64
        } else {
            1_000_000
        };
        queue.push(Instant(now.0 + dt), EvKind::CpsArrival(g));
        train
    }

    /// The next packet of the short connection in `slot`; its next packet scheduled, or its
    /// slot freed after the last one.
    pub(super) fn short_step(
        &mut self,
        slot: u32,
        now: Instant,
        queue: &mut EventQueue,
    ) -> Option<Train> {
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
            born: now,
            denied: s.denied,
        };
        if s.denied || s.step as usize + 1 == SHORT_STEPS.len() {
            // A denied connection's SYN is its only packet.
            self.free_shorts.push(slot);
        } else {
            self.shorts[slot as usize].step += 1;
            queue.push(Instant(now.0 + s.gap_ns), EvKind::Short(slot));
        }
        self.emit(t)
    }
}
