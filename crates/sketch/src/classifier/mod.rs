//! The stability classifier: which flows behave predictably enough to deserve a hardware entry.
//!
//! # Two tiers
//!
//! Every flow gets cheap per-tick state (a few EWMAs: recent and long-run mean bandwidth, packet
//! rate, control ratio; about 50 ns per flow per tick, no logarithm). Only the flows worth
//! an entry get a **sketch slot**: the last [`WINDOW`] normalised bandwidth samples and a
//! time-decayed Frequent Directions sketch of their recent behaviour. The slots are a fixed pool of [`StabilityParams::sketched_max`]; a flow is
//! admitted when its gain (recent mean bandwidth) is at least [`StabilityParams::gain_floor_bps`]
//! and it ranks among the top `sketched_max` by gain; once the pool is full a newcomer takes the
//! slot of the weakest sketched flow only when its gain is [`StabilityParams::admit_margin`]
//! times larger, so slots do not churn between flows of similar size. The sketch work per tick
//! is therefore bounded by `sketched_max`, whatever the number of flows.
//!
//! # Normalisation
//!
//! Flow rates are heavy-tailed (a few elephants carry most bytes), so raw bandwidth would let
//! the largest flows dominate every direction of a sketch. Each sample is taken **relative to
//! the flow's own running mean** and in logarithms:
//! `z = ln((bw + f·m) / (m·(1 + f)))`, clipped to `[-Z_CLIP, Z_CLIP]`, where `m` is the flow's
//! long-run mean bandwidth (bias-corrected EWMA, so a young flow's mean is its plain mean) and `f` = [`FLOOR`] keeps an idle tick finite
//! (`ln(0.05/1.05) ≈ -3`). A steady flow sits at `z ≈ 0` whatever its size; a flow that doubles
//! is at `+0.67`; a silent tick is at `-3`. The control ratio is already in `[0, 1]`; jitter
//! enters as `ln(1 + cv)` of the gaps' coefficient of variation, which is scale-free.
//!
//! # The sketch and the score
//!
//! A sketch row at tick `t` is `[z(t-7) .. z(t), ctrl(t), ln(1 + jitter_cv(t))]`: a delay
//! embedding of the last eight ticks (as in singular spectrum analysis) plus the two shape
//! features. A flow that follows a recurring pattern produces rows in a low-dimensional
//! subspace: a steady flow's rows are near zero, a sinusoidal one's lie in the span of a
//! sine/cosine pair plus a constant. The sketch (decayed, half-life
//! [`StabilityParams::sketch_half_life_ticks`]) holds the flow's long-run second moments;
//! its top-[`StabilityParams::k`] right singular vectors are the flow's recurring pattern.
//!
//! Instability combines three signals, each in units where 1.0 is "clearly unstable":
//!
//! - **residual** — the RMS of each new row's component outside the top-k subspace (computed
//!   against the subspace *before* the row is added, so it measures prediction, not fit),
//!   EWMA'd over [`StabilityParams::residual_half_life_ticks`], divided by
//!   [`StabilityParams::residual_scale`]. Erratic flows (random on/off, heavy noise) spread
//!   energy over many directions and score high; steady and periodic flows score near zero.
//! - **drift** — the RMS over time (half-life [`StabilityParams::drift_half_life_ticks`]) of
//!   `ln(recent mean / long-run mean)`, the recent mean having a half-life of
//!   [`StabilityParams::recent_half_life_ticks`] (2 s) and the long-run one
//!   [`StabilityParams::mean_half_life_ticks`] (10 s), divided by
//!   [`StabilityParams::drift_scale`]: how far the recent level keeps moving away from the
//!   long-run one. A random walk's rows stay near the constant direction (the subspace explains
//!   them), but its level keeps leaving the long-run mean; a periodic flow's swings of a few
//!   seconds average out of the 2 s mean; a ramping-down or dying flow shows here too. The
//!   RMS over time, not the current value, because a wandering flow that happens to cross its
//!   long-run mean right now is no more predictable for it.
//! - **control** — the EWMA of the control-packet ratio divided by
//!   [`StabilityParams::ctrl_scale`]: a flow made of SYN/FIN/ACK is opening or closing.
//!
//! Residual and drift have a memory: their sum's peak is **held**, decaying with a half-life
//! of [`StabilityParams::memory_half_life_ticks`] (10 s), and the larger of the held peak and
//! the current sum counts. A level shift or an off period seconds ago keeps a flow suspect
//! through the calm that follows it.
//!
//! `instability = 1 - exp(-(held + control))` maps the sum into `[0, 1)`; the exponential
//! keeps the score monotone and lets any one strong signal alone make a flow unstable. The
//! placement **score** is `gain_bps × (1 - instability)^e` with `e` =
//! [`StabilityParams::instability_exponent`] (3), the gain being the recent mean bandwidth:
//! what an entry is expected to carry, discounted steeply by how likely it is to keep carrying
//! it. The steep discount is what makes the ranking hold on traces it was not tuned on, where
//! flow sizes span two orders of magnitude (the crate's README has the figures).
//!
//! A flow is scored only once it has been sketched for [`StabilityParams::min_ticks`] ticks;
//! before that it stays on the host ([`Status::TooYoung`]).
//!
//! # Layout
//!
//! This file holds the classifier itself: the two tiers, the score and the ranking.
//! `params.rs` holds what shapes it: the fixed row layout and the tunable
//! [`StabilityParams`] with their reasons and range check.
//!
//! # Determinism
//!
//! No clock, no randomness; the per-flow map is a seeded `hashbrown` table whose iteration order
//! never reaches an output: every list this module returns is sorted by (score or gain, flow).

use core::fmt;

use hashbrown::HashMap;

use crate::fd::{FrequentDirections, Spectrum, Variant};
use crate::features::FeatureTick;

mod params;

pub use params::{FLOOR, ParamError, ROW_DIM, StabilityParams, WINDOW, Z_CLIP};

/// A flow's identifier (the caller's: a connection id, a CSV `flow_id`).
pub type FlowId = u64;

/// EWMA weight of a new sample for a half-life in ticks.
fn alpha(half_life: f64) -> f64 {
    1.0 - 0.5f64.powf(1.0 / half_life)
}

/// The cheap state every flow has: no logarithm, no sketch (tens of nanoseconds per tick).
#[derive(Clone, Copy, Debug)]
struct FlowState {
    /// Ticks observed.
    ticks: u32,
    /// Tick of the last observation.
    seen: u64,
    /// Long-run mean bandwidth, bits/s (bias-corrected EWMA: `mean_acc / mean_w`).
    mean_acc: f64,
    mean_w: f64,
    /// Recent mean bandwidth, bits/s (bias-corrected EWMA: `recent_acc / recent_w`).
    recent_acc: f64,
    recent_w: f64,
    /// Recent mean packet rate, packets/s (the recent weights).
    pps_acc: f64,
    /// EWMA of the control ratio.
    ctrl: f64,
    /// This tick's features (read by the sketch tier at the end of the tick).
    last: FeatureTick,
    /// Sketch slot, if it has one.
    slot: Option<u32>,
}

impl FlowState {
    fn new() -> FlowState {
        FlowState {
            ticks: 0,
            seen: 0,
            mean_acc: 0.0,
            mean_w: 0.0,
            recent_acc: 0.0,
            recent_w: 0.0,
            pps_acc: 0.0,
            ctrl: 0.0,
            last: FeatureTick::default(),
            slot: None,
        }
    }

    /// The long-run mean bandwidth.
    fn long_bps(&self) -> f64 {
        if self.mean_w > 0.0 {
            self.mean_acc / self.mean_w
        } else {
            0.0
        }
    }

    /// The recent mean bandwidth: what an entry would carry next.
    fn gain_bps(&self) -> f64 {
        if self.recent_w > 0.0 {
            self.recent_acc / self.recent_w
        } else {
            0.0
        }
    }

    fn pps(&self) -> f64 {
        if self.recent_w > 0.0 {
            self.pps_acc / self.recent_w
        } else {
            0.0
        }
    }

    /// Log ratio of `bw` to the long-run mean, floored and clipped (see the module doc).
    fn normalised(&self, bw: f64) -> f64 {
        let m = self.long_bps();
        if m > 0.0 {
            ((bw + FLOOR * m) / (m * (1.0 + FLOOR)))
                .ln()
                .clamp(-Z_CLIP, Z_CLIP)
        } else {
            0.0
        }
    }
}

/// A sketch slot: the expensive tier, for at most `sketched_max` flows.
#[derive(Clone, Debug)]
struct Slot {
    /// The flow it belongs to and its index in the state vector (meaningless while `in_use`
    /// is false).
    flow: FlowId,
    state: u32,
    in_use: bool,
    fd: FrequentDirections<ROW_DIM>,
    /// Subspace the next row is judged against (from the sketch's latest shrink).
    basis: Option<Spectrum<ROW_DIM>>,
    shrinks_seen: u64,
    /// EWMA of the per-dimension residual energy (log units squared).
    residual: f64,
    /// Residual samples so far.
    residual_n: u32,
    /// EWMA of the squared drift (log ratio of recent to long-run level).
    drift2: f64,
    /// The held peak of residual + drift (in their units), decaying with
    /// `memory_half_life_ticks`.
    peak: f64,
    /// Ticks sketched.
    ticks: u32,
    /// The last `WINDOW` normalised bandwidth samples, a ring; `head` is the oldest.
    window: [f64; WINDOW],
    head: usize,
}

impl Slot {
    /// Gives the slot to `flow` (at `state`), forgetting the previous flow's sketch.
    fn reset(&mut self, flow: FlowId, state: u32) {
        self.flow = flow;
        self.state = state;
        self.in_use = true;
        self.fd.clear();
        self.basis = None;
        self.shrinks_seen = 0;
        self.residual = 0.0;
        self.residual_n = 0;
        self.drift2 = 0.0;
        self.peak = 0.0;
        self.ticks = 0;
        self.window = [0.0; WINDOW];
        self.head = 0;
    }

    /// Adds this tick's normalised sample and returns the sketch row.
    fn push(&mut self, st: &FlowState) -> [f64; ROW_DIM] {
        let f = &st.last;
        self.window[self.head] = st.normalised(f.bw_bps);
        self.head = (self.head + 1) % WINDOW;
        let mut row = [0.0; ROW_DIM];
        for (i, r) in row.iter_mut().take(WINDOW).enumerate() {
            *r = self.window[(self.head + i) % WINDOW];
        }
        row[WINDOW] = f.ctrl_ratio;
        row[WINDOW + 1] = f.jitter_cv().ln_1p().min(Z_CLIP);
        row
    }
}

/// Why a flow has or has not a score.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Status {
    /// Scored.
    Scored,
    /// Sketched, but for fewer than `min_ticks` ticks (it stays on the host).
    TooYoung {
        /// Ticks sketched so far.
        ticks: u32,
        /// Ticks needed.
        needed: u32,
    },
    /// Not sketched: its gain is below the floor or below the sketched flows' (the candidate
    /// set is full).
    NotCandidate,
}

/// A flow's current assessment.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Score {
    /// The flow.
    pub flow: FlowId,
    /// Recent mean bandwidth (half-life `recent_half_life_ticks`), bits/s: what an entry would
    /// carry.
    pub gain_bps: f64,
    /// Recent mean packet rate, packets/s (what it costs the fast path).
    pub pps: f64,
    /// Instability in [0, 1) (0 for a flow not scored).
    pub instability: f64,
    /// `gain_bps × (1 - instability)^instability_exponent`; 0 for a flow not scored.
    pub score: f64,
    /// The residual component (in units of `residual_scale`).
    pub residual: f64,
    /// The drift component (in units of `drift_scale`).
    pub drift: f64,
    /// The held peak of residual + drift (at least their sum now).
    pub held: f64,
    /// The control component (in units of `ctrl_scale`).
    pub control: f64,
    /// Ticks observed.
    pub ticks: u32,
    /// Whether it is scored, and if not why.
    pub status: Status,
}

impl fmt::Display for Score {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.status {
            Status::Scored => write!(
                f,
                "flow {}: score {:.0} = gain {:.0} bit/s x (1 - instability {:.2})^e; held {:.2} (residual {:.2} + drift {:.2} now) + control {:.2}",
                self.flow,
                self.score,
                self.gain_bps,
                self.instability,
                self.held,
                self.residual,
                self.drift,
                self.control
            ),
            Status::TooYoung { ticks, needed } => write!(
                f,
                "flow {}: not scored, {ticks} ticks of history < {needed} (gain {:.0} bit/s)",
                self.flow, self.gain_bps
            ),
            Status::NotCandidate => write!(
                f,
                "flow {}: not a candidate, gain {:.0} bit/s below the floor or the sketched flows",
                self.flow, self.gain_bps
            ),
        }
    }
}

/// The classifier. Feed every flow's [`FeatureTick`] with [`Classifier::observe`], close the
/// tick with [`Classifier::end_tick`], then read [`Classifier::rank`] or
/// [`Classifier::score`].
///
/// The cheap tier is a dense vector of per-flow states in first-observation order, with a hash
/// index from flow id: a caller that observes its flows in a stable order (the spill plane
/// walks its connections by id) touches that vector sequentially, so the per-flow cost stays
/// at a hash probe plus a few multiply-adds rather than a cache miss per flow.
#[derive(Debug)]
pub struct Classifier {
    p: StabilityParams,
    a_mean: f64,
    a_recent: f64,
    a_resid: f64,
    a_drift: f64,
    /// Per-tick decay of the held peak.
    hold: f64,
    decay: f64,
    tick: u64,
    /// Flow id -> index into `states`.
    index: HashMap<FlowId, u32, foldhash::fast::FixedState>,
    states: Vec<(FlowId, FlowState)>,
    slots: Vec<Slot>,
    /// Free slot indices (a stack; a slot's index never reaches an output).
    free: Vec<u32>,
    /// Scratch for admissions: (gain, flow).
    want: Vec<(f64, FlowId)>,
    /// Scratch for the sketched flows by gain: (gain, flow, slot).
    weak: Vec<(f64, FlowId, u32)>,
    /// Scratch for forgetting.
    gone: Vec<FlowId>,
}

impl Classifier {
    /// A classifier with `p`.
    pub fn new(p: StabilityParams) -> Result<Classifier, ParamError> {
        p.validate()?;
        Ok(Classifier {
            a_mean: alpha(p.mean_half_life_ticks),
            a_recent: alpha(p.recent_half_life_ticks),
            a_resid: alpha(p.residual_half_life_ticks),
            a_drift: alpha(p.drift_half_life_ticks),
            hold: 0.5f64.powf(1.0 / p.memory_half_life_ticks),
            decay: 0.5f64.powf(1.0 / p.sketch_half_life_ticks),
            tick: 0,
            index: HashMap::with_hasher(foldhash::fast::FixedState::with_seed(0x5eed_57ab)),
            states: Vec::new(),
            slots: Vec::new(),
            free: Vec::new(),
            want: Vec::new(),
            weak: Vec::new(),
            gone: Vec::new(),
            p,
        })
    }

    /// The parameters.
    pub fn params(&self) -> &StabilityParams {
        &self.p
    }

    /// Sets the gain floor below which flows get no sketch slot (see the field's doc).
    pub fn set_gain_floor(&mut self, bps: f64) {
        if bps.is_finite() && bps >= 0.0 {
            self.p.gain_floor_bps = bps;
        }
    }

    /// Ticks closed so far.
    pub fn ticks(&self) -> u64 {
        self.tick
    }

    /// Flows known.
    pub fn flows(&self) -> usize {
        self.states.len()
    }

    /// Flows holding a sketch slot.
    pub fn sketched(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    fn state(&self, flow: FlowId) -> Option<&FlowState> {
        let i = *self.index.get(&flow)?;
        Some(&self.states[i as usize].1)
    }

    /// Records `flow`'s features for the current tick. Invalid features (NaN, negative, a
    /// control ratio outside [0, 1]) are treated as an idle tick, so bad input never poisons
    /// a sketch. A second observation of a flow in the same tick is ignored.
    #[inline]
    pub fn observe(&mut self, flow: FlowId, f: &FeatureTick) {
        let f = if f.is_valid() {
            *f
        } else {
            FeatureTick::default()
        };
        let tick = self.tick + 1;
        let next = self.states.len() as u32;
        let i = *self.index.entry(flow).or_insert(next);
        if i == next {
            self.states.push((flow, FlowState::new()));
        }
        let st = &mut self.states[i as usize].1;
        if st.ticks > 0 && st.seen == tick {
            return;
        }
        st.seen = tick;
        Self::update(st, &f, self.a_mean, self.a_recent, self.a_resid);
    }

    /// The cheap tier's per-tick update: four EWMAs and a copy.
    #[inline]
    fn update(st: &mut FlowState, f: &FeatureTick, a_mean: f64, a_recent: f64, a: f64) {
        st.ticks = st.ticks.saturating_add(1);
        // Bias-corrected EWMAs (`acc / w`): the first ticks give a plain mean, later ones decay.
        st.mean_acc = (1.0 - a_mean) * st.mean_acc + a_mean * f.bw_bps;
        st.mean_w = (1.0 - a_mean) * st.mean_w + a_mean;
        st.recent_acc = (1.0 - a_recent) * st.recent_acc + a_recent * f.bw_bps;
        st.pps_acc = (1.0 - a_recent) * st.pps_acc + a_recent * f.pps;
        st.recent_w = (1.0 - a_recent) * st.recent_w + a_recent;
        st.ctrl = if st.ticks == 1 {
            f.ctrl_ratio
        } else {
            (1.0 - a) * st.ctrl + a * f.ctrl_ratio
        };
        st.last = *f;
    }

    /// Removes `flow` (it ended, or placement took it off the host).
    pub fn remove(&mut self, flow: FlowId) {
        let Some(i) = self.index.remove(&flow) else {
            return;
        };
        let (_, st) = self.states.swap_remove(i as usize);
        if let Some(s) = st.slot {
            self.slots[s as usize].in_use = false;
            self.free.push(s);
        }
        // The last state moved into `i`: repoint its index entry and its slot.
        if let Some(&(moved, mst)) = self.states.get(i as usize) {
            self.index.insert(moved, i);
            if let Some(s) = mst.slot {
                self.slots[s as usize].state = i;
            }
        }
    }

    /// Closes the tick: flows not observed this tick count as idle (a zero sample) and are
    /// forgotten after `forget_ticks` ticks without an observation; sketch slots are admitted
    /// and replaced; every sketched flow's row goes into its sketch and its residual is
    /// updated.
    pub fn end_tick(&mut self) {
        let tick = self.tick + 1;
        // Who may get a slot this tick: with free slots, anyone above the floor; with a full
        // pool, only a flow clearly larger than the weakest sketched one. Computing that bar
        // first keeps the wish list short (a full sort of every flow each tick would cost
        // more than everything else here).
        self.weak.clear();
        for (i, s) in self.slots.iter().enumerate() {
            if s.in_use {
                let g = self.states[s.state as usize].1.gain_bps();
                self.weak.push((g, s.flow, i as u32));
            }
        }
        self.weak
            .sort_unstable_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let room = self.p.sketched_max - self.sketched();
        let bar = if room > 0 {
            self.p.gain_floor_bps
        } else {
            let weakest = self.weak.first().map_or(0.0, |w| w.0);
            self.p.gain_floor_bps.max(weakest * self.p.admit_margin)
        };
        let idle = FeatureTick::default();
        self.gone.clear();
        self.want.clear();
        // One sequential pass over every flow: idle samples, forgetting, the wish list.
        for (id, st) in self.states.iter_mut() {
            if st.seen != tick {
                if tick - st.seen >= u64::from(self.p.forget_ticks) {
                    self.gone.push(*id);
                    continue;
                }
                Self::update(st, &idle, self.a_mean, self.a_recent, self.a_resid);
            }
            let g = st.gain_bps();
            if st.slot.is_none() && g > 0.0 && g >= bar {
                self.want.push((g, *id));
            }
        }
        if !self.gone.is_empty() {
            self.gone.sort_unstable();
            for i in 0..self.gone.len() {
                let id = self.gone[i];
                self.remove(id);
            }
            self.weak.retain(|w| self.slots[w.2 as usize].in_use);
        }
        self.admit();
        self.sketch_tick();
        self.tick = tick;
    }

    /// Gives sketch slots to the flows in `want` that deserve them (see the module doc).
    fn admit(&mut self) {
        if self.want.is_empty() {
            return;
        }
        let best = |a: &(f64, FlowId), b: &(f64, FlowId)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
        // Best first; ties by flow id (never by map order). Only the first `n` can get a
        // slot this tick, so select them before sorting.
        let n = self.p.admit_per_tick_max.min(self.want.len());
        if n < self.want.len() {
            self.want.select_nth_unstable_by(n, best);
            self.want.truncate(n);
        }
        self.want.sort_unstable_by(best);
        let mut weakest = 0;
        for w in 0..self.want.len() {
            let (g, id) = self.want[w];
            let state = self.index[&id];
            let slot = if let Some(s) = self.free.pop() {
                s
            } else if self.slots.len() < self.p.sketched_max {
                let s = self.fresh_slot(id, state);
                self.slots.push(s);
                (self.slots.len() - 1) as u32
            } else {
                // Full: replace the weakest sketched flow if the newcomer is clearly larger.
                let Some(&(wg, _, ws)) = self.weak.get(weakest) else {
                    break;
                };
                if g < wg * self.p.admit_margin {
                    break;
                }
                weakest += 1;
                let old = self.slots[ws as usize].state;
                self.states[old as usize].1.slot = None;
                ws
            };
            // A reused slot keeps its sketch's memory: clearing it does not allocate.
            self.slots[slot as usize].reset(id, state);
            self.states[state as usize].1.slot = Some(slot);
        }
    }

    fn fresh_slot(&self, flow: FlowId, state: u32) -> Slot {
        Slot {
            flow,
            state,
            in_use: true,
            fd: FrequentDirections::new(self.p.ell, Variant::Buffered(self.p.buffer_rows))
                .and_then(|f| f.with_decay(self.decay))
                .expect("ell and decay are validated by StabilityParams::validate"),
            basis: None,
            shrinks_seen: 0,
            residual: 0.0,
            residual_n: 0,
            drift2: 0.0,
            peak: 0.0,
            ticks: 0,
            window: [0.0; WINDOW],
            head: 0,
        }
    }

    /// One row per sketched flow: judge it against the current subspace, then add it.
    fn sketch_tick(&mut self) {
        let k = self.p.k;
        let a = self.a_resid;
        let min_ticks = self.p.min_ticks;
        let a_drift = self.a_drift;
        let (hold, rs, ds) = (self.hold, self.p.residual_scale, self.p.drift_scale);
        for s in self.slots.iter_mut() {
            if !s.in_use {
                continue;
            }
            let st = &self.states[s.state as usize].1;
            let row = s.push(st);
            let d = st.normalised(st.gain_bps());
            s.drift2 = if s.ticks == 0 {
                d * d
            } else {
                (1.0 - a_drift) * s.drift2 + a_drift * d * d
            };
            if let Some(b) = &s.basis {
                let r = b.residual(k, &row) / ROW_DIM as f64;
                s.residual = (1.0 - a) * s.residual + a * r;
                s.residual_n += 1;
            }
            s.fd.insert(&row);
            s.ticks = s.ticks.saturating_add(1);
            // The subspace comes from the latest shrink (free: the shrink computed it). A flow
            // whose rows are (near) zero may never fill the buffer; it gets one on-demand
            // decomposition when it is old enough to be scored.
            let fresh = if s.fd.shrinks() != s.shrinks_seen {
                s.shrinks_seen = s.fd.shrinks();
                s.fd.last_spectrum().cloned()
            } else if s.basis.is_none() && s.ticks >= min_ticks {
                Some(s.fd.spectrum())
            } else {
                None
            };
            if let Some(sp) = fresh {
                if s.residual_n == 0 {
                    // The first subspace: start from its in-sample tail energy per row, a
                    // fair first estimate until out-of-sample residuals arrive.
                    let tail: f64 = sp.sigma2.iter().skip(k).sum();
                    let rows = f64::from(s.ticks).max(1.0);
                    s.residual = tail / rows / ROW_DIM as f64;
                    s.residual_n = 1;
                }
                s.basis = Some(sp);
            }
            if s.ticks >= min_ticks && s.residual_n > 0 {
                let now = s.residual.max(0.0).sqrt() / rs + s.drift2.max(0.0).sqrt() / ds;
                s.peak = now.max(s.peak * hold);
            }
        }
    }

    /// The assessment of `flow`, if it is known.
    pub fn score(&self, flow: FlowId) -> Option<Score> {
        let st = self.state(flow)?;
        Some(self.assess(flow, st))
    }

    fn assess(&self, flow: FlowId, st: &FlowState) -> Score {
        let gain_bps = st.gain_bps();
        let base = Score {
            flow,
            gain_bps,
            pps: st.pps(),
            instability: 0.0,
            score: 0.0,
            residual: 0.0,
            drift: 0.0,
            held: 0.0,
            control: 0.0,
            ticks: st.ticks,
            status: Status::NotCandidate,
        };
        let Some(slot) = st.slot else {
            return base;
        };
        let s = &self.slots[slot as usize];
        if s.ticks < self.p.min_ticks || s.residual_n == 0 {
            return Score {
                status: Status::TooYoung {
                    ticks: s.ticks,
                    needed: self.p.min_ticks,
                },
                ..base
            };
        }
        let residual = s.residual.max(0.0).sqrt() / self.p.residual_scale;
        let drift = s.drift2.max(0.0).sqrt() / self.p.drift_scale;
        let control = st.ctrl / self.p.ctrl_scale;
        let held = s.peak.max(residual + drift);
        let unstable = held + control;
        let instability = 1.0 - (-unstable).exp();
        Score {
            instability,
            score: gain_bps * (-self.p.instability_exponent * unstable).exp(),
            residual,
            drift,
            held,
            control,
            status: Status::Scored,
            ..base
        }
    }

    /// Every scored flow, best first (score descending, ties by flow id), into `out`.
    pub fn rank(&self, out: &mut Vec<Score>) {
        out.clear();
        for s in &self.slots {
            if !s.in_use {
                continue;
            }
            let a = self.assess(s.flow, &self.states[s.state as usize].1);
            if a.status == Status::Scored {
                out.push(a);
            }
        }
        out.sort_unstable_by(|a, b| b.score.total_cmp(&a.score).then(a.flow.cmp(&b.flow)));
    }

    /// Every known flow ranked by gain alone (the bandwidth-only baseline), best first, ties
    /// by flow id.
    pub fn rank_by_gain(&self, out: &mut Vec<Score>) {
        out.clear();
        out.extend(self.states.iter().map(|(id, st)| self.assess(*id, st)));
        out.sort_unstable_by(|a, b| b.gain_bps.total_cmp(&a.gain_bps).then(a.flow.cmp(&b.flow)));
    }

    /// Checks the two-tier bookkeeping: the index and the states agree, a flow's slot belongs
    /// to it and is in use, every slot in use belongs to a flow that points back, the pool
    /// never exceeds its bound.
    pub fn check_invariants(&self) -> Result<(), String> {
        if self.slots.len() > self.p.sketched_max {
            return Err(format!(
                "stability: {} slots > sketched_max {}",
                self.slots.len(),
                self.p.sketched_max
            ));
        }
        if self.index.len() != self.states.len() {
            return Err(format!(
                "stability: index {} != states {}",
                self.index.len(),
                self.states.len()
            ));
        }
        let mut used = 0;
        for (i, (id, st)) in self.states.iter().enumerate() {
            if self.index.get(id) != Some(&(i as u32)) {
                return Err(format!("stability: flow {id} at {i} not indexed there"));
            }
            if let Some(s) = st.slot {
                used += 1;
                let slot = self
                    .slots
                    .get(s as usize)
                    .ok_or_else(|| format!("stability: flow {id} slot {s} out of range"))?;
                if slot.flow != *id || slot.state != i as u32 || !slot.in_use {
                    return Err(format!(
                        "stability: flow {id} holds slot {s} (of flow {}, state {}, in use {})",
                        slot.flow, slot.state, slot.in_use
                    ));
                }
            }
        }
        let in_use = self.slots.iter().filter(|s| s.in_use).count();
        if used != in_use || in_use + self.free.len() != self.slots.len() {
            return Err(format!(
                "stability: {used} flows with slots, {in_use} slots in use, {} free, {} slots",
                self.free.len(),
                self.slots.len()
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::rng::SplitMix64;

    fn tick(bw: f64) -> FeatureTick {
        FeatureTick {
            bw_bps: bw,
            pps: bw / 8.0 / 1000.0,
            ctrl_ratio: 0.0,
            jitter_us: 0.0,
        }
    }

    /// Runs four flows of one shape each for `ticks` ticks: 1 steady, 2 periodic, 3 bursty
    /// on/off (random durations), 4 random walk, all with a mean near 10 Mbit/s.
    fn four_classes(ticks: u32, seed: u64) -> Classifier {
        let mut c = Classifier::new(StabilityParams::default()).unwrap();
        let mut rng = SplitMix64::new(seed);
        let mut on = true;
        let mut walk = 0.0f64;
        for t in 0..ticks {
            let tf = f64::from(t);
            c.observe(1, &tick(10e6 * (1.0 + 0.03 * rng.normal())));
            let periodic = 10e6 * (1.0 + 0.6 * (core::f64::consts::TAU * tf / 20.0).sin());
            c.observe(2, &tick(periodic * (1.0 + 0.03 * rng.normal())));
            // Switches with probability 0.2 per tick: on and off last 0.5 s on average.
            if rng.uniform() < 0.2 {
                on = !on;
            }
            c.observe(3, &tick(if on { 20e6 } else { 0.0 }));
            walk = (walk + 0.2 * rng.normal()).clamp(-2.3, 2.3);
            c.observe(4, &tick(10e6 * walk.exp()));
            c.end_tick();
            c.check_invariants().unwrap();
        }
        c
    }

    #[test]
    fn steady_and_periodic_flows_are_stable_bursty_and_wandering_ones_are_not() {
        for seed in 1..=5 {
            let c = four_classes(300, seed);
            let i = |f| c.score(f).unwrap().instability;
            let (steady, periodic, bursty, walk) = (i(1), i(2), i(3), i(4));
            assert!(steady < 0.3, "seed {seed}: steady {steady}");
            assert!(periodic < 0.5, "seed {seed}: periodic {periodic}");
            assert!(bursty > 0.8, "seed {seed}: bursty {bursty}");
            assert!(walk > 0.4 && walk > periodic, "seed {seed}: walk {walk}");
        }
    }

    #[test]
    fn a_flow_is_not_scored_before_min_ticks_of_sketch() {
        let mut c = Classifier::new(StabilityParams::default()).unwrap();
        for t in 0..9 {
            c.observe(7, &tick(1e6));
            c.end_tick();
            let s = c.score(7).unwrap();
            assert_eq!(
                s.status,
                Status::TooYoung {
                    ticks: t + 1,
                    needed: 10
                }
            );
            assert_eq!(s.score, 0.0);
        }
        let mut ranked = Vec::new();
        c.rank(&mut ranked);
        assert!(ranked.is_empty());
        c.observe(7, &tick(1e6));
        c.end_tick();
        assert_eq!(c.score(7).unwrap().status, Status::Scored);
        c.rank(&mut ranked);
        assert_eq!(ranked.len(), 1);
    }

    #[test]
    fn sketch_slots_are_bounded_and_go_to_clearly_larger_flows() {
        let p = StabilityParams {
            sketched_max: 4,
            ..StabilityParams::default()
        };
        let mut c = Classifier::new(p).unwrap();
        // Flows 1..=6 at 1..=6 Mbit/s: the four largest get the slots.
        for _ in 0..3 {
            for f in 1..=6u64 {
                c.observe(f, &tick(f as f64 * 1e6));
            }
            c.end_tick();
        }
        c.check_invariants().unwrap();
        assert_eq!(c.sketched(), 4);
        let sketched = |c: &Classifier, f| c.score(f).unwrap().status != Status::NotCandidate;
        assert!(!sketched(&c, 1) && !sketched(&c, 2));
        assert!((3..=6).all(|f| sketched(&c, f)));
        // A 5 Mbit/s newcomer is not twice the weakest (3 Mbit/s): no churn.
        for _ in 0..3 {
            for f in 1..=7u64 {
                let bw = if f == 7 { 5e6 } else { f as f64 * 1e6 };
                c.observe(f, &tick(bw));
            }
            c.end_tick();
        }
        assert!(!sketched(&c, 7));
        // A 50 Mbit/s one is: it takes the weakest slot.
        for _ in 0..3 {
            for f in 1..=8u64 {
                let bw = if f == 8 { 50e6 } else { f as f64 * 1e6 };
                c.observe(f, &tick(bw));
            }
            c.end_tick();
        }
        c.check_invariants().unwrap();
        assert!(sketched(&c, 8));
        assert!(!sketched(&c, 3));
        assert_eq!(c.sketched(), 4);
    }

    #[test]
    fn silent_flows_are_forgotten_and_free_their_slot() {
        let mut c = Classifier::new(StabilityParams::default()).unwrap();
        c.observe(1, &tick(1e6));
        c.end_tick();
        assert_eq!((c.flows(), c.sketched()), (1, 1));
        for _ in 0..9 {
            c.end_tick();
            assert_eq!(c.flows(), 1);
        }
        // The idle ticks pulled its mean down.
        assert!(c.score(1).unwrap().gain_bps < 1e6);
        c.end_tick();
        assert_eq!((c.flows(), c.sketched()), (0, 0));
        c.check_invariants().unwrap();
    }

    #[test]
    fn invalid_features_count_as_an_idle_tick() {
        let mut c = Classifier::new(StabilityParams::default()).unwrap();
        let bad = FeatureTick {
            bw_bps: f64::NAN,
            pps: -1.0,
            ctrl_ratio: 2.0,
            jitter_us: f64::INFINITY,
        };
        c.observe(1, &tick(1e6));
        c.end_tick();
        c.observe(1, &bad);
        c.end_tick();
        let s = c.score(1).unwrap();
        assert!(s.gain_bps.is_finite() && s.gain_bps > 0.0 && s.gain_bps < 1e6);
    }

    #[test]
    fn control_heavy_flows_are_unstable() {
        let mut c = Classifier::new(StabilityParams::default()).unwrap();
        for _ in 0..30 {
            c.observe(1, &tick(1e6));
            c.observe(
                2,
                &FeatureTick {
                    ctrl_ratio: 0.9,
                    ..tick(1e6)
                },
            );
            c.end_tick();
        }
        let (a, b) = (c.score(1).unwrap(), c.score(2).unwrap());
        assert!(b.control > 1.5 && b.instability > 0.8, "{b}");
        assert!(a.score > 3.0 * b.score, "{a} vs {b}");
    }

    #[test]
    fn bad_parameters_name_the_field() {
        let e = Classifier::new(StabilityParams {
            k: 5,
            ..StabilityParams::default()
        })
        .unwrap_err();
        assert_eq!(e.field, "k");
        let e = Classifier::new(StabilityParams {
            drift_scale: f64::NAN,
            ..StabilityParams::default()
        })
        .unwrap_err();
        assert_eq!(e.field, "drift_scale");
        assert!(e.to_string().starts_with("stability.drift_scale: expected"));
    }
}
