//! Feeds arbitrary frames through the vSwitch pipeline configured with the shipped example
//! policy. The input is a sequence of records `[port selector, time step, len lo, len hi, bytes]`;
//! each frame enters on the uplink or one of the example's VM ports. After every frame the
//! pipeline's invariants (conservation, table bounds) must hold. Any panic is a bug.
#![no_main]

use libfuzzer_sys::fuzz_target;
use spillway_vswitch::conntrack::ConntrackConfig;
use spillway_vswitch::flow_table::FlowTableConfig;
use spillway_vswitch::pipeline::{Pipeline, PipelineConfig};
use spillway_vswitch::policy::Policy;
use spillway_vswitch::{Instant, PacketBuf, PortId};

const POLICY: &str = include_str!("../../examples/policy-basic.toml");
const PORTS: [u32; 5] = [0, 10, 11, 12, 20];

fuzz_target!(|data: &[u8]| {
    let policy = Policy::from_toml_str(POLICY, "policy-basic.toml").expect("example compiles");
    // Small tables: construction cost dominates short inputs, and small tables reach their
    // full behaviour (eviction, conntrack full) within one input.
    let cfg = PipelineConfig {
        flow_table: FlowTableConfig { capacity: 64, ..FlowTableConfig::default() },
        conntrack: ConntrackConfig { capacity: 32, ..ConntrackConfig::default() },
        ..PipelineConfig::default()
    };
    let mut pipeline = Pipeline::new(policy, cfg).expect("valid config");
    let mut now = 1u64;
    let mut rest = data;
    let mut buf = PacketBuf::default();
    while rest.len() >= 4 {
        let port = PortId(PORTS[rest[0] as usize % PORTS.len()]);
        now += u64::from(rest[1]) * 100_000_000;
        let len = usize::from(u16::from_le_bytes([rest[2], rest[3]])).min(rest.len() - 4);
        let frame = &rest[4..4 + len];
        rest = &rest[4 + len..];
        if buf.load(frame).is_ok() {
            pipeline.process(Instant(now), port, &mut buf);
        }
        pipeline.expire(Instant(now), 64);
        pipeline.check_invariants().expect("invariants hold");
    }
});
