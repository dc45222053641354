//! `spillway sim isolation` runs the isolation model end to end: `--json` has the baseline and
//! the four steps in the paper's order, the baseline's ratios are 1, each step costs the tenant
//! no more than the one before, the same seed prints the same document, and a bad flag is a
//! one-line error naming it.

use std::process::Output;

use serde_json::Value;

fn spillway(args: &[&str]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_spillway"))
        .args(args)
        .output()
        .expect("running spillway")
}

fn json(args: &[&str]) -> Value {
    let o = spillway(args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).expect("JSON")
}

#[test]
fn the_ladder_is_in_order_each_step_no_worse_and_the_same_seed_the_same() {
    let args = [
        "sim",
        "isolation",
        "--requests",
        "5000",
        "--seed",
        "4",
        "--json",
    ];
    let d = json(&args);
    let ladder = d["ladder"].as_array().unwrap();
    let steps: Vec<&str> = ladder.iter().map(|r| r["step"].as_str().unwrap()).collect();
    assert_eq!(
        steps,
        [
            "baseline (no plane)",
            "plane, no isolation",
            "pinned",
            "pinned + CAT",
            "pinned + CAT + MBA"
        ]
    );
    assert_eq!(ladder[0]["p99_ratio"], 1.0);
    assert_eq!(ladder[0]["effect"]["throughput_ratio"], 1.0);
    let p99 = |i: usize| ladder[i]["p99_ratio"].as_f64().unwrap();
    for i in 2..ladder.len() {
        assert!(p99(i) <= p99(i - 1), "{steps:?}: {}", d["ladder"]);
    }
    assert!(p99(4) >= 1.0, "{}", d["ladder"]);
    assert_eq!(d["p99_ratio_by_pps"].as_array().unwrap().len(), 5);
    assert_eq!(json(&args), d);
}

#[test]
fn a_bad_flag_is_an_error_naming_it() {
    for (flag, value) in [
        ("--tenant-load", "1.5"),
        ("--pps", "-1"),
        ("--cat-ways", "12"),
        ("--llc-mib", "0"),
    ] {
        let o = spillway(&["sim", "isolation", &format!("{flag}={value}")]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{flag} {value}");
        assert!(err.contains(flag), "{flag} {value}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
    }
}
