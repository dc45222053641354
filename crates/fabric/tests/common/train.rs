//! A train of `packets` 64-byte packets of `conn`, tenant 1's, from its initiator toward the
//! wire: what the DPU node tests and benches offer it.

use spillway_fabric::types::{ConnId, Dest, Kind, Side, Train};
use spillway_vswitch::{Instant, TenantId};

pub fn train(conn: ConnId, kind: Kind, packets: u32, at: Instant) -> Train {
    Train {
        conn,
        tenant: TenantId(1),
        side: Side::Orig,
        dest: Dest::Wire,
        kind,
        packets,
        packet_bytes: 64,
        born: at,
        denied: false,
    }
}
