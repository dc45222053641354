//! The Prometheus exposition behind [`crate::ops::metrics`]: what a process reports
//! ([`Sample`]s from a [`MetricsSource`]), the [`Snapshot`] a data-plane loop publishes them
//! through, how dotted names become exposed ones, and the OpenMetrics text a scrape gets. The
//! HTTP server that serves it is `ops::metrics`; every public item here is re-exported there,
//! which is the path to use.
//!
//! The data plane keeps its counters as plain `(dotted.name, u64)` pairs in its own state, so the
//! per-packet path never touches an atomic, a lock or this module. About every 100 ms the
//! data-plane loop copies them into a [`Snapshot`] through its [`SnapshotPublisher`]; a scrape
//! reads the last snapshot. The loop therefore never waits for an HTTP client, and a scrape never
//! waits for the loop: publishing uses `try_lock` and simply skips a tick if a scrape is copying the
//! snapshot at that instant.
//!
//! Encoding goes through `prometheus-client`'s OpenMetrics text encoder. Instead of registering one
//! atomic per counter, a custom [`Collector`] asks a [`MetricsSource`] for [`Sample`]s at scrape
//! time and encodes them as metric families. Names map as `dpu.hw.packets` (counter) ->
//! `spillway_dpu_hw_packets_total`: the registry adds the `spillway` prefix, dots become
//! underscores, and the encoder adds `_total` to counters ([`exposed_name`] computes it).

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError, TryLockError};
use std::time::Instant;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

/// The prefix every exposed metric name starts with (followed by `_`).
pub const PREFIX: &str = "spillway";

/// The `Content-Type` of a scrape response: OpenMetrics text 1.0.0, which is what
/// `prometheus-client`'s text encoder writes (including the closing `# EOF`).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

// ---------------------------------------------------------------------------------------------
// Samples
// ---------------------------------------------------------------------------------------------

/// What a sample measures, which decides its OpenMetrics type and suffix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SampleKind {
    /// A monotonically increasing count since process start; exposed with the `_total` suffix.
    Counter,
    /// A value that goes up and down (table occupancy, a phase indicator).
    Gauge,
}

impl SampleKind {
    fn metric_type(self) -> MetricType {
        match self {
            SampleKind::Counter => MetricType::Counter,
            SampleKind::Gauge => MetricType::Gauge,
        }
    }
}

/// A sample's value. Integers stay integers so that 64-bit counters keep full precision (an
/// `f64` loses exactness above 2^53).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum SampleValue {
    /// An unsigned integer: counters and most gauges.
    U64(u64),
    /// A signed integer gauge.
    I64(i64),
    /// A floating-point value (ratios, seconds).
    F64(f64),
}

impl From<u64> for SampleValue {
    fn from(v: u64) -> Self {
        SampleValue::U64(v)
    }
}

impl From<u32> for SampleValue {
    fn from(v: u32) -> Self {
        SampleValue::U64(u64::from(v))
    }
}

impl From<usize> for SampleValue {
    fn from(v: usize) -> Self {
        // usize is at most 64 bits on every target this crate builds for (it is Linux-only).
        SampleValue::U64(v as u64)
    }
}

impl From<i64> for SampleValue {
    fn from(v: i64) -> Self {
        SampleValue::I64(v)
    }
}

impl From<f64> for SampleValue {
    fn from(v: f64) -> Self {
        SampleValue::F64(v)
    }
}

/// One labelled value of one metric, as a process reports it at scrape time.
///
/// Names are the project's dotted lowercase metric names (`dpu.hw.packets`); they and the labels
/// are `Cow<'static, str>` so that the data plane can publish its fixed names without
/// allocating.
///
/// What the encoder does with samples it cannot expose as given, so that a scrape is always
/// valid OpenMetrics: samples are grouped into families by exposed name and sorted; a family's
/// type is its first reported sample's kind and samples of the other kind are left out; of two
/// samples of one series (same name and labels) the first reported wins; a repeated label key
/// keeps its first value; negative counters and NaN or infinite values are left out.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// Dotted metric name, e.g. `spill.redirect.new_conn`. Exposed as [`exposed_name`] says.
    pub name: Cow<'static, str>,
    /// One-line description for `# HELP`; may be empty (then the dotted name is used). The first
    /// non-empty help of a family wins.
    pub help: Cow<'static, str>,
    /// Counter or gauge.
    pub kind: SampleKind,
    /// Label pairs `(key, value)`; keys are sanitised to `[a-zA-Z_][a-zA-Z0-9_]*`, values escaped.
    pub labels: Vec<(Cow<'static, str>, Cow<'static, str>)>,
    /// The value.
    pub value: SampleValue,
}

impl Sample {
    /// A counter sample without help or labels.
    pub fn counter(name: impl Into<Cow<'static, str>>, value: u64) -> Self {
        Sample {
            name: name.into(),
            help: Cow::Borrowed(""),
            kind: SampleKind::Counter,
            labels: Vec::new(),
            value: SampleValue::U64(value),
        }
    }

    /// A gauge sample without help or labels.
    pub fn gauge(name: impl Into<Cow<'static, str>>, value: impl Into<SampleValue>) -> Self {
        Sample {
            name: name.into(),
            help: Cow::Borrowed(""),
            kind: SampleKind::Gauge,
            labels: Vec::new(),
            value: value.into(),
        }
    }

    /// Sets the `# HELP` text.
    #[must_use]
    pub fn with_help(mut self, help: impl Into<Cow<'static, str>>) -> Self {
        self.help = help.into();
        self
    }

    /// Adds one label.
    #[must_use]
    pub fn with_label(
        mut self,
        key: impl Into<Cow<'static, str>>,
        value: impl Into<Cow<'static, str>>,
    ) -> Self {
        self.labels.push((key.into(), value.into()));
        self
    }

    /// A state set as gauges, the Prometheus convention for an enum such as `fabric.phase`: one
    /// sample per state, labelled `key="state"`, valued 1 for `current` and 0 for the others.
    /// (`prometheus-client` 0.26 has no StateSet type, and gauges are what Prometheus stores
    /// state sets as anyway.)
    pub fn state_set<'a>(
        name: &'static str,
        key: &'static str,
        states: &'a [&'static str],
        current: &'a str,
    ) -> impl Iterator<Item = Sample> + 'a {
        states.iter().map(move |&state| {
            Sample::gauge(name, u64::from(state == current)).with_label(key, state)
        })
    }
}

/// Something that reports samples on every scrape.
///
/// Implemented by [`Snapshot`] (the usual source), by closures `Fn(&mut Vec<Sample>)`, and by
/// vectors of sources (concatenated in order). `collect` runs on the HTTP thread and must not
/// block on the data plane.
pub trait MetricsSource: Send + Sync + 'static {
    /// Appends the current samples to `out`.
    fn collect(&self, out: &mut Vec<Sample>);
}

impl<F> MetricsSource for F
where
    F: Fn(&mut Vec<Sample>) + Send + Sync + 'static,
{
    fn collect(&self, out: &mut Vec<Sample>) {
        self(out)
    }
}

impl<S: MetricsSource> MetricsSource for Vec<S> {
    fn collect(&self, out: &mut Vec<Sample>) {
        for source in self {
            source.collect(out);
        }
    }
}

impl MetricsSource for Box<dyn MetricsSource> {
    fn collect(&self, out: &mut Vec<Sample>) {
        self.as_ref().collect(out)
    }
}

// ---------------------------------------------------------------------------------------------
// Snapshot
// ---------------------------------------------------------------------------------------------

/// The last set of samples a data-plane loop published; the read side, handed to the server.
///
/// Cloning is cheap (an `Arc`). Besides the published samples, a scrape reports
/// `metrics.snapshot.age_seconds` and `metrics.snapshot.published` labelled `origin`, so a
/// stalled data-plane loop shows up as a growing age rather than as silently frozen counters.
#[derive(Clone, Debug)]
pub struct Snapshot {
    shared: Arc<SnapshotShared>,
}

#[derive(Debug)]
struct SnapshotShared {
    origin: &'static str,
    state: Mutex<Published>,
}

#[derive(Debug, Default)]
struct Published {
    samples: Vec<Sample>,
    at: Option<Instant>,
    count: u64,
}

impl Snapshot {
    /// An empty snapshot. `origin` names the publishing loop (`"dpu"`, `"spill"`) in the
    /// snapshot's own metrics, so several snapshots can share one server.
    pub fn new(origin: &'static str) -> Self {
        Snapshot {
            shared: Arc::new(SnapshotShared {
                origin,
                state: Mutex::new(Published::default()),
            }),
        }
    }

    /// The write side for the data-plane loop. Use one publisher per snapshot: each publish
    /// replaces the whole sample set, so two publishers would overwrite each other.
    pub fn publisher(&self) -> SnapshotPublisher {
        SnapshotPublisher {
            shared: Arc::clone(&self.shared),
            spare: Vec::new(),
            skipped: 0,
        }
    }
}

impl MetricsSource for Snapshot {
    fn collect(&self, out: &mut Vec<Sample>) {
        let shared = &self.shared;
        // A panic while holding this lock cannot leave the sample vector half-updated in a way
        // that matters (it is replaced wholesale), so a poisoned lock is still usable.
        let state = shared.state.lock().unwrap_or_else(PoisonError::into_inner);
        out.extend(state.samples.iter().cloned());
        let (at, count) = (state.at, state.count);
        drop(state);
        if let Some(at) = at {
            out.push(
                Sample::gauge("metrics.snapshot.age_seconds", at.elapsed().as_secs_f64())
                    .with_help("Seconds since the loop last published its metrics snapshot")
                    .with_label("origin", shared.origin),
            );
        }
        out.push(
            Sample::counter("metrics.snapshot.published", count)
                .with_help("Metrics snapshots the loop has published")
                .with_label("origin", shared.origin),
        );
    }
}

/// The write side of a [`Snapshot`], owned by the data-plane loop.
///
/// It keeps a spare buffer and swaps it with the published one, so after the first two publishes
/// nothing allocates (as long as samples use static names and no owned labels).
#[derive(Debug)]
pub struct SnapshotPublisher {
    shared: Arc<SnapshotShared>,
    spare: Vec<Sample>,
    skipped: u64,
}

impl SnapshotPublisher {
    /// Clears a buffer, lets `fill` write the current samples into it, and makes it the
    /// published snapshot. Never blocks: if a scrape is copying the snapshot right now, this
    /// publish is skipped and `false` returned; the next tick publishes fresher data anyway.
    pub fn publish(&mut self, fill: impl FnOnce(&mut Vec<Sample>)) -> bool {
        self.spare.clear();
        fill(&mut self.spare);
        let mut state = match self.shared.state.try_lock() {
            Ok(guard) => guard,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => {
                self.skipped += 1;
                return false;
            }
        };
        std::mem::swap(&mut state.samples, &mut self.spare);
        state.at = Some(Instant::now());
        state.count += 1;
        true
    }

    /// Publishes skipped because a scrape held the snapshot at that moment.
    pub fn skipped(&self) -> u64 {
        self.skipped
    }
}

// ---------------------------------------------------------------------------------------------
// Encoding
// ---------------------------------------------------------------------------------------------

/// The full exposed sample name of a dotted metric name: `spillway_` + the name with every
/// character outside `[a-zA-Z0-9_:]` replaced by `_`, plus `_total` for counters (a counter
/// name that already ends in `.total`/`_total` does not get it twice).
pub fn exposed_name(dotted: &str, kind: SampleKind) -> String {
    let family = family_name(dotted, kind);
    match kind {
        SampleKind::Counter => format!("{PREFIX}_{family}_total"),
        SampleKind::Gauge => format!("{PREFIX}_{family}"),
    }
}

/// The family name without prefix: what the encoder's descriptor takes.
fn family_name(dotted: &str, kind: SampleKind) -> String {
    let mut name: String = dotted
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == ':' {
                c
            } else {
                '_'
            }
        })
        .collect();
    // The OpenMetrics text encoder appends `_total` itself; strip a user-written one so that
    // `x.total` does not become `x_total_total`.
    if kind == SampleKind::Counter && name.len() > "_total".len() && name.ends_with("_total") {
        name.truncate(name.len() - "_total".len());
    }
    name
}

/// A label key valid in OpenMetrics: `[a-zA-Z_][a-zA-Z0-9_]*`.
fn label_key(key: &str) -> Cow<'_, str> {
    let valid_first = key
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    let valid_rest = key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if valid_first && valid_rest {
        return Cow::Borrowed(key);
    }
    let mut out = String::with_capacity(key.len() + 1);
    if !valid_first {
        out.push('_');
    }
    out.extend(key.chars().map(|c| {
        if c.is_ascii_alphanumeric() || c == '_' {
            c
        } else {
            '_'
        }
    }));
    Cow::Owned(out)
}

/// `# HELP` text escaped as OpenMetrics requires (`\\`, `\n`, `\"`); the encoder writes it raw.
fn escape_help(help: &str) -> Cow<'_, str> {
    if !help.contains(['\\', '\n', '"']) {
        return Cow::Borrowed(help);
    }
    let mut out = String::with_capacity(help.len() + 8);
    for c in help.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '"' => out.push_str("\\\""),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// A sample with its names mapped and its value checked, ready to sort into families.
struct Prepared {
    /// The dotted name as reported, the `# HELP` text when no help was given.
    name: Cow<'static, str>,
    family: String,
    kind: SampleKind,
    help: Cow<'static, str>,
    labels: Vec<(String, String)>,
    value: SampleValue,
    /// Position in the source's report: among conflicting samples, the first reported wins.
    index: usize,
}

impl Prepared {
    /// `None` for a sample OpenMetrics cannot express: a negative counter (a reporting bug,
    /// better left out than shown as some other number) or a NaN or infinite value (the encoder
    /// would spell those `NaN`/`inf` rather than OpenMetrics' `+Inf`).
    fn new(index: usize, sample: Sample) -> Option<Self> {
        let expressible = match (sample.kind, sample.value) {
            (_, SampleValue::F64(v)) if !v.is_finite() => false,
            (SampleKind::Counter, SampleValue::I64(v)) => v >= 0,
            (SampleKind::Counter, SampleValue::F64(v)) => v >= 0.0,
            (SampleKind::Counter | SampleKind::Gauge, _) => true,
        };
        if !expressible {
            return None;
        }
        let mut labels: Vec<(String, String)> = sample
            .labels
            .iter()
            .map(|(k, v)| (label_key(k).into_owned(), v.to_string()))
            .collect();
        // One value per label name (the first), in name order, so that a series reported with
        // its labels in another order is still recognised as the same series.
        labels.sort_by(|a, b| a.0.cmp(&b.0));
        labels.dedup_by(|later, earlier| later.0 == earlier.0);
        Some(Prepared {
            family: family_name(&sample.name, sample.kind),
            name: sample.name,
            kind: sample.kind,
            help: sample.help,
            labels,
            value: sample.value,
            index,
        })
    }
}

/// The `Collector` that turns a [`MetricsSource`]'s samples into metric families at scrape time.
struct SampleCollector {
    source: Arc<dyn MetricsSource>,
}

impl fmt::Debug for SampleCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SampleCollector").finish_non_exhaustive()
    }
}

impl Collector for SampleCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        let mut samples = Vec::new();
        self.source.collect(&mut samples);
        let mut prepared: Vec<Prepared> = samples
            .into_iter()
            .enumerate()
            .filter_map(|(index, sample)| Prepared::new(index, sample))
            .collect();
        // OpenMetrics wants each family's samples contiguous under one descriptor and no series
        // twice. Sorting by (family, labels, report index) groups the families, puts duplicates
        // next to each other with the first reported in front, and makes the output independent
        // of the order in which the sources happened to report.
        prepared
            .sort_by(|a, b| (&a.family, &a.labels, a.index).cmp(&(&b.family, &b.labels, b.index)));
        let families: Vec<(&[Prepared], SampleKind)> = prepared
            .chunk_by(|a, b| a.family == b.family)
            .map(|family| {
                // A family has one type: the first reported sample's. Samples of the other kind
                // under the same name cannot be expressed and are left out below.
                let first = family
                    .iter()
                    .min_by_key(|p| p.index)
                    .expect("chunk_by yields non-empty chunks");
                (family, first.kind)
            })
            .collect();
        // Counter family `x` exposes the sample name `x_total`; a gauge family literally named
        // `x_total` would repeat it, so it is left out.
        let counter_samples: BTreeSet<String> = families
            .iter()
            .filter(|(_, kind)| *kind == SampleKind::Counter)
            .map(|(family, _)| format!("{}_total", family[0].family))
            .collect();

        for (family, kind) in families {
            let name = &family[0].family;
            if kind == SampleKind::Gauge && counter_samples.contains(name) {
                continue;
            }
            // The first help given; without one, the dotted name, which ties the exposed name
            // back to where the metric is documented.
            let same_kind = || family.iter().filter(|p| p.kind == kind);
            let help = same_kind()
                .filter(|p| !p.help.is_empty())
                .min_by_key(|p| p.index)
                .or_else(|| same_kind().min_by_key(|p| p.index))
                .map_or("", |p| if p.help.is_empty() { &p.name } else { &p.help });
            let help = escape_help(help);
            let mut metric = encoder.encode_descriptor(name, &help, None, kind.metric_type())?;
            let mut previous_labels: Option<&Vec<(String, String)>> = None;
            for p in family.iter().filter(|p| p.kind == kind) {
                if previous_labels == Some(&p.labels) {
                    continue;
                }
                previous_labels = Some(&p.labels);
                let mut series = metric.encode_family(&p.labels)?;
                match (kind, p.value) {
                    (SampleKind::Counter, SampleValue::U64(v)) => {
                        series.encode_counter::<NoLabelSet, _, f64>(&v, None)?
                    }
                    (SampleKind::Counter, SampleValue::I64(v)) => {
                        let v = u64::try_from(v).expect("Prepared::new drops negative counters");
                        series.encode_counter::<NoLabelSet, _, f64>(&v, None)?
                    }
                    (SampleKind::Counter, SampleValue::F64(v)) => {
                        series.encode_counter::<NoLabelSet, _, f64>(&v, None)?
                    }
                    (SampleKind::Gauge, SampleValue::U64(v)) => series.encode_gauge(&v)?,
                    (SampleKind::Gauge, SampleValue::I64(v)) => series.encode_gauge(&v)?,
                    (SampleKind::Gauge, SampleValue::F64(v)) => series.encode_gauge(&v)?,
                }
            }
        }
        Ok(())
    }
}

/// A `prometheus-client` registry (prefix `spillway`) wrapping one [`MetricsSource`]: renders
/// the complete OpenMetrics text exposition on demand. The server uses it per scrape; a `ctl
/// metrics` command can use it too.
#[derive(Debug)]
pub struct Exposition {
    registry: Registry,
}

impl Exposition {
    /// Wraps `source` in a registry with a scrape-time collector.
    pub fn new(source: impl MetricsSource) -> Self {
        Self::from_arc(Arc::new(source))
    }

    pub(super) fn from_arc(source: Arc<dyn MetricsSource>) -> Self {
        let mut registry = Registry::with_prefix(PREFIX);
        registry.register_collector(Box::new(SampleCollector { source }));
        Exposition { registry }
    }

    /// The exposition text, ending in `# EOF`. Fails only if a collector fails to format, which
    /// the built-in one does not do; the error is kept rather than hidden behind a panic.
    pub fn render(&self) -> Result<String, fmt::Error> {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)?;
        Ok(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposed_name_maps_dots_prefix_and_total() {
        assert_eq!(
            exposed_name("dpu.hw.packets", SampleKind::Counter),
            "spillway_dpu_hw_packets_total"
        );
        assert_eq!(
            exposed_name("dpu.hw.entries", SampleKind::Gauge),
            "spillway_dpu_hw_entries"
        );
        assert_eq!(
            exposed_name("x.total", SampleKind::Counter),
            "spillway_x_total"
        );
        assert_eq!(exposed_name("a-b c", SampleKind::Gauge), "spillway_a_b_c");
    }

    #[test]
    fn label_keys_are_sanitised() {
        assert_eq!(label_key("reason"), "reason");
        assert_eq!(label_key("9lives"), "_9lives");
        assert_eq!(label_key("a.b"), "a_b");
        assert_eq!(label_key(""), "_");
    }
    #[test]
    fn help_is_escaped() {
        assert_eq!(escape_help("plain"), "plain");
        assert_eq!(escape_help("a\nb\\c\"d"), "a\\nb\\\\c\\\"d");
    }
}
