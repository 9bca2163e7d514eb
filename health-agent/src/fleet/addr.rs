//! What a peer's address may be before it is asked: `host:port`, the host an IPv4 literal, a
//! bracketed IPv6 literal or a DNS name, and nothing else. Addresses come from outside (the
//! Consul catalog, DNS, the auto-scaling group's listing, the config's `fleet.peers`); each
//! becomes a URL, a `/health` field, a log line and an incident's Markdown, so one that could
//! carry a scheme, a path, credentials or a control character is dropped before any of that,
//! and said where the round tells what went wrong with its sources.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::text;

/// `[` + the longest IPv6 text (45) + `]:65535`, or a 253-character name + `:65535`.
pub const MAX_LEN: usize = 261;
/// How much of a dropped value is shown.
const SHOWN: usize = 64;
/// How many dropped values a round's discovery error names (it counts them all).
const NAMED: usize = 3;

/// What is wrong with a peer address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AddrError {
    #[error("longer than {MAX_LEN} characters")]
    TooLong,
    #[error("holds a control character")]
    Control,
    #[error("holds whitespace")]
    Whitespace,
    #[error("holds a scheme: give host:port, not a URL")]
    Scheme,
    #[error("holds credentials ('@')")]
    Userinfo,
    #[error("holds a path, query or fragment")]
    Path,
    #[error("has no port: give host:port")]
    NoPort,
    #[error("the port is not a number from 1 to 65535")]
    Port,
    #[error("an IPv6 address needs brackets: [addr]:port")]
    Unbracketed,
    #[error("not an IPv6 address between the brackets")]
    Ipv6,
    #[error("looks like an IPv4 address but is not one")]
    Ipv4,
    #[error("the host name is empty")]
    EmptyHost,
    #[error("the host name is longer than 253 characters")]
    NameTooLong,
    #[error("a host name label is empty or longer than 63 characters")]
    Label,
    #[error("a host name label starts or ends with '-'")]
    Hyphen,
    #[error("a host name holds a character other than letters, digits, '-' and '.'")]
    NameChar,
    /// From a source that lists IP addresses only (DNS answers, the group's private addresses).
    #[error("not an IP address, as this source gives")]
    NotAnIp,
}

/// Whether `addr` is `host:port` as a peer's address must be.
pub fn check(addr: &str) -> Result<(), AddrError> {
    if addr.len() > MAX_LEN {
        return Err(AddrError::TooLong);
    }
    if addr.chars().any(char::is_control) {
        return Err(AddrError::Control);
    }
    if addr.chars().any(char::is_whitespace) {
        return Err(AddrError::Whitespace);
    }
    if addr.contains("://") {
        return Err(AddrError::Scheme);
    }
    if addr.contains('@') {
        return Err(AddrError::Userinfo);
    }
    if addr.contains(['/', '?', '#', '\\']) {
        return Err(AddrError::Path);
    }
    let (host, port) = addr.rsplit_once(':').ok_or(AddrError::NoPort)?;
    port_of(port)?;
    if let Some(inner) = host.strip_prefix('[') {
        let inner = inner.strip_suffix(']').ok_or(AddrError::Ipv6)?;
        return inner
            .parse::<Ipv6Addr>()
            .map(drop)
            .map_err(|_| AddrError::Ipv6);
    }
    if host.contains(':') {
        return Err(AddrError::Unbracketed);
    }
    host_name(host)
}

fn port_of(port: &str) -> Result<u16, AddrError> {
    // u16's parser takes a leading '+'; a port is digits only.
    if port.is_empty() || port.len() > 5 || !port.bytes().all(|b| b.is_ascii_digit()) {
        return Err(AddrError::Port);
    }
    port.parse::<u16>()
        .ok()
        .filter(|p| *p > 0)
        .ok_or(AddrError::Port)
}

/// An IPv4 literal, or a DNS name (RFC 1123 labels).
fn host_name(host: &str) -> Result<(), AddrError> {
    if host.is_empty() {
        return Err(AddrError::EmptyHost);
    }
    if host.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return host
            .parse::<Ipv4Addr>()
            .map(drop)
            .map_err(|_| AddrError::Ipv4);
    }
    if host.len() > 253 {
        return Err(AddrError::NameTooLong);
    }
    for label in host.split('.') {
        if label.is_empty() || label.len() > 63 {
            return Err(AddrError::Label);
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        {
            return Err(AddrError::NameChar);
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err(AddrError::Hyphen);
        }
    }
    Ok(())
}

/// `host:port` for an IP address: an IPv6 one in brackets.
pub fn join(ip: IpAddr, port: u16) -> String {
    std::net::SocketAddr::new(ip, port).to_string()
}

/// Where a peer address came from, as the round names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Static,
    Dns,
    Consul,
    Asg,
}

impl Source {
    /// Whether the source gives IP addresses only: a name from it is a listing gone wrong.
    fn ips_only(self) -> bool {
        matches!(self, Self::Dns | Self::Asg)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Static => "fleet.peers",
            Self::Dns => "fleet.peers_dns",
            Self::Consul => "the Consul catalog",
            Self::Asg => "the auto-scaling group",
        }
    }
}

/// The addresses a source gave that were dropped: how many, and the first few, each shown
/// cleaned of control characters and cut short.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dropped {
    pub source: Source,
    pub count: usize,
    /// (the value as shown, what is wrong with it).
    pub named: Vec<(String, AddrError)>,
}

impl std::fmt::Display for Dropped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: {} address(es) dropped: ",
            self.source.as_str(),
            self.count
        )?;
        for (i, (value, why)) in self.named.iter().enumerate() {
            let sep = if i == 0 { "" } else { "; " };
            write!(f, "{sep}\"{value}\" {why}")?;
        }
        if self.count > self.named.len() {
            write!(f, "; …")?;
        }
        Ok(())
    }
}

/// A dropped value fit to show: no control characters, at most 64 bytes.
pub fn shown(value: &str) -> String {
    text::truncate(&text::clean(value), SHOWN)
}

/// `check`, and for a source of IP addresses only, that the host is one.
pub fn check_from(source: Source, addr: &str) -> Result<(), AddrError> {
    check(addr)?;
    if source.ips_only() && addr.parse::<std::net::SocketAddr>().is_err() {
        return Err(AddrError::NotAnIp);
    }
    Ok(())
}

/// The addresses of `source` that pass `check_from`, and those that do not.
pub fn admit(source: Source, addrs: Vec<String>) -> (Vec<String>, Option<Dropped>) {
    let mut ok = Vec::with_capacity(addrs.len());
    let mut dropped = Dropped {
        source,
        count: 0,
        named: Vec::new(),
    };
    for a in addrs {
        match check_from(source, &a) {
            Ok(()) => ok.push(a),
            Err(why) => {
                dropped.count += 1;
                if dropped.named.len() < NAMED {
                    dropped.named.push((shown(&a), why));
                }
            }
        }
    }
    (ok, (dropped.count > 0).then_some(dropped))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_a_peer_may_have() {
        for ok in [
            "[::1]:8080",
            "[fd00::3]:9",
            "10.0.0.3:8080",
            "web-1.internal:8080",
            "web-1:65535",
            "a:1",
            "xn--bcher-kva.example:443",
        ] {
            assert_eq!(check(ok), Ok(()), "{ok}");
        }
    }

    #[test]
    fn hostile_addresses_are_refused_for_what_they_hold() {
        let long_name = format!("{}:1", "a".repeat(300));
        let long_label = format!("{}.x:1", "a".repeat(64));
        let name_254 = format!("{}:1", vec!["a".repeat(63); 4].join(".") + "aa");
        for (bad, why) in [
            ("http://x:1/y", AddrError::Scheme),
            ("a b:1", AddrError::Whitespace),
            ("x:0", AddrError::Port),
            ("x:99999", AddrError::Port),
            ("x:+80", AddrError::Port),
            ("x:", AddrError::Port),
            ("x", AddrError::NoPort),
            ("\x1b[31mx:1", AddrError::Control),
            ("x:1\n", AddrError::Control),
            (long_name.as_str(), AddrError::TooLong),
            (long_label.as_str(), AddrError::Label),
            (name_254.as_str(), AddrError::NameTooLong),
            ("user:pw@x:1", AddrError::Userinfo),
            ("x/y:1", AddrError::Path),
            ("x:1?a", AddrError::Path),
            ("x?a:1", AddrError::Path),
            ("::1:8080", AddrError::Unbracketed),
            ("[::1:8080", AddrError::Ipv6),
            ("[x]:8080", AddrError::Ipv6),
            ("999.1.1.1:80", AddrError::Ipv4),
            (":80", AddrError::EmptyHost),
            ("a..b:80", AddrError::Label),
            ("-a:80", AddrError::Hyphen),
            ("a-.b:80", AddrError::Hyphen),
            ("a_b:80", AddrError::NameChar),
            ("x`](http:1", AddrError::NameChar),
            ("héllo:80", AddrError::NameChar),
        ] {
            assert_eq!(check(bad), Err(why), "{bad:?}");
        }
    }

    #[test]
    fn a_source_keeps_the_good_and_names_the_dropped_cleaned_and_cut() {
        let hostile = format!("\x1b[2J{}:1", "b".repeat(100));
        let (ok, dropped) = admit(
            Source::Consul,
            vec![
                "10.0.0.1:8080".into(),
                hostile,
                "x:0".into(),
                "a b:1".into(),
                "c d:1".into(),
            ],
        );
        assert_eq!(ok, ["10.0.0.1:8080"]);
        let d = dropped.unwrap();
        assert_eq!(d.count, 4);
        let said = d.to_string();
        assert!(
            said.starts_with("the Consul catalog: 4 address(es) dropped: \"[2Jbbb"),
            "{said}"
        );
        assert!(!said.contains('\x1b'), "{said:?}");
        assert!(said.contains("…\" holds a control character"), "{said}");
        assert!(said.contains("\"x:0\" the port is not"), "{said}");
        assert!(said.ends_with("; …"), "{said}");
        assert!(d.named.iter().all(|(v, _)| v.len() <= SHOWN));
        assert_eq!(
            admit(Source::Static, vec!["a:1".into()]),
            (vec!["a:1".into()], None)
        );
        // The group's private addresses and DNS answers are IP addresses, never a name.
        let (ok, dropped) = admit(
            Source::Asg,
            vec![
                "10.0.0.2:8080".into(),
                "[fd00::2]:8080".into(),
                "evil.example:8080".into(),
            ],
        );
        assert_eq!(ok, ["10.0.0.2:8080", "[fd00::2]:8080"]);
        assert_eq!(
            dropped.unwrap().to_string(),
            "the auto-scaling group: 1 address(es) dropped: \"evil.example:8080\" not an IP \
             address, as this source gives"
        );
    }

    #[test]
    fn ip_addresses_join_their_port() {
        assert_eq!(join("fd00::3".parse().unwrap(), 80), "[fd00::3]:80");
        assert_eq!(join("10.0.0.3".parse().unwrap(), 80), "10.0.0.3:80");
    }
}
