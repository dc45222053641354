//! The trace CSV: reading it with every field checked ([`parse_csv`], [`read_csv`]) and
//! writing it back in a form that reads back to the same values ([`write_csv`]). The format
//! itself is described in the `trace` module's documentation.

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, Write};

use super::row::{FlowClass, LabelledRow, TraceRow};
use crate::classifier::FlowId;
use crate::features::FeatureTick;

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
/// What a `class` field must be.
const CLASS_EXPECTED: &str = "one of steady, periodic, bursty, random-walk, mice";

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::{GenSpec, generate};

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
}
