//! Parsers for the command line's numeric flags. Every numeric flag has a documented range that
//! is checked when the command line is parsed, so a bad value is a usage error naming the flag
//! (clap adds it), the value and the range, and nothing later converts an unchecked value (a
//! `NaN` second count used to panic in `Duration::from_secs_f64`).
//!
//! Integer flags use clap's ranged parsers (`value_parser!(u16).range(..)`, or [`ranged`] for
//! `usize`); flags in seconds use [`Seconds`], written once for all of them.

use std::time::Duration;

use clap::builder::{RangedU64ValueParser, TypedValueParser};
use spillway_vswitch::policy::echo;

/// A flag in seconds (`--timeout 2.5`): a finite decimal number in `min..=max`, parsed into a
/// [`Duration`].
#[derive(Clone, Copy, Debug)]
pub struct Seconds {
    /// Smallest accepted value, seconds.
    pub min: f64,
    /// Largest accepted value, seconds.
    pub max: f64,
}

impl Seconds {
    /// `spillway ctl --timeout`: 1 ms to 1 hour.
    pub const CTL_TIMEOUT: Seconds = Seconds {
        min: 0.001,
        max: 3600.0,
    };
    /// `spillway vm-endpoint --duration`: 1 ms to 30 days.
    pub const ENDPOINT_DURATION: Seconds = Seconds {
        min: 0.001,
        max: 30.0 * 86_400.0,
    };
    /// `spillway traffic gen|sink --duration`: 1 ms to 30 days.
    pub const TRAFFIC_DURATION: Seconds = Seconds::ENDPOINT_DURATION;
    /// `spillway traffic sink --idle` and `--wait`: 1 ms to 1 hour.
    pub const TRAFFIC_WAIT: Seconds = Seconds::CTL_TIMEOUT;

    /// Parses `s`; the error names the value and the range (clap prefixes the flag).
    pub fn check(self, s: &str) -> Result<Duration, String> {
        let Seconds { min, max } = self;
        let range = format!("a number of seconds in {min}..={max}");
        let v: f64 = s
            .trim()
            .parse()
            .map_err(|_| format!("expected {range}, got {}", echo(s)))?;
        // `contains` is false for NaN, and the bounds are finite, so this also rejects inf.
        if !(min..=max).contains(&v) {
            return Err(format!("expected {range}, got {}", echo(s)));
        }
        Ok(Duration::from_secs_f64(v))
    }
}

impl TypedValueParser for Seconds {
    type Value = Duration;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<Duration, clap::Error> {
        let text = value.to_str().ok_or_else(|| {
            clap::Error::raw(
                clap::error::ErrorKind::InvalidUtf8,
                "a number of seconds must be UTF-8\n",
            )
            .with_cmd(cmd)
        })?;
        self.check(text).map_err(|why| {
            let flag = arg.map_or_else(|| "value".to_string(), |a| a.to_string());
            clap::Error::raw(
                clap::error::ErrorKind::ValueValidation,
                format!("invalid value for '{flag}': {why}\n"),
            )
            .with_cmd(cmd)
        })
    }
}

/// A `usize` flag in `min..=max` (clap's ranged parsers give `u64`/`i64` types or need this
/// spelled out).
pub fn ranged(min: u64, max: u64) -> RangedU64ValueParser<usize> {
    RangedU64ValueParser::<usize>::new().range(min..=max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_rejects_nan_infinities_negative_huge_and_garbage() {
        for bad in [
            "nan", "NaN", "inf", "-inf", "1e30", "-1", "0", "", "5s", "3601",
        ] {
            let e = Seconds::CTL_TIMEOUT.check(bad).unwrap_err();
            assert!(e.contains("0.001..=3600"), "{bad}: {e}");
        }
        assert_eq!(
            Seconds::CTL_TIMEOUT.check("2.5"),
            Ok(Duration::from_millis(2500))
        );
        assert_eq!(
            Seconds::ENDPOINT_DURATION.check("0.001"),
            Ok(Duration::from_millis(1))
        );
    }

    #[test]
    fn seconds_error_does_not_echo_a_huge_value() {
        let e = Seconds::CTL_TIMEOUT
            .check(&"9".repeat(200_000))
            .unwrap_err();
        assert!(e.len() < 300, "{} bytes", e.len());
    }
}
