//! Per-flow features, one sample per placement tick (100 ms in the seed).
//!
//! [`FlowCounters`] is what a data plane keeps for **every** flow: a few integers and floats
//! updated per arrival, turned into one [`FeatureTick`] at the end of a tick. It costs tens of
//! nanoseconds per flow per tick, so it can run for every one of 100,000 flows; the sketch work
//! of [`crate::classifier`] is spent only on the flows worth an entry.
//!
//! The four features are the seed's: bandwidth, packet rate, control-packet ratio (SYN, FIN, RST
//! and pure ACK share of the packets) and inter-packet jitter (standard deviation of the gaps
//! between packets in the tick). They are raw here; [`crate::classifier`] normalises them.

use core::time::Duration;

/// One flow's features over one tick.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FeatureTick {
    /// Bits per second.
    pub bw_bps: f64,
    /// Packets per second.
    pub pps: f64,
    /// Share of control packets (SYN, FIN, RST, pure ACK), in [0, 1].
    pub ctrl_ratio: f64,
    /// Standard deviation of the inter-packet gaps in the tick, microseconds.
    pub jitter_us: f64,
}

impl FeatureTick {
    /// The jitter relative to the mean gap (coefficient of variation of the gaps): scale-free,
    /// so a 1 kpps and a 1 Mpps flow with equally regular timing score alike. 0 without packets.
    pub fn jitter_cv(&self) -> f64 {
        if self.pps > 0.0 && self.jitter_us.is_finite() {
            // Mean gap in us is 1e6 / pps.
            (self.jitter_us * self.pps / 1e6).max(0.0)
        } else {
            0.0
        }
    }

    /// True when every field is finite and in its range (bandwidth, rate and jitter
    /// non-negative, the control ratio in [0, 1]).
    pub fn is_valid(&self) -> bool {
        self.bw_bps.is_finite()
            && self.bw_bps >= 0.0
            && self.pps.is_finite()
            && self.pps >= 0.0
            && self.ctrl_ratio.is_finite()
            && (0.0..=1.0).contains(&self.ctrl_ratio)
            && self.jitter_us.is_finite()
            && self.jitter_us >= 0.0
    }
}

/// The cheap per-flow counters of one tick.
///
/// An arrival of `n` packets at one instant (a receive batch, a simulator train) is counted as
/// `n` gaps of `(now - previous arrival) / n`: its packets spread evenly since the previous
/// arrival. Batching by the driver is therefore not reported as jitter; variation of the
/// arrivals' spacing is.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FlowCounters {
    packets: u64,
    bytes: u64,
    ctrl: u64,
    /// Previous arrival, ns (`None` before the first).
    last_ns: Option<u64>,
    gaps: u64,
    gap_sum_us: f64,
    gap_sq_us: f64,
}

impl FlowCounters {
    /// Records an arrival of `packets` packets, `bytes` bytes in all, `ctrl` of them control
    /// packets, at `now_ns`. An arrival earlier than the previous one counts as a zero gap.
    #[inline]
    pub fn record(&mut self, now_ns: u64, packets: u32, bytes: u64, ctrl: u32) {
        if packets == 0 {
            return;
        }
        let n = u64::from(packets);
        self.packets += n;
        self.bytes += bytes;
        self.ctrl += u64::from(ctrl.min(packets));
        if let Some(last) = self.last_ns {
            let gap_us = now_ns.saturating_sub(last) as f64 / 1e3 / n as f64;
            let nf = n as f64;
            self.gaps += n;
            self.gap_sum_us += nf * gap_us;
            self.gap_sq_us += nf * gap_us * gap_us;
        }
        self.last_ns = Some(now_ns);
    }

    /// Packets recorded this tick.
    pub fn packets(&self) -> u64 {
        self.packets
    }

    /// Ends the tick of length `tick`: returns its features and starts the next tick (the
    /// previous arrival is kept, so the first gap of the next tick is measured from it).
    pub fn take(&mut self, tick: Duration) -> FeatureTick {
        let secs = tick.as_secs_f64();
        let (bw_bps, pps) = if secs > 0.0 {
            (self.bytes as f64 * 8.0 / secs, self.packets as f64 / secs)
        } else {
            (0.0, 0.0)
        };
        let ctrl_ratio = if self.packets > 0 {
            self.ctrl as f64 / self.packets as f64
        } else {
            0.0
        };
        let jitter_us = if self.gaps >= 2 {
            let n = self.gaps as f64;
            let mean = self.gap_sum_us / n;
            (self.gap_sq_us / n - mean * mean).max(0.0).sqrt()
        } else {
            0.0
        };
        let last_ns = self.last_ns;
        *self = FlowCounters {
            last_ns,
            ..FlowCounters::default()
        };
        FeatureTick {
            bw_bps,
            pps,
            ctrl_ratio,
            jitter_us,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evenly_spaced_trains_report_no_jitter_and_exact_rates() {
        let mut c = FlowCounters::default();
        // 20 trains of 5 packets of 100 bytes, every 5 ms, in a 100 ms tick.
        for i in 0..20u64 {
            c.record(i * 5_000_000, 5, 500, 0);
        }
        let f = c.take(Duration::from_millis(100));
        assert_eq!(f.pps, 1000.0);
        assert_eq!(f.bw_bps, 800_000.0);
        assert_eq!(f.ctrl_ratio, 0.0);
        assert!(f.jitter_us < 1e-9, "{}", f.jitter_us);
    }

    #[test]
    fn irregular_arrivals_report_the_gap_deviation_and_control_share() {
        let mut c = FlowCounters::default();
        // Gaps of 1 ms and 3 ms alternating: mean 2 ms, standard deviation 1 ms.
        let mut t = 0;
        c.record(t, 1, 64, 1);
        for i in 0..10 {
            t += if i % 2 == 0 { 1_000_000 } else { 3_000_000 };
            c.record(t, 1, 64, 0);
        }
        let f = c.take(Duration::from_millis(100));
        assert!((f.jitter_us - 1000.0).abs() < 1e-6, "{}", f.jitter_us);
        assert!((f.ctrl_ratio - 1.0 / 11.0).abs() < 1e-12);
        assert!((f.jitter_cv() - 1000.0 * 110.0 / 1e6).abs() < 1e-9);
    }

    #[test]
    fn take_starts_a_new_tick_but_keeps_the_previous_arrival() {
        let mut c = FlowCounters::default();
        c.record(0, 1, 64, 0);
        let _ = c.take(Duration::from_millis(100));
        c.record(2_000_000, 1, 64, 0);
        c.record(4_000_000, 1, 64, 0);
        let f = c.take(Duration::from_millis(100));
        assert_eq!(f.pps, 20.0);
        assert!(f.jitter_us < 1e-9, "two 2 ms gaps: {}", f.jitter_us);
        let idle = c.take(Duration::from_millis(100));
        assert_eq!(idle, FeatureTick::default());
    }
}
