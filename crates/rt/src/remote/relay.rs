//! The relay: the DPU process's "plane" when the plane runs on a pool host
//! (`spillway spill-plane --remote ADDR`).
//!
//! The DPU process starts it exactly as it starts a local plane (same pid check, same secret,
//! same vNIC set), and hands it, after the secret, the token of its reservation on the pool
//! host. The relay maps the vNIC set, enters the host's namespace on the underlay, connects to
//! the pool host's service, says who it is (host, token, lanes, workers, clock origin, and the
//! testbed text the plane there builds its pipeline from), and once the service has started
//! the plane, pumps records both ways until either side goes. It exits when the link closes, so
//! the DPU process sees its plane die and fails open (or over), as for a local plane.

use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use serde_json::json;

use crate::plane::process::PlaneOptions;
use crate::remote::link::{self, Pump};
use crate::shm::vnic::{SECRET_LEN, VnicSet};
use crate::testbed::Testbed;

/// Where the relay's plane runs.
#[derive(Clone, Debug)]
pub struct RemoteOptions {
    /// The pool host's service (`address:port` on the underlay).
    pub endpoint: SocketAddr,
    /// The namespace of this host's interface on the underlay, entered before connecting.
    pub netns: Option<String>,
    /// This host's name in the cluster (the reserver).
    pub host: String,
}

/// How long the pool host may take to start the plane and answer.
const ANSWER_WITHIN: Duration = Duration::from_secs(10);

/// Bytes of a token at most (the cluster's bound).
const TOKEN_MAX: usize = spillway_cluster::TOKEN_LEN_MAX;

/// The secret and the token, from stdin (the DPU process's pipe, closed after them).
fn read_stdin() -> Result<([u8; SECRET_LEN], String), String> {
    let mut all = Vec::with_capacity(SECRET_LEN + TOKEN_MAX);
    std::io::Read::read_to_end(
        &mut std::io::Read::take(std::io::stdin().lock(), (SECRET_LEN + TOKEN_MAX + 1) as u64),
        &mut all,
    )
    .map_err(|e| format!("reading the secret and token from stdin: {e}"))?;
    if all.len() <= SECRET_LEN || all.len() > SECRET_LEN + TOKEN_MAX {
        return Err(format!(
            "expected a {SECRET_LEN}-byte secret and a token of 1 to {TOKEN_MAX} bytes on \
             stdin (`spillway run` hands them), got {} bytes",
            all.len()
        ));
    }
    let secret: [u8; SECRET_LEN] = all[..SECRET_LEN].try_into().expect("checked length");
    let token = std::str::from_utf8(&all[SECRET_LEN..])
        .map_err(|_| "the token is not UTF-8".to_string())?
        .to_string();
    Ok((secret, token))
}

/// Runs the relay until the link or the DPU process goes, or a signal asks it to stop.
pub fn run(opts: &PlaneOptions, remote: &RemoteOptions) -> Result<(), String> {
    let tb = Testbed::load(&opts.config).map_err(|e| e.to_string())?;
    let text = std::fs::read_to_string(&opts.config)
        .map_err(|e| format!("{}: {e}", opts.config.display()))?;
    let (secret, token) = read_stdin()?;
    let stream = UnixStream::connect(&opts.vnic_socket)
        .map_err(|e| format!("connecting to {}: {e}", opts.vnic_socket.display()))?;
    crate::plane::process::check_parent(&stream, &opts.vnic_socket)?;
    crate::shm::vnic::send_auth(&stream, &secret).map_err(|e| e.to_string())?;
    let (mut vnic, hello) = VnicSet::accept(stream).map_err(|e| e.to_string())?;
    if let Some(ns) = &remote.netns {
        crate::host::netns::enter(ns)?;
    }
    let mut tcp = TcpStream::connect_timeout(&remote.endpoint, Duration::from_secs(2))
        .map_err(|e| format!("connecting to the pool host at {}: {e}", remote.endpoint))?;
    tcp.set_write_timeout(Some(Duration::from_secs(2)))
        .map_err(|e| e.to_string())?;
    link::send_json(
        &mut tcp,
        &json!({
            "host": remote.host,
            "token": token,
            "lanes": vnic.lanes(),
            "workers": opts.workers,
            "clock_origin_ns": opts.clock_origin_ns,
            "testbed": text,
        }),
    )
    .map_err(|e| e.to_string())?;
    let answer = link::recv_json(&mut tcp, ANSWER_WITHIN).map_err(|e| e.to_string())?;
    if answer["ok"] != true {
        return Err(format!(
            "the pool host at {} refused: {}",
            remote.endpoint,
            answer["error"].as_str().unwrap_or("no reason given")
        ));
    }
    tracing::info!(target: "spillway::plane", endpoint = %remote.endpoint, hello = %hello, plane_pid = %answer["pid"], "relay: the plane runs on the pool host");
    // The socket's options first: the filter the plane runs under allows neither ioctl nor
    // setsockopt.
    let mut pump = Pump::new(tcp).map_err(|e| e.to_string())?;
    crate::plane::process::drop_privileges(&tb)?;
    let r = pump.run(&mut vnic, crate::host::signals::stop_requested);
    tracing::info!(target: "spillway::plane", counters = ?pump.counters, "relay: link done");
    r.map_err(|e| format!("link to the pool host at {}: {e}", remote.endpoint))
}
