//! `spillway sim --explain CONN`: one connection's story. Why it went to the spill plane, when
//! and why it was or was not recalled to the hardware fast path, and every other change of
//! where it was served, each with the fabric's reason: the message that moved it (a recall and
//! the rate placement measured, a demotion, a handover and the lifecycle decision behind it) or
//! the lifecycle event it followed.
//!
//! The engine notes what an event is about before handling it ([`Story::note_event`]), then
//! where the connection is served after it ([`Story::after`]); a chapter is written when the
//! event said something about the connection or its place changed.

use serde::Serialize;
use spillway_fabric::types::{ConnId, Msg, Owner, Role, SyncKind};
use spillway_vswitch::Instant;

/// One step of a connection's story.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Chapter {
    /// Virtual time, seconds.
    pub at_s: f64,
    /// Where it is served after this step: `dpu hardware`, `dpu slow path`, `spill plane`, or
    /// `nowhere` (not open, or closed).
    pub served_by: &'static str,
    /// What happened, and why.
    pub what: String,
}

/// The story being written.
#[derive(Debug)]
pub(super) struct Story {
    conn: ConnId,
    policy: &'static str,
    chapters: Vec<Chapter>,
    served_by: &'static str,
    note: Option<String>,
    /// The lifecycle events so far (name, and the line to quote): the reasons behind steering
    /// and handovers.
    lifecycle: Vec<(&'static str, String)>,
    opened: bool,
    recalls_asked: u32,
    on_plane_since: Option<Instant>,
    plane_time_ns: u64,
}

fn secs(at: Instant) -> f64 {
    at.0 as f64 / 1e9
}

impl Story {
    pub(super) fn new(conn: ConnId, policy: &'static str) -> Story {
        Story {
            conn,
            policy,
            chapters: Vec::new(),
            served_by: "nowhere",
            note: None,
            lifecycle: Vec::new(),
            opened: false,
            recalls_asked: 0,
            on_plane_since: None,
            plane_time_ns: 0,
        }
    }

    pub(super) fn conn(&self) -> ConnId {
        self.conn
    }

    /// A lifecycle event (activation, quota, release...), kept as the context of what follows.
    pub(super) fn lifecycle(&mut self, at: Instant, name: &'static str, reason: &str) {
        // Bounded: a long run's events are many, and only the last of each kind is quoted.
        self.lifecycle.retain(|(n, _)| *n != name);
        self.lifecycle
            .push((name, format!("{name} at {:.3} s: {reason}", secs(at))));
    }

    /// The last lifecycle event among `names`.
    fn context(&self, names: &[&str]) -> String {
        self.lifecycle
            .iter()
            .rev()
            .find(|(n, _)| names.contains(n))
            .map_or("no lifecycle event of that kind yet".into(), |(_, s)| {
                s.clone()
            })
    }

    /// The source offered a train of the connection.
    pub(super) fn note_offer(&mut self) {
        if !self.opened {
            self.opened = true;
            self.note = Some("opened".into());
        }
    }

    /// A message about the connection, to the plane (`to_plane`) or to the DPU.
    pub(super) fn note_msg(&mut self, msg: &Msg, to_plane: bool) {
        let what = match (msg, to_plane) {
            (
                Msg::Recall {
                    pps, replaces_pps, ..
                },
                false,
            ) => {
                self.recalls_asked += 1;
                let swap = if *replaces_pps > 0.0 {
                    format!(", swapped for an offloaded flow of {replaces_pps:.0} pps")
                } else {
                    String::new()
                };
                format!(
                    "the plane's placement ({}) recalls it to the fast path: measured {pps:.0} pps{swap}",
                    self.policy
                )
            }
            (Msg::RecallDone { ok: true, .. }, true) => {
                "the DPU confirms the recall: both entries live".into()
            }
            (Msg::RecallDone { ok: false, .. }, true) => {
                "the DPU refused the recall (no free entry, no fast-path headroom, or the \
                 insert queue full): the plane keeps it"
                    .into()
            }
            (Msg::Delete { .. }, false) => format!(
                "the plane's placement ({}) demotes it: its entries go, the plane owns it again",
                self.policy
            ),
            // Already told when the DPU moved it (the handover only carries the state).
            (
                Msg::Sync {
                    kind: SyncKind::Handover,
                    ..
                },
                true,
            ) if self.served_by == "spill plane" => return,
            (
                Msg::Sync {
                    kind: SyncKind::Handover,
                    ..
                },
                true,
            ) => format!(
                "the DPU hands it to the plane ({})",
                self.context(&["quota", "activating", "active", "fail_over", "upgrade"])
            ),
            (
                Msg::Sync {
                    kind: SyncKind::Handover,
                    ..
                },
                false,
            ) => format!(
                "the plane hands it back to the DPU ({})",
                self.context(&["draining", "redirect_removed", "idle", "hold", "upgrade"])
            ),
            (
                Msg::Sync {
                    kind: SyncKind::Closed,
                    ..
                },
                _,
            ) => "its last packet went through; closed".into(),
            (Msg::Packets(_), true) if self.served_by == "nowhere" || !self.seen_on_plane() => {
                format!(
                    "its packets are steered to the plane: its redirect bucket is live ({})",
                    self.context(&["active", "quota", "activating"])
                )
            }
            _ => return,
        };
        self.note = Some(what);
    }

    fn seen_on_plane(&self) -> bool {
        self.chapters.iter().any(|c| c.served_by == "spill plane")
    }

    /// After the event: where the connection is served now (`dpu` as the DPU sees it, `plane`
    /// the role of any plane's record).
    pub(super) fn after(&mut self, at: Instant, dpu: Option<Owner>, plane: Option<Role>) {
        let served_by = match (dpu, plane) {
            (Some(Owner::DpuHw), _) => "dpu hardware",
            (Some(Owner::DpuSoc), _) => "dpu slow path",
            (Some(Owner::Spill), _) | (None, Some(Role::Owner)) => "spill plane",
            _ => "nowhere",
        };
        let moved = served_by != self.served_by;
        if served_by == "spill plane" && self.on_plane_since.is_none() {
            self.on_plane_since = Some(at);
        } else if served_by != "spill plane"
            && let Some(since) = self.on_plane_since.take()
        {
            self.plane_time_ns += at.0.saturating_sub(since.0);
        }
        let what = match self.note.take() {
            Some(w) => w,
            None if moved => match (self.served_by, served_by) {
                (_, "dpu hardware") => "its entries went live: served by the fast path".into(),
                ("dpu hardware", "dpu slow path") => {
                    "its entries are gone (refused or removed): the DPU's slow path serves it"
                        .into()
                }
                (_, "nowhere") => "closed".into(),
                (_, "spill plane") => format!(
                    "the DPU moved it to the plane ({})",
                    self.context(&["quota", "fail_open", "fail_over", "active"])
                ),
                (from, to) => format!("moved from {from} to {to}"),
            },
            None => return,
        };
        self.served_by = served_by;
        self.chapters.push(Chapter {
            at_s: secs(at),
            served_by,
            what,
        });
    }

    /// The story, with its ending: on the plane and never recalled, that is said too.
    pub(super) fn finish(mut self, end: Instant) -> Vec<Chapter> {
        if let Some(since) = self.on_plane_since.take() {
            self.plane_time_ns += end.0.saturating_sub(since.0);
        }
        if !self.opened {
            self.chapters.push(Chapter {
                at_s: secs(end),
                served_by: "nowhere",
                what: "the workload never offered a packet of this connection".into(),
            });
        } else if self.plane_time_ns > 0 && self.recalls_asked == 0 {
            self.chapters.push(Chapter {
                at_s: secs(end),
                served_by: self.served_by,
                what: format!(
                    "never recalled: the plane served it for {:.3} s and its placement ({}) \
                     never chose it (not among the flows it ranks best within the free entries \
                     and headroom, or not measured long enough)",
                    self.plane_time_ns as f64 / 1e9,
                    self.policy
                ),
            });
        }
        self.chapters
    }
}
