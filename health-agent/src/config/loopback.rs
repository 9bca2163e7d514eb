//! Whether a configured URL names this host: plain http:// is accepted there only (webhooks,
//! the CloudWatch endpoint), since nothing crosses a network.

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
