//! The invariant checkers: what makes a run valid, checked while it runs.
//!
//! After every event (O(1)): packet conservation (offered = delivered + dropped + in flight)
//! and the DPU's cheap checks (its table within capacity). Every sample: inserts within the
//! insertion budget. At every 1,024th train: path equivalence through the real frame nodes
//! ([`crate::pathcheck`]). At every lifecycle event and every `FULL_CHECK_EVERY` events (the
//! driver decides when): each node's full invariants and ownership across the planes (no
//! connection owned by both). At the end: every connection has one owner or a handover in
//! flight, and state continuity (no packet of a connection whose opening packet was delivered
//! found its plane without state).
//!
//! The checkers own their counts, the path checker and the violation a sampled check found;
//! they read the nodes and never change them. A failed check is a message: the driver turns it
//! into a [`super::SimFailure`] with the time and the seed.

use spillway_fabric::dpu::Role;

use super::SimDpu;
use super::plane::Planes;
use spillway_fabric::spill::SpillPlane;
use spillway_fabric::stats::Drops;
use spillway_fabric::types::{ConnId, Msg, Train};
use spillway_vswitch::Instant;

use crate::pathcheck::PathCheck;

/// Trains between two path-equivalence checks on the real pipeline.
const PATH_CHECK_EVERY: u64 = 1024;

/// What the links hold besides the nodes, for the conservation check.
#[derive(Clone, Copy, Debug)]
pub(super) struct InTransit<'a> {
    /// Packets offered by the sources.
    pub(super) offered: u64,
    /// Packets inside messages on their way.
    pub(super) in_flight: u64,
    /// Packets the links lost with a dead plane.
    pub(super) lost: &'a Drops,
}

/// The checkers of a run.
#[derive(Debug)]
pub(super) struct Checkers {
    /// Checks run (cheap and full).
    checks: u64,
    path: PathCheck,
    /// Trains offered, to pace the path checks.
    trains: u64,
    /// A violation found outside the driver's own checks (path equivalence, insertion
    /// budget), reported after the event that found it.
    violation: Option<String>,
}

impl Checkers {
    pub(super) fn new(seed: u64) -> Checkers {
        Checkers {
            checks: 0,
            path: PathCheck::new(seed),
            trains: 0,
            violation: None,
        }
    }

    /// A train was offered at `now`: every `PATH_CHECK_EVERY`th one (not denied) goes through
    /// the path-equivalence check.
    pub(super) fn offered(&mut self, now: Instant, t: &Train) {
        self.trains += 1;
        if self.trains.is_multiple_of(PATH_CHECK_EVERY)
            && !t.denied
            && let Err(e) = self.path.check(now, t.conn)
        {
            self.violation.get_or_insert(e);
        }
    }

    /// A sample counted `inserts` hardware inserts in `secs` seconds; more than the budget
    /// (`limit` per second, plus two for the sample's edges) is a violation.
    pub(super) fn insert_budget(&mut self, inserts: u64, secs: f64, limit: f64) {
        let budget = limit * secs + 2.0;
        if inserts as f64 > budget {
            self.violation = Some(format!(
                "insertion budget: {inserts} inserts in {secs} s > {budget:.0}"
            ));
        }
    }

    /// The violation found since the last call, if any.
    pub(super) fn take_violation(&mut self) -> Option<String> {
        self.violation.take()
    }

    /// Conservation and the DPU's cheap checks, after every event.
    pub(super) fn cheap(
        &mut self,
        dpu: &SimDpu,
        planes: &Planes,
        links: InTransit<'_>,
    ) -> Result<(), String> {
        self.checks += 1;
        // Only the sums conservation needs: this runs after every event.
        let d = dpu.counters();
        let via_dpu = d.hw_delivered + d.soc_delivered;
        let via_host = d.host_out + planes.counters().direct;
        let dropped = dpu.drops().total() + planes.drops().total() + links.lost.total();
        if links.offered != via_dpu + via_host + dropped + links.in_flight {
            return Err(format!(
                "conservation: offered {} != dpu {} + host {} + dropped {} + in flight {}",
                links.offered, via_dpu, via_host, dropped, links.in_flight
            ));
        }
        dpu.check_cheap()
    }

    /// Each node's full invariants, and ownership across the planes: no connection owned by
    /// two of the DPU and the running planes (`spills`; none when no plane runs, two while a
    /// warm standby plane runs beside the active one).
    pub(super) fn full(&mut self, dpu: &SimDpu, spills: &[&SpillPlane]) -> Result<(), String> {
        self.checks += 1;
        dpu.check_invariants()?;
        for spill in spills {
            spill.check_invariants()?;
        }
        if spills.is_empty() {
            return Ok(());
        }
        let mut owners: Vec<(ConnId, usize)> = dpu
            .conns_sorted()
            .into_iter()
            .filter(|(_, r)| r.role == Role::Owner)
            .map(|(c, _)| (c, 0))
            .collect();
        for (i, spill) in spills.iter().enumerate() {
            owners.extend(
                spill
                    .conns_sorted()
                    .into_iter()
                    .filter(|(_, r)| r.role == Role::Owner)
                    .map(|(c, _)| (c, i + 1)),
            );
        }
        owners.sort_unstable();
        for w in owners.windows(2) {
            if w[0].0 == w[1].0 {
                let who = |i: usize| if i == 0 { "the DPU" } else { "a plane" };
                return Err(format!(
                    "ownership: {} is owned by {} and {}",
                    w[0].0,
                    who(w[0].1),
                    who(w[1].1)
                ));
            }
        }
        Ok(())
    }

    /// Liveness of ownership at the end of a run with a plane running: every connection the
    /// DPU or a running plane knows has exactly one owner, or a handover is in flight.
    /// `in_transit` lists the connections of the handover messages on their way (see
    /// [`handover_conn`]).
    pub(super) fn final_ownership(
        &self,
        dpu: &SimDpu,
        spills: &[&SpillPlane],
        mut in_transit: Vec<ConnId>,
    ) -> Result<(), String> {
        let d = dpu.conns_sorted();
        // A recall whose inserts are still queued at the DPU is a handover in progress.
        for (c, r) in &d {
            if r.recalled && r.inserts_pending > 0 {
                in_transit.push(*c);
            }
        }
        in_transit.sort_unstable();
        let mut known: Vec<(ConnId, bool)> =
            d.iter().map(|(c, r)| (*c, r.role == Role::Owner)).collect();
        for spill in spills {
            known.extend(
                spill
                    .conns_sorted()
                    .into_iter()
                    .map(|(c, r)| (c, r.role == Role::Owner)),
            );
        }
        known.sort_unstable();
        for run in known.chunk_by(|a, b| a.0 == b.0) {
            let c = run[0].0;
            let n = run.iter().filter(|x| x.1).count();
            if n == 0 && in_transit.binary_search(&c).is_err() {
                return Err(format!(
                    "ownership: {c} has no owner and no handover in flight at the end (dpu {:?}, planes {:?})",
                    dpu.conn(c),
                    spills.iter().map(|s| s.conn(c)).collect::<Vec<_>>()
                ));
            }
            if n >= 2 {
                return Err(format!("ownership: {c} has {n} owners at the end"));
            }
        }
        Ok(())
    }

    /// State continuity at the end: a packet may find no state only if its connection's
    /// opening packet was lost (then the connection never existed for the fabric).
    pub(super) fn state_continuity(
        &self,
        no_state: u64,
        opens_lost: u64,
        dpu: &SimDpu,
        planes: &Planes,
    ) -> Result<(), String> {
        if no_state > 0 && opens_lost == 0 {
            return Err(format!(
                "state continuity: {no_state} packets found no connection state, but no opening packet was lost (first: dpu {:?}, plane {:?})",
                dpu.first_no_state(),
                planes.first_no_state()
            ));
        }
        Ok(())
    }

    /// Checks run.
    pub(super) fn checks(&self) -> u64 {
        self.checks
    }

    /// The path checker (for its counts in the report).
    pub(super) fn path(&self) -> &PathCheck {
        &self.path
    }
}

/// The connection a message in flight hands over, for the final ownership check: a sync, a
/// recall, a recall's completion or a delete. `Msg::conn` also names the connection of
/// trains, delete acks, adoptions and offload statistics, which move no ownership; the
/// variant filter keeps exactly the set this check has always counted as a handover.
pub(super) fn handover_conn(msg: &Msg) -> Option<ConnId> {
    match msg {
        Msg::Sync { .. } | Msg::Recall { .. } | Msg::RecallDone { .. } | Msg::Delete { .. } => {
            msg.conn()
        }
        _ => None,
    }
}
