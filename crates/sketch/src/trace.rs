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
//! # Determinism
//!
//! Every function here is a pure function of its inputs. The generator derives each flow's
//! random stream from the seed and the flow's index, so a flow's series does not depend on how
//! many other flows there are. Rankings break ties by flow id.

use core::fmt;
use core::str::FromStr;
use std::collections::{HashMap, HashSet};
use std::io::{BufRead, Write};

use crate::features::FeatureTick;
use crate::rng::{SplitMix64, mix64};
use crate::stability::{Classifier, FlowId, ParamError, Score, StabilityParams};

/// Length of a tick, seconds.
pub const TICK_S: f64 = 0.1;
/// Ticks per second (the inverse of [`TICK_S`], exact).
const TICKS_PER_S: f64 = 10.0;
/// The columns a trace must have, in the order [`write_csv`] writes them.
pub const COLUMNS: [&str; 6] = [
    "flow_id",
    "tick",
    "bw_bps",
    "pps",
    "ctrl_ratio",
    "jitter_us",
];
/// The optional label column.
pub const CLASS_COLUMN: &str = "class";

/// One flow's features in one tick.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TraceRow {
    /// The flow.
    pub flow_id: FlowId,
    /// The tick (100 ms each).
    pub tick: u64,
    /// Its features in that tick.
    pub features: FeatureTick,
}

/// The behaviour a generated flow follows (its label).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FlowClass {
    /// Constant rate with small noise.
    Steady,
    /// Sinusoidal modulation of the rate.
    Periodic,
    /// On/off.
    Bursty,
    /// Log-rate random walk.
    RandomWalk,
    /// Short-lived.
    Mice,
}

impl FlowClass {
    /// Every class, in label order.
    pub const ALL: [FlowClass; 5] = [
        FlowClass::Steady,
        FlowClass::Periodic,
        FlowClass::Bursty,
        FlowClass::RandomWalk,
        FlowClass::Mice,
    ];

    /// The label as written in a trace.
    pub fn name(self) -> &'static str {
        match self {
            FlowClass::Steady => "steady",
            FlowClass::Periodic => "periodic",
            FlowClass::Bursty => "bursty",
            FlowClass::RandomWalk => "random-walk",
            FlowClass::Mice => "mice",
        }
    }

    /// True for the classes that deserve a hardware entry (steady, periodic).
    pub fn is_stable(self) -> bool {
        match self {
            FlowClass::Steady | FlowClass::Periodic => true,
            FlowClass::Bursty | FlowClass::RandomWalk | FlowClass::Mice => false,
        }
    }

    /// Index in [`FlowClass::ALL`].
    pub fn index(self) -> usize {
        match self {
            FlowClass::Steady => 0,
            FlowClass::Periodic => 1,
            FlowClass::Bursty => 2,
            FlowClass::RandomWalk => 3,
            FlowClass::Mice => 4,
        }
    }
}

impl fmt::Display for FlowClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What a `class` field must be.
const CLASS_EXPECTED: &str = "one of steady, periodic, bursty, random-walk, mice";

impl FromStr for FlowClass {
    type Err = ();

    fn from_str(s: &str) -> Result<FlowClass, ()> {
        FlowClass::ALL.into_iter().find(|c| c.name() == s).ok_or(())
    }
}

/// A generated row with its flow's label.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LabelledRow {
    /// The row.
    pub row: TraceRow,
    /// The flow's class.
    pub class: FlowClass,
}

/// A parsed trace.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Trace {
    /// The rows, in tick order.
    pub rows: Vec<TraceRow>,
    /// One label per row (parallel to `rows`) when the header has a `class` column.
    pub classes: Option<Vec<FlowClass>>,
}

impl Trace {
    /// The rows with their labels, if the trace is labelled.
    pub fn labelled(&self) -> Option<Vec<LabelledRow>> {
        let classes = self.classes.as_ref()?;
        Some(
            self.rows
                .iter()
                .zip(classes)
                .map(|(row, class)| LabelledRow {
                    row: *row,
                    class: *class,
                })
                .collect(),
        )
    }
}

/// Why a trace could not be read. Line numbers count from 1 (the header).
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum TraceError {
    /// Reading failed.
    #[error("line {line}: read error: {message}")]
    Io {
        /// The line being read.
        line: u64,
        /// The I/O error.
        message: String,
    },
    /// No header line.
    #[error("line 1: expected a header naming the columns {}, got an empty file", COLUMNS.join(","))]
    Empty,
    /// A required column is not in the header.
    #[error("line 1: expected a column `{column}` in the header (required: {}), got `{header}`", COLUMNS.join(","))]
    MissingColumn {
        /// The column.
        column: &'static str,
        /// The header as read.
        header: String,
    },
    /// A column is named twice.
    #[error("line 1, column `{column}`: expected each column once, got it twice")]
    DuplicateColumn {
        /// The column.
        column: String,
    },
    /// A row has a different number of fields than the header.
    #[error("line {line}: expected {expected} fields as in the header, got {actual}")]
    FieldCount {
        /// The line.
        line: u64,
        /// Fields in the header.
        expected: usize,
        /// Fields in the row.
        actual: usize,
    },
    /// A field does not hold what its column needs.
    #[error("line {line}, column `{column}`: expected {expected}, got `{actual}`")]
    BadValue {
        /// The line.
        line: u64,
        /// The column.
        column: &'static str,
        /// What the column needs.
        expected: &'static str,
        /// The field as read (trimmed).
        actual: String,
    },
    /// A row's tick is before the previous row's.
    #[error(
        "line {line}, column `tick`: expected rows in tick order (at least {previous}), got {tick}"
    )]
    OutOfOrder {
        /// The line.
        line: u64,
        /// The previous row's tick.
        previous: u64,
        /// This row's tick.
        tick: u64,
    },
    /// A flow has two rows in one tick.
    #[error(
        "line {line}, column `flow_id`: expected one row per flow per tick, got flow {flow} twice in tick {tick}"
    )]
    DuplicateRow {
        /// The line.
        line: u64,
        /// The flow.
        flow: FlowId,
        /// The tick.
        tick: u64,
    },
    /// A flow's label changes between rows.
    #[error("line {line}, column `class`: expected flow {flow} to keep its class {was}, got {now}")]
    ClassChanged {
        /// The line.
        line: u64,
        /// The flow.
        flow: FlowId,
        /// Its earlier label.
        was: FlowClass,
        /// This row's label.
        now: FlowClass,
    },
}

/// Parses a trace held in memory. See the module doc for the format.
pub fn parse_csv(text: &str) -> Result<Trace, TraceError> {
    read_csv(text.as_bytes())
}

/// Where each column is in a row.
#[derive(Clone, Copy, Debug)]
struct Layout {
    /// Field index of each of [`COLUMNS`].
    at: [usize; 6],
    class: Option<usize>,
    fields: usize,
}

impl Layout {
    fn from_header(header: &str) -> Result<Layout, TraceError> {
        let names: Vec<&str> = header.split(',').map(str::trim).collect();
        let mut seen = HashSet::new();
        for n in &names {
            if !n.is_empty() && !seen.insert(*n) {
                return Err(TraceError::DuplicateColumn {
                    column: (*n).to_string(),
                });
            }
        }
        let mut at = [0; 6];
        for (slot, column) in at.iter_mut().zip(COLUMNS) {
            *slot = names.iter().position(|n| *n == column).ok_or_else(|| {
                TraceError::MissingColumn {
                    column,
                    header: header.to_string(),
                }
            })?;
        }
        Ok(Layout {
            at,
            class: names.iter().position(|n| *n == CLASS_COLUMN),
            fields: names.len(),
        })
    }
}

/// Parser state across rows: tick order, one row per flow per tick, stable labels.
#[derive(Debug, Default)]
struct RowChecks {
    tick: Option<u64>,
    in_tick: HashSet<FlowId>,
    labels: HashMap<FlowId, FlowClass>,
}

fn bad(line: u64, column: &'static str, expected: &'static str, actual: &str) -> TraceError {
    TraceError::BadValue {
        line,
        column,
        expected,
        actual: actual.to_string(),
    }
}

fn parse_u64(line: u64, column: &'static str, s: &str) -> Result<u64, TraceError> {
    s.parse()
        .map_err(|_| bad(line, column, "an integer in 0..=2^64-1", s))
}

/// A finite number >= 0 (and <= 1 when `ratio`).
fn parse_f64(line: u64, column: &'static str, s: &str, ratio: bool) -> Result<f64, TraceError> {
    let expected = if ratio {
        "a number in [0, 1]"
    } else {
        "a finite number >= 0"
    };
    let v: f64 = s.parse().map_err(|_| bad(line, column, expected, s))?;
    let ok = v.is_finite() && v >= 0.0 && (!ratio || v <= 1.0);
    if ok {
        // `-0` is accepted as 0.
        Ok(v.abs())
    } else {
        Err(bad(line, column, expected, s))
    }
}

/// Splits a row into the fields the layout needs (no allocation) and parses them.
fn parse_row(
    line: u64,
    text: &str,
    layout: &Layout,
    checks: &mut RowChecks,
) -> Result<(TraceRow, Option<FlowClass>), TraceError> {
    let mut fs = [""; 7];
    let mut count = 0;
    for (i, field) in text.split(',').enumerate() {
        count += 1;
        if let Some(j) = layout.at.iter().position(|&a| a == i) {
            fs[j] = field.trim();
        } else if layout.class == Some(i) {
            fs[6] = field.trim();
        }
    }
    if count != layout.fields {
        return Err(TraceError::FieldCount {
            line,
            expected: layout.fields,
            actual: count,
        });
    }
    parse_fields(line, &fs, layout.class.is_some(), checks)
}

/// Parses the fields of [`COLUMNS`] (in that order) and the class (index 6, if `labelled`),
/// then checks the row against the earlier ones.
fn parse_fields(
    line: u64,
    fs: &[&str; 7],
    labelled: bool,
    checks: &mut RowChecks,
) -> Result<(TraceRow, Option<FlowClass>), TraceError> {
    let flow_id = parse_u64(line, "flow_id", fs[0])?;
    let tick = parse_u64(line, "tick", fs[1])?;
    let features = FeatureTick {
        bw_bps: parse_f64(line, "bw_bps", fs[2], false)?,
        pps: parse_f64(line, "pps", fs[3], false)?,
        ctrl_ratio: parse_f64(line, "ctrl_ratio", fs[4], true)?,
        jitter_us: parse_f64(line, "jitter_us", fs[5], false)?,
    };
    let class = if labelled {
        Some(
            fs[6]
                .parse::<FlowClass>()
                .map_err(|()| bad(line, CLASS_COLUMN, CLASS_EXPECTED, fs[6]))?,
        )
    } else {
        None
    };
    match checks.tick {
        Some(previous) if tick < previous => {
            return Err(TraceError::OutOfOrder {
                line,
                previous,
                tick,
            });
        }
        Some(previous) if tick == previous => {}
        _ => {
            checks.tick = Some(tick);
            checks.in_tick.clear();
        }
    }
    if !checks.in_tick.insert(flow_id) {
        return Err(TraceError::DuplicateRow {
            line,
            flow: flow_id,
            tick,
        });
    }
    if let Some(now) = class {
        let was = *checks.labels.entry(flow_id).or_insert(now);
        if was != now {
            return Err(TraceError::ClassChanged {
                line,
                flow: flow_id,
                was,
                now,
            });
        }
    }
    Ok((
        TraceRow {
            flow_id,
            tick,
            features,
        },
        class,
    ))
}

/// Reads a trace line by line. See the module doc for the format.
pub fn read_csv(mut input: impl BufRead) -> Result<Trace, TraceError> {
    let mut buf = String::new();
    let mut line: u64 = 0;
    let mut next_line = |buf: &mut String, line: &mut u64| -> Result<bool, TraceError> {
        buf.clear();
        *line += 1;
        let n = input.read_line(buf).map_err(|e| TraceError::Io {
            line: *line,
            message: e.to_string(),
        })?;
        while buf.ends_with('\n') || buf.ends_with('\r') {
            buf.pop();
        }
        Ok(n > 0)
    };
    // The header: the first line that is not blank.
    let layout = loop {
        if !next_line(&mut buf, &mut line)? {
            return Err(TraceError::Empty);
        }
        let header = buf.trim_start_matches('\u{feff}');
        if !header.trim().is_empty() {
            break Layout::from_header(header)?;
        }
    };
    let mut trace = Trace {
        rows: Vec::new(),
        classes: layout.class.map(|_| Vec::new()),
    };
    let mut checks = RowChecks::default();
    while next_line(&mut buf, &mut line)? {
        if buf.trim().is_empty() {
            continue;
        }
        let (row, class) = parse_row(line, &buf, &layout, &mut checks)?;
        trace.rows.push(row);
        if let (Some(classes), Some(c)) = (trace.classes.as_mut(), class) {
            classes.push(c);
        }
    }
    Ok(trace)
}

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
    /// Rows not in tick order (a trace built in memory; [`read_csv`] rejects these itself).
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

/// Closes `n` ticks in which no flow had a row, at most `forget_ticks + 1` of them: after that
/// every flow is forgotten and more empty ticks change nothing.
fn empty_ticks(c: &mut Classifier, n: u64) {
    let n = n.min(u64::from(c.params().forget_ticks) + 1);
    for _ in 0..n {
        c.end_tick();
    }
}

/// Feeds `rows` (in tick order) to a classifier with `params`, tick by tick, up to and
/// including `at_tick` (default: the trace's last tick), and ranks the flows there.
///
/// A tick number missing between two rows' ticks is a tick in which no flow had a row (every
/// flow idle). `at_tick` must lie within the trace's ticks.
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
                empty_ticks(&mut c, r.tick - t - 1);
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
                empty_ticks(&mut c, at - cur);
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

// ---------------------------------------------------------------------------------------------
// The generator.

/// What to generate. [`GenSpec::default`] is the mix the evaluation uses.
#[derive(Clone, Debug, PartialEq)]
pub struct GenSpec {
    /// Flows in all (mice included).
    pub flows: usize,
    /// Ticks (100 ms each).
    pub ticks: u64,
    /// Share of each class, in [`FlowClass::ALL`] order; normalised, so they need not sum
    /// to 1. Counts are rounded by largest remainder.
    pub mix: [f64; 5],
    /// Median of the log-normal mean rate, bits/s. Default 10 Mbit/s.
    pub rate_median_bps: f64,
    /// Log-standard deviation of the mean rate. Default 1.5: the 99th percentile is 33x the
    /// median, the 1st 1/33 of it (300 kbit/s .. 330 Mbit/s), as in data-centre flow-size
    /// measurements where a few elephants carry most bytes.
    pub rate_sigma: f64,
}

impl Default for GenSpec {
    /// 2,000 flows over 600 ticks (60 s): 30 % steady, 15 % periodic, 20 % bursty, 15 % random
    /// walk, 20 % mice.
    fn default() -> Self {
        GenSpec {
            flows: 2_000,
            ticks: 600,
            mix: [0.30, 0.15, 0.20, 0.15, 0.20],
            rate_median_bps: 10e6,
            rate_sigma: 1.5,
        }
    }
}

impl GenSpec {
    /// How many flows of each class: largest-remainder rounding of `flows × share`, ties to
    /// the earlier class.
    pub fn counts(&self) -> [usize; 5] {
        let total: f64 = self.mix.iter().map(|s| s.max(0.0)).sum();
        let mut counts = [0usize; 5];
        if total <= 0.0 || self.flows == 0 {
            return counts;
        }
        let mut rem = [(0.0f64, 0usize); 5];
        let mut given = 0;
        for (i, s) in self.mix.iter().enumerate() {
            let exact = self.flows as f64 * s.max(0.0) / total;
            counts[i] = exact.floor() as usize;
            given += counts[i];
            rem[i] = (exact - exact.floor(), i);
        }
        rem.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        for (_, i) in rem.iter().take(self.flows.saturating_sub(given)) {
            counts[*i] += 1;
        }
        counts
    }
}

/// How a flow's rate evolves.
#[derive(Clone, Debug)]
enum Shape {
    Steady,
    Periodic {
        period_ticks: f64,
        amplitude: f64,
        phase: f64,
    },
    Bursty {
        on: bool,
        /// Time left in the current period, seconds.
        left_s: f64,
        mean_on_s: f64,
        mean_off_s: f64,
        /// Length of the current off period so far, seconds (the gap before the next packet).
        off_run_s: f64,
    },
    RandomWalk {
        x: f64,
        /// Mean reversion per tick.
        theta: f64,
        /// Volatility per tick.
        sigma: f64,
        /// Stationary log-standard deviation.
        spread: f64,
    },
    Mice {
        born: u64,
        life: u64,
        /// Rate of a full tick, so that the life's mean is the drawn rate.
        body_bps: f64,
        /// Control ratio of the first and last tick.
        edge_ctrl: f64,
    },
}

/// One generated flow.
#[derive(Clone, Debug)]
struct FlowGen {
    id: FlowId,
    class: FlowClass,
    rate_bps: f64,
    size_bytes: f64,
    /// Coefficient of variation of its regular gaps.
    cv: f64,
    /// Its base control ratio.
    ctrl: f64,
    rng: SplitMix64,
    shape: Shape,
}

/// Standard deviation of a set of gaps: `regular` gaps of mean `g` and coefficient of variation
/// `cv`, plus the `big` gaps; 0 with fewer than two gaps (as [`crate::features::FlowCounters`]
/// reports).
fn gap_std(regular: f64, g: f64, cv: f64, big: &[f64]) -> f64 {
    let n = regular + big.len() as f64;
    if n < 2.0 {
        return 0.0;
    }
    let sum = regular * g + big.iter().sum::<f64>();
    let sq = regular * g * g * (1.0 + cv * cv) + big.iter().map(|b| b * b).sum::<f64>();
    let mean = sum / n;
    (sq / n - mean * mean).max(0.0).sqrt()
}

/// Rounds to a multiple of `1 / scale` (`scale` a power of ten), so that the CSV's shortest
/// decimal form reads back as the same value.
fn round_to(x: f64, scale: f64) -> f64 {
    (x * scale).round() / scale
}

impl FlowGen {
    fn new(id: FlowId, class: FlowClass, spec: &GenSpec, seed: u64) -> FlowGen {
        // Each flow's stream from the seed and its id, independent of the other flows.
        let mut rng = SplitMix64::new(mix64(seed ^ mix64(id ^ 0x5851_F42D_4C95_7F2D)));
        let rate_bps = spec.rate_median_bps * (spec.rate_sigma * rng.normal()).exp();
        let size_bytes = rng.log_range(64.0, 1500.0).round();
        let ctrl = rng.range(0.0, 0.05);
        let (cv, shape) = match class {
            FlowClass::Steady => (rng.range(0.05, 0.3), Shape::Steady),
            FlowClass::Periodic => (
                rng.range(0.05, 0.3),
                Shape::Periodic {
                    period_ticks: rng.range(1.0, 5.0) * TICKS_PER_S,
                    amplitude: rng.range(0.3, 0.8),
                    phase: rng.range(0.0, 2.0 * core::f64::consts::PI),
                },
            ),
            FlowClass::Bursty => {
                let mean_on_s = rng.log_range(0.2, 3.0);
                let mean_off_s = rng.log_range(0.2, 3.0);
                // Start in the stationary state: on with probability duty, and (memoryless)
                // a full exponential time left.
                let on = rng.uniform() < mean_on_s / (mean_on_s + mean_off_s);
                let left_s = rng.exp(if on { mean_on_s } else { mean_off_s });
                (
                    rng.range(0.05, 0.3),
                    Shape::Bursty {
                        on,
                        left_s,
                        mean_on_s,
                        mean_off_s,
                        off_run_s: if on { 0.0 } else { rng.exp(mean_off_s) },
                    },
                )
            }
            FlowClass::RandomWalk => {
                let sigma = rng.range(0.1, 0.3);
                let spread: f64 = rng.range(0.5, 1.0);
                // Stationary variance of x' = (1 - θ) x + σ ε is σ² / (2θ - θ²).
                let theta = 1.0 - (1.0 - (sigma / spread).powi(2)).sqrt();
                (
                    rng.range(0.1, 0.5),
                    Shape::RandomWalk {
                        x: spread * rng.normal(),
                        theta,
                        sigma,
                        spread,
                    },
                )
            }
            FlowClass::Mice => {
                let life = rng.int(2, 15).min(spec.ticks.max(1));
                let born = rng.int(0, spec.ticks.saturating_sub(life));
                // Half a tick's worth in the first and the last tick (handshake, slow start,
                // the tail): the full ticks carry rate × life / (life - 1).
                let weight = (life as f64 - 1.0).max(1.0);
                (
                    rng.range(1.0, 3.0),
                    Shape::Mice {
                        born,
                        life,
                        body_bps: rate_bps * life as f64 / weight,
                        edge_ctrl: rng.range(0.3, 0.8),
                    },
                )
            }
        };
        FlowGen {
            id,
            class,
            rate_bps,
            size_bytes,
            cv,
            ctrl,
            rng,
            shape,
        }
    }

    /// Whole packets for an expected (fractional) count, by unbiased random rounding.
    fn packets(rng: &mut SplitMix64, expected: f64) -> f64 {
        (expected.max(0.0) + rng.uniform()).floor()
    }

    /// The flow's row in `tick`, or `None` when it is not alive.
    fn step(&mut self, tick: u64) -> Option<FeatureTick> {
        let bits = self.size_bytes * 8.0;
        let rng = &mut self.rng;
        // (packets, mean regular gap in us, cv, big gaps in us, control ratio)
        let mut big = [0.0f64; 8];
        let mut nbig = 0;
        let (n, gap_us, cv, ctrl) = match &mut self.shape {
            Shape::Steady => {
                let bw = self.rate_bps * rng.lognormal_noise(0.05);
                let n = Self::packets(rng, bw * TICK_S / bits);
                (n, 1e6 * bits / bw, self.cv, self.ctrl)
            }
            Shape::Periodic {
                period_ticks,
                amplitude,
                phase,
            } => {
                let angle = 2.0 * core::f64::consts::PI * tick as f64 / *period_ticks + *phase;
                let bw =
                    self.rate_bps * (1.0 + *amplitude * angle.sin()) * rng.lognormal_noise(0.05);
                let n = Self::packets(rng, bw * TICK_S / bits);
                (n, 1e6 * bits / bw, self.cv, self.ctrl)
            }
            Shape::Bursty {
                on,
                left_s,
                mean_on_s,
                mean_off_s,
                off_run_s,
            } => {
                // Walk the on/off periods through the tick; each off period that ends inside
                // it is one long gap before the first packet of the next on period.
                let duty = *mean_on_s / (*mean_on_s + *mean_off_s);
                let on_bps = self.rate_bps / duty;
                let mut t = 0.0;
                let mut on_s = 0.0;
                while t < TICK_S {
                    let span = left_s.min(TICK_S - t);
                    if *on {
                        on_s += span;
                    } else {
                        *off_run_s += span;
                    }
                    t += span;
                    *left_s -= span;
                    if *left_s <= 0.0 {
                        if !*on {
                            if nbig < big.len() {
                                big[nbig] = *off_run_s * 1e6;
                                nbig += 1;
                            }
                            *off_run_s = 0.0;
                        }
                        *on = !*on;
                        *left_s = rng.exp(if *on { *mean_on_s } else { *mean_off_s });
                    }
                }
                let n = Self::packets(rng, on_bps * on_s / bits);
                (n, 1e6 * bits / on_bps, self.cv, self.ctrl)
            }
            Shape::RandomWalk {
                x,
                theta,
                sigma,
                spread,
            } => {
                *x = (1.0 - *theta) * *x + *sigma * rng.normal();
                let bw = self.rate_bps * (*x - 0.5 * *spread * *spread).exp();
                let n = Self::packets(rng, bw * TICK_S / bits);
                (n, 1e6 * bits / bw, self.cv, self.ctrl)
            }
            Shape::Mice {
                born,
                life,
                body_bps,
                edge_ctrl,
            } => {
                if tick < *born || tick >= *born + *life {
                    return None;
                }
                let edge = tick == *born || tick + 1 == *born + *life;
                let full = *body_bps * rng.lognormal_noise(0.2);
                let bw = if edge { 0.5 * full } else { full };
                let bw = if *life == 1 { *body_bps } else { bw };
                let n = Self::packets(rng, bw * TICK_S / bits);
                let ctrl = if edge { *edge_ctrl } else { self.ctrl };
                (n, 1e6 * bits / full.max(1.0), self.cv, ctrl)
            }
        };
        if n <= 0.0 {
            // A silent tick: no packets, nothing to measure.
            return Some(FeatureTick::default());
        }
        let nbig = nbig.min(n as usize);
        let regular = n - nbig as f64;
        let jitter = gap_std(
            regular,
            gap_us,
            cv * self.rng.lognormal_noise(0.1),
            &big[..nbig],
        );
        let ctrl = (ctrl * self.rng.range(0.5, 1.5)).clamp(0.0, 1.0);
        Some(FeatureTick {
            // Whole packets of a whole size: exact integers (ticks per second is exact).
            bw_bps: n * bits * TICKS_PER_S,
            pps: n * TICKS_PER_S,
            ctrl_ratio: round_to(ctrl, 1e4),
            jitter_us: round_to(jitter, 1e3),
        })
    }
}

/// Generates a labelled trace: every live flow's row at every tick, in tick order (flows by
/// id within a tick). Flow ids are 0..flows with the classes shuffled over them, so an id says
/// nothing about its class. The same `spec` and `seed` give the same rows.
pub fn generate(spec: &GenSpec, seed: u64) -> Vec<LabelledRow> {
    let counts = spec.counts();
    let mut classes: Vec<FlowClass> = FlowClass::ALL
        .iter()
        .zip(counts)
        .flat_map(|(c, n)| core::iter::repeat_n(*c, n))
        .collect();
    // Fisher-Yates with the trace's own stream.
    let mut rng = SplitMix64::new(mix64(seed ^ 0xC1A5_5E5D_0F0F_1234));
    for i in (1..classes.len()).rev() {
        let j = rng.int(0, i as u64) as usize;
        classes.swap(i, j);
    }
    let mut flows: Vec<FlowGen> = classes
        .iter()
        .enumerate()
        .map(|(i, c)| FlowGen::new(i as FlowId, *c, spec, seed))
        .collect();
    let mut rows = Vec::with_capacity(flows.len() * spec.ticks as usize);
    for tick in 0..spec.ticks {
        for f in flows.iter_mut() {
            if let Some(features) = f.step(tick) {
                rows.push(LabelledRow {
                    row: TraceRow {
                        flow_id: f.id,
                        tick,
                        features,
                    },
                    class: f.class,
                });
            }
        }
    }
    rows
}

/// Writes `rows` as a trace CSV with the header and a trailing `class` column. Numbers are
/// written in their shortest round-trip form, so [`parse_csv`] reads back the same values.
pub fn write_csv(rows: &[LabelledRow], mut out: impl Write) -> std::io::Result<()> {
    writeln!(out, "{},{CLASS_COLUMN}", COLUMNS.join(","))?;
    for r in rows {
        let f = &r.row.features;
        writeln!(
            out,
            "{},{},{},{},{},{},{}",
            r.row.flow_id, r.row.tick, f.bw_bps, f.pps, f.ctrl_ratio, f.jitter_us, r.class
        )?;
    }
    Ok(())
}

/// [`write_csv`] into a string.
pub fn to_csv_string(rows: &[LabelledRow]) -> String {
    let mut out = Vec::new();
    write_csv(rows, &mut out).expect("writing to a Vec cannot fail");
    String::from_utf8(out).expect("the CSV is ASCII")
}

// ---------------------------------------------------------------------------------------------
// Evaluation.

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

    const HEADER: &str = "flow_id,tick,bw_bps,pps,ctrl_ratio,jitter_us";

    fn parse_err(body: &str) -> TraceError {
        parse_csv(&format!("{HEADER}\n{body}")).expect_err("should be rejected")
    }

    #[test]
    fn parser_takes_columns_by_name_in_any_order_and_ignores_extras() {
        let text = "\u{feff} jitter_us , extra,tick,flow_id,pps,bw_bps,ctrl_ratio\r\n\
                    5, x ,0,7,100,800000,0.25\r\n\
                    \r\n\
                    6,y,1,7,200,1600000,0\r\n";
        let t = parse_csv(text).expect("valid");
        assert_eq!(t.classes, None);
        assert_eq!(
            t.rows,
            vec![
                TraceRow {
                    flow_id: 7,
                    tick: 0,
                    features: FeatureTick {
                        bw_bps: 800_000.0,
                        pps: 100.0,
                        ctrl_ratio: 0.25,
                        jitter_us: 5.0
                    }
                },
                TraceRow {
                    flow_id: 7,
                    tick: 1,
                    features: FeatureTick {
                        bw_bps: 1_600_000.0,
                        pps: 200.0,
                        ctrl_ratio: 0.0,
                        jitter_us: 6.0
                    }
                },
            ]
        );
    }

    #[test]
    fn parser_errors_name_the_line_the_column_and_what_was_expected() {
        let e = parse_err("1,0,100,1,0,0\n2,0,abc,1,0,0");
        assert_eq!(
            e,
            TraceError::BadValue {
                line: 3,
                column: "bw_bps",
                expected: "a finite number >= 0",
                actual: "abc".into()
            }
        );
        assert_eq!(
            e.to_string(),
            "line 3, column `bw_bps`: expected a finite number >= 0, got `abc`"
        );
        let e = parse_err("1,0,100,-1,0,0");
        assert!(
            matches!(
                e,
                TraceError::BadValue {
                    line: 2,
                    column: "pps",
                    ..
                }
            ),
            "{e}"
        );
        let e = parse_err("1,0,100,1,1.5,0");
        assert_eq!(
            e.to_string(),
            "line 2, column `ctrl_ratio`: expected a number in [0, 1], got `1.5`"
        );
        let e = parse_err("1,0,100,1,0,NaN");
        assert!(
            matches!(
                e,
                TraceError::BadValue {
                    column: "jitter_us",
                    ..
                }
            ),
            "{e}"
        );
        let e = parse_err("1,0,100,1,0,inf");
        assert!(
            matches!(
                e,
                TraceError::BadValue {
                    column: "jitter_us",
                    ..
                }
            ),
            "{e}"
        );
        let e = parse_err("x,0,100,1,0,0");
        assert!(
            matches!(
                e,
                TraceError::BadValue {
                    column: "flow_id",
                    ..
                }
            ),
            "{e}"
        );
        let e = parse_err("1,-2,100,1,0,0");
        assert!(
            matches!(e, TraceError::BadValue { column: "tick", .. }),
            "{e}"
        );
        let e = parse_err("1,0,100,1,0");
        assert_eq!(
            e,
            TraceError::FieldCount {
                line: 2,
                expected: 6,
                actual: 5
            }
        );
        let e = parse_err("1,5,100,1,0,0\n1,4,100,1,0,0");
        assert_eq!(
            e.to_string(),
            "line 3, column `tick`: expected rows in tick order (at least 5), got 4"
        );
        let e = parse_err("1,5,100,1,0,0\n1,5,100,1,0,0");
        assert_eq!(
            e,
            TraceError::DuplicateRow {
                line: 3,
                flow: 1,
                tick: 5
            }
        );
    }

    #[test]
    fn parser_rejects_bad_headers_and_labels() {
        assert_eq!(parse_csv(""), Err(TraceError::Empty));
        assert_eq!(parse_csv("\n  \n"), Err(TraceError::Empty));
        let e = parse_csv("flow_id,tick,bw_bps,pps,ctrl_ratio\n").expect_err("missing");
        assert!(
            matches!(
                e,
                TraceError::MissingColumn {
                    column: "jitter_us",
                    ..
                }
            ),
            "{e}"
        );
        assert!(
            e.to_string()
                .starts_with("line 1: expected a column `jitter_us`"),
            "{e}"
        );
        let e = parse_csv(&format!("{HEADER},tick\n")).expect_err("duplicate");
        assert_eq!(
            e,
            TraceError::DuplicateColumn {
                column: "tick".into()
            }
        );
        let labelled = format!("{HEADER},class\n1,0,1,1,0,0,steady\n1,1,1,1,0,0,elephant\n");
        let e = parse_csv(&labelled).expect_err("unknown class");
        assert_eq!(
            e.to_string(),
            "line 3, column `class`: expected one of steady, periodic, bursty, random-walk, mice, got `elephant`"
        );
        let changed = format!("{HEADER},class\n1,0,1,1,0,0,steady\n1,1,1,1,0,0,mice\n");
        assert!(matches!(
            parse_csv(&changed),
            Err(TraceError::ClassChanged {
                line: 3,
                flow: 1,
                ..
            })
        ));
    }

    #[test]
    fn generated_trace_round_trips_through_csv_with_labels() {
        let spec = GenSpec {
            flows: 60,
            ticks: 40,
            ..GenSpec::default()
        };
        let rows = generate(&spec, 9);
        let text = to_csv_string(&rows);
        let back = parse_csv(&text).expect("generated CSV parses");
        assert_eq!(back.labelled().expect("labelled"), rows);
    }

    #[test]
    fn generator_is_reproducible_for_a_seed_and_differs_across_seeds() {
        let spec = GenSpec {
            flows: 200,
            ticks: 100,
            ..GenSpec::default()
        };
        let a = generate(&spec, 42);
        assert_eq!(a, generate(&spec, 42));
        assert_ne!(a, generate(&spec, 43));
        // Rows are in tick order and each live flow has one row per tick.
        assert!(a.windows(2).all(|w| w[0].row.tick <= w[1].row.tick));
        assert!(a.iter().all(|r| r.row.features.is_valid()));
        // The class counts follow the mix exactly (largest remainder).
        let counts = spec.counts();
        assert_eq!(counts, [60, 30, 40, 30, 40]);
        let mut per_class = [0usize; 5];
        let mut seen = HashSet::new();
        for r in &a {
            if seen.insert(r.row.flow_id) {
                per_class[r.class.index()] += 1;
            }
        }
        assert_eq!(per_class, counts);
    }

    #[test]
    fn rate_distribution_is_the_same_for_every_class() {
        // The drawn mean rates' median per class is near the spec's median whatever the
        // class: bandwidth alone does not give the class away.
        let spec = GenSpec {
            flows: 2_500,
            ticks: 1,
            mix: [1.0; 5],
            ..GenSpec::default()
        };
        let mut rates: [Vec<f64>; 5] = Default::default();
        for (i, c) in FlowClass::ALL.iter().cycle().take(spec.flows).enumerate() {
            let f = FlowGen::new(i as FlowId, *c, &spec, 3);
            rates[c.index()].push(f.rate_bps);
        }
        for (c, r) in FlowClass::ALL.iter().zip(rates.iter_mut()) {
            r.sort_by(f64::total_cmp);
            let median = r[r.len() / 2];
            assert!(
                (median / spec.rate_median_bps).ln().abs() < 0.25,
                "{c}: median {median}"
            );
        }
    }

    #[test]
    fn each_class_carries_its_drawn_mean_rate() {
        let spec = GenSpec {
            flows: 1_000,
            ticks: 600,
            ..GenSpec::default()
        };
        let seed = 11;
        let counts = spec.counts();
        let mut classes: Vec<FlowClass> = Vec::new();
        for (c, n) in FlowClass::ALL.iter().zip(counts) {
            classes.extend(core::iter::repeat_n(*c, n));
        }
        // Per class: the mean over flows of (empirical mean rate while alive / drawn rate).
        for (i, class) in FlowClass::ALL.iter().enumerate() {
            let mut ratio_sum = 0.0;
            let mut flows = 0.0;
            for (id, _) in classes.iter().enumerate().filter(|(_, c)| *c == class) {
                let mut f = FlowGen::new(id as FlowId, *class, &spec, seed);
                let drawn = f.rate_bps;
                let (mut sum, mut n) = (0.0, 0.0);
                for t in 0..spec.ticks {
                    if let Some(x) = f.step(t) {
                        sum += x.bw_bps;
                        n += 1.0;
                    }
                }
                ratio_sum += sum / n / drawn;
                flows += 1.0;
            }
            let ratio = ratio_sum / flows;
            // Random walks and on/off flows average fewer independent samples per flow.
            let tol = [0.02, 0.03, 0.10, 0.15, 0.05][i];
            assert!(
                (ratio - 1.0).abs() < tol,
                "{class}: empirical / drawn mean rate {ratio:.3} over {flows} flows"
            );
        }
    }

    #[test]
    fn mice_are_short_with_control_heavy_edges_and_bursty_flows_go_silent() {
        let spec = GenSpec {
            flows: 300,
            ticks: 300,
            ..GenSpec::default()
        };
        let rows = generate(&spec, 5);
        let mut life: HashMap<FlowId, (u64, u64, Vec<f64>)> = HashMap::new();
        let mut silent_bursty = 0;
        for r in &rows {
            match r.class {
                FlowClass::Mice => {
                    let e = life
                        .entry(r.row.flow_id)
                        .or_insert((u64::MAX, 0, Vec::new()));
                    e.0 = e.0.min(r.row.tick);
                    e.1 = e.1.max(r.row.tick);
                    e.2.push(r.row.features.ctrl_ratio);
                }
                FlowClass::Bursty if r.row.features.bw_bps == 0.0 => silent_bursty += 1,
                _ => {}
            }
        }
        assert_eq!(life.len(), spec.counts()[4]);
        for (first, last, ctrl) in life.values() {
            let n = last - first + 1;
            assert!((2..=15).contains(&n), "life {n}");
            assert_eq!(ctrl.len() as u64, n, "one row per live tick");
            let edge = ctrl[0].min(ctrl[ctrl.len() - 1]);
            assert!(edge >= 0.15, "edge control ratio {edge}");
        }
        assert!(
            silent_bursty > 0,
            "bursty flows have off ticks with zero rows"
        );
    }

    #[test]
    fn gap_std_matches_a_direct_computation() {
        assert_eq!(gap_std(1.0, 10.0, 0.0, &[]), 0.0);
        assert!((gap_std(10.0, 10.0, 0.2, &[]) - 2.0).abs() < 1e-9);
        // Nine gaps of 10 and one of 110: mean 20, variance (9·100 + 8100)/10 = 900.
        assert!((gap_std(9.0, 10.0, 0.0, &[110.0]) - 30.0).abs() < 1e-9);
    }

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
    fn rank_trace_treats_missing_ticks_as_idle() {
        let p = StabilityParams::default();
        // Flow 1 every tick to 20, then a gap, then one row at tick 25.
        let mut rows: Vec<TraceRow> = (0..=20).map(|t| row(1, t, 1e6)).collect();
        rows.push(row(2, 25, 1e6));
        let r = rank_trace(&rows, Some(23), &p).expect("tick in the gap");
        assert_eq!(r.tick, 23);
        assert!(r.by_last_tick.is_empty());
        let gap = rank_trace(&rows, None, &p).expect("ranks");
        let g1 = |r: &Ranking| {
            r.by_gain
                .iter()
                .find(|s| s.flow == 1)
                .map(|s| s.gain_bps)
                .expect("flow 1 known")
        };
        let before = rank_trace(&rows, Some(20), &p).expect("ranks");
        assert!(g1(&gap) < g1(&before), "idle ticks lower the long-run mean");
    }

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
