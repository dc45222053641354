//! The seeded generator of traces, tests and benches: SplitMix64 with Box-Muller normals.
//!
//! The library never draws randomness on its own (the classifier is deterministic); the trace
//! generator takes a seed, and tests and benches use the same named, stable algorithm so their
//! streams reproduce across platforms and releases.

/// SplitMix64 (Steele, Lea and Flood 2014): a tiny, fast, well-mixed 64-bit generator whose
/// output is fixed by its algorithm, so traces reproduce across platforms and releases.
#[derive(Clone, Debug)]
pub struct SplitMix64 {
    state: u64,
    /// The second normal deviate of the last Box-Muller pair.
    spare: Option<f64>,
}

/// SplitMix64's output function: a bijective 64-bit mix.
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl SplitMix64 {
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64 {
            state: seed,
            spare: None,
        }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix64(self.state)
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in (0, 1] (safe under `ln`).
    pub fn uniform_open(&mut self) -> f64 {
        ((self.next_u64() >> 11) + 1) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in [lo, hi).
    pub fn range(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.uniform()
    }

    /// Log-uniform in [lo, hi).
    pub fn log_range(&mut self, lo: f64, hi: f64) -> f64 {
        (lo.ln() + (hi.ln() - lo.ln()) * self.uniform()).exp()
    }

    /// Uniform integer in [lo, hi] (inclusive; the modulo bias is below 2^-50 here).
    pub fn int(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo + 1)
    }

    /// Standard normal (Box-Muller, both deviates used).
    pub fn normal(&mut self) -> f64 {
        if let Some(z) = self.spare.take() {
            return z;
        }
        let r = (-2.0 * self.uniform_open().ln()).sqrt();
        let theta = 2.0 * core::f64::consts::PI * self.uniform();
        self.spare = Some(r * theta.sin());
        r * theta.cos()
    }

    /// Exponential with mean `mean`.
    pub fn exp(&mut self, mean: f64) -> f64 {
        -mean * self.uniform_open().ln()
    }

    /// Pareto with scale (minimum) `min` and tail index `shape`: `P(X > x) = (min / x)^shape`.
    pub fn pareto(&mut self, min: f64, shape: f64) -> f64 {
        min * self.uniform_open().powf(-1.0 / shape)
    }

    /// Log-normal multiplicative noise of log-deviation `sigma` with mean 1.
    pub fn lognormal_noise(&mut self, sigma: f64) -> f64 {
        (sigma * self.normal() - 0.5 * sigma * sigma).exp()
    }
}
