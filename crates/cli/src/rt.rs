//! `spillway run`, `spillway spill-plane` and `spillway ctl`: the real-time fabric's command
//! line. The work is in `spillway-rt`; this module parses arguments and prints results.

use anyhow::{Context, Result, bail};
use spillway_rt::ctl::{CtlRequest, ctl_call};
use spillway_rt::dpud::{DpuDaemon, RunOptions};
use spillway_rt::planed::{self, PlaneOptions};
use spillway_rt::testbed::{InitialHold, Testbed};
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
    /// Workers.
    #[arg(long, default_value_t = 1)]
    pub workers: u32,
    /// The DPU process's clock origin (CLOCK_MONOTONIC ns).
    #[arg(long)]
    pub clock_origin_ns: u64,
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
        /// At most this many rows.
        #[arg(long)]
        limit: Option<usize>,
        /// Only this owner: dpu-hw, dpu-soc or spill.
        #[arg(long)]
        owner: Option<String>,
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
    /// Seconds to wait for the answer.
    #[arg(long, default_value_t = 5.0)]
    pub timeout: f64,
    /// The command.
    #[command(subcommand)]
    pub command: CtlCommand,
}

fn level(s: &str) -> Result<tracing::Level> {
    s.parse().map_err(|_| {
        anyhow::anyhow!("--log: expected error, warn, info, debug or trace, got {s:?}")
    })
}

/// `spillway run`.
pub fn run(args: &RunArgs) -> Result<()> {
    spillway_rt::log::init(level(&args.log)?, spillway_rt::log::LogFormat::Text);
    let mut testbed = Testbed::load(&args.config)?;
    if let Some(h) = &args.hold {
        testbed.hold = match h.as_str() {
            "auto" => InitialHold::Auto,
            "active" => InitialHold::Active,
            "released" => InitialHold::Released,
            _ => bail!("--hold: expected auto, active or released, got {h:?}"),
        };
    }
    spillway_rt::signals::install().context("installing signal handlers")?;
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
    spillway_rt::log::init(level(&args.log)?, spillway_rt::log::LogFormat::Text);
    spillway_rt::signals::install().context("installing signal handlers")?;
    planed::run(PlaneOptions {
        config: args.config.clone(),
        vnic_socket: args.vnic_socket.clone(),
        workers: args.workers,
        clock_origin_ns: args.clock_origin_ns,
    })
    .map_err(|e| anyhow::anyhow!("spill plane: {e}"))
}

/// `spillway ctl`.
pub fn ctl(args: &CtlArgs) -> Result<()> {
    let socket = match (&args.socket, &args.config) {
        (Some(s), _) => s.clone(),
        (None, Some(c)) => Testbed::load(c)?.ctl_socket,
        (None, None) => bail!("give --config <testbed.toml> or --socket <path>"),
    };
    let req = match &args.command {
        CtlCommand::Status => CtlRequest::Status,
        CtlCommand::Flows { limit, owner } => CtlRequest::Flows {
            limit: *limit,
            owner: owner.clone(),
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
    };
    let resp = ctl_call(&socket, &req, Duration::from_secs_f64(args.timeout))?;
    if !resp.ok {
        bail!(
            "{}",
            resp.error.unwrap_or_else(|| "request failed".to_string())
        );
    }
    println!("{}", serde_json::to_string_pretty(&resp.body)?);
    Ok(())
}
