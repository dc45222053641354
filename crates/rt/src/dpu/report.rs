//! What the DPU process reports: its answers to `spillway ctl` (status, flows, metrics and the
//! operator's commands), the samples it publishes to `/metrics` about every 100 ms, and the
//! per-second rates `ctl status` shows (`Rates`, a field of the daemon). These are the daemon's methods, run in its
//! upkeep and off the data path: what they allocate is counted as upkeep (`daemon.rs`, `upkeep`).

use std::collections::BTreeMap;

use serde_json::json;
use spillway_fabric::dpu::{DpuConn, Hold, Role, Sender};
use spillway_fabric::frame::{DpuModel, DpuSwitch};
use spillway_fabric::params::PlacementKind;
use spillway_fabric::types::{ConnId, PlaneSlot};
use spillway_vswitch::Instant;
use spillway_vswitch::policy::Policy;

use crate::dpu::daemon::DpuDaemon;
use crate::dpu::forward::ShardStats;
use crate::dpu::ports::{PortIo, vm_id};
use crate::ops::ctl::{
    CtlCall, CtlRequest, CtlResponse, FLOWS_LIMIT_DEFAULT, FLOWS_LIMIT_MAX, FlowOwner,
};
use crate::ops::metrics::Sample;
use crate::testbed::Testbed;

fn sample_f64(v: &crate::ops::metrics::SampleValue) -> f64 {
    match *v {
        crate::ops::metrics::SampleValue::U64(x) => x as f64,
        crate::ops::metrics::SampleValue::I64(x) => x as f64,
        crate::ops::metrics::SampleValue::F64(x) => x,
    }
}

impl DpuDaemon {
    pub(super) fn serve_ctl(&mut self, now: Instant) {
        while let Some(call) = self.ctl.as_ref().and_then(|c| c.try_recv()) {
            let resp = self.answer(now, &call.request);
            CtlCall::respond(call, resp);
        }
    }

    fn answer(&mut self, now: Instant, req: &CtlRequest) -> CtlResponse {
        match req {
            CtlRequest::Status => CtlResponse::ok(self.status(now)),
            CtlRequest::Vatc { on } => {
                self.vatc = *on;
                let plane = match self.send_plane_command(json!({ "vatc": on })) {
                    Ok(()) => "switched".to_string(),
                    Err(e) => e,
                };
                CtlResponse::ok(json!({ "vatc": on, "plane": plane }))
            }
            CtlRequest::TenantCores { cores } => {
                let host = self.tb.fabric.host.cores;
                if *cores > host {
                    return CtlResponse::error(format!(
                        "tenant-cores: expected at most the host's {host} cores \
                         (fabric.host.cores), got {cores}"
                    ));
                }
                self.sw.dpu_mut().set_tenant_cores(*cores);
                let dpu = self.sw.dpu();
                CtlResponse::ok(json!({
                    "tenant_cores": cores,
                    "isolatable_cores": dpu.isolatable_cores(),
                }))
            }
            CtlRequest::Upgrade { binary } => match self.upgrade(now, binary.as_deref()) {
                Ok(v) => CtlResponse::ok(v),
                Err(e) => CtlResponse::error(e),
            },
            CtlRequest::Metrics => {
                let mut v = Vec::new();
                self.fill_samples(&mut v);
                let m: BTreeMap<String, f64> = v
                    .iter()
                    .filter(|s| s.labels.is_empty())
                    .map(|s| (s.name.to_string(), sample_f64(&s.value)))
                    .collect();
                CtlResponse::ok(json!(m))
            }
            CtlRequest::Flows { limit, owner } => CtlResponse::ok(self.flow_dump(*limit, *owner)),
            CtlRequest::Activate => {
                self.sw.dpu_mut().handle_hold(now, Hold::Active);
                self.after_input(now);
                CtlResponse::ok(json!({"hold": "active", "phase": self.sw.dpu().phase().name()}))
            }
            CtlRequest::Release => {
                self.sw.dpu_mut().handle_hold(now, Hold::Released);
                self.after_input(now);
                CtlResponse::ok(json!({"hold": "released", "phase": self.sw.dpu().phase().name()}))
            }
            CtlRequest::Prepare => {
                self.sw.dpu_mut().handle_hold(now, Hold::Shadow);
                self.after_input(now);
                CtlResponse::ok(json!({"hold": "shadow", "phase": self.sw.dpu().phase().name()}))
            }
            CtlRequest::Auto => {
                self.sw.dpu_mut().handle_hold(now, Hold::Auto);
                CtlResponse::ok(json!({"hold": "auto", "phase": self.sw.dpu().phase().name()}))
            }
            CtlRequest::SetPolicy { placement } => {
                let Some((_, kind)) = PlacementKind::NAMES.iter().find(|(n, _)| n == placement)
                else {
                    let names: Vec<&str> = PlacementKind::NAMES.iter().map(|(n, _)| *n).collect();
                    return CtlResponse::error(format!(
                        "unknown placement policy {placement:?}; expected one of {}",
                        names.join(", ")
                    ));
                };
                self.tb.fabric.placement.policy = *kind;
                let sent = self.send_plane_command(json!({"set_placement": placement}));
                CtlResponse::ok(
                    json!({"placement": placement, "plane": sent.err().unwrap_or_else(|| "updated".into())}),
                )
            }
            CtlRequest::Reload => {
                let tb = match Testbed::load(&self.tb.file) {
                    Ok(t) => t,
                    Err(e) => return CtlResponse::error(e.to_string()),
                };
                let policy: Policy = tb.policy.clone();
                if let Some(l) = self.links.as_mut() {
                    l.set_policy(&policy);
                }
                self.sw.set_policy(policy);
                self.tb.policy_text = tb.policy_text.clone();
                self.tb.policy = tb.policy;
                let sent = self.send_plane_command(json!({"set_policy": tb.policy_text}));
                CtlResponse::ok(json!({
                    "epoch": self.sw.pipeline().epoch().0,
                    "plane": sent.err().unwrap_or_else(|| "updated".into()),
                }))
            }
        }
    }

    /// Every 100 ms: the cores URSched wants from a pool to the cluster agent, and what is held
    /// there back to URSched (only on a pool host that serves planes: where one can start).
    /// Once a second also this host's record, and the cluster's baseline back to URSched (none
    /// while the control plane is unreachable: the host judges its tenants against its own
    /// aggregate then).
    fn exchange_with_cluster(&mut self, now: Instant) {
        let Some(agent) = &self.cluster else { return };
        if now.0.saturating_sub(self.last_cluster.0) < 100_000_000 {
            return;
        }
        self.last_cluster = now;
        let dpu = self.sw.dpu();
        agent.want_remote(dpu.remote_wanted());
        // Cores granted where a plane can be started: a pool host that serves them.
        let grant = agent.granted_cores();
        let baseline = if now.0.saturating_sub(self.last_record.0) >= 1_000_000_000 {
            self.last_record = now;
            let record = crate::ops::cluster::host_record(
                dpu.tenant_loads(),
                dpu.isolatable_cores(),
                dpu.phase(),
            );
            Some(agent.exchange(record))
        } else {
            None
        };
        let dpu = self.sw.dpu_mut();
        if let Some(b) = baseline {
            dpu.set_cluster_baseline(b);
        }
        dpu.set_remote_grant(grant);
    }

    fn status(&mut self, now: Instant) -> serde_json::Value {
        let stats = self.stats();
        let dpu = self.sw.dpu();
        let last = self.events.back();
        let counters: BTreeMap<String, u64> = stats
            .dpu
            .iter()
            .map(|(k, v)| (k.to_string(), v))
            .chain(rt_counters(&stats))
            .collect();
        // Per tenant only here, on the root-only control socket: a tenant's traffic volume is
        // not for `/metrics`, which every local user can read.
        let mut totals = Vec::new();
        dpu.tenant_totals(&mut totals);
        let tenants: Vec<serde_json::Value> = totals
            .into_iter()
            .map(|(id, delivered, lost)| {
                let tenant = if id == spillway_fabric::stats::TenantStats::OTHERS {
                    json!("others")
                } else {
                    json!(id)
                };
                json!({ "tenant": tenant, "delivered": delivered, "lost": lost })
            })
            .collect();
        json!({
            "testbed": self.tb.name,
            "uptime_s": now.0 as f64 / 1e9,
            "phase": dpu.phase().name(),
            "hold": dpu.hold().name(),
            "reason": last.map(|e| e.reason.clone()),
            "last_event": last.map(|e| e.what.name()),
            "quota_buckets": dpu.quota(),
            "redirect_buckets": self.tb.fabric.dpu.redirect_buckets,
            "hw_entries": dpu.hw_entries(),
            "hw_capacity": dpu.hw_capacity(),
            "epoch": self.sw.pipeline().epoch().0,
            "placement": self.tb.fabric.placement.policy.name(),
            "vatc": self.vatc,
            "cluster": self.cluster.as_ref().map(|c| c.status()),
            "pool": self.pool.as_ref().map(|p| p.status()),
            "tenants": tenants,
            "vm_ports": self.dp.ports.iter().filter_map(|p| match &p.io {
                PortIo::Shm(s) => Some(json!({
                    "vm": s.vm, "port": p.id.0, "attached": s.port.is_some(),
                    "epoch": self.dp.authority.epoch(vm_id(p.id)).0,
                    "rx_no_buffer": s.port.as_ref().map(|x| x.rx_no_buffer),
                    "bad_desc": s.port.as_ref().map(|x| x.bad_desc),
                })),
                PortIo::VhostUser(s) => Some({
                    let acked = s.dev().acked.load(std::sync::atomic::Ordering::Relaxed);
                    json!({
                    "vm": s.vm, "port": p.id.0, "backend": "vhost-user",
                    "attached": s.backend.connected(),
                    "connections": s.dev().counters.connections.load(std::sync::atomic::Ordering::Relaxed),
                    "requests_refused": s.dev().counters.refused.load(std::sync::atomic::Ordering::Relaxed),
                    // What the guest's driver acked (0 before it did), and whether it merges
                    // receive buffers.
                    "features": format!("{acked:#x}"),
                    "mergeable_rx": crate::vm::vhost_user::device::mergeable(acked),
                    "guest_pid": s.guest.as_ref().and_then(|g| g.pid()),
                    "accel": s.guest.as_ref().map(|g| g.accel().name()),
                })
                }),
                PortIo::Tap(_) => None,
            }).collect::<Vec<_>>(),
            "metrics_addr": self.metrics.as_ref().map(|m| m.local_addr().to_string()),
            // The active plane (the one the redirect rules steer to), then every plane
            // process by slot: the warm one, or one retiring after an upgrade.
            "plane": self.active_plane().map(|p| json!({
                "pid": p.child.id(),
                "up": p.up,
                "connected": p.vnic.is_some(),
                // On a pool host: `pid` is the relay's, `stats` the remote plane's.
                "remote": p.remote,
                "stats": p.stats,
            })),
            "active_slot": self.active_slot().0,
            "warm": self.sw.dpu().warm().name(),
            "upgrade": self.sw.dpu().upgrade().name(),
            "plane_exe": self.plane_exe.display().to_string(),
            "planes": self.planes_status(),
            "retiring": self.retiring.iter().map(|r| r.pid()).collect::<Vec<_>>(),
            "rates_per_s": self.rates.per_sec,
            // Allocations of the forwarding thread outside upkeep (see `host::allocs` and
            // `upkeep`), up to the start of the upkeep that answers this request.
            // Summed over the forwarding threads, each up to its last report.
            "forwarding_allocs": stats.forwarding_allocs,
            "upkeep_allocs": stats.upkeep_allocs,
            "forwarding_threads": self.tb.fabric.dpu.shards.max(1),
            "conns": stats.conns_held,
            // Thread 0's shard's, then each forwarding thread's (its last report): how the
            // connections spread over the shards.
            "conns_per_thread": std::iter::once(dpu.conns_len() as u64)
                .chain(self.fwd.iter().flat_map(|f| f.conns_per_thread()))
                .collect::<Vec<_>>(),
            "counters": counters,
            "drops": stats.drops.iter().filter(|(_, v)| *v > 0).collect::<BTreeMap<_, _>>(),
            "vswitch_drops": stats.vswitch_drops.iter().filter(|(_, v)| *v > 0).collect::<BTreeMap<_, _>>(),
            "activations": self.activations,
            "events": self.events.iter().rev().map(|e| json!({
                "at_s": e.at.0 as f64 / 1e9, "event": e.what.name(), "reason": e.reason,
            })).collect::<Vec<_>>(),
        })
    }

    /// Every plane process by slot, with what it is to the DPU now.
    fn planes_status(&self) -> Vec<serde_json::Value> {
        [PlaneSlot(0), PlaneSlot(1)]
            .iter()
            .filter_map(|&slot| {
                let p = self.planes[slot.index()].as_ref()?;
                let role = match self.sw.dpu().sender(slot) {
                    Sender::Active => "active",
                    Sender::Warm => "warm",
                    Sender::Fenced => "fenced",
                };
                Some(json!({
                    "slot": slot.0,
                    "role": role,
                    "pid": p.child.id(),
                    "up": p.up,
                    "connected": p.vnic.is_some(),
                    "remote": p.remote,
                }))
            })
            .collect()
    }

    /// The flow dump: this thread's shard's records and, with several forwarding threads,
    /// every other shard's (each thread answers at its next turn), merged in connection order.
    fn flow_dump(&mut self, limit: Option<usize>, owner: Option<FlowOwner>) -> serde_json::Value {
        let q = FlowQuery {
            limit: limit.unwrap_or(FLOWS_LIMIT_DEFAULT).min(FLOWS_LIMIT_MAX),
            owner,
            quota: self.sw.dpu().quota(),
            buckets: self.tb.fabric.dpu.redirect_buckets,
        };
        let mut rows = flow_rows(&self.sw, self.sw.dpu().conns_sorted(), &q);
        let mut total = self.sw.dpu().conns_len();
        if let Some(links) = self.links.as_mut() {
            let (more, n) = links.ask_flows(&q);
            rows.extend(more);
            total += n;
            rows.sort_by_key(|(conn, _)| *conn);
            rows.truncate(q.limit);
        }
        let rows: Vec<serde_json::Value> = rows.into_iter().map(|(_, r)| r).collect();
        json!({ "flows": rows, "total": total })
    }

    fn fill_samples(&self, out: &mut Vec<Sample>) {
        let stats = self.stats();
        let dpu = self.sw.dpu();
        for (n, v) in stats.dpu.iter() {
            out.push(Sample::counter(n, v));
        }
        for (n, v) in stats.drops.iter() {
            out.push(
                Sample::counter(n, v)
                    .with_help("packets a DPU limit dropped")
                    .with_label("layer", "fabric"),
            );
        }
        for (n, v) in rt_counters(&stats) {
            out.push(Sample::counter(n, v));
        }
        for (n, v) in self.ctl.iter().flat_map(|c| c.refused()) {
            out.push(Sample::counter(n, v).with_help("control connections refused"));
        }
        // The DPU vSwitch's counter groups, each under its own help text.
        let mut group = |counters: &mut dyn Iterator<Item = (&'static str, u64)>, help| {
            for (n, v) in counters {
                out.push(
                    Sample::counter(n, v)
                        .with_help(help)
                        .with_label("plane", "dpu"),
                );
            }
        };
        group(
            &mut stats.vswitch_drops.iter(),
            "frames the DPU's vSwitch pipeline dropped",
        );
        group(
            &mut stats.neigh.iter(),
            "ARP and neighbour discovery the DPU's vSwitch answered or took",
        );
        group(
            &mut stats.icmp.iter(),
            "ICMP errors the DPU's vSwitch router sent or held back",
        );
        group(
            &mut stats.frag.iter(),
            "IP fragments the DPU's vSwitch tracked",
        );
        out.push(Sample::gauge("dpu.hw.entries", dpu.hw_entries() as f64));
        out.push(Sample::gauge("dpu.hw.capacity", dpu.hw_capacity() as f64));
        out.push(Sample::gauge("dpu.redirect.quota", f64::from(dpu.quota())));
        out.push(Sample::gauge("dpu.conns", stats.conns_held as f64));
        out.push(Sample::gauge(
            "spill.up",
            if self.active_plane().is_some_and(|p| p.up) {
                1.0
            } else {
                0.0
            },
        ));
        out.extend(Sample::state_set(
            "fabric.phase",
            "phase",
            &[
                "idle",
                "preparing",
                "shadow",
                "activating",
                "active",
                "draining",
            ],
            dpu.phase().name(),
        ));
        if let Some(p) = self.active_plane()
            && let Some(obj) = p.stats.get("counters").and_then(|c| c.as_object())
        {
            for (k, v) in obj {
                if let Some(v) = v.as_u64() {
                    out.push(Sample::counter(k.clone(), v));
                }
            }
        }
    }

    /// Every thread's counters summed: this one's, and the forwarding threads' as each last
    /// published them.
    pub(super) fn stats(&self) -> ShardStats {
        let dpu = self.sw.dpu();
        let mut s = ShardStats::of(
            &self.sw,
            (&dpu.counters(), &dpu.drops(), dpu.conns_len() as u64),
            &self.dp.counters,
            self.taps.as_ref().map(|t| t.counters()),
        );
        if let Some(l) = &self.links {
            s.handoff = l.counters.clone();
        }
        s.forwarding_allocs = self.allocs.forwarding();
        s.upkeep_allocs = self.allocs.upkeep();
        if let Some(f) = &self.fwd {
            s.add(&f.stats());
        }
        s
    }

    /// The process's own counters under `rt.` (see [`rt_counters`]).
    pub(super) fn rt_counters(&self) -> BTreeMap<String, u64> {
        rt_counters(&self.stats()).collect()
    }

    pub(super) fn publish(&mut self, now: Instant) {
        self.last_publish = now;
        self.exchange_with_cluster(now);
        // Connections that never close (UDP) or whose close was not seen are forgotten after
        // two minutes idle, a bounded slice per call.
        self.sw.expire(now);
        let mut samples = Vec::new();
        self.fill_samples(&mut samples);
        self.publisher
            .publish(|out| out.extend(samples.iter().cloned()));
        // Rates once a second.
        if now.0.saturating_sub(self.rates.at.0) >= 1_000_000_000 {
            let secs = (now.0 - self.rates.at.0) as f64 / 1e9;
            let stats = self.stats();
            let mut cur: BTreeMap<String, u64> = stats
                .dpu
                .iter()
                .map(|(k, v)| (k.to_string(), v))
                .chain(rt_counters(&stats))
                .collect();
            if let Some(obj) = self
                .active_plane()
                .and_then(|p| p.stats.get("counters"))
                .and_then(|c| c.as_object())
            {
                cur.extend(
                    obj.iter()
                        .filter_map(|(k, v)| Some((k.clone(), v.as_u64()?))),
                );
            }
            self.rates.per_sec = cur
                .iter()
                .filter_map(|(k, v)| {
                    let b = self.rates.base.get(k)?;
                    Some((k.clone(), v.saturating_sub(*b) as f64 / secs))
                })
                .filter(|(_, r)| *r > 0.0)
                .collect();
            self.rates.base = cur;
            self.rates.at = now;
        }
    }
}

/// The process's own counters under `rt.`: what the driver moved, handed between its threads,
/// and what became of the frames inside the DPU's frame nodes.
fn rt_counters(s: &ShardStats) -> impl Iterator<Item = (String, u64)> + '_ {
    let node = s.frame.iter(&s.conns);
    s.rt.iter()
        .chain(s.ring.iter())
        .chain(s.handoff.iter())
        .map(|(k, v)| (k.to_string(), v))
        .chain(node.map(|(k, v)| (format!("rt.{k}"), v)))
}

/// What `ctl flows` asks each shard for.
#[derive(Clone, Copy, Debug)]
pub(super) struct FlowQuery {
    pub(super) limit: usize,
    pub(super) owner: Option<FlowOwner>,
    pub(super) quota: u16,
    pub(super) buckets: u16,
}

/// The flow dump's rows of one frame node's `records` (sorted by connection), at most
/// `q.limit`, each with its connection id.
pub(super) fn flow_rows<M: DpuModel>(
    sw: &DpuSwitch<M>,
    records: Vec<(ConnId, DpuConn)>,
    q: &FlowQuery,
) -> Vec<(u64, serde_json::Value)> {
    let (quota, buckets) = (q.quota, q.buckets);
    let mut rows = Vec::new();
    for (conn, c) in records {
        let (who, why) = match (c.role, c.hw_live) {
            (Role::Owner, n) if n > 0 => (
                FlowOwner::DpuHw,
                if c.recalled {
                    "recalled to the fast path by the plane's placement".to_string()
                } else {
                    "fast-path entries installed by the SoC slow path".to_string()
                },
            ),
            (Role::Owner, _) if c.inserts_pending > 0 => {
                (FlowOwner::DpuSoc, "hardware inserts pending".to_string())
            }
            (Role::Owner, _) => (
                FlowOwner::DpuSoc,
                "no hardware entry (table full, memory, or insertion budget)".to_string(),
            ),
            (Role::Copy, _) => (
                FlowOwner::Spill,
                if conn.bucket(buckets) < quota {
                    format!(
                        "redirected: bucket {} < quota {quota}",
                        conn.bucket(buckets)
                    )
                } else {
                    "handed to the plane (shed from the fast path or opened while redirected)"
                        .to_string()
                },
            ),
        };
        if q.owner.is_some_and(|o| o != who) {
            continue;
        }
        let key = sw.conns().get(conn).map(|r| {
            format!(
                "{}:{} > {}:{} proto {}",
                r.orig.src_ip.to_std(),
                r.orig.src_port,
                r.orig.dst_ip.to_std(),
                r.orig.dst_port,
                r.orig.proto
            )
        });
        rows.push((
                conn.0,
                json!({
                    "conn": conn.0, "flow": key, "tenant": c.state.tenant.0, "owner": who.name(), "why": why,
                    "packets": c.state.packets, "phase": format!("{:?}", c.state.phase),
                }),
            ));
        if rows.len() >= q.limit {
            break;
        }
    }
    rows
}
