//! The DPU and the spill plane agree after a policy reload with `on_policy_change = "recheck"`.
//! Two real `Pipeline`s stand for the two planes (the DPU's SoC slow path with the fast path
//! off, the spill plane with its flow cache on), over the simulator's workload policy (VXLAN from
//! remote senders to local VMs, security groups, routes). They hold the same connections through
//! state sync (`export_conn` / `adopt_conn`), as after a bulk sync; then the reload lands as it
//! does in the real-time driver: the DPU first, and while the plane still runs the old policy it
//! serves packets of the connections it owns and syncs them back. The new policy drops the rule
//! that admits the traffic of every other VM. The test asserts that the DPU refuses the synced
//! connections its policy revokes (no resurrection), and that once both planes run the new
//! policy they give the same verdict and the same bytes for every packet, twice over (the cut
//! itself, then what follows it), with the same cut and drop counters; and that a snapshot of a
//! revoked connection taken under the old policy is refused by both planes afterwards.

use spillway_vswitch::pipeline::{AdoptError, Pipeline, PipelineConfig};
use spillway_vswitch::policy::{Policy, PolicyConfig};
use spillway_vswitch::workload::{UPLINK_PORT, Workload, WorkloadConfig};
use spillway_vswitch::{DropReason, Instant, PacketBuf, PortId, TenantId, Verdict};
use spillway_wire::{FlowKey, ParseOptions, parse_frame};

const TENANT: TenantId = TenantId(1);

fn ms(n: u64) -> Instant {
    Instant(n * 1_000_000)
}

fn run(p: &mut Pipeline, now: Instant, port: PortId, frame: &[u8]) -> (Verdict, Vec<u8>) {
    let mut buf = PacketBuf::from_frame(frame);
    let v = p.process(now, port, &mut buf);
    p.check_invariants().expect("pipeline invariants");
    (v, buf.data().to_vec())
}

/// The connection key of an uplink frame: its inner 5-tuple.
fn inner_key(frame: &[u8]) -> FlowKey {
    let p = parse_frame(frame, &ParseOptions::default()).expect("workload frames parse");
    p.inner.expect("VXLAN").key.expect("IP")
}

fn counter(p: &Pipeline, name: &str) -> u64 {
    p.counters()
        .iter()
        .chain(p.drops().iter())
        .find(|(n, _)| *n == name)
        .map_or(0, |(_, v)| v)
}

#[test]
fn dpu_and_spill_plane_agree_after_a_reload_with_recheck() {
    let w = Workload::new(WorkloadConfig {
        flows: 256,
        vm_ports: 8,
        sg_rules: 8,
        routes: 16,
        remote_vteps: 4,
        seed: 11,
    })
    .expect("a valid workload");
    let mut old: PolicyConfig = w.policy_config();
    old.tenants[0].on_policy_change = Some("recheck".into());
    let mut new = old.clone();
    // The last rule of each group admits the workload's traffic: every other VM loses it.
    for g in new.security_groups.iter_mut().step_by(2) {
        g.rules.pop();
    }
    let compile = |c: &PolicyConfig| Policy::compile(c.clone(), "reload").expect("compiles");
    let cfg = w.pipeline_config();
    let mut dpu = Pipeline::new(
        compile(&old),
        PipelineConfig {
            fast_path: false,
            ..cfg.clone()
        },
    )
    .expect("valid");
    let mut spill = Pipeline::new(compile(&old), cfg).expect("valid");
    let frames = w.uplink();
    let n = frames.len();

    // The DPU opens every connection; the plane holds copies (bulk sync).
    for i in 0..n {
        let (v, _) = run(&mut dpu, ms(1), UPLINK_PORT, frames.get(i));
        assert!(matches!(v, Verdict::Forward(_)), "flow {i}: {v:?}");
        let snap = dpu
            .export_conn(ms(1), TENANT, &inner_key(frames.get(i)))
            .expect("tracked");
        spill.adopt_conn(ms(1), &snap).expect("adopted");
    }

    // Reload, DPU first. The plane, still on the old policy, serves the odd flows it owns and
    // syncs them back: the DPU refuses the ones its new policy revokes.
    dpu.set_policy(compile(&new));
    let (mut refused, mut adopted) = (0, 0);
    for i in (1..n).step_by(2) {
        let (v, _) = run(&mut spill, ms(2), UPLINK_PORT, frames.get(i));
        assert!(matches!(v, Verdict::Forward(_)), "old epoch on the plane");
        let snap = spill
            .export_conn(ms(2), TENANT, &inner_key(frames.get(i)))
            .expect("tracked");
        match dpu.adopt_conn(ms(2), &snap) {
            Ok(()) => adopted += 1,
            Err(AdoptError::Revoked) => refused += 1,
            Err(e) => panic!("flow {i}: {e}"),
        }
    }
    assert!(
        refused > 0 && adopted > 0,
        "{refused} refused, {adopted} adopted"
    );
    spill.set_policy(compile(&new));

    // One policy on both planes: the same packet gets the same verdict and bytes on either.
    let mut revoked_flows = Vec::new();
    for pass in 0..2u64 {
        for i in 0..n {
            let now = ms(3 + pass);
            let (vd, bd) = run(&mut dpu, now, UPLINK_PORT, frames.get(i));
            let (vs, bs) = run(&mut spill, now, UPLINK_PORT, frames.get(i));
            assert_eq!(vd, vs, "pass {pass} flow {i}");
            assert_eq!(bd, bs, "pass {pass} flow {i}");
            if vd == Verdict::Drop(DropReason::PolicyRevoked) {
                assert_eq!(pass, 0, "a connection is cut once");
                revoked_flows.push(i);
            }
        }
        for (port, start, end) in w.reply_segments() {
            for i in start..end {
                let now = ms(5 + pass);
                let (vd, bd) = run(&mut dpu, now, port, w.replies().get(i));
                let (vs, bs) = run(&mut spill, now, port, w.replies().get(i));
                assert_eq!(vd, vs, "pass {pass} reply {i}");
                assert_eq!(bd, bs, "pass {pass} reply {i}");
            }
        }
    }
    let revoked = revoked_flows.len();
    assert!(revoked > 0 && revoked < n, "{revoked} of {n} revoked");
    for name in [
        "vswitch.policy.conn_cut",
        "vswitch.drop.policy_revoked",
        "vswitch.tx.forwarded",
        "vswitch.drop.sg_default_deny",
    ] {
        let (d, s) = (counter(&dpu, name), counter(&spill, name));
        // Before the plane reloaded, the DPU had forwarded every flow's first packet and the
        // plane the odd flows' packets: the rest agrees.
        if name == "vswitch.tx.forwarded" {
            assert_eq!(d - n as u64, s - n as u64 / 2, "{name}");
        } else {
            assert_eq!(d, s, "{name}");
        }
    }
    assert_eq!(counter(&dpu, "vswitch.policy.conn_cut"), revoked as u64);

    // A stale snapshot from before the reload resurrects nothing on either plane.
    let mut old_plane = Pipeline::new(compile(&old), w.pipeline_config()).expect("valid");
    for &i in &revoked_flows {
        let key = inner_key(frames.get(i));
        run(&mut old_plane, ms(7), UPLINK_PORT, frames.get(i));
        let snap = old_plane.export_conn(ms(7), TENANT, &key).expect("tracked");
        for p in [&mut dpu, &mut spill] {
            assert_eq!(p.adopt_conn(ms(7), &snap), Err(AdoptError::Revoked));
        }
    }
}
