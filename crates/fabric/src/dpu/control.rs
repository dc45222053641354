//! The DPU's control part: one lifecycle ([`Lifecycle`]: phase, hold, colour, quota, what the
//! plane last reported) and one set of measurement windows with URSched ([`Windows`]),
//! whatever number of shards forward. It decides; the shards act on their records.
//!
//! The control part reaches the shards only through [`Shards`]: the few things a lifecycle
//! step asks of every shard (a bulk sync, promoting mirrors on a fail-open, a hand-over of
//! buckets, a shed, a window's totals) and the DPU's resources. [`super::DpuNode`] implements
//! it over the shards it holds, by calling them; a driver that runs each shard on its own
//! thread implements it by carrying each call to the shards' threads at a batch boundary and
//! waiting for their answers (lifecycle steps are rare: a window every `sched.window`, a
//! transition now and then). After a step, the driver gives the shards the control part's new
//! [`DpuControl::view`].

use spillway_vswitch::{Instant, TenantId};

use super::lifecycle::{Command, FabricEvent, Hold, Lifecycle, Phase};
use super::shard::ShardView;
use super::window::{Totals, Utils, Windows};
use crate::params::FabricParams;
use crate::types::{Channel, Colour, Msg};
use crate::ursched::Load;

/// What the control part asks of the shards, all of them at once. See the module doc.
pub trait Shards {
    /// How many shards there are.
    fn count(&self) -> usize;
    /// The bulk sync of an activation of `colour`: every shard sends a mirror of each
    /// connection it owns, then its own end marker. Returns how many mirrors in all.
    fn bulk_sync(&mut self, now: Instant, colour: Colour) -> u64;
    /// A fail-open: every copy becomes owned. Returns how many.
    fn promote_copies(&mut self) -> usize;
    /// Connections of buckets `[from, to)` served on the SoC move to the plane.
    fn hand_over_buckets(&mut self, now: Instant, colour: Colour, from: u16, to: u16);
    /// Connections of the redirected buckets `[0, quota)` with live entries move to the plane
    /// until `excess` packets/s are covered. Returns how many moved and their rate.
    fn shed(&mut self, now: Instant, colour: Colour, quota: u16, excess: f64) -> (u64, f64);
    /// Every shard sends the plane its recalled entries' rates.
    fn send_offload_stats(&mut self, now: Instant);
    /// The cumulative counts a window's rates are differences of, summed over the shards.
    fn totals(&self) -> Totals;
    /// Hands over, and zeroes, the packets each tenant sent since the last call, summed over
    /// the shards.
    fn drain_tenant_packets(&mut self, into: &mut dyn FnMut(TenantId, u64));
    /// Counts a fail-open.
    fn count_fail_open(&mut self);
    /// Sends one of the control part's own messages to the plane.
    fn send(&mut self, at: Instant, channel: Channel, msg: Msg);
    /// The resources' utilisations since the last call; starts the next window.
    fn take_utils(&mut self, now: Instant) -> Utils;
    /// The recall headroom of a new window, packets/s.
    fn set_headroom(&mut self, pps: f64);
    /// Hardware entries neither installed nor promised to an insert on its way.
    fn free_entries(&self) -> usize;
    /// Recall headroom left in this window, packets/s.
    fn headroom_left(&self) -> f64;
    /// When everything queued toward the host has left, not before `now`, ps.
    fn host_idle_ps(&self, now: Instant) -> u64;
}

/// The control part. See the module doc.
#[derive(Debug)]
pub struct DpuControl {
    pub(crate) f: FabricParams,
    pub(crate) life: Lifecycle,
    pub(crate) win: Windows,
    /// Shards whose bulk sync of the current colour the plane has not acknowledged yet, and
    /// the connections the acknowledged ones carried.
    pub(crate) sync_pending: usize,
    pub(crate) sync_acked: u64,
}

impl DpuControl {
    /// The control part of a DPU with the limits in `f`.
    pub fn new(f: &FabricParams) -> DpuControl {
        DpuControl {
            life: Lifecycle::new(),
            win: Windows::new(f),
            sync_pending: 0,
            sync_acked: 0,
            f: f.clone(),
        }
    }

    /// What the shards must know of the lifecycle to serve a packet.
    pub fn view(&self) -> ShardView {
        ShardView {
            phase: self.life.phase,
            colour: self.life.colour,
            quota: self.life.quota,
        }
    }

    /// The lifecycle phase.
    pub fn phase(&self) -> Phase {
        self.life.phase
    }
    /// The operator's hold.
    pub fn hold(&self) -> Hold {
        self.life.hold
    }
    /// Redirected buckets (the overflow quota).
    pub fn quota(&self) -> u16 {
        self.life.quota
    }
    /// The load URSched saw in the last window.
    pub fn last_load(&self) -> &Load {
        self.win.last_load()
    }
    /// The next command for the driver.
    pub fn poll_command(&mut self) -> Option<Command> {
        self.life.commands.pop_front()
    }
    /// The next lifecycle event.
    pub fn poll_event(&mut self) -> Option<FabricEvent> {
        self.life.events.pop_front()
    }
    /// When [`DpuControl::handle_timeout`] must next run (the shards' own timers apart).
    pub fn poll_timeout(&self) -> Instant {
        let t = self.win.next_edge();
        match self.life.next_timer() {
            Some(at) => t.min(at),
            None => t,
        }
    }
    /// The driver's report of how many host cores the tenants use (isolation input).
    pub fn set_tenant_cores(&mut self, cores: u32) {
        self.win.set_tenant_cores(cores);
    }

    pub(crate) fn event(&mut self, at: Instant, what: super::EventKind, reason: impl Into<String>) {
        self.life.event(at, what, reason);
    }
}
