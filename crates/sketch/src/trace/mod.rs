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
pub use generate::{GenSpec, generate};
pub use rank::{LastTick, RankError, Ranking, rank_trace};
pub use row::{FlowClass, LabelledRow, TICK_S, TraceRow};
