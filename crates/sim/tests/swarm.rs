//! Seed swarm: 100 seeds, each a random workload mix, placement policy and fault schedule
//! (plane kills, control-channel loss, vNIC delays) in the safety phase, then a liveness phase
//! without faults; half the seeds split the DPU over two or three shards (ADR 0011). Every run must pass every checker after every event (conservation, table and
//! queue bounds, insertion budget, ownership, state continuity) and the end-of-run ownership
//! check. A failing seed prints the line that replays it. `SPILLWAY_SWARM_SEEDS=N` runs more;
//! `SPILLWAY_TRACE_CONN=N` traces one connection (in either swarm). A second swarm runs the same seeds' scenarios
//! with the newer workload shapes (periodic, bursty, random walk, random arrivals, exponential
//! lifetimes) and the threshold and stability policies drawn on top (`swarm::scenario_shaped`).

use spillway_sim::swarm;

/// A number from the environment, if set and valid.
fn env_opt(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// A number from the environment, or `default`.
fn env_u64(name: &str, default: u64) -> u64 {
    env_opt(name).unwrap_or(default)
}

#[test]
fn swarm_of_seeds_passes_every_checker() {
    let (n, base) = (
        env_u64("SPILLWAY_SWARM_SEEDS", 100),
        env_u64("SPILLWAY_SWARM_BASE", 0),
    );
    // `SPILLWAY_TRACE_CONN=N` prints every train and message of connection N (with a single
    // seed, to see how a failing one went wrong).
    let trace = env_opt("SPILLWAY_TRACE_CONN");
    let mut activated = 0;
    let mut faults = 0;
    for seed in base..base + n {
        let sc = swarm::scenario(seed);
        faults += sc.faults.len();
        let opts = spillway_sim::engine::RunOptions {
            seed,
            dpu_only: false,
            trace_conn: trace.map(spillway_fabric::types::ConnId),
            explain_conn: None,
        };
        let r = spillway_sim::run_with(&sc, opts, &mut |_| {}).unwrap_or_else(|e| {
            panic!(
                "seed {seed}: {e}\nrepro: SPILLWAY_SWARM_BASE={seed} SPILLWAY_SWARM_SEEDS=1 cargo test -p spillway-sim --test swarm"
            )
        });
        if r.activation_ms.is_some() {
            activated += 1;
        }
        assert_eq!(
            r.offered_packets,
            r.delivered_packets + r.drops.values().sum::<u64>(),
            "seed {seed}: conservation after the drain"
        );
    }
    eprintln!("{n} seeds: {activated} activated the plane, {faults} faults injected");
    // The swarm must exercise the fabric, not just the DPU.
    assert!(
        activated * 4 >= n as usize,
        "only {activated} of {n} seeds activated the plane"
    );
}

#[test]
fn shaped_swarm_passes_every_checker() {
    let (n, base) = (
        env_u64("SPILLWAY_SWARM_SEEDS", 50),
        env_u64("SPILLWAY_SWARM_BASE", 0),
    );
    let mut activated = 0;
    let mut threshold_recalled = 0;
    let mut stability_recalled = 0;
    let trace = env_opt("SPILLWAY_TRACE_CONN");
    for seed in base..base + n {
        let sc = swarm::scenario_shaped(seed);
        let opts = spillway_sim::engine::RunOptions {
            seed,
            dpu_only: false,
            trace_conn: trace.map(spillway_fabric::types::ConnId),
            explain_conn: None,
        };
        let r = spillway_sim::run_with(&sc, opts, &mut |_| {}).unwrap_or_else(|e| {
            panic!(
                "seed {seed}: {e}\nrepro: SPILLWAY_SWARM_BASE={seed} SPILLWAY_SWARM_SEEDS=1 cargo test -p spillway-sim --test swarm shaped"
            )
        });
        assert_eq!(
            r.offered_packets,
            r.delivered_packets + r.drops.values().sum::<u64>(),
            "seed {seed}: conservation after the drain"
        );
        if r.activation_ms.is_some() {
            activated += 1;
        }
        if r.placement == "threshold" && r.counters["dpu.recall.ok"] > 0 {
            threshold_recalled += 1;
        }
        if r.placement == "stability" && r.counters["dpu.recall.ok"] > 0 {
            stability_recalled += 1;
        }
    }
    eprintln!(
        "{n} shaped seeds: {activated} activated the plane, {threshold_recalled} recalled with the threshold policy, {stability_recalled} with the stability policy"
    );
    assert!(
        activated * 4 >= n as usize,
        "only {activated} of {n} seeds activated the plane"
    );
    // The threshold and stability policies' recalls go through the protocol too (some seeds
    // among the first 50 do).
    assert!(
        n < 50 || (threshold_recalled > 0 && stability_recalled > 0),
        "{threshold_recalled} threshold and {stability_recalled} stability recalls in {n} seeds"
    );
}

/// The standby swarm: the same seeds' workloads with a warm standby plane and a fault schedule
/// over every fault class, the warm plane's, stalls and upgrades included
/// (`swarm::scenario_standby`). Every checker runs (state continuity among them: a packet finds
/// no state only if its connection's opening packet was lost with a dead plane), and failovers
/// must happen. `spillway sim swarm --kind standby --seeds N` runs more.
#[test]
fn standby_swarm_passes_every_checker() {
    let (n, base) = (
        env_u64("SPILLWAY_SWARM_SEEDS", 100),
        env_u64("SPILLWAY_SWARM_BASE", 0),
    );
    let trace = env_opt("SPILLWAY_TRACE_CONN");
    let mut sum = swarm::SeedOutcome::default();
    let mut activated = 0;
    for seed in base..base + n {
        let o = swarm::run_seed(swarm::SwarmKind::Standby, seed, trace).unwrap_or_else(|e| {
            panic!(
                "seed {seed}: {e}\nrepro: spillway sim swarm --kind standby --base {seed} --seeds 1"
            )
        });
        activated += usize::from(o.activated);
        sum.add(&o);
    }
    eprintln!(
        "{n} standby seeds: {activated} activated, {} faults, {} failovers, {} fail-opens, {} upgrades",
        sum.faults, sum.failovers, sum.fail_opens, sum.upgrades
    );
    assert!(
        n < 50 || sum.failovers >= 5,
        "only {} failovers in {n} seeds",
        sum.failovers
    );
}
