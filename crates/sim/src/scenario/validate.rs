//! What makes a scenario valid: every range the simulator relies on, the bounds that keep a
//! run's work finite (durations within the horizon, periodic timers not too fine, flow totals,
//! the estimated events within `work_max`), and each flow shape's own fields.
//!
//! It is a module of its own because it is the half of the scenario code that changes with
//! every new field, while the types beside it change only with the format. A failed check is a
//! [`ScenarioError::Invalid`] naming the file, the field, what was expected and what was given.

use core::time::Duration;

use super::{
    Dur, FLOWS_TOTAL_MAX, FlowGroup, HORIZON_MAX, SENSITIVITY_PARAMS, Scenario, ScenarioError,
    Shape, WORK_MAX_DEFAULT, WORK_MAX_LIMIT,
};

impl Scenario {
    /// Checks ranges the simulator relies on.
    pub fn validate(&self, file: &str) -> Result<(), ScenarioError> {
        let bad = |field: String, expected: &str, actual: String| ScenarioError::Invalid {
            file: file.to_string(),
            field,
            expected: expected.to_string(),
            actual,
        };
        self.fabric
            .validate()
            .map_err(|e| bad(format!("fabric.{}", e.field), e.expected, e.actual))?;
        if self.duration.ns() == 0 || self.duration.0 > Duration::from_secs(3600) {
            return Err(bad(
                "duration".into(),
                "between 1ns and 1h",
                format!("{:?}", self.duration.0),
            ));
        }
        if self.measure[0] >= self.measure[1] || self.measure[1] > self.duration {
            return Err(bad(
                "measure".into(),
                "[from, to] with from < to <= duration",
                format!("[{:?}, {:?}]", self.measure[0].0, self.measure[1].0),
            ));
        }
        if self.sample.ns() < 100_000 {
            return Err(bad(
                "sample".into(),
                "at least 100us",
                format!("{:?}", self.sample.0),
            ));
        }
        if self.train.ns() < 10_000 || self.train > self.sample {
            return Err(bad(
                "train".into(),
                "between 10us and `sample`",
                format!("{:?}", self.train.0),
            ));
        }
        for (i, g) in self.flows.iter().enumerate() {
            if g.count == 0 || g.count > 10_000_000 {
                return Err(bad(
                    format!("flows[{i}].count"),
                    "1..=10000000",
                    g.count.to_string(),
                ));
            }
            if !(g.pps.is_finite() && g.pps > 0.0 && g.pps <= 1e8) {
                return Err(bad(
                    format!("flows[{i}].pps"),
                    "a rate in (0, 1e8]",
                    g.pps.to_string(),
                ));
            }
            if g.tenants == 0 {
                return Err(bad(format!("flows[{i}].tenants"), "at least 1", "0".into()));
            }
            if g.lifetime.ns() == 0 {
                return Err(bad(
                    format!("flows[{i}].lifetime"),
                    "a positive duration",
                    "0".into(),
                ));
            }
            if !(0.0..=1.0).contains(&g.jitter) {
                return Err(bad(
                    format!("flows[{i}].jitter"),
                    "0..=1",
                    g.jitter.to_string(),
                ));
            }
            if (g.on.ns() == 0) != (g.off.ns() == 0) {
                return Err(bad(
                    format!("flows[{i}].on"),
                    "on and off both set or both zero",
                    format!("on {:?}, off {:?}", g.on.0, g.off.0),
                ));
            }
            validate_shape(g, i, &bad)?;
            if g.bytes < 60 || g.bytes > 9216 {
                return Err(bad(
                    format!("flows[{i}].bytes"),
                    "60..=9216",
                    g.bytes.to_string(),
                ));
            }
        }
        for (i, c) in self.cps.iter().enumerate() {
            for (name, v) in [("rate_from", c.rate_from), ("rate_to", c.rate_to)] {
                if !(v.is_finite() && (0.0..=1e8).contains(&v)) {
                    return Err(bad(
                        format!("cps[{i}].{name}"),
                        "a rate in [0, 1e8]",
                        v.to_string(),
                    ));
                }
            }
            if c.end <= c.start {
                return Err(bad(
                    format!("cps[{i}].end"),
                    "after start",
                    format!("{:?}", c.end.0),
                ));
            }
            if c.tenants == 0 {
                return Err(bad(format!("cps[{i}].tenants"), "at least 1", "0".into()));
            }
            if !(0.0..=1.0).contains(&c.denied_fraction) {
                return Err(bad(
                    format!("cps[{i}].denied_fraction"),
                    "0..=1",
                    c.denied_fraction.to_string(),
                ));
            }
        }
        for (i, f) in self.faults.iter().enumerate() {
            if !(0.0..=1.0).contains(&f.probability) {
                return Err(bad(
                    format!("faults[{i}].probability"),
                    "0..=1",
                    f.probability.to_string(),
                ));
            }
        }
        if let Some(c) = &self.compare {
            if c.policies.is_empty() {
                return Err(bad(
                    "compare.policies".into(),
                    "at least one policy",
                    "none".into(),
                ));
            }
            for (i, p) in c.policies.iter().enumerate() {
                if c.policies[..i].contains(p) {
                    return Err(bad(
                        format!("compare.policies[{i}]"),
                        "each policy once",
                        format!("{:?} twice", p.name()),
                    ));
                }
            }
            if self.sweep.is_some() {
                return Err(bad(
                    "compare".into(),
                    "either a sweep or a comparison, not both",
                    "both".into(),
                ));
            }
        }
        if let Some(v) = &self.vatc {
            if self.sweep.is_some() || self.compare.is_some() {
                return Err(bad(
                    "vatc".into(),
                    "a vATC comparison alone, without a sweep or a placement comparison",
                    "both".into(),
                ));
            }
            if !(v.latency_load.is_finite() && v.latency_load > 0.0 && v.latency_load <= 1.0) {
                return Err(bad(
                    "vatc.latency_load".into(),
                    "a fraction in (0, 1]",
                    v.latency_load.to_string(),
                ));
            }
            if !(v.factor.is_finite() && v.factor > 1.0 && v.factor <= 100.0) {
                return Err(bad(
                    "vatc.factor".into(),
                    "a factor in (1, 100]",
                    v.factor.to_string(),
                ));
            }
            for (i, name) in v.sensitivity.iter().enumerate() {
                if !SENSITIVITY_PARAMS.contains(&name.as_str()) {
                    return Err(bad(
                        format!("vatc.sensitivity[{i}]"),
                        &format!("one of {}", SENSITIVITY_PARAMS.join(", ")),
                        format!("{name:?}"),
                    ));
                }
                if v.sensitivity[..i].contains(name) {
                    return Err(bad(
                        format!("vatc.sensitivity[{i}]"),
                        "each parameter once",
                        format!("{name:?} twice"),
                    ));
                }
            }
        }
        if let Some(sw) = &self.sweep {
            for (i, w) in sw.workers.iter().enumerate() {
                if *w > 1024 {
                    return Err(bad(
                        format!("sweep.workers[{i}]"),
                        "0..=1024",
                        w.to_string(),
                    ));
                }
            }
            if !(sw.low > 0.0 && sw.low < sw.high && sw.high <= 1e8) {
                return Err(bad(
                    "sweep.low".into(),
                    "0 < low < high <= 1e8",
                    format!("{} .. {}", sw.low, sw.high),
                ));
            }
            if sw.iterations == 0 || sw.iterations > 20 {
                return Err(bad(
                    "sweep.iterations".into(),
                    "1..=20",
                    sw.iterations.to_string(),
                ));
            }
            if sw.trial.ns() == 0 || sw.warmup.ns() == 0 {
                return Err(bad(
                    "sweep.trial".into(),
                    "positive warmup and trial",
                    format!("{:?} {:?}", sw.warmup.0, sw.trial.0),
                ));
            }
            if self.cps.is_empty() {
                return Err(bad(
                    "sweep".into(),
                    "a [[cps]] group giving the connections' shape",
                    "none".into(),
                ));
            }
            if !(sw.warmup_rate.is_finite() && (0.0..=1e8).contains(&sw.warmup_rate)) {
                return Err(bad(
                    "sweep.warmup_rate".into(),
                    "a rate in [0, 1e8]",
                    sw.warmup_rate.to_string(),
                ));
            }
            for (name, d) in [
                ("sweep.warmup", sw.warmup),
                ("sweep.ramp", sw.ramp),
                ("sweep.trial", sw.trial),
            ] {
                within_horizon(name.to_string(), d, &bad)?;
            }
        }
        self.validate_limits(&bad)?;
        self.validate_work(&bad)
    }

    /// The ranges of the fields the checks above leave open: every duration within
    /// [`HORIZON_MAX`], the fabric timers the scenario sets, tenant ranges that fit a `u32`,
    /// the total of flows.
    fn validate_limits(
        &self,
        bad: &dyn Fn(String, &str, String) -> ScenarioError,
    ) -> Result<(), ScenarioError> {
        // The sample period is a periodic timer: each tick is simulated work, so a nanosecond
        // period turns a 30 ms run into tens of millions of events. The fabric's timers
        // (heartbeat, decision windows) are bounded once, by `FabricParams::validate`.
        let host = &self.fabric.host;
        if !(TIMER_MIN..=TIMER_MAX).contains(&self.sample.0) {
            return Err(bad(
                "sample".into(),
                "between 100us and 10s",
                format!("{:?}", self.sample.0),
            ));
        }
        let tenants_fit = |tenant: u32, tenants: u32| tenant.checked_add(tenants - 1).is_some();
        let mut flows_total = 0u64;
        for (i, g) in self.flows.iter().enumerate() {
            flows_total += u64::from(g.count);
            if !tenants_fit(g.tenant, g.tenants) {
                return Err(bad(
                    format!("flows[{i}].tenants"),
                    "tenant + tenants - 1 <= 4294967295",
                    format!("tenant {} + tenants {}", g.tenant, g.tenants),
                ));
            }
            let durations = [
                ("start", Some(g.start)),
                ("spread", Some(g.spread)),
                ("lifetime", Some(g.lifetime)),
                ("on", Some(g.on)),
                ("off", Some(g.off)),
                ("gap", Some(g.gap)),
                ("period", g.period),
                ("step", g.step),
            ];
            for (name, d) in durations {
                if let Some(d) = d {
                    within_horizon(format!("flows[{i}].{name}"), d, bad)?;
                }
            }
        }
        if flows_total > FLOWS_TOTAL_MAX {
            return Err(bad(
                "flows[*].count".into(),
                &format!(
                    "at most {FLOWS_TOTAL_MAX} flows over all [[flows]] groups (each is state held for the whole run; split the scenario)"
                ),
                flows_total.to_string(),
            ));
        }
        for (i, c) in self.cps.iter().enumerate() {
            if !tenants_fit(c.tenant, c.tenants) {
                return Err(bad(
                    format!("cps[{i}].tenants"),
                    "tenant + tenants - 1 <= 4294967295",
                    format!("tenant {} + tenants {}", c.tenant, c.tenants),
                ));
            }
            for (name, d) in [("start", c.start), ("end", c.end), ("gap", c.gap)] {
                within_horizon(format!("cps[{i}].{name}"), d, bad)?;
            }
        }
        for (i, h) in self.host_load.iter().enumerate() {
            within_horizon(format!("host_load[{i}].at"), h.at, bad)?;
            if h.tenant_cores > host.cores {
                return Err(bad(
                    format!("host_load[{i}].tenant_cores"),
                    &format!("at most fabric.host.cores ({})", host.cores),
                    h.tenant_cores.to_string(),
                ));
            }
        }
        for (i, f) in self.faults.iter().enumerate() {
            within_horizon(format!("faults[{i}].at"), f.at, bad)?;
            within_horizon(format!("faults[{i}].duration"), f.duration, bad)?;
        }
        Ok(())
    }

    /// The whole run's estimated work ([`Scenario::work`]) within `work_max`; for a sweep, one
    /// trial at the highest rate searched.
    fn validate_work(
        &self,
        bad: &dyn Fn(String, &str, String) -> ScenarioError,
    ) -> Result<(), ScenarioError> {
        let max = self.work_max.unwrap_or(WORK_MAX_DEFAULT);
        if !(max.is_finite() && (1.0..=WORK_MAX_LIMIT).contains(&max)) {
            return Err(bad(
                "work_max".into(),
                &format!("a number of events in [1, {WORK_MAX_LIMIT:e}]"),
                max.to_string(),
            ));
        }
        let (what, work) = match &self.sweep {
            Some(sw) => (
                "one sweep trial at sweep.high",
                crate::sweep_trial(self, 0, sw.high).work(),
            ),
            None => ("one run", self.work()),
        };
        if work.total > max {
            let (field, part) = &work.largest;
            return Err(bad(
                "work_max".into(),
                &format!(
                    "{what} within {max:.3e} estimated events (most from {field}: {part:.3e}); shorten duration, lower counts or rates, lengthen train or the timer periods, split the scenario into several, or set work_max (up to {WORK_MAX_LIMIT:e}) to run it anyway"
                ),
                format!("{:.3e} estimated events", work.total),
            ));
        }
        Ok(())
    }
}

/// Shortest sample period a scenario may give.
const TIMER_MIN: Duration = Duration::from_micros(100);
/// Longest such period.
const TIMER_MAX: Duration = Duration::from_secs(10);

/// `d` (the value of `field`) is at most [`HORIZON_MAX`].
fn within_horizon(
    field: String,
    d: Dur,
    bad: &dyn Fn(String, &str, String) -> ScenarioError,
) -> Result<(), ScenarioError> {
    if d.0 > HORIZON_MAX {
        return Err(bad(field, "at most 1h", format!("{:?}", d.0)));
    }
    Ok(())
}

/// The shape-specific fields of flow group `i`: each shape's own fields present and in range,
/// no field of another shape.
fn validate_shape(
    g: &FlowGroup,
    i: usize,
    bad: &dyn Fn(String, &str, String) -> ScenarioError,
) -> Result<(), ScenarioError> {
    let shape = g.shape.name();
    let only = |field: &str, owner: &str| {
        bad(
            format!("flows[{i}].{field}"),
            &format!("no {field} for shape {shape} (it belongs to shape {owner})"),
            "a value".into(),
        )
    };
    let periodic = g.shape == Shape::Periodic;
    let walk = g.shape == Shape::RandomWalk;
    if !periodic && g.period.is_some() {
        return Err(only("period", "periodic"));
    }
    if !periodic && g.amplitude.is_some() {
        return Err(only("amplitude", "periodic"));
    }
    if !walk && g.volatility.is_some() {
        return Err(only("volatility", "random-walk"));
    }
    if !walk && g.step.is_some() {
        return Err(only("step", "random-walk"));
    }
    let on_off = g.on.ns() != 0 || g.off.ns() != 0;
    match g.shape {
        Shape::Steady => {}
        Shape::Periodic => {
            let period = g.period.map_or(0, Dur::ns);
            if period < 1_000_000 {
                return Err(bad(
                    format!("flows[{i}].period"),
                    "a period of at least 1ms for shape periodic",
                    g.period.map_or("none".into(), |d| format!("{:?}", d.0)),
                ));
            }
            match g.amplitude {
                Some(a) if (0.0..=1.0).contains(&a) => {}
                a => {
                    return Err(bad(
                        format!("flows[{i}].amplitude"),
                        "0..=1 for shape periodic",
                        a.map_or("none".into(), |a| a.to_string()),
                    ));
                }
            }
        }
        Shape::Bursty => {
            if g.on.ns() == 0 || g.off.ns() == 0 {
                return Err(bad(
                    format!("flows[{i}].on"),
                    "positive mean on and off times for shape bursty",
                    format!("on {:?}, off {:?}", g.on.0, g.off.0),
                ));
            }
        }
        Shape::RandomWalk => {
            match g.volatility {
                Some(v) if (0.0..=2.0).contains(&v) => {}
                v => {
                    return Err(bad(
                        format!("flows[{i}].volatility"),
                        "0..=2 for shape random-walk",
                        v.map_or("none".into(), |v| v.to_string()),
                    ));
                }
            }
            if let Some(st) = g.step
                && st.ns() < 1_000_000
            {
                return Err(bad(
                    format!("flows[{i}].step"),
                    "at least 1ms",
                    format!("{:?}", st.0),
                ));
            }
        }
    }
    if on_off && matches!(g.shape, Shape::Periodic | Shape::RandomWalk) {
        return Err(bad(
            format!("flows[{i}].on"),
            &format!("no on/off for shape {shape} (steady or bursty only)"),
            format!("on {:?}, off {:?}", g.on.0, g.off.0),
        ));
    }
    Ok(())
}
