//! The probe's answer: the status line and `Location` read from the response head, and what an
//! answer that is neither success nor a server error says about the probe's configuration. A
//! redirect, a refused Host or a missing path proves the server answers: the probe is set up
//! wrong, and the words name the key that fixes it. Never a fault of the backend.

use crate::config::ProbeScheme;

/// The most of a response head the probe reads; a `Location` beyond it is not named.
pub const HEAD_MAX: usize = 8192;

/// What the probe sent, for the words of a mistake.
pub struct Sent<'a> {
    pub path: &'a str,
    /// The Host header sent.
    pub host: &'a str,
    /// Whether the Host header was `web.probe_host` (false: the address probed).
    pub host_configured: bool,
    pub scheme: ProbeScheme,
    /// Where it went, e.g. `127.0.0.1:9000`.
    pub target: &'a str,
}

/// The status and `Location` of a response head (`bytes` may stop anywhere after the status
/// line). None: not an HTTP/1.x status line.
pub fn parse_head(bytes: &[u8]) -> Option<(u16, Option<String>)> {
    let line = bytes.get(..12)?;
    let line = std::str::from_utf8(line).ok()?;
    if !line.starts_with("HTTP/1.") {
        return None;
    }
    let status = line.get(9..12)?.parse().ok()?;
    let text = String::from_utf8_lossy(bytes);
    let head = text.split("\r\n\r\n").next().unwrap_or_default();
    let location = head.lines().skip(1).find_map(|l| {
        let (name, value) = l.split_once(':')?;
        name.trim()
            .eq_ignore_ascii_case("location")
            .then(|| value.trim().to_string())
    });
    Some((status, location))
}

/// The head is complete: the blank line after the headers has been read.
pub fn head_complete(bytes: &[u8]) -> bool {
    bytes.windows(4).any(|w| w == b"\r\n\r\n")
}

/// What an answer with `status` (and `location`) says is wrong with the probe's configuration;
/// None for a success, a server error or an informational status.
pub fn mistake(status: u16, location: Option<&str>, sent: &Sent) -> Option<String> {
    let at = format!(
        "web.probe_path = {:?} answered {status} at {}",
        sent.path, sent.target
    );
    let fix = match status {
        300..=399 => return Some(redirect(&at, location, sent)),
        403 | 421 | 400 => host_refused(status, sent),
        401 => "the route needs credentials: set web.probe_path to one that answers 200 \
                without them"
            .to_string(),
        400..=499 => "the backend answers, but not on this path; set web.probe_path to a route \
                      that answers 200 (\"\" watches the listener only)"
            .to_string(),
        _ => return None,
    };
    Some(format!("{at}: {fix}"))
}

/// A refused Host header (Rails' host authorization answers 403; 421 is Misdirected Request;
/// some servers answer 400).
fn host_refused(status: u16, sent: &Sent) -> String {
    let host = sent.host;
    let mut fix = if sent.host_configured {
        format!(
            "the app refuses Host: {host} (host authorization?); web.probe_host is not a host it \
             serves, or the route needs credentials: set web.probe_host to one it serves, or \
             web.probe_path to a public route"
        )
    } else {
        format!(
            "the app refuses Host: {host} (host authorization, as Rails' answers 403): set \
             web.probe_host to a host it serves, or exempt web.probe_path from the host check"
        )
    };
    if status == 400 && sent.scheme == ProbeScheme::Http {
        fix.push_str("; a TLS port answering plain HTTP: set web.probe_scheme = \"https\"");
    }
    fix
}

/// A redirect: where to, and which keys make the probe ask where the app answers.
fn redirect(at: &str, location: Option<&str>, sent: &Sent) -> String {
    let Some(location) = location else {
        return format!(
            "{at} (no Location): the app redirects the probe instead of answering it; set \
             web.probe_path to a route that answers 200 itself"
        );
    };
    let base = format!("{}://{}{}", sent.scheme.as_str(), sent.host, sent.path);
    let to = url::Url::parse(&base).and_then(|b| b.join(location));
    let mut fixes = Vec::new();
    if let Ok(to) = &to {
        let probed_port = sent
            .target
            .parse::<std::net::SocketAddr>()
            .map(|a| a.port());
        if to.scheme() == "https" && sent.scheme == ProbeScheme::Http {
            fixes.push(match to.port() {
                Some(p) if Ok(p) != probed_port => {
                    format!("web.probe_scheme = \"https\" with web.port = {p}, where it serves TLS")
                }
                _ => "web.probe_scheme = \"https\" if web.port serves TLS (else exempt the path \
                      from the redirect: Rails' config.ssl_options redirect exclude)"
                    .to_string(),
            });
        }
        let to_host = to.host_str().map(|h| match to.port() {
            Some(p) => format!("{h}:{p}"),
            None => h.to_string(),
        });
        let sent_host = super::tls::host_part(sent.host);
        if let Some(h) = to_host.filter(|h| super::tls::host_part(h) != sent_host) {
            fixes.push(format!("web.probe_host = {h:?}"));
        }
        if fixes.is_empty() && to.path() != sent.path {
            fixes.push(format!(
                "web.probe_path to a route that answers 200 itself (this one sends to {:?})",
                to.path()
            ));
        }
    }
    if fixes.is_empty() {
        fixes.push("web.probe_path to a route that answers 200 itself".into());
    }
    format!(
        "{at} (Location: {location}): the app redirects the probe instead of answering it; set {}",
        fixes.join(" and ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sent(host: &str, configured: bool) -> Sent<'_> {
        Sent {
            path: "/up",
            host,
            host_configured: configured,
            scheme: ProbeScheme::Http,
            target: "127.0.0.1:9000",
        }
    }

    #[test]
    fn heads() {
        assert_eq!(
            parse_head(b"HTTP/1.1 204 No Content\r\n"),
            Some((204, None))
        );
        assert_eq!(parse_head(b"SSH-2.0-OpenSSH"), None);
        let head = b"HTTP/1.1 301 Moved\r\nContent-Type: text/html\r\nlocation: https://a.example/up\r\n\r\nLocation: no";
        assert_eq!(
            parse_head(head),
            Some((301, Some("https://a.example/up".into())))
        );
        assert!(head_complete(head) && !head_complete(b"HTTP/1.1 200 OK\r\n"));
    }

    #[test]
    fn a_redirect_to_https_names_the_scheme_and_the_host() {
        let s = sent("127.0.0.1:9000", false);
        let m = mistake(301, Some("https://127.0.0.1:9000/up"), &s).unwrap();
        assert!(
            m.contains("answered 301") && m.contains("Location: https://"),
            "{m}"
        );
        assert!(m.contains("web.probe_scheme = \"https\""), "{m}");
        assert!(!m.contains("web.probe_host"), "same host: {m}");
        let m = mistake(301, Some("https://127.0.0.1:9443/up"), &s).unwrap();
        assert!(m.contains("with web.port = 9443"), "{m}");
        let m = mistake(308, Some("https://shop.example/up"), &s).unwrap();
        assert!(m.contains("web.probe_host = \"shop.example\""), "{m}");
        let m = mistake(302, Some("/login"), &s).unwrap();
        assert!(m.contains("web.probe_path") && m.contains("/login"), "{m}");
        let m = mistake(302, None, &s).unwrap();
        assert!(m.contains("no Location"), "{m}");
    }

    #[test]
    fn a_refused_host_names_probe_host() {
        for status in [403, 421] {
            let m = mistake(status, None, &sent("127.0.0.1:9000", false)).unwrap();
            assert!(m.contains(&format!("answered {status}")), "{m}");
            assert!(
                m.contains("Host: 127.0.0.1:9000") && m.contains("web.probe_host"),
                "{m}"
            );
        }
        let m = mistake(403, None, &sent("shop.example", true)).unwrap();
        assert!(m.contains("is not a host it serves"), "{m}");
        let m = mistake(400, None, &sent("127.0.0.1:9000", false)).unwrap();
        assert!(m.contains("web.probe_scheme = \"https\""), "{m}");
    }

    #[test]
    fn other_client_errors_name_the_path_and_success_or_server_errors_nothing() {
        let s = sent("127.0.0.1:9000", false);
        let m = mistake(404, None, &s).unwrap();
        assert!(m.contains("web.probe_path = \"/up\" answered 404"), "{m}");
        assert!(mistake(401, None, &s).unwrap().contains("credentials"));
        for ok in [200, 204, 500, 503, 101] {
            assert_eq!(mistake(ok, None, &s), None, "{ok}");
        }
    }
}
