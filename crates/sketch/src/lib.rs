//! # spillway-sketch
//!
//! Which spill-plane flows deserve a DPU hardware entry. Fast-path entries are the scarcest
//! resource of the fabric: the spill plane hands back to the DPU the flows that will keep paying
//! for their entry (stable, high-bandwidth ones) and keeps bursty, short or erratic flows on the
//! host. This crate judges flows; the placement policy that spends entries on its judgement is
//! the fabric's `stability` placement (`spillway sim --placement stability`).
//!
//! ## Main types
//!
//! - [`features::FlowCounters`] / [`features::FeatureTick`]: the cheap per-flow counters a
//!   data plane keeps for every flow, and the four features of a 100 ms tick (bandwidth, packet
//!   rate, control-packet ratio, inter-packet jitter).
//! - [`fd::FrequentDirections`]: the Frequent Directions sketch (basic, fast, buffered and
//!   time-decayed variants) with its error guarantee.
//! - [`classifier::Classifier`]: two tiers, cheap state for every flow and a decayed FD sketch
//!   for a bounded set of candidates; instability in `[0, 1)` from the sketch's residual, the
//!   level drift and the control ratio; `score = gain × (1 − instability)^3`; ranking.
//! - [`trace`]: the CSV trace format of `spillway stability rank`, a labelled trace generator
//!   and the precision/recall evaluation against bandwidth-only rankings.
//!
//! ## Invariants
//!
//! - FD: `0 ⪯ AᵀA − BᵀB ⪯ ‖A − A_k‖²_F / (ℓ − k) · I` for every `k < ℓ` (tested against an
//!   exact SVD).
//! - The classifier never holds more than `sketched_max` sketches; every list it returns is
//!   sorted by (value, flow id), never by hash order; no clock, no randomness.
//!
//! ## Example
//!
//! ```
//! use spillway_sketch::features::FeatureTick;
//! use spillway_sketch::classifier::{Classifier, StabilityParams};
//!
//! let mut c = Classifier::new(StabilityParams::default()).unwrap();
//! for t in 0..40 {
//!     // Flow 1 is steady at 10 Mbit/s; flow 2 bursts at 20 Mbit/s at irregular times.
//!     c.observe(1, &FeatureTick { bw_bps: 10e6, pps: 1e3, ..FeatureTick::default() });
//!     let bw = if (t * t * 7 + 3) % 11 < 5 { 20e6 } else { 0.0 };
//!     c.observe(2, &FeatureTick { bw_bps: bw, pps: bw / 1e4, ..FeatureTick::default() });
//!     c.end_tick();
//! }
//! let (steady, bursty) = (c.score(1).unwrap(), c.score(2).unwrap());
//! assert!(steady.instability < 0.2 && bursty.instability > 0.8);
//! assert!(steady.score > bursty.score);
//! ```

#![deny(unsafe_code)]

pub mod classifier;
pub mod fd;
pub mod features;
pub mod rng;
pub mod trace;
