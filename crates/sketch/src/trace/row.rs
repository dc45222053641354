//! The row types every trace job shares: one flow's features in one tick ([`TraceRow`]), the
//! label of a generated flow ([`FlowClass`]) and the two together ([`LabelledRow`]). They sit
//! in their own file so that reading, ranking, generating and evaluating can all use them
//! without depending on one another.

use core::fmt;
use core::str::FromStr;

use crate::classifier::FlowId;
use crate::features::FeatureTick;

/// Length of a tick, seconds.
pub const TICK_S: f64 = 0.1;

/// One flow's features in one tick.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TraceRow {
    /// The flow.
    pub flow_id: FlowId,
    /// The tick (100 ms each).
    pub tick: u64,
    /// Its features in that tick.
    pub features: FeatureTick,
}

/// The behaviour a generated flow follows (its label).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FlowClass {
    /// Constant rate with small noise.
    Steady,
    /// Sinusoidal modulation of the rate.
    Periodic,
    /// On/off.
    Bursty,
    /// Log-rate random walk.
    RandomWalk,
    /// Short-lived.
    Mice,
}

impl FlowClass {
    /// Every class, in label order.
    pub const ALL: [FlowClass; 5] = [
        FlowClass::Steady,
        FlowClass::Periodic,
        FlowClass::Bursty,
        FlowClass::RandomWalk,
        FlowClass::Mice,
    ];

    /// The label as written in a trace.
    pub fn name(self) -> &'static str {
        match self {
            FlowClass::Steady => "steady",
            FlowClass::Periodic => "periodic",
            FlowClass::Bursty => "bursty",
            FlowClass::RandomWalk => "random-walk",
            FlowClass::Mice => "mice",
        }
    }

    /// True for the classes that deserve a hardware entry (steady, periodic).
    pub fn is_stable(self) -> bool {
        match self {
            FlowClass::Steady | FlowClass::Periodic => true,
            FlowClass::Bursty | FlowClass::RandomWalk | FlowClass::Mice => false,
        }
    }

    /// Index in [`FlowClass::ALL`].
    pub fn index(self) -> usize {
        match self {
            FlowClass::Steady => 0,
            FlowClass::Periodic => 1,
            FlowClass::Bursty => 2,
            FlowClass::RandomWalk => 3,
            FlowClass::Mice => 4,
        }
    }
}

impl fmt::Display for FlowClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for FlowClass {
    type Err = ();

    fn from_str(s: &str) -> Result<FlowClass, ()> {
        FlowClass::ALL.into_iter().find(|c| c.name() == s).ok_or(())
    }
}

/// A generated row with its flow's label.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LabelledRow {
    /// The row.
    pub row: TraceRow,
    /// The flow's class.
    pub class: FlowClass,
}
