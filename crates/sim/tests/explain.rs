//! `spillway sim --explain CONN`: a connection's story names every move and its reason, and
//! asking for it changes nothing else in the run.

use spillway_fabric::types::ConnId;
use spillway_sim::engine::RunOptions;
use spillway_sim::scenario::Scenario;

fn run(explain: Option<u64>) -> spillway_sim::report::RunReport {
    let sc = Scenario::builtin("noisy-tenant").unwrap();
    let opts = RunOptions {
        seed: sc.seed,
        dpu_only: false,
        trace_conn: None,
        explain_conn: explain.map(ConnId),
    };
    spillway_sim::run_with(&sc, opts, &mut |_| {}).unwrap()
}

#[test]
fn a_shed_then_recalled_connection_tells_each_move_and_why() {
    // Connection 6000: one of the noisy tenant's flows opened at 2.4-3.4 s on the DPU, shed to
    // the plane when the fast path went over capacity, then recalled by first-come placement.
    let r = run(Some(6000));
    let story = r.explain.clone().expect("a story");
    for ch in &story {
        eprintln!("{:8.3} {:<14} {}", ch.at_s, ch.served_by, ch.what);
    }
    let places: Vec<&str> = story.iter().map(|c| c.served_by).collect();
    let at = |want: &str, from: usize| {
        places[from..]
            .iter()
            .position(|p| *p == want)
            .map(|i| i + from)
            .unwrap_or_else(|| panic!("no {want} after chapter {from}: {story:#?}"))
    };
    let opened = at("dpu slow path", 0);
    assert_eq!(story[opened].what, "opened");
    let hw = at("dpu hardware", opened);
    let plane = at("spill plane", hw);
    assert!(
        story[plane..]
            .iter()
            .any(|c| c.what.contains("fast path over capacity")),
        "the shed names the DPU's quota decision: {story:#?}"
    );
    let recalled = story
        .iter()
        .position(|c| c.what.contains("placement (first-come) recalls it"))
        .expect("a recall");
    assert!(recalled > plane);
    assert!(
        story[recalled..]
            .iter()
            .any(|c| c.served_by == "dpu hardware")
    );
    // Times never go back.
    assert!(
        story.windows(2).all(|w| w[0].at_s <= w[1].at_s),
        "{story:#?}"
    );
}

#[test]
fn the_story_changes_nothing_else_and_an_unknown_connection_says_so() {
    let plain = run(None);
    let told = run(Some(u64::MAX));
    assert!(plain.explain.is_none());
    assert_eq!(plain.counters, told.counters);
    assert_eq!(plain.lost_packets, told.lost_packets);
    let story = told.explain.unwrap();
    assert_eq!(story.len(), 1, "{story:#?}");
    assert!(story[0].what.contains("never offered"), "{story:#?}");
    // The JSON report has the story only when asked.
    let v = serde_json::to_value(&plain).unwrap();
    assert!(v.get("explain").is_none());
}
