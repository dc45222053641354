//! Proves that `spillway stability rank | gen | eval` behave as specified, by running the built
//! binary on labelled traces generated with a fixed seed (`spillway_sketch::trace::generate`)
//! and written to a per-test temp dir: `rank --json` prints exactly a list of K objects with
//! `flow_id`, `score`, `gain_bps`, `instability`, sorted by score descending and equal to the
//! library's ranking; `--at-tick` changes the answer and a tick beyond the trace is a one-line
//! error naming the file and the trace's last tick; a malformed CSV is an error naming the file,
//! the line and the column; `gen` writes the library's trace byte for byte and `eval --json`
//! reports one row per K for the three rankings.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::Value;
use spillway_sketch::classifier::StabilityParams;
use spillway_sketch::trace::{GenSpec, generate, rank_trace, to_csv_string};

fn spillway<S: AsRef<OsStr>>(args: &[S]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_spillway"))
        .args(args)
        .output()
        .expect("running spillway")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A 300-flow, 200-tick labelled trace of seed 7, written to `dir/trace.csv`.
fn small_trace(dir: &Path) -> PathBuf {
    let spec = GenSpec {
        flows: 300,
        ticks: 200,
        ..GenSpec::default()
    };
    let path = dir.join("trace.csv");
    std::fs::write(&path, to_csv_string(&generate(&spec, 7))).expect("writing the trace");
    path
}

/// Runs `rank --json` and returns the parsed list.
fn rank_json(trace: &Path, k: usize, at_tick: Option<u64>) -> Vec<Value> {
    let mut args: Vec<String> = vec![
        "stability".into(),
        "rank".into(),
        "--trace".into(),
        trace.display().to_string(),
        "--k".into(),
        k.to_string(),
        "--json".into(),
    ];
    if let Some(t) = at_tick {
        args.extend(["--at-tick".into(), t.to_string()]);
    }
    let o = spillway(&args);
    assert!(o.status.success(), "rank failed: {}", stderr(&o));
    let v: Value = serde_json::from_str(&stdout(&o)).expect("rank --json prints JSON");
    v.as_array().expect("a JSON list").clone()
}

fn flows_and_scores(list: &[Value]) -> Vec<(u64, f64)> {
    list.iter()
        .map(|o| {
            (
                o["flow_id"].as_u64().expect("flow_id is an integer"),
                o["score"].as_f64().expect("score is a number"),
            )
        })
        .collect()
}

#[test]
fn rank_json_lists_k_flows_by_score_descending_as_the_library_ranks_them() {
    let dir = tempfile::tempdir().expect("temp dir");
    let trace = small_trace(dir.path());
    let list = rank_json(&trace, 20, None);
    assert_eq!(list.len(), 20);
    for o in &list {
        let o = o.as_object().expect("each entry is an object");
        for key in ["flow_id", "score", "gain_bps", "instability"] {
            assert!(o.contains_key(key), "missing `{key}` in {o:?}");
        }
        let inst = o["instability"].as_f64().expect("a number");
        assert!((0.0..1.0).contains(&inst), "instability {inst}");
        let gain = o["gain_bps"].as_f64().expect("a number");
        let score = o["score"].as_f64().expect("a number");
        let e = spillway_sketch::classifier::StabilityParams::default().instability_exponent;
        assert!((score - gain * (1.0 - inst).powf(e)).abs() <= 1e-6 * gain.max(1.0));
    }
    let got = flows_and_scores(&list);
    assert!(
        got.windows(2).all(|w| w[0].1 >= w[1].1),
        "scores not descending: {got:?}"
    );
    // The same flows, in the same order, as the library's ranking of the same rows.
    let rows = generate(
        &GenSpec {
            flows: 300,
            ticks: 200,
            ..GenSpec::default()
        },
        7,
    );
    let r = rank_trace(
        rows.iter().map(|r| &r.row),
        None,
        &StabilityParams::default(),
    )
    .expect("ranks");
    let want: Vec<u64> = r.stability.iter().take(20).map(|s| s.flow).collect();
    let got_flows: Vec<u64> = got.iter().map(|(f, _)| *f).collect();
    assert_eq!(got_flows, want);
    // Deterministic: a second run prints the same list.
    assert_eq!(rank_json(&trace, 20, None), list);
}

#[test]
fn rank_table_explains_each_decision() {
    let dir = tempfile::tempdir().expect("temp dir");
    let trace = small_trace(dir.path());
    let o = spillway(&[
        "stability".as_ref(),
        "rank".as_ref(),
        "--trace".as_ref(),
        trace.as_os_str(),
        "--k".as_ref(),
        "3".as_ref(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("ranked at tick 199"), "{out}");
    let explained = out
        .lines()
        .filter(|l| l.trim_start().starts_with("flow ") && l.contains("x (1 - instability"))
        .count();
    assert_eq!(explained, 3, "one explanation per flow: {out}");
    assert!(out.contains("residual") && out.contains("drift"), "{out}");
}

#[test]
fn at_tick_changes_the_answer_and_a_tick_beyond_the_trace_is_an_error() {
    let dir = tempfile::tempdir().expect("temp dir");
    let trace = small_trace(dir.path());
    let end = flows_and_scores(&rank_json(&trace, 10, None));
    let early = flows_and_scores(&rank_json(&trace, 10, Some(60)));
    assert_eq!(early.len(), 10);
    assert_ne!(early, end, "ranking at tick 60 equals the end's");
    assert_eq!(
        flows_and_scores(&rank_json(&trace, 10, Some(199))),
        end,
        "--at-tick at the last tick is the default"
    );
    let o = spillway(&[
        "stability".as_ref(),
        "rank".as_ref(),
        "--trace".as_ref(),
        trace.as_os_str(),
        "--k".as_ref(),
        "10".as_ref(),
        "--at-tick".as_ref(),
        "500".as_ref(),
    ]);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert_eq!(err.lines().count(), 1, "one-line error: {err}");
    assert!(err.contains("trace.csv"), "{err}");
    assert!(
        err.contains("tick 500 is beyond the trace") && err.contains("0..=199"),
        "{err}"
    );
}

#[test]
fn malformed_csv_is_an_error_naming_the_file_line_and_column() {
    let dir = tempfile::tempdir().expect("temp dir");
    let cases: [(&str, &str); 4] = [
        (
            "flow_id,tick,bw_bps,pps,ctrl_ratio,jitter_us\n1,0,100,1,0,0\n2,0,1e6x,1,0,0\n",
            "line 3, column `bw_bps`: expected a finite number >= 0, got `1e6x`",
        ),
        (
            "tick,flow_id,ctrl_ratio,bw_bps,pps,jitter_us\r\n0,1,2,100,1,0\r\n",
            "line 2, column `ctrl_ratio`: expected a number in [0, 1], got `2`",
        ),
        (
            "flow_id,tick,bw_bps,pps,ctrl_ratio,jitter_us\n1,3,1,1,0,0\n1,2,1,1,0,0\n",
            "line 3, column `tick`: expected rows in tick order (at least 3), got 2",
        ),
        (
            "flow_id,tick,bw_bps,pps,jitter_us\n1,0,1,1,0\n",
            "line 1: expected a column `ctrl_ratio` in the header",
        ),
    ];
    for (i, (text, want)) in cases.iter().enumerate() {
        let path = dir.path().join(format!("bad{i}.csv"));
        std::fs::write(&path, text).expect("writing");
        let o = spillway(&[
            "stability".as_ref(),
            "rank".as_ref(),
            "--trace".as_ref(),
            path.as_os_str(),
            "--k".as_ref(),
            "5".as_ref(),
        ]);
        assert!(!o.status.success(), "case {i} accepted");
        let err = stderr(&o);
        assert!(err.contains(&format!("bad{i}.csv")), "case {i}: {err}");
        assert!(err.contains(want), "case {i}: {err}");
    }
    let missing = dir.path().join("absent.csv");
    let o = spillway(&[
        "stability".as_ref(),
        "rank".as_ref(),
        "--trace".as_ref(),
        missing.as_os_str(),
        "--k".as_ref(),
        "5".as_ref(),
    ]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("opening trace"), "{}", stderr(&o));
}

#[test]
fn gen_writes_the_librarys_trace_and_eval_reports_every_k() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("gen.csv");
    let o = spillway(&[
        "stability".as_ref(),
        "gen".as_ref(),
        "--seed".as_ref(),
        "5".as_ref(),
        "--flows".as_ref(),
        "120".as_ref(),
        "--ticks".as_ref(),
        "60".as_ref(),
        "--out".as_ref(),
        out.as_os_str(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let spec = GenSpec {
        flows: 120,
        ticks: 60,
        ..GenSpec::default()
    };
    let written = std::fs::read_to_string(&out).expect("gen wrote the file");
    assert_eq!(written, to_csv_string(&generate(&spec, 5)));

    let o = spillway(&[
        "stability",
        "eval",
        "--trace",
        out.to_str().expect("a UTF-8 temp path"),
        "--k",
        "5,10",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_str(&stdout(&o)).expect("eval --json prints JSON");
    let rows = v["rows"].as_array().expect("rows");
    let ks: Vec<u64> = rows.iter().map(|r| r["k"].as_u64().expect("k")).collect();
    assert_eq!(ks, vec![5, 10]);
    for r in rows {
        for ranking in ["stability", "bandwidth_only", "last_tick"] {
            let p = r[ranking]["precision"].as_f64().expect("precision");
            assert!((0.0..=1.0).contains(&p), "{ranking}: {p}");
        }
    }
    // An unlabelled trace cannot be evaluated.
    let plain = dir.path().join("plain.csv");
    std::fs::write(
        &plain,
        "flow_id,tick,bw_bps,pps,ctrl_ratio,jitter_us\n1,0,1,1,0,0\n",
    )
    .expect("writing");
    let o = spillway(&[
        "stability",
        "eval",
        "--trace",
        plain.to_str().expect("utf-8"),
    ]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("`class` column"), "{}", stderr(&o));
}

#[test]
fn families_reports_every_family_as_the_library_evaluates_it() {
    use spillway_sketch::trace::{Family, evaluate};
    let o = spillway(&[
        "stability",
        "families",
        "--seeds",
        "1",
        "--k",
        "100",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_str(&stdout(&o)).expect("families --json prints JSON");
    let list = v["families"].as_array().expect("families");
    let names: Vec<&str> = list
        .iter()
        .map(|f| f["family"].as_str().expect("name"))
        .collect();
    assert_eq!(names, vec!["uniform", "elephants", "pareto"]);
    for (f, family) in list.iter().zip(Family::ALL) {
        let role = if family == Family::Uniform {
            "tuned"
        } else {
            "held-out"
        };
        assert_eq!(f["role"], role);
        // One seed: median, min and max are that seed's figure, the library's.
        let spec = GenSpec::family(family);
        let e =
            evaluate(&generate(&spec, 1), &[100], &StabilityParams::default()).expect("evaluates");
        let p = &f["rows"][0]["stability_precision"];
        assert_eq!(p["median"].as_f64(), Some(e.rows[0].stability.precision));
        assert_eq!(p["min"], p["max"]);
        let b = &f["rows"][0]["bandwidth_only_precision"]["median"];
        assert_eq!(b.as_f64(), Some(e.rows[0].by_gain.precision));
    }
    // `eval --family` names the family and rejects an unknown one.
    let o = spillway(&["stability", "eval", "--family", "pareto", "--k", "10"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("family pareto"), "{}", stdout(&o));
    let o = spillway(&["stability", "eval", "--family", "gaussian"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("expected one of uniform"),
        "{}",
        stderr(&o)
    );
}
