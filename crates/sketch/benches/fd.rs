//! What one Frequent Directions row costs, amortised over the shrinks it eventually triggers.
//! One iteration inserts one row into a warm sketch, so criterion's time per iteration is the
//! cost per row, shrinks included at their steady-state rate (`Fast`: one Gram plus one `D × D`
//! symmetric eigen per `ℓ + 1` rows or so; `Basic`: one per row). This is the per-flow,
//! per-tick price of the stability classifier's sketch tier, which runs it for every sketched
//! flow each tick, so it bounds how many flows can be sketched within the tick budget.
//!
//! Cases, named `sketch/fd/insert/<case>`: `d10_l5_fast_decay` is the classifier's shape (ten
//! features, `ℓ` = 5, `Fast`, half-life 50 rows); `d16_l8_fast` and `d32_l16_fast` show how the
//! cost grows with the row dimension (the eigen is `O(D³)`); `d16_l8_basic` is the same sketch
//! as `d16_l8_fast` with an `ℓ`-row buffer, for the ratio the `Fast` variant buys. Rows are
//! fixed-seed Gaussian, cycled from a pre-generated table so generating them costs nothing.
//!
//! `sketch/fd/spectrum/<case>` times `FrequentDirections::spectrum` on the same warm sketch:
//! what a caller would pay per tick for a fresh eigendecomposition, which
//! `FrequentDirections::last_spectrum` gives for free after each shrink.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use nalgebra::allocator::Allocator;
use nalgebra::{Const, DefaultAllocator, DimDiff, DimSub, U1};
use spillway_sketch::fd::{FrequentDirections, Variant, decay_for_half_life};
use spillway_sketch::rng::SplitMix64;

/// Rows in the pre-generated table (a power of two, indexed with a mask).
const TABLE: usize = 4096;

/// Benchmarks inserting rows of dimension `D` into a warm sketch. The `where` clauses are
/// nalgebra's, needed by any code generic over `D` (see the `fd` module documentation).
fn insert_case<const D: usize>(
    c: &mut Criterion,
    case: &str,
    ell: usize,
    variant: Variant,
    lambda: f64,
) where
    Const<D>: DimSub<U1>,
    DefaultAllocator: Allocator<DimDiff<Const<D>, U1>>,
{
    let mut rng = SplitMix64::new(0x5EED_F00D);
    let rows: Vec<[f64; D]> = (0..TABLE)
        .map(|_| core::array::from_fn(|_| rng.normal()))
        .collect();
    let mut fd = FrequentDirections::<D>::new(ell, variant)
        .and_then(|f| f.with_decay(lambda))
        .expect("valid bench configuration");
    // Warm: fill and shrink the buffer many times so the measured rows see the steady state.
    for r in &rows {
        fd.insert(r);
    }
    let mut i = 0usize;
    c.bench_function(&format!("sketch/fd/insert/{case}"), |b| {
        b.iter(|| {
            fd.insert(black_box(&rows[i & (TABLE - 1)]));
            i = i.wrapping_add(1);
        })
    });
    black_box(fd.shrunk_mass());
    // The on-demand spectrum (Gram of the held rows plus one D × D eigen): the price a caller
    // pays per call that `last_spectrum` avoids, and most of what one shrink costs.
    c.bench_function(&format!("sketch/fd/spectrum/{case}"), |b| {
        b.iter(|| black_box(&fd).spectrum())
    });
}

fn insert(c: &mut Criterion) {
    insert_case::<10>(
        c,
        "d10_l5_fast_decay",
        5,
        Variant::Fast,
        decay_for_half_life(50.0),
    );
    insert_case::<16>(c, "d16_l8_fast", 8, Variant::Fast, 1.0);
    insert_case::<16>(c, "d16_l8_basic", 8, Variant::Basic, 1.0);
    insert_case::<32>(c, "d32_l16_fast", 16, Variant::Fast, 1.0);
}

criterion_group!(benches, insert);
criterion_main!(benches);
