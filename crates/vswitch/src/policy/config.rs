//! The serde form of the policy file: what TOML deserialises into and what code may build
//! directly. Addresses stay strings here so that [`super::Policy::compile`] can report a bad one
//! with its field path; the compiled [`super::Policy`] holds only parsed, validated values.

use super::sg::SgAction;
use crate::ids::Direction;
use serde::{Deserialize, Serialize};

/// The whole policy file. See the module doc of [`super`] for the schema.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyConfig {
    /// This host.
    pub host: HostSection,
    /// Tenants (VPCs), `[[tenant]]`.
    #[serde(default, rename = "tenant")]
    pub tenants: Vec<TenantSection>,
    /// VM ports, `[[port]]`.
    #[serde(default, rename = "port")]
    pub ports: Vec<PortSection>,
    /// Security groups, `[[security_group]]`.
    #[serde(default, rename = "security_group")]
    pub security_groups: Vec<SecurityGroupSection>,
}

/// `[host]`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostSection {
    /// PortId of the uplink; must not be a VM port's id.
    pub uplink_port: u32,
    /// The uplink's MAC, `02:00:00:00:00:01`.
    pub uplink_mac: String,
    /// This host's underlay address (VXLAN source), IPv4 or IPv6.
    pub vtep_ip: String,
    /// Underlay next-hop MAC for encapsulated and SNAT traffic.
    pub gateway_mac: String,
    /// VXLAN UDP destination port; 4789 (RFC 7348) when omitted.
    #[serde(default = "default_vxlan_port")]
    pub vxlan_port: u16,
    /// MTU of the uplink's link (IP bytes); 1500 when omitted. The overlay's MTU is this less
    /// the VXLAN overhead (50 bytes over an IPv4 underlay, 70 over IPv6).
    #[serde(default)]
    pub underlay_mtu: Option<u16>,
}

fn default_vxlan_port() -> u16 {
    4789
}

/// `[[tenant]]`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantSection {
    /// TenantId, unique.
    pub id: u32,
    /// Human-readable name (not required unique).
    #[serde(default)]
    pub name: String,
    /// VXLAN network id, unique, at most 2^24 - 1.
    pub vni: u32,
    /// The VPC's virtual router MAC, source MAC of routed frames.
    pub router_mac: String,
    /// CIDR blocks of the VPC; implicitly routed "local".
    #[serde(default)]
    pub subnets: Vec<String>,
    /// The VPC router's addresses (the guests' default gateways), each inside one of
    /// `subnets`; when omitted, the first host of each subnet (see `Policy` docs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub router_ips: Option<Vec<String>>,
    /// Source NAT for internet-bound traffic.
    #[serde(default)]
    pub snat: Option<SnatSection>,
    /// Routes, `[[tenant.route]]`.
    #[serde(default, rename = "route")]
    pub routes: Vec<RouteSection>,
    /// What a policy change does to the tenant's established connections: `"keep"` (the
    /// default) or `"recheck"`. A string here so that a bad value is reported with its field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_policy_change: Option<String>,
}

/// `snat = { public_ip, port_min, port_max }`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnatSection {
    /// The public address connections are translated to; unique across tenants.
    pub public_ip: String,
    /// First port (or ICMP id) of the pool; default 1024.
    #[serde(default = "default_port_min")]
    pub port_min: u16,
    /// Last port of the pool; default 65535.
    #[serde(default = "default_port_max")]
    pub port_max: u16,
}

fn default_port_min() -> u16 {
    1024
}

fn default_port_max() -> u16 {
    u16::MAX
}

/// `[[tenant.route]]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteSection {
    /// CIDR; host bits are cleared.
    pub prefix: String,
    /// Where matching traffic goes.
    pub target: RouteTargetSection,
}

/// A route target: `"local"`, `"internet"`, `"blackhole"` or `{ tunnel = "192.0.2.2" }`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RouteTargetSection {
    /// A VM on this host in the tenant's subnets.
    Local,
    /// VXLAN to the remote host VTEP at this address.
    Tunnel(String),
    /// SNAT to the tenant's public address and out of the underlay gateway.
    Internet,
    /// Drop.
    Blackhole,
}

/// `[[port]]`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PortSection {
    /// PortId, unique, not the uplink's.
    pub id: u32,
    /// The owning tenant's id.
    pub tenant: u32,
    /// The VM's MAC (anti-spoofing source MAC).
    pub mac: String,
    /// The VM's addresses, inside its tenant's subnets, unique within the tenant.
    #[serde(default)]
    pub ips: Vec<String>,
    /// Security group ids, evaluated together.
    #[serde(default)]
    pub security_groups: Vec<u32>,
    /// The largest IP packet the vSwitch delivers to this port; 1500 when omitted.
    #[serde(default)]
    pub mtu: Option<u16>,
}

/// `[[security_group]]`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecurityGroupSection {
    /// SecurityGroupId, unique.
    pub id: u32,
    /// The tenant the group belongs to; only that tenant's ports may use it.
    pub tenant: u32,
    /// Rules, `[[security_group.rule]]`; a rule's index here is the index reported in verdicts.
    #[serde(default, rename = "rule")]
    pub rules: Vec<RuleSection>,
}

/// `[[security_group.rule]]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleSection {
    /// `"ingress"` (toward the VM) or `"egress"` (from the VM).
    pub direction: Direction,
    /// Lower evaluates first.
    pub priority: u32,
    /// `"allow"` or `"deny"`.
    pub action: SgAction,
    /// `"tcp" | "udp" | "icmp" | "icmpv6" | "any"` or a protocol number; default any.
    #[serde(default = "default_protocol")]
    pub protocol: ProtocolSection,
    /// CIDR of the remote end, IPv4 or IPv6 (use `0.0.0.0/0` or `::/0` for anywhere).
    pub remote: String,
    /// Destination port `80`, `"80"` or `"8000-8099"`; TCP and UDP only; omitted = any.
    #[serde(default)]
    pub ports: Option<PortsSection>,
}

fn default_protocol() -> ProtocolSection {
    ProtocolSection::Name("any".to_string())
}

/// A protocol by name or number.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ProtocolSection {
    /// An IP protocol number, 0-255.
    Number(i64),
    /// `tcp`, `udp`, `icmp`, `icmpv6` or `any`.
    Name(String),
}

/// A destination port or range.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum PortsSection {
    /// One port.
    Number(i64),
    /// `"80"` or `"8000-8099"`.
    Text(String),
}
