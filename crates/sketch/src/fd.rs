//! Frequent Directions: a deterministic streaming sketch of a matrix's second moment.
//!
//! The stability scorer needs, per tracked flow, the principal directions of a stream of feature
//! vectors `a_1, a_2, ... ∈ R^D` and how much of the stream's energy they explain, in bounded
//! memory and without randomness (every run must replay from its seed, and a sketch that needs a
//! random projection would need a seed per flow). Frequent Directions (Liberty 2013; Ghashami,
//! Liberty, Phillips and Woodruff 2016, "Frequent Directions: simple and deterministic matrix
//! sketching") gives exactly that: a matrix `B` of fewer than `ℓ` nonzero rows such that, with
//! `A` the matrix whose rows are the stream,
//!
//! ```text
//! 0 <= xᵀ(AᵀA − BᵀB)x <= ‖A − A_k‖²_F / (ℓ − k)     for every unit x and every k < ℓ,
//! ```
//!
//! where `A_k` is the best rank-`k` approximation of `A`. When the stream is close to rank `k`
//! the error is close to zero, which is the case that matters for a stable flow.
//!
//! # How it works
//!
//! Rows are appended to a buffer. When the buffer is full it is *shrunk*: with `σ_i², v_i` the
//! eigenpairs of the buffer's Gram matrix `BᵀB` (descending), and `δ = σ_ℓ²` the `ℓ`-th largest
//! eigenvalue (0 when there are fewer than `ℓ`, i.e. `ℓ > D`), the buffer is replaced by the rows
//! `sqrt(σ_i² − δ) · v_i` for `σ_i² > δ`, at most `ℓ − 1` of them. Every direction loses at most
//! `δ` of energy and the top `ℓ` lose exactly `δ`, which is what the bound is made of (see
//! [`FrequentDirections::shrunk_mass`] for the two-line argument).
//!
//! | [`Variant`] | buffer  | shrinks                      | cost per row               |
//! |-------------|---------|------------------------------|----------------------------|
//! | `Basic`     | `ℓ`     | on (almost) every row        | `O(ℓ·D² + D³)`             |
//! | `Fast`      | `2ℓ`    | at most once per `ℓ + 1` rows| `O(D² + D³/ℓ)` amortised   |
//! | `Buffered(m)` | `m >= ℓ` | at most once per `m − ℓ + 1` rows | `O(D² + D³/(m − ℓ))` amortised |
//!
//! All give the same guarantee; `Fast` spends `ℓ` more rows of memory to shrink `ℓ` times less
//! often, `Buffered` generalises that to any buffer size.
//!
//! # Why the Gram route
//!
//! A shrink needs only the `σ_i²` and the right singular vectors `v_i`, never the left ones. For
//! `D <= 32` (the sizes used here) the symmetric eigendecomposition of the `D × D` Gram matrix
//! gives exactly those at about half the cost of an SVD of the `m × D` buffer (`m = ℓ` or `2ℓ`),
//! and forming the Gram costs `m·D²/2` multiply-adds. It also lives on
//! the stack as an `SMatrix<f64, D, D>`, so no shrink allocates. The price of squaring is that
//! eigenvalues below about `D·ε·σ_1²` are lost in rounding; FD throws away everything below
//! `δ = σ_ℓ²` anyway, and the guarantee is additive in units of `‖A‖²_F`, so that loss is far
//! below the bound.
//!
//! # Time decay
//!
//! [`FrequentDirections::with_decay`] multiplies the sketch's second moment by `λ` before each
//! row, so `BᵀB` tracks `C_λ = Σ_i λ^(n−i) a_i a_iᵀ` with the same guarantee stated for the
//! decayed matrix `Ã` whose rows are `λ^((n−i)/2) a_i` (the argument goes through unchanged: a
//! row's arrival multiplies the error by `λ`, a shrink adds between 0 and `δ`).
//!
//! # Allocation and determinism
//!
//! [`FrequentDirections::new`] allocates the row buffer and the slot for the last spectrum; after
//! that [`FrequentDirections::insert`] never allocates. Nothing reads a clock or draws random
//! numbers; eigenvalue ties sort by index and each singular vector's sign is fixed (its largest
//! component is positive), so the same stream gives bit-identical sketches on the same build.
//!
//! # Const-generic bounds
//!
//! nalgebra's `SymmetricEigen` on `SMatrix<f64, D, D>` needs `Const<D>: DimSub<U1>` (and the
//! matching allocator), which holds for every concrete `D` in `1..=127`; generic callers have to
//! repeat the two `where` clauses of [`FrequentDirections`]'s `impl` block.

use nalgebra::allocator::Allocator;
use nalgebra::{Const, DefaultAllocator, DimDiff, DimSub, SMatrix, SymmetricEigen, U1};

/// The largest accepted `ℓ`. FD is meant for small sketches (`ℓ` above `D` is already exact),
/// and the cap keeps the `2ℓ`-row buffer's size computation far from overflow.
pub const ELL_MAX: usize = 1 << 16;

/// The largest accepted squared norm of an inserted row. Rows above it (and rows with NaN or
/// infinite entries) are rejected and counted: with every row's squared norm at most `1e150`,
/// even `2^64` rows keep every Gram entry below `2·10^169`, so the eigensolver only ever sees
/// finite matrices and always converges.
pub const ROW_NORM2_MAX: f64 = 1e150;

/// Iteration cap of the symmetric eigensolver. Implicit-shift QR on a finite symmetric
/// tridiagonal matrix needs two or three iterations per eigenvalue; the cap only turns a
/// would-be hang (impossible with finite input, see [`ROW_NORM2_MAX`]) into a panic with a reason.
const EIGEN_ITERATIONS_MAX: usize = 10_000;

/// Below this the lazy decay scale is folded into the rows. Stored rows are at most
/// `sqrt(ROW_NORM2_MAX) / SCALE_MIN = 1e105` in size, so their Gram stays finite.
const SCALE_MIN: f64 = 1e-30;

/// Errors of the sketch's configuration.
#[derive(Clone, Copy, Debug, PartialEq, thiserror::Error)]
pub enum FdError {
    /// `ℓ` must be at least 1 (a sketch with no rows keeps nothing).
    #[error("sketch size ell too small: expected at least {expected}, got {actual}")]
    EllTooSmall {
        /// The smallest accepted `ℓ`.
        expected: usize,
        /// The `ℓ` asked for.
        actual: usize,
    },
    /// `ℓ` above [`ELL_MAX`].
    #[error("sketch size ell too large: expected at most {expected}, got {actual}")]
    EllTooLarge {
        /// The largest accepted `ℓ`.
        expected: usize,
        /// The `ℓ` asked for.
        actual: usize,
    },
    /// The decay factor must lie in `(0, 1]`: 0 would forget everything at once, above 1 the
    /// sketch would grow without bound, and NaN means nothing.
    #[error("decay factor out of range: expected {expected}, got {actual}")]
    DecayOutOfRange {
        /// The accepted range, as text.
        expected: &'static str,
        /// The factor asked for.
        actual: f64,
    },
    /// [`FrequentDirections::check_invariants`] found a broken invariant (a bug).
    #[error("frequent directions invariant broken: {what}")]
    Invariant {
        /// Which invariant.
        what: &'static str,
    },
}

/// Which buffer size the sketch keeps between shrinks (see the module documentation's table).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Variant {
    /// A buffer of `ℓ` rows, shrunk (by `σ_ℓ²`, zeroing at least one row) whenever it fills.
    /// Once warm that is nearly every row: the smallest memory, the highest cost per row.
    Basic,
    /// A buffer of `2ℓ` rows, shrunk by the `ℓ`-th largest `σ²` when it fills, which leaves at
    /// most `ℓ − 1` rows; the next shrink is at least `ℓ + 1` rows away, so the eigen cost is
    /// amortised over them.
    Fast,
    /// A buffer of `m` rows (at least `ℓ`), shrunk like `Fast` when it fills: the next shrink
    /// is at least `m − ℓ + 1` rows away. The guarantee does not depend on the buffer size
    /// (every shrink still takes `δ` from at least `ℓ` directions); a larger buffer trades
    /// memory for fewer eigendecompositions, which is what a per-flow sketch of small `D`
    /// needs, where the `D × D` eigen dominates the cost and a buffer row is only `D` floats.
    Buffered(usize),
}

impl Variant {
    /// Rows of buffer for sketch size `ell`.
    const fn capacity(self, ell: usize) -> usize {
        match self {
            Variant::Basic => ell,
            Variant::Fast => 2 * ell,
            Variant::Buffered(m) => {
                if m > ell {
                    m
                } else {
                    ell
                }
            }
        }
    }
}

/// The decay factor per row that halves a row's weight in the second moment after `rows` rows:
/// `λ = 2^(−1/rows)`.
///
/// An infinite half-life gives 1 (no decay). A half-life of 0, a negative one or NaN gives 0, a
/// factor above 1 or NaN, all of which [`FrequentDirections::with_decay`] rejects, so a bad
/// configuration surfaces as a typed error rather than a silently wrong sketch.
pub fn decay_for_half_life(rows: f64) -> f64 {
    (-core::f64::consts::LN_2 / rows).exp()
}

/// Eigendecomposition of a sketch's `BᵀB`: the squared singular values of `B` and its right
/// singular vectors.
#[derive(Clone, Debug, PartialEq)]
pub struct Spectrum<const D: usize> {
    /// Eigenvalues `σ_i²`, descending, clamped at 0 (rounding can make a zero eigenvalue of a
    /// positive semidefinite matrix come out slightly negative).
    pub sigma2: [f64; D],
    /// Row `i` is the unit eigenvector of `sigma2[i]`, signed so its largest-magnitude component
    /// (the first on ties) is positive. The rows are orthonormal.
    pub vectors: [[f64; D]; D],
}

impl<const D: usize> Spectrum<D> {
    /// The spectrum of the zero matrix: all eigenvalues 0, the standard basis as vectors.
    pub fn zero() -> Self {
        Self {
            sigma2: [0.0; D],
            vectors: core::array::from_fn(|i| {
                core::array::from_fn(|j| f64::from(u8::from(i == j)))
            }),
        }
    }

    /// `Σ σ_i²`: the sketch's total energy, `‖B‖²_F`.
    pub fn total(&self) -> f64 {
        self.sigma2.iter().sum()
    }

    /// `‖x − V_k V_kᵀ x‖²`: the squared distance from `x` to the span of the top `k` vectors
    /// (`k` is clamped to `D`). The projection is subtracted component by component rather than
    /// computed as `‖x‖² − Σ (v_i·x)²`, which would cancel catastrophically for `x` close to the
    /// subspace, exactly the case a stability score looks at.
    pub fn residual(&self, k: usize, x: &[f64; D]) -> f64 {
        let mut r = *x;
        for v in self.vectors.iter().take(k) {
            let c: f64 = v.iter().zip(x).map(|(a, b)| a * b).sum();
            for (ri, vi) in r.iter_mut().zip(v) {
                *ri -= c * vi;
            }
        }
        r.iter().map(|v| v * v).sum()
    }

    /// The share of the energy in the top `k` directions, `Σ_{i<k} σ_i² / Σ σ_i²`, in `[0, 1]`;
    /// 1 when the total is 0 (an empty sketch is perfectly explained by anything).
    pub fn explained(&self, k: usize) -> f64 {
        let total = self.total();
        if total <= 0.0 {
            return 1.0;
        }
        let top: f64 = self.sigma2.iter().take(k).sum();
        (top / total).clamp(0.0, 1.0)
    }
}

/// A Frequent Directions sketch of a stream of rows in `R^D` (see the module documentation).
///
/// Invariants (checked by [`FrequentDirections::check_invariants`]): the buffer is never full
/// between calls (a full buffer is shrunk at once), so at most `ℓ − 1` (`Basic`) or `2ℓ − 1`
/// (`Fast`) rows are held; every held row is finite; `shrunk_mass` is finite and non-negative.
#[derive(Clone, Debug)]
pub struct FrequentDirections<const D: usize> {
    ell: usize,
    variant: Variant,
    /// The buffer; `rows[..held]` are the sketch's rows, the rest is scratch.
    rows: Box<[[f64; D]]>,
    held: usize,
    /// Second-moment decay per row, in (0, 1].
    lambda: f64,
    /// `sqrt(lambda)`, the factor applied to each held row per arrival.
    row_scale: f64,
    /// The held rows are `rows[..held] × scale`: decay multiplies this one number instead of
    /// every held row (a shrink, or a scale near underflow, folds it back in).
    scale: f64,
    rows_seen: u64,
    rows_rejected: u64,
    shrinks: u64,
    shrunk_mass: f64,
    /// Boxed at construction so a shrink writes into it without allocating, and so moving the
    /// sketch does not copy `D² + D` floats.
    last_spectrum: Box<Spectrum<D>>,
    has_last_spectrum: bool,
}

impl<const D: usize> FrequentDirections<D>
where
    Const<D>: DimSub<U1>,
    DefaultAllocator: Allocator<DimDiff<Const<D>, U1>>,
{
    /// A sketch with `ell` (`ℓ`) rows of budget: the guarantee holds for every `k < ℓ`.
    ///
    /// Allocates the buffer (`ℓ` or `2ℓ` rows of `D` floats) and the last-spectrum slot; nothing
    /// allocates after this.
    pub fn new(ell: usize, variant: Variant) -> Result<Self, FdError> {
        if ell < 1 {
            return Err(FdError::EllTooSmall {
                expected: 1,
                actual: ell,
            });
        }
        if ell > ELL_MAX {
            return Err(FdError::EllTooLarge {
                expected: ELL_MAX,
                actual: ell,
            });
        }
        Ok(Self {
            ell,
            variant,
            rows: vec![[0.0; D]; variant.capacity(ell)].into_boxed_slice(),
            held: 0,
            lambda: 1.0,
            row_scale: 1.0,
            scale: 1.0,
            rows_seen: 0,
            rows_rejected: 0,
            shrinks: 0,
            shrunk_mass: 0.0,
            last_spectrum: Box::new(Spectrum::zero()),
            has_last_spectrum: false,
        })
    }

    /// Turns on time decay: before each new row the sketch's second moment (and
    /// [`Self::shrunk_mass`]) is multiplied by `lambda`, i.e. each held row by `sqrt(lambda)`,
    /// so `BᵀB` tracks `Σ_i λ^(n−i) a_i a_iᵀ`. `lambda = 1` is no decay. Applies from the next
    /// row on; see [`decay_for_half_life`] to pick `lambda` from a half-life in rows.
    pub fn with_decay(mut self, lambda: f64) -> Result<Self, FdError> {
        // Written so NaN fails the test too.
        if !(lambda > 0.0 && lambda <= 1.0) {
            return Err(FdError::DecayOutOfRange {
                expected: "(0, 1]",
                actual: lambda,
            });
        }
        self.lambda = lambda;
        self.row_scale = lambda.sqrt();
        Ok(self)
    }

    /// Adds one row to the stream. Never allocates.
    ///
    /// A zero row counts as a row (it advances the decay and [`Self::rows_seen`]) but takes no
    /// buffer slot, since it adds nothing to `AᵀA`. A row with a NaN or infinite entry, or with
    /// squared norm above [`ROW_NORM2_MAX`], is rejected: it counts in [`Self::rows_seen`] and
    /// [`Self::rows_rejected`] and otherwise changes nothing (one NaN would poison the sketch
    /// for good). When the row fills the buffer, the buffer is shrunk before returning.
    pub fn insert(&mut self, row: &[f64; D]) {
        self.rows_seen += 1;
        let norm2: f64 = row.iter().map(|v| v * v).sum();
        // A NaN or infinite entry makes the norm NaN or infinite.
        if norm2.is_nan() || norm2 > ROW_NORM2_MAX {
            self.rows_rejected += 1;
            return;
        }
        if self.lambda < 1.0 {
            self.scale *= self.row_scale;
            self.shrunk_mass *= self.lambda;
            if self.scale < SCALE_MIN {
                self.fold_scale();
            }
        }
        if norm2 == 0.0 {
            return;
        }
        let inv = 1.0 / self.scale;
        for (out, &v) in self.rows[self.held].iter_mut().zip(row) {
            *out = v * inv;
        }
        self.held += 1;
        if self.held == self.rows.len() {
            self.shrink();
        }
    }

    /// Multiplies the held rows by `scale` and resets it to 1.
    fn fold_scale(&mut self) {
        let s = self.scale;
        for r in &mut self.rows[..self.held] {
            for v in r.iter_mut() {
                *v *= s;
            }
        }
        self.scale = 1.0;
    }

    /// Rows inserted so far, including zero and rejected rows.
    pub fn rows_seen(&self) -> u64 {
        self.rows_seen
    }

    /// Rows rejected by [`Self::insert`] for a non-finite entry or an oversized norm.
    pub fn rows_rejected(&self) -> u64 {
        self.rows_rejected
    }

    /// Shrinks performed so far.
    pub fn shrinks(&self) -> u64 {
        self.shrinks
    }

    /// The sketch size `ℓ`.
    pub fn ell(&self) -> usize {
        self.ell
    }

    /// The buffer variant.
    pub fn variant(&self) -> Variant {
        self.variant
    }

    /// The decay factor per row (1 without decay).
    pub fn decay(&self) -> f64 {
        self.lambda
    }

    /// The current nonzero rows of `B`, buffered (not yet shrunk) rows included, in buffer
    /// order: after a shrink the first rows are the surviving directions, largest first. Rows
    /// that decayed all the way to zero (underflow after a very long idle) are skipped.
    pub fn sketch(&self) -> impl Iterator<Item = [f64; D]> + '_ {
        let s = self.scale;
        self.rows[..self.held]
            .iter()
            .map(move |r| r.map(|v| v * s))
            .filter(|r| r.iter().any(|&v| v != 0.0))
    }

    /// `BᵀB`, the sketch's estimate of the (decayed) second moment `AᵀA`. Costs `held·D²/2`
    /// multiply-adds; the result is exactly symmetric.
    pub fn covariance(&self) -> SMatrix<f64, D, D> {
        gram(&self.rows[..self.held]) * (self.scale * self.scale)
    }

    /// The sum of the shrink amounts `δ` so far, decayed along with the sketch: an upper bound
    /// on the spectral error `‖AᵀA − BᵀB‖₂` (for the decayed `Ã` with decay), and itself at most
    /// `‖A − A_k‖²_F / (ℓ − k)` for every `k < ℓ`.
    ///
    /// Why it bounds the error: with `E = AᵀA − BᵀB`, a row's arrival maps `E` to `λE` (the
    /// row enters both sides), and a shrink by `δ` adds `Σ_i min(σ_i², δ) v_i v_iᵀ`, which lies
    /// between `0` and `δI`; so `0 ⪯ E ⪯ shrunk_mass · I` by induction.
    ///
    /// Why it is at most the FD bound: each shrink removes at least `ℓδ` of `‖B‖²_F` (the top
    /// `ℓ` eigenvalues lose `δ` each), so `ℓ·shrunk_mass <= ‖A‖²_F − ‖B‖²_F`, and on the top
    /// `k` right singular vectors of `A` the two sides differ by at most `k·shrunk_mass`,
    /// giving `(ℓ − k)·shrunk_mass <= ‖A − A_k‖²_F`.
    pub fn shrunk_mass(&self) -> f64 {
        self.shrunk_mass
    }

    /// The eigendecomposition of the current `BᵀB`, computed now (one `D × D` symmetric eigen).
    pub fn spectrum(&self) -> Spectrum<D> {
        let mut out = Spectrum::zero();
        eigen_into(self.covariance(), &mut out);
        out
    }

    /// The spectrum the most recent shrink computed, for free: the eigendecomposition of the
    /// full buffer's `BᵀB` at the moment of the shrink (the row that filled the buffer
    /// included), before the rows were reduced. `None` before the first shrink.
    ///
    /// The sketch right after that shrink has the same vectors and eigenvalues
    /// `max(σ_i² − δ, 0)` for `i < ℓ` (0 beyond), with `δ = sigma2[ℓ − 1]` when `ℓ <= D` and 0
    /// otherwise. Rows inserted since are not reflected.
    pub fn last_spectrum(&self) -> Option<&Spectrum<D>> {
        self.has_last_spectrum.then_some(&*self.last_spectrum)
    }

    /// Forgets the stream (rows, counters, shrunk mass, last spectrum), keeping `ℓ`, the
    /// variant, the decay and the buffer's memory: a tracked-flow slot can be reused without
    /// allocating.
    pub fn clear(&mut self) {
        self.held = 0;
        self.scale = 1.0;
        self.rows_seen = 0;
        self.rows_rejected = 0;
        self.shrinks = 0;
        self.shrunk_mass = 0.0;
        self.has_last_spectrum = false;
    }

    /// Checks the type's invariants (see the type's documentation).
    pub fn check_invariants(&self) -> Result<(), FdError> {
        let fail = |what| Err(FdError::Invariant { what });
        if self.rows.len() != self.variant.capacity(self.ell) {
            return fail("buffer length is not the variant's capacity");
        }
        if self.held >= self.rows.len() {
            return fail("buffer full between calls (a full buffer must have been shrunk)");
        }
        if self.rows[..self.held]
            .iter()
            .flatten()
            .any(|v| !v.is_finite())
        {
            return fail("non-finite entry in a held row");
        }
        if !(self.shrunk_mass.is_finite() && self.shrunk_mass >= 0.0) {
            return fail("shrunk mass not finite and non-negative");
        }
        if !(self.lambda > 0.0 && self.lambda <= 1.0) {
            return fail("decay factor outside (0, 1]");
        }
        if !(self.scale >= SCALE_MIN && self.scale <= 1.0) {
            return fail("lazy decay scale outside [SCALE_MIN, 1]");
        }
        if self.has_last_spectrum != (self.shrinks > 0) {
            return fail("last spectrum present iff a shrink happened");
        }
        if self.rows_rejected > self.rows_seen {
            return fail("more rows rejected than seen");
        }
        Ok(())
    }

    /// Reduces a full buffer to at most `ℓ − 1` rows (see the module documentation).
    fn shrink(&mut self) {
        self.fold_scale();
        let spectrum = &mut *self.last_spectrum;
        eigen_into(gram(&self.rows[..self.held]), spectrum);
        self.has_last_spectrum = true;
        self.shrinks += 1;

        // δ is the ℓ-th largest eigenvalue; with ℓ > D there are fewer than ℓ eigenvalues, the
        // buffer (more than D rows) is compressed to at most D rows losslessly and δ = 0.
        let delta = if self.ell <= D {
            spectrum.sigma2[self.ell - 1]
        } else {
            0.0
        };
        let mut held = 0;
        // Eigenvalues are sorted, so the survivors are a prefix; the one at index ℓ − 1 equals δ
        // and never survives, so at most ℓ − 1 rows are kept and the buffer always has room.
        for (s2, v) in spectrum.sigma2.iter().zip(&spectrum.vectors).take(self.ell) {
            let kept = s2 - delta;
            if kept <= 0.0 {
                break;
            }
            let s = kept.sqrt();
            for (out, vi) in self.rows[held].iter_mut().zip(v) {
                *out = s * vi;
            }
            held += 1;
        }
        self.held = held;
        self.shrunk_mass += delta;
    }
}

/// `Σ_r r rᵀ` over the given rows, as a symmetric `SMatrix`.
///
/// Accumulates the lower triangle of a plain row-major array (contiguous, bounds-check-free
/// inner loop) and mirrors it, so the eigensolver sees an exactly symmetric matrix.
fn gram<const D: usize>(rows: &[[f64; D]]) -> SMatrix<f64, D, D> {
    let mut g = [[0.0_f64; D]; D];
    for r in rows {
        for (i, (gi, &ri)) in g.iter_mut().zip(r).enumerate() {
            for (gij, &rj) in gi[..=i].iter_mut().zip(r) {
                *gij += ri * rj;
            }
        }
    }
    SMatrix::from_fn(|i, j| if j <= i { g[i][j] } else { g[j][i] })
}

/// Writes the sorted, sign-normalised eigendecomposition of the symmetric `g` into `out`.
fn eigen_into<const D: usize>(g: SMatrix<f64, D, D>, out: &mut Spectrum<D>)
where
    Const<D>: DimSub<U1>,
    DefaultAllocator: Allocator<DimDiff<Const<D>, U1>>,
{
    let eig = SymmetricEigen::<f64, Const<D>>::try_new(g, f64::EPSILON, EIGEN_ITERATIONS_MAX)
        .expect("a finite symmetric matrix converges well within the iteration cap");
    // Descending eigenvalue, ties by index: a total, deterministic order, and the unstable
    // sort of a stack array does not allocate.
    let mut order: [usize; D] = core::array::from_fn(|i| i);
    order.sort_unstable_by(|&a, &b| {
        eig.eigenvalues[b]
            .total_cmp(&eig.eigenvalues[a])
            .then(a.cmp(&b))
    });
    for (rank, &col) in order.iter().enumerate() {
        out.sigma2[rank] = eig.eigenvalues[col].max(0.0);
        let v = &mut out.vectors[rank];
        for (vi, &e) in v.iter_mut().zip(eig.eigenvectors.column(col).iter()) {
            *vi = e;
        }
        // Fix the sign: the largest-magnitude component (first on ties) is made positive, so
        // consumers comparing directions across ticks see no spurious flips.
        let mut pivot = 0.0_f64;
        for &vi in v.iter() {
            if vi.abs() > pivot.abs() {
                pivot = vi;
            }
        }
        if pivot < 0.0 {
            for vi in v.iter_mut() {
                *vi = -*vi;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::rng::SplitMix64;

    /// A row uniform in [-1, 1)^D.
    fn row<const D: usize>(rng: &mut SplitMix64) -> [f64; D] {
        core::array::from_fn(|_| rng.uniform() * 2.0 - 1.0)
    }

    fn max_abs_diff<const D: usize>(a: &SMatrix<f64, D, D>, b: &SMatrix<f64, D, D>) -> f64 {
        (a - b).amax()
    }

    fn outer_sum<const D: usize>(rows: &[[f64; D]]) -> SMatrix<f64, D, D> {
        let mut c = SMatrix::<f64, D, D>::zeros();
        for r in rows {
            for i in 0..D {
                for j in 0..D {
                    c[(i, j)] += r[i] * r[j];
                }
            }
        }
        c
    }

    #[test]
    fn new_rejects_zero_ell_with_expected_and_actual() {
        let err = FrequentDirections::<4>::new(0, Variant::Basic).unwrap_err();
        assert_eq!(
            err,
            FdError::EllTooSmall {
                expected: 1,
                actual: 0
            }
        );
        assert!(err.to_string().contains("expected at least 1, got 0"));
        let err = FrequentDirections::<4>::new(ELL_MAX + 1, Variant::Fast).unwrap_err();
        assert_eq!(
            err,
            FdError::EllTooLarge {
                expected: ELL_MAX,
                actual: ELL_MAX + 1
            }
        );
    }

    #[test]
    fn with_decay_accepts_only_the_unit_interval_open_at_zero() {
        let fd = || FrequentDirections::<3>::new(2, Variant::Fast).unwrap();
        for bad in [0.0, -0.5, 1.0 + 1e-12, f64::NAN, f64::INFINITY] {
            assert!(
                matches!(fd().with_decay(bad), Err(FdError::DecayOutOfRange { .. })),
                "{bad} accepted"
            );
        }
        assert_eq!(fd().with_decay(1.0).unwrap().decay(), 1.0);
        assert_eq!(fd().with_decay(0.25).unwrap().decay(), 0.25);
    }

    #[test]
    fn half_life_factor_halves_after_that_many_rows_and_bad_half_lives_are_rejected() {
        let l = decay_for_half_life(10.0);
        assert!((l.powi(10) - 0.5).abs() < 1e-14);
        assert_eq!(decay_for_half_life(f64::INFINITY), 1.0);
        for bad in [0.0, -3.0, f64::NAN] {
            let lambda = decay_for_half_life(bad);
            assert!(
                FrequentDirections::<2>::new(1, Variant::Basic)
                    .unwrap()
                    .with_decay(lambda)
                    .is_err(),
                "half-life {bad} gave accepted factor {lambda}"
            );
        }
    }

    #[test]
    fn short_stream_is_held_exactly() {
        let mut rng = SplitMix64::new(1);
        let rows: Vec<[f64; 5]> = (0..7).map(|_| row(&mut rng)).collect();
        let mut fd = FrequentDirections::<5>::new(4, Variant::Fast).unwrap();
        for r in &rows {
            fd.insert(r);
        }
        assert_eq!(fd.shrinks(), 0);
        assert!(fd.last_spectrum().is_none());
        let held: Vec<[f64; 5]> = fd.sketch().collect();
        assert_eq!(held, rows);
        assert!(max_abs_diff(&fd.covariance(), &outer_sum(&rows)) < 1e-15);
        assert_eq!(fd.shrunk_mass(), 0.0);
        fd.check_invariants().unwrap();
    }

    #[test]
    fn zero_rows_count_but_take_no_slot() {
        let mut fd = FrequentDirections::<3>::new(2, Variant::Basic).unwrap();
        for _ in 0..10 {
            fd.insert(&[0.0; 3]);
        }
        assert_eq!(fd.rows_seen(), 10);
        assert_eq!(fd.sketch().count(), 0);
        assert_eq!(fd.shrinks(), 0);
        fd.insert(&[1.0, 0.0, 0.0]);
        assert_eq!(fd.sketch().count(), 1);
        fd.check_invariants().unwrap();
    }

    #[test]
    fn non_finite_and_oversized_rows_are_rejected_and_counted() {
        let mut fd = FrequentDirections::<2>::new(2, Variant::Fast).unwrap();
        fd.insert(&[1.0, 2.0]);
        let before = fd.covariance();
        for bad in [
            [f64::NAN, 0.0],
            [f64::INFINITY, 1.0],
            [0.0, f64::NEG_INFINITY],
            [1e100, 0.0],
        ] {
            fd.insert(&bad);
        }
        assert_eq!(fd.rows_seen(), 5);
        assert_eq!(fd.rows_rejected(), 4);
        assert_eq!(fd.covariance(), before);
        fd.check_invariants().unwrap();
    }

    #[test]
    fn basic_holds_fewer_than_ell_rows_and_shrinks_every_row_once_warm() {
        let mut rng = SplitMix64::new(2);
        let mut fd = FrequentDirections::<6>::new(3, Variant::Basic).unwrap();
        for i in 0..50_u64 {
            fd.insert(&row(&mut rng));
            assert!(fd.sketch().count() < 3);
            // Random rows in R^6 are in general position: after warm-up each row fills the
            // buffer again.
            if i >= 2 {
                assert_eq!(fd.shrinks(), i - 1);
            }
            fd.check_invariants().unwrap();
        }
    }

    #[test]
    fn fast_shrinks_at_most_once_per_ell_plus_one_rows() {
        let mut rng = SplitMix64::new(3);
        let ell = 4;
        let mut fd = FrequentDirections::<8>::new(ell, Variant::Fast).unwrap();
        let mut last_shrink_at = None;
        for i in 0..200_u64 {
            let before = fd.shrinks();
            fd.insert(&row(&mut rng));
            assert!(fd.sketch().count() < 2 * ell);
            if fd.shrinks() > before {
                assert!(fd.sketch().count() < ell);
                if let Some(prev) = last_shrink_at {
                    assert!(i - prev > ell as u64, "shrinks at rows {prev} and {i}");
                }
                last_shrink_at = Some(i);
            }
        }
        assert!(fd.shrinks() >= 200 / (2 * ell as u64));
    }

    /// The exact property of `last_spectrum`: it is the eigendecomposition of the buffer
    /// (held rows plus the row that triggered the shrink), and the sketch after the shrink has
    /// the same vectors with eigenvalues reduced by δ = sigma2[ℓ − 1].
    #[test]
    fn last_spectrum_is_the_pre_shrink_buffer_spectrum_and_predicts_the_sketch() {
        let mut rng = SplitMix64::new(4);
        let ell = 3;
        let mut fd = FrequentDirections::<5>::new(ell, Variant::Fast).unwrap();
        let mut checked = 0;
        for _ in 0..100 {
            let row: [f64; 5] = row(&mut rng);
            let mut buffer: Vec<[f64; 5]> = fd.sketch().collect();
            buffer.push(row);
            let shrinks = fd.shrinks();
            fd.insert(&row);
            if fd.shrinks() == shrinks {
                continue;
            }
            checked += 1;
            let last = fd.last_spectrum().expect("a shrink just happened").clone();

            // Exact pre-shrink spectrum, from the exact Gram of the buffer via nalgebra's
            // dynamic eigensolver (independent of the sketch's code path).
            let g = outer_sum(&buffer);
            let exact = nalgebra::DMatrix::from_fn(5, 5, |i, j| g[(i, j)]).symmetric_eigen();
            let mut vals: Vec<f64> = exact.eigenvalues.iter().copied().collect();
            vals.sort_by(|a, b| b.total_cmp(a));
            let scale = vals[0];
            for (a, b) in last.sigma2.iter().zip(&vals) {
                assert!((a - b.max(0.0)).abs() <= 1e-12 * scale, "{a} vs {b}");
            }
            // Each vector is a unit eigenvector of the buffer's Gram: ‖G v − σ² v‖ small.
            for (s2, v) in last.sigma2.iter().zip(&last.vectors) {
                let v = nalgebra::SVector::<f64, 5>::from_column_slice(v);
                assert!((v.norm() - 1.0).abs() < 1e-12);
                assert!((g * v - v * *s2).norm() <= 1e-12 * scale);
            }

            // The sketch after the shrink: same vectors, eigenvalues minus δ.
            let delta = last.sigma2[ell - 1];
            let now = fd.spectrum();
            for i in 0..5 {
                let expected = if i < ell {
                    (last.sigma2[i] - delta).max(0.0)
                } else {
                    0.0
                };
                assert!((now.sigma2[i] - expected).abs() <= 1e-12 * scale);
            }
            let cov = fd.covariance();
            let mut predicted = SMatrix::<f64, 5, 5>::zeros();
            for (s2, v) in last.sigma2.iter().zip(&last.vectors).take(ell) {
                let v = nalgebra::SVector::<f64, 5>::from_column_slice(v);
                predicted += v * v.transpose() * (s2 - delta).max(0.0);
            }
            assert!(max_abs_diff(&cov, &predicted) <= 1e-12 * scale);
        }
        assert!(checked > 10);
    }

    #[test]
    fn ell_above_d_is_exact() {
        let mut rng = SplitMix64::new(5);
        let rows: Vec<[f64; 3]> = (0..100).map(|_| row(&mut rng)).collect();
        for variant in [Variant::Basic, Variant::Fast] {
            let mut fd = FrequentDirections::<3>::new(5, variant).unwrap();
            for r in &rows {
                fd.insert(r);
            }
            assert!(fd.shrinks() > 0);
            assert_eq!(fd.shrunk_mass(), 0.0);
            assert!(fd.sketch().count() <= 3 + 2 * 5);
            let exact = outer_sum(&rows);
            assert!(max_abs_diff(&fd.covariance(), &exact) <= 1e-12 * exact.amax());
        }
    }

    #[test]
    fn decay_scales_held_rows_per_arrival() {
        let mut fd = FrequentDirections::<2>::new(3, Variant::Basic)
            .unwrap()
            .with_decay(0.5)
            .unwrap();
        fd.insert(&[2.0, 0.0]);
        for _ in 0..3 {
            fd.insert(&[0.0, 0.0]);
        }
        // (2·0.5^(3/2))² = 4 · 0.125.
        let c = fd.covariance();
        assert!((c[(0, 0)] - 0.5).abs() < 1e-15);
        assert_eq!(c[(1, 1)], 0.0);
    }

    #[test]
    fn spectrum_helpers_on_a_known_spectrum() {
        let mut s = Spectrum::<3>::zero();
        assert_eq!(s.explained(0), 1.0);
        s.sigma2 = [3.0, 1.0, 0.0];
        assert_eq!(s.total(), 4.0);
        assert_eq!(s.explained(1), 0.75);
        assert_eq!(s.explained(2), 1.0);
        assert_eq!(s.explained(10), 1.0);
        let x = [1.0, 2.0, 3.0];
        assert_eq!(s.residual(0, &x), 14.0);
        assert_eq!(s.residual(1, &x), 13.0);
        assert_eq!(s.residual(2, &x), 9.0);
        assert_eq!(s.residual(3, &x), 0.0);
        assert_eq!(s.residual(99, &x), 0.0);
    }

    #[test]
    fn spectrum_vectors_are_orthonormal_sorted_and_sign_fixed() {
        let mut rng = SplitMix64::new(6);
        let mut fd = FrequentDirections::<7>::new(5, Variant::Fast).unwrap();
        for _ in 0..40 {
            fd.insert(&row(&mut rng));
        }
        let s = fd.spectrum();
        assert!(s.sigma2.windows(2).all(|w| w[0] >= w[1]));
        for (i, vi) in s.vectors.iter().enumerate() {
            let pivot = vi
                .iter()
                .copied()
                .fold(0.0_f64, |p, x| if x.abs() > p.abs() { x } else { p });
            assert!(pivot > 0.0);
            for (j, vj) in s.vectors.iter().enumerate() {
                let dot: f64 = vi.iter().zip(vj).map(|(a, b)| a * b).sum();
                let want = if i == j { 1.0 } else { 0.0 };
                assert!((dot - want).abs() < 1e-12);
            }
        }
    }

    #[test]
    fn same_stream_gives_bit_identical_sketches() {
        let run = || {
            let mut rng = SplitMix64::new(7);
            let mut fd = FrequentDirections::<6>::new(3, Variant::Fast)
                .unwrap()
                .with_decay(0.97)
                .unwrap();
            for _ in 0..300 {
                fd.insert(&row(&mut rng));
            }
            (fd.sketch().collect::<Vec<_>>(), fd.shrunk_mass())
        };
        assert_eq!(run(), run());
    }

    #[test]
    fn clear_forgets_the_stream_but_keeps_the_configuration() {
        let mut rng = SplitMix64::new(8);
        let mut fd = FrequentDirections::<4>::new(2, Variant::Basic)
            .unwrap()
            .with_decay(0.9)
            .unwrap();
        for _ in 0..20 {
            fd.insert(&row(&mut rng));
        }
        fd.clear();
        assert_eq!(fd.rows_seen(), 0);
        assert_eq!(fd.sketch().count(), 0);
        assert!(fd.last_spectrum().is_none());
        assert_eq!(fd.shrunk_mass(), 0.0);
        assert_eq!(fd.decay(), 0.9);
        fd.check_invariants().unwrap();
    }
}
