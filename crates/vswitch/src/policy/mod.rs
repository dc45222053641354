//! The policy model: tenants (VPCs), VM ports, routes, security groups and SNAT, loaded from TOML,
//! validated, and compiled into an immutable [`Policy`] with fast classifiers.
//!
//! The slow path consults a [`Policy`] once per new connection (the fast path never does): which
//! tenant owns a VNI or port, where a destination routes ([`Policy::route`], longest-prefix match,
//! see [`lpm`]), and whether security groups admit the connection ([`Policy::sg_evaluate`], see
//! [`sg`]). A policy never changes after [`Policy::compile`]; the pipeline swaps in a new one and
//! bumps the [`crate::Epoch`]. SNAT port state is mutable and lives outside, in [`SnatPools`].
//!
//! # Schema
//!
//! Unknown fields anywhere are errors. Addresses are IPv4 dotted or IPv6; IPv4 and IPv6 never
//! match each other. Prefixes are `address/length`; host bits are allowed and cleared.
//!
//! ```toml
//! [host]
//! uplink_port = 0                    # PortId of the uplink (no VM port may reuse it)
//! uplink_mac = "02:00:00:00:00:01"
//! vtep_ip = "192.0.2.1"              # this host's underlay address, VXLAN source
//! gateway_mac = "02:00:00:00:00:fe"  # underlay next hop for encapsulated and SNAT traffic
//! vxlan_port = 4789                  # optional, default 4789
//! underlay_mtu = 1500                # optional, default 1500: the uplink link's MTU; the
//!                                    # overlay's is 50 less (70 over an IPv6 underlay).
//!                                    # 576..=9216 (1280.. over IPv6); with IPv6 tenants the
//!                                    # overlay's must be at least 1280
//!
//! [[tenant]]
//! id = 1                             # unique
//! name = "acme"                      # optional
//! vni = 1001                         # unique, <= 16777215
//! router_mac = "02:00:00:00:01:01"   # the VPC router's MAC (source MAC of routed frames)
//! subnets = ["10.1.0.0/16", "fd00:1::/64"]   # implicitly routed "local"
//! router_ips = ["10.1.0.1", "fd00:1::1"]     # optional: the guests' gateway addresses, each
//!                                    # inside a subnet, no repeats; default: the first host
//!                                    # of each subnet (network + 1) that has at least two
//!                                    # host bits (none for /31, /32, /127, /128)
//! snat = { public_ip = "203.0.113.10", port_min = 1024, port_max = 65535 }
//!                                    # optional; 1 <= port_min <= port_max, default
//!                                    # 1024/65535 (port 0 is not a source port);
//!                                    # public_ip unique across tenants
//! on_policy_change = "keep"          # optional: "keep" (default) leaves established
//!                                    # connections alone when the policy changes;
//!                                    # "recheck" cuts those the new security groups
//!                                    # would not admit (see crate::pipeline)
//! [[tenant.route]]
//! prefix = "10.2.0.0/16"             # unique within the tenant, subnets included
//! target = { tunnel = "192.0.2.2" }  # remote host VTEP
//! [[tenant.route]]
//! prefix = "0.0.0.0/0"
//! target = "internet"                # or "local", "blackhole"
//!
//! [[port]]
//! id = 10                            # unique, != host.uplink_port
//! tenant = 1                         # a defined tenant
//! mac = "02:00:00:01:00:0a"          # unicast, not all zeros, unique among ports, not
//!                                    # host.uplink_mac, host.gateway_mac or a router_mac
//! ips = ["10.1.0.10", "fd00:1::10"]  # inside the tenant's subnets, unique within the tenant
//! security_groups = [1]              # groups of the same tenant, no repeats
//! mtu = 1500                         # optional, default 1500: largest IP packet delivered
//!                                    # to the port, 68..=9216 (1280.. with an IPv6 address)
//!
//! [[security_group]]
//! id = 1                             # unique
//! tenant = 1
//! [[security_group.rule]]            # its index in this list is the rule number in verdicts
//! direction = "ingress"              # relative to the VM: "ingress" or "egress"
//! priority = 100                     # lower first; ties by group id, then rule index
//! action = "allow"                   # or "deny"
//! protocol = "tcp"                   # tcp | udp | icmp | icmpv6 | any | 0-255; default any
//! remote = "0.0.0.0/0"               # remote end: source for ingress, destination for egress
//! ports = "80"                       # 80, "80" or "8000-8099"; tcp/udp only; omitted = any
//! ```
//!
//! Security groups are stateful: only a connection's first packet is evaluated (and, for a
//! tenant with `on_policy_change = "recheck"`, the connection again after a policy change). All rules of
//! all the port's groups are searched in precedence order, the first match wins, and with no
//! match ingress is denied and egress allowed. `icmp` matches protocol 1 only and `icmpv6`
//! protocol 58 only, any type. At most [`sg::RULES_PER_PORT_MAX`] rules per port.
//!
//! # Example
//!
//! ```
//! use spillway_vswitch::policy::{Policy, RouteTarget};
//! use spillway_vswitch::TenantId;
//! let text = r#"
//! [host]
//! uplink_port = 0
//! uplink_mac = "02:00:00:00:00:01"
//! vtep_ip = "192.0.2.1"
//! gateway_mac = "02:00:00:00:00:fe"
//! [[tenant]]
//! id = 1
//! vni = 1001
//! router_mac = "02:00:00:00:01:01"
//! subnets = ["10.1.0.0/16"]
//! [[tenant.route]]
//! prefix = "0.0.0.0/0"
//! target = "blackhole"
//! "#;
//! let policy = Policy::from_toml_str(text, "inline.toml").unwrap();
//! let dst = "10.1.2.3".parse().unwrap();
//! assert_eq!(policy.route(TenantId(1), dst), Some(RouteTarget::Local));
//! ```
//!
//! Just over 1,000 lines because about a hundred of them are this module doc, the policy
//! format's worked example; the compiled policy's code is about 900.

pub mod config;
pub mod diag;
mod error;
pub mod lpm;
pub mod prefix;
pub mod sg;
pub mod snat;
#[cfg(test)]
mod tests;

pub use config::{
    HostSection, PolicyConfig, PortSection, PortsSection, ProtocolSection, RouteSection,
    RouteTargetSection, RuleSection, SecurityGroupSection, SnatSection, TenantSection,
};
pub use diag::{TomlPlace, bounded, describe, echo, toml_place_at, toml_place_of};
pub use error::ConfigError;
pub use lpm::LpmTable;
pub use prefix::{Family, Prefix};
pub use sg::{RULES_PER_PORT_MAX, SgAction, SgClassifier, SgDecision, SgRule};
pub use snat::{SnatError, SnatPool, SnatPools};

use crate::ids::{Direction, PortId, SecurityGroupId, TenantId};
use spillway_wire::{Decap, FlowKey, IpAddr16, MacAddr, Vni, ip_proto};
use std::collections::BTreeMap;
use std::path::Path;

type FixedMap<K, V> = hashbrown::HashMap<K, V, foldhash::fast::FixedState>;

/// This host's identity on the underlay.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostConfig {
    /// The uplink port.
    pub uplink_port: PortId,
    /// The uplink's MAC.
    pub uplink_mac: MacAddr,
    /// This host's VTEP address, the VXLAN outer source.
    pub vtep_ip: IpAddr16,
    /// Underlay next hop for encapsulated and SNAT traffic.
    pub gateway_mac: MacAddr,
    /// VXLAN UDP destination port.
    pub vxlan_port: u16,
    /// MTU of the uplink's link: the largest IP packet the underlay carries.
    pub underlay_mtu: u16,
}

impl HostConfig {
    /// What a frame arriving on `ingress` may be decapsulated as: VXLAN to our VTEP on the
    /// uplink, nothing on a VM port (a tenant's UDP to the VXLAN port is its own traffic).
    pub fn decap_at(&self, ingress: PortId) -> Decap {
        if ingress == self.uplink_port {
            Decap::Vxlan {
                port: self.vxlan_port,
                vtep: self.vtep_ip,
            }
        } else {
            Decap::Off
        }
    }

    /// The largest inner IP packet the overlay carries: the underlay MTU less the VXLAN
    /// encapsulation (outer IP, UDP, VXLAN and the inner Ethernet header).
    pub fn overlay_mtu(&self) -> u16 {
        let overhead = if self.vtep_ip.is_v4() {
            spillway_wire::build::VXLAN_V4_OVERHEAD
        } else {
            spillway_wire::build::VXLAN_V6_OVERHEAD
        };
        self.underlay_mtu.saturating_sub(overhead as u16)
    }
}

/// Largest MTU a port or the underlay may have: jumbo frames, as far as NICs commonly go.
pub const MTU_MAX: u16 = 9216;

/// The MTU when the config names none.
pub const MTU_DEFAULT: u16 = 1500;

/// IPv6's minimum link MTU (RFC 8200 section 5).
const MTU_MIN_V6: u16 = 1280;

/// A tenant's SNAT address and port range (inclusive).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SnatRange {
    /// The public source address of translated connections.
    pub public_ip: IpAddr16,
    /// First port (or ICMP id).
    pub port_min: u16,
    /// Last port; `port_min <= port_max`.
    pub port_max: u16,
}

/// Where a route sends traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RouteTarget {
    /// A VM port on this host (the destination is looked up with [`Policy::port_by_ip`]).
    Local,
    /// VXLAN-encapsulate to a remote host's VTEP with the tenant's VNI.
    Tunnel {
        /// The remote VTEP's underlay address.
        vtep: IpAddr16,
    },
    /// SNAT to the tenant's public address and send to the underlay gateway.
    Internet,
    /// Drop ([`crate::DropReason::Blackhole`]).
    Blackhole,
}

/// One route of a tenant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Route {
    /// Destination prefix.
    pub prefix: Prefix,
    /// Where it goes.
    pub target: RouteTarget,
}

/// A tenant (one VPC).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tenant {
    /// Its id, also the conntrack zone.
    pub id: TenantId,
    /// Display name.
    pub name: String,
    /// Its VXLAN network id.
    pub vni: Vni,
    /// The VPC router's MAC.
    pub router_mac: MacAddr,
    /// SNAT for internet routes, if configured.
    pub snat: Option<SnatRange>,
    /// Subnets (routed local), in config order.
    pub subnets: Vec<Prefix>,
    /// The router's addresses, which the neighbour responder answers for with `router_mac`
    /// (see [`crate::neigh`]): `router_ips` as configured, or the first host of each subnet.
    pub router_ips: Vec<IpAddr16>,
    /// Explicit routes, in config order.
    pub routes: Vec<Route>,
    /// What a policy change does to its established connections.
    pub on_policy_change: OnPolicyChange,
}

/// What a policy change does to a tenant's established connections (`on_policy_change`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum OnPolicyChange {
    /// `"keep"`: security groups are stateful; an established connection is never judged
    /// again, also when the rule that admitted it is gone.
    #[default]
    Keep,
    /// `"recheck"`: an established connection is judged again under the new security groups,
    /// as its first packet would be, and cut when they no longer admit it.
    Recheck,
}

impl OnPolicyChange {
    /// Every mode with its name in the policy file.
    pub const NAMES: [(&'static str, OnPolicyChange); 2] = [
        ("keep", OnPolicyChange::Keep),
        ("recheck", OnPolicyChange::Recheck),
    ];
}

/// A VM's vNIC port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VmPort {
    /// Its id.
    pub id: PortId,
    /// The owning tenant.
    pub tenant: TenantId,
    /// The VM's MAC.
    pub mac: MacAddr,
    /// The VM's addresses.
    pub ips: Vec<IpAddr16>,
    /// Its security groups, in config order.
    pub groups: Vec<SecurityGroupId>,
    /// The largest IP packet delivered to it; larger ones routed to it are refused with
    /// ICMP fragmentation-needed / packet-too-big (see [`crate::router`]).
    pub mtu: u16,
}

/// A security group as compiled (rules in config order; `rules[i].index == i`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SecurityGroup {
    /// Its id.
    pub id: SecurityGroupId,
    /// The owning tenant.
    pub tenant: TenantId,
    /// Its rules.
    pub rules: Vec<SgRule>,
}

/// The compiled, immutable policy. Lookups take `&self`, never allocate and are deterministic.
#[derive(Clone, Debug)]
pub struct Policy {
    host: HostConfig,
    /// Sorted by id.
    tenants: Vec<Tenant>,
    tenant_index: FixedMap<TenantId, usize>,
    vni_index: FixedMap<Vni, TenantId>,
    /// Per tenant, aligned with `tenants`.
    routes: Vec<LpmTable<RouteTarget>>,
    /// Sorted by id.
    ports: Vec<VmPort>,
    port_index: FixedMap<PortId, usize>,
    ip_index: FixedMap<(TenantId, IpAddr16), PortId>,
    snat_index: FixedMap<IpAddr16, TenantId>,
    /// Sorted by id.
    groups: Vec<SecurityGroup>,
    /// Per port (aligned with `ports`), the index of its classifier in `classifiers`.
    port_classifier: Vec<usize>,
    /// One per distinct list of groups.
    classifiers: Vec<SgClassifier>,
}

impl Policy {
    /// Parse and compile TOML text; `source` names it in errors (usually the file name).
    pub fn from_toml_str(text: &str, source: &str) -> Result<Policy, ConfigError> {
        let cfg: PolicyConfig =
            toml::from_str(text).map_err(|e| ConfigError::from_toml(source, text, &e))?;
        Policy::compile(cfg, source)
    }

    /// Read, parse and compile a policy file.
    pub fn load(path: &Path) -> Result<Policy, ConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            file: file.clone(),
            source,
        })?;
        Policy::from_toml_str(&text, &file)
    }

    /// Validate and compile a configuration built in code or deserialised.
    pub fn compile(cfg: PolicyConfig, source: &str) -> Result<Policy, ConfigError> {
        Compiler { file: source }.compile(cfg)
    }

    /// This host.
    pub fn host(&self) -> &HostConfig {
        &self.host
    }

    /// What a policy change does to `tenant`'s established connections (`Keep` for an unknown
    /// tenant).
    pub fn on_policy_change(&self, tenant: TenantId) -> OnPolicyChange {
        self.tenant(tenant)
            .map_or(OnPolicyChange::Keep, |t| t.on_policy_change)
    }

    /// A tenant by id.
    pub fn tenant(&self, id: TenantId) -> Option<&Tenant> {
        self.tenant_index.get(&id).map(|&i| &self.tenants[i])
    }

    /// All tenants in id order.
    pub fn tenants(&self) -> &[Tenant] {
        &self.tenants
    }

    /// The tenant owning a VNI.
    pub fn tenant_by_vni(&self, vni: Vni) -> Option<TenantId> {
        self.vni_index.get(&vni).copied()
    }

    /// A VM port by id (the uplink is not a VM port).
    pub fn port(&self, id: PortId) -> Option<&VmPort> {
        self.port_index.get(&id).map(|&i| &self.ports[i])
    }

    /// All VM ports in id order.
    pub fn ports(&self) -> &[VmPort] {
        &self.ports
    }

    /// The VM port holding `ip` in a tenant.
    pub fn port_by_ip(&self, tenant: TenantId, ip: IpAddr16) -> Option<PortId> {
        self.ip_index.get(&(tenant, ip)).copied()
    }

    /// The tenant whose SNAT public address is `ip` (to steer return traffic).
    pub fn is_snat_address(&self, ip: IpAddr16) -> Option<TenantId> {
        self.snat_index.get(&ip).copied()
    }

    /// A security group by id.
    pub fn security_group(&self, id: SecurityGroupId) -> Option<&SecurityGroup> {
        self.groups
            .binary_search_by_key(&id, |g| g.id)
            .ok()
            .map(|i| &self.groups[i])
    }

    /// Longest-prefix match over the tenant's routes and subnets (subnets are `Local`). `None`
    /// for an unknown tenant or no matching prefix.
    #[inline]
    pub fn route(&self, tenant: TenantId, dst: IpAddr16) -> Option<RouteTarget> {
        let &i = self.tenant_index.get(&tenant)?;
        self.routes[i].lookup(dst)
    }

    /// Evaluate the port's security groups for a connection's first packet travelling in `dir`
    /// (relative to the VM). An unknown port is denied (`DefaultDeny`) in both directions.
    #[inline]
    pub fn sg_evaluate(&self, port: PortId, dir: Direction, key: &FlowKey) -> SgDecision {
        match self.port_index.get(&port) {
            Some(&i) => self.classifiers[self.port_classifier[i]].evaluate(dir, key),
            None => SgDecision::DefaultDeny,
        }
    }

    /// Number of distinct compiled security-group classifiers and their total heap bytes.
    pub fn sg_memory(&self) -> (usize, usize) {
        (
            self.classifiers.len(),
            self.classifiers
                .iter()
                .map(SgClassifier::memory_bytes)
                .sum(),
        )
    }
}

/// Validation and compilation, carrying the source name for errors.
struct Compiler<'a> {
    file: &'a str,
}

const MAC_EXPECTED: &str = "a MAC address like 02:00:00:00:00:01";
const IP_EXPECTED: &str = "an IPv4 or IPv6 address like 10.0.0.1 or fd00::1";
const PREFIX_EXPECTED: &str = "a CIDR prefix like 10.0.0.0/16 or fd00::/64";

impl Compiler<'_> {
    fn invalid(&self, field: String, expected: &str, found: impl std::fmt::Display) -> ConfigError {
        ConfigError::Invalid {
            file: self.file.to_string(),
            field,
            expected: expected.to_string(),
            // Callers echo input with `diag::echo`; this bounds anything else they format.
            found: diag::bounded(&found.to_string(), diag::MESSAGE_CHARS_MAX).into_owned(),
        }
    }

    fn duplicate(
        &self,
        field: String,
        what: &'static str,
        value: impl std::fmt::Display,
        first: &str,
    ) -> ConfigError {
        ConfigError::Duplicate {
            file: self.file.to_string(),
            field,
            what,
            value: value.to_string(),
            first: first.to_string(),
        }
    }

    fn mac(&self, field: String, s: &str, unicast: bool) -> Result<MacAddr, ConfigError> {
        match s.parse::<MacAddr>() {
            Ok(m) if unicast && m.is_multicast() => Err(self.invalid(
                field,
                "a unicast MAC address (first octet even)",
                diag::echo(s),
            )),
            // 00:00:00:00:00:00 is no station's address: frames to it go nowhere.
            Ok(m) if m == MacAddr::ZERO => Err(self.invalid(
                field,
                "a MAC address other than 00:00:00:00:00:00",
                diag::echo(s),
            )),
            Ok(m) => Ok(m),
            Err(()) => Err(self.invalid(field, MAC_EXPECTED, diag::echo(s))),
        }
    }

    fn ip(&self, field: String, s: &str) -> Result<IpAddr16, ConfigError> {
        s.parse::<IpAddr16>()
            .map_err(|_| self.invalid(field, IP_EXPECTED, diag::echo(s)))
    }

    fn prefix(&self, field: String, s: &str) -> Result<Prefix, ConfigError> {
        use prefix::PrefixParseError as E;
        s.parse::<Prefix>().map_err(|e| {
            let expected = match e {
                E::Syntax => PREFIX_EXPECTED,
                E::Length => "a prefix length of at most 32 (IPv4) or 128 (IPv6)",
                E::MappedV6 => "an IPv6 prefix outside ::ffff:0:0/96 (write IPv4 prefixes dotted)",
            };
            self.invalid(field, expected, diag::echo(s))
        })
    }

    fn compile(&self, cfg: PolicyConfig) -> Result<Policy, ConfigError> {
        let host = HostConfig {
            uplink_port: PortId(cfg.host.uplink_port),
            uplink_mac: self.mac("host.uplink_mac".into(), &cfg.host.uplink_mac, true)?,
            vtep_ip: self.ip("host.vtep_ip".into(), &cfg.host.vtep_ip)?,
            gateway_mac: self.mac("host.gateway_mac".into(), &cfg.host.gateway_mac, true)?,
            vxlan_port: cfg.host.vxlan_port,
            underlay_mtu: cfg.host.underlay_mtu.unwrap_or(MTU_DEFAULT),
        };
        if host.vxlan_port == 0 {
            return Err(self.invalid("host.vxlan_port".into(), "a UDP port 1-65535", 0));
        }
        let underlay_min = if host.vtep_ip.is_v4() {
            576
        } else {
            MTU_MIN_V6
        };
        if !(underlay_min..=MTU_MAX).contains(&host.underlay_mtu) {
            return Err(self.invalid(
                "host.underlay_mtu".into(),
                &format!("an MTU in {underlay_min}..={MTU_MAX}"),
                host.underlay_mtu,
            ));
        }

        let (tenants, routes, snat_index) = self.tenants(&cfg.tenants)?;
        // IPv6 needs 1280 bytes on every link (RFC 8200 section 5), the overlay included.
        if host.overlay_mtu() < MTU_MIN_V6
            && let Some(t) = tenants
                .iter()
                .find(|t| t.subnets.iter().any(|n| !n.network().is_v4()))
        {
            let min = host.underlay_mtu - host.overlay_mtu() + MTU_MIN_V6;
            return Err(self.invalid(
                "host.underlay_mtu".into(),
                &format!(
                    "at least {min}: tenant {} has IPv6 subnets, and the overlay must carry 1280-byte IPv6 packets",
                    t.id.0
                ),
                host.underlay_mtu,
            ));
        }
        // Encapsulation needs both VTEPs in one family: the outer header is IPv4 or IPv6.
        for (ti, t) in tenants.iter().enumerate() {
            for (ri, r) in t.routes.iter().enumerate() {
                if let RouteTarget::Tunnel { vtep } = r.target
                    && vtep.is_v4() != host.vtep_ip.is_v4()
                {
                    let family = if host.vtep_ip.is_v4() { "IPv4" } else { "IPv6" };
                    return Err(self.invalid(
                        format!("tenant[{ti}].route[{ri}].target.tunnel"),
                        &format!("an {family} VTEP address, like host.vtep_ip"),
                        vtep,
                    ));
                }
            }
        }
        let mut tenant_index = FixedMap::default();
        let mut vni_index = FixedMap::default();
        for (i, t) in tenants.iter().enumerate() {
            tenant_index.insert(t.id, i);
            vni_index.insert(t.vni, t.id);
        }
        let groups = self.groups(&cfg.security_groups, &tenant_index)?;
        let (ports, ip_index) = self.ports(&cfg.ports, &host, &tenants, &tenant_index, &groups)?;

        // One classifier per distinct group list, shared by every port with that list.
        let mut by_list: BTreeMap<Vec<SecurityGroupId>, usize> = BTreeMap::new();
        let mut classifiers = Vec::new();
        let mut port_classifier = Vec::with_capacity(ports.len());
        for p in &ports {
            let next = classifiers.len();
            let idx = *by_list.entry(p.groups.clone()).or_insert(next);
            if idx == next {
                let rules: Vec<SgRule> = p
                    .groups
                    .iter()
                    .flat_map(|g| {
                        let i = groups
                            .binary_search_by_key(g, |x| x.id)
                            .expect("port groups validated to exist");
                        groups[i].rules.iter().copied()
                    })
                    .collect();
                classifiers.push(SgClassifier::build(&rules));
            }
            port_classifier.push(idx);
        }
        let mut port_index = FixedMap::default();
        for (i, p) in ports.iter().enumerate() {
            port_index.insert(p.id, i);
        }
        Ok(Policy {
            host,
            tenants,
            tenant_index,
            vni_index,
            routes,
            ports,
            port_index,
            ip_index,
            snat_index,
            groups,
            port_classifier,
            classifiers,
        })
    }

    #[allow(clippy::type_complexity)]
    fn tenants(
        &self,
        cfg: &[TenantSection],
    ) -> Result<
        (
            Vec<Tenant>,
            Vec<LpmTable<RouteTarget>>,
            FixedMap<IpAddr16, TenantId>,
        ),
        ConfigError,
    > {
        let mut ids: BTreeMap<u32, String> = BTreeMap::new();
        let mut vnis: BTreeMap<u32, String> = BTreeMap::new();
        let mut snat_ips: BTreeMap<IpAddr16, String> = BTreeMap::new();
        let mut snat_index = FixedMap::default();
        let mut out: Vec<(Tenant, LpmTable<RouteTarget>)> = Vec::with_capacity(cfg.len());
        for (ti, t) in cfg.iter().enumerate() {
            let at = format!("tenant[{ti}]");
            if let Some(first) = ids.insert(t.id, format!("{at}.id")) {
                return Err(self.duplicate(format!("{at}.id"), "tenant id", t.id, &first));
            }
            let vni = Vni::new(t.vni).ok_or_else(|| {
                self.invalid(
                    format!("{at}.vni"),
                    "a VNI of at most 16777215 (2^24 - 1)",
                    t.vni,
                )
            })?;
            if let Some(first) = vnis.insert(t.vni, format!("{at}.vni")) {
                return Err(self.duplicate(format!("{at}.vni"), "VNI", t.vni, &first));
            }
            let router_mac = self.mac(format!("{at}.router_mac"), &t.router_mac, true)?;

            // Subnets and routes share one prefix namespace: a prefix may appear once.
            let mut seen: BTreeMap<Prefix, String> = BTreeMap::new();
            let mut entries: Vec<(Prefix, RouteTarget)> = Vec::new();
            let mut subnets = Vec::with_capacity(t.subnets.len());
            for (si, s) in t.subnets.iter().enumerate() {
                let field = format!("{at}.subnets[{si}]");
                let p = self.prefix(field.clone(), s)?;
                if let Some(first) = seen.insert(p, field.clone()) {
                    return Err(self.duplicate(field, "prefix", p, &first));
                }
                subnets.push(p);
                entries.push((p, RouteTarget::Local));
            }
            let router_ips = self.router_ips(&at, t, &subnets)?;
            let mut routes = Vec::with_capacity(t.routes.len());
            for (ri, r) in t.routes.iter().enumerate() {
                let field = format!("{at}.route[{ri}].prefix");
                let p = self.prefix(field.clone(), &r.prefix)?;
                if let Some(first) = seen.insert(p, field.clone()) {
                    return Err(self.duplicate(field, "prefix", p, &first));
                }
                let target = match &r.target {
                    RouteTargetSection::Local => RouteTarget::Local,
                    RouteTargetSection::Internet => RouteTarget::Internet,
                    RouteTargetSection::Blackhole => RouteTarget::Blackhole,
                    RouteTargetSection::Tunnel(ip) => RouteTarget::Tunnel {
                        vtep: self.ip(format!("{at}.route[{ri}].target.tunnel"), ip)?,
                    },
                };
                routes.push(Route { prefix: p, target });
                entries.push((p, target));
            }

            let snat = match &t.snat {
                None => None,
                Some(s) => {
                    let public_ip = self.ip(format!("{at}.snat.public_ip"), &s.public_ip)?;
                    // Port 0 is not a valid source port (RFC 768/9293 reserve it), so a pool
                    // that hands it out translates connections into unanswerable ones.
                    if s.port_min == 0 || s.port_min > s.port_max {
                        return Err(self.invalid(
                            format!("{at}.snat.port_min"),
                            &format!("a port in 1..=port_max ({})", s.port_max),
                            s.port_min,
                        ));
                    }
                    let field = format!("{at}.snat.public_ip");
                    if let Some(first) = snat_ips.insert(public_ip, field.clone()) {
                        return Err(self.duplicate(field, "SNAT address", public_ip, &first));
                    }
                    snat_index.insert(public_ip, TenantId(t.id));
                    Some(SnatRange {
                        public_ip,
                        port_min: s.port_min,
                        port_max: s.port_max,
                    })
                }
            };
            let on_policy_change = match &t.on_policy_change {
                None => OnPolicyChange::Keep,
                Some(s) => OnPolicyChange::NAMES
                    .iter()
                    .find(|(n, _)| n == s)
                    .map(|&(_, m)| m)
                    .ok_or_else(|| {
                        self.invalid(
                            format!("{at}.on_policy_change"),
                            "\"keep\" or \"recheck\"",
                            diag::echo(s),
                        )
                    })?,
            };
            let table = LpmTable::build(&entries);
            out.push((
                Tenant {
                    id: TenantId(t.id),
                    name: t.name.clone(),
                    vni,
                    router_mac,
                    snat,
                    subnets,
                    router_ips,
                    routes,
                    on_policy_change,
                },
                table,
            ));
        }
        out.sort_by_key(|(t, _)| t.id);
        let (tenants, tables) = out.into_iter().unzip();
        Ok((tenants, tables, snat_index))
    }

    /// The router addresses of tenant `t` (at field path `at`): its `router_ips`, each inside
    /// one of `subnets` and given once, or by default the first host (network + 1) of every
    /// subnet with at least two host bits, the address clouds conventionally give the gateway.
    /// A port may hold the same address (the examples give VMs the first host): the responder
    /// answers for it with the router MAC either way, and IP packets to it reach the port.
    fn router_ips(
        &self,
        at: &str,
        t: &TenantSection,
        subnets: &[Prefix],
    ) -> Result<Vec<IpAddr16>, ConfigError> {
        let Some(list) = &t.router_ips else {
            return Ok(subnets
                .iter()
                .filter(|p| p.prefix_len() + 2 <= p.family().bits())
                .map(|p| {
                    let mut a = p.network();
                    a.0[15] |= 1;
                    a
                })
                .collect());
        };
        let mut first: BTreeMap<IpAddr16, String> = BTreeMap::new();
        let mut out = Vec::with_capacity(list.len());
        for (i, s) in list.iter().enumerate() {
            let field = format!("{at}.router_ips[{i}]");
            let ip = self.ip(field.clone(), s)?;
            if !subnets.iter().any(|n| n.contains(ip)) {
                let subnets: Vec<String> = subnets.iter().map(Prefix::to_string).collect();
                return Err(ConfigError::AddressOutsideSubnets {
                    file: self.file.to_string(),
                    field,
                    tenant: t.id,
                    subnets: subnets.join(", "),
                    ip: s.clone(),
                });
            }
            if let Some(f) = first.insert(ip, field.clone()) {
                return Err(self.duplicate(field, "router address", ip, &f));
            }
            out.push(ip);
        }
        Ok(out)
    }

    fn groups(
        &self,
        cfg: &[SecurityGroupSection],
        tenants: &FixedMap<TenantId, usize>,
    ) -> Result<Vec<SecurityGroup>, ConfigError> {
        let mut ids: BTreeMap<u32, String> = BTreeMap::new();
        let mut out = Vec::with_capacity(cfg.len());
        for (gi, g) in cfg.iter().enumerate() {
            let at = format!("security_group[{gi}]");
            if let Some(first) = ids.insert(g.id, format!("{at}.id")) {
                return Err(self.duplicate(format!("{at}.id"), "security group id", g.id, &first));
            }
            if !tenants.contains_key(&TenantId(g.tenant)) {
                return Err(ConfigError::UnknownReference {
                    file: self.file.to_string(),
                    field: format!("{at}.tenant"),
                    what: "defined tenant".to_string(),
                    id: g.tenant,
                });
            }
            let mut rules = Vec::with_capacity(g.rules.len());
            for (ri, r) in g.rules.iter().enumerate() {
                let rat = format!("{at}.rule[{ri}]");
                let protocol = self.protocol(format!("{rat}.protocol"), &r.protocol)?;
                let remote = self.prefix(format!("{rat}.remote"), &r.remote)?;
                let ports = match &r.ports {
                    None => (0, u16::MAX),
                    Some(p) => {
                        if !matches!(protocol, Some(ip_proto::TCP | ip_proto::UDP)) {
                            return Err(self.invalid(
                                format!("{rat}.ports"),
                                "no ports unless protocol is tcp or udp",
                                format!("{p:?} with protocol {:?}", r.protocol),
                            ));
                        }
                        self.ports_range(format!("{rat}.ports"), p)?
                    }
                };
                rules.push(SgRule {
                    group: SecurityGroupId(g.id),
                    index: u32::try_from(ri).expect("rule count fits u32"),
                    priority: r.priority,
                    direction: r.direction,
                    action: r.action,
                    protocol,
                    remote,
                    ports,
                });
            }
            out.push(SecurityGroup {
                id: SecurityGroupId(g.id),
                tenant: TenantId(g.tenant),
                rules,
            });
        }
        out.sort_by_key(|g| g.id);
        Ok(out)
    }

    fn protocol(&self, field: String, p: &ProtocolSection) -> Result<Option<u8>, ConfigError> {
        const EXPECTED: &str = "tcp, udp, icmp, icmpv6, any or a protocol number 0-255";
        match p {
            ProtocolSection::Number(n) => u8::try_from(*n)
                .map(Some)
                .map_err(|_| self.invalid(field, EXPECTED, n)),
            ProtocolSection::Name(s) => match s.as_str() {
                "tcp" => Ok(Some(ip_proto::TCP)),
                "udp" => Ok(Some(ip_proto::UDP)),
                "icmp" => Ok(Some(ip_proto::ICMP)),
                "icmpv6" => Ok(Some(ip_proto::ICMPV6)),
                "any" => Ok(None),
                _ => Err(self.invalid(field, EXPECTED, diag::echo(s))),
            },
        }
    }

    fn ports_range(&self, field: String, p: &PortsSection) -> Result<(u16, u16), ConfigError> {
        const EXPECTED: &str = "a port 0-65535 or a range like \"8000-8099\" with low <= high";
        let bad = |found: String| self.invalid(field.clone(), EXPECTED, found);
        match p {
            PortsSection::Number(n) => {
                let port = u16::try_from(*n).map_err(|_| bad(n.to_string()))?;
                Ok((port, port))
            }
            PortsSection::Text(s) => {
                let parse = |x: &str| x.trim().parse::<u16>().map_err(|_| bad(diag::echo(s)));
                let (lo, hi) = match s.split_once('-') {
                    Some((a, b)) => (parse(a)?, parse(b)?),
                    None => {
                        let x = parse(s)?;
                        (x, x)
                    }
                };
                if lo > hi {
                    return Err(bad(diag::echo(s)));
                }
                Ok((lo, hi))
            }
        }
    }

    #[allow(clippy::type_complexity)]
    fn ports(
        &self,
        cfg: &[PortSection],
        host: &HostConfig,
        tenants: &[Tenant],
        tenant_index: &FixedMap<TenantId, usize>,
        groups: &[SecurityGroup],
    ) -> Result<(Vec<VmPort>, FixedMap<(TenantId, IpAddr16), PortId>), ConfigError> {
        let mut ids: BTreeMap<u32, String> = BTreeMap::new();
        let mut ip_first: BTreeMap<(TenantId, IpAddr16), String> = BTreeMap::new();
        // A port's MAC is how the switch tells its frames from everyone else's: it must not
        // be another port's, the uplink's, the gateway's or a tenant router's.
        let mut macs: BTreeMap<MacAddr, String> = BTreeMap::new();
        macs.insert(host.uplink_mac, "host.uplink_mac".to_string());
        macs.entry(host.gateway_mac)
            .or_insert_with(|| "host.gateway_mac".to_string());
        for t in tenants {
            macs.entry(t.router_mac)
                .or_insert_with(|| format!("the router_mac of tenant {}", t.id.0));
        }
        let mut ip_index = FixedMap::default();
        let mut out = Vec::with_capacity(cfg.len());
        for (pi, p) in cfg.iter().enumerate() {
            let at = format!("port[{pi}]");
            if p.id == host.uplink_port.0 {
                return Err(self.duplicate(
                    format!("{at}.id"),
                    "port id",
                    p.id,
                    "host.uplink_port",
                ));
            }
            if let Some(first) = ids.insert(p.id, format!("{at}.id")) {
                return Err(self.duplicate(format!("{at}.id"), "port id", p.id, &first));
            }
            let tenant_id = TenantId(p.tenant);
            let tenant = match tenant_index.get(&tenant_id) {
                Some(&i) => &tenants[i],
                None => {
                    return Err(ConfigError::UnknownReference {
                        file: self.file.to_string(),
                        field: format!("{at}.tenant"),
                        what: "defined tenant".to_string(),
                        id: p.tenant,
                    });
                }
            };
            let mac = self.mac(format!("{at}.mac"), &p.mac, true)?;
            if let Some(first) = macs.insert(mac, format!("{at}.mac")) {
                return Err(self.duplicate(format!("{at}.mac"), "MAC address", mac, &first));
            }
            let mut ips = Vec::with_capacity(p.ips.len());
            for (ii, s) in p.ips.iter().enumerate() {
                let field = format!("{at}.ips[{ii}]");
                let ip = self.ip(field.clone(), s)?;
                if !tenant.subnets.iter().any(|n| n.contains(ip)) {
                    let subnets: Vec<String> =
                        tenant.subnets.iter().map(Prefix::to_string).collect();
                    return Err(ConfigError::AddressOutsideSubnets {
                        file: self.file.to_string(),
                        field,
                        tenant: p.tenant,
                        subnets: subnets.join(", "),
                        ip: s.clone(),
                    });
                }
                if let Some(first) = ip_first.insert((tenant_id, ip), field.clone()) {
                    return Err(self.duplicate(field, "address within the tenant", ip, &first));
                }
                ip_index.insert((tenant_id, ip), PortId(p.id));
                ips.push(ip);
            }
            let mut port_groups: Vec<SecurityGroupId> = Vec::with_capacity(p.security_groups.len());
            let mut rule_count = 0usize;
            for (gi, &g) in p.security_groups.iter().enumerate() {
                let field = format!("{at}.security_groups[{gi}]");
                let gid = SecurityGroupId(g);
                let group = groups
                    .binary_search_by_key(&gid, |x| x.id)
                    .ok()
                    .map(|i| &groups[i])
                    .filter(|x| x.tenant == tenant_id)
                    .ok_or_else(|| ConfigError::UnknownReference {
                        file: self.file.to_string(),
                        field: field.clone(),
                        what: format!("security group of tenant {}", p.tenant),
                        id: g,
                    })?;
                if port_groups.contains(&gid) {
                    return Err(self.duplicate(
                        field,
                        "security group in the list",
                        g,
                        &format!("{at}.security_groups"),
                    ));
                }
                port_groups.push(gid);
                rule_count += group.rules.len();
            }
            if rule_count > RULES_PER_PORT_MAX {
                return Err(ConfigError::TooManyRules {
                    file: self.file.to_string(),
                    field: format!("{at}.security_groups"),
                    max: RULES_PER_PORT_MAX,
                    found: rule_count,
                });
            }
            let mtu = p.mtu.unwrap_or(MTU_DEFAULT);
            let mtu_min = if ips.iter().any(|ip| !ip.is_v4()) {
                MTU_MIN_V6
            } else {
                68
            };
            if !(mtu_min..=MTU_MAX).contains(&mtu) {
                let why = if mtu_min == MTU_MIN_V6 {
                    " (the port has an IPv6 address)"
                } else {
                    ""
                };
                return Err(self.invalid(
                    format!("{at}.mtu"),
                    &format!("an MTU in {mtu_min}..={MTU_MAX}{why}"),
                    mtu,
                ));
            }
            out.push(VmPort {
                id: PortId(p.id),
                tenant: tenant_id,
                mac,
                ips,
                groups: port_groups,
                mtu,
            });
        }
        out.sort_by_key(|p| p.id);
        Ok((out, ip_index))
    }
}
