//! The agent's log lines on stderr: plain text by default, one JSON object a line with
//! `HEALTH_AGENT_LOG_FORMAT=json` (for log shippers: Vector, Fluent Bit, CloudWatch Logs), and
//! under systemd's journal each line starts with its syslog priority (`<4>` for a warning, the
//! sd-daemon(3) convention), which journald takes off and files the line under, so that
//! `journalctl -p warning` shows the agent's warnings (every line of a message of several
//! lines, since the journal files each line on its own).
//!
//! The journal is recognised as the documentation of `$JOURNAL_STREAM` says: the variable holds
//! the device and inode of the stream systemd connected, and a prefix is written only while
//! stderr is still that stream (a shell started from a unit, with stderr sent elsewhere, gets
//! none).
//!
//! Secrets are kept out where the lines are made (`crate::redact` at each call site); the JSON
//! lines pass every string field through `redact::text` once more, since a shipper indexes
//! fields one by one.

use std::{fmt, os::fd::AsFd, time::SystemTime};

use serde::Serialize;
use serde_json::{Map, Value};
use tracing::{
    field::{Field, Visit},
    Event, Level, Subscriber,
};
use tracing_subscriber::{
    fmt::{format::Writer, FmtContext, FormatEvent, FormatFields},
    registry::LookupSpan,
};

/// The variable that picks the format; the filter is `HEALTH_AGENT_LOG`.
pub const FORMAT_VAR: &str = "HEALTH_AGENT_LOG_FORMAT";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Text,
    Json,
}

impl Format {
    /// `text` (or unset, or empty) and `json`, in any case; anything else is an error that
    /// says what is allowed.
    pub fn parse(value: Option<&str>) -> Result<Self, String> {
        match value.map(str::trim) {
            None | Some("") => Ok(Self::Text),
            Some(v) if v.eq_ignore_ascii_case("text") => Ok(Self::Text),
            Some(v) if v.eq_ignore_ascii_case("json") => Ok(Self::Json),
            Some(v) => Err(format!(
                "{FORMAT_VAR}={v:?} is not a log format: use \"text\" or \"json\"; logging as text"
            )),
        }
    }
}

/// Whether `$JOURNAL_STREAM` (`"<dev>:<ino>"`, decimal) names the stream with this device and
/// inode.
pub fn names_stream(journal_stream: Option<&str>, dev: u64, ino: u64) -> bool {
    let Some((d, i)) = journal_stream.and_then(|v| v.trim().split_once(':')) else {
        return false;
    };
    d.parse() == Ok(dev) && i.parse() == Ok(ino)
}

/// Whether stderr is the journal stream systemd connected.
pub fn stderr_is_journal() -> bool {
    let Ok(var) = std::env::var("JOURNAL_STREAM") else {
        return false;
    };
    // fstat of a duplicate of fd 2: the same open file, so the same device and inode.
    let Ok(fd) = std::io::stderr().as_fd().try_clone_to_owned() else {
        return false;
    };
    let Ok(meta) = std::fs::File::from(fd).metadata() else {
        return false;
    };
    use std::os::unix::fs::MetadataExt;
    names_stream(Some(&var), meta.dev(), meta.ino())
}

/// The sd-daemon(3) prefix of a level: `<3>` error, `<4>` warning, `<6>` info, `<7>` debug.
pub fn priority(level: &Level) -> u8 {
    match *level {
        Level::ERROR => 3,
        Level::WARN => 4,
        Level::INFO => 6,
        _ => 7,
    }
}

/// The event formatter: the text or JSON line, after the priority prefix when the journal
/// reads it.
pub struct Lines {
    pub format: Format,
    pub priority: bool,
    text: tracing_subscriber::fmt::format::Format,
}

impl Lines {
    pub fn new(format: Format, priority: bool) -> Self {
        Self {
            format,
            priority,
            text: tracing_subscriber::fmt::format::Format::default(),
        }
    }
}

impl<S, N> FormatEvent<S, N> for Lines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut w: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let prefix = self.priority.then(|| priority(event.metadata().level()));
        match (self.format, prefix) {
            (Format::Text, None) => self.text.format_event(ctx, w, event),
            // The journal reads each line of a message as an entry of its own: every line
            // gets the prefix, or the second line of a warning is filed as info.
            (Format::Text, Some(p)) => {
                let mut text = String::new();
                self.text.format_event(ctx, Writer::new(&mut text), event)?;
                for line in text.split_inclusive('\n') {
                    write!(w, "<{p}>{line}")?;
                }
                Ok(())
            }
            (Format::Json, _) => {
                if let Some(p) = prefix {
                    write!(w, "<{p}>")?;
                }
                let spans: Vec<&str> = ctx
                    .event_scope()
                    .into_iter()
                    .flat_map(|scope| scope.from_root())
                    .map(|span| span.name())
                    .collect();
                writeln!(w, "{}", json_line(event, &spans, SystemTime::now()))
            }
        }
    }
}

/// One event as a JSON object: `timestamp` (RFC 3339, UTC), `level` (`ERROR` … `TRACE`),
/// `target` (the module), `message`, `fields` (the event's own key-value pairs), and `spans`
/// when it happened inside any. Records from the `log` crate (aya-log) carry their own target.
pub fn json_line(event: &Event<'_>, spans: &[&str], at: SystemTime) -> String {
    let mut v = JsonFields::default();
    event.record(&mut v);
    let meta = event.metadata();
    let line = Line {
        timestamp: crate::text::rfc3339(at),
        level: meta.level().as_str(),
        target: v.log_target.unwrap_or_else(|| meta.target().to_string()),
        message: v.message.unwrap_or_default(),
        fields: v.fields,
        spans,
    };
    serde_json::to_string(&line).unwrap_or_default()
}

/// The keys in the order a person reads them.
#[derive(Serialize)]
struct Line<'a> {
    timestamp: String,
    level: &'static str,
    target: String,
    message: String,
    fields: Map<String, Value>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    spans: &'a [&'a str],
}

/// Collects an event's fields: numbers and booleans as such, everything else as redacted text.
#[derive(Default)]
struct JsonFields {
    message: Option<String>,
    log_target: Option<String>,
    fields: Map<String, Value>,
}

impl JsonFields {
    fn text(&mut self, field: &Field, text: String) {
        let text = crate::redact::text(&text);
        match field.name() {
            "message" => self.message = Some(text),
            "log.target" => self.log_target = Some(text),
            // The `log` crate's location fields: noise in every aya-log line.
            name if name.starts_with("log.") => {}
            name => {
                self.fields.insert(name.into(), text.into());
            }
        }
    }
}

impl Visit for JsonFields {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.text(field, format!("{value:?}"));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.text(field, value.to_string());
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.fields.insert(field.name().into(), value.into());
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.fields.insert(field.name().into(), value.into());
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.fields.insert(field.name().into(), value.into());
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        // NaN and infinities have no JSON number.
        let v = serde_json::Number::from_f64(value)
            .map_or_else(|| value.to_string().into(), Value::Number);
        self.fields.insert(field.name().into(), v);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tracing_subscriber::fmt::MakeWriter;

    use super::*;

    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buffer {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Buffer {
        type Writer = Buffer;
        fn make_writer(&'a self) -> Self::Writer {
            self.clone()
        }
    }

    /// What `log` writes through a subscriber with these lines.
    fn written(format: Format, priority: bool, log: impl FnOnce()) -> String {
        let buf = Buffer::default();
        let sub = tracing_subscriber::fmt()
            .with_writer(buf.clone())
            .with_ansi(false)
            .with_max_level(Level::DEBUG)
            .event_format(Lines::new(format, priority))
            .finish();
        tracing::subscriber::with_default(sub, log);
        let out = buf.0.lock().unwrap().clone();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn the_journal_gets_each_lines_priority() {
        let out = written(Format::Text, true, || {
            tracing::error!("e");
            tracing::warn!("w");
            tracing::info!("i");
            tracing::debug!("d");
        });
        let prefixes: Vec<&str> = out.lines().map(|l| &l[..3]).collect();
        assert_eq!(prefixes, ["<3>", "<4>", "<6>", "<7>"], "{out}");
        assert!(out.lines().nth(1).unwrap().contains("WARN"), "{out}");
        let two = written(Format::Text, true, || tracing::warn!("first\nsecond"));
        let lines: Vec<&str> = two.lines().collect();
        assert_eq!(lines.len(), 2, "{two}");
        assert!(
            lines[0].starts_with("<4>") && lines[1] == "<4>second",
            "{two}"
        );
        let plain = written(Format::Text, false, || tracing::warn!("w"));
        assert!(!plain.starts_with('<') && plain.contains("WARN"), "{plain}");
    }

    #[test]
    fn json_lines_carry_level_target_message_and_fields_redacted() {
        let out = written(Format::Json, false, || {
            tracing::warn!(
                destination = %"slack",
                attempts = 3u64,
                ok = false,
                share = 0.5,
                "alert not delivered to https://hooks.slack.com/services/T0/B0/SECRETPATH"
            );
            let span = tracing::info_span!("round");
            let _in = span.enter();
            tracing::info!(url = "postgres://app:hunter2@db:5432/app", "quoted");
        });
        let lines: Vec<Value> = out
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect();
        assert_eq!(lines.len(), 2, "{out}");
        let w = &lines[0];
        assert_eq!(w["level"], "WARN");
        assert_eq!(w["target"], module_path!());
        assert_eq!(
            w["message"],
            "alert not delivered to https://hooks.slack.com/…"
        );
        assert_eq!(w["fields"]["destination"], "slack");
        assert_eq!(w["fields"]["attempts"], 3);
        assert_eq!(w["fields"]["ok"], false);
        assert_eq!(w["fields"]["share"], 0.5);
        assert!(w.get("spans").is_none());
        assert!(
            time::OffsetDateTime::parse(
                w["timestamp"].as_str().unwrap(),
                &time::format_description::well_known::Rfc3339
            )
            .is_ok(),
            "{w}"
        );
        let i = &lines[1];
        assert_eq!(i["spans"], serde_json::json!(["round"]));
        assert!(
            !out.contains("SECRETPATH") && !out.contains("hunter2"),
            "{out}"
        );
        // Under the journal, the prefix comes first and the rest is the same object.
        let j = written(Format::Json, true, || tracing::warn!("w"));
        let (prefix, rest) = j.split_at(3);
        assert_eq!(prefix, "<4>");
        assert_eq!(serde_json::from_str::<Value>(rest).unwrap()["message"], "w");
    }

    #[test]
    fn formats_and_journal_streams_parse() {
        assert_eq!(Format::parse(None), Ok(Format::Text));
        assert_eq!(Format::parse(Some(" JSON ")), Ok(Format::Json));
        assert_eq!(Format::parse(Some("text")), Ok(Format::Text));
        let e = Format::parse(Some("xml")).unwrap_err();
        assert!(e.contains("\"text\" or \"json\""), "{e}");
        assert!(names_stream(Some("8:12345"), 8, 12345));
        assert!(!names_stream(Some("8:12345"), 8, 12346));
        assert!(!names_stream(Some("garbage"), 8, 12345));
        assert!(!names_stream(None, 8, 12345));
    }
}
