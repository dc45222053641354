//! The Prometheus `/metrics` endpoint of a running process (an emulated DPU, a spill plane).
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
//!
//! [`MetricsServer`] serves `GET /metrics` from a background thread with a deliberately tiny
//! HTTP/1.1 implementation on `std::net`: one request per connection, `Connection: close`, a size
//! limit and one deadline for the whole request head (a client dribbling a byte at a time gets
//! no more time than one sending nothing), one deadline for the whole response, a cap on
//! concurrent connections and a smaller cap per client, so that one client holding idle
//! connections cannot take every slot. A client is the local user owning the connecting socket
//! for a loopback peer (asked from the kernel with `NETLINK_SOCK_DIAG`: a local user cannot
//! pass for another, and cannot evade the cap by connecting from 127.0.0.2, 127.0.0.3, ...), and
//! the source address otherwise. It refuses to listen on a non-loopback address unless
//! [`MetricsConfig::allow_remote`] is set, because the endpoint has no authentication. Shutting it
//! down (or dropping it) wakes every thread through a pipe and joins them, so nothing outlives the
//! server.
//!
//! ```no_run
//! use spillway_rt::ops::metrics::{MetricsServer, Sample, Snapshot};
//!
//! let snapshot = Snapshot::new("dpu");
//! let mut publisher = snapshot.publisher();
//! let server = MetricsServer::bind("127.0.0.1:9464".parse().unwrap(), snapshot).unwrap();
//! // In the data-plane loop, every ~100 ms:
//! let hw_packets = 42;
//! publisher.publish(|out| out.push(Sample::counter("dpu.hw.packets", hw_packets)));
//! # drop(server);
//! ```

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::fmt::{self, Write as _};
use std::io::{self, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::OwnedFd;
use std::thread::JoinHandle;

use crate::ops::service::{Readiness, ServiceThread, StopWatch};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, TryLockError};
use std::time::{Duration, Instant};

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

    fn from_arc(source: Arc<dyn MetricsSource>) -> Self {
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

// ---------------------------------------------------------------------------------------------
// HTTP server
// ---------------------------------------------------------------------------------------------

/// Errors starting the metrics endpoint.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// The address is not loopback and remote scrapes were not allowed.
    #[error(
        "metrics endpoint {addr} is not a loopback address; the endpoint has no authentication, \
         so serving other hosts needs allow_remote"
    )]
    NotLoopback {
        /// The refused address.
        addr: SocketAddr,
    },
    /// Binding the listening socket failed (port in use, permission).
    #[error("cannot listen for metrics scrapes on {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// The OS error.
        source: io::Error,
    },
    /// Creating the wake-up pipe or the server thread failed.
    #[error("cannot start the metrics server thread: {source}")]
    Start {
        /// The OS error.
        source: io::Error,
    },
}

impl From<MetricsError> for io::Error {
    fn from(e: MetricsError) -> Self {
        let kind = match &e {
            MetricsError::NotLoopback { .. } => io::ErrorKind::PermissionDenied,
            MetricsError::Bind { source, .. } | MetricsError::Start { source } => source.kind(),
        };
        io::Error::new(kind, e)
    }
}

/// Settings of a [`MetricsServer`]. Every resource the server uses has a limit here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetricsConfig {
    /// Where to listen; port 0 picks a free port (see [`MetricsServer::local_addr`]).
    pub addr: SocketAddr,
    /// Allow a non-loopback `addr`. Off by default: the endpoint is unauthenticated.
    pub allow_remote: bool,
    /// Connections served at once; further ones get `503` and are closed.
    pub connections_max: usize,
    /// Connections served at once for one client (a local user for a loopback peer, else a
    /// source address); further ones from that client get `503` and are closed. Below
    /// `connections_max`, so one client cannot deny the endpoint to the others.
    pub connections_per_client_max: usize,
    /// Longest accepted request head (request line and headers), in bytes; longer gets `431`.
    pub request_head_max: usize,
    /// Time a client has, in total, to send its request head; then it gets `408`.
    pub head_timeout: Duration,
    /// Time the whole response may take to write; then the connection is closed.
    pub write_timeout: Duration,
}

impl MetricsConfig {
    /// Defaults for `addr`: loopback only, 16 connections of which 4 per client, 8 KiB heads
    /// sent within 2 s, responses written within 5 s.
    pub fn new(addr: SocketAddr) -> Self {
        MetricsConfig {
            addr,
            allow_remote: false,
            connections_max: 16,
            connections_per_client_max: 4,
            request_head_max: 8 * 1024,
            head_timeout: Duration::from_secs(2),
            write_timeout: Duration::from_secs(5),
        }
    }
}

/// A running `/metrics` endpoint. Dropping it stops and joins its threads.
#[derive(Debug)]
pub struct MetricsServer {
    local_addr: SocketAddr,
    service: ServiceThread,
}

impl MetricsServer {
    /// Serves `source` on `addr` (loopback only) with default limits.
    pub fn bind(addr: SocketAddr, source: impl MetricsSource) -> Result<Self, MetricsError> {
        Self::bind_with(MetricsConfig::new(addr), source)
    }

    /// Serves `source` with explicit settings.
    pub fn bind_with(
        config: MetricsConfig,
        source: impl MetricsSource,
    ) -> Result<Self, MetricsError> {
        let addr = config.addr;
        if !addr.ip().is_loopback() && !config.allow_remote {
            return Err(MetricsError::NotLoopback { addr });
        }
        let bind_error = |source| MetricsError::Bind { addr, source };
        let listener = TcpListener::bind(addr).map_err(bind_error)?;
        // Created here, in the listener's network namespace: sock_diag answers for sockets of
        // its own namespace only.
        let owners = SocketOwners::new();
        let local_addr = listener.local_addr().map_err(bind_error)?;
        // Nonblocking so that a connection that vanishes between poll and accept cannot block
        // the accept thread (and with it, shutdown).
        listener.set_nonblocking(true).map_err(bind_error)?;
        let counters = Arc::new(ServerCounters::default());
        let exposition = Arc::new(Exposition::from_arc(Arc::new(WithServerCounters {
            source,
            counters: Arc::clone(&counters),
        })));
        let service = ServiceThread::spawn("spillway-metrics", "metrics server", move |watch| {
            accept_loop(listener, exposition, watch, config, owners, counters)
        })
        .map_err(|source| MetricsError::Start { source })?;
        tracing::info!(%local_addr, "metrics endpoint listening");
        Ok(MetricsServer {
            local_addr,
            service,
        })
    }

    /// The address actually bound (with the real port when 0 was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Stops accepting, wakes connections in progress, and joins every thread.
    pub fn shutdown(mut self) {
        self.service.stop_and_join();
    }
}

/// The server's own counters, exposed with the source's samples.
#[derive(Debug, Default)]
struct ServerCounters {
    /// Refused because `connections_max` connections were open.
    busy: AtomicU64,
    /// Refused because the client had `connections_per_client_max` open.
    client_busy: AtomicU64,
    /// Request heads not complete within `head_timeout`.
    head_timeout: AtomicU64,
    /// Responses not written within `write_timeout`.
    write_timeout: AtomicU64,
}

/// A source plus the server's counters.
struct WithServerCounters<S> {
    source: S,
    counters: Arc<ServerCounters>,
}

impl<S: MetricsSource> MetricsSource for WithServerCounters<S> {
    fn collect(&self, out: &mut Vec<Sample>) {
        self.source.collect(out);
        let c = &self.counters;
        for (reason, n) in [
            ("busy", &c.busy),
            ("client_busy", &c.client_busy),
            ("head_timeout", &c.head_timeout),
            ("write_timeout", &c.write_timeout),
        ] {
            out.push(
                Sample::counter("metrics.refused", n.load(Ordering::Relaxed))
                    .with_help("Scrape connections the metrics endpoint refused or cut, by reason")
                    .with_label("reason", reason),
            );
        }
    }
}

/// Who is on the other end of a connection, for [`MetricsConfig::connections_per_client_max`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Client {
    /// The local user owning the peer's socket (a loopback peer).
    Uid(u32),
    /// The peer's address (a remote peer, or a loopback one whose owner was not found).
    Addr(IpAddr),
}

/// Asks the kernel who owns a local TCP socket: one `SOCK_DIAG_BY_FAMILY` request for the exact
/// 4-tuple over a `NETLINK_SOCK_DIAG` socket (no privilege needed, answered synchronously, no
/// scan of `/proc/net/tcp`). Without the socket, every client is its address.
#[derive(Debug)]
struct SocketOwners {
    socket: Option<OwnedFd>,
    seq: u32,
}

/// `SOCK_DIAG_BY_FAMILY` from `linux/sock_diag.h`.
const SOCK_DIAG_BY_FAMILY: u16 = 20;
/// `NLM_F_REQUEST` from `linux/netlink.h`.
const NLM_F_REQUEST: u16 = 1;
/// `struct nlmsghdr` (16 bytes) + `struct inet_diag_req_v2` (56 bytes).
const DIAG_REQUEST_LEN: usize = 72;
/// Offset of `idiag_uid` in a reply: `struct nlmsghdr` (16) + `struct inet_diag_msg` up to it
/// (family, state, timer, retrans: 4; `inet_diag_sockid`: 48; expires, rqueue, wqueue: 12).
const DIAG_UID_OFFSET: usize = 16 + 4 + 48 + 12;

impl SocketOwners {
    fn new() -> Self {
        let socket = rustix::net::socket_with(
            rustix::net::AddressFamily::NETLINK,
            rustix::net::SocketType::DGRAM,
            rustix::net::SocketFlags::CLOEXEC,
            Some(rustix::net::netlink::SOCK_DIAG),
        );
        if let Err(error) = &socket {
            tracing::warn!(%error, "metrics endpoint: no sock_diag socket; clients are told apart by address only");
        }
        SocketOwners {
            socket: socket.ok(),
            seq: 0,
        }
    }

    /// The client behind a connection accepted on `local` from `peer`.
    fn client(&mut self, local: SocketAddr, peer: SocketAddr) -> Client {
        if peer.ip().is_loopback()
            && let Some(uid) = self.owner(peer, local)
        {
            return Client::Uid(uid);
        }
        Client::Addr(peer.ip())
    }

    /// The uid owning the TCP socket bound to `sock` and connected to `remote`.
    fn owner(&mut self, sock: SocketAddr, remote: SocketAddr) -> Option<u32> {
        let fd = self.socket.as_ref()?;
        self.seq = self.seq.wrapping_add(1);
        let mut req = [0u8; DIAG_REQUEST_LEN];
        req[0..4].copy_from_slice(&(DIAG_REQUEST_LEN as u32).to_ne_bytes());
        req[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
        req[6..8].copy_from_slice(&NLM_F_REQUEST.to_ne_bytes());
        req[8..12].copy_from_slice(&self.seq.to_ne_bytes());
        // inet_diag_req_v2: family, protocol, no extensions, every TCP state.
        req[16] = match sock {
            SocketAddr::V4(_) => libc::AF_INET as u8,
            SocketAddr::V6(_) => libc::AF_INET6 as u8,
        };
        req[17] = libc::IPPROTO_TCP as u8;
        req[20..24].copy_from_slice(&u32::MAX.to_ne_bytes());
        // inet_diag_sockid: ports and addresses in network order, any interface, no cookie.
        req[24..26].copy_from_slice(&sock.port().to_be_bytes());
        req[26..28].copy_from_slice(&remote.port().to_be_bytes());
        let octets = |a: IpAddr| -> [u8; 16] {
            let mut out = [0u8; 16];
            match a {
                IpAddr::V4(v4) => out[..4].copy_from_slice(&v4.octets()),
                IpAddr::V6(v6) => out = v6.octets(),
            }
            out
        };
        req[28..44].copy_from_slice(&octets(sock.ip()));
        req[44..60].copy_from_slice(&octets(remote.ip()));
        req[64..72].fill(0xff); // INET_DIAG_NOCOOKIE
        rustix::net::send(fd, &req, rustix::net::SendFlags::empty()).ok()?;
        // The kernel answers within the send; a reply with another sequence number is a late
        // answer to an earlier request and is skipped.
        let mut reply = [0u8; 512];
        for _ in 0..8 {
            let (n, _) =
                rustix::net::recv(fd, &mut reply[..], rustix::net::RecvFlags::DONTWAIT).ok()?;
            let msg = reply.get(..n)?;
            let word = |at: usize| -> Option<u32> {
                Some(u32::from_ne_bytes(msg.get(at..at + 4)?.try_into().ok()?))
            };
            if word(8)? != self.seq {
                continue;
            }
            let kind = u16::from_ne_bytes(msg.get(4..6)?.try_into().ok()?);
            return if kind == SOCK_DIAG_BY_FAMILY {
                word(DIAG_UID_OFFSET)
            } else {
                None // NLMSG_ERROR: no such socket (it closed meanwhile)
            };
        }
        None
    }
}

fn accept_loop(
    listener: TcpListener,
    exposition: Arc<Exposition>,
    watch: StopWatch,
    config: MetricsConfig,
    mut owners: SocketOwners,
    counters: Arc<ServerCounters>,
) {
    let local = listener.local_addr().ok();
    let mut connections: Vec<(JoinHandle<()>, Client)> = Vec::new();
    loop {
        if !watch.wait_listener(&listener, "metrics endpoint") {
            break;
        }
        let (stream, peer) = match listener.accept() {
            Ok(accepted) => accepted,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(error) => {
                // Typically EMFILE: back off instead of spinning on a listener that stays
                // readable.
                tracing::warn!(%error, "metrics endpoint: accept failed");
                if !matches!(
                    watch.sleep_until(Instant::now() + Duration::from_millis(100)),
                    Ok(false)
                ) {
                    break;
                }
                continue;
            }
        };
        connections.retain(|(c, _)| !c.is_finished());
        let client = match local {
            Some(local) => owners.client(local, peer),
            None => Client::Addr(peer.ip()),
        };
        let same_client = connections.iter().filter(|(_, c)| *c == client).count();
        if same_client >= config.connections_per_client_max {
            tracing::debug!(%peer, ?client, "metrics endpoint: too many connections from one client");
            counters.client_busy.fetch_add(1, Ordering::Relaxed);
            reject_busy(stream, "too many concurrent scrapes from this client\n");
            continue;
        }
        if connections.len() >= config.connections_max {
            tracing::debug!(%peer, "metrics endpoint: too many connections");
            counters.busy.fetch_add(1, Ordering::Relaxed);
            reject_busy(stream, "too many concurrent scrapes\n");
            continue;
        }
        let exposition = Arc::clone(&exposition);
        let conn_watch = watch.clone();
        let conn_config = config.clone();
        let conn_counters = Arc::clone(&counters);
        let spawned = std::thread::Builder::new()
            .name("spillway-metrics-conn".into())
            .spawn(move || {
                serve_connection(
                    stream,
                    &exposition,
                    &conn_watch,
                    &conn_config,
                    &conn_counters,
                )
            });
        match spawned {
            Ok(handle) => connections.push((handle, client)),
            Err(error) => tracing::warn!(%error, "metrics endpoint: cannot spawn a thread"),
        }
    }
    for (connection, _) in connections {
        if connection.join().is_err() {
            tracing::error!("metrics connection thread panicked");
        }
    }
}

/// Answers `503` from the accept thread without ever waiting on the client, so a client opening
/// connections as fast as it can does not slow accepting for the others: the answer is written
/// only if the socket takes it at once (a fresh socket's buffer does), what the client already
/// sent is discarded (closing with unread input would send RST, which can destroy the answer
/// before the client read it), and the socket is closed.
fn reject_busy(mut stream: TcpStream, why: &str) {
    if stream.set_nonblocking(true).is_err() {
        return;
    }
    let _ = stream.write_all(&Response::text(503, why).bytes(false));
    let _ = stream.shutdown(Shutdown::Write);
    let mut sink = [0u8; 1024];
    for _ in 0..16 {
        match stream.read(&mut sink) {
            Ok(n) if n > 0 => {}
            _ => break,
        }
    }
}

/// An HTTP response about to be written.
#[derive(Debug)]
struct Response {
    status: u16,
    content_type: &'static str,
    extra_header: Option<&'static str>,
    body: String,
}

impl Response {
    fn text(status: u16, body: &str) -> Self {
        Response {
            status,
            content_type: "text/plain; charset=utf-8",
            extra_header: None,
            body: body.to_owned(),
        }
    }

    fn reason(&self) -> &'static str {
        match self.status {
            200 => "OK",
            400 => "Bad Request",
            404 => "Not Found",
            405 => "Method Not Allowed",
            408 => "Request Timeout",
            431 => "Request Header Fields Too Large",
            500 => "Internal Server Error",
            503 => "Service Unavailable",
            _ => "Unknown",
        }
    }

    /// The response as sent (head, and the body unless `head_only`).
    fn bytes(&self, head_only: bool) -> Vec<u8> {
        let mut head = String::with_capacity(160 + self.body.len());
        // Writing into a String cannot fail.
        let _ = write!(
            head,
            "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n",
            self.status,
            self.reason(),
            self.content_type,
            self.body.len()
        );
        if let Some(extra) = self.extra_header {
            head.push_str(extra);
            head.push_str("\r\n");
        }
        head.push_str("\r\n");
        if !head_only {
            head.push_str(&self.body);
        }
        head.into_bytes()
    }

    /// Writes the response, all of it by `deadline` (one deadline for the whole response, not
    /// per write: a client reading a byte at a time cannot hold the connection longer).
    fn write_to(
        &self,
        stream: &mut TcpStream,
        head_only: bool,
        deadline: Instant,
    ) -> io::Result<()> {
        let bytes = self.bytes(head_only);
        let mut rest = &bytes[..];
        while !rest.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::ErrorKind::TimedOut.into());
            }
            stream.set_write_timeout(Some(left))?;
            match stream.write(rest) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => rest = &rest[n..],
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    return Err(io::ErrorKind::TimedOut.into());
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// What reading a request head produced.
enum Head {
    /// A complete head (without the blank line).
    Complete(Vec<u8>),
    /// The client closed or the server is stopping: nothing to answer.
    Gone,
    /// An answer is due without parsing (too large, too slow).
    Reject(Response),
}

fn serve_connection(
    mut stream: TcpStream,
    exposition: &Exposition,
    watch: &StopWatch,
    config: &MetricsConfig,
    counters: &ServerCounters,
) {
    // Accepted sockets do not inherit the listener's nonblocking flag on Linux, but make sure:
    // reads are gated by poll, writes by the write timeout set before each write.
    if stream.set_nonblocking(false).is_err() {
        return;
    }
    let head = match read_head(&mut stream, watch, config) {
        Ok(Head::Complete(head)) => head,
        Ok(Head::Gone) => return,
        Ok(Head::Reject(response)) => {
            if response.status == 408 {
                counters.head_timeout.fetch_add(1, Ordering::Relaxed);
            }
            let deadline = Instant::now() + config.write_timeout;
            let _ = response.write_to(&mut stream, false, deadline);
            linger_close(stream, watch, Duration::from_millis(200));
            return;
        }
        Err(error) => {
            tracing::debug!(%error, "metrics endpoint: reading request failed");
            return;
        }
    };
    let (response, head_only) = respond(&head, exposition);
    let deadline = Instant::now() + config.write_timeout;
    if let Err(error) = response.write_to(&mut stream, head_only, deadline) {
        if error.kind() == io::ErrorKind::TimedOut {
            counters.write_timeout.fetch_add(1, Ordering::Relaxed);
        }
        tracing::debug!(%error, "metrics endpoint: writing response failed");
        return;
    }
    linger_close(stream, watch, Duration::from_millis(200));
}

/// Reads until the blank line that ends the request head, within the size limit and deadline.
fn read_head(
    stream: &mut TcpStream,
    watch: &StopWatch,
    config: &MetricsConfig,
) -> io::Result<Head> {
    let deadline = Instant::now() + config.head_timeout;
    let mut head = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    loop {
        match watch.wait_readable(&*stream, Some(deadline))? {
            Readiness::Stopped => return Ok(Head::Gone),
            Readiness::TimedOut => {
                return Ok(Head::Reject(Response::text(408, "request head too slow\n")));
            }
            Readiness::Ready => {}
        }
        // Never read past the limit (plus one byte to tell "exactly full" from "too long").
        let room = (config.request_head_max + 1 - head.len()).min(chunk.len());
        let n = match stream.read(&mut chunk[..room]) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if n == 0 {
            // EOF before the end of the head: an empty connection (health checks, port scans)
            // gets nothing; a truncated head gets 400 in case the client still reads.
            return Ok(if head.is_empty() {
                Head::Gone
            } else {
                Head::Reject(Response::text(400, "incomplete request head\n"))
            });
        }
        // Search only where a terminator could newly appear.
        let search_from = head.len().saturating_sub(3);
        head.extend_from_slice(&chunk[..n]);
        if let Some(end) = find_head_end(&head[search_from..]) {
            head.truncate(search_from + end);
            return Ok(Head::Complete(head));
        }
        if head.len() > config.request_head_max {
            return Ok(Head::Reject(Response::text(
                431,
                "request head too large\n",
            )));
        }
    }
}

/// Index of the end of the head (start of the blank line) within `bytes`: `\r\n\r\n`, or a
/// bare `\n\n` from lenient clients.
fn find_head_end(bytes: &[u8]) -> Option<usize> {
    (0..bytes.len())
        .find(|&i| bytes[i..].starts_with(b"\r\n\r\n") || bytes[i..].starts_with(b"\n\n"))
}

/// Routes a complete request head. Returns the response and whether to omit the body (`HEAD`).
fn respond(head: &[u8], exposition: &Exposition) -> (Response, bool) {
    let Some((method, target)) = parse_head(head) else {
        return (Response::text(400, "malformed request\n"), false);
    };
    let head_only = match method {
        "GET" => false,
        "HEAD" => true,
        _ => {
            let mut response = Response::text(405, "only GET and HEAD are served\n");
            response.extra_header = Some("Allow: GET, HEAD");
            return (response, false);
        }
    };
    let path = target.split_once('?').map_or(target, |(path, _query)| path);
    if path != "/metrics" {
        return (Response::text(404, "not found; try /metrics\n"), head_only);
    }
    match exposition.render() {
        Ok(body) => (
            Response {
                status: 200,
                content_type: CONTENT_TYPE,
                extra_header: None,
                body,
            },
            head_only,
        ),
        Err(fmt::Error) => (
            Response::text(500, "encoding the metrics failed\n"),
            head_only,
        ),
    }
}

/// Checks the request line (`METHOD SP /target SP HTTP/1.x`) and the header syntax; returns the
/// method and target, or `None` for anything malformed.
fn parse_head(head: &[u8]) -> Option<(&str, &str)> {
    let head = std::str::from_utf8(head).ok()?;
    let mut lines = head.split('\n').map(|l| l.strip_suffix('\r').unwrap_or(l));
    let request_line = lines.next()?;
    let mut parts = request_line.split(' ');
    let (method, target, version) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some()
        || method.is_empty()
        || !method.bytes().all(|b| b.is_ascii_uppercase())
        || !target.starts_with('/')
        || !(version == "HTTP/1.1" || version == "HTTP/1.0")
    {
        return None;
    }
    for line in lines {
        let (name, _value) = line.split_once(':')?;
        if name.is_empty()
            || name
                .bytes()
                .any(|b| b.is_ascii_whitespace() || b.is_ascii_control())
        {
            return None;
        }
    }
    Some((method, target))
}

/// Closes gracefully: send FIN, then discard what the client still sends for a short while.
/// Closing a socket with unread input makes the kernel send RST, which can destroy the response
/// before the client read it (the classic lost-400 problem).
fn linger_close(mut stream: TcpStream, watch: &StopWatch, linger: Duration) {
    if stream.shutdown(Shutdown::Write).is_err() {
        return;
    }
    let deadline = Instant::now() + linger;
    let mut sink = [0u8; 1024];
    let mut drained = 0usize;
    while drained < 64 * 1024 {
        match watch.wait_readable(&stream, Some(deadline)) {
            Ok(Readiness::Ready) => match stream.read(&mut sink) {
                Ok(0) | Err(_) => return,
                Ok(n) => drained += n,
            },
            _ => return,
        }
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
    fn request_heads_parse_strictly() {
        assert_eq!(
            parse_head(b"GET /metrics HTTP/1.1\r\nHost: x"),
            Some(("GET", "/metrics"))
        );
        assert_eq!(
            parse_head(b"GET /metrics HTTP/1.0"),
            Some(("GET", "/metrics"))
        );
        assert_eq!(parse_head(b"garbage"), None);
        assert_eq!(parse_head(b"GET metrics HTTP/1.1"), None);
        assert_eq!(parse_head(b"GET /metrics HTTP/2"), None);
        assert_eq!(parse_head(b"GET  /metrics HTTP/1.1"), None);
        assert_eq!(parse_head(b"GET /metrics HTTP/1.1\r\nno colon"), None);
        assert_eq!(parse_head(b"GET /metrics HTTP/1.1\r\nbad name: 1"), None);
        assert_eq!(parse_head(b"\xff\xfe /metrics HTTP/1.1"), None);
    }

    #[test]
    fn head_end_accepts_crlf_and_lf() {
        assert_eq!(find_head_end(b"GET / HTTP/1.1\r\n\r\n"), Some(14));
        assert_eq!(find_head_end(b"GET / HTTP/1.1\n\n"), Some(14));
        assert_eq!(find_head_end(b"GET / HTTP/1.1\r\n"), None);
    }

    #[test]
    fn help_is_escaped() {
        assert_eq!(escape_help("plain"), "plain");
        assert_eq!(escape_help("a\nb\\c\"d"), "a\\nb\\\\c\\\"d");
    }
}
