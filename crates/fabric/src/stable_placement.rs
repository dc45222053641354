//! Stability-based placement: recall to the DPU fast path the host flows that will keep paying
//! for their hardware entry.
//!
//! Each placement tick the [`StabilityPlacement`] policy feeds every candidate's
//! [`FeatureTick`] to a [`Classifier`] (crate `spillway-sketch`: cheap counters for every flow,
//! a Frequent Directions sketch for the flows worth an entry) and ranks the scored flows by
//! `gain × (1 - instability)^3`. It then fills the free entries best first, within the fast-path
//! headroom and the tick's recall budget. When the table is full it swaps: the weakest offloaded
//! flow (its DPU-measured rate × its score discount when it was recalled) makes way for a host flow
//! only when the newcomer's score is [`StabilityPlacementParams::swap_margin`] times larger and
//! the incumbent has been on the fast path for [`StabilityPlacementParams::dwell_min`]. A flow
//! taken off the fast path is not recalled again for [`StabilityPlacementParams::cooldown`].
//! Those three rules are the hysteresis: a flow flaps only if its value changes by more than the
//! margin and stays changed for longer than the dwell.
//!
//! Flows with too little history (fewer than `min_ticks` sketched ticks) are not scored and stay
//! on the host: that is what keeps short-lived mice from spending insertions.
//!
//! Every decision can be explained: [`StabilityPlacement::explain`].

use core::fmt;
use core::time::Duration;
use std::collections::BTreeMap;

use spillway_sketch::classifier::{Classifier, Score, StabilityParams, Status};
use spillway_vswitch::Instant;

use crate::placement::{Budget, Candidate, Move, Offloaded, PlacementPolicy};
use crate::types::ConnId;

/// The policy's own settings (the classifier's are [`StabilityParams`]).
#[derive(Clone, Debug, PartialEq)]
pub struct StabilityPlacementParams {
    /// An offloaded flow is not swapped out before it has been on the fast path this long.
    /// Default 2 s: longer than the DPU's flow-stats period needs to report its rate once.
    pub dwell_min: Duration,
    /// A flow taken off the fast path is not recalled again for this long. Default 5 s.
    pub cooldown: Duration,
    /// A swap needs the newcomer's score to exceed the incumbent's value by this factor.
    /// Default 1.5: swapping costs a delete and an insert, and the estimates are noisy.
    pub swap_margin: f64,
    /// Most swaps per tick. Default 256.
    pub swaps_per_tick_max: u32,
}

impl Default for StabilityPlacementParams {
    fn default() -> Self {
        StabilityPlacementParams {
            dwell_min: Duration::from_secs(2),
            cooldown: Duration::from_secs(5),
            swap_margin: 1.5,
            swaps_per_tick_max: 256,
        }
    }
}

/// What the policy remembers of a flow it recalled.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Recalled {
    at: Instant,
    /// Bits per packet when it was recalled (turns the DPU's packet rate into bandwidth).
    bits_per_packet: f64,
    /// The classifier's discount when it was recalled (score / gain: what a bit/s of it was
    /// worth), so that an incumbent and a newcomer are valued on one scale.
    discount: f64,
    /// Score when it was recalled.
    score: f64,
}

/// Why a flow is where it is.
#[derive(Clone, Debug, PartialEq)]
pub enum Explanation {
    /// On the fast path since `since`, valued at `value_bps`.
    Offloaded {
        /// The flow.
        conn: ConnId,
        /// Recalled at.
        since: Instant,
        /// Its score when it was recalled.
        score_at_recall: f64,
    },
    /// Recently taken off the fast path; not recalled before `until`.
    Cooldown {
        /// The flow.
        conn: ConnId,
        /// End of its cooldown.
        until: Instant,
    },
    /// Scored, but ranked below the cut of the last tick.
    Host {
        /// The classifier's assessment.
        score: Score,
        /// Its rank (1-based) among the scored flows.
        rank: usize,
        /// How many of the best-ranked flows were on or recalled to the fast path.
        k: usize,
    },
    /// Recalled (or kept) at the last tick.
    Chosen {
        /// The classifier's assessment.
        score: Score,
        /// Its rank (1-based).
        rank: usize,
    },
    /// Not scored (too young, or not a candidate for a sketch).
    Unscored(Score),
    /// Unknown to the policy.
    Unknown(ConnId),
}

impl fmt::Display for Explanation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Explanation::Offloaded {
                conn,
                since,
                score_at_recall,
            } => write!(
                f,
                "flow {} on the fast path since {since} (score {score_at_recall:.0} when recalled)",
                conn.0
            ),
            Explanation::Cooldown { conn, until } => write!(
                f,
                "flow {} stays on host: demoted recently, no recall before {until}",
                conn.0
            ),
            Explanation::Host { score, rank, k } => write!(
                f,
                "flow {} stays on host: instability {:.2}, score {:.0}, rank {rank} > K = {k}",
                score.flow, score.instability, score.score
            ),
            Explanation::Chosen { score, rank } => write!(
                f,
                "flow {} recalled: rank {rank}, score {:.0} (gain {:.0} bit/s, instability {:.2})",
                score.flow, score.score, score.gain_bps, score.instability
            ),
            Explanation::Unscored(s) => write!(f, "{s}; stays on host"),
            Explanation::Unknown(c) => write!(f, "flow {} unknown to placement", c.0),
        }
    }
}

/// The stability-based Top-K placement policy. See the module doc.
#[derive(Debug)]
pub struct StabilityPlacement {
    cls: Classifier,
    p: StabilityPlacementParams,
    recalled: BTreeMap<ConnId, Recalled>,
    demoted: BTreeMap<ConnId, Instant>,
    ranked: Vec<Score>,
    /// Rank of the last flow chosen at the last tick (the K of explanations).
    cut: usize,
    /// Scratch: offloaded flows eligible for a swap, weakest first: (value, conn, pps).
    victims: Vec<(f64, ConnId, f64)>,
    /// Scratch: conns to forget.
    stale: Vec<ConnId>,
}

impl StabilityPlacement {
    /// A policy with the classifier `c` and the policy settings `p`.
    pub fn new(c: StabilityParams, p: StabilityPlacementParams) -> StabilityPlacement {
        StabilityPlacement {
            cls: Classifier::new(c).expect("stability parameters are validated with the fabric's"),
            p,
            recalled: BTreeMap::new(),
            demoted: BTreeMap::new(),
            ranked: Vec::new(),
            cut: 0,
            victims: Vec::new(),
            stale: Vec::new(),
        }
    }

    /// The classifier (for reports and tests).
    pub fn classifier(&self) -> &Classifier {
        &self.cls
    }

    /// Why `conn` is where it is, as of the last tick.
    pub fn explain(&self, conn: ConnId, now: Instant) -> Explanation {
        if let Some(r) = self.recalled.get(&conn) {
            return Explanation::Offloaded {
                conn,
                since: r.at,
                score_at_recall: r.score,
            };
        }
        if let Some(&until) = self.demoted.get(&conn)
            && now < until
        {
            return Explanation::Cooldown { conn, until };
        }
        // The last tick's ranking may still list a flow that closed since; the classifier
        // knows only the living.
        let Some(now_score) = self.cls.score(conn.0) else {
            return Explanation::Unknown(conn);
        };
        if let Some(rank) = self.ranked.iter().position(|s| s.flow == conn.0) {
            let score = self.ranked[rank];
            return if rank < self.cut {
                Explanation::Chosen {
                    score,
                    rank: rank + 1,
                }
            } else {
                Explanation::Host {
                    score,
                    rank: rank + 1,
                    k: self.cut,
                }
            };
        }
        if now_score.status != Status::Scored {
            return Explanation::Unscored(now_score);
        }
        Explanation::Host {
            score: now_score,
            rank: self.ranked.len() + 1,
            k: self.cut,
        }
    }

    /// Value of an offloaded flow now: its DPU-measured rate in bits/s, discounted as the
    /// classifier discounted it when it was recalled.
    fn value(r: &Recalled, pps: f64) -> f64 {
        pps * r.bits_per_packet * r.discount
    }
}

impl PlacementPolicy for StabilityPlacement {
    fn name(&self) -> &'static str {
        "stability"
    }

    fn closed(&mut self, conn: ConnId) {
        self.recalled.remove(&conn);
        self.demoted.remove(&conn);
        self.cls.remove(conn.0);
    }

    fn tick(
        &mut self,
        now: Instant,
        candidates: &[Candidate],
        offloaded: &[Offloaded],
        budget: Budget,
        out: &mut Vec<Move>,
    ) {
        for c in candidates {
            self.cls.observe(c.conn.0, &c.features);
        }
        self.cls.end_tick();
        self.cls.rank(&mut self.ranked);

        // A recalled flow that is a candidate again is back on the host (its recall was
        // refused, or the DPU shed it): it is judged like any other from now on. Closed flows
        // leave through `closed`; expired cooldowns here. `candidates` is sorted by id.
        self.stale.clear();
        for conn in self.recalled.keys() {
            if candidates.binary_search_by_key(conn, |c| c.conn).is_ok() {
                self.stale.push(*conn);
            }
        }
        for conn in &self.stale {
            self.recalled.remove(conn);
        }
        self.demoted.retain(|_, until| now < *until);

        // Swap victims: offloaded flows past their dwell, weakest first.
        self.victims.clear();
        for o in offloaded {
            if let Some(r) = self.recalled.get(&o.conn)
                && now.saturating_since(r.at) >= self.p.dwell_min
            {
                self.victims.push((Self::value(r, o.pps), o.conn, o.pps));
            }
            // An offloaded flow this policy did not recall (a plane restarted since) is not
            // a victim: without its packet size and stability its value would be a guess.
        }
        self.victims
            .sort_unstable_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));

        let mut entries = budget.free_entries;
        let mut headroom = budget.headroom_pps;
        let mut recalls = 0u32;
        let mut swaps = 0u32;
        let mut weakest = 0usize;
        self.cut = 0;
        for (rank, s) in self.ranked.iter().enumerate() {
            if recalls >= budget.recalls_max {
                break;
            }
            let conn = ConnId(s.flow);
            // Only this tick's candidates can move (not one in transit or already recalled).
            if candidates.binary_search_by_key(&conn, |c| c.conn).is_err()
                || self.demoted.contains_key(&conn)
                || self.recalled.contains_key(&conn)
            {
                continue;
            }
            let bits_per_packet = if s.pps > 0.0 { s.gain_bps / s.pps } else { 0.0 };
            let remember = Recalled {
                at: now,
                bits_per_packet,
                discount: if s.gain_bps > 0.0 {
                    s.score / s.gain_bps
                } else {
                    0.0
                },
                score: s.score,
            };
            if entries >= 2 && s.pps <= headroom {
                entries -= 2;
                headroom -= s.pps;
                recalls += 1;
                self.cut = rank + 1;
                self.recalled.insert(conn, remember);
                out.push(Move::Recall {
                    conn,
                    pps: s.pps,
                    replaces_pps: 0.0,
                });
                continue;
            }
            if entries >= 2 {
                // Entries left but no headroom for this one: a smaller flow may still fit.
                continue;
            }
            // The table is full: swap with the weakest eligible offloaded flow, if this one
            // is clearly worth more. Ranked best first, so once one fails, the rest would too.
            if swaps >= self.p.swaps_per_tick_max {
                break;
            }
            let Some(&(value, victim, victim_pps)) = self.victims.get(weakest) else {
                break;
            };
            if s.score <= value * self.p.swap_margin || s.pps > headroom + victim_pps {
                break;
            }
            weakest += 1;
            swaps += 1;
            recalls += 1;
            headroom += victim_pps - s.pps;
            self.cut = rank + 1;
            self.recalled.remove(&victim);
            self.demoted.insert(victim, now + self.p.cooldown);
            self.recalled.insert(conn, remember);
            out.push(Move::Demote { conn: victim });
            out.push(Move::Recall {
                conn,
                pps: s.pps,
                replaces_pps: victim_pps,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use spillway_sketch::features::FeatureTick;

    const TICK_NS: u64 = 100_000_000;

    fn cand(id: u64, pps: f64) -> Candidate {
        Candidate {
            conn: ConnId(id),
            tenant: spillway_vswitch::TenantId(1),
            since: Instant(0),
            features: FeatureTick {
                bw_bps: pps * 512.0 * 8.0,
                pps,
                ctrl_ratio: 0.0,
                jitter_us: 0.0,
            },
        }
    }

    fn budget(entries: u64) -> Budget {
        Budget {
            free_entries: entries,
            headroom_pps: 1e9,
            recalls_max: 1000,
        }
    }

    fn recalls(out: &[Move]) -> Vec<u64> {
        out.iter()
            .filter_map(|m| match m {
                Move::Recall { conn, .. } => Some(conn.0),
                Move::Demote { .. } => None,
            })
            .collect()
    }

    /// Flow 1 steady at 1,000 pps, 2 steady at 3,000 pps, 3 bursting at 6,000 pps at
    /// irregular times (mean ~2,700), 4 steady at 500 pps.
    fn candidates(t: u64) -> Vec<Candidate> {
        let on = (t * t * 7 + 3) % 11 < 5;
        vec![
            cand(1, 1000.0),
            cand(2, 3000.0),
            cand(3, if on { 6000.0 } else { 0.0 }),
            cand(4, 500.0),
        ]
    }

    #[test]
    fn young_flows_stay_on_host_then_stable_ones_are_recalled_best_first() {
        let mut p = StabilityPlacement::new(
            StabilityParams::default(),
            StabilityPlacementParams::default(),
        );
        let mut out = Vec::new();
        // Nine ticks: nobody has the history to be scored.
        for t in 0..9 {
            p.tick(
                Instant(t * TICK_NS),
                &candidates(t),
                &[],
                budget(4),
                &mut out,
            );
            assert!(out.is_empty(), "tick {t}: {out:?}");
        }
        let e = p.explain(ConnId(2), Instant(9 * TICK_NS));
        assert!(
            e.to_string()
                .contains("not scored, 9 ticks of history < 10"),
            "{e}"
        );
        for t in 9..40 {
            p.tick(
                Instant(t * TICK_NS),
                &candidates(t),
                &[],
                budget(0),
                &mut out,
            );
        }
        assert!(
            out.is_empty(),
            "a full table and nothing offloaded: no moves"
        );
        // Two connections' worth of entries: the two stable ones with the highest gain, not
        // the burster whose mean rate is close to flow 2's.
        p.tick(
            Instant(40 * TICK_NS),
            &candidates(40),
            &[],
            budget(4),
            &mut out,
        );
        assert_eq!(recalls(&out), vec![2, 1]);
        let e = p.explain(ConnId(3), Instant(40 * TICK_NS));
        assert!(matches!(e, Explanation::Host { rank: 4, k: 2, .. }), "{e}");
        assert!(e.to_string().contains("stays on host: instability"), "{e}");
    }

    #[test]
    fn swaps_respect_the_margin_the_dwell_and_the_cooldown() {
        let mut p = StabilityPlacement::new(
            StabilityParams::default(),
            StabilityPlacementParams::default(),
        );
        let mut out = Vec::new();
        // Flow 4 (500 pps) gets the only free slot while it is the only scored flow. From
        // then on it is on the DPU, as the plane shows it: no longer a candidate, offloaded,
        // and the table full.
        let on_dpu = [Offloaded {
            tenant: spillway_vswitch::TenantId(1),
            conn: ConnId(4),
            pps: 500.0,
        }];
        for t in 0..12 {
            let (c, o, b) = match t {
                0..2 => (vec![cand(4, 500.0)], &[][..], budget(2)),
                2..10 => (vec![cand(2, 3000.0), cand(4, 500.0)], &[][..], budget(2)),
                _ => (vec![cand(2, 3000.0)], &on_dpu[..], budget(0)),
            };
            out.clear();
            p.tick(Instant(t * TICK_NS), &c, o, b, &mut out);
            if t == 9 {
                assert_eq!(recalls(&out), vec![4]);
            }
        }
        // Flow 4 is offloaded; flow 2 (6x its value) becomes scored at tick 11 but flow 4
        // has not dwelt 2 s yet, so no swap until tick 29 (recalled at 0.9 s).
        let offl = [Offloaded {
            tenant: spillway_vswitch::TenantId(1),
            conn: ConnId(4),
            pps: 500.0,
        }];
        let mut swapped_at = None;
        for t in 12..40 {
            out.clear();
            p.tick(
                Instant(t * TICK_NS),
                &[cand(2, 3000.0)],
                &offl,
                budget(0),
                &mut out,
            );
            if !out.is_empty() {
                assert_eq!(
                    out,
                    vec![
                        Move::Demote { conn: ConnId(4) },
                        Move::Recall {
                            conn: ConnId(2),
                            pps: out_pps(&out),
                            replaces_pps: 500.0
                        }
                    ]
                );
                swapped_at = Some(t);
                break;
            }
        }
        assert_eq!(swapped_at, Some(29));
        // Flow 4 is cooling down: even with room, it is not recalled for 5 s.
        let e = p.explain(ConnId(4), Instant(30 * TICK_NS));
        assert!(matches!(e, Explanation::Cooldown { .. }), "{e}");
    }

    #[test]
    fn a_closed_flow_is_forgotten_and_a_returning_one_is_judged_again() {
        let mut p = StabilityPlacement::new(
            StabilityParams::default(),
            StabilityPlacementParams::default(),
        );
        let mut out = Vec::new();
        for t in 0..10 {
            out.clear();
            p.tick(
                Instant(t * TICK_NS),
                &[cand(4, 1000.0), cand(5, 800.0)],
                &[],
                budget(4),
                &mut out,
            );
        }
        assert_eq!(recalls(&out), vec![4, 5]);
        let now = Instant(10 * TICK_NS);
        assert!(matches!(
            p.explain(ConnId(4), now),
            Explanation::Offloaded { .. }
        ));
        // Flow 4 closes: the policy holds nothing of it any more.
        p.closed(ConnId(4));
        assert_eq!(p.explain(ConnId(4), now), Explanation::Unknown(ConnId(4)));
        assert!(p.classifier().score(4).is_none());
        // Flow 5 comes back to the host (its recall refused or shed): a candidate again, it is
        // ranked, not taken for offloaded.
        out.clear();
        p.tick(now, &[cand(5, 800.0)], &[], budget(0), &mut out);
        assert!(matches!(
            p.explain(ConnId(5), now),
            Explanation::Host { .. } | Explanation::Chosen { .. }
        ));
    }

    fn out_pps(out: &[Move]) -> f64 {
        match out[1] {
            Move::Recall { pps, .. } => pps,
            Move::Demote { .. } => f64::NAN,
        }
    }

    #[test]
    fn no_swap_below_the_margin() {
        let mut p = StabilityPlacement::new(
            StabilityParams::default(),
            StabilityPlacementParams::default(),
        );
        let mut out = Vec::new();
        // Flow 4 is recalled at tick 9 into the only free slot, and is on the DPU from then.
        for t in 0..10 {
            out.clear();
            p.tick(
                Instant(t * TICK_NS),
                &[cand(4, 1000.0)],
                &[],
                budget(2),
                &mut out,
            );
        }
        let offl = [Offloaded {
            tenant: spillway_vswitch::TenantId(1),
            conn: ConnId(4),
            pps: 1000.0,
        }];
        // Flow 5 is 1.3x flow 4: below the 1.5x margin, never swapped in.
        for t in 12..80 {
            out.clear();
            p.tick(
                Instant(t * TICK_NS),
                &[cand(5, 1300.0)],
                &offl,
                budget(0),
                &mut out,
            );
            assert!(out.is_empty(), "tick {t}: {out:?}");
        }
    }
}
