//! Evaluating the rankings of a labelled trace: the precision and recall of each ranking's
//! top K against the stable classes, and the per-class counts the CLI prints with them.

use std::collections::HashMap;

use super::rank::{RankError, rank_trace};
use super::row::{FlowClass, LabelledRow};
use crate::classifier::{FlowId, StabilityParams};

/// Per-class counts in [`FlowClass::ALL`] order as text: `steady 16, periodic 4, ...`.
pub fn class_counts(counts: &[usize; 5]) -> String {
    let parts: Vec<String> = FlowClass::ALL
        .iter()
        .map(|c| format!("{c} {}", counts[c.index()]))
        .collect();
    parts.join(", ")
}

/// How one ranking's top K fares against the labels.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TopK {
    /// Entries in the top K (fewer than K when the ranking is shorter).
    pub taken: usize,
    /// Stable flows among them.
    pub stable: usize,
    /// `stable / K`: the share of K entries that went to stable flows (an entry the ranking
    /// could not fill counts as not stable).
    pub precision: f64,
    /// `stable / min(K, S)` with `S` the stable flows alive at the ranked tick: the share of
    /// what a perfect ranking would find. Plain recall (`stable / S`) cannot reach 1 while
    /// K < S and would measure K rather than the ranking; this equals it when K >= S.
    pub recall: f64,
    /// Entries per class, in [`FlowClass::ALL`] order (entries of unlabelled flows are not
    /// counted).
    pub by_class: [usize; 5],
    /// Mean gain (recent mean bandwidth) of the entries, bits/s: what their entries carry.
    pub mean_gain_bps: f64,
}

/// The three rankings at one K.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EvalRow {
    /// K.
    pub k: usize,
    /// The stability ranking.
    pub stability: TopK,
    /// The bandwidth-only ranking (by gain, the recent mean bandwidth).
    pub by_gain: TopK,
    /// The last-tick bandwidth ranking.
    pub by_last_tick: TopK,
}

/// Precision and recall of the rankings of a labelled trace at its last tick.
#[derive(Clone, Debug, PartialEq)]
pub struct Evaluation {
    /// The tick ranked at (the trace's last).
    pub tick: u64,
    /// Flows with a row at that tick.
    pub alive: usize,
    /// Stable flows among them (`S`).
    pub stable_alive: usize,
    /// Alive flows per class, in [`FlowClass::ALL`] order.
    pub alive_by_class: [usize; 5],
    /// Flows the stability ranking scored.
    pub scored: usize,
    /// One row per K, in the order given.
    pub rows: Vec<EvalRow>,
}

/// Ranks `rows` at their last tick (see [`rank_trace`]) and measures, for each K in `ks`, the
/// precision and recall (see [`TopK`]) of each ranking's top K against the stable classes.
pub fn evaluate(
    rows: &[LabelledRow],
    ks: &[usize],
    params: &StabilityParams,
) -> Result<Evaluation, RankError> {
    let ranking = rank_trace(rows.iter().map(|r| &r.row), None, params)?;
    let mut labels: HashMap<FlowId, FlowClass> = HashMap::new();
    let mut alive_by_class = [0usize; 5];
    let mut alive = 0;
    for r in rows {
        labels.insert(r.row.flow_id, r.class);
        if r.row.tick == ranking.tick {
            alive += 1;
            alive_by_class[r.class.index()] += 1;
        }
    }
    let stable_alive = FlowClass::ALL
        .iter()
        .filter(|c| c.is_stable())
        .map(|c| alive_by_class[c.index()])
        .sum();
    // Long-run gain of every known flow, for the mean gain of the last-tick ranking's entries.
    let gain: HashMap<FlowId, f64> = ranking
        .by_gain
        .iter()
        .map(|s| (s.flow, s.gain_bps))
        .collect();
    let top = |k: usize, flows: &mut dyn Iterator<Item = FlowId>| -> TopK {
        let mut t = TopK {
            taken: 0,
            stable: 0,
            precision: 0.0,
            recall: 0.0,
            by_class: [0; 5],
            mean_gain_bps: 0.0,
        };
        let mut gain_sum = 0.0;
        for f in flows.take(k) {
            t.taken += 1;
            gain_sum += gain.get(&f).copied().unwrap_or(0.0);
            if let Some(c) = labels.get(&f) {
                t.by_class[c.index()] += 1;
                if c.is_stable() {
                    t.stable += 1;
                }
            }
        }
        if k > 0 {
            t.precision = t.stable as f64 / k as f64;
        }
        let reachable = k.min(stable_alive);
        if reachable > 0 {
            t.recall = t.stable as f64 / reachable as f64;
        }
        if t.taken > 0 {
            t.mean_gain_bps = gain_sum / t.taken as f64;
        }
        t
    };
    let rows = ks
        .iter()
        .map(|&k| EvalRow {
            k,
            stability: top(k, &mut ranking.stability.iter().map(|s| s.flow)),
            by_gain: top(k, &mut ranking.by_gain.iter().map(|s| s.flow)),
            by_last_tick: top(k, &mut ranking.by_last_tick.iter().map(|s| s.flow)),
        })
        .collect();
    Ok(Evaluation {
        tick: ranking.tick,
        alive,
        stable_alive,
        alive_by_class,
        scored: ranking.stability.len(),
        rows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::{GenSpec, generate};

    #[test]
    fn evaluate_counts_precision_and_recall_against_the_labels() {
        let spec = GenSpec {
            flows: 150,
            ticks: 80,
            ..GenSpec::default()
        };
        let rows = generate(&spec, 7);
        let p = StabilityParams::default();
        let e = evaluate(&rows, &[10, 1_000], &p).expect("evaluates");
        assert_eq!(e.tick, 79);
        let counts = spec.counts();
        assert_eq!(e.stable_alive, counts[0] + counts[1]);
        for r in &e.rows {
            for t in [r.stability, r.by_gain, r.by_last_tick] {
                assert!(t.taken <= r.k);
                assert_eq!(t.by_class[0] + t.by_class[1], t.stable);
                assert!((t.precision - t.stable as f64 / r.k as f64).abs() < 1e-12);
                assert!((0.0..=1.0).contains(&t.recall));
            }
        }
        // With K above every flow, the bandwidth-only ranking holds every stable flow.
        assert_eq!(e.rows[1].by_gain.recall, 1.0);
        assert_eq!(e, evaluate(&rows, &[10, 1_000], &p).expect("evaluates"));
    }
}
