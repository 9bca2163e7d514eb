//! Keeping secrets out of everything the agent prints: log lines, `/health`, `check`, alerts
//! and incident issues. Secrets are removed where they sit, never searched for by value.
//!
//! Searching every message for a secret's value and masking it reveals the secret the moment it
//! is short or common: a password `e` masked in "password authentication failed" leaves
//! `pass***word auth***ntication`, and tells the reader both that there is a password and what
//! it is. So nothing here knows a secret's value. The places a secret can sit are known:
//! - a URL's userinfo and its `password=` parameter, and the path and query of an alert
//!   destination's URL (a Slack webhook's path is its credential): every URL in a message is
//!   shown without them ([`text`]);
//! - the config keys that hold one: named, never shown (`config::secrets`);
//! - request headers and bodies (a token, a routing key): never printed;
//! - a reply to a request that carried one: a receiver or a server may quote what it was sent,
//!   so a reply is shown only in the shapes its service documents ([`reply`]), and a database
//!   server's answer to the command that carried the password only by its error code.
//!
//! A leaf beside `dburl`, whose `redact_url` it applies to every URL.

use crate::dburl::redact_urls_in;

/// `text` fit to show: every `scheme://…` in it without its password (userinfo, `password=`),
/// and every `http(s)://` URL cut to its origin, since an alert destination keeps its
/// credential in the path or query (`https://hooks.slack.com/…`).
pub fn text(text: &str) -> String {
    strip_url_paths(&redact_urls_in(text))
}

/// What a receiver (Slack, PagerDuty, GitHub, a webhook) answered, fit to show: only the shapes
/// those services document, because a reply may quote the request, and the request carried the
/// secret (the URL's path, a routing key in the body, a token). Slack answers one error code
/// (`invalid_payload`, `no_service`); PagerDuty and GitHub a JSON object whose `status`,
/// `message` or `error` say in words what went wrong ("Bad credentials"). A field is shown only
/// when it is such words: letters and punctuation, no digit, path, `=` or `@`, so that a
/// credential it might quote (Slack's path, a routing key, a token: service-issued, with
/// digits) is never among them; PagerDuty's `errors` list, which quotes fields, is left out.
/// Anything else is described by its size, never quoted.
pub fn reply(body: &[u8]) -> String {
    const LIMIT: usize = 200;
    let raw = String::from_utf8_lossy(body);
    let trimmed = raw.trim();
    if trimmed.is_empty() {
        return String::new();
    }
    if is_error_code(trimmed) {
        return trimmed.to_string();
    }
    if let Ok(serde_json::Value::Object(fields)) = serde_json::from_str(trimmed) {
        let said: Vec<String> = ["status", "message", "error"]
            .into_iter()
            .filter_map(|k| fields.get(k)?.as_str().map(|v| (k, v.trim())))
            .filter(|(_, v)| is_words(v))
            .map(|(k, v)| format!("{k}: {v}"))
            .collect();
        if !said.is_empty() {
            return crate::text::truncate(&said.join("; "), LIMIT);
        }
    }
    format!(
        "a {}-byte reply (not shown: a reply may quote the request)",
        body.len()
    )
}

/// One token of lower-case letters and `_`: Slack's answers (`invalid_token`).
fn is_error_code(s: &str) -> bool {
    s.len() <= 64 && s.chars().all(|c| c.is_ascii_lowercase() || c == '_')
}

/// Plain words: letters, spaces and sentence punctuation, at most 120 characters.
fn is_words(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 120
        && s.chars().all(|c| {
            c.is_alphabetic() || matches!(c, ' ' | '.' | ',' | ';' | ':' | '!' | '\'' | '-')
        })
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

/// `https://user:pw@hooks.slack.com/services/…` → `https://hooks.slack.com/…`.
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
    text(&parts.join(": "))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SLACK: &str = "https://hooks.slack.com/services/T0000/B0000/XXXXXXXXXXXXXXXXXXXXXXXX";

    /// Secrets of every kind the issue names: one letter, two and three characters, a digit, a
    /// common word, a word of the message itself, the user name, non-ASCII, and random ones.
    fn secrets(rng: &mut fastrand::Rng) -> Vec<String> {
        let mut out: Vec<String> = [
            "e",
            "a",
            "7",
            "ab",
            "xyz",
            "password",
            "app",
            "user",
            "for",
            "pässwörd",
            "秘密",
            "p@ss/w?rd#1",
            "%41",
            "http",
            "Error",
            ":",
        ]
        .map(String::from)
        .to_vec();
        for _ in 0..40 {
            let len = rng.usize(1..24);
            out.push(
                (0..len)
                    .map(|_| {
                        let c = rng.u32(0x21..0x7f);
                        char::from_u32(if rng.u8(..) < 20 {
                            rng.u32(0xa1..0x3000)
                        } else {
                            c
                        })
                        .unwrap_or('x')
                    })
                    .collect(),
            );
        }
        out
    }

    /// A password as it sits in a URL's userinfo or query: percent-encoded.
    fn encoded(secret: &str) -> String {
        percent_encoding::utf8_percent_encode(secret, percent_encoding::NON_ALPHANUMERIC)
            .to_string()
    }

    /// Messages with the secret where secrets sit (a database URL's userinfo and `password=`,
    /// an alert URL's path and query), amid free text that may contain it by chance.
    fn messages(secret: &str, words: &str) -> Vec<String> {
        let e = encoded(secret);
        vec![
            format!("connect postgres://app:{e}@db.internal:5432/app: {words}"),
            format!("{words} redis://default:{e}@127.0.0.1:6379/0 refused"),
            format!("mysql://app@db:3306/app?password={e}&ssl-mode=REQUIRED {words}"),
            format!("POST https://hooks.slack.com/services/T0/B0/{e} failed: {words}"),
            format!("{words}: https://hooks.example.com/in?token={e}"),
            format!("\"postgresql://app:{e}@[::1]:5432/app\" {words}"),
        ]
    }

    /// The heart of it: whatever the secret, the text shown is the same. No secret can be read
    /// back from it, however short or common, because nothing shown depends on it; and no
    /// masked pattern appears, since nothing is masked.
    #[test]
    fn what_is_shown_never_depends_on_the_secret() {
        let mut rng = fastrand::Rng::with_seed(0x5ec7e7);
        let secrets = secrets(&mut rng);
        let free = [
            "FATAL: password authentication failed for user \"app\"",
            "e a 7 ab xyz password app user for pässwörd 秘密 Error",
            "",
        ];
        for words in free {
            let reference = messages("reference-secret", words)
                .iter()
                .map(|m| text(m))
                .collect::<Vec<_>>();
            for secret in &secrets {
                for (i, m) in messages(secret, words).iter().enumerate() {
                    let shown = text(m);
                    assert_eq!(
                        shown, reference[i],
                        "secret {secret:?} changed what is shown of {m:?}"
                    );
                    assert!(!shown.contains("***") && !shown.contains("[redacted]"));
                }
            }
        }
        // And the free text stays whole: the user name and every word are readable.
        let shown = text(&messages("app", free[0])[0]);
        assert_eq!(
            shown,
            "connect postgres://app@db.internal:5432/app: FATAL: password authentication failed \
             for user \"app\""
        );
    }

    #[test]
    fn a_reply_is_shown_only_in_its_documented_shapes() {
        let mut rng = fastrand::Rng::with_seed(7);
        for secret in secrets(&mut rng) {
            let e = encoded(&secret);
            let echoes = [
                // An Apache 404 quoting the Slack path.
                format!(
                    "<html><body><p>The requested URL /services/T0/B0/{e} was not found on \
                     this server.</p></body></html>"
                ),
                // PagerDuty's shape, its errors quoting the key.
                serde_json::json!({
                    "status": "invalid event",
                    "message": "Event object is invalid",
                    "errors": [format!("routing_key {secret} is not valid")],
                })
                .to_string(),
                // A webhook echoing its request in plain text.
                format!("bad request POST /hook?token={e} key={secret}"),
            ];
            let shown: Vec<String> = echoes.iter().map(|b| reply(b.as_bytes())).collect();
            assert_eq!(
                shown,
                [
                    format!(
                        "a {}-byte reply (not shown: a reply may quote the request)",
                        echoes[0].len()
                    ),
                    "status: invalid event; message: Event object is invalid".to_string(),
                    format!(
                        "a {}-byte reply (not shown: a reply may quote the request)",
                        echoes[2].len()
                    ),
                ],
                "secret {secret:?}"
            );
        }
        assert_eq!(reply(b"no_service\n"), "no_service");
        assert_eq!(reply(b""), "");
        assert_eq!(
            reply(br#"{"message":"Bad credentials","documentation_url":"https://docs.github.com/rest"}"#),
            "message: Bad credentials"
        );
        // Words that quote a path or a token are not shown.
        for quoting in [
            r#"{"error":"no route for POST /services/T/B/s3cr3t"}"#,
            r#"{"message":"Bad credentials for ghp_TESTtoken0123456789"}"#,
        ] {
            assert_eq!(
                reply(quoting.as_bytes()),
                format!(
                    "a {}-byte reply (not shown: a reply may quote the request)",
                    quoting.len()
                )
            );
        }
    }

    #[test]
    fn urls_lose_their_secret_parts_and_keep_their_place() {
        assert_eq!(
            text(
                "redirected to https://u:pw@example.com/hook?token=abc, then \"http://x.io/t/123\""
            ),
            "redirected to https://example.com/…, then \"http://x.io/…\""
        );
        assert_eq!(text("see https://example.com"), "see https://example.com");
        assert_eq!(
            text(&format!("POST {SLACK} failed")),
            "POST https://hooks.slack.com/… failed"
        );
        assert_eq!(
            text("postgres://app:pw@db:5432/app?sslmode=require"),
            "postgres://app@db:5432/app?sslmode=require"
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
        let text = describe_error(err);
        assert!(!text.contains("sekrit"), "{text}");
        assert!(text.starts_with("cannot connect"), "{text}");
    }
}
