//! Structured logging setup for the real-time processes.
//!
//! Everything logs through `tracing`; this module installs the one global subscriber: a
//! `tracing-subscriber` fmt layer writing to stderr (stdout stays free for command output such as
//! `spillway ctl status` JSON), filtered by [`filter::Targets`]: the chosen level for the
//! project's own targets (every target starting with `spillway`, which covers `spillway_rt::ops::ctl`
//! and the `spillway` binary) and `warn` for dependencies. `Targets` is used instead of
//! `EnvFilter` because the latter needs the `env-filter` feature and its regex build; `Targets`
//! still parses directive strings such as `spillway_rt::ops::ctl=trace,info` (see
//! [`LogConfig::directives`]).
//!
//! Two formats: [`LogFormat::Text`], tracing's usual human-readable lines (coloured only when
//! stderr is a terminal), and [`LogFormat::Logfmt`], one `key=value` line per event for machines
//! (`ts=... level=info target=spillway_rt::ops::ctl msg="control socket listening" path=/run/x`).
//! JSON output would need tracing-subscriber's `json` feature and serde glue, which logfmt avoids
//! while staying trivially parseable.
//!
//! Setup is idempotent: a second [`init`] (tests, a library caller) leaves the first subscriber in
//! place and reports [`LogInit::AlreadyInstalled`] instead of panicking.

use std::fmt;
use std::io::IsTerminal;

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::filter::{self, LevelFilter, Targets};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;

/// The target prefix that gets the configured level; everything else gets `warn`.
pub const PROJECT_TARGET: &str = "spillway";

/// How log lines look.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// tracing-subscriber's default human-readable format.
    #[default]
    Text,
    /// One logfmt (`key=value`) line per event, for log shippers and `grep`.
    Logfmt,
}

/// Settings for [`init_with`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogConfig {
    /// Level for `spillway*` targets.
    pub level: Level,
    /// Output format.
    pub format: LogFormat,
    /// Extra `Targets` directives layered over the defaults, e.g.
    /// `spillway_rt::shm::ring=trace,hyper=info`. A bare level (`debug`) sets the default for other
    /// targets.
    pub directives: Option<String>,
}

impl LogConfig {
    /// `level` for the project, `warn` for the rest, no extra directives.
    pub fn new(level: Level, format: LogFormat) -> Self {
        LogConfig {
            level,
            format,
            directives: None,
        }
    }
}

/// Whether [`init`] installed the subscriber.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogInit {
    /// This call installed it.
    Installed,
    /// A global subscriber was already set (by an earlier call or by someone else); it stays.
    AlreadyInstalled,
}

/// Errors setting up logging.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// The directive string did not parse.
    #[error("invalid log directives {directives:?}: {source}")]
    Directives {
        /// The string given.
        directives: String,
        /// Why it did not parse.
        source: filter::ParseError,
    },
}

/// Installs the global subscriber: `level` for `spillway*` targets, `warn` for others, stderr.
pub fn init(level: Level, format: LogFormat) -> LogInit {
    match init_with(&LogConfig::new(level, format)) {
        Ok(outcome) => outcome,
        Err(LogError::Directives { .. }) => {
            unreachable!("LogConfig::new has no directives, so none can fail to parse")
        }
    }
}

/// Installs the global subscriber from a full configuration.
pub fn init_with(config: &LogConfig) -> Result<LogInit, LogError> {
    let targets = targets(config)?;
    let installed = match config.format {
        LogFormat::Text => {
            let layer = tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(std::io::stderr().is_terminal());
            tracing_subscriber::registry()
                .with(layer)
                .with(targets)
                .try_init()
        }
        LogFormat::Logfmt => {
            let layer = tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(false)
                .event_format(Logfmt);
            tracing_subscriber::registry()
                .with(layer)
                .with(targets)
                .try_init()
        }
    };
    Ok(match installed {
        Ok(()) => LogInit::Installed,
        Err(_already_set) => LogInit::AlreadyInstalled,
    })
}

/// The filter [`init_with`] installs: `warn` by default, `config.level` for `spillway*`, then
/// `config.directives` on top (a later directive for the same target wins).
pub fn targets(config: &LogConfig) -> Result<Targets, LogError> {
    let mut targets = Targets::new()
        .with_default(LevelFilter::WARN)
        .with_target(PROJECT_TARGET, config.level);
    if let Some(directives) = &config.directives {
        let extra: Targets = directives.parse().map_err(|source| LogError::Directives {
            directives: directives.clone(),
            source,
        })?;
        if let Some(default) = extra.default_level() {
            targets = targets.with_default(default);
        }
        targets = targets.with_targets(extra);
    }
    Ok(targets)
}

/// The logfmt event format: `ts=<RFC 3339> level=<lowercase> target=<target>
/// [span=<outer>.<inner> <span fields>] msg="..." <field>=<value>...`.
///
/// Values are written bare when they contain only characters that need no quoting, and as a
/// quoted, escaped string otherwise (Rust's `{:?}` escaping for strings, which is what logfmt
/// parsers accept).
#[derive(Clone, Copy, Debug, Default)]
pub struct Logfmt;

impl<S, N> FormatEvent<S, N> for Logfmt
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        writer.write_str("ts=")?;
        SystemTime.format_time(&mut writer)?;
        let level = match *meta.level() {
            Level::ERROR => "error",
            Level::WARN => "warn",
            Level::INFO => "info",
            Level::DEBUG => "debug",
            Level::TRACE => "trace",
        };
        write!(writer, " level={level} target=")?;
        write_value(&mut writer, meta.target())?;
        if let Some(scope) = ctx.event_scope() {
            let mut span_fields = String::new();
            writer.write_str(" span=")?;
            for (i, span) in scope.from_root().enumerate() {
                if i > 0 {
                    writer.write_char('.')?;
                }
                writer.write_str(span.name())?;
                // Span fields were formatted by the layer's field formatter when the span was
                // created; append them as they are.
                let extensions = span.extensions();
                if let Some(fields) = extensions.get::<FormattedFields<N>>()
                    && !fields.is_empty()
                {
                    span_fields.push(' ');
                    span_fields.push_str(fields);
                }
            }
            writer.write_str(&span_fields)?;
        }
        let mut visitor = LogfmtVisitor {
            writer: &mut writer,
            result: Ok(()),
        };
        event.record(&mut visitor);
        visitor.result?;
        writeln!(writer)
    }
}

/// Writes each event field as ` key=value`, renaming `message` to `msg`.
struct LogfmtVisitor<'w, 'a> {
    writer: &'w mut Writer<'a>,
    result: fmt::Result,
}

impl LogfmtVisitor<'_, '_> {
    fn key(&mut self, field: &Field) -> fmt::Result {
        let name = match field.name() {
            "message" => "msg",
            name => name,
        };
        write!(self.writer, " {name}=")
    }
}

impl Visit for LogfmtVisitor<'_, '_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if self.result.is_ok() {
            self.result = self
                .key(field)
                .and_then(|()| write_value(self.writer, value));
        }
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        if self.result.is_ok() {
            self.result = self
                .key(field)
                .and_then(|()| write!(self.writer, "{value}"));
        }
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        if self.result.is_ok() {
            self.result = self
                .key(field)
                .and_then(|()| write!(self.writer, "{value}"));
        }
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        if self.result.is_ok() {
            self.result = self
                .key(field)
                .and_then(|()| write!(self.writer, "{value}"));
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if self.result.is_ok() {
            // Logging is off the data path; formatting into a String first is what lets the
            // value be quoted only when needed.
            let text = format!("{value:?}");
            self.result = self
                .key(field)
                .and_then(|()| write_value(self.writer, &text));
        }
    }
}

/// Writes `value` bare if it is non-empty and contains no space, `=`, quote, backslash or
/// control character; quoted and escaped otherwise.
fn write_value(writer: &mut impl fmt::Write, value: &str) -> fmt::Result {
    let bare = !value.is_empty()
        && value
            .chars()
            .all(|c| !c.is_whitespace() && !c.is_control() && !matches!(c, '=' | '"' | '\\'));
    if bare {
        writer.write_str(value)
    } else {
        write!(writer, "{value:?}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use tracing_subscriber::fmt::MakeWriter;

    /// A writer that appends to a shared buffer, to capture formatted output.
    #[derive(Clone, Debug, Default)]
    struct Capture(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Capture {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Capture {
        type Writer = Capture;
        fn make_writer(&'a self) -> Self::Writer {
            self.clone()
        }
    }

    fn captured(config: &LogConfig, emit: impl FnOnce()) -> String {
        let capture = Capture::default();
        let layer = tracing_subscriber::fmt::layer()
            .with_writer(capture.clone())
            .with_ansi(false)
            .event_format(Logfmt);
        let subscriber = tracing_subscriber::registry()
            .with(layer)
            .with(targets(config).unwrap());
        tracing::subscriber::with_default(subscriber, emit);
        String::from_utf8(capture.0.lock().unwrap().clone()).unwrap()
    }

    #[test]
    fn logfmt_writes_keys_values_and_quotes_only_when_needed() {
        let config = LogConfig::new(Level::INFO, LogFormat::Logfmt);
        let out = captured(&config, || {
            let span = tracing::info_span!(target: "spillway_rt::ops::ctl", "conn", peer = 7);
            let _guard = span.enter();
            tracing::info!(
                target: "spillway_rt::ops::ctl",
                path = "/run/s.sock",
                n = 3u64,
                neg = -2i64,
                ok = true,
                note = "two words",
                "socket up"
            );
        });
        assert!(out.starts_with("ts="), "{out}");
        assert!(
            out.contains(" level=info target=spillway_rt::ops::ctl"),
            "{out}"
        );
        assert!(out.contains(" span=conn peer=7"), "{out}");
        assert!(out.contains(r#" msg="socket up""#), "{out}");
        assert!(out.contains(" path=/run/s.sock"), "{out}");
        assert!(out.contains(" n=3 neg=-2 ok=true"), "{out}");
        assert!(out.contains(r#" note="two words""#), "{out}");
        assert!(out.ends_with('\n'));
        assert_eq!(out.lines().count(), 1);
    }

    #[test]
    fn targets_keep_project_level_and_warn_for_others() {
        let config = LogConfig::new(Level::DEBUG, LogFormat::Logfmt);
        let out = captured(&config, || {
            tracing::debug!(target: "spillway_fabric::dpu", "kept");
            tracing::info!(target: "some_dependency", "dropped");
            tracing::warn!(target: "some_dependency", "kept warning");
            tracing::trace!(target: "spillway", "dropped trace");
        });
        assert!(out.contains(r#"msg=kept"#), "{out}");
        assert!(out.contains(r#"msg="kept warning""#), "{out}");
        assert!(!out.contains("dropped"), "{out}");
    }

    #[test]
    fn directives_override_defaults() {
        let mut config = LogConfig::new(Level::INFO, LogFormat::Logfmt);
        config.directives = Some("spillway_rt::shm::ring=trace,error".into());
        let out = captured(&config, || {
            tracing::trace!(target: "spillway_rt::shm::ring", "ring trace");
            tracing::debug!(target: "spillway_rt::ops::ctl", "ctl debug");
            tracing::warn!(target: "other", "other warn");
            tracing::error!(target: "other", "other error");
        });
        assert!(out.contains("ring trace"), "{out}");
        assert!(!out.contains("ctl debug"), "{out}");
        assert!(!out.contains("other warn"), "{out}");
        assert!(out.contains("other error"), "{out}");

        config.directives = Some("spillway=loud".into());
        assert!(matches!(targets(&config), Err(LogError::Directives { .. })));
    }

    #[test]
    fn init_twice_does_not_panic() {
        let first = init(Level::INFO, LogFormat::Text);
        let second = init(Level::DEBUG, LogFormat::Logfmt);
        // Another test binary thread may have installed one first; either way the second call
        // must report the existing subscriber.
        assert!(matches!(
            first,
            LogInit::Installed | LogInit::AlreadyInstalled
        ));
        assert_eq!(second, LogInit::AlreadyInstalled);
    }

    #[test]
    fn values_are_quoted_when_needed() {
        let mut s = String::new();
        write_value(&mut s, "plain").unwrap();
        s.push(' ');
        write_value(&mut s, "").unwrap();
        s.push(' ');
        write_value(&mut s, "a=b").unwrap();
        s.push(' ');
        write_value(&mut s, "say \"hi\"\n").unwrap();
        assert_eq!(s, r#"plain "" "a=b" "say \"hi\"\n""#);
    }
}
