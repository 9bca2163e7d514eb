//! The probe over TLS (`web.probe_scheme = "https"`): the rustls client (ring, as reqwest and
//! the database check already link it), checking the backend's certificate against the
//! system's CAs or (`web.probe_tls_verify = false`) accepting any, and what a TLS failure says
//! about the configuration. Any TLS error is the backend's answer, so it proves something
//! serves: it names a key to fix, never a fault of the backend.

use std::sync::Arc;

use rustls::{pki_types::ServerName, CertificateError, ClientConfig, RootCertStore};

/// The client for the probe: `verify` checks the chain against the system's CAs and the name;
/// otherwise any certificate is taken (the handshake's signatures are still checked, so the
/// probe talks to the holder of the certificate's key). Err: no CA to check against.
pub fn client_config(verify: bool) -> Result<Arc<ClientConfig>, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let algs = provider.signature_verification_algorithms;
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS setup: {e}"))?;
    let mut config = if verify {
        let mut roots = RootCertStore::empty();
        // Unreadable entries are skipped, as every TLS client does with the system store.
        roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
        if roots.is_empty() {
            return Err(
                "web.probe_tls_verify = true but the system's CA store is empty: \
                        install ca-certificates, or set web.probe_tls_verify = false"
                    .into(),
            );
        }
        builder.with_root_certificates(roots).with_no_client_auth()
    } else {
        builder
            .dangerous()
            .with_custom_certificate_verifier(crate::checks::database::tls::any_certificate(algs))
            .with_no_client_auth()
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The name the certificate is checked against (and sent as SNI): `probe_host` without its
/// port, else the address probed (matched against the certificate's IP entries; no SNI).
pub fn server_name(probe_host: &str, addr: std::net::SocketAddr) -> ServerName<'static> {
    let host = host_part(probe_host);
    if !host.is_empty() {
        if let Ok(name) = ServerName::try_from(host.to_string()) {
            return name;
        }
    }
    ServerName::IpAddress(addr.ip().into())
}

/// `example.com:8443` → `example.com`, `[::1]:443` → `::1`, a bare IPv6 address as it is.
pub fn host_part(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match host.split_once(':') {
        Some((h, port)) if !port.contains(':') => h,
        _ => host,
    }
}

/// The rustls error inside an I/O error from the handshake, if the handshake failed on TLS
/// grounds (not on the connection).
pub fn rustls_error(e: &std::io::Error) -> Option<&rustls::Error> {
    e.get_ref()?.downcast_ref::<rustls::Error>()
}

/// What a TLS failure at `target` means for the configuration: the key to set.
pub fn mistake(e: &rustls::Error, target: &str, port: u16) -> String {
    use rustls::Error as E;
    use CertificateError as C;
    let cert = |why: &str, fix: &str| {
        format!(
            "the TLS backend at {target} presented a certificate the probe refused ({why}): \
             {fix}, or set web.probe_tls_verify = false for a self-signed one"
        )
    };
    let trust = "add its CA to the system's store";
    match e {
        E::InvalidCertificate(c) => match c {
            C::UnknownIssuer | C::BadSignature => {
                cert("no CA of the system's store signed it", trust)
            }
            C::NotValidForName | C::NotValidForNameContext { .. } => cert(
                "not valid for the name checked: web.probe_host, else the address probed",
                "set web.probe_host to a name it carries",
            ),
            C::Expired | C::ExpiredContext { .. } => cert("expired", "renew it"),
            other => cert(&format!("{other:?}"), trust),
        },
        E::InvalidMessage(_) | E::InappropriateMessage { .. } => format!(
            "web.probe_scheme = \"https\" but port {port} at {target} does not speak TLS \
             ({e}): set web.probe_scheme = \"http\""
        ),
        other => format!(
            "the TLS handshake with {target} failed ({other}): check the backend's TLS setup, \
             web.probe_host (the name sent) and web.probe_tls_verify"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_name_checked_is_probe_hosts_without_its_port_else_the_address() {
        let addr: std::net::SocketAddr = "127.0.0.1:9443".parse().unwrap();
        let dns = |h| match server_name(h, addr) {
            ServerName::DnsName(d) => d.as_ref().to_string(),
            other => format!("{other:?}"),
        };
        assert_eq!(dns("app.example.com:8443"), "app.example.com");
        assert_eq!(dns("app.example.com"), "app.example.com");
        assert!(matches!(server_name("", addr), ServerName::IpAddress(_)));
        assert_eq!(host_part("[::1]:443"), "::1");
        assert_eq!(host_part("::1"), "::1");
    }

    #[test]
    fn tls_failures_name_the_key_to_set() {
        let t = "127.0.0.1:9443";
        let e = rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer);
        let m = mistake(&e, t, 9443);
        assert!(m.contains("web.probe_tls_verify = false"), "{m}");
        let e = rustls::Error::InvalidMessage(rustls::InvalidMessage::InvalidContentType);
        let m = mistake(&e, t, 9443);
        assert!(m.contains("web.probe_scheme = \"http\""), "{m}");
    }

    #[test]
    fn both_clients_build() {
        assert!(client_config(false).is_ok());
        // The CI machine has ca-certificates; the error path names the key either way.
        if let Err(e) = client_config(true) {
            assert!(e.contains("web.probe_tls_verify"), "{e}");
        }
    }
}
