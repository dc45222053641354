//! The `spillway` command line: run the vSwitch pipeline over captures, inspect captures, and
//! benchmark the data path, simulate the fabric, and run it in real time (`run`, `ctl`).

mod alloc;
mod bench;
mod flags;
mod inspect;
mod pcapio;
mod rt;
mod run;
mod sim;
mod stability;
mod traffic;

use anyhow::Result;
use clap::{Parser, Subcommand};
use std::path::PathBuf;

/// Transparent huge pages for the big tables; see `alloc`.
#[global_allocator]
static GLOBAL: alloc::HugePageAlloc = alloc::HugePageAlloc;

#[derive(Parser, Debug)]
#[command(
    name = "spillway",
    version,
    about = "Elastic DPU + host vSwitch fabric"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Work with packet captures.
    #[command(subcommand)]
    Pcap(PcapCommand),
    /// Benchmarks that print machine-readable results.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Simulate the fabric on a scenario (model results, virtual time), or run a seed swarm
    /// (`spillway sim swarm`).
    #[command(args_conflicts_with_subcommands = true)]
    Sim(sim::SimArgs),
    /// The flow-stability classifier offline: rank a feature trace, generate and evaluate
    /// labelled traces.
    #[command(subcommand)]
    Stability(stability::StabilityCommand),
    /// Bring up a testbed (tenant VMs as network namespaces on TAP devices) and run the fabric
    /// in real time until Ctrl-C; everything it creates is removed on exit.
    Run(rt::RunArgs),
    /// The spill-plane process (started by `spillway run`, not by hand).
    #[command(hide = true)]
    SpillPlane(rt::PlaneArgs),
    /// Talk to a running `spillway run`: status, flows, activate, release, policy.
    Ctl(rt::CtlArgs),
    /// A tenant VM on a shared-memory port (virtio queues in a memfd): generator, sink, echo,
    /// or a bridge to a TAP in the VM's namespace.
    VmEndpoint(rt::EndpointArgs),
    /// A UDP flood generator and sink on plain sockets (sendmmsg/recvmmsg batches), for use
    /// inside a VM's network namespace: per-flow sequence numbers, loss and reordering.
    #[command(subcommand)]
    Traffic(traffic::TrafficCommand),
}

#[derive(Subcommand, Debug)]
enum PcapCommand {
    /// Print one JSON object per frame: VNI, addresses, protocol, ports, or why it is malformed.
    Inspect {
        /// A pcap or pcapng file with Ethernet frames.
        file: PathBuf,
        /// UDP port that marks VXLAN, 1..=65535.
        #[arg(long, default_value_t = 4789, value_parser = clap::value_parser!(u16).range(1..))]
        vxlan_port: u16,
    },
    /// Run the vSwitch pipeline over a capture; print a verdict per frame as JSON lines and
    /// write the forwarded (rewritten) frames to --out.
    Run(run::RunArgs),
}

#[derive(Subcommand, Debug)]
enum BenchCommand {
    /// Single-core fast-path and slow-path throughput on a large synthetic workload.
    Datapath(bench::DatapathArgs),
    /// Simulator speed: simulated packets per wall-clock second.
    Sim(sim::BenchSimArgs),
}

/// Errors are printed as one line with their whole cause chain (`{:#}`), never as a debug dump
/// with a backtrace: a bad config or a missing file is a user's mistake, not a crash. Every
/// line printed for an error is bounded (see [`bounded_lines`]), whatever it quotes.
fn main() -> std::process::ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if e.use_stderr() => {
            eprint!("{}", bounded_lines(&e.render().to_string()));
            return std::process::ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2));
        }
        // --help and --version.
        Err(e) => e.exit(),
    };
    match run_cli(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{}", bounded_lines(&format!("error: {e:#}")));
            std::process::ExitCode::FAILURE
        }
    }
}

fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

fn ceil_char_boundary(s: &str, mut i: usize) -> usize {
    while !s.is_char_boundary(i) {
        i += 1;
    }
    i
}

/// Longest line of an error message printed, in bytes.
const ERROR_LINE_MAX: usize = 1024;

/// `text` with every line longer than [`ERROR_LINE_MAX`] shortened: the sources quote bounded
/// excerpts already, this is the last guard against echoing a whole input line (a 200 KB
/// argument or config line) back at the operator.
fn bounded_lines(text: &str) -> String {
    text.split_inclusive('\n')
        .map(|line| {
            let (body, end) = match line.strip_suffix('\n') {
                Some(body) => (body, "\n"),
                None => (line, ""),
            };
            if body.len() <= ERROR_LINE_MAX {
                return format!("{body}{end}");
            }
            // Keep the head and the tail: a quoted value often sits between the start of a
            // message and the flag or field it names.
            let head = floor_char_boundary(body, ERROR_LINE_MAX / 2);
            let tail = ceil_char_boundary(body, body.len() - ERROR_LINE_MAX / 4);
            format!(
                "{} ... ({} bytes left out) ... {}{end}",
                &body[..head],
                tail - head,
                &body[tail..]
            )
        })
        .collect()
}

fn run_cli(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Pcap(PcapCommand::Inspect { file, vxlan_port }) => {
            let frames = pcapio::read_frames(&file)?;
            let opts = spillway_wire::ParseOptions { vxlan_port };
            let stdout = std::io::stdout();
            let mut out = std::io::BufWriter::new(stdout.lock());
            for (i, f) in frames.iter().enumerate() {
                use std::io::Write;
                serde_json::to_writer(&mut out, &inspect::inspect(i, &f.data, &opts))?;
                writeln!(out)?;
            }
            Ok(())
        }
        Command::Pcap(PcapCommand::Run(args)) => run::run(&args),
        Command::Bench(BenchCommand::Datapath(args)) => bench::datapath(&args),
        Command::Bench(BenchCommand::Sim(args)) => sim::bench_sim(&args),
        Command::Sim(args) => sim::sim(&args),
        Command::Stability(cmd) => stability::run(&cmd),
        Command::Run(args) => rt::run(&args),
        Command::SpillPlane(args) => rt::spill_plane(&args),
        Command::VmEndpoint(args) => rt::vm_endpoint(&args),
        Command::Ctl(args) => rt::ctl(&args),
        Command::Traffic(cmd) => traffic::run(&cmd),
    }
}
