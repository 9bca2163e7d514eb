//! Keeping secrets out of log lines and `alert test` output. Slack webhook URLs, PagerDuty
//! routing keys, the generic webhook's URL (it often embeds a token) and the GitHub token are
//! all credentials. Destinations are named, never shown by URL, and every error text passes
//! through `redact` with the destination's secrets before it goes anywhere. A leaf, beside
//! `dburl`'s URL redaction: `config` scrubs its errors with it, `alerts` its messages.

/// The secrets one destination knows. A URL contributes itself and its path-and-query (a
/// Slack URL's secret part), so an error that prints only the path is caught as well.
#[derive(Clone, Default)]
pub struct Secrets(Vec<String>);

impl Secrets {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn with(mut self, secret: &str) -> Self {
        if !secret.is_empty() {
            self.0.push(secret.to_string());
        }
        self
    }

    pub fn with_url(mut self, url: &str) -> Self {
        self = self.with(url);
        if let Ok(u) = reqwest::Url::parse(url) {
            let mut tail = u.path().to_string();
            if let Some(q) = u.query() {
                tail.push('?');
                tail.push_str(q);
            }
            if tail.len() > 1 {
                self = self.with(&tail);
            }
            if let Some(p) = u.password() {
                self = self.with(p);
            }
        }
        self
    }

    /// `text` with every secret replaced by `[redacted]` and any other URL cut to its origin.
    pub fn redact(&self, text: &str) -> String {
        redact(text, &self.0)
    }

    /// `text` with every secret replaced by `[redacted]`, other URLs left whole: for messages
    /// that show a URL already redacted on purpose (a database URL without its password).
    pub fn replace(&self, text: &str) -> String {
        replace_secrets(text, &self.0)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Replaces each secret (longest first, so a URL that contains a key goes whole) with
/// `[redacted]`, then shortens any remaining `http(s)://…` to scheme and host: a URL we were
/// not told about may still carry a token in its path or query.
pub fn redact(text: &str, secrets: &[String]) -> String {
    strip_url_paths(&replace_secrets(text, secrets))
}

fn replace_secrets(text: &str, secrets: &[String]) -> String {
    let mut sorted: Vec<&String> = secrets.iter().filter(|s| !s.is_empty()).collect();
    sorted.sort_by_key(|s| std::cmp::Reverse(s.len()));
    let mut out = text.to_string();
    for s in sorted {
        out = out.replace(s.as_str(), "[redacted]");
    }
    out
}

fn strip_url_paths(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    loop {
        let i = match (rest.find("http://"), rest.find("https://")) {
            (Some(a), Some(b)) => a.min(b),
            (Some(i), None) | (None, Some(i)) => i,
            (None, None) => break,
        };
        out.push_str(&rest[..i]);
        let url = &rest[i..];
        let end = url
            .find(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | ')' | '>' | ','))
            .unwrap_or(url.len());
        let (url, after) = url.split_at(end);
        out.push_str(&url_origin(url));
        rest = after;
    }
    out.push_str(rest);
    out
}

/// `https://user:pw@hooks.slack.com/services/…` → `https://hooks.slack.com`.
fn url_origin(url: &str) -> String {
    let scheme_end = url.find("://").map_or(0, |i| i + 3);
    let authority = &url[scheme_end..];
    let authority = &authority[..authority.find(['/', '?', '#']).unwrap_or(authority.len())];
    let host = authority.rsplit('@').next().unwrap_or(authority);
    let mut s = format!("{}{host}", &url[..scheme_end]);
    if url.len() > scheme_end + authority.len() {
        s.push_str("/…");
    }
    s
}

/// A URL's host (and port), for naming a destination in logs: `webhook hooks.example.com`.
pub fn host_of(url: &str) -> String {
    reqwest::Url::parse(url)
        .ok()
        .and_then(|u| {
            let host = u.host_str()?.to_string();
            Some(match u.port() {
                Some(p) => format!("{host}:{p}"),
                None => host,
            })
        })
        .unwrap_or_else(|| "(invalid url)".into())
}

/// A `reqwest` error as text without its URL, with its causes (`connection refused`…).
pub fn describe_error(e: reqwest::Error) -> String {
    let kind = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "cannot connect"
    } else if e.is_decode() || e.is_body() {
        "bad response"
    } else {
        "request failed"
    };
    let e = e.without_url();
    let mut parts = vec![kind.to_string()];
    let mut source: Option<&dyn std::error::Error> = Some(&e);
    while let Some(s) = source {
        let text = s.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        source = s.source();
    }
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;

    const SLACK: &str = "https://hooks.slack.com/services/T0000/B0000/XXXXXXXXXXXXXXXXXXXXXXXX";

    #[test]
    fn secrets_never_survive() {
        let s = Secrets::new()
            .with_url(SLACK)
            .with("0123456789abcdef0123456789abcdef");
        let text = format!(
            "POST {SLACK} failed; path /services/T0000/B0000/XXXXXXXXXXXXXXXXXXXXXXXX; \
             key 0123456789abcdef0123456789abcdef"
        );
        let out = s.redact(&text);
        assert!(!out.contains("XXXXXXXX"), "{out}");
        assert!(!out.contains("0123456789abcdef"), "{out}");
        assert!(out.contains("[redacted]"), "{out}");
    }

    #[test]
    fn unknown_urls_are_cut_to_their_origin() {
        let out = redact(
            "redirected to https://u:pw@example.com/hook?token=abc, then \"http://x.io/t/123\"",
            &[],
        );
        assert_eq!(
            out,
            "redirected to https://example.com/…, then \"http://x.io/…\""
        );
        assert_eq!(
            redact("see https://example.com", &[]),
            "see https://example.com"
        );
    }

    #[test]
    fn names_are_hosts() {
        assert_eq!(
            host_of("https://hooks.example.com/x/y?z=1"),
            "hooks.example.com"
        );
        assert_eq!(host_of("http://127.0.0.1:9/x"), "127.0.0.1:9");
    }

    #[tokio::test]
    async fn client_errors_lose_their_url() {
        // Port 9 (discard) on loopback: nothing listens, the connect is refused.
        let url = "http://127.0.0.1:9/services/T1/B1/sekrit";
        let err = reqwest::Client::builder()
            .no_proxy()
            .build()
            .unwrap()
            .post(url)
            .send()
            .await
            .unwrap_err();
        assert!(err.to_string().contains("sekrit"), "reqwest shows the URL");
        let text = Secrets::new().with_url(url).redact(&describe_error(err));
        assert!(!text.contains("sekrit"), "{text}");
        assert!(text.starts_with("cannot connect"), "{text}");
    }
}
