//! The testbed file of `spillway run`: which tenant VMs to bring up as network namespaces, the
//! vSwitch policy they live under, the emulated DPU's limits, the spill plane's cgroup, and where
//! the operations surface listens.
//!
//! ```toml
//! [testbed]
//! name = "sw2"                       # prefix of every object created; at most 8 characters
//! [ops]
//! metrics_addr = "127.0.0.1:9464"    # optional Prometheus endpoint (loopback only)
//! [spill]
//! cpus = "1"                         # the plane's cpuset
//! memory_max = "512M"
//! [fabric.dpu]                       # the emulated DPU's limits (spillway_fabric::params)
//! hw_pps_limit = 20000.0
//! [policy.host]                      # the vSwitch policy (same schema as a policy file)
//! ...
//! [[vm]]
//! name = "a"                         # namespace "<name>-a" unless `netns` is given
//! port = 1                           # the policy port: its MAC and first IPv4 address
//! # uid = 1000                       # shm ports: who may attach the endpoint (default 0)
//! ```
//!
//! Every error names the file and the field, and says what was expected.

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};

use serde::Deserialize;
use spillway_fabric::params::FabricParams;
use spillway_vswitch::PortId;
use spillway_vswitch::policy::Policy;
use spillway_wire::MacAddr;

/// A testbed file that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("{file}: {field}: expected {expected}, got {actual}")]
pub struct TestbedError {
    /// The file.
    pub file: String,
    /// Dotted field path.
    pub field: String,
    /// What was expected.
    pub expected: String,
    /// What was found.
    pub actual: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    testbed: RawTestbed,
    #[serde(default)]
    ops: RawOps,
    #[serde(default)]
    spill: RawSpill,
    #[serde(default)]
    fabric: FabricParams,
    policy: toml::Table,
    vm: Vec<RawVm>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTestbed {
    name: String,
    #[serde(default)]
    state_dir: Option<PathBuf>,
    #[serde(default)]
    hold: Option<String>,
    #[serde(default)]
    vnet_hdr: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawOps {
    #[serde(default)]
    ctl_socket: Option<PathBuf>,
    #[serde(default)]
    metrics_addr: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSpill {
    #[serde(default)]
    cpus: Option<String>,
    #[serde(default)]
    memory_max: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawVm {
    name: String,
    port: u32,
    #[serde(default)]
    netns: Option<String>,
    #[serde(default)]
    ifname: Option<String>,
    #[serde(default)]
    prefix_len: Option<u8>,
    #[serde(default)]
    mtu: Option<u32>,
    #[serde(default)]
    backend: Option<String>,
    #[serde(default)]
    endpoint: Option<String>,
    #[serde(default)]
    uid: Option<u32>,
}

/// The operator's initial hold on the lifecycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InitialHold {
    /// URSched decides.
    Auto,
    /// Bring a plane up and keep it active.
    Active,
    /// Never spill (the DPU-only baseline).
    Released,
}

/// How a VM's port reaches the DPU process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VmBackend {
    /// A TAP device the DPU process holds (the kernel's memory; no vATC).
    Tap,
    /// A shared-memory port ([`crate::virtq`]): the VM's memory holds virtio queues, which the
    /// DPU process and, through the vATC, the spill plane serve.
    Shm(VmEndpoint),
}

/// Who drives a shared-memory port's queues.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VmEndpoint {
    /// The DPU process starts `spillway vm-endpoint` bridging the queues to a TAP inside the
    /// VM's namespace, so applications run there as with a TAP port.
    Bridge,
    /// The operator starts `spillway vm-endpoint --mode gen|sink|echo` (no namespace).
    External,
}

/// A tenant VM: a network namespace with one interface (a TAP the driver holds).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VmSpec {
    /// How its port is attached.
    pub backend: VmBackend,
    /// Short name.
    pub name: String,
    /// The policy port it is.
    pub port: PortId,
    /// Namespace name.
    pub netns: String,
    /// Interface name inside the namespace.
    pub ifname: String,
    /// The TAP's name before it moves into the namespace (unique on the host).
    pub tap: String,
    /// MAC (the policy port's).
    pub mac: MacAddr,
    /// IPv4 address (the policy port's first).
    pub ip: Ipv4Addr,
    /// Prefix length of its subnet.
    pub prefix_len: u8,
    /// MTU.
    pub mtu: u32,
    /// The tenant router's MAC: the VM reaches every peer through it.
    pub router_mac: MacAddr,
    /// Addresses of the other VMs of its tenant (permanent neighbours via the router MAC).
    pub peers: Vec<Ipv4Addr>,
    /// The uid whose processes may attach this VM's shared-memory endpoint (`SO_PEERCRED`
    /// of the connection to its port socket, which is owned by this uid, mode 0600).
    /// Default 0.
    pub uid: u32,
}

/// A validated testbed.
#[derive(Clone, Debug)]
pub struct Testbed {
    /// The file it came from.
    pub file: PathBuf,
    /// Object name prefix.
    pub name: String,
    /// Ledger, sockets.
    pub state_dir: PathBuf,
    /// `spillway ctl` socket.
    pub ctl_socket: PathBuf,
    /// Prometheus endpoint.
    pub metrics_addr: Option<SocketAddr>,
    /// Spill plane cpuset.
    pub spill_cpus: String,
    /// Spill plane memory limit, bytes.
    pub spill_memory_max: Option<u64>,
    /// Fabric parameters (validated).
    pub fabric: FabricParams,
    /// The vSwitch policy as TOML text (both processes build their pipeline from it).
    pub policy_text: String,
    /// The parsed policy.
    pub policy: Policy,
    /// The VMs.
    pub vms: Vec<VmSpec>,
    /// Initial hold.
    pub hold: InitialHold,
    /// Use virtio-net headers on the TAPs (checksum and TSO offload pass-through).
    pub vnet_hdr: bool,
}

fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let (num, mul) = match s.char_indices().find(|(_, c)| c.is_ascii_alphabetic()) {
        None => (s, 1u64),
        Some((i, _)) => {
            let m = match &s[i..] {
                "K" | "k" | "KiB" => 1 << 10,
                "M" | "MiB" => 1 << 20,
                "G" | "GiB" => 1 << 30,
                _ => return None,
            };
            (&s[..i], m)
        }
    };
    num.trim().parse::<u64>().ok()?.checked_mul(mul)
}

impl Testbed {
    /// Reads and validates `path`.
    pub fn load(path: &Path) -> Result<Testbed, TestbedError> {
        let text = std::fs::read_to_string(path).map_err(|e| TestbedError {
            file: path.display().to_string(),
            field: "(file)".into(),
            expected: "a readable TOML file".into(),
            actual: e.to_string(),
        })?;
        Testbed::from_toml_str(&text, path)
    }

    /// Parses and validates testbed text that came from `path`.
    pub fn from_toml_str(text: &str, path: &Path) -> Result<Testbed, TestbedError> {
        let file = path.display().to_string();
        let err = |field: &str, expected: &str, actual: String| TestbedError {
            file: file.clone(),
            field: field.to_string(),
            expected: expected.to_string(),
            actual,
        };
        let raw: Raw = toml::from_str(text).map_err(|e| {
            let span = e
                .span()
                .map(|s| format!(" (at byte {})", s.start))
                .unwrap_or_default();
            err(
                "(document)",
                "a testbed: [testbed], [policy] and [[vm]] sections",
                format!("{}{span}", e.message()),
            )
        })?;
        let name = raw.testbed.name;
        if name.is_empty()
            || name.len() > 8
            || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        {
            return Err(err(
                "testbed.name",
                "1 to 8 characters of [A-Za-z0-9-] (it prefixes interface names of at most 15)",
                format!("{name:?}"),
            ));
        }
        raw.fabric
            .validate()
            .map_err(|e| err(&format!("fabric.{}", e.field), e.expected, e.actual))?;
        let policy_text = toml::to_string(&raw.policy)
            .map_err(|e| err("policy", "a TOML table", e.to_string()))?;
        let policy = Policy::from_toml_str(&policy_text, &format!("{file} [policy]"))
            .map_err(|e| err("policy", "a valid vSwitch policy", e.to_string()))?;
        let state_dir = raw
            .testbed
            .state_dir
            .unwrap_or_else(|| PathBuf::from("/run/spillway"));
        let hold = match raw.testbed.hold.as_deref() {
            None | Some("auto") => InitialHold::Auto,
            Some("active") => InitialHold::Active,
            Some("released") => InitialHold::Released,
            Some(h) => {
                return Err(err(
                    "testbed.hold",
                    "one of auto, active, released",
                    format!("{h:?}"),
                ));
            }
        };
        let metrics_addr = match raw.ops.metrics_addr {
            None => None,
            Some(a) => {
                let sa: SocketAddr = a.parse().map_err(|_| {
                    err(
                        "ops.metrics_addr",
                        "an address:port such as 127.0.0.1:9464",
                        format!("{a:?}"),
                    )
                })?;
                if !sa.ip().is_loopback() {
                    return Err(err(
                        "ops.metrics_addr",
                        "a loopback address (metrics are local)",
                        a,
                    ));
                }
                Some(sa)
            }
        };
        let spill_memory_max = match raw.spill.memory_max {
            None => None,
            Some(s) => Some(parse_size(&s).ok_or_else(|| {
                err(
                    "spill.memory_max",
                    "a size such as 512M or 1G",
                    format!("{s:?}"),
                )
            })?),
        };
        if raw.vm.is_empty() {
            return Err(err("vm", "at least one [[vm]]", "none".into()));
        }
        let mut vms = Vec::new();
        let mut seen = BTreeSet::new();
        for (i, v) in raw.vm.iter().enumerate() {
            let f = |field: &str| format!("vm[{i}].{field}");
            if !seen.insert(v.name.clone()) {
                return Err(err(
                    &f("name"),
                    "a name unique among the VMs",
                    v.name.clone(),
                ));
            }
            let port = policy.port(PortId(v.port)).ok_or_else(|| {
                err(
                    &f("port"),
                    "the id of a [[policy.port]]",
                    v.port.to_string(),
                )
            })?;
            let ip = port
                .ips
                .iter()
                .find_map(|ip| ip.v4_octets().map(Ipv4Addr::from))
                .ok_or_else(|| {
                    err(
                        &f("port"),
                        "a port with an IPv4 address",
                        format!("port {} has none", v.port),
                    )
                })?;
            let tenant = policy
                .tenant(port.tenant)
                .ok_or_else(|| err(&f("port"), "a port of a known tenant", v.port.to_string()))?;
            let netns = v
                .netns
                .clone()
                .unwrap_or_else(|| format!("{name}-{}", v.name));
            let tap = format!("{name}t{i}");
            let prefix_len = v.prefix_len.unwrap_or(24);
            if prefix_len == 0 || prefix_len > 32 {
                return Err(err(&f("prefix_len"), "1 to 32", prefix_len.to_string()));
            }
            let peers = policy
                .ports()
                .iter()
                .filter(|p| p.tenant == port.tenant && p.id != port.id)
                .flat_map(|p| {
                    p.ips
                        .iter()
                        .filter_map(|ip| ip.v4_octets().map(Ipv4Addr::from))
                })
                .collect();
            let endpoint = match v.endpoint.as_deref() {
                None | Some("bridge") => VmEndpoint::Bridge,
                Some("external") => VmEndpoint::External,
                Some(other) => {
                    return Err(err(
                        &f("endpoint"),
                        "\"bridge\" or \"external\"",
                        other.into(),
                    ));
                }
            };
            let backend = match v.backend.as_deref() {
                None | Some("tap") if v.endpoint.is_none() => VmBackend::Tap,
                None | Some("tap") => {
                    return Err(err(
                        &f("endpoint"),
                        "no endpoint for a TAP port (set backend = \"shm\")",
                        format!("{:?}", v.endpoint.as_deref().unwrap_or_default()),
                    ));
                }
                Some("shm") => VmBackend::Shm(endpoint),
                Some(other) => return Err(err(&f("backend"), "\"tap\" or \"shm\"", other.into())),
            };
            vms.push(VmSpec {
                backend,
                name: v.name.clone(),
                port: PortId(v.port),
                netns,
                ifname: v.ifname.clone().unwrap_or_else(|| "eth0".into()),
                tap,
                mac: port.mac,
                ip,
                prefix_len,
                mtu: v.mtu.unwrap_or(1500),
                router_mac: tenant.router_mac,
                peers,
                uid: v.uid.unwrap_or(0),
            });
        }
        Ok(Testbed {
            file: path.to_path_buf(),
            ctl_socket: raw
                .ops
                .ctl_socket
                .unwrap_or_else(|| state_dir.join(format!("{name}.ctl"))),
            name,
            state_dir,
            metrics_addr,
            spill_cpus: raw.spill.cpus.unwrap_or_else(|| "1".into()),
            spill_memory_max,
            fabric: raw.fabric,
            policy_text,
            policy,
            vms,
            hold,
            vnet_hdr: raw.testbed.vnet_hdr.unwrap_or(true),
        })
    }

    /// The VM on policy port `port`.
    pub fn vm(&self, port: PortId) -> Option<&VmSpec> {
        self.vms.iter().find(|v| v.port == port)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
[testbed]
name = "t1"
[spill]
memory_max = "256M"
[fabric.dpu]
hw_pps_limit = 20000.0
[policy.host]
uplink_port = 0
uplink_mac = "02:00:00:00:00:01"
vtep_ip = "192.0.2.1"
gateway_mac = "02:00:00:00:00:fe"
[[policy.tenant]]
id = 1
vni = 100
router_mac = "02:00:00:00:01:01"
subnets = ["10.77.0.0/24"]
[[policy.port]]
id = 1
tenant = 1
mac = "02:00:00:00:00:0a"
ips = ["10.77.0.1"]
[[policy.port]]
id = 2
tenant = 1
mac = "02:00:00:00:00:0b"
ips = ["10.77.0.2"]
[[vm]]
name = "a"
port = 1
[[vm]]
name = "b"
port = 2
netns = "swvs-b"
"#;

    #[test]
    fn example_parses_and_derives_vm_addresses() {
        let t = Testbed::from_toml_str(GOOD, Path::new("t.toml")).unwrap();
        assert_eq!(t.vms.len(), 2);
        assert_eq!(t.vms[0].netns, "t1-a");
        assert_eq!(t.vms[1].netns, "swvs-b");
        assert_eq!(t.vms[0].ip, Ipv4Addr::new(10, 77, 0, 1));
        assert_eq!(t.vms[0].peers, vec![Ipv4Addr::new(10, 77, 0, 2)]);
        assert_eq!(t.spill_memory_max, Some(256 << 20));
        assert_eq!(t.fabric.dpu.hw_pps_limit, 20000.0);
        assert_eq!(t.ctl_socket, PathBuf::from("/run/spillway/t1.ctl"));
    }

    #[test]
    fn errors_name_file_field_and_expectation() {
        let bad_port = GOOD.replace("port = 2\nnetns", "port = 9\nnetns");
        let e = Testbed::from_toml_str(&bad_port, Path::new("x.toml")).unwrap_err();
        assert_eq!(e.field, "vm[1].port");
        assert!(
            e.to_string().starts_with("x.toml: vm[1].port: expected"),
            "{e}"
        );
        let long = GOOD.replace("name = \"t1\"", "name = \"muchtoolong\"");
        let e = Testbed::from_toml_str(&long, Path::new("x.toml")).unwrap_err();
        assert_eq!(e.field, "testbed.name");
        let neg = GOOD.replace("hw_pps_limit = 20000.0", "hw_pps_limit = -1.0");
        let e = Testbed::from_toml_str(&neg, Path::new("x.toml")).unwrap_err();
        assert_eq!(e.field, "fabric.dpu.hw_pps_limit");
        let metrics = GOOD.replace("[spill]", "[ops]\nmetrics_addr = \"0.0.0.0:1\"\n[spill]");
        let e = Testbed::from_toml_str(&metrics, Path::new("x.toml")).unwrap_err();
        assert_eq!(e.field, "ops.metrics_addr");
        let e = Testbed::from_toml_str("[testbed]\nname=1", Path::new("x.toml")).unwrap_err();
        assert_eq!(e.field, "(document)");
    }
}

#[cfg(test)]
mod shipped {
    use super::*;

    /// Every testbed the repository ships loads and validates.
    #[test]
    fn shipped_testbeds_load() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let mut n = 0;
        for dir in ["examples", "bench"] {
            for e in std::fs::read_dir(root.join(dir)).unwrap() {
                let p = e.unwrap().path();
                let name = p.file_name().unwrap().to_string_lossy().to_string();
                if name.starts_with("testbed-") && name.ends_with(".toml") {
                    let t = Testbed::load(&p).unwrap_or_else(|e| panic!("{e}"));
                    assert!(!t.vms.is_empty());
                    n += 1;
                }
            }
        }
        assert!(n >= 4, "found {n} testbeds");
    }
}
