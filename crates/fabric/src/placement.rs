//! Placement back to the DPU: which spill-plane flows are recalled into the hardware fast path.
//!
//! A [`PlacementPolicy`] sees, once per placement tick, the plane's recall candidates (owned,
//! established connections with at least one full tick of measured rate, none in transit), the
//! recalled flows' measured rates (from the DPU's flow-stats dump), and the budget: free
//! hardware entries and the fast-path headroom URSched allows. It answers with recalls and, for
//! swaps, demotions. URSched's headroom binds every policy (the DPU refuses recalls beyond it);
//! policies differ only in which flows they choose.
//!
//! - [`FirstCome`]: offload every flow in the order it arrived while entries and headroom last.
//!   What a plain hardware-offload switch does.
//! - [`OvsRebalance`]: Open vSwitch's `offload-rebalance`: offload first come while the table has
//!   room; when flows are left pending for lack of room, every `rebalance_period` (3 s), swap the
//!   lowest-pps offloaded flow for the highest-pps pending one, pair by pair, while the pending
//!   one is faster.
//! - [`Threshold`]: a bandwidth threshold, as Andromeda's Hoverboard offloads the flows whose
//!   measured usage exceeds a threshold: recall every flow above `threshold_pps`, fastest
//!   first, while entries and headroom last. Like Hoverboard it never evicts: an entry comes
//!   back when its flow ends.
//! - [`crate::stable_placement::StabilityPlacement`]: Top-K on recent bandwidth × (1 − instability)³,
//!   judged by per-flow Frequent Directions sketches, with hysteresis when swapping.
//! - [`NoRecall`]: never recall.

use spillway_sketch::features::FeatureTick;
use spillway_vswitch::{Instant, TenantId};

use crate::types::ConnId;

/// A host flow that could be recalled.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Candidate {
    /// The connection.
    pub conn: ConnId,
    /// Its tenant.
    pub tenant: TenantId,
    /// When the plane took it.
    pub since: Instant,
    /// Its features over the last tick, as the plane measured them: bandwidth (packets x
    /// packet size), packet rate, control-packet share (the trains that step the connection:
    /// open, control, close) and inter-arrival jitter.
    pub features: FeatureTick,
}

impl Candidate {
    /// Its rate over the last tick, packets/s.
    pub fn pps(&self) -> f64 {
        self.features.pps
    }
}

/// A flow on the hardware fast path that came from the plane.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Offloaded {
    /// The connection.
    pub conn: ConnId,
    /// Its tenant.
    pub tenant: TenantId,
    /// Its rate over the last stats period, packets/s.
    pub pps: f64,
}

/// What the policy may spend this tick.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Budget {
    /// Free hardware entries (two per connection).
    pub free_entries: u64,
    /// Fast-path packets/s the DPU can still take.
    pub headroom_pps: f64,
    /// Most recalls this tick.
    pub recalls_max: u32,
}

/// A placement decision.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Move {
    /// Recall `conn` (measured at `pps`).
    Recall {
        /// The connection.
        conn: ConnId,
        /// Its rate.
        pps: f64,
        /// Rate of the flow it replaces (a swap), 0 if none.
        replaces_pps: f64,
    },
    /// Demote an offloaded flow back to the host (a swap's first half; the recall of its
    /// replacement waits for the delete's acknowledgement).
    Demote {
        /// The connection.
        conn: ConnId,
    },
}

/// A placement policy. `candidates` are sorted by connection id; so is `offloaded`.
pub trait PlacementPolicy: core::fmt::Debug {
    /// Short name for reports.
    fn name(&self) -> &'static str;
    /// `conn` closed: a policy that keeps per-connection state forgets it. The plane calls
    /// this for every connection it removes; a connection back on the host shows up among the
    /// candidates again, and a restarted plane starts with a fresh policy.
    fn closed(&mut self, _conn: ConnId) {}
    /// Decides this tick's moves, appending them to `out`.
    fn tick(
        &mut self,
        now: Instant,
        candidates: &[Candidate],
        offloaded: &[Offloaded],
        budget: Budget,
        out: &mut Vec<Move>,
    );
}

/// Offload first come, first served.
#[derive(Clone, Debug, Default)]
pub struct FirstCome {
    order: Vec<Candidate>,
}

impl FirstCome {
    fn fill(&mut self, candidates: &[Candidate], budget: Budget, out: &mut Vec<Move>) {
        self.order.clear();
        self.order.extend_from_slice(candidates);
        self.order.sort_by_key(|c| (c.since, c.conn));
        recall_in_order(&self.order, budget, out);
    }
}

/// Recalls `order`'s flows in that order while entries, headroom and the tick's recalls last.
/// A flow too fast for the headroom left blocks nothing behind it: a slower one may still fit.
fn recall_in_order(order: &[Candidate], budget: Budget, out: &mut Vec<Move>) {
    let mut entries = budget.free_entries;
    let mut headroom = budget.headroom_pps;
    let mut n = 0;
    for c in order {
        if entries < 2 || n >= budget.recalls_max {
            break;
        }
        if c.pps() > headroom {
            continue;
        }
        entries -= 2;
        headroom -= c.pps();
        n += 1;
        out.push(Move::Recall {
            conn: c.conn,
            pps: c.pps(),
            replaces_pps: 0.0,
        });
    }
}

impl PlacementPolicy for FirstCome {
    fn name(&self) -> &'static str {
        "first-come"
    }
    fn tick(
        &mut self,
        _now: Instant,
        candidates: &[Candidate],
        _offloaded: &[Offloaded],
        budget: Budget,
        out: &mut Vec<Move>,
    ) {
        self.fill(candidates, budget, out);
    }
}

/// Open vSwitch's `offload-rebalance`. See the module doc.
#[derive(Clone, Debug)]
pub struct OvsRebalance {
    period: core::time::Duration,
    next: Option<Instant>,
    first: FirstCome,
    pending: Vec<Candidate>,
    low: Vec<Offloaded>,
}

impl OvsRebalance {
    /// Rebalances every `period`.
    pub fn new(period: core::time::Duration) -> OvsRebalance {
        OvsRebalance {
            period,
            next: None,
            first: FirstCome::default(),
            pending: Vec::new(),
            low: Vec::new(),
        }
    }
}

impl PlacementPolicy for OvsRebalance {
    fn name(&self) -> &'static str {
        "ovs-rebalance"
    }
    fn tick(
        &mut self,
        now: Instant,
        candidates: &[Candidate],
        offloaded: &[Offloaded],
        budget: Budget,
        out: &mut Vec<Move>,
    ) {
        // Offload first come into whatever is free. The table is full when that leaves flows
        // pending (OVS rebalances when offloads fail for lack of room), whether or not a few
        // entries happened to be free at the start of this tick: with churn they usually are.
        let before = out.len();
        self.first.fill(candidates, budget, out);
        let filled = (out.len() - before) as u64;
        if budget.free_entries >= 2 * (filled + 1) || filled as usize == candidates.len() {
            return;
        }
        let due = *self.next.get_or_insert(now + self.period);
        if now < due {
            return;
        }
        self.next = Some(now + self.period);
        self.pending.clear();
        // Pending: the candidates the fill did not take.
        let taken = &out[before..];
        self.pending.extend(candidates.iter().filter(|c| {
            !taken
                .iter()
                .any(|m| matches!(m, Move::Recall { conn, .. } if *conn == c.conn))
        }));
        // Highest pps first; ties by connection id.
        self.pending
            .sort_by(|a, b| b.pps().total_cmp(&a.pps()).then(a.conn.cmp(&b.conn)));
        self.low.clear();
        self.low.extend_from_slice(offloaded);
        self.low
            .sort_by(|a, b| a.pps.total_cmp(&b.pps).then(a.conn.cmp(&b.conn)));
        let pairs = self.pending.iter().zip(self.low.iter());
        for (n, (p, o)) in pairs.enumerate() {
            if p.pps() <= o.pps || n as u32 >= budget.recalls_max {
                break;
            }
            out.push(Move::Demote { conn: o.conn });
            out.push(Move::Recall {
                conn: p.conn,
                pps: p.pps(),
                replaces_pps: o.pps,
            });
        }
    }
}

/// Recall the flows above a rate threshold, fastest first (Andromeda's Hoverboard). See the
/// module doc.
#[derive(Clone, Debug)]
pub struct Threshold {
    threshold_pps: f64,
    above: Vec<Candidate>,
}

impl Threshold {
    /// Recalls flows measured above `threshold_pps`.
    pub fn new(threshold_pps: f64) -> Threshold {
        Threshold {
            threshold_pps,
            above: Vec::new(),
        }
    }
}

impl PlacementPolicy for Threshold {
    fn name(&self) -> &'static str {
        "threshold"
    }
    fn tick(
        &mut self,
        _now: Instant,
        candidates: &[Candidate],
        _offloaded: &[Offloaded],
        budget: Budget,
        out: &mut Vec<Move>,
    ) {
        self.above.clear();
        self.above.extend(
            candidates
                .iter()
                .filter(|c| c.pps() > self.threshold_pps)
                .copied(),
        );
        // Highest rate first; ties by connection id.
        self.above
            .sort_by(|a, b| b.pps().total_cmp(&a.pps()).then(a.conn.cmp(&b.conn)));
        recall_in_order(&self.above, budget, out);
    }
}

/// Never recall.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoRecall;

impl PlacementPolicy for NoRecall {
    fn name(&self) -> &'static str {
        "none"
    }
    fn tick(&mut self, _: Instant, _: &[Candidate], _: &[Offloaded], _: Budget, _: &mut Vec<Move>) {
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cand(id: u64, pps: f64, since: u64) -> Candidate {
        Candidate {
            conn: ConnId(id),
            tenant: TenantId(1),
            since: Instant(since),
            features: FeatureTick {
                pps,
                bw_bps: pps * 64.0 * 8.0,
                ..FeatureTick::default()
            },
        }
    }

    fn recalled(out: &[Move]) -> Vec<u64> {
        out.iter()
            .map(|m| match m {
                Move::Recall { conn, .. } => conn.0,
                Move::Demote { .. } => panic!("unexpected demotion: {out:?}"),
            })
            .collect()
    }

    #[test]
    fn threshold_recalls_only_flows_above_it_fastest_first_within_the_budget() {
        let mut p = Threshold::new(1000.0);
        let c = [
            cand(1, 1000.0, 0), // at the threshold: not above it
            cand(2, 5000.0, 0),
            cand(3, 3000.0, 0),
            cand(4, 3000.0, 0), // ties with 3: lower id first
            cand(5, 90_000.0, 0),
            cand(6, 999.0, 0),
            cand(7, 2000.0, 0),
        ];
        let mut out = Vec::new();
        let budget = Budget {
            free_entries: 8,
            headroom_pps: 12_000.0,
            recalls_max: 100,
        };
        p.tick(Instant(0), &c, &[], budget, &mut out);
        // 5 does not fit the headroom (skipped, not blocking); 2, 3, 4 fit (11k); 7 would
        // exceed the headroom left (1k).
        assert_eq!(recalled(&out), vec![2, 3, 4]);
        out.clear();
        // Entries bind: two connections' worth.
        p.tick(
            Instant(0),
            &c,
            &[],
            Budget {
                free_entries: 5,
                ..budget
            },
            &mut out,
        );
        assert_eq!(recalled(&out), vec![2, 3]);
        out.clear();
        // The per-tick recall cap binds.
        p.tick(
            Instant(0),
            &c,
            &[],
            Budget {
                recalls_max: 1,
                ..budget
            },
            &mut out,
        );
        assert_eq!(recalled(&out), vec![2]);
        out.clear();
        // A full table: nothing, and never an eviction.
        let o = [Offloaded {
            tenant: TenantId(1),
            conn: ConnId(9),
            pps: 1.0,
        }];
        p.tick(
            Instant(0),
            &c,
            &o,
            Budget {
                free_entries: 1,
                ..budget
            },
            &mut out,
        );
        assert!(out.is_empty(), "{out:?}");
    }

    #[test]
    fn first_come_takes_arrival_order_within_entries_and_headroom() {
        let mut p = FirstCome::default();
        let mut out = Vec::new();
        let c = [
            cand(1, 100.0, 30),
            cand(2, 100.0, 10),
            cand(3, 500.0, 20),
            cand(4, 50.0, 40),
        ];
        p.tick(
            Instant(0),
            &c,
            &[],
            Budget {
                free_entries: 6,
                headroom_pps: 260.0,
                recalls_max: 10,
            },
            &mut out,
        );
        let ids: Vec<u64> = out
            .iter()
            .map(|m| match m {
                Move::Recall { conn, .. } => conn.0,
                Move::Demote { .. } => unreachable!(),
            })
            .collect();
        // 2 (t=10) fits; 3 (500 pps) does not; 1 fits; 4 fits the headroom but not the entries.
        assert_eq!(ids, vec![2, 1, 4]);
    }

    #[test]
    fn ovs_rebalance_fills_free_entries_then_swaps_for_what_is_still_pending() {
        let mut p = OvsRebalance::new(core::time::Duration::from_secs(3));
        // One connection's worth of entries free, three candidates: the first come fills it,
        // the other two are pending, so the table counts as full and the period is armed.
        let b = Budget {
            free_entries: 2,
            headroom_pps: 1e9,
            recalls_max: 100,
        };
        let c = [cand(10, 900.0, 5), cand(11, 50.0, 1), cand(12, 400.0, 3)];
        let o = [Offloaded {
            tenant: TenantId(1),
            conn: ConnId(1),
            pps: 100.0,
        }];
        let mut out = Vec::new();
        p.tick(Instant(0), &c, &o, b, &mut out);
        assert_eq!(
            out,
            vec![Move::Recall {
                conn: ConnId(11),
                pps: 50.0,
                replaces_pps: 0.0
            }]
        );
        out.clear();
        p.tick(Instant(3_000_000_000), &c, &o, b, &mut out);
        // Fill again (first come), then swap the fastest pending (900) for the slowest
        // offloaded (100).
        assert_eq!(
            out,
            vec![
                Move::Recall {
                    conn: ConnId(11),
                    pps: 50.0,
                    replaces_pps: 0.0
                },
                Move::Demote { conn: ConnId(1) },
                Move::Recall {
                    conn: ConnId(10),
                    pps: 900.0,
                    replaces_pps: 100.0
                },
            ]
        );
    }

    #[test]
    fn ovs_rebalance_swaps_while_pending_beats_offloaded_and_only_every_period() {
        let mut p = OvsRebalance::new(core::time::Duration::from_secs(3));
        let full = Budget {
            free_entries: 0,
            headroom_pps: 1e9,
            recalls_max: 100,
        };
        let c = [cand(10, 900.0, 0), cand(11, 50.0, 0), cand(12, 400.0, 0)];
        let o = [
            Offloaded {
                tenant: TenantId(1),
                conn: ConnId(1),
                pps: 100.0,
            },
            Offloaded {
                tenant: TenantId(1),
                conn: ConnId(2),
                pps: 500.0,
            },
            Offloaded {
                tenant: TenantId(1),
                conn: ConnId(3),
                pps: 10.0,
            },
        ];
        let mut out = Vec::new();
        p.tick(Instant(0), &c, &o, full, &mut out);
        assert!(out.is_empty(), "the first full tick arms the period");
        p.tick(Instant(3_000_000_000), &c, &o, full, &mut out);
        // 900 vs 10: swap; 400 vs 100: swap; 50 vs 500: stop.
        assert_eq!(
            out,
            vec![
                Move::Demote { conn: ConnId(3) },
                Move::Recall {
                    conn: ConnId(10),
                    pps: 900.0,
                    replaces_pps: 10.0
                },
                Move::Demote { conn: ConnId(1) },
                Move::Recall {
                    conn: ConnId(12),
                    pps: 400.0,
                    replaces_pps: 100.0
                },
            ]
        );
        out.clear();
        p.tick(Instant(4_000_000_000), &c, &o, full, &mut out);
        assert!(out.is_empty(), "no rebalance before the next period");
    }
}
