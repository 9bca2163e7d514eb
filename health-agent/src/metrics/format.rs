//! The two exposition formats `/metrics` speaks, chosen by the client's `Accept` header:
//! Prometheus' text format 0.0.4 by default (what every scraper reads), OpenMetrics 1.0.0 when
//! the client prefers it (Prometheus itself asks for it first).
//!
//! The registry encodes OpenMetrics; the text format differs from it only in what is written
//! here: a counter's family is named with its `_total` (OpenMetrics names the family without
//! it and only the sample with it), and there is no `# EOF` or `# UNIT`.

pub const TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Text,
    OpenMetrics,
}

impl Format {
    /// The format an `Accept` header prefers: OpenMetrics 1.0.0 when its quality is above the
    /// text format's, the text format otherwise (also without the header, or when it names
    /// neither).
    pub fn negotiate(accept: Option<&str>) -> Self {
        let (mut om, mut text) = (0.0_f64, 0.0_f64);
        for range in accept.unwrap_or("").split(',') {
            let mut parts = range.split(';').map(str::trim);
            let media = parts.next().unwrap_or("").to_ascii_lowercase();
            let (mut q, mut version) = (1.0, None);
            for p in parts {
                if let Some((k, v)) = p.split_once('=') {
                    match k.trim().to_ascii_lowercase().as_str() {
                        "q" => q = v.trim().parse().unwrap_or(0.0),
                        "version" => version = Some(v.trim().to_string()),
                        _ => {}
                    }
                }
            }
            match media.as_str() {
                "application/openmetrics-text"
                    if version.as_deref().is_none_or(|v| v == "1.0.0") =>
                {
                    om = om.max(q)
                }
                "text/plain" | "*/*" | "text/*" => text = text.max(q),
                _ => {}
            }
        }
        if om > 0.0 && om > text {
            Self::OpenMetrics
        } else {
            Self::Text
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Self::Text => TEXT,
            Self::OpenMetrics => OPENMETRICS,
        }
    }
}

/// OpenMetrics text (as the registry encodes it) in the text format 0.0.4.
pub fn to_text(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len());
    let mut help: Option<&str> = None;
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            if let Some(h) = help.replace(rest) {
                push_line(&mut out, &format!("# HELP {h}"));
            }
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, "untyped"));
            let name = if kind == "counter" && !name.ends_with("_total") {
                format!("{name}_total")
            } else {
                name.to_string()
            };
            if let Some(h) = help.take() {
                let text = h.split_once(' ').map_or("", |(_, t)| t);
                push_line(&mut out, &format!("# HELP {name} {text}"));
            }
            push_line(&mut out, &format!("# TYPE {name} {kind}"));
            continue;
        }
        if let Some(h) = help.take() {
            push_line(&mut out, &format!("# HELP {h}"));
        }
        push_line(&mut out, line);
    }
    out
}

fn push_line(out: &mut String, line: &str) {
    out.push_str(line);
    out.push('\n');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prometheus_asks_for_openmetrics_and_gets_it() {
        let prometheus = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;\
                          version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert_eq!(Format::negotiate(Some(prometheus)), Format::OpenMetrics);
        for accept in [
            None,
            Some(""),
            Some("*/*"),
            Some("text/plain;version=0.0.4"),
            Some("text/plain, application/openmetrics-text;q=0.5"),
            Some("application/openmetrics-text;version=0.0.1"),
            Some("application/json"),
        ] {
            assert_eq!(Format::negotiate(accept), Format::Text, "{accept:?}");
        }
        assert_eq!(
            Format::negotiate(Some("Application/OpenMetrics-Text")),
            Format::OpenMetrics
        );
    }

    #[test]
    fn counters_are_named_with_total_and_eof_goes() {
        let om = "# HELP x_requests Requests.\n# TYPE x_requests counter\nx_requests_total 3\n\
                  # HELP x_up Up.\n# TYPE x_up gauge\nx_up 1.0\n# EOF\n";
        assert_eq!(
            to_text(om),
            "# HELP x_requests_total Requests.\n# TYPE x_requests_total counter\n\
             x_requests_total 3\n# HELP x_up Up.\n# TYPE x_up gauge\nx_up 1.0\n"
        );
    }
}
