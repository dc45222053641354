//! `spillway pcap run`: the pipeline over a capture.
//!
//! Ingress rule: a frame whose Ethernet source MAC is a VM port's MAC entered on that VM port;
//! every other frame entered on the uplink. `--ingress-port` forces one port for all frames.
//! Time is the capture's timestamps, so idle timeouts behave as they would have on the wire.

use anyhow::{Context, Result};
use serde::Serialize;
use spillway_vswitch::pipeline::{Pipeline, PipelineConfig};
use spillway_vswitch::policy::Policy;
use spillway_vswitch::{Instant, PacketBuf, PortId, Verdict};
use spillway_wire::MacAddr;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;

/// Arguments of `spillway pcap run`.
#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// Policy file (TOML).
    #[arg(long)]
    pub config: PathBuf,
    /// Input capture (pcap or pcapng, Ethernet).
    #[arg(long = "in")]
    pub input: PathBuf,
    /// Output capture of forwarded frames (pcap).
    #[arg(long = "out")]
    pub output: PathBuf,
    /// Treat every frame as arriving on this port instead of applying the MAC rule: one of the
    /// policy's VM port ids or its uplink port id.
    #[arg(long)]
    pub ingress_port: Option<u32>,
}

#[derive(Serialize)]
struct VerdictRecord {
    index: usize,
    ingress: u32,
    path: &'static str,
    verdict: &'static str,
    out_port: Option<u32>,
    reason: Option<String>,
    len_in: usize,
    len_out: Option<usize>,
}

/// `--ingress-port p` names a port of `policy`: its uplink or one of its VM ports. A frame on a
/// port the policy does not know would be dropped, frame after frame, for a reason that says
/// nothing about the flag.
fn check_ingress_port(p: u32, policy: &Policy, config: &std::path::Path) -> Result<()> {
    let uplink = policy.host().uplink_port;
    let ports: Vec<u32> = policy.ports().iter().map(|q| q.id.0).collect();
    if p == uplink.0 || ports.contains(&p) {
        return Ok(());
    }
    // The list is bounded: a policy can hold many ports, an error line should not.
    const SHOWN: usize = 16;
    let mut shown: Vec<String> = ports.iter().take(SHOWN).map(u32::to_string).collect();
    if ports.len() > SHOWN {
        shown.push(format!("... ({} VM ports in all)", ports.len()));
    }
    anyhow::bail!(
        "--ingress-port: expected the uplink port {} or a VM port of {} ({}), got {p}",
        uplink.0,
        config.display(),
        if shown.is_empty() {
            "none".to_string()
        } else {
            shown.join(", ")
        }
    )
}

/// Run the pipeline over `args.input`.
pub fn run(args: &RunArgs) -> Result<()> {
    let policy = Policy::load(&args.config)?;
    let uplink = policy.host().uplink_port;
    let by_mac: BTreeMap<MacAddr, PortId> = policy.ports().iter().map(|p| (p.mac, p.id)).collect();
    if let Some(p) = args.ingress_port {
        check_ingress_port(p, &policy, &args.config)?;
    }
    let frames = crate::pcapio::read_frames(&args.input)?;
    let mut pipeline =
        Pipeline::new(policy, PipelineConfig::default()).context("building the pipeline")?;
    let mut out_frames = Vec::new();
    let stdout = std::io::stdout();
    let mut log = std::io::BufWriter::new(stdout.lock());
    let mut buf = PacketBuf::default();
    for (index, f) in frames.iter().enumerate() {
        let ingress = match args.ingress_port {
            Some(p) => PortId(p),
            None => f
                .data
                .get(6..12)
                .and_then(|m| {
                    by_mac
                        .get(&MacAddr(m.try_into().expect("six bytes")))
                        .copied()
                })
                .unwrap_or(uplink),
        };
        let now = Instant(u64::try_from(f.ts.as_nanos()).unwrap_or(u64::MAX));
        let rec = match buf.load(&f.data) {
            Err(e) => VerdictRecord {
                index,
                ingress: ingress.0,
                path: "none",
                verdict: "drop",
                out_port: None,
                reason: Some(e.to_string()),
                len_in: f.data.len(),
                len_out: None,
            },
            Ok(()) => {
                let (fast_before, slow_before) = {
                    let c = pipeline.counters();
                    (c.fast_path_hits, c.slow_path_packets)
                };
                let v = pipeline.process(now, ingress, &mut buf);
                pipeline.expire(now, 64);
                // A frame the parser rejects takes neither path (the pipeline drops it before
                // the lookup), so it is "none", as when it does not even fit a buffer.
                let c = pipeline.counters();
                let path = if c.fast_path_hits > fast_before {
                    "fast"
                } else if c.slow_path_packets > slow_before {
                    "slow"
                } else {
                    "none"
                };
                match v {
                    Verdict::Forward(p) => {
                        out_frames.push((f.ts, buf.data().to_vec()));
                        VerdictRecord {
                            index,
                            ingress: ingress.0,
                            path,
                            verdict: "forward",
                            out_port: Some(p.0),
                            reason: None,
                            len_in: f.data.len(),
                            len_out: Some(buf.len()),
                        }
                    }
                    Verdict::Drop(r) => VerdictRecord {
                        index,
                        ingress: ingress.0,
                        path,
                        verdict: "drop",
                        out_port: None,
                        reason: Some(r.to_string()),
                        len_in: f.data.len(),
                        len_out: None,
                    },
                }
            }
        };
        serde_json::to_writer(&mut log, &rec)?;
        writeln!(log)?;
    }
    log.flush()?;
    crate::pcapio::write_frames(
        &args.output,
        out_frames.iter().map(|(ts, d)| (*ts, d.as_slice())),
    )?;
    let mut summary = serde_json::Map::new();
    for (k, v) in pipeline
        .counters()
        .iter()
        .chain(pipeline.drops().iter().filter(|(_, v)| *v > 0))
        .chain(pipeline.neigh_counters().iter().filter(|(_, v)| *v > 0))
        .chain(
            pipeline
                .icmp_error_counters()
                .iter()
                .filter(|(_, v)| *v > 0),
        )
        .chain(pipeline.frag_counters().iter().filter(|(_, v)| *v > 0))
    {
        summary.insert(k.to_string(), v.into());
    }
    eprintln!("{}", serde_json::Value::Object(summary));
    Ok(())
}
