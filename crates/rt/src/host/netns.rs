//! Network namespaces, links, addresses, routes and sysctls through `ip` (iproute2).
//!
//! A testbed is a handful of network namespaces (each playing a VM or a host), veth pairs and
//! TAP devices between them, addresses, routes and static neighbours. These are set up once
//! and never on a hot path, so we shell out to `ip`: zero build cost, and every step is a
//! command line an operator can paste to reproduce or inspect it. Each error carries that
//! command line and `ip`'s stderr.
//!
//! Functions taking `ns: Option<&str>` act inside that namespace (`ip -n <ns> ...`) or, with
//! `None`, in the caller's.
//!
//! Removing what these functions create, even after a crash, is the job of the
//! [`Ledger`](super::ledger::Ledger) in [`super::ledger`].

use std::fmt::Write as _;
use std::fs;
use std::io;
use std::net::IpAddr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use spillway_wire::MacAddr;
use thiserror::Error;

/// Errors from namespace and link commands. Each carries the command line that was run.
#[derive(Debug, Error)]
pub enum NetnsError {
    /// A program we need is not installed.
    #[error("`{tool}` not found on PATH (install {package}); needed for `{cmd}`")]
    ToolMissing {
        /// The program, e.g. `ip` or `ethtool`.
        tool: &'static str,
        /// The Debian package that provides it.
        package: &'static str,
        /// The command line that needed it.
        cmd: String,
    },
    /// The command could not be started.
    #[error("could not run `{cmd}`: {source}")]
    Spawn {
        /// The command line.
        cmd: String,
        /// The OS error.
        source: io::Error,
    },
    /// The command ran and failed.
    #[error("`{cmd}` failed ({status}): {stderr}")]
    Failed {
        /// The command line.
        cmd: String,
        /// Its exit status.
        status: std::process::ExitStatus,
        /// Its standard error, trimmed.
        stderr: String,
    },
    /// An argument was rejected before running anything.
    #[error("invalid {what} {value:?}: {reason}")]
    InvalidArg {
        /// What kind of argument: "namespace name", "link name", "sysctl key", ...
        what: &'static str,
        /// The value given.
        value: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// Writing a sysctl in the caller's namespace failed.
    #[error("writing {value:?} to {path}: {source}")]
    Sysctl {
        /// The /proc/sys file.
        path: PathBuf,
        /// The value.
        value: String,
        /// The OS error.
        source: io::Error,
    },
}

// ---- Running commands ------------------------------------------------------------------------

/// The command line of `cmd` as one string, for error messages: arguments with spaces quoted.
pub(super) fn cmd_line(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for arg in cmd.get_args() {
        let arg = arg.to_string_lossy();
        if arg.is_empty() || arg.contains(char::is_whitespace) {
            let _ = write!(s, " {arg:?}");
        } else {
            let _ = write!(s, " {arg}");
        }
    }
    s
}

/// Runs `cmd` to completion and returns its stdout; a non-zero exit is an error with stderr.
fn run(mut cmd: Command, tool: &'static str, package: &'static str) -> Result<String, NetnsError> {
    let line = cmd_line(&cmd);
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|source| match source.kind() {
            io::ErrorKind::NotFound => NetnsError::ToolMissing {
                tool,
                package,
                cmd: line.clone(),
            },
            _ => NetnsError::Spawn {
                cmd: line.clone(),
                source,
            },
        })?;
    if !out.status.success() {
        return Err(NetnsError::Failed {
            cmd: line,
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `ip [-n <ns>] <args...>`.
fn ip(ns: Option<&str>, args: &[&str]) -> Result<String, NetnsError> {
    let mut cmd = Command::new("ip");
    if let Some(ns) = ns {
        check_netns_name(ns)?;
        cmd.args(["-n", ns]);
    }
    cmd.args(args);
    run(cmd, "ip", "iproute2")
}

/// Whether `program` is an executable file in a `PATH` directory.
fn on_path(program: &str) -> bool {
    find_on_path(program).is_some()
}

/// `program`'s path: the first executable file of that name in a `PATH` directory.
pub fn find_on_path(program: &str) -> Option<std::path::PathBuf> {
    let paths = std::env::var_os("PATH")?;
    std::env::split_paths(&paths)
        .map(|dir| dir.join(program))
        .find(|p| fs::metadata(p).is_ok_and(|m| m.is_file() && m.mode() & 0o111 != 0))
}

// ---- Argument checks: reject early what `ip` would misparse ---------------------------------

fn invalid(what: &'static str, value: &str, reason: &'static str) -> NetnsError {
    NetnsError::InvalidArg {
        what,
        value: value.to_owned(),
        reason,
    }
}

/// Namespace names become file names under /run/netns.
pub(super) fn check_netns_name(name: &str) -> Result<(), NetnsError> {
    const WHAT: &str = "namespace name";
    if name.is_empty() || name == "." || name == ".." {
        return Err(invalid(WHAT, name, "empty, '.' or '..'"));
    }
    if name.len() > 255 {
        return Err(invalid(WHAT, name, "longer than 255 bytes"));
    }
    if name.starts_with('-') {
        return Err(invalid(
            WHAT,
            name,
            "starts with '-' (would parse as an option)",
        ));
    }
    if name.contains(|c: char| c == '/' || c == '\0' || c.is_whitespace()) {
        return Err(invalid(WHAT, name, "contains '/', NUL or whitespace"));
    }
    Ok(())
}

/// Interface names: at most 15 bytes, no '/', ':' or whitespace (the kernel's `dev_valid_name`).
pub(super) fn check_link_name(name: &str) -> Result<(), NetnsError> {
    const WHAT: &str = "link name";
    if name.is_empty() || name == "." || name == ".." {
        return Err(invalid(WHAT, name, "empty, '.' or '..'"));
    }
    if name.len() > 15 {
        return Err(invalid(WHAT, name, "longer than 15 bytes"));
    }
    if name.starts_with('-') {
        return Err(invalid(
            WHAT,
            name,
            "starts with '-' (would parse as an option)",
        ));
    }
    if name.contains(|c: char| c == '/' || c == ':' || c == '\0' || c.is_whitespace()) {
        return Err(invalid(WHAT, name, "contains '/', ':', NUL or whitespace"));
    }
    Ok(())
}

// ---- Namespaces --------------------------------------------------------------------------------

/// Creates network namespace `name` (`ip netns add`), bound at `/run/netns/<name>`.
pub fn netns_add(name: &str) -> Result<(), NetnsError> {
    check_netns_name(name)?;
    ip(None, &["netns", "add", name]).map(drop)
}

/// Deletes network namespace `name` (`ip netns del`). Links inside go with it once no process
/// holds the namespace; veth peers outside are deleted with their inside end.
pub fn netns_del(name: &str) -> Result<(), NetnsError> {
    check_netns_name(name)?;
    ip(None, &["netns", "del", name]).map(drop)
}

/// Whether a named network namespace exists (`ip netns list`).
pub fn netns_exists(name: &str) -> Result<bool, NetnsError> {
    check_netns_name(name)?;
    let list = ip(None, &["netns", "list"])?;
    // Lines look like "name" or "name (id: 3)".
    Ok(list
        .lines()
        .any(|l| l.split_whitespace().next() == Some(name)))
}

/// A `Command` that runs `program` inside namespace `ns` (`ip netns exec <ns> <program>`); add
/// arguments and spawn it as usual. `ip netns exec` also mounts a /sys for the namespace and
/// applies `/etc/netns/<ns>`, as an operator's shell would see it.
pub fn run_in_netns(ns: &str, program: &str) -> Command {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", ns, program]);
    cmd
}

// ---- Links -------------------------------------------------------------------------------------

/// Moves `link` from the caller's namespace into namespace `ns`.
pub fn link_set_netns(link: &str, ns: &str) -> Result<(), NetnsError> {
    check_link_name(link)?;
    check_netns_name(ns)?;
    ip(None, &["link", "set", "dev", link, "netns", ns]).map(drop)
}

/// Creates a veth pair `a` <-> `b` in the caller's namespace.
pub fn veth_add(a: &str, b: &str) -> Result<(), NetnsError> {
    check_link_name(a)?;
    check_link_name(b)?;
    ip(None, &["link", "add", a, "type", "veth", "peer", "name", b]).map(drop)
}

/// Deletes link `name` (for a veth, both ends).
pub fn link_del(name: &str, ns: Option<&str>) -> Result<(), NetnsError> {
    check_link_name(name)?;
    ip(ns, &["link", "del", "dev", name]).map(drop)
}

/// Whether link `name` exists in `ns` (false as well when the namespace does not exist).
pub fn link_exists(name: &str, ns: Option<&str>) -> Result<bool, NetnsError> {
    check_link_name(name)?;
    if let Some(ns) = ns
        && !netns_exists(ns)?
    {
        return Ok(false);
    }
    match ip(ns, &["link", "show", "dev", name]) {
        Ok(_) => Ok(true),
        // iproute2 says "Device \"x\" does not exist." for a missing link.
        Err(NetnsError::Failed { stderr, .. }) if stderr.contains("does not exist") => Ok(false),
        Err(e) => Err(e),
    }
}

/// Brings `link` up.
pub fn link_set_up(ns: Option<&str>, link: &str) -> Result<(), NetnsError> {
    check_link_name(link)?;
    ip(ns, &["link", "set", "dev", link, "up"]).map(drop)
}

/// Sets the MAC address of `link`.
pub fn link_set_mac(ns: Option<&str>, link: &str, mac: MacAddr) -> Result<(), NetnsError> {
    check_link_name(link)?;
    ip(
        ns,
        &["link", "set", "dev", link, "address", &mac.to_string()],
    )
    .map(drop)
}

/// Sets the MTU of `link`.
pub fn link_set_mtu(ns: Option<&str>, link: &str, mtu: u32) -> Result<(), NetnsError> {
    check_link_name(link)?;
    ip(ns, &["link", "set", "dev", link, "mtu", &mtu.to_string()]).map(drop)
}

/// Adds address `cidr` (e.g. `10.0.0.1/24` or `fd00::1/64`) to `link`.
pub fn addr_add(ns: Option<&str>, link: &str, cidr: &str) -> Result<(), NetnsError> {
    check_link_name(link)?;
    if cidr.starts_with('-') || cidr.contains(char::is_whitespace) {
        return Err(invalid("address", cidr, "not an address/prefix"));
    }
    ip(ns, &["addr", "add", cidr, "dev", link]).map(drop)
}

/// Adds a route to `dest` (a prefix or `default`) via gateway `via` and/or out of `dev`; at
/// least one of the two must be given.
pub fn route_add(
    ns: Option<&str>,
    dest: &str,
    via: Option<IpAddr>,
    dev: Option<&str>,
) -> Result<(), NetnsError> {
    if dest.starts_with('-') || dest.is_empty() || dest.contains(char::is_whitespace) {
        return Err(invalid(
            "route destination",
            dest,
            "not a prefix or 'default'",
        ));
    }
    if via.is_none() && dev.is_none() {
        return Err(invalid("route", dest, "needs a gateway (via) or a device"));
    }
    let via = via.map(|v| v.to_string());
    let mut args = vec!["route", "add", dest];
    if let Some(via) = &via {
        args.extend(["via", via.as_str()]);
    }
    if let Some(dev) = dev {
        check_link_name(dev)?;
        args.extend(["dev", dev]);
    }
    ip(ns, &args).map(drop)
}

/// Installs a permanent neighbour entry `ip` -> `mac` on `dev`, so traffic to a peer that never
/// answers ARP/ND (a TAP read by a test) leaves without resolution. Uses `ip neigh replace`, so
/// an entry the kernel already made for `ip` is overwritten rather than an error.
pub fn neigh_add_permanent(
    ns: Option<&str>,
    ip_addr: IpAddr,
    mac: MacAddr,
    dev: &str,
) -> Result<(), NetnsError> {
    check_link_name(dev)?;
    let (ip_s, mac_s) = (ip_addr.to_string(), mac.to_string());
    let args = [
        "neigh",
        "replace",
        &ip_s,
        "lladdr",
        &mac_s,
        "dev",
        dev,
        "nud",
        "permanent",
    ];
    ip(ns, &args).map(drop)
}

/// Turns an offload `feature` of `link` on or off with `ethtool -K` (in `ns` through
/// `ip netns exec`). `ethtool` is often not installed: that is a [`NetnsError::ToolMissing`].
pub fn ethtool_offload(
    ns: Option<&str>,
    link: &str,
    feature: &str,
    on: bool,
) -> Result<(), NetnsError> {
    check_link_name(link)?;
    if feature.is_empty() || feature.starts_with('-') || feature.contains(char::is_whitespace) {
        return Err(invalid("ethtool feature", feature, "not a feature name"));
    }
    let state = if on { "on" } else { "off" };
    let mut cmd = match ns {
        Some(ns) => {
            check_netns_name(ns)?;
            run_in_netns(ns, "ethtool")
        }
        None => Command::new("ethtool"),
    };
    cmd.args(["-K", link, feature, state]);
    // Under `ip netns exec` a missing ethtool would surface as an exec failure inside ip;
    // look it up first for a clear error.
    if !on_path("ethtool") {
        return Err(NetnsError::ToolMissing {
            tool: "ethtool",
            package: "ethtool",
            cmd: cmd_line(&cmd),
        });
    }
    run(cmd, "ethtool", "ethtool").map(drop)
}

/// Sets sysctl `key` (`net.ipv4.ip_forward`, or with slashes `net/ipv4/conf/eth0.1/rp_filter`)
/// to `value` in `ns`. Network sysctls are per namespace; in one, the write is done by a shell
/// started with `ip netns exec`, which avoids depending on procps' `sysctl`.
pub fn sysctl(ns: Option<&str>, key: &str, value: &str) -> Result<(), NetnsError> {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '/');
    if key.is_empty() || !key.chars().all(ok_char) || key.split(['.', '/']).any(str::is_empty) {
        return Err(invalid(
            "sysctl key",
            key,
            "expected dotted or slashed /proc/sys path",
        ));
    }
    if value.contains('\n') {
        return Err(invalid("sysctl value", value, "contains a newline"));
    }
    // Slashes mean the key is already a path (needed when a component contains a dot).
    let rel = if key.contains('/') {
        key.to_owned()
    } else {
        key.replace('.', "/")
    };
    let path = Path::new("/proc/sys").join(rel);
    match ns {
        None => fs::write(&path, value).map_err(|source| NetnsError::Sysctl {
            path,
            value: value.to_owned(),
            source,
        }),
        Some(ns) => {
            check_netns_name(ns)?;
            let mut cmd = run_in_netns(ns, "sh");
            // Value and path are positional parameters, never parsed by the shell.
            cmd.args(["-c", "printf '%s\\n' \"$1\" > \"$2\"", "sh", value])
                .arg(&path);
            run(cmd, "ip", "iproute2").map(drop)
        }
    }
}

/// Enters network namespace `ns` (`/run/netns/<ns>`) on the calling thread only: a thread or
/// process it then starts is in it too, and nothing else changes (mounts stay the machine's).
pub fn enter(ns: &str) -> Result<(), String> {
    check_netns_name(ns).map_err(|e| e.to_string())?;
    let path = std::path::Path::new("/run/netns").join(ns);
    let f = std::fs::File::open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    rustix::thread::move_into_link_name_space(
        std::os::fd::AsFd::as_fd(&f),
        Some(rustix::thread::LinkNameSpaceType::Network),
    )
    .map_err(|e| format!("entering namespace {ns}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_ip_would_misparse_are_rejected() {
        assert!(matches!(
            netns_add("-n"),
            Err(NetnsError::InvalidArg { .. })
        ));
        assert!(matches!(
            netns_add("a/b"),
            Err(NetnsError::InvalidArg { .. })
        ));
        assert!(matches!(
            veth_add("abcdefghijklmnop", "x"),
            Err(NetnsError::InvalidArg { .. })
        ));
        assert!(matches!(
            link_set_up(Some("ns"), "a b"),
            Err(NetnsError::InvalidArg { .. })
        ));
        assert!(matches!(
            sysctl(None, "../etc/passwd", "x"),
            Err(NetnsError::InvalidArg { .. })
        ));
        assert!(matches!(
            route_add(None, "default", None, None),
            Err(NetnsError::InvalidArg { .. })
        ));
    }

    #[test]
    fn cmd_line_quotes_arguments_with_spaces() {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", "n", "sh", "-c", "echo hi"]);
        assert_eq!(cmd_line(&c), r#"ip netns exec n sh -c "echo hi""#);
    }
}
