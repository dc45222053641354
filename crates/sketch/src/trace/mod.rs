//! Feature traces: read, rank, generate and evaluate, with no I/O of their own.
//!
//! A trace is a CSV with one row per flow per 100 ms tick, in tick order:
//!
//! ```text
//! flow_id,tick,bw_bps,pps,ctrl_ratio,jitter_us[,class][,anything else]
//! ```
//!
//! Columns are found by name in the header (any order; unknown columns are ignored). `bw_bps`
//! is bits/s, `pps` packets/s, `ctrl_ratio` the control-packet share in [0, 1], `jitter_us` the
//! standard deviation of the inter-packet gaps in the tick (the four fields of
//! [`FeatureTick`]). An optional `class` column labels each flow with its [`FlowClass`]; the
//! generator writes it and [`evaluate`] reads it. Fields are split on `,` (no quoting), trimmed,
//! and CRLF line ends and a UTF-8 byte-order mark are accepted; blank lines are skipped.
//!
//! - [`parse_csv`] / [`read_csv`] check every field and return a [`TraceError`] naming the
//!   line, the column and what was expected.
//! - [`rank_trace`] feeds a [`Classifier`] tick by tick and returns three rankings at a tick:
//!   the stability ranking, the bandwidth-only ranking (the recent mean bandwidth, the same EWMA
//!   the classifier uses as its gain) and the last-tick bandwidth ranking (what a rebalance
//!   that looks only at the latest interval, like OVS's pps-based PMD rebalance, sees).
//! - [`generate`] makes a labelled trace from a [`GenSpec`] and a seed (its own SplitMix64
//!   generator, so the trace is the same on every platform and release), and [`write_csv`]
//!   writes it.
//! - [`evaluate`] measures the precision and recall of each ranking's top K against the
//!   labels.
//!
//! # The generator's classes
//!
//! Every flow draws its mean rate from the same log-normal distribution
//! ([`GenSpec::rate_median_bps`], [`GenSpec::rate_sigma`]): bandwidth alone does not tell the
//! classes apart, only the shape of the rate over time does. Each flow also draws a packet size
//! (log-uniform in 64..1,500 B), a gap regularity (coefficient of variation of its gaps) and a
//! base control ratio (pure ACKs, 0-5 %). Packets are whole: a tick carries
//! `floor(expected + u)` packets for a uniform `u` (unbiased rounding), so a flow of less than
//! a packet per tick is on-off at the tick scale, as it is on a real link.
//!
//! | class         | rate over time                                                                  | gaps (cv)                |
//! |---------------|---------------------------------------------------------------------------------|--------------------------|
//! | `steady`      | the mean times log-normal noise of 5 % (mean preserved)                         | 0.05-0.3                 |
//! | `periodic`    | `mean × (1 + A sin(2πt/P + φ))`, `P` 1-5 s, `A` 0.3-0.8, random phase, 5 % noise | 0.05-0.3                 |
//! | `bursty`      | on/off, exponential on and off times with means log-uniform in 0.2-3 s; `mean / duty` while on | 0.05-0.3, plus each off period as one gap |
//! | `random-walk` | `mean × exp(x - s²/2)`, `x` a log-rate walk of volatility 0.1-0.3 per tick, weakly mean-reverting so that its spread stays `s` = 0.5-1.0 | 0.1-0.5 |
//! | `mice`        | live 2-15 ticks, born uniformly over the trace; half rate in the first and last tick; control ratio 0.3-0.8 in those two ticks | 1-3 (slow-start trains) |
//!
//! The random walk reverts to its mean (an Ornstein-Uhlenbeck process in log space) because a
//! free walk of volatility 0.2 spreads by a factor e^5 over a minute, which no real flow does;
//! with the reversion its rate still wanders by a factor e^±1 over seconds to tens of seconds.
//! The stable classes (the ones that deserve a hardware entry) are `steady` and `periodic`.
//!
//! # Families
//!
//! The table above is [`Family::Uniform`], the family the classifier's constants were chosen
//! on. Two more families hold the classifier to traces it was not tuned on; each differs in
//! generator, size distribution, class mix, tick jitter and missing ticks
//! ([`GenSpec::family`]):
//!
//! | | `uniform` (tuned) | `elephants` (held out) | `pareto` (held out) |
//! |---|---|---|---|
//! | flows, mix (steady/periodic/bursty/walk/mice) | 2,000; 30/15/20/15/20 % | 4,000; 15/10/15/10/50 % | 2,000; 25/20/25/20/10 % |
//! | mean rates | one log-normal for every class (median 10 Mbit/s, log-sd 1.5) | by class: stable 200 Mbit/s-2 Gbit/s, on/off 0.1-3 Gbit/s while on, walks 0.3-2 Gbit/s that pass 5 Gbit/s, mice 0.1-50 Mbit/s (all log-uniform) | one Pareto for every class (tail index 1.3 from 2 Mbit/s, capped at 10 Gbit/s) |
//! | steady noise | 5 % | 8 % | 10 % |
//! | periodic | sine, 1-5 s | sine, 2-8 s, amplitude 0.2-0.6 | square wave, 0.6-10 s |
//! | bursty | exponential on/off, means 0.2-3 s | exponential, means 0.5-5 s | Pareto periods (tail index 1.5), means 0.3-4 s |
//! | random walk | mean-reverting log walk, spread 0.5-1 | the same, volatility 0.15-0.35, spread 0.8-1.2 | level shifts: a new log-normal level (log-sd 0.5-1.2) after exponential holds of 1-10 s |
//! | mice | 2-15 ticks | 2-30 ticks | 2-40 ticks (long enough to be scored) |
//! | tick jitter | none | each tick lasts 100 ms ± 10 % (every flow) | each flow's sample covers ± 15 % of the tick |
//! | missing ticks | none | none | 1 % of ticks have no rows |
//!
//! [`rank_trace`] skips a tick number with no rows (an interval the exporter lost) rather than
//! reading it as every flow idle.
//!
//! # Layout
//!
//! One file per job, each depending only on the row types and, for the evaluation, on the
//! ranking, so none of them imports another in a circle:
//!
//! - `row.rs`: the types every job shares ([`TraceRow`], [`FlowClass`], [`LabelledRow`],
//!   [`TICK_S`]).
//! - `csv.rs`: reading ([`parse_csv`], [`read_csv`]) and writing ([`write_csv`]) the CSV.
//! - `rank.rs`: [`rank_trace`], the three rankings at one tick.
//! - `generate.rs`: [`generate`], the labelled synthetic traces.
//! - `eval.rs`: [`evaluate`], precision and recall of the rankings against the labels.
//!
//! # Determinism
//!
//! Every function here is a pure function of its inputs. The generator derives each flow's
//! random stream from the seed and the flow's index, so a flow's series does not depend on how
//! many other flows there are. Rankings break ties by flow id.
//!
//! [`FeatureTick`]: crate::features::FeatureTick
//! [`Classifier`]: crate::classifier::Classifier

mod csv;
mod eval;
mod generate;
mod rank;
mod row;

pub use csv::{
    CLASS_COLUMN, COLUMNS, Trace, TraceError, parse_csv, read_csv, to_csv_string, write_csv,
};
pub use eval::{EvalRow, Evaluation, TopK, class_counts, evaluate};
pub use generate::{Family, GenSpec, generate};
pub use rank::{LastTick, RankError, Ranking, rank_trace};
pub use row::{FlowClass, LabelledRow, TICK_S, TraceRow};
