//! Brings a testbed's VMs up: for each, a network namespace and a TAP device the DPU process
//! holds, moved into the namespace, renamed, addressed, and its GSO size capped so a TSO
//! super-frame plus headers fits a 64 KiB frame. Like an unmodified guest, a VM gets only its
//! address and a default route via the tenant router's address on its subnet, and resolves the
//! router and its on-link peers with ARP, which the vSwitch's neighbour responder answers with
//! the router MAC. A VM whose port has an IPv6 address also gets that (with duplicate address
//! detection) and a default route via the router's link-local address, as a router
//! advertisement would give; other VMs have IPv6 off. A VM with `static_neighbours` (or whose subnet has no router address) gets
//! the old set-up instead: on-link routes to peers outside its subnet and, with
//! `static_neighbours`, permanent neighbour entries pointing every peer at the router MAC.
//!
//! Every namespace is recorded in the [`Ledger`] before it is created, so a crash leaves
//! nothing the next start cannot remove. The TAPs are not persistent: they vanish with the
//! process's fds (and with their namespace).

use std::net::IpAddr;

use crate::host::ledger::Ledger;
use crate::host::netns;
use crate::host::tap::{Tap, TapOptions};
use crate::testbed::{Testbed, VmBackend, VmEndpoint, VmSpec};

/// GSO super-frames from the VMs are capped below the 65,535-byte IP datagram limit so that
/// the Ethernet frame parses (its length must fit 16 bits too).
const GSO_MAX_SIZE: u32 = 62_000;

/// Creates every VM of `tb`; returns each with its TAP, in testbed order.
pub fn bring_up(tb: &Testbed, ledger: &mut Ledger) -> Result<Vec<(VmSpec, Option<Tap>)>, String> {
    let mut out = Vec::with_capacity(tb.vms.len());
    for vm in &tb.vms {
        if matches!(
            vm.backend,
            VmBackend::Shm(VmEndpoint::External) | VmBackend::VhostUser(_)
        ) {
            // Its endpoint (or guest) brings its own memory and no namespace.
            out.push((vm.clone(), None));
            continue;
        }
        let tap = bring_up_vm(tb, vm, ledger).map_err(|e| format!("vm {}: {e}", vm.name))?;
        out.push((vm.clone(), Some(tap)));
    }
    Ok(out)
}

/// `ip -n ns ARGS`, its error output in the error.
fn ip_in(ns: &str, args: &[&str]) -> Result<(), String> {
    let out = std::process::Command::new("ip")
        .arg("-n")
        .arg(ns)
        .args(args)
        .output()
        .map_err(|e| format!("running ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip -n {ns} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Creates the uplink's TAP (`[uplink]`), if the testbed has one: moved into the underlay's
/// namespace, into its bridge, and up. The namespace and the bridge are the operator's; only
/// the TAP is ours, and it vanishes with the process's fds.
pub fn bring_up_uplink(tb: &Testbed, ledger: &mut Ledger) -> Result<Option<Tap>, String> {
    let Some(u) = &tb.uplink else {
        return Ok(None);
    };
    let ns = u.netns.as_str();
    if !netns::netns_exists(ns).map_err(|e| e.to_string())? {
        return Err(format!(
            "uplink: namespace {ns} does not exist (the underlay is the operator's: create it \
             and its bridge first, e.g. `ip netns add {ns}`)"
        ));
    }
    let opts = TapOptions {
        vnet_hdr: tb.vnet_hdr,
        offload: false,
        queues: u16::try_from(tb.fabric.dpu.shards.max(1)).unwrap_or(u16::MAX),
    };
    let tap = Tap::create(&u.tap, opts).map_err(|e| format!("uplink: {e}"))?;
    ledger
        .link_set_netns(&u.tap, ns)
        .map_err(|e| format!("uplink: {e}"))?;
    if let Some(br) = &u.bridge {
        ip_in(ns, &["link", "set", "dev", &u.tap, "master", br])
            .map_err(|e| format!("uplink: {e}"))?;
    }
    netns::link_set_up(Some(ns), &u.tap).map_err(|e| format!("uplink: {e}"))?;
    Ok(Some(tap))
}

fn bring_up_vm(tb: &Testbed, vm: &VmSpec, ledger: &mut Ledger) -> Result<Tap, String> {
    let ns = vm.netns.as_str();
    if netns::netns_exists(ns).map_err(|e| e.to_string())? {
        return Err(format!(
            "namespace {ns} already exists (another testbed, or a run that did not clean up \
             and left no ledger); remove it with `ip netns del {ns}`"
        ));
    }
    ledger.netns_add(ns).map_err(|e| e.to_string())?;
    // A bridged shared-memory port carries the virtio-net header end to end.
    let vnet = tb.vnet_hdr || matches!(vm.backend, VmBackend::Shm(_));
    let opts = TapOptions {
        vnet_hdr: vnet,
        offload: vnet,
        // One queue per forwarding thread (each shard's thread reads and writes its own).
        queues: u16::try_from(tb.fabric.dpu.shards.max(1)).unwrap_or(u16::MAX),
    };
    let tap = Tap::create(&vm.tap, opts).map_err(|e| e.to_string())?;
    ledger
        .link_set_netns(&vm.tap, ns)
        .map_err(|e| e.to_string())?;
    let ip = |args: &[&str]| ip_in(ns, args);
    ip(&["link", "set", "dev", &vm.tap, "name", &vm.ifname])?;
    let e = |e: netns::NetnsError| e.to_string();
    // A VM without an IPv6 address is an IPv4 host: IPv6 stays off, so its namespace sends no
    // router solicitations or MLD reports (the vSwitch would only consume them).
    if vm.ip6.is_none() {
        netns::sysctl(Some(ns), "net.ipv6.conf.all.disable_ipv6", "1").map_err(e)?;
        netns::sysctl(Some(ns), "net.ipv6.conf.default.disable_ipv6", "1").map_err(e)?;
    }
    netns::link_set_mac(Some(ns), &vm.ifname, vm.mac).map_err(e)?;
    netns::link_set_mtu(Some(ns), &vm.ifname, vm.mtu).map_err(e)?;
    ip(&[
        "link",
        "set",
        "dev",
        &vm.ifname,
        "gso_max_size",
        &GSO_MAX_SIZE.to_string(),
    ])?;
    netns::addr_add(
        Some(ns),
        &vm.ifname,
        &format!("{}/{}", vm.ip, vm.prefix_len),
    )
    .map_err(e)?;
    if let Some((a, len)) = vm.ip6 {
        // With duplicate address detection: the responder keeps silent about the VM's own
        // address, so it completes.
        netns::addr_add(Some(ns), &vm.ifname, &format!("{a}/{len}")).map_err(e)?;
    }
    netns::link_set_up(Some(ns), "lo").map_err(e)?;
    netns::link_set_up(Some(ns), &vm.ifname).map_err(e)?;
    let mask = u32::MAX
        .checked_shl(32 - u32::from(vm.prefix_len))
        .unwrap_or(0);
    if let (Some(_), false) = (vm.ip6, vm.static_neighbours) {
        // What a router advertisement would give: the router's link-local address.
        let ll = std::net::Ipv6Addr::from(spillway_wire::nd::link_local_of(vm.router_mac));
        netns::route_add(Some(ns), "default", Some(IpAddr::V6(ll)), Some(&vm.ifname)).map_err(e)?;
    }
    if let (Some(gw), false) = (vm.gateway, vm.static_neighbours) {
        netns::route_add(Some(ns), "default", Some(IpAddr::V4(gw)), Some(&vm.ifname)).map_err(e)?;
        return Ok(tap);
    }
    for peer in &vm.peers {
        if u32::from(*peer) & mask != u32::from(vm.ip) & mask {
            // A peer in another subnet of the tenant: on-link through the router too.
            netns::route_add(Some(ns), &format!("{peer}/32"), None, Some(&vm.ifname)).map_err(e)?;
        }
        if vm.static_neighbours {
            netns::neigh_add_permanent(Some(ns), IpAddr::V4(*peer), vm.router_mac, &vm.ifname)
                .map_err(e)?;
        }
    }
    Ok(tap)
}
