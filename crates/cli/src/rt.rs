//! `spillway run`, `spillway spill-plane` and `spillway ctl`: the real-time fabric's command
//! line. The work is in `spillway-rt`; this module parses arguments and prints results.

use crate::flags::{Seconds, ranged};
use anyhow::{Context, Result, bail};
use spillway_rt::dpu::daemon::{DpuDaemon, RunOptions};
use spillway_rt::ops::ctl::{CtlRequest, FLOWS_LIMIT_MAX, FlowOwner, ctl_call};
use spillway_rt::plane::process::{self, PlaneOptions};
use spillway_rt::shm::virtq::{BUF_BYTES_MAX, BUF_BYTES_MIN, QUEUE_SIZE_MAX, QUEUE_SIZE_MIN};
use spillway_rt::testbed::{InitialHold, TapIo, Testbed};
use std::path::PathBuf;
use std::time::Duration;

/// Arguments of `spillway run`.
#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// Testbed file (see `examples/testbed-*.toml`).
    #[arg(long)]
    pub config: PathBuf,
    /// Written with the DPU process's pid once the testbed is up.
    #[arg(long)]
    pub ready_file: Option<PathBuf>,
    /// Override the testbed's initial hold: auto (URSched decides), active (force a plane
    /// active), released (DPU only).
    #[arg(long)]
    pub hold: Option<String>,
    /// Override the testbed's `tap_io`: io_uring (batched, the default) or syscalls (a read
    /// and a write per frame), for measuring one against the other.
    #[arg(long)]
    pub tap_io: Option<String>,
    /// Log level: error, warn, info, debug, trace.
    #[arg(long, default_value = "info")]
    pub log: String,
}

/// Arguments of `spillway spill-plane` (started by `spillway run`, not by hand).
#[derive(clap::Args, Debug)]
pub struct PlaneArgs {
    /// The testbed file.
    #[arg(long)]
    pub config: PathBuf,
    /// The DPU process's vNIC socket.
    #[arg(long)]
    pub vnic_socket: PathBuf,
    /// Workers, 1..=1024.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub workers: u32,
    /// The DPU process's clock origin (CLOCK_MONOTONIC ns; any u64).
    #[arg(long)]
    pub clock_origin_ns: u64,
    /// Run the plane on the pool host whose service listens at this `address:port`, and
    /// relay its records (the DPU process passes this when URSched places the plane on a
    /// remote pool; the reservation's token follows the secret on stdin).
    #[arg(long)]
    pub remote: Option<std::net::SocketAddr>,
    /// With `--remote`: this host's name in the cluster (the reserver).
    #[arg(long, requires = "remote")]
    pub remote_host: Option<String>,
    /// With `--remote`: the namespace of this host's interface on the underlay, to connect
    /// from.
    #[arg(long, requires = "remote")]
    pub remote_netns: Option<String>,
    /// Log level.
    #[arg(long, default_value = "info")]
    pub log: String,
}

/// `spillway ctl` commands.
#[derive(clap::Subcommand, Debug)]
pub enum CtlCommand {
    /// Phase and the reason for it, hold, rates, counters, activations, recent events.
    Status,
    /// Flow dump with owner (dpu-hw / dpu-soc / spill) and why.
    Flows {
        /// At most this many rows, 1..=100000 (the daemon's own cap; default 1000).
        #[arg(long, value_parser = ranged(1, FLOWS_LIMIT_MAX as u64))]
        limit: Option<usize>,
        /// Only this owner: dpu-hw, dpu-soc or spill.
        #[arg(long, value_parser = parse_owner)]
        owner: Option<FlowOwner>,
    },
    /// Force activation: start a plane if none runs and keep it active (overrides URSched).
    Activate,
    /// Force release: hand everything back and keep the plane released.
    Release,
    /// Clear a forced activation or release: URSched decides again.
    Auto,
    /// Pre-warm: start a plane and keep it synced in shadow, not active (a later `activate`
    /// is then a warm activation).
    Prepare,
    /// Change the spill plane's placement policy (first-come, ovs-rebalance, threshold,
    /// stability, none).
    SetPolicy {
        /// Policy name.
        placement: String,
    },
    /// Re-read the testbed's [policy] and apply it to both planes (bumps the policy epoch).
    Reload,
    /// Counters and gauges as JSON.
    Metrics,
    /// Switch the spill plane's delivery into shared-memory VMs: `on` copies straight into VM
    /// memory through the vATC, `off` sends every packet back through the DPU.
    Vatc {
        /// on or off.
        state: String,
    },
    /// The host cores the tenants' VMs use now, as the host's VM scheduler would report it:
    /// the spill plane is placed on the others (URSched's isolatable cores).
    TenantCores {
        /// Cores in use by tenants, at most `fabric.host.cores`.
        cores: u32,
    },
    /// Online upgrade: start a new plane in the warm slot, sync it, hand the active plane's
    /// connections over, flip the redirect rules to it and retire the old plane.
    Upgrade {
        /// The binary the new plane (and every later one) runs: an absolute path to a file
        /// owned by root, not writable by group or others, in directories that are not either.
        #[arg(long)]
        binary: Option<PathBuf>,
    },
}

/// Most packets per second `vm-endpoint --pps` accepts (far above what one queue carries).
const ENDPOINT_PPS_MAX: u64 = 100_000_000;

/// Arguments of `spillway vm-endpoint`.
#[derive(clap::Args, Debug)]
pub struct EndpointArgs {
    /// The testbed file.
    #[arg(long)]
    pub config: PathBuf,
    /// The VM (a [[vm]] with backend = "shm").
    #[arg(long)]
    pub vm: String,
    /// sink (count, measure latency), gen (send UDP to --dst), echo (send UDP back), bridge
    /// (to the TAP given by --tap-fd; started by `spillway run`).
    #[arg(long)]
    pub mode: String,
    /// Generator: destination VM (name) or IPv4 address.
    #[arg(long)]
    pub dst: Option<String>,
    /// Generator: packets per second, 0..=100000000 (0: as fast as the queue takes them).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=ENDPOINT_PPS_MAX))]
    pub pps: u64,
    /// Generator: flows (source ports), round-robin, 1..=65535.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..))]
    pub flows: u16,
    /// Generator: frame size, bytes, 64..=131072 (and it must fit --buf-bytes with the
    /// virtio-net header).
    #[arg(long, default_value_t = 64, value_parser = ranged(64, u64::from(BUF_BYTES_MAX)))]
    pub size: usize,
    /// Generator: source port of the first flow, 1..=65535 (a fresh base makes fresh
    /// connections).
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u16).range(1..))]
    pub sport_base: u16,
    /// Stop after this many seconds, 0.001..=2592000 (30 days; default: until SIGINT/SIGTERM
    /// or the DPU goes away).
    #[arg(long, value_parser = Seconds::ENDPOINT_DURATION)]
    pub duration: Option<Duration>,
    /// Descriptors per queue: a power of two in 8..=4096.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u16).range(i64::from(QUEUE_SIZE_MIN)..=i64::from(QUEUE_SIZE_MAX)))]
    pub queue_size: u16,
    /// Bytes per buffer: a multiple of 64 in 256..=131072 (the default holds a 64 KiB GSO
    /// frame).
    #[arg(long, default_value_t = 65_600, value_parser = clap::value_parser!(u32).range(i64::from(BUF_BYTES_MIN)..=i64::from(BUF_BYTES_MAX)))]
    pub buf_bytes: u32,
    /// Bridge: the TAP's fd, inherited from `spillway run` (0..=2147483647).
    #[arg(long, hide = true, value_parser = clap::value_parser!(i32).range(0..))]
    pub tap_fd: Option<i32>,
    /// Write the JSON report here too.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Log level.
    #[arg(long, default_value = "info")]
    pub log: String,
}

/// `spillway vm-endpoint`.
pub fn vm_endpoint(args: &EndpointArgs) -> Result<()> {
    use spillway_rt::vm::endpoint::{self, EndpointOptions, GenOptions, Mode};
    spillway_rt::ops::log::init(level(&args.log)?, spillway_rt::ops::log::LogFormat::Text);
    spillway_rt::host::signals::install().context("installing signal handlers")?;
    let testbed = load_testbed(&args.config)?;
    let mode = match args.mode.as_str() {
        "sink" => Mode::Sink,
        "echo" => Mode::Echo,
        "bridge" => Mode::Bridge(
            args.tap_fd
                .context("--mode bridge needs --tap-fd (it is started by `spillway run`)")?,
        ),
        "gen" => {
            let dst = args.dst.as_deref().context("--mode gen needs --dst")?;
            let dst = match testbed.vms.iter().find(|v| v.name == dst) {
                Some(v) => v.ip,
                None => dst.parse().with_context(|| {
                    format!("--dst: expected a VM name or an IPv4 address, got {dst:?}")
                })?,
            };
            Mode::Gen(GenOptions {
                dst,
                pps: args.pps,
                flows: args.flows,
                size: args.size,
                sport_base: args.sport_base,
            })
        }
        other => bail!("--mode: expected sink, gen, echo or bridge, got {other:?}"),
    };
    let report = endpoint::run(EndpointOptions {
        testbed,
        vm: args.vm.clone(),
        mode,
        queue_size: args.queue_size,
        buf_bytes: args.buf_bytes,
        duration: args.duration,
    })
    .map_err(|e| anyhow::anyhow!("vm-endpoint {}: {e}", args.vm))?;
    let text = serde_json::to_string_pretty(&report)?;
    if let Some(p) = &args.json {
        std::fs::write(p, &text).with_context(|| format!("writing {}", p.display()))?;
    }
    println!("{text}");
    Ok(())
}

/// Arguments of `spillway ctl`.
#[derive(clap::Args, Debug)]
pub struct CtlArgs {
    /// The testbed file (its ctl socket is used) ...
    #[arg(long, conflicts_with = "socket")]
    pub config: Option<PathBuf>,
    /// ... or the ctl socket itself.
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// Seconds to wait for the answer, 0.001..=3600.
    #[arg(long, default_value = "5", value_parser = Seconds::CTL_TIMEOUT)]
    pub timeout: Duration,
    /// The command.
    #[command(subcommand)]
    pub command: CtlCommand,
}

/// Reads the testbed file `path`. Its errors already give `file:line:column: field:` and bound
/// what they quote (see `spillway_rt::testbed`).
fn load_testbed(path: &std::path::Path) -> Result<Testbed> {
    Ok(Testbed::load(path)?)
}

fn level(s: &str) -> Result<tracing::Level> {
    s.parse().map_err(|_| {
        anyhow::anyhow!("--log: expected error, warn, info, debug or trace, got {s:?}")
    })
}

/// `spillway run`.
pub fn run(args: &RunArgs) -> Result<()> {
    spillway_rt::ops::log::init(level(&args.log)?, spillway_rt::ops::log::LogFormat::Text);
    let mut testbed = load_testbed(&args.config)?;
    if let Some(h) = &args.hold {
        testbed.hold = match h.as_str() {
            "auto" => InitialHold::Auto,
            "active" => InitialHold::Active,
            "released" => InitialHold::Released,
            _ => bail!("--hold: expected auto, active or released, got {h:?}"),
        };
    }
    if let Some(t) = &args.tap_io {
        testbed.tap_io = match t.as_str() {
            "io_uring" => TapIo::Uring,
            "syscalls" => TapIo::Syscalls,
            _ => bail!("--tap-io: expected io_uring or syscalls, got {t:?}"),
        };
        if testbed.tap_io == TapIo::Syscalls && testbed.fabric.dpu.shards > 1 {
            bail!(
                "--tap-io syscalls: {} sets fabric.dpu.shards = {}, and several forwarding \
                 threads need io_uring",
                testbed.file.display(),
                testbed.fabric.dpu.shards
            );
        }
    }
    spillway_rt::host::signals::install().context("installing signal handlers")?;
    let plane_exe = std::env::current_exe().context("locating the spillway binary")?;
    let daemon = DpuDaemon::start(RunOptions {
        testbed,
        plane_exe,
        ready_file: args.ready_file.clone(),
    })?;
    let report = daemon.run()?;
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}

/// `spillway spill-plane`.
pub fn spill_plane(args: &PlaneArgs) -> Result<()> {
    spillway_rt::ops::log::init(level(&args.log)?, spillway_rt::ops::log::LogFormat::Text);
    spillway_rt::host::signals::install().context("installing signal handlers")?;
    process::run(PlaneOptions {
        config: args.config.clone(),
        vnic_socket: args.vnic_socket.clone(),
        workers: args.workers,
        clock_origin_ns: args.clock_origin_ns,
        remote: match args.remote {
            None => None,
            Some(endpoint) => Some(spillway_rt::remote::relay::RemoteOptions {
                endpoint,
                netns: args.remote_netns.clone(),
                host: args
                    .remote_host
                    .clone()
                    .context("--remote needs --remote-host")?,
            }),
        },
    })
    .map_err(|e| anyhow::anyhow!("spill plane: {e}"))
}

/// `--owner`: one of the names the daemon's flow dump uses.
fn parse_owner(s: &str) -> Result<FlowOwner, String> {
    FlowOwner::from_name(s).ok_or_else(|| {
        let names: Vec<&str> = FlowOwner::ALL.iter().map(|o| o.name()).collect();
        format!("expected one of {}", names.join(", "))
    })
}

/// `spillway ctl`.
pub fn ctl(args: &CtlArgs) -> Result<()> {
    let socket = match (&args.socket, &args.config) {
        (Some(s), _) => s.clone(),
        (None, Some(c)) => load_testbed(c)?.ctl_socket,
        (None, None) => bail!("give --config <testbed.toml> or --socket <path>"),
    };
    let req = match &args.command {
        CtlCommand::Status => CtlRequest::Status,
        CtlCommand::Flows { limit, owner } => CtlRequest::Flows {
            limit: *limit,
            owner: *owner,
        },
        CtlCommand::Activate => CtlRequest::Activate,
        CtlCommand::Release => CtlRequest::Release,
        CtlCommand::Auto => CtlRequest::Auto,
        CtlCommand::Prepare => CtlRequest::Prepare,
        CtlCommand::SetPolicy { placement } => CtlRequest::SetPolicy {
            placement: placement.clone(),
        },
        CtlCommand::Reload => CtlRequest::Reload,
        CtlCommand::Metrics => CtlRequest::Metrics,
        CtlCommand::Vatc { state } => CtlRequest::Vatc {
            on: match state.as_str() {
                "on" => true,
                "off" => false,
                _ => bail!("vatc: expected on or off, got {state:?}"),
            },
        },
        CtlCommand::TenantCores { cores } => CtlRequest::TenantCores { cores: *cores },
        CtlCommand::Upgrade { binary } => CtlRequest::Upgrade {
            binary: match binary {
                Some(b) => Some(
                    std::path::absolute(b)
                        .with_context(|| format!("upgrade: --binary {}", b.display()))?
                        .to_str()
                        .with_context(|| format!("upgrade: --binary {} is not UTF-8", b.display()))?
                        .to_string(),
                ),
                None => None,
            },
        },
    };
    let resp = ctl_call(&socket, &req, args.timeout)?;
    if !resp.ok {
        bail!(
            "{}",
            resp.error.unwrap_or_else(|| "request failed".to_string())
        );
    }
    println!("{}", serde_json::to_string_pretty(&resp.body)?);
    Ok(())
}
