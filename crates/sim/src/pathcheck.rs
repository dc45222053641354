//! Path equivalence on the real pipeline: the fabric model decides *where* a packet is served
//! (DPU fast path, DPU slow path, spill plane) but does not run the vSwitch on every simulated
//! packet. This checker does, on a sample: for a sampled train it takes a real frame of the
//! connection (VXLAN from a remote sender to a VM, from the `spillway_vswitch::workload` policy
//! with security groups and routes), and runs it through three real `Pipeline` instances that
//! stand for the three places: the DPU hardware path (flow entries installed, fast path on), the
//! DPU SoC (fast path off: every packet walks the policy), and the spill plane's own instance
//! (its own flow cache). The three must give the same verdict and the same output bytes: the
//! invariant that makes moving a connection between planes invisible to tenants.
//!
//! All three share one policy (one epoch), as the planes do after a sync. The frame of a train
//! is chosen by the connection's hash, so the same connection keeps the same frame and the
//! pipelines see the connection repeatedly (first packet slow path, later packets flow entries).

use spillway_fabric::types::ConnId;
use spillway_vswitch::pipeline::{Pipeline, PipelineConfig};
use spillway_vswitch::policy::Policy;
use spillway_vswitch::workload::{UPLINK_PORT, Workload, WorkloadConfig};
use spillway_vswitch::{Instant, PacketBuf, Verdict};

/// The checker. See the module doc.
#[derive(Debug)]
pub struct PathCheck {
    w: Workload,
    hw: Pipeline,
    soc: Pipeline,
    spill: Pipeline,
    bufs: [PacketBuf; 3],
    checks: u64,
}

impl PathCheck {
    /// Three pipelines over a small workload policy (256 flows, 8 VM ports, 16 security-group
    /// rules each, 64 routes).
    pub fn new(seed: u64) -> PathCheck {
        PathCheck::with_spill_policy(seed, |_| {})
    }

    /// Like [`PathCheck::new`], with the spill plane's policy edited by `edit` first (a plane
    /// whose policy sync went wrong; the tests use it to show the checker catches that).
    pub fn with_spill_policy(
        seed: u64,
        edit: impl FnOnce(&mut spillway_vswitch::policy::PolicyConfig),
    ) -> PathCheck {
        let w = Workload::new(WorkloadConfig {
            flows: 256,
            vm_ports: 8,
            sg_rules: 16,
            routes: 64,
            remote_vteps: 4,
            seed,
        })
        .expect("a valid small workload");
        let policy =
            Policy::compile(w.policy_config(), "pathcheck").expect("the workload policy compiles");
        let cfg = w.pipeline_config();
        let soc_cfg = PipelineConfig {
            fast_path: false,
            ..cfg.clone()
        };
        let mut spill_cfg = w.policy_config();
        edit(&mut spill_cfg);
        let spill_policy =
            Policy::compile(spill_cfg, "pathcheck-spill").expect("the edited policy compiles");
        let hw = Pipeline::new(policy.clone(), cfg.clone()).expect("valid pipeline config");
        let soc = Pipeline::new(policy, soc_cfg).expect("valid pipeline config");
        let spill = Pipeline::new(spill_policy, cfg).expect("valid pipeline config");
        let n = 2048;
        PathCheck {
            w,
            hw,
            soc,
            spill,
            bufs: [
                PacketBuf::with_capacity(n),
                PacketBuf::with_capacity(n),
                PacketBuf::with_capacity(n),
            ],
            checks: 0,
        }
    }

    /// Checks the frame of `conn` at `now` through the three pipelines.
    pub fn check(&mut self, now: Instant, conn: ConnId) -> Result<(), String> {
        let frames = self.w.uplink();
        let i = (conn.hash() % frames.len() as u64) as usize;
        let frame = frames.get(i);
        let mut v = [Verdict::Drop(spillway_vswitch::DropReason::PolicyDrop); 3];
        for (k, p) in [&mut self.hw, &mut self.soc, &mut self.spill]
            .into_iter()
            .enumerate()
        {
            self.bufs[k]
                .load(frame)
                .expect("workload frames fit the buffer");
            v[k] = p.process(now, UPLINK_PORT, &mut self.bufs[k]);
        }
        self.checks += 1;
        if v[0] != v[1] || v[0] != v[2] {
            return Err(format!(
                "path equivalence: {conn} frame {i}: hw {:?}, soc {:?}, spill {:?}",
                v[0], v[1], v[2]
            ));
        }
        if self.bufs[0].data() != self.bufs[1].data() || self.bufs[0].data() != self.bufs[2].data()
        {
            return Err(format!(
                "path equivalence: {conn} frame {i}: same verdict {:?}, different bytes",
                v[0]
            ));
        }
        Ok(())
    }

    /// Checks run.
    pub fn checks(&self) -> u64 {
        self.checks
    }

    /// Fast-path hits of the hardware-path pipeline (the check really exercised flow entries).
    pub fn hw_fast_path_hits(&self) -> u64 {
        self.hw.counters().fast_path_hits
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn three_planes_agree_on_the_same_policy_over_repeated_packets() {
        let mut p = PathCheck::new(7);
        for i in 0..2000u64 {
            p.check(Instant(i * 1000), ConnId(i % 300)).unwrap();
        }
        // Later packets of each connection took the hardware path's flow entries.
        assert!(p.hw_fast_path_hits() > 1000, "{}", p.hw_fast_path_hits());
    }

    #[test]
    fn a_plane_with_a_different_policy_is_caught() {
        // The spill plane lost the rule that admits the traffic (the last rule of each group).
        let mut p = PathCheck::with_spill_policy(7, |cfg| {
            for g in &mut cfg.security_groups {
                g.rules.pop();
            }
        });
        let e = (0..50u64)
            .find_map(|i| p.check(Instant(i), ConnId(i)).err())
            .expect("a divergent plane is detected");
        assert!(e.starts_with("path equivalence"), "{e}");
    }
}
