//! `spillway stability rank | gen | eval`: the flow-stability classifier offline, on feature
//! traces (see `spillway_sketch::trace` for the CSV format).
//!
//! - `rank` reads a trace and prints the K flows the classifier would recall to the DPU at
//!   the end of the trace (or at `--at-tick`), best first, with each decision explained.
//! - `gen` writes a labelled synthetic trace (steady, periodic, bursty, random-walk, mice).
//! - `eval` measures precision and recall of the top K against the labels, for the stability
//!   ranking and the two bandwidth baselines, on a generated or a given labelled trace.
//!
//! Everything is deterministic: the same trace (or seed) gives the same output.

use std::fs::File;
use std::io::{BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::flags::ranged;
use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use spillway_sketch::classifier::StabilityParams;
use spillway_sketch::trace::{
    self, Evaluation, Family, FlowClass, GenSpec, LabelledRow, Ranking, TopK, Trace,
};

/// Most rows `gen` and `eval` generate (flows × ticks): about 1.1 GB in memory.
const ROWS_MAX: u64 = 20_000_000;
/// Largest K of `rank --k` and `eval --k`.
const K_MAX: u64 = 1_000_000;

/// `spillway stability` subcommands.
#[derive(clap::Subcommand, Debug)]
pub enum StabilityCommand {
    /// Rank a trace's flows: the K the classifier would recall to the DPU, best first.
    Rank(RankArgs),
    /// Write a labelled synthetic trace (steady, periodic, bursty, random-walk, mice).
    Gen(GenArgs),
    /// Precision and recall of the top K against the labels: stability vs bandwidth-only vs
    /// last-tick bandwidth.
    Eval(EvalArgs),
    /// The generalisation table: `eval` on every trace family over several seeds, medians
    /// with min-max (the constants were chosen on `uniform`; the others are held out).
    Families(FamiliesArgs),
}

/// `spillway stability rank` arguments.
#[derive(clap::Args, Debug)]
pub struct RankArgs {
    /// The trace: CSV with header flow_id,tick,bw_bps,pps,ctrl_ratio,jitter_us (any order,
    /// extra columns ignored), one row per flow per 100 ms tick, in tick order.
    #[arg(long)]
    pub trace: PathBuf,
    /// How many flows to print, 1..=1000000.
    #[arg(long, value_parser = ranged(1, K_MAX))]
    pub k: usize,
    /// Print a JSON list of {rank, flow_id, score, gain_bps, instability, ...} instead of the
    /// table.
    #[arg(long)]
    pub json: bool,
    /// Rank at this tick (its rows included) instead of the trace's last (any u64).
    #[arg(long)]
    pub at_tick: Option<u64>,
}

/// `spillway stability gen` arguments.
#[derive(clap::Args, Debug)]
pub struct GenArgs {
    /// The seed (any u64).
    #[arg(long)]
    pub seed: u64,
    /// The generator: uniform (the mix the constants were chosen on), elephants or pareto.
    #[arg(long, default_value = "uniform", value_parser = parse_family)]
    pub family: Family,
    /// Flows (default: the family's, 2000 or 4000), 1..=20000000, with flows x ticks at most
    /// 20000000.
    #[arg(long, value_parser = ranged(1, ROWS_MAX))]
    pub flows: Option<usize>,
    /// Ticks of 100 ms (default 600), 1..=20000000, with flows x ticks at most 20000000.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=ROWS_MAX))]
    pub ticks: Option<u64>,
    /// Where to write the CSV (with a trailing `class` column).
    #[arg(long)]
    pub out: PathBuf,
}

/// `spillway stability eval` arguments.
#[derive(clap::Args, Debug)]
pub struct EvalArgs {
    /// The seed of the generated trace (any u64).
    #[arg(long, default_value_t = 1, conflicts_with = "trace")]
    pub seed: u64,
    /// The generator: uniform, elephants or pareto.
    #[arg(long, default_value = "uniform", conflicts_with = "trace", value_parser = parse_family)]
    pub family: Family,
    /// Flows of the generated trace (default: the family's), 1..=20000000, with flows x ticks
    /// at most 20000000.
    #[arg(long, conflicts_with = "trace", value_parser = ranged(1, ROWS_MAX))]
    pub flows: Option<usize>,
    /// Ticks of the generated trace (default 600), 1..=20000000, with flows x ticks at most
    /// 20000000.
    #[arg(long, conflicts_with = "trace", value_parser = clap::value_parser!(u64).range(1..=ROWS_MAX))]
    pub ticks: Option<u64>,
    /// Evaluate this labelled trace (a CSV with a `class` column) instead of generating one.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// The K values, comma-separated, each 1..=1000000.
    #[arg(long, value_delimiter = ',', default_value = "25,50,100,200", value_parser = ranged(1, K_MAX))]
    pub k: Vec<usize>,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// `spillway stability families` arguments.
#[derive(clap::Args, Debug)]
pub struct FamiliesArgs {
    /// Seeds 1..=N of every family, 1..=100.
    #[arg(long, default_value_t = 5, value_parser = ranged(1, 100))]
    pub seeds: usize,
    /// The K values, comma-separated, each 1..=1000000.
    #[arg(long, value_delimiter = ',', default_value = "25,50,100,200", value_parser = ranged(1, K_MAX))]
    pub k: Vec<usize>,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
}

fn parse_family(s: &str) -> Result<Family, String> {
    s.parse()
}

/// The spec of a generated trace: the family's, with `flows` and `ticks` if given.
fn spec_of(family: Family, flows: Option<usize>, ticks: Option<u64>) -> Result<GenSpec> {
    let base = GenSpec::family(family);
    let spec = GenSpec {
        flows: flows.unwrap_or(base.flows),
        ticks: ticks.unwrap_or(base.ticks),
        ..base
    };
    check_size(spec.flows, spec.ticks)?;
    Ok(spec)
}

/// Runs a `spillway stability` subcommand.
pub fn run(cmd: &StabilityCommand) -> Result<()> {
    let stdout = std::io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    match cmd {
        StabilityCommand::Rank(args) => rank(args, &mut out)?,
        StabilityCommand::Gen(args) => gen_trace(args, &mut out)?,
        StabilityCommand::Eval(args) => eval(args, &mut out)?,
        StabilityCommand::Families(args) => families(args, &mut out)?,
    }
    out.flush()?;
    Ok(())
}

fn read_trace(path: &Path) -> Result<Trace> {
    let file = File::open(path).with_context(|| format!("opening trace {}", path.display()))?;
    trace::read_csv(BufReader::new(file))
        .with_context(|| format!("reading trace {}", path.display()))
}

/// Bits per second with an SI prefix.
fn fmt_bps(bps: f64) -> String {
    let (v, unit) = if bps >= 1e9 {
        (bps / 1e9, "Gbit/s")
    } else if bps >= 1e6 {
        (bps / 1e6, "Mbit/s")
    } else if bps >= 1e3 {
        (bps / 1e3, "kbit/s")
    } else {
        (bps, "bit/s")
    };
    format!("{v:.2} {unit}")
}

fn rank(args: &RankArgs, out: &mut impl Write) -> Result<()> {
    let t = read_trace(&args.trace)?;
    let r = trace::rank_trace(&t.rows, args.at_tick, &StabilityParams::default()).with_context(
        || match args.at_tick {
            Some(at) => format!("ranking trace {} at --at-tick {at}", args.trace.display()),
            None => format!("ranking trace {}", args.trace.display()),
        },
    )?;
    let top = &r.stability[..args.k.min(r.stability.len())];
    if args.json {
        let list: Vec<Value> = top
            .iter()
            .enumerate()
            .map(|(i, s)| {
                json!({
                    "rank": i + 1,
                    "flow_id": s.flow,
                    "score": s.score,
                    "gain_bps": s.gain_bps,
                    "instability": s.instability,
                    "residual": s.residual,
                    "drift": s.drift,
                    "held": s.held,
                    "control": s.control,
                    "pps": s.pps,
                    "ticks": s.ticks,
                })
            })
            .collect();
        serde_json::to_writer(&mut *out, &list)?;
        writeln!(out)?;
        return Ok(());
    }
    print_rank_header(args, &r, out)?;
    writeln!(
        out,
        "{:>4}  {:>20}  {:>16}  {:>16}  {:>11}",
        "rank", "flow_id", "score", "gain", "instability"
    )?;
    for (i, s) in top.iter().enumerate() {
        writeln!(
            out,
            "{:>4}  {:>20}  {:>16}  {:>16}  {:>11.3}",
            i + 1,
            s.flow,
            fmt_bps(s.score),
            fmt_bps(s.gain_bps),
            s.instability
        )?;
        writeln!(out, "      {s}")?;
    }
    if top.len() < args.k {
        writeln!(
            out,
            "only {} flows are scored; the others have too little history and stay on the host",
            top.len()
        )?;
    }
    Ok(())
}

fn print_rank_header(args: &RankArgs, r: &Ranking, out: &mut impl Write) -> Result<()> {
    writeln!(
        out,
        "trace {}: ranked at tick {} (first tick {}); {} flows known, {} scored; top {} by stability score = gain x (1 - instability)^e",
        args.trace.display(),
        r.tick,
        r.first_tick,
        r.flows_known,
        r.stability.len(),
        args.k
    )?;
    Ok(())
}

fn check_size(flows: usize, ticks: u64) -> Result<()> {
    // Each is in 1..=ROWS_MAX by its parser; their product is bounded here.
    let rows = (flows as u64).saturating_mul(ticks);
    if rows > ROWS_MAX {
        bail!(
            "--flows {flows} x --ticks {ticks} = {rows} rows: expected at most {ROWS_MAX} (the trace is held in memory)"
        );
    }
    Ok(())
}

fn gen_trace(args: &GenArgs, out: &mut impl Write) -> Result<()> {
    let spec = spec_of(args.family, args.flows, args.ticks)?;
    let rows = trace::generate(&spec, args.seed);
    let file =
        File::create(&args.out).with_context(|| format!("creating {}", args.out.display()))?;
    let mut w = BufWriter::new(file);
    trace::write_csv(&rows, &mut w)
        .and_then(|()| w.flush())
        .with_context(|| format!("writing {}", args.out.display()))?;
    writeln!(
        out,
        "wrote {} rows to {}: family {}, seed {}, {} flows ({}), {} ticks of 100 ms",
        rows.len(),
        args.out.display(),
        spec.family,
        args.seed,
        spec.flows,
        trace::class_counts(&spec.counts()),
        spec.ticks
    )?;
    Ok(())
}

fn eval(args: &EvalArgs, out: &mut impl Write) -> Result<()> {
    if args.k.is_empty() {
        bail!("--k: expected a comma-separated list of K in 1..={K_MAX}, got none");
    }
    let (rows, source): (Vec<LabelledRow>, String) = match &args.trace {
        Some(path) => {
            let t = read_trace(path)?;
            let rows = t.labelled().with_context(|| {
                format!(
                    "evaluating trace {}: expected a `class` column with the flows' labels",
                    path.display()
                )
            })?;
            (rows, format!("trace {}", path.display()))
        }
        None => {
            let spec = spec_of(args.family, args.flows, args.ticks)?;
            (
                trace::generate(&spec, args.seed),
                format!(
                    "generated trace: family {}, seed {}, {} flows, {} ticks",
                    spec.family, args.seed, spec.flows, spec.ticks
                ),
            )
        }
    };
    let e = trace::evaluate(&rows, &args.k, &StabilityParams::default())
        .with_context(|| format!("evaluating {source}"))?;
    if args.json {
        let v = eval_json(&e, args);
        serde_json::to_writer(&mut *out, &v)?;
        writeln!(out)?;
    } else {
        print_eval(&e, &source, out)?;
    }
    Ok(())
}

/// Median, min and max of some figures (the median of an even count is the mean of the two
/// middle ones).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Spread {
    median: f64,
    min: f64,
    max: f64,
}

impl Spread {
    fn of(mut v: Vec<f64>) -> Spread {
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = match n {
            0 => f64::NAN,
            _ if n % 2 == 1 => v[n / 2],
            _ => 0.5 * (v[n / 2 - 1] + v[n / 2]),
        };
        Spread {
            median,
            min: v.first().copied().unwrap_or(f64::NAN),
            max: v.last().copied().unwrap_or(f64::NAN),
        }
    }

    fn json(&self) -> Value {
        json!({ "median": self.median, "min": self.min, "max": self.max })
    }
}

impl std::fmt::Display for Spread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:.2} [{:.2}-{:.2}]", self.median, self.min, self.max)
    }
}

/// One ranking at one K over the seeds of a family.
struct FamilyRow {
    k: usize,
    /// Precision of stability, bandwidth-only, last-tick; then the stability ranking's recall.
    spreads: [Spread; 4],
    /// Median of the stability top K's mean gain over the bandwidth-only top K's.
    gain_ratio: f64,
}

fn families(args: &FamiliesArgs, out: &mut impl Write) -> Result<()> {
    if args.k.is_empty() {
        bail!("--k: expected a comma-separated list of K in 1..={K_MAX}, got none");
    }
    let params = StabilityParams::default();
    let mut report = Vec::new();
    for family in Family::ALL {
        let spec = GenSpec::family(family);
        let mut evals = Vec::with_capacity(args.seeds);
        for seed in 1..=args.seeds as u64 {
            let rows = trace::generate(&spec, seed);
            evals.push(
                trace::evaluate(&rows, &args.k, &params)
                    .with_context(|| format!("evaluating family {family} seed {seed}"))?,
            );
        }
        let rows: Vec<FamilyRow> = args
            .k
            .iter()
            .enumerate()
            .map(|(i, &k)| {
                let pick =
                    |f: &dyn Fn(&Evaluation) -> f64| Spread::of(evals.iter().map(f).collect());
                FamilyRow {
                    k,
                    spreads: [
                        pick(&|e| e.rows[i].stability.precision),
                        pick(&|e| e.rows[i].by_gain.precision),
                        pick(&|e| e.rows[i].by_last_tick.precision),
                        pick(&|e| e.rows[i].stability.recall),
                    ],
                    gain_ratio: pick(&|e| {
                        let r = &e.rows[i];
                        r.stability.mean_gain_bps / r.by_gain.mean_gain_bps.max(f64::MIN_POSITIVE)
                    })
                    .median,
                }
            })
            .collect();
        report.push((family, spec, evals, rows));
    }
    if args.json {
        let list: Vec<Value> = report
            .iter()
            .map(|(family, spec, evals, rows)| {
                json!({
                    "family": family.name(),
                    "role": if *family == Family::Uniform { "tuned" } else { "held-out" },
                    "flows": spec.flows,
                    "ticks": spec.ticks,
                    "seeds": evals.len(),
                    "stable_alive": Spread::of(evals.iter().map(|e| e.stable_alive as f64).collect()).json(),
                    "rows": rows.iter().map(|r| json!({
                        "k": r.k,
                        "stability_precision": r.spreads[0].json(),
                        "bandwidth_only_precision": r.spreads[1].json(),
                        "last_tick_precision": r.spreads[2].json(),
                        "stability_recall": r.spreads[3].json(),
                        "stability_gain_over_bandwidth_only": r.gain_ratio,
                    })).collect::<Vec<Value>>(),
                })
            })
            .collect();
        serde_json::to_writer(&mut *out, &json!({ "families": list }))?;
        writeln!(out)?;
        return Ok(());
    }
    writeln!(
        out,
        "precision of the top K (stable share), median [min-max] over seeds 1..={}; constants chosen on uniform",
        args.seeds
    )?;
    for (family, spec, evals, rows) in &report {
        let stable = Spread::of(evals.iter().map(|e| e.stable_alive as f64).collect());
        writeln!(
            out,
            "\n{family}{}: {} flows ({}), {} ticks; stable alive {:.0}",
            if *family == Family::Uniform {
                " (tuned)"
            } else {
                " (held out)"
            },
            spec.flows,
            trace::class_counts(&spec.counts()),
            spec.ticks,
            stable.median
        )?;
        writeln!(
            out,
            "{:>6} | {:>17} | {:>17} | {:>17} | {:>17} | gain / bw-only",
            "K", "stability", "bandwidth-only", "last-tick bw", "stability recall"
        )?;
        for r in rows {
            writeln!(
                out,
                "{:>6} | {:>17} | {:>17} | {:>17} | {:>17} | {:.2}",
                r.k,
                r.spreads[0].to_string(),
                r.spreads[1].to_string(),
                r.spreads[2].to_string(),
                r.spreads[3].to_string(),
                r.gain_ratio
            )?;
        }
    }
    Ok(())
}

fn by_class_json(counts: &[usize; 5]) -> Value {
    let mut m = serde_json::Map::new();
    for c in FlowClass::ALL {
        m.insert(c.name().to_string(), json!(counts[c.index()]));
    }
    Value::Object(m)
}

fn top_json(t: &TopK) -> Value {
    json!({
        "precision": t.precision,
        "recall": t.recall,
        "stable": t.stable,
        "taken": t.taken,
        "by_class": by_class_json(&t.by_class),
        "mean_gain_bps": t.mean_gain_bps,
    })
}

fn eval_json(e: &Evaluation, args: &EvalArgs) -> Value {
    let source = match &args.trace {
        Some(p) => json!({ "trace": p.display().to_string() }),
        None => {
            let spec = GenSpec::family(args.family);
            json!({
                "family": args.family.name(),
                "seed": args.seed,
                "flows": args.flows.unwrap_or(spec.flows),
                "ticks": args.ticks.unwrap_or(spec.ticks),
            })
        }
    };
    json!({
        "source": source,
        "tick": e.tick,
        "alive": e.alive,
        "stable_alive": e.stable_alive,
        "alive_by_class": by_class_json(&e.alive_by_class),
        "scored": e.scored,
        "rows": e.rows.iter().map(|r| json!({
            "k": r.k,
            "stability": top_json(&r.stability),
            "bandwidth_only": top_json(&r.by_gain),
            "last_tick": top_json(&r.by_last_tick),
        })).collect::<Vec<Value>>(),
    })
}

fn print_eval(e: &Evaluation, source: &str, out: &mut impl Write) -> Result<()> {
    let alive = trace::class_counts(&e.alive_by_class);
    writeln!(out, "{source}")?;
    writeln!(
        out,
        "ranked at tick {}: {} flows alive ({}), {} stable; {} scored",
        e.tick, e.alive, alive, e.stable_alive, e.scored
    )?;
    writeln!(
        out,
        "precision = stable share of the K entries; recall = stable entries / min(K, stable alive)"
    )?;
    writeln!(
        out,
        "{:>6} | {:^17} | {:^17} | {:^17} | stability top-K by class",
        "", "stability", "bandwidth-only", "last-tick bw"
    )?;
    writeln!(
        out,
        "{:>6} | {:>8} {:>8} | {:>8} {:>8} | {:>8} {:>8} |",
        "K", "prec", "recall", "prec", "recall", "prec", "recall"
    )?;
    for r in &e.rows {
        writeln!(
            out,
            "{:>6} | {:>8.3} {:>8.3} | {:>8.3} {:>8.3} | {:>8.3} {:>8.3} | {}",
            r.k,
            r.stability.precision,
            r.stability.recall,
            r.by_gain.precision,
            r.by_gain.recall,
            r.by_last_tick.precision,
            r.by_last_tick.recall,
            trace::class_counts(&r.stability.by_class)
        )?;
    }
    writeln!(
        out,
        "mean gain (recent bandwidth) of the top K (what the entries carry):"
    )?;
    for r in &e.rows {
        writeln!(
            out,
            "{:>6} | {:>17} | {:>17} | {:>17} |",
            r.k,
            fmt_bps(r.stability.mean_gain_bps),
            fmt_bps(r.by_gain.mean_gain_bps),
            fmt_bps(r.by_last_tick.mean_gain_bps)
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bandwidth_is_printed_with_an_si_prefix() {
        assert_eq!(fmt_bps(950.0), "950.00 bit/s");
        assert_eq!(fmt_bps(12_345.0), "12.35 kbit/s");
        assert_eq!(fmt_bps(10e6), "10.00 Mbit/s");
        assert_eq!(fmt_bps(2.5e9), "2.50 Gbit/s");
    }
}
