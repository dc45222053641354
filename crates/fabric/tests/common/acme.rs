//! The example policy's tenant "acme" (`examples/policy-basic.toml`): its two web servers'
//! ports, addresses and router, for the frame-node tests.

use std::net::Ipv4Addr;

use spillway_vswitch::policy::Policy;
use spillway_vswitch::{PortId, TenantId};
use spillway_wire::MacAddr;

pub const POLICY: &str = include_str!("../../../../examples/policy-basic.toml");
pub const WEB: PortId = PortId(10);
pub const WEB2: PortId = PortId(11);
pub const ACME: TenantId = TenantId(1);
pub const ACME_ROUTER: MacAddr = MacAddr([2, 0, 0, 0, 1, 1]);
pub const WEB_MAC: MacAddr = MacAddr([2, 0, 0, 1, 0, 0x0a]);
pub const WEB2_MAC: MacAddr = MacAddr([2, 0, 0, 1, 0, 0x0b]);
pub const WEB_IP: Ipv4Addr = Ipv4Addr::new(10, 1, 0, 10);
pub const WEB2_IP: Ipv4Addr = Ipv4Addr::new(10, 1, 0, 11);
pub const SYN: u8 = 0x02;
pub const ACK: u8 = 0x10;

/// The example policy.
pub fn policy() -> Policy {
    Policy::from_toml_str(POLICY, "examples/policy-basic.toml").expect("the example loads")
}
