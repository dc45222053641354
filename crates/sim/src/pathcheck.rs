//! Path equivalence on the real pipeline: the fabric model decides *where* a packet is served
//! (DPU fast path, DPU slow path, spill plane) but does not run the vSwitch on every simulated
//! packet. This checker does, on a sample: for a sampled train it takes a real frame of the
//! connection (VXLAN from a remote sender to a VM, from the `spillway_vswitch::workload` policy
//! with security groups and routes), and sends it three ways, through the same frame-level
//! nodes the real-time driver runs (`spillway_fabric::frame`):
//!
//! - the DPU hardware path: a bare `Pipeline` with flow entries installed and the fast path on
//!   (what the hardware table applies);
//! - the DPU alone: a `DpuSwitch` whose vSwitch has the fast path off (the SoC walks the policy
//!   for every packet) and no plane;
//! - through the spill plane: a `DpuSwitch` and a `PlaneSwitch` joined back to back
//!   (`frame::Pair`) with every redirect bucket live, so the frame is steered to the plane,
//!   processed by the plane's own vSwitch and sent on by the DPU, messages and conntrack
//!   snapshots crossing between them as over the real rings.
//!
//! The three must give the same verdict and the same output bytes: the invariant that makes
//! moving a connection between planes invisible to tenants.
//!
//! All three share one policy (one epoch), as the planes do after a sync. The frame of a train
//! is chosen by the connection's hash, so the same connection keeps the same frame and the
//! nodes see the connection repeatedly (first packet slow path, later packets flow entries).
//! The nodes run on their own clock, the simulator's time after the moment the pair became
//! active, and see one frame per check: their emulated limits are never the reason a frame is
//! lost here, and a frame a node drops for any reason but its vSwitch's is a failed check.

use spillway_fabric::frame::{CONNS_MAX, DpuSwitch, FrameDrop, Pair, PlaneSwitch};
use spillway_fabric::params::FabricParams;
use spillway_fabric::types::ConnId;
use spillway_vswitch::pipeline::{Pipeline, PipelineConfig};
use spillway_vswitch::policy::Policy;
use spillway_vswitch::workload::{UPLINK_PORT, Workload, WorkloadConfig};
use spillway_vswitch::{Instant, PacketBuf, PortId, Verdict};

/// The checker. See the module doc.
#[derive(Debug)]
pub struct PathCheck {
    w: Workload,
    hw: Pipeline,
    hw_buf: PacketBuf,
    alone: DpuSwitch,
    pair: Pair,
    /// When the pair became active: the nodes' clock is this plus the simulator's.
    t0: Instant,
    checks: u64,
}

/// What one way gave: the port the frame left by and its bytes, or the vSwitch's verdict.
type Way = Result<(PortId, Vec<u8>), String>;

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
        let fabric = FabricParams::default();
        let hw = Pipeline::new(policy.clone(), cfg.clone()).expect("valid pipeline config");
        let alone = DpuSwitch::new(&fabric, policy.clone(), soc_cfg, CONNS_MAX)
            .expect("valid pipeline config");
        let dpu =
            DpuSwitch::new(&fabric, policy, cfg.clone(), CONNS_MAX).expect("valid pipeline config");
        let plane =
            PlaneSwitch::new(&fabric, spill_policy, cfg, CONNS_MAX).expect("valid pipeline config");
        let mut pair = Pair::new(dpu, plane);
        let t0 = pair
            .activate(Instant::ZERO)
            .expect("a joined pair activates with the default parameters");
        PathCheck {
            w,
            hw,
            hw_buf: PacketBuf::with_capacity(2048),
            alone,
            pair,
            t0,
            checks: 0,
        }
    }

    /// Checks the frame of `conn` at `now` three ways.
    pub fn check(&mut self, now: Instant, conn: ConnId) -> Result<(), String> {
        let frames = self.w.uplink();
        let i = (conn.hash() % frames.len() as u64) as usize;
        let frame = frames.get(i);
        self.checks += 1;
        let t = Instant(self.t0.0 + now.0);
        self.hw_buf
            .load(frame)
            .expect("workload frames fit the buffer");
        let hw: Way = match self.hw.process(now, UPLINK_PORT, &mut self.hw_buf) {
            Verdict::Forward(p) => Ok((p, self.hw_buf.data().to_vec())),
            Verdict::Drop(r) => Err(format!("{r:?}")),
        };
        let alone: Way = match self.alone.process(t, UPLINK_PORT, 0, frame) {
            spillway_fabric::frame::Outcome::Forward { port, bytes, .. } => {
                Ok((port, bytes.to_vec()))
            }
            spillway_fabric::frame::Outcome::Drop(d) => Err(vswitch_drop(d)?),
            o => return Err(format!("path check: the DPU alone answered {o:?}")),
        };
        while self.alone.poll_transmit(t).is_some() {}
        self.pair.advance(t)?;
        let through = self.pair.process(t, UPLINK_PORT, frame)?;
        if !through.via_plane {
            return Err(format!(
                "path check: {conn} frame {i} was not steered to the active plane"
            ));
        }
        let spill: Way = match through.out {
            Ok((p, b)) => Ok((p, b.to_vec())),
            Err(d) => Err(vswitch_drop(d)?),
        };
        let name = |w: &Way| match w {
            Ok((p, _)) => format!("forward to {p:?}"),
            Err(r) => format!("drop {r}"),
        };
        let verdicts = [name(&hw), name(&alone), name(&spill)];
        if verdicts[0] != verdicts[1] || verdicts[0] != verdicts[2] {
            return Err(format!(
                "path equivalence: {conn} frame {i}: hw {}, soc {}, spill {}",
                verdicts[0], verdicts[1], verdicts[2]
            ));
        }
        if hw != alone || hw != spill {
            return Err(format!(
                "path equivalence: {conn} frame {i}: same verdict {}, different bytes",
                verdicts[0]
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

/// The vSwitch's reason for a node's drop; any other drop is not the vSwitch's verdict and
/// fails the check.
fn vswitch_drop(d: FrameDrop) -> Result<String, String> {
    match d {
        FrameDrop::Vswitch(r) => Ok(format!("{r:?}")),
        d => Err(format!(
            "path check: a node dropped the frame outside its vSwitch: {d:?}"
        )),
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
