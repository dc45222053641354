//! Frequent Directions keeps its published guarantee, checked against an exact reference.
//!
//! For each stream `A` (rows `a_1..a_n`, optionally decayed into `Ã` with rows
//! `λ^((n−i)/2) a_i`) the test computes, with nalgebra's dynamic `DMatrix` routines and
//! independently of the sketch's code path: the singular values of `A` (SVD), hence the tails
//! `‖A − A_k‖²_F`, and the extreme eigenvalues of the error `E = AᵀA − BᵀB`, which are the
//! minimum and maximum of `xᵀEx` over unit `x`. It then asserts, for every `k < ℓ`, that
//! `λ_min(E) >= −tol` and `λ_max(E) <= ‖A − A_k‖²_F / (ℓ − k) + tol`, that `shrunk_mass` lies
//! between `λ_max(E)` and that bound, and that the sketch's top-`k` subspace projects `A` with
//! error at most `‖A − A_k‖²_F + k·shrunk_mass` (Ghashami et al. 2016, Theorem 1.1's
//! `(1 + k/(ℓ − k))` form). Streams come from the crate's seeded SplitMix64 with Box–Muller
//! normals: Gaussian matrices, low rank plus noise (where the bound is small and the check is
//! tight), streams with zero rows, streams shorter than the buffer (exact: zero error), decayed
//! streams, and proptest-generated small matrices for both variants.

use nalgebra::{DMatrix, SymmetricEigen};
use proptest::prelude::*;
use spillway_sketch::fd::{FrequentDirections, Variant, decay_for_half_life};
use spillway_sketch::rng::SplitMix64;

/// `n` rows of independent standard normals.
fn gaussian_rows<const D: usize>(rng: &mut SplitMix64, n: usize) -> Vec<[f64; D]> {
    (0..n)
        .map(|_| core::array::from_fn(|_| rng.normal()))
        .collect()
}

/// What one check measured, for the callers' tightness assertions.
#[derive(Debug)]
struct Checked {
    /// `λ_max(ÃᵀÃ − BᵀB)`.
    err_max: f64,
    /// `‖Ã‖²_F`.
    scale: f64,
    /// `‖Ã − Ã_k‖²_F / (ℓ − k)` for each `k < ℓ`.
    bounds: Vec<f64>,
}

/// Feeds `rows` to a fresh sketch and checks every guarantee against the exact reference.
fn run_and_check<const D: usize>(
    rows: &[[f64; D]],
    ell: usize,
    variant: Variant,
    lambda: f64,
) -> (FrequentDirections<D>, Checked)
where
    nalgebra::Const<D>: nalgebra::DimSub<nalgebra::U1>,
    nalgebra::DefaultAllocator:
        nalgebra::allocator::Allocator<nalgebra::DimDiff<nalgebra::Const<D>, nalgebra::U1>>,
{
    let mut fd = FrequentDirections::<D>::new(ell, variant)
        .unwrap()
        .with_decay(lambda)
        .unwrap();
    for r in rows {
        fd.insert(r);
        fd.check_invariants().unwrap();
    }
    assert_eq!(fd.rows_seen(), rows.len() as u64);
    let checked = check(rows, &fd, lambda);
    (fd, checked)
}

fn check<const D: usize>(rows: &[[f64; D]], fd: &FrequentDirections<D>, lambda: f64) -> Checked
where
    nalgebra::Const<D>: nalgebra::DimSub<nalgebra::U1>,
    nalgebra::DefaultAllocator:
        nalgebra::allocator::Allocator<nalgebra::DimDiff<nalgebra::Const<D>, nalgebra::U1>>,
{
    let n = rows.len();
    let ell = fd.ell();
    // Ã: row i (0-based) weighted by λ^((n−1−i)/2), so the newest row has weight 1.
    let a = DMatrix::from_fn(n, D, |i, j| {
        rows[i][j] * lambda.powf((n - 1 - i) as f64 / 2.0)
    });
    let scale = a.norm_squared();
    let tol = 1e-9 * scale.max(f64::MIN_POSITIVE);

    // Squared singular values of Ã, descending, padded to D; tails[k] = ‖Ã − Ã_k‖²_F.
    let mut s2 = vec![0.0; D];
    if n > 0 {
        let mut sv: Vec<f64> = a
            .clone()
            .svd(false, false)
            .singular_values
            .iter()
            .map(|s| s * s)
            .collect();
        sv.sort_by(|x, y| y.total_cmp(x));
        for (dst, v) in s2.iter_mut().zip(sv) {
            *dst = v;
        }
    }
    let tails: Vec<f64> = (0..=D).map(|k| s2[k.min(D)..].iter().sum()).collect();
    let tail = |k: usize| tails[k.min(D)];

    // E = ÃᵀÃ − BᵀB; its extreme eigenvalues are the extremes of xᵀEx over unit x.
    let c = a.transpose() * &a;
    let cov = fd.covariance();
    let b = DMatrix::from_fn(D, D, |i, j| cov[(i, j)]);
    let e = &c - &b;
    let e = (&e + e.transpose()) * 0.5;
    let eig = SymmetricEigen::<f64, nalgebra::Dyn>::new(e).eigenvalues;
    let err_min = eig.min();
    let err_max = eig.max();

    assert!(err_min >= -tol, "λ_min(E) = {err_min} < −{tol}");
    assert!(
        fd.shrunk_mass() >= err_max - tol,
        "shrunk_mass {} below λ_max(E) = {err_max}",
        fd.shrunk_mass()
    );
    let mut bounds = Vec::with_capacity(ell);
    for k in 0..ell {
        let bound = tail(k) / (ell - k) as f64;
        assert!(
            err_max <= bound + tol,
            "k = {k}: λ_max(E) = {err_max} > ‖A − A_k‖²/(ℓ − k) = {bound}"
        );
        assert!(
            fd.shrunk_mass() <= bound + tol,
            "k = {k}: shrunk_mass {} > bound {bound}",
            fd.shrunk_mass()
        );
        bounds.push(bound);
    }

    // Projection error of Ã onto the sketch's top-k directions, through Spectrum::residual.
    let spectrum = fd.spectrum();
    for k in 1..ell.min(D + 1) {
        let proj_err: f64 = (0..n)
            .map(|i| {
                let row: [f64; D] = core::array::from_fn(|j| a[(i, j)]);
                spectrum.residual(k, &row)
            })
            .sum();
        let limit = tail(k) + k as f64 * fd.shrunk_mass();
        assert!(
            proj_err <= limit + tol,
            "k = {k}: ‖Ã − π_Bk(Ã)‖² = {proj_err} > {limit}"
        );
    }
    Checked {
        err_max,
        scale,
        bounds,
    }
}

#[test]
fn gaussian_d16_ell4_and_ell8_both_variants() {
    let rows = gaussian_rows::<16>(&mut SplitMix64::new(0x5EED_0001), 500);
    for ell in [4, 8] {
        for variant in [Variant::Basic, Variant::Fast, Variant::Buffered(24)] {
            let (fd, c) = run_and_check(&rows, ell, variant, 1.0);
            assert!(fd.shrinks() > 0);
            // A Gaussian matrix has a flat spectrum: the error is a real fraction of the bound,
            // so this case exercises it rather than passing vacuously.
            assert!(c.err_max > 0.1 * c.bounds[0], "{c:?}");
        }
    }
}

#[test]
fn gaussian_d32_ell10_both_variants() {
    let rows = gaussian_rows::<32>(&mut SplitMix64::new(0x5EED_0002), 500);
    for variant in [Variant::Basic, Variant::Fast, Variant::Buffered(24)] {
        let (fd, _) = run_and_check(&rows, 10, variant, 1.0);
        assert!(fd.shrinks() > 0);
    }
}

/// Rank-3 signal in R^16 plus noise of standard deviation 0.01: the bound for k = 3 is tiny,
/// and the sketch must find the signal subspace.
#[test]
fn low_rank_plus_noise_is_captured_with_a_small_error() {
    const D: usize = 16;
    let mut rng = SplitMix64::new(0x5EED_0003);
    let basis: [[f64; D]; 3] = core::array::from_fn(|_| core::array::from_fn(|_| rng.normal()));
    let rows: Vec<[f64; D]> = (0..500)
        .map(|_| {
            let w = [3.0 * rng.normal(), 2.0 * rng.normal(), rng.normal()];
            core::array::from_fn(|j| {
                (0..3).map(|r| w[r] * basis[r][j]).sum::<f64>() + 0.01 * rng.normal()
            })
        })
        .collect();
    for variant in [Variant::Basic, Variant::Fast, Variant::Buffered(24)] {
        let (fd, c) = run_and_check(&rows, 8, variant, 1.0);
        // The k = 3 bound is the noise energy over 5: orders of magnitude below the signal.
        assert!(c.bounds[3] < 1e-4 * c.scale, "{c:?}");
        assert!(c.err_max <= c.bounds[3]);
        let spectrum = fd.spectrum();
        assert!(spectrum.explained(3) > 0.999, "{}", spectrum.explained(3));
        // Every signal direction lies in the sketch's top-3 subspace up to the noise level.
        for v in &basis {
            let norm2: f64 = v.iter().map(|x| x * x).sum();
            assert!(spectrum.residual(3, v) < 1e-4 * norm2);
        }
    }
}

#[test]
fn zero_rows_in_the_stream_change_nothing_but_the_count() {
    let mut rng = SplitMix64::new(0x5EED_0004);
    let rows: Vec<[f64; 8]> = (0..300)
        .map(|i| {
            if i % 3 == 0 {
                [0.0; 8]
            } else {
                core::array::from_fn(|_| rng.normal())
            }
        })
        .collect();
    let nonzero: Vec<[f64; 8]> = rows.iter().copied().filter(|r| r != &[0.0; 8]).collect();
    for variant in [Variant::Basic, Variant::Fast, Variant::Buffered(24)] {
        let (with_zeros, _) = run_and_check(&rows, 4, variant, 1.0);
        let (without, _) = run_and_check(&nonzero, 4, variant, 1.0);
        assert_eq!(
            with_zeros.sketch().collect::<Vec<_>>(),
            without.sketch().collect::<Vec<_>>()
        );
    }
    // All zeros: an empty sketch, zero error.
    let zeros = vec![[0.0; 8]; 50];
    let (fd, c) = run_and_check(&zeros, 3, Variant::Basic, 1.0);
    assert_eq!(fd.sketch().count(), 0);
    assert_eq!(c.err_max, 0.0);
}

#[test]
fn stream_shorter_than_the_buffer_is_exact() {
    let mut rng = SplitMix64::new(0x5EED_0005);
    for (variant, n) in [(Variant::Basic, 5), (Variant::Fast, 11)] {
        let rows = gaussian_rows::<10>(&mut rng, n);
        let (fd, c) = run_and_check(&rows, 6, variant, 1.0);
        assert_eq!(fd.shrinks(), 0);
        assert_eq!(fd.shrunk_mass(), 0.0);
        assert_eq!(fd.sketch().collect::<Vec<_>>(), rows);
        assert!(c.err_max.abs() <= 1e-13 * c.scale, "{c:?}");
    }
}

#[test]
fn decayed_sketch_tracks_the_decayed_second_moment() {
    let mut rng = SplitMix64::new(0x5EED_0006);
    let lambda = decay_for_half_life(50.0);
    // A drifting stream: the dominant direction changes half way, which a decayed sketch must
    // follow.
    let mut rows = gaussian_rows::<10>(&mut rng, 400);
    for (i, r) in rows.iter_mut().enumerate() {
        let axis = if i < 200 { 0 } else { 5 };
        r[axis] *= 10.0;
    }
    for variant in [Variant::Basic, Variant::Fast, Variant::Buffered(24)] {
        for ell in [3, 5] {
            let (fd, _) = run_and_check(&rows, ell, variant, lambda);
            let top = fd.spectrum().vectors[0];
            assert!(
                top[5].abs() > 0.95,
                "top direction {top:?} did not follow the drift"
            );
        }
    }
    // A stream that goes quiet: the sketch and its error fade together, and the bound holds
    // throughout the silence.
    let mut quiet = rows[..100].to_vec();
    quiet.extend(core::iter::repeat_n([0.0; 10], 200));
    let (fd, c) = run_and_check(&quiet, 5, Variant::Fast, 0.9);
    let loud: f64 = quiet.iter().flatten().map(|v| v * v).sum();
    let energy: f64 = fd.sketch().flatten().map(|v| v * v).sum();
    assert!(c.scale < 1e-6 * loud, "{c:?}");
    assert!(energy <= c.scale * (1.0 + 1e-9));
}

fn row4() -> impl Strategy<Value = [f64; 4]> {
    let entry = prop_oneof![1 => Just(0.0), 6 => -100.0..100.0_f64];
    prop_oneof![
        1 => Just([0.0; 4]),
        8 => [entry.clone(), entry.clone(), entry.clone(), entry],
    ]
}

proptest! {
    /// Arbitrary small matrices (including zero rows, repeated rows and a wide range of
    /// magnitudes), both variants, with and without decay: never a panic, never a broken bound.
    #[test]
    fn arbitrary_small_streams_never_break_the_bound(
        rows in prop::collection::vec(row4(), 0..60),
        repeat in 0..3usize,
        magnitude in -6..7i32,
        ell in 1..6usize,
        fast in any::<bool>(),
        lambda in prop_oneof![Just(1.0), 0.5..1.0_f64],
    ) {
        let scale = 10f64.powi(magnitude);
        let rows: Vec<[f64; 4]> = rows
            .iter()
            .flat_map(|r| core::iter::repeat_n(r.map(|v| v * scale), repeat + 1))
            .collect();
        let variant = if fast { Variant::Fast } else { Variant::Basic };
        run_and_check(&rows, ell, variant, lambda);
    }
}
