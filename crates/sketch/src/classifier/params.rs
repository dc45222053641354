//! The classifier's parameters: the fixed shape of a sketch row ([`WINDOW`], [`ROW_DIM`]) and
//! of its normalisation ([`FLOOR`], [`Z_CLIP`]), and the tunable [`StabilityParams`] with
//! their defaults, the reason for each, and the range check that [`Classifier::new`] runs.
//! They live apart from the classifier so that what a deployment may set, and why the
//! defaults are what they are, reads in one place.
//!
//! [`Classifier::new`]: super::Classifier::new

/// Ticks of normalised bandwidth in a sketch row (the delay embedding).
pub const WINDOW: usize = 8;
/// Dimension of a sketch row: the window plus control ratio and jitter.
pub const ROW_DIM: usize = WINDOW + 2;
/// Bandwidth floor relative to the flow's mean, so an idle tick has a finite log ratio.
pub const FLOOR: f64 = 0.05;
/// Clip of the normalised bandwidth (log ratio), `e^3 ≈ 20x` either way.
pub const Z_CLIP: f64 = 3.0;

/// Parameters of the classifier. Defaults are documented with their reason.
///
/// Memory: the cheap tier is about 120 bytes per flow; a sketch slot about
/// `(buffer_rows + D + 1) · D · 8` bytes plus the window (2.7 KB with the defaults).
#[derive(Clone, Debug, PartialEq)]
pub struct StabilityParams {
    /// Frequent Directions sketch rows `ell`. Default 5: with `k = 3` the FD guarantee bounds
    /// the sketch's error by half the tail energy (`/(ell - k)`), in 800 bytes per flow.
    pub ell: usize,
    /// Rows of the sketch's buffer (FD shrinks when it fills, so at most every
    /// `buffer_rows - ell + 1` ticks). Default 20: one shrink every 1.6 s per flow, so the
    /// `D x D` eigendecomposition, the dominant cost, is paid once per 16 rows; the subspace a
    /// row is judged against is then at most 1.6 s old, against a sketch memory of 3 s.
    pub buffer_rows: usize,
    /// Rank of the "recurring pattern" subspace. Default 3: a constant level plus one
    /// periodic component (a sine/cosine pair).
    pub k: usize,
    /// Half-life of the sketch's memory, ticks. Default 30 (3 s at 100 ms ticks): long enough
    /// to span several periods of a second-scale pattern.
    pub sketch_half_life_ticks: f64,
    /// Half-life of the long-run mean bandwidth (the normalisation reference and the level
    /// drift is measured against), ticks. Default 100 (10 s).
    pub mean_half_life_ticks: f64,
    /// Half-life of the recent mean bandwidth (the gain, and the level that drifts), ticks.
    /// Default 20 (2 s): long enough to average a periodic flow's swings of a few seconds
    /// out of it, short enough that a random walk's level visibly leaves the long-run mean.
    pub recent_half_life_ticks: f64,
    /// Half-life of the residual and control EWMAs, ticks. Default 10 (1 s).
    pub residual_half_life_ticks: f64,
    /// Half-life of the mean square drift, ticks. Default 30 (3 s): a random walk that
    /// happens to cross its long-run mean right now still remembers where it was.
    pub drift_half_life_ticks: f64,
    /// RMS unexplained log-deviation that counts as 1.0 of instability. Default 0.25.
    pub residual_scale: f64,
    /// Log-ratio of recent to long-run level that counts as 1.0. Default 0.5 (1.65x).
    pub drift_scale: f64,
    /// Control-packet ratio that counts as 1.0. Default 0.5.
    pub ctrl_scale: f64,
    /// Half-life of the held peak of residual + drift, ticks. Default 100 (10 s, the long-run
    /// mean's): a flow that jumped or went silent a few seconds ago stays suspect for tens of
    /// seconds, even when its last three seconds look calm. A walk that shifts its level every
    /// few seconds, or an on/off flow in a long on period, otherwise scores as steady between
    /// its moves.
    pub memory_half_life_ticks: f64,
    /// Exponent `e` of the score `gain × (1 - instability)^e`. Default 3: the smallest whole
    /// exponent whose top K holds at least 95 % stable flows at every K of 25-200 on the
    /// `uniform` trace family (median of seeds 1-5; 2 gives 0.94 at K = 200). With 1, flow
    /// sizes that span 100x let a high-bandwidth random walk (instability 0.8) outscore a
    /// stable flow a fifth its size; with 3 it must be 125 times larger. The price is
    /// bandwidth: the top K carries about 75 % of the bandwidth-only top K's mean rate
    /// instead of 85 % (the crate's README).
    pub instability_exponent: f64,
    /// Ticks a flow must have been sketched before it is scored. Default 10 (1 s): enough for
    /// a full delay-embedding window plus a first subspace, short enough that an elephant is
    /// not kept on the host for long.
    pub min_ticks: u32,
    /// Sketch slots (the bound on sketch work per tick). Default 4,096: several times the free
    /// entries a spill plane can expect to win back in one placement horizon, and within the
    /// cost budget (the sketch tier measured ~0.8 us per sketched flow per tick, so 4,096 flows
    /// at 10 ticks/s are ~3.3% of a core; `benches/classifier.rs`).
    pub sketched_max: usize,
    /// Flows below this recent bandwidth never get a sketch slot, bits/s. Default 0: the slot
    /// pool alone bounds the work; a deployment that knows the smallest flow worth an entry
    /// sets it (also at run time, [`Classifier::set_gain_floor`](super::Classifier::set_gain_floor)).
    pub gain_floor_bps: f64,
    /// A newcomer replaces the weakest sketched flow only when its gain is this many times
    /// larger. Default 2.0.
    pub admit_margin: f64,
    /// Most slot admissions per tick (bounds the work of a tick with many new flows).
    /// Default 2,048.
    pub admit_per_tick_max: usize,
    /// A flow not observed for this many consecutive ticks is forgotten. Default 10.
    pub forget_ticks: u32,
}

impl Default for StabilityParams {
    fn default() -> Self {
        StabilityParams {
            ell: 5,
            buffer_rows: 20,
            k: 3,
            sketch_half_life_ticks: 30.0,
            mean_half_life_ticks: 100.0,
            recent_half_life_ticks: 20.0,
            residual_half_life_ticks: 10.0,
            drift_half_life_ticks: 30.0,
            residual_scale: 0.25,
            drift_scale: 0.5,
            ctrl_scale: 0.5,
            memory_half_life_ticks: 100.0,
            instability_exponent: 3.0,
            min_ticks: 10,
            sketched_max: 4_096,
            gain_floor_bps: 0.0,
            admit_margin: 2.0,
            admit_per_tick_max: 2_048,
            forget_ticks: 10,
        }
    }
}

/// A parameter outside its range.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("stability.{field}: expected {expected}, got {actual}")]
pub struct ParamError {
    /// The field.
    pub field: &'static str,
    /// What was expected.
    pub expected: &'static str,
    /// What it was.
    pub actual: String,
}

impl StabilityParams {
    /// Checks every field's range.
    pub fn validate(&self) -> Result<(), ParamError> {
        let err = |field, expected, actual: String| {
            Err(ParamError {
                field,
                expected,
                actual,
            })
        };
        if self.k == 0 || self.k >= self.ell {
            return err(
                "k",
                "1 <= k < ell",
                format!("k {} ell {}", self.k, self.ell),
            );
        }
        if self.buffer_rows <= self.ell || self.buffer_rows > 1024 {
            return err(
                "buffer_rows",
                "more than ell and at most 1024",
                self.buffer_rows.to_string(),
            );
        }
        if self.ell > ROW_DIM {
            return err(
                "ell",
                "at most the row dimension (10)",
                self.ell.to_string(),
            );
        }
        let positive: [(&'static str, f64); 10] = [
            ("memory_half_life_ticks", self.memory_half_life_ticks),
            ("instability_exponent", self.instability_exponent),
            ("sketch_half_life_ticks", self.sketch_half_life_ticks),
            ("mean_half_life_ticks", self.mean_half_life_ticks),
            ("recent_half_life_ticks", self.recent_half_life_ticks),
            ("residual_half_life_ticks", self.residual_half_life_ticks),
            ("drift_half_life_ticks", self.drift_half_life_ticks),
            ("residual_scale", self.residual_scale),
            ("drift_scale", self.drift_scale),
            ("ctrl_scale", self.ctrl_scale),
        ];
        for (field, v) in positive {
            if !(v.is_finite() && v > 0.0) {
                return err(field, "a finite number > 0", v.to_string());
            }
        }
        if !(self.gain_floor_bps.is_finite() && self.gain_floor_bps >= 0.0) {
            return err(
                "gain_floor_bps",
                "a finite number >= 0",
                self.gain_floor_bps.to_string(),
            );
        }
        if !(self.admit_margin.is_finite() && self.admit_margin >= 1.0) {
            return err(
                "admit_margin",
                "a finite number >= 1",
                self.admit_margin.to_string(),
            );
        }
        if self.sketched_max == 0 {
            return err("sketched_max", "at least 1", "0".into());
        }
        if self.forget_ticks == 0 {
            return err("forget_ticks", "at least 1", "0".into());
        }
        Ok(())
    }
}
