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
//! uid = 65534                        # whom the plane runs as after set-up (default nobody)
//! gid = 65534
//! seccomp = "kill"                   # "kill" (default) or "log" (development)
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
//! Every error names the file, the line and column, the field by its dotted path (also for a
//! wrong type, and for the embedded policy: `policy.port[1].mac`), the range or form expected
//! and a bounded echo of the value (`spillway_vswitch::policy::diag`). The numeric fields and
//! their ranges are listed in `docs/CONFIG.md`.

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::host::privilege::{PlanePrivileges, SeccompMode};
use spillway_fabric::params::FabricParams;
use spillway_vswitch::PortId;
use spillway_vswitch::policy::{
    ConfigError, Policy, PolicyConfig, bounded, echo, toml_place_at, toml_place_of,
};
use spillway_wire::MacAddr;

/// A testbed file that cannot be used. `Display` reads
/// `file:line:column: field: expected X, got Y` (without `:line:column` when the field does
/// not appear in the file, e.g. a missing section).
#[derive(Debug, thiserror::Error)]
#[error("{file}{}: {field}: expected {expected}, got {actual}", .place.map(|(l, c)| format!(":{l}:{c}")).unwrap_or_default())]
pub struct TestbedError {
    /// The file.
    pub file: String,
    /// 1-based line and column of the field in the file, when it appears there.
    pub place: Option<(usize, usize)>,
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
    // Deserialised in place (not re-serialised and parsed again) so that a policy error's
    // span is a position in this file.
    policy: PolicyConfig,
    vm: Vec<RawVm>,
    #[serde(default)]
    cluster: Option<RawCluster>,
    #[serde(default)]
    uplink: Option<RawUplink>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawUplink {
    netns: String,
    #[serde(default)]
    bridge: Option<String>,
}

/// The DPU's uplink to the underlay (`[uplink]`): a TAP the DPU process holds as the policy's
/// `host.uplink_port`, moved into the underlay's namespace (the operator's or the test's:
/// never created or removed here) and, with `bridge`, enslaved to that bridge. VXLAN for this
/// host's VTEP comes in there; frames routed to a `tunnel` go out there, encapsulated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UplinkSpec {
    /// The underlay's namespace (`uplink.netns`), which must exist.
    pub netns: String,
    /// A bridge in that namespace the TAP joins (`uplink.bridge`), which must exist.
    pub bridge: Option<String>,
    /// The TAP's name: `<testbed>ul`.
    pub tap: String,
    /// The policy's uplink port.
    pub port: PortId,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCluster {
    #[serde(default)]
    host: Option<String>,
    etcd: Vec<String>,
    #[serde(default)]
    lease_ttl_s: Option<u64>,
    #[serde(default)]
    pool_cores: Option<u32>,
    #[serde(default)]
    netns: Option<String>,
    #[serde(default)]
    pool_listen: Option<String>,
    #[serde(default)]
    pool_cpus: Option<String>,
}

/// The cluster control plane the DPU process publishes to (`[cluster]`): its host record under
/// a lease, renewed and republished every second, and the cluster baseline it feeds URSched.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterSpec {
    /// This host's name in the cluster (`cluster.host`, default the testbed's name).
    pub host: String,
    /// The etcd members (`cluster.etcd`, `http://address:port` each).
    pub etcd: Vec<String>,
    /// The lease's time to live (`cluster.lease_ttl_s`, 2..=60, default 5): how soon a host
    /// that died disappears.
    pub lease_ttl: std::time::Duration,
    /// Cores this host offers other hosts as a pool host (`cluster.pool_cores`, 0..=1024,
    /// default 0: none).
    pub pool_cores: u32,
    /// The namespace of this host's own interface on the underlay (`cluster.netns`, the
    /// operator's): the relay to a pool host connects from there, and the pool service
    /// listens there. `None`: the DPU process's own.
    pub netns: Option<String>,
    /// Where this pool host's remote-plane service listens (`cluster.pool_listen`,
    /// `address:port`, advertised in the cluster); `None`: no service (cores offered are then
    /// only reserved, never served).
    pub pool_listen: Option<SocketAddr>,
    /// The cpuset of the planes it serves for other hosts (`cluster.pool_cpus`, default
    /// `spill.cpus`).
    pub pool_cpus: Option<String>,
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
    netns: Option<String>,
    #[serde(default)]
    vnet_hdr: Option<bool>,
    #[serde(default)]
    tap_io: Option<String>,
    #[serde(default)]
    guest_dir: Option<PathBuf>,
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
    #[serde(default)]
    uid: Option<i64>,
    #[serde(default)]
    gid: Option<i64>,
    #[serde(default)]
    seccomp: Option<String>,
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
    #[serde(default)]
    static_neighbours: Option<bool>,
    #[serde(default)]
    memory_mib: Option<u32>,
    #[serde(default)]
    cpus: Option<u32>,
    #[serde(default)]
    guest_cmdline: Option<String>,
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
    /// A shared-memory port ([`crate::shm::virtq`]): the VM's memory holds virtio queues, which the
    /// DPU process and, through the vATC, the spill plane serve.
    Shm(VmEndpoint),
    /// A QEMU guest's virtio-net device whose vhost-user backend is the DPU process
    /// ([`crate::vm::vhost_user`]).
    VhostUser(VhostEndpoint),
}

/// Who runs a vhost-user port's guest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VhostEndpoint {
    /// `spillway run` boots the guest `guest/build.sh` builds (`testbed.guest_dir`) under QEMU
    /// and stops it at exit.
    Qemu,
    /// The operator runs QEMU with a vhost-user socket at the port's path
    /// (`server=on`; the DPU process connects).
    External,
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
    /// Addresses of the other VMs of its tenant (on-link routes to those outside its subnet;
    /// permanent neighbours via the router MAC with `static_neighbours`).
    pub peers: Vec<Ipv4Addr>,
    /// The tenant router's IPv4 address on the VM's subnet (its first `router_ips` entry
    /// there), the VM's default route; `None` when the tenant has none on that subnet.
    pub gateway: Option<Ipv4Addr>,
    /// The policy port's first IPv6 address with the length of the tenant subnet holding it;
    /// `None` leaves IPv6 off in the VM's namespace.
    pub ip6: Option<(std::net::Ipv6Addr, u8)>,
    /// Install permanent neighbour entries for the peers instead of letting the guest resolve
    /// them through the vSwitch's ARP responder (`vm[i].static_neighbours`, default false).
    pub static_neighbours: bool,
    /// The uid whose processes may attach this VM's shared-memory endpoint (`SO_PEERCRED`
    /// of the connection to its port socket, which is owned by this uid, mode 0600).
    /// Default 0.
    pub uid: u32,
    /// Guest memory of a QEMU guest, MiB (`vm[i].memory_mib`, default 256).
    pub memory_mib: u32,
    /// Virtual CPUs of a QEMU guest (`vm[i].cpus`, 1 to 64, default 2). Linux's virtio-net
    /// driver runs as many queue pairs as the guest has CPUs (up to the device's two): the
    /// second pair carries the spill plane's direct (vATC) deliveries, so a one-CPU guest gets
    /// every frame the DPU way.
    pub cpus: u32,
    /// More of a QEMU guest's kernel command line (`vm[i].guest_cmdline`: for the guest of
    /// `guest/build.sh`, `spillway.ping=ADDR` and `spillway.fetch=URL`), after its address.
    pub guest_cmdline: String,
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
    /// Whom the spill plane runs as after set-up (`[spill] uid`, `gid`, `seccomp`).
    pub spill_privileges: PlanePrivileges,
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
    /// How the DPU process reads and writes its TAPs.
    pub tap_io: TapIo,
    /// The cluster control plane, if any (`[cluster]`).
    pub cluster: Option<ClusterSpec>,
    /// The uplink to the underlay, if any (`[uplink]`).
    pub uplink: Option<UplinkSpec>,
    /// The network namespace the DPU process runs in (`testbed.netns`, the operator's: a
    /// host of several on one machine); `None`: the one it was started in. Entered by the
    /// process itself, so that it keeps the machine's mounts (`ip netns exec` remounts
    /// `/sys`, and the cgroup hierarchies with it).
    pub netns: Option<String>,
    /// Where the guest of `backend = "vhost-user"` VMs is (`guest/build.sh`'s output:
    /// `vmlinuz`, `initramfs.cpio.gz`; `testbed.guest_dir`, default `target/guest`).
    pub guest_dir: PathBuf,
}

/// How the DPU process moves frames through its TAPs (`testbed.tap_io`; docs/adr/0005-tap-io.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TapIo {
    /// io_uring: a multishot read on every TAP (armed reads on kernels before 6.7), a turn's
    /// writes submitted in one system call (`"io_uring"`, the default). Falls back to `Syscalls`, with a warning,
    /// where the kernel refuses the ring.
    Uring,
    /// One `read` per frame until the TAP is empty, one `write` per frame (`"syscalls"`).
    Syscalls,
}

/// A policy compilation error reported as a testbed error: the field under `policy.`, at its
/// line in the testbed file.
fn policy_error(err: &dyn Fn(&str, &str, String) -> TestbedError, e: &ConfigError) -> TestbedError {
    let field = match e.field() {
        Some(f) => format!("policy.{f}"),
        None => "policy".into(),
    };
    let (expected, actual) = match e {
        // The first definition is a field path of the policy too (or a description).
        ConfigError::Duplicate {
            what, value, first, ..
        } => {
            let first = if first.contains(' ') {
                first.clone()
            } else {
                format!("policy.{first}")
            };
            (
                format!("a unique {what}"),
                format!("{value} which {first} already has"),
            )
        }
        _ => e
            .expected_found()
            .unwrap_or_else(|| ("a valid vSwitch policy".into(), e.to_string())),
    };
    err(&field, &expected, actual)
}

/// A namespace is a file under /run/netns: a plain file name, no path.
fn valid_netns(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 64
        && !n.starts_with('.')
        && n.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// An interface name: IFNAMSIZ is 16 with the terminating NUL; '/', ':' and whitespace are
/// refused by the kernel or break `ip`'s syntax.
fn valid_ifname(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 15
        && n != "."
        && n != ".."
        && n.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
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
            place: None,
            field: "(file)".into(),
            expected: "a readable TOML file".into(),
            actual: e.to_string(),
        })?;
        Testbed::from_toml_str(&text, path)
    }

    /// Parses and validates testbed text that came from `path`.
    pub fn from_toml_str(text: &str, path: &Path) -> Result<Testbed, TestbedError> {
        let file = path.display().to_string();
        // Every error goes through here: the field's line is looked up in the text, and the
        // echoed value is bounded (callers quote input with `echo`).
        let err = |field: &str, expected: &str, actual: String| TestbedError {
            file: file.clone(),
            place: toml_place_of(text, field).map(|p| (p.line, p.column)),
            field: bounded(field, 240).into_owned(),
            expected: expected.to_string(),
            actual: bounded(&actual, 240).into_owned(),
        };
        let raw: Raw = toml::from_str(text).map_err(|e| {
            let message = bounded(e.message().trim(), 240).into_owned();
            match e.span() {
                // The parser's span gives the line, column and the key (path) at fault; a
                // type error names its field like any other error.
                Some(span) => {
                    let p = toml_place_at(text, span.start);
                    TestbedError {
                        file: file.clone(),
                        place: Some((p.line, p.column)),
                        field: if p.field.is_empty() {
                            "(document)".into()
                        } else {
                            p.field
                        },
                        expected: "a field of the documented type (docs/CONFIG.md)".into(),
                        actual: message,
                    }
                }
                None => err(
                    "(document)",
                    "a testbed: [testbed], [policy] and [[vm]] sections",
                    message,
                ),
            }
        })?;
        let name = raw.testbed.name;
        if name.is_empty()
            || name.len() > 8
            || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        {
            return Err(err(
                "testbed.name",
                "1 to 8 characters of [A-Za-z0-9-] (it prefixes interface names of at most 15)",
                echo(&name),
            ));
        }
        raw.fabric
            .validate()
            .map_err(|e| err(&format!("fabric.{}", e.field), e.expected, e.actual))?;
        // The processes get the policy as text; it was parsed from this file a moment ago, so
        // writing it back cannot fail for a reason the operator could fix.
        let policy_text = toml::to_string(&raw.policy)
            .map_err(|e| err("policy", "a policy TOML can represent", e.to_string()))?;
        let policy = Policy::compile(raw.policy, &file).map_err(|e| policy_error(&err, &e))?;
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
                    echo(h),
                ));
            }
        };
        let cluster = match raw.cluster {
            None => None,
            Some(c) => {
                let host = c.host.unwrap_or_else(|| name.clone());
                if !spillway_cluster::valid_name(&host) {
                    return Err(err(
                        "cluster.host",
                        "1 to 64 of A-Z a-z 0-9 . _ -",
                        echo(&host),
                    ));
                }
                if c.etcd.is_empty() || c.etcd.len() > 7 {
                    return Err(err(
                        "cluster.etcd",
                        "1 to 7 etcd members such as [\"http://127.0.0.1:2379\"]",
                        format!("{} members", c.etcd.len()),
                    ));
                }
                for e in &c.etcd {
                    let ok = e
                        .strip_prefix("http://")
                        .is_some_and(|a| a.parse::<SocketAddr>().is_ok());
                    if !ok {
                        return Err(err(
                            "cluster.etcd",
                            "http://address:port such as http://127.0.0.1:2379",
                            echo(e),
                        ));
                    }
                }
                let ttl = c.lease_ttl_s.unwrap_or(5);
                if !(2..=60).contains(&ttl) {
                    return Err(err("cluster.lease_ttl_s", "2..=60", ttl.to_string()));
                }
                let pool_cores = c.pool_cores.unwrap_or(0);
                if pool_cores > 1024 {
                    return Err(err(
                        "cluster.pool_cores",
                        "0..=1024",
                        pool_cores.to_string(),
                    ));
                }
                if let Some(ns) = c.netns.as_deref().filter(|n| !valid_netns(n)) {
                    return Err(err(
                        "cluster.netns",
                        "1 to 64 characters of [A-Za-z0-9_.-], not starting with '.'",
                        echo(ns),
                    ));
                }
                let pool_listen = match c.pool_listen.as_deref() {
                    None => None,
                    Some(a) => {
                        let sa: SocketAddr = a
                            .parse()
                            .map_err(|_| err("cluster.pool_listen", "an address:port", echo(a)))?;
                        if pool_cores == 0 {
                            return Err(err(
                                "cluster.pool_listen",
                                "no service without cluster.pool_cores > 0",
                                echo(a),
                            ));
                        }
                        Some(sa)
                    }
                };
                Some(ClusterSpec {
                    host,
                    etcd: c.etcd,
                    lease_ttl: std::time::Duration::from_secs(ttl),
                    pool_cores,
                    netns: c.netns,
                    pool_listen,
                    pool_cpus: c.pool_cpus,
                })
            }
        };
        let vnet_hdr = raw.testbed.vnet_hdr.unwrap_or(true);
        if let Some(ns) = raw.testbed.netns.as_deref().filter(|n| !valid_netns(n)) {
            return Err(err(
                "testbed.netns",
                "1 to 64 characters of [A-Za-z0-9_.-], not starting with '.'",
                echo(ns),
            ));
        }
        let uplink = match raw.uplink {
            None => None,
            Some(u) => {
                if !valid_netns(&u.netns) {
                    return Err(err(
                        "uplink.netns",
                        "1 to 64 characters of [A-Za-z0-9_.-], not starting with '.'",
                        echo(&u.netns),
                    ));
                }
                if let Some(b) = u.bridge.as_deref().filter(|b| !valid_ifname(b)) {
                    return Err(err(
                        "uplink.bridge",
                        "1 to 15 characters of [A-Za-z0-9_.-]",
                        echo(b),
                    ));
                }
                // A VM's TSO super-frame routed to a tunnel would go out encapsulated with a
                // vnet header describing its inner TCP: the kernel's segmentation needs the
                // UDP-tunnel GSO types for that, which this driver does not write.
                if vnet_hdr {
                    return Err(err(
                        "testbed.vnet_hdr",
                        "false with an [uplink] (TSO through VXLAN is not built: frames on \
                         an underlay fit its MTU)",
                        "true (the default)".into(),
                    ));
                }
                Some(UplinkSpec {
                    netns: u.netns,
                    bridge: u.bridge,
                    tap: format!("{name}ul"),
                    port: policy.host().uplink_port,
                })
            }
        };
        let tap_io = match raw.testbed.tap_io.as_deref() {
            None | Some("io_uring") => TapIo::Uring,
            Some("syscalls") => TapIo::Syscalls,
            Some(v) => {
                return Err(err("testbed.tap_io", "one of io_uring, syscalls", echo(v)));
            }
        };
        let metrics_addr = match raw.ops.metrics_addr {
            None => None,
            Some(a) => {
                let sa: SocketAddr = a.parse().map_err(|_| {
                    err(
                        "ops.metrics_addr",
                        "an address:port such as 127.0.0.1:9464",
                        echo(&a),
                    )
                })?;
                if !sa.ip().is_loopback() {
                    return Err(err(
                        "ops.metrics_addr",
                        "a loopback address (metrics are local)",
                        echo(&a),
                    ));
                }
                Some(sa)
            }
        };
        let spill_memory_max = match raw.spill.memory_max {
            None => None,
            Some(s) => {
                const EXPECTED: &str = "a size in 16M..=1024G such as 512M or 1G";
                let bytes =
                    parse_size(&s).ok_or_else(|| err("spill.memory_max", EXPECTED, echo(&s)))?;
                // Below 16 MiB the plane cannot map its rings; above 1 TiB is a typo.
                if !(16 << 20..=1 << 40).contains(&bytes) {
                    return Err(err("spill.memory_max", EXPECTED, echo(&s)));
                }
                Some(bytes)
            }
        };
        let spill_id = |field: &str, v: Option<i64>| match v {
            None => Ok(crate::host::privilege::NOBODY),
            Some(v) => u32::try_from(v)
                .ok()
                .filter(|v| (1..u32::MAX).contains(v))
                .ok_or_else(|| {
                    err(
                        field,
                        "an unprivileged id, 1 to 4294967294 (0 is root, 4294967295 is -1)",
                        v.to_string(),
                    )
                }),
        };
        let spill_privileges = PlanePrivileges {
            uid: spill_id("spill.uid", raw.spill.uid)?,
            gid: spill_id("spill.gid", raw.spill.gid)?,
            seccomp: match raw.spill.seccomp.as_deref() {
                None => SeccompMode::Kill,
                Some(m) => SeccompMode::from_name(m)
                    .ok_or_else(|| err("spill.seccomp", "\"kill\" or \"log\"", format!("{m:?}")))?,
            },
        };
        if raw.vm.is_empty() {
            return Err(err("vm", "at least one [[vm]]", "none".into()));
        }
        let mut vms: Vec<VmSpec> = Vec::new();
        let mut seen = BTreeSet::new();
        for (i, v) in raw.vm.iter().enumerate() {
            let f = |field: &str| format!("vm[{i}].{field}");
            // The name becomes part of a namespace name and of log lines.
            if v.name.is_empty()
                || v.name.len() > 15
                || !v
                    .name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
            {
                return Err(err(
                    &f("name"),
                    "1 to 15 characters of [A-Za-z0-9_-]",
                    echo(&v.name),
                ));
            }
            if !seen.insert(v.name.clone()) {
                return Err(err(
                    &f("name"),
                    "a name unique among the VMs",
                    echo(&v.name),
                ));
            }
            // One port, one VM: a second VM on a port would take the first's traffic.
            if let Some((j, other)) = vms
                .iter()
                .enumerate()
                .find(|(_, o)| o.port == PortId(v.port))
            {
                return Err(err(
                    &f("port"),
                    "a port no other [[vm]] uses",
                    format!(
                        "port {} of VM {:?} (vm[{i}]), which VM {:?} (vm[{j}]) already uses",
                        v.port, v.name, other.name
                    ),
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
            if !valid_netns(&netns) {
                return Err(err(
                    &f("netns"),
                    "1 to 64 characters of [A-Za-z0-9_.-], not starting with '.'",
                    echo(&netns),
                ));
            }
            if let Some((j, _)) = vms.iter().enumerate().find(|(_, o)| o.netns == netns) {
                return Err(err(
                    &f("netns"),
                    "a namespace no other [[vm]] uses",
                    format!("{} which vm[{j}] already uses", echo(&netns)),
                ));
            }
            let ifname = v.ifname.clone().unwrap_or_else(|| "eth0".into());
            if !valid_ifname(&ifname) {
                return Err(err(
                    &f("ifname"),
                    "1 to 15 characters of [A-Za-z0-9_.-]",
                    echo(&ifname),
                ));
            }
            // The guest interface's MTU: what its DHCP or virtio `host_mtu` would give it, the
            // port's, unless the test or operator sets another (a guest larger than its path).
            let mtu = v.mtu.unwrap_or(u32::from(port.mtu));
            // Linux's ETH_MIN_MTU and ETH_MAX_MTU.
            if !(68..=65535).contains(&mtu) {
                return Err(err(&f("mtu"), "an MTU in 68..=65535", mtu.to_string()));
            }
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
            let mask = u32::MAX
                .checked_shl(32 - u32::from(prefix_len))
                .unwrap_or(0);
            let gateway = tenant
                .router_ips
                .iter()
                .filter_map(|r| r.v4_octets().map(Ipv4Addr::from))
                .find(|r| u32::from(*r) & mask == u32::from(ip) & mask && *r != ip);
            let ip6 = port.ips.iter().find(|a| !a.is_v4()).and_then(|a| {
                let len = tenant.subnets.iter().find(|s| s.contains(*a))?.prefix_len();
                Some((std::net::Ipv6Addr::from(a.0), len))
            });
            let backend = match v.backend.as_deref() {
                None | Some("tap") if v.endpoint.is_none() => VmBackend::Tap,
                None | Some("tap") => {
                    return Err(err(
                        &f("endpoint"),
                        "no endpoint for a TAP port (set backend = \"shm\" or \"vhost-user\")",
                        format!("{:?}", v.endpoint.as_deref().unwrap_or_default()),
                    ));
                }
                Some("shm") => VmBackend::Shm(match v.endpoint.as_deref() {
                    None | Some("bridge") => VmEndpoint::Bridge,
                    Some("external") => VmEndpoint::External,
                    Some(other) => {
                        return Err(err(
                            &f("endpoint"),
                            "\"bridge\" or \"external\"",
                            echo(other),
                        ));
                    }
                }),
                Some("vhost-user") => VmBackend::VhostUser(match v.endpoint.as_deref() {
                    None | Some("qemu") => VhostEndpoint::Qemu,
                    Some("external") => VhostEndpoint::External,
                    Some(other) => {
                        return Err(err(
                            &f("endpoint"),
                            "\"qemu\" or \"external\" (with backend = \"vhost-user\")",
                            echo(other),
                        ));
                    }
                }),
                Some(other) => {
                    return Err(err(
                        &f("backend"),
                        "\"tap\", \"shm\" or \"vhost-user\"",
                        echo(other),
                    ));
                }
            };
            let memory_mib = match v.memory_mib {
                None => 256,
                Some(m) if (64..=65536).contains(&m) => m,
                Some(m) => return Err(err(&f("memory_mib"), "64 to 65536", m.to_string())),
            };
            let cpus = match v.cpus {
                None => 2,
                Some(n) if (1..=64).contains(&n) => n,
                Some(n) => return Err(err(&f("cpus"), "1 to 64", n.to_string())),
            };
            let guest_cmdline = v.guest_cmdline.clone().unwrap_or_default();
            if guest_cmdline.len() > 512 || guest_cmdline.chars().any(|c| c.is_control()) {
                return Err(err(
                    &f("guest_cmdline"),
                    "at most 512 characters, no control characters",
                    echo(&guest_cmdline),
                ));
            }
            vms.push(VmSpec {
                backend,
                name: v.name.clone(),
                port: PortId(v.port),
                netns,
                ifname,
                tap,
                mac: port.mac,
                ip,
                prefix_len,
                mtu,
                router_mac: tenant.router_mac,
                peers,
                gateway,
                ip6,
                static_neighbours: v.static_neighbours.unwrap_or(false),
                uid: v.uid.unwrap_or(0),
                memory_mib,
                cpus,
                guest_cmdline,
            });
        }
        // One forwarding thread per shard, each over its own queue of every TAP (through its
        // own io_uring). A shared-memory or vhost-user port has one receive queue, with one
        // producer: thread 0 serves it, and the other threads hand it their frames for it.
        if raw.fabric.dpu.shards > 1 {
            let threads = |why: &str| {
                err(
                    "fabric.dpu.shards",
                    &format!("1 (one forwarding thread) {why}"),
                    raw.fabric.dpu.shards.to_string(),
                )
            };
            if tap_io != TapIo::Uring {
                return Err(threads("with testbed.tap_io = \"syscalls\""));
            }
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
            spill_privileges,
            fabric: raw.fabric,
            policy_text,
            policy,
            vms,
            hold,
            cluster,
            uplink,
            netns: raw.testbed.netns.clone(),
            vnet_hdr,
            tap_io,
            guest_dir: raw
                .testbed
                .guest_dir
                .clone()
                .unwrap_or_else(|| PathBuf::from("target/guest")),
        })
    }

    /// The VM on policy port `port` (at most one: ports are unique among the VMs).
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
        assert_eq!(e.place, Some((33, 1)), "{e}");
        assert!(
            e.to_string()
                .starts_with("x.toml:33:1: vm[1].port: expected"),
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
        let e = Testbed::from_toml_str("[testbed]\n[[vm]]", Path::new("x.toml")).unwrap_err();
        assert_eq!(e.field, "testbed", "{e}");
        assert!(e.actual.contains("missing field `name`"), "{e}");
        let e = Testbed::from_toml_str("", Path::new("x.toml")).unwrap_err();
        assert_eq!(e.field, "(document)", "{e}");
    }

    fn load_err(text: &str) -> TestbedError {
        Testbed::from_toml_str(text, Path::new("x.toml")).expect_err("must be rejected")
    }

    #[test]
    fn type_errors_name_the_field_with_line_and_column() {
        let e = load_err(&GOOD.replace("hw_pps_limit = 20000.0", "hw_pps_limit = \"fast\""));
        assert_eq!(e.field, "fabric.dpu.hw_pps_limit", "{e}");
        assert_eq!(e.place, Some((7, 16)), "{e}");
        assert!(
            e.to_string()
                .starts_with("x.toml:7:16: fabric.dpu.hw_pps_limit: "),
            "{e}"
        );
        assert!(!e.to_string().contains("byte"), "{e}");
        let e = load_err("[testbed]\nname=1");
        assert_eq!(e.field, "testbed.name", "{e}");
        assert_eq!(e.place, Some((2, 6)), "{e}");
        let e = load_err(&GOOD.replace("port = 2\nnetns", "port = \"2\"\nnetns"));
        assert_eq!(e.field, "vm[1].port", "{e}");
        let e = load_err(&GOOD.replace("[[vm]]\nname = \"a\"", "[[vm]]\nname = \"a\"\ncolour = 1"));
        assert_eq!(e.field, "vm[0].colour", "{e}");
    }

    #[test]
    fn policy_errors_cite_the_line_in_the_testbed_file() {
        // Line 26 of GOOD is port 2's MAC; the policy used to be re-serialised and its errors
        // cited lines of that copy (`[policy]:36:7` for line 52).
        let dup = GOOD.replace("mac = \"02:00:00:00:00:0b\"", "mac = \"02:00:00:00:00:0a\"");
        assert_eq!(dup.lines().nth(25), Some("mac = \"02:00:00:00:00:0a\""));
        let e = load_err(&dup);
        assert_eq!(e.field, "policy.port[1].mac", "{e}");
        assert_eq!(e.place, Some((26, 1)), "{e}");
        assert!(
            e.actual.contains("which policy.port[0].mac already has"),
            "{e}"
        );
        // A type error inside the policy: the parser's own span, in this file.
        let e = load_err(&GOOD.replace("vni = 100", "vni = \"100\""));
        assert_eq!(e.field, "policy.tenant[0].vni", "{e}");
        assert_eq!(e.place, Some((15, 7)), "{e}");
        let e = load_err(&GOOD.replace(
            "subnets = [\"10.77.0.0/24\"]",
            "subnets = [\"10.77.0.0/24\"]\nsnat = { public_ip = \"1.2.3.4\", port_min = 0 }",
        ));
        assert_eq!(e.field, "policy.tenant[0].snat.port_min", "{e}");
        assert_eq!(e.place, Some((18, 1)), "{e}");
    }

    #[test]
    fn a_cluster_section_names_its_host_and_etcd_members() {
        let t = Testbed::from_toml_str(GOOD, Path::new("t.toml")).unwrap();
        assert_eq!(t.cluster, None);
        let with =
            |extra: &str| GOOD.replace("[fabric.dpu]\n", &format!("{extra}\n[fabric.dpu]\n"));
        let t = Testbed::from_toml_str(
            &with("[cluster]\netcd = [\"http://127.0.0.1:2379\"]"),
            Path::new("t.toml"),
        )
        .unwrap();
        let c = t.cluster.expect("a cluster");
        assert_eq!(c.host, t.name);
        assert_eq!(c.etcd, vec!["http://127.0.0.1:2379".to_string()]);
        assert_eq!(c.lease_ttl, std::time::Duration::from_secs(5));
        for (bad, field) in [
            (
                "[cluster]\nhost = \"a/b\"\netcd = [\"http://127.0.0.1:2379\"]",
                "cluster.host",
            ),
            ("[cluster]\netcd = []", "cluster.etcd"),
            (
                "[cluster]\netcd = [\"https://127.0.0.1:2379\"]",
                "cluster.etcd",
            ),
            ("[cluster]\netcd = [\"http://localhost\"]", "cluster.etcd"),
            (
                "[cluster]\netcd = [\"http://127.0.0.1:2379\"]\nlease_ttl_s = 1",
                "cluster.lease_ttl_s",
            ),
            (
                "[cluster]\netcd = [\"http://127.0.0.1:2379\"]\nttl = 3",
                "cluster.ttl",
            ),
            (
                "[cluster]\netcd = [\"http://127.0.0.1:2379\"]\npool_cores = 5000",
                "cluster.pool_cores",
            ),
        ] {
            let e = load_err(&with(bad));
            assert_eq!(e.field, field, "{bad}: {e}");
        }
    }

    #[test]
    fn an_uplink_names_its_underlay_and_needs_plain_frames() {
        let plain = |extra: &str| {
            GOOD.replace("name = \"t1\"", "name = \"t1\"\nvnet_hdr = false")
                .replace("[fabric.dpu]\n", &format!("{extra}\n[fabric.dpu]\n"))
        };
        let t = Testbed::from_toml_str(
            &plain("[uplink]\nnetns = \"under\"\nbridge = \"br0\"\n"),
            Path::new("t.toml"),
        )
        .unwrap();
        let u = t.uplink.expect("an uplink");
        assert_eq!(u.netns, "under");
        assert_eq!(u.bridge.as_deref(), Some("br0"));
        assert_eq!(u.tap, "t1ul");
        assert_eq!(u.port, t.policy.host().uplink_port);
        for (bad, field) in [
            ("[uplink]\nnetns = \"../x\"\n", "uplink.netns"),
            (
                "[uplink]\nnetns = \"u\"\nbridge = \"a bridge\"\n",
                "uplink.bridge",
            ),
            ("[uplink]\nnetns = \"u\"\nmtu = 9000\n", "uplink.mtu"),
            ("[uplink]\nbridge = \"br0\"\n", "uplink"),
        ] {
            let e = load_err(&plain(bad));
            assert!(e.field.starts_with(field), "{bad}: {e}");
        }
        // With virtio-net headers (the default) a VM's TSO super-frame could reach the
        // underlay encapsulated: refused, naming the field to change.
        let e = load_err(&GOOD.replace(
            "[fabric.dpu]\n",
            "[uplink]\nnetns = \"u\"\n\n[fabric.dpu]\n",
        ));
        assert_eq!(e.field, "testbed.vnet_hdr", "{e}");
    }

    #[test]
    fn a_testbed_may_name_the_namespace_its_dpu_process_runs_in() {
        assert_eq!(
            Testbed::from_toml_str(GOOD, Path::new("t.toml"))
                .unwrap()
                .netns,
            None
        );
        let named = GOOD.replace("name = \"t1\"", "name = \"t1\"\nnetns = \"host-a\"");
        let t = Testbed::from_toml_str(&named, Path::new("t.toml")).unwrap();
        assert_eq!(t.netns.as_deref(), Some("host-a"));
        let e = load_err(&GOOD.replace("name = \"t1\"", "name = \"t1\"\nnetns = \"../x\""));
        assert_eq!(e.field, "testbed.netns", "{e}");
    }

    #[test]
    fn several_forwarding_threads_need_io_uring_and_take_any_port() {
        let sharded = GOOD.replace("[fabric.dpu]\n", "[fabric.dpu]\nshards = 2\n");
        let t = Testbed::from_toml_str(&sharded, Path::new("t.toml")).unwrap();
        assert_eq!(t.fabric.dpu.shards, 2);
        // A shared-memory port beside them: thread 0 serves it.
        let shm = sharded.replace("port = 2\nnetns", "port = 2\nbackend = \"shm\"\nnetns");
        let t = Testbed::from_toml_str(&shm, Path::new("t.toml")).unwrap();
        assert_eq!(t.fabric.dpu.shards, 2);
        assert!(matches!(t.vms[1].backend, VmBackend::Shm(_)));
        let e = load_err(&sharded.replace("name = \"t1\"", "name = \"t1\"\ntap_io = \"syscalls\""));
        assert_eq!(e.field, "fabric.dpu.shards", "{e}");
        assert!(e.expected.contains("syscalls"), "{e}");
    }

    #[test]
    fn warm_standby_runs_with_one_forwarding_thread_or_more() {
        let warm = GOOD.replace(
            "[fabric.dpu]\n",
            "[fabric.host]\nwarm_standby = true\n\n[fabric.dpu]\n",
        );
        let t = Testbed::from_toml_str(&warm, Path::new("t.toml")).unwrap();
        assert!(t.fabric.host.warm_standby);
        let sharded = warm.replace("[fabric.dpu]\n", "[fabric.dpu]\nshards = 2\n");
        let t = Testbed::from_toml_str(&sharded, Path::new("t.toml")).unwrap();
        assert!(t.fabric.host.warm_standby);
        assert_eq!(t.fabric.dpu.shards, 2);
    }

    #[test]
    fn two_vms_on_one_port_are_rejected_naming_both() {
        let e = load_err(&GOOD.replace("port = 2\nnetns", "port = 1\nnetns"));
        assert_eq!(e.field, "vm[1].port", "{e}");
        assert!(e.actual.contains("\"b\" (vm[1])"), "{e}");
        assert!(e.actual.contains("\"a\" (vm[0])"), "{e}");
        let e = load_err(&GOOD.replace("netns = \"swvs-b\"", "netns = \"t1-a\""));
        assert_eq!(e.field, "vm[1].netns", "{e}");
        let e = load_err(&GOOD.replace("netns = \"swvs-b\"", "netns = \"../etc\""));
        assert_eq!(e.field, "vm[1].netns", "{e}");
        let e = load_err(&GOOD.replace("name = \"b\"", "name = \"a\""));
        assert_eq!(e.field, "vm[1].name", "{e}");
        let e = load_err(&GOOD.replace("name = \"b\"", "name = \"b/c\""));
        assert_eq!(e.field, "vm[1].name", "{e}");
        let e = load_err(&GOOD.replace("netns = \"swvs-b\"", "ifname = \"a-very-long-interface\""));
        assert_eq!(e.field, "vm[1].ifname", "{e}");
        let e = load_err(&GOOD.replace("netns = \"swvs-b\"", "mtu = 4294967295"));
        assert_eq!(e.field, "vm[1].mtu", "{e}");
    }

    #[test]
    fn fabric_ranges_are_checked_without_overflow() {
        for (line, field) in [
            ("hw_entries_max = 4294967295", "fabric.dpu.hw_entries_max"),
            ("hw_entries_max = 4000000000", "fabric.dpu.hw_entries_max"),
            (
                "insert_queue_max = 4294967295",
                "fabric.dpu.insert_queue_max",
            ),
            (
                "mem_per_conn = 18446744073709551615",
                "fabric.dpu.mem_per_conn",
            ),
        ] {
            let e = load_err(&GOOD.replace("hw_pps_limit = 20000.0", line));
            assert_eq!(e.field, field, "{e}");
            assert_eq!(e.place, Some((7, 1)), "{e}");
        }
        let e = load_err(&GOOD.replace(
            "[fabric.dpu]",
            "[fabric.host]\ntenant_cores = 4294967295\nreserve_cores = 5\n[fabric.dpu]",
        ));
        assert_eq!(e.field, "fabric.host.tenant_cores", "{e}");
        for d in ["heartbeat = \"1ns\"", "heartbeat = \"100000000s\""] {
            let e = load_err(
                &GOOD.replace("[fabric.dpu]", &format!("[fabric.host]\n{d}\n[fabric.dpu]")),
            );
            assert_eq!(e.field, "fabric.host.heartbeat", "{e}");
            assert!(e.expected.contains("1ms..=10s"), "{e}");
        }
        let e = load_err(&GOOD.replace(
            "[fabric.dpu]",
            "[fabric.sched]\nwindow = \"1ns\"\n[fabric.dpu]",
        ));
        assert_eq!(e.field, "fabric.sched.window", "{e}");
        let e = load_err(&GOOD.replace("memory_max = \"256M\"", "memory_max = \"1K\""));
        assert_eq!(e.field, "spill.memory_max", "{e}");
    }

    #[test]
    fn errors_echo_a_bounded_part_of_a_huge_line() {
        let huge = "x".repeat(200_000);
        for text in [
            GOOD.replace("name = \"t1\"", &format!("name = \"{huge}\"")),
            GOOD.replace(
                "hw_pps_limit = 20000.0",
                &format!("hw_pps_limit = \"{huge}\""),
            ),
            GOOD.replace("mac = \"02:00:00:00:00:0b\"", &format!("mac = \"{huge}\"")),
            GOOD.replace("netns = \"swvs-b\"", &format!("netns = \"{huge}\"")),
            GOOD.replace("netns = \"swvs-b\"", &format!("{huge} = 1")),
        ] {
            let e = load_err(&text).to_string();
            assert!(e.len() < 700, "{} bytes: {}", e.len(), &e[..700]);
        }
    }

    #[test]
    fn spill_plane_identity_defaults_to_nobody_and_refuses_root() {
        let t = Testbed::from_toml_str(GOOD, Path::new("t.toml")).unwrap();
        assert_eq!(t.spill_privileges, PlanePrivileges::default());
        let custom = GOOD.replace(
            "[spill]",
            "[spill]\nuid = 4000\ngid = 4001\nseccomp = \"log\"",
        );
        let t = Testbed::from_toml_str(&custom, Path::new("t.toml")).unwrap();
        assert_eq!(
            t.spill_privileges,
            PlanePrivileges {
                uid: 4000,
                gid: 4001,
                seccomp: SeccompMode::Log
            }
        );
        for (field, line) in [
            ("spill.uid", "uid = 0"),
            ("spill.uid", "uid = -1"),
            ("spill.gid", "gid = 4294967295"),
            ("spill.gid", "gid = 4294967296"),
            ("spill.seccomp", "seccomp = \"off\""),
        ] {
            let bad = GOOD.replace("[spill]", &format!("[spill]\n{line}"));
            let e = Testbed::from_toml_str(&bad, Path::new("x.toml")).unwrap_err();
            assert_eq!(e.field, field, "{line}: {e}");
        }
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
