//! Whether a configured URL names this host: plain http:// is accepted there only (webhooks,
//! the CloudWatch endpoint), since nothing crosses a network; and the check of a URL that
//! carries a secret, which says so without showing it.

/// `localhost`, or an address in 127.0.0.0/8 or `::1`.
pub(crate) fn loopback_host(u: &reqwest::Url) -> bool {
    let host = u.host_str().unwrap_or("");
    host.eq_ignore_ascii_case("localhost")
        || host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// A URL that carries a secret (a webhook's path, a token or key sent with the request):
/// https://, or http:// to a loopback host only, where nothing crosses a network. The message
/// never shows the URL.
pub(super) fn secret_url(url: &str) -> Result<(), &'static str> {
    let Ok(u) = reqwest::Url::parse(url) else {
        return Err("must be an https:// URL (value not shown: it may be a secret)");
    };
    match u.scheme() {
        "https" if u.host().is_some() => Ok(()),
        "http" if loopback_host(&u) => Ok(()),
        "http" => Err(
            "must be https://; http:// only to a loopback host (127.0.0.0/8, ::1, \
             localhost): it carries a secret (value not shown)",
        ),
        _ => Err("must be an https:// URL (value not shown: it may be a secret)"),
    }
}
