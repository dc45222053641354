//! Ranking a trace: feeding its rows to a [`Classifier`] tick by tick and reading, at one
//! tick, the stability ranking next to the two bandwidth rankings it is compared with.

use super::row::TraceRow;
use crate::classifier::{Classifier, FlowId, ParamError, Score, StabilityParams};

/// One flow's bandwidth in the ranked tick (the last-tick ranking's entry).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LastTick {
    /// The flow.
    pub flow: FlowId,
    /// Its bandwidth in that tick, bits/s.
    pub bw_bps: f64,
    /// Its packet rate in that tick, packets/s.
    pub pps: f64,
}

/// The three rankings of a trace at one tick, each best first with ties broken by flow id.
#[derive(Clone, Debug, PartialEq)]
pub struct Ranking {
    /// The tick ranked at (its rows included).
    pub tick: u64,
    /// The trace's first tick.
    pub first_tick: u64,
    /// Flows the classifier knows at that tick (observed within its forget window).
    pub flows_known: usize,
    /// Scored flows by stability score ([`Classifier::rank`]); flows with too little history
    /// are not in it.
    pub stability: Vec<Score>,
    /// Every known flow by its gain, the recent mean bandwidth ([`Classifier::rank_by_gain`]).
    pub by_gain: Vec<Score>,
    /// The flows with a row at the ranked tick, by that tick's bandwidth.
    pub by_last_tick: Vec<LastTick>,
}

/// Why a trace could not be ranked.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum RankError {
    /// No rows.
    #[error("expected a trace with at least one row, got none")]
    EmptyTrace,
    /// The tick asked for is after the trace.
    #[error("tick {at} is beyond the trace: expected a tick in {first}..={last}")]
    TickBeyond {
        /// The tick asked for.
        at: u64,
        /// The trace's first tick.
        first: u64,
        /// The trace's last tick.
        last: u64,
    },
    /// The tick asked for is before the trace.
    #[error("tick {at} is before the trace: expected a tick of at least {first}")]
    TickBefore {
        /// The tick asked for.
        at: u64,
        /// The trace's first tick.
        first: u64,
    },
    /// Rows not in tick order (a trace built in memory; [`read_csv`](super::read_csv) rejects these itself).
    #[error("row {index}: expected rows in tick order (at least {previous}), got tick {tick}")]
    OutOfOrder {
        /// Index of the row.
        index: usize,
        /// The previous row's tick.
        previous: u64,
        /// This row's tick.
        tick: u64,
    },
    /// The classifier's parameters are invalid.
    #[error(transparent)]
    Params(#[from] ParamError),
}

/// Feeds `rows` (in tick order) to a classifier with `params`, tick by tick, up to and
/// including `at_tick` (default: the trace's last tick), and ranks the flows there.
///
/// A tick number missing between two rows' ticks is a tick the exporter did not measure (an
/// idle flow has a row of zeros): it is skipped, not read as every flow idle, so that a lost
/// interval does not look like a stall of every flow. A flow with no row in a tick that other
/// flows have rows in is idle in it. `at_tick` must lie within the trace's ticks; in a gap it
/// ranks the state after the last measured tick.
pub fn rank_trace<'a>(
    rows: impl IntoIterator<Item = &'a TraceRow>,
    at_tick: Option<u64>,
    params: &StabilityParams,
) -> Result<Ranking, RankError> {
    let mut c = Classifier::new(params.clone())?;
    let mut first: Option<u64> = None;
    // The tick whose rows are being observed (not yet closed).
    let mut cur: Option<u64> = None;
    // The tick of the first row after `at_tick`, if any (then `at_tick` is within the trace).
    let mut beyond: Option<u64> = None;
    let mut last_tick: Vec<LastTick> = Vec::new();
    for (index, r) in rows.into_iter().enumerate() {
        if let Some(at) = at_tick
            && r.tick > at
        {
            if let Some(t) = cur
                && r.tick < t
            {
                return Err(RankError::OutOfOrder {
                    index,
                    previous: t,
                    tick: r.tick,
                });
            }
            beyond = Some(r.tick);
            break;
        }
        match cur {
            None => {
                first = Some(r.tick);
                cur = Some(r.tick);
            }
            Some(t) if r.tick < t => {
                return Err(RankError::OutOfOrder {
                    index,
                    previous: t,
                    tick: r.tick,
                });
            }
            Some(t) if r.tick > t => {
                c.end_tick();
                cur = Some(r.tick);
                last_tick.clear();
            }
            Some(_) => {}
        }
        c.observe(r.flow_id, &r.features);
        last_tick.push(LastTick {
            flow: r.flow_id,
            bw_bps: r.features.bw_bps,
            pps: r.features.pps,
        });
    }
    let (Some(first), Some(cur)) = (first, cur) else {
        // No row at or before `at_tick`: the tick is before the trace, or the trace is empty.
        return match (at_tick, beyond) {
            (Some(at), Some(first)) => Err(RankError::TickBefore { at, first }),
            _ => Err(RankError::EmptyTrace),
        };
    };
    c.end_tick();
    let tick = match (at_tick, beyond) {
        (None, _) => cur,
        (Some(at), None) if at > cur => {
            return Err(RankError::TickBeyond {
                at,
                first,
                last: cur,
            });
        }
        (Some(at), _) => {
            // `at` is at least `cur` (rows after it end the loop); it may fall in a gap of
            // empty ticks after `cur`.
            if at > cur {
                last_tick.clear();
            }
            at
        }
    };
    let mut stability = Vec::new();
    c.rank(&mut stability);
    let mut by_gain = Vec::new();
    c.rank_by_gain(&mut by_gain);
    last_tick.sort_unstable_by(|a, b| b.bw_bps.total_cmp(&a.bw_bps).then(a.flow.cmp(&b.flow)));
    Ok(Ranking {
        tick,
        first_tick: first,
        flows_known: c.flows(),
        stability,
        by_gain,
        by_last_tick: last_tick,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::features::FeatureTick;

    fn row(flow: FlowId, tick: u64, bw: f64) -> TraceRow {
        TraceRow {
            flow_id: flow,
            tick,
            features: FeatureTick {
                bw_bps: bw,
                pps: bw / 8_000.0,
                ctrl_ratio: 0.0,
                jitter_us: 0.0,
            },
        }
    }

    #[test]
    fn rank_trace_checks_the_tick_range_and_order() {
        let p = StabilityParams::default();
        let rows: Vec<TraceRow> = (3..30).map(|t| row(1, t, 1e6)).collect();
        assert_eq!(rank_trace(&[], None, &p), Err(RankError::EmptyTrace));
        assert_eq!(
            rank_trace(&rows, Some(30), &p),
            Err(RankError::TickBeyond {
                at: 30,
                first: 3,
                last: 29
            })
        );
        assert_eq!(
            rank_trace(&rows, Some(2), &p),
            Err(RankError::TickBefore { at: 2, first: 3 })
        );
        let r = rank_trace(&rows, None, &p).expect("ranks");
        assert_eq!((r.first_tick, r.tick), (3, 29));
        let r = rank_trace(&rows, Some(10), &p).expect("ranks");
        assert_eq!(r.tick, 10);
        assert_eq!(r.by_last_tick.len(), 1);
        let mut bad = rows.clone();
        bad.swap(4, 5);
        assert!(matches!(
            rank_trace(&bad, None, &p),
            Err(RankError::OutOfOrder { index: 5, .. })
        ));
    }

    #[test]
    fn rank_trace_ranks_last_tick_by_that_ticks_bandwidth_and_ties_by_flow() {
        let p = StabilityParams::default();
        let mut rows = Vec::new();
        for t in 0..20 {
            rows.push(row(1, t, 1e6));
            rows.push(row(2, t, if t == 19 { 5e6 } else { 1e6 }));
            rows.push(row(3, t, 1e6));
        }
        let r = rank_trace(&rows, None, &p).expect("ranks");
        let order: Vec<FlowId> = r.by_last_tick.iter().map(|l| l.flow).collect();
        assert_eq!(order, vec![2, 1, 3]);
        let r = rank_trace(&rows, Some(18), &p).expect("ranks");
        let order: Vec<FlowId> = r.by_last_tick.iter().map(|l| l.flow).collect();
        assert_eq!(order, vec![1, 2, 3]);
    }

    #[test]
    fn rank_trace_skips_missing_ticks() {
        let p = StabilityParams::default();
        // Flow 1 every tick to 20, then a gap, then one row of flow 2 at tick 25.
        let mut rows: Vec<TraceRow> = (0..=20).map(|t| row(1, t, 1e6)).collect();
        rows.push(row(2, 25, 1e6));
        let g1 = |r: &Ranking| {
            r.by_gain
                .iter()
                .find(|s| s.flow == 1)
                .map(|s| s.gain_bps)
                .expect("flow 1 known")
        };
        let before = rank_trace(&rows, Some(20), &p).expect("ranks");
        let gap = rank_trace(&rows, Some(23), &p).expect("tick in the gap");
        assert_eq!(gap.tick, 23);
        assert!(gap.by_last_tick.is_empty());
        // The unmeasured ticks 21-24 change nothing.
        assert_eq!(g1(&gap), g1(&before));
        assert_eq!(gap.stability, before.stability);
        // Tick 25 was measured and flow 1 had no row in it: one idle tick.
        let after = rank_trace(&rows, None, &p).expect("ranks");
        assert!(g1(&after) < g1(&before), "an idle tick lowers the mean");
    }
}
