//! TLS for the database check: the rustls client a database's [`TlsOptions`] ask for (libpq's
//! `sslmode`: `require` checks no certificate, `verify-ca` the chain, `verify-full` the chain and
//! the host name), the adapter tokio-postgres connects through, and the words for TLS failures.
//!
//! rustls with its ring provider, as reqwest already has it: no OpenSSL is linked. The CA bundle
//! is read every round (the config is built per round trip), so a replaced `sslrootcert` file
//! shows at once, like the password file.
//!
//! A failure the server or its certificate gives (not trusted, wrong name, expired, an alert,
//! no TLS on that port) is a configuration error: retrying does not fix it, and it must never
//! read as an outage. A TLS handshake that stalls or is cut off is an outage, as a connect is.

use std::{
    future::Future,
    io,
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll},
    time::{Duration, Instant},
};

use rustls::{
    client::{
        danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier},
        verify_server_cert_signed_by_trust_anchor, verify_server_name,
    },
    crypto::{verify_tls12_signature, verify_tls13_signature, WebPkiSupportedAlgorithms},
    pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer, ServerName, UnixTime},
    server::ParsedCertificate,
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_rustls::{client::TlsStream, TlsConnector};

use super::{no_answer, Failure};
use crate::dburl::{RootCerts, SslMode, TlsOptions};

/// The rustls client for `opts`; `alpn` is offered in the handshake (Postgres asks for its own).
/// Every error is ours to fix (a missing or empty CA or key file): `Failure::Refused`.
pub(super) fn client_config(
    opts: &TlsOptions,
    alpn: Option<&[u8]>,
) -> Result<Arc<ClientConfig>, Failure> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let check = match opts.mode {
        SslMode::Disable | SslMode::Prefer | SslMode::Require => Check::Nothing,
        SslMode::VerifyCa => Check::Chain,
        SslMode::VerifyFull => Check::ChainAndName,
    };
    let roots = match check {
        // No trust anchors needed, so none are read: a missing bundle cannot fail `require`.
        Check::Nothing => RootCertStore::empty(),
        Check::Chain | Check::ChainAndName => root_store(&opts.roots)?,
    };
    let verifier = Verifier {
        check,
        roots: Arc::new(roots),
        source: opts.roots.to_string(),
        algs: provider.signature_verification_algorithms,
    };
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Failure::Refused(format!("TLS setup: {e}")))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier));
    let mut config = match &opts.client {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let chain = read_certs(cert, "sslcert")?;
            let key = PrivateKeyDer::from_pem_file(key).map_err(|e| {
                Failure::Refused(format!(
                    "cannot read sslkey {}: {e} (a PEM private key)",
                    key.display()
                ))
            })?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| Failure::Refused(format!("sslcert and sslkey: {e}")))?
        }
    };
    config.alpn_protocols = alpn.map(|a| vec![a.to_vec()]).unwrap_or_default();
    Ok(Arc::new(config))
}

/// The trust anchors of `roots`, each certificate in a bundle added (a bundle may hold several).
fn root_store(roots: &RootCerts) -> Result<RootCertStore, Failure> {
    let mut store = RootCertStore::empty();
    match roots {
        RootCerts::File(path) => {
            let certs = read_certs(path, "sslrootcert")?;
            let (added, _ignored) = store.add_parsable_certificates(certs);
            if added == 0 {
                return Err(Failure::Refused(format!(
                    "sslrootcert {}: no usable CA certificate in it",
                    path.display()
                )));
            }
        }
        RootCerts::System => {
            // Unreadable entries are skipped, as every TLS client does with the system store.
            let found = rustls_native_certs::load_native_certs();
            store.add_parsable_certificates(found.certs);
            if store.is_empty() {
                return Err(Failure::Refused(
                    "no CA certificates in the system's store (install ca-certificates, or set \
                     sslrootcert to the provider's CA bundle)"
                        .into(),
                ));
            }
        }
    }
    Ok(store)
}

/// Every certificate in a PEM file; `what` names the URL key for the error.
fn read_certs(path: &std::path::Path, what: &str) -> Result<Vec<CertificateDer<'static>>, Failure> {
    let cannot = |e: &dyn std::fmt::Display| {
        Failure::Refused(format!("cannot read {what} {}: {e}", path.display()))
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| cannot(&e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| cannot(&e))?;
    if certs.is_empty() {
        return Err(cannot(&"no PEM certificate in it"));
    }
    Ok(certs)
}

/// What the certificate check covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Check {
    Nothing,
    Chain,
    ChainAndName,
}

/// A verifier that takes any certificate but still checks the handshake's signatures (so the
/// peer holds the certificate's key): libpq's `require`, and the probe's
/// `web.probe_tls_verify = false`.
pub(crate) fn any_certificate(algs: WebPkiSupportedAlgorithms) -> Arc<dyn ServerCertVerifier> {
    Arc::new(Verifier {
        check: Check::Nothing,
        roots: Arc::new(RootCertStore::empty()),
        source: String::new(),
        algs,
    })
}

/// libpq's three levels of certificate checking. Handshake signatures are always checked, so
/// even `require` talks to the holder of the certificate's key.
#[derive(Debug)]
struct Verifier {
    check: Check,
    roots: Arc<RootCertStore>,
    /// Where the roots came from, for the error.
    source: String,
    algs: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for Verifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        _ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if self.check == Check::Nothing {
            return Ok(ServerCertVerified::assertion());
        }
        let cert = ParsedCertificate::try_from(end_entity)?;
        verify_server_cert_signed_by_trust_anchor(
            &cert,
            &self.roots,
            intermediates,
            now,
            self.algs.all,
        )
        .map_err(|e| match e {
            // Carry where the roots came from into the message.
            rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer) => {
                rustls::Error::General(format!(
                    "the server's certificate is not trusted: no CA in {} signed it",
                    self.source
                ))
            }
            other => other,
        })?;
        if self.check == Check::ChainAndName {
            verify_server_name(&cert, server_name)?;
        }
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(message, cert, dss, &self.algs)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(message, cert, dss, &self.algs)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algs.supported_schemes()
    }
}

/// The name the certificate must carry: the URL's host (an IP address is matched against the
/// certificate's IP entries, as libpq does).
pub(super) fn server_name(host: &str) -> Result<ServerName<'static>, Failure> {
    ServerName::try_from(host.to_string()).map_err(|_| {
        Failure::Refused(format!(
            "host {host:?} is neither a DNS name nor an IP address, so TLS cannot check it"
        ))
    })
}

/// A TLS handshake over `stream`, given up at `deadline` (the end of the connect's `timeout`).
pub(super) async fn handshake<S>(
    config: Arc<ClientConfig>,
    name: ServerName<'static>,
    stream: S,
    deadline: Instant,
    timeout: Duration,
) -> Result<TlsStream<S>, Failure>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let handshake = TlsConnector::from(config).connect(name, stream);
    tokio::time::timeout_at(deadline.into(), handshake)
        .await
        .map_err(|_| no_answer("TLS handshake", timeout))?
        .map_err(|e| classify(&e))
}

/// A failed handshake in words: the server's or its certificate's fault is a configuration
/// error, a broken or closed connection an outage.
pub(super) fn classify(e: &io::Error) -> Failure {
    match e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
        Some(tls) => Failure::Refused(format!("TLS handshake: {}", describe(tls))),
        None => Failure::Outage(format!("TLS handshake: {e}")),
    }
}

/// A rustls error as an operator reads it.
pub(super) fn describe(e: &rustls::Error) -> String {
    use rustls::Error as E;
    use CertificateError as C;
    match e {
        E::General(m) => m.clone(),
        E::InvalidCertificate(c) => match c {
            C::UnknownIssuer | C::BadSignature | C::UnsupportedSignatureAlgorithmContext { .. } => {
                format!("the server's certificate is not trusted: no CA given signed it ({c:?})")
            }
            C::NotValidForName => {
                "the server's certificate is not valid for this host name (host name mismatch; \
                 connect by the name the certificate carries, or use sslmode=verify-ca)"
                    .into()
            }
            C::NotValidForNameContext {
                expected,
                presented,
            } => format!(
                "the server's certificate is not valid for host name {} (host name mismatch: it \
                 names {}); connect by one of those names, or use sslmode=verify-ca",
                server_name_text(expected),
                if presented.is_empty() {
                    "nothing".to_string()
                } else {
                    presented
                        .iter()
                        .map(|p| presented_name(p))
                        .collect::<Vec<_>>()
                        .join(", ")
                }
            ),
            C::Expired | C::ExpiredContext { .. } => "the server's certificate has expired".into(),
            C::NotValidYet | C::NotValidYetContext { .. } => {
                "the server's certificate is not valid yet (check this host's clock)".into()
            }
            C::Revoked => "the server's certificate is revoked".into(),
            other => format!("the server's certificate was rejected: {other:?}"),
        },
        E::AlertReceived(alert) => format!(
            "the server refused the handshake ({alert:?}); does it want a client certificate \
             (sslcert/sslkey), or another TLS version?"
        ),
        E::PeerIncompatible(why) => {
            format!("no TLS version or cipher in common with the server ({why:?})")
        }
        E::InvalidMessage(_)
        | E::InappropriateMessage { .. }
        | E::InappropriateHandshakeMessage { .. } => {
            format!("the server does not speak TLS on this port ({e})")
        }
        other => other.to_string(),
    }
}

/// rustls lists a certificate's names as `DnsName("db.example")` / `IpAddress(10.0.0.1)`: the
/// name alone reads better.
fn presented_name(p: &str) -> &str {
    let inner = p
        .split_once('(')
        .and_then(|(_, rest)| rest.strip_suffix(')'))
        .unwrap_or(p);
    inner.trim_matches('"')
}

fn server_name_text(name: &ServerName<'_>) -> String {
    match name {
        ServerName::DnsName(d) => d.as_ref().to_string(),
        ServerName::IpAddress(ip) => std::net::IpAddr::from(*ip).to_string(),
        other => format!("{other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// tokio-postgres: its TLS traits over the rustls client above.

/// What a TLS connection negotiated, for the check's detail: set once the handshake is done.
pub(super) type Negotiated = Arc<Mutex<Option<String>>>;

/// tokio-postgres's `MakeTlsConnect`: one rustls connection per host it tries.
pub(super) struct PgTls {
    pub(super) config: Arc<ClientConfig>,
    pub(super) negotiated: Negotiated,
}

impl<S> tokio_postgres::tls::MakeTlsConnect<S> for PgTls
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = PgTlsStream<S>;
    type TlsConnect = PgTlsConnect;
    type Error = TlsFailure;

    fn make_tls_connect(&mut self, host: &str) -> Result<PgTlsConnect, TlsFailure> {
        let name = server_name(host).map_err(TlsFailure)?;
        Ok(PgTlsConnect {
            config: self.config.clone(),
            name,
            negotiated: self.negotiated.clone(),
        })
    }
}

pub(super) struct PgTlsConnect {
    config: Arc<ClientConfig>,
    name: ServerName<'static>,
    negotiated: Negotiated,
}

impl<S> tokio_postgres::tls::TlsConnect<S> for PgTlsConnect
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = PgTlsStream<S>;
    type Error = TlsFailure;
    type Future = Pin<Box<dyn Future<Output = Result<PgTlsStream<S>, TlsFailure>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        Box::pin(async move {
            // The caller's deadline bounds the whole connect, this handshake included.
            let tls = TlsConnector::from(self.config)
                .connect(self.name, stream)
                .await
                .map_err(|e| TlsFailure(classify(&e)))?;
            let version = tls.get_ref().1.protocol_version();
            if let Ok(mut n) = self.negotiated.lock() {
                *n = Some(version.map_or_else(|| "TLS".into(), |v| format!("{v:?}")));
            }
            Ok(PgTlsStream(tls))
        })
    }
}

/// A failed TLS setup or handshake, already classified; tokio-postgres hands it back as the
/// source of its error, where `postgres::round_trip` finds it.
#[derive(Debug)]
pub(super) struct TlsFailure(pub(super) Failure);

impl std::fmt::Display for TlsFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0.message())
    }
}

impl std::error::Error for TlsFailure {}

pub(super) struct PgTlsStream<S>(TlsStream<S>);

impl<S> tokio_postgres::tls::TlsStream for PgTlsStream<S>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    fn channel_binding(&self) -> tokio_postgres::tls::ChannelBinding {
        // SCRAM then runs without channel binding (as libpq with channel_binding=prefer does
        // against a server that offers none); the certificate check is what the modes promise.
        tokio_postgres::tls::ChannelBinding::none()
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for PgTlsStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for PgTlsStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    fn opts(mode: SslMode, roots: RootCerts) -> TlsOptions {
        TlsOptions {
            mode,
            roots,
            client: None,
        }
    }

    #[test]
    fn certificate_and_tls_errors_are_misconfigured_and_io_errors_an_outage() {
        let tls = |e: rustls::Error| classify(&io::Error::new(io::ErrorKind::InvalidData, e));
        let refused = |f: Failure| match f {
            Failure::Refused(m) => m,
            Failure::Outage(m) => panic!("an outage: {m}"),
        };
        let m = refused(tls(rustls::Error::InvalidCertificate(
            CertificateError::UnknownIssuer,
        )));
        assert!(m.contains("certificate is not trusted"), "{m}");
        let m = refused(tls(rustls::Error::InvalidCertificate(
            CertificateError::NotValidForNameContext {
                expected: ServerName::try_from("127.0.0.1").unwrap(),
                presented: vec!["DnsName(\"localhost\")".into()],
            },
        )));
        assert!(m.contains("host name mismatch: it names localhost"), "{m}");
        assert!(m.contains("host name 127.0.0.1"), "{m}");
        let m = refused(tls(rustls::Error::InvalidCertificate(
            CertificateError::Expired,
        )));
        assert!(m.contains("has expired"), "{m}");
        let m = refused(tls(rustls::Error::AlertReceived(
            rustls::AlertDescription::CertificateRequired,
        )));
        assert!(m.contains("client certificate"), "{m}");
        let m = refused(tls(rustls::Error::InvalidMessage(
            rustls::InvalidMessage::InvalidContentType,
        )));
        assert!(m.contains("does not speak TLS"), "{m}");
        // The connection broke or closed: the network's doing, damped as an outage.
        for kind in [
            io::ErrorKind::UnexpectedEof,
            io::ErrorKind::ConnectionReset,
            io::ErrorKind::TimedOut,
        ] {
            let f = classify(&io::Error::new(kind, "gone"));
            assert!(matches!(f, Failure::Outage(_)), "{kind:?}: {f:?}");
        }
    }

    #[test]
    fn unreadable_or_empty_ca_files_are_ours_to_fix() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.pem");
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        for (path, want) in [
            (&missing, "cannot read sslrootcert"),
            (&empty, "no PEM certificate"),
        ] {
            let err = client_config(
                &opts(SslMode::VerifyFull, RootCerts::File(path.clone())),
                None,
            )
            .expect_err("refused");
            assert!(
                matches!(&err, Failure::Refused(m) if m.contains(want)),
                "{err:?}"
            );
        }
        // require checks nothing, so it reads no CA file: a missing one cannot fail it.
        assert!(client_config(&opts(SslMode::Require, RootCerts::File(missing)), None).is_ok());
        let half = TlsOptions {
            client: Some((PathBuf::from("/nonexistent.crt"), PathBuf::from("/k"))),
            ..opts(SslMode::Require, RootCerts::System)
        };
        let err = client_config(&half, None).expect_err("refused");
        assert!(
            matches!(&err, Failure::Refused(m) if m.contains("cannot read sslcert")),
            "{err:?}"
        );
    }

    #[test]
    fn the_system_store_has_roots_here() {
        // Debian's ca-certificates: what a URL without sslrootcert trusts.
        let c = client_config(
            &opts(SslMode::VerifyFull, RootCerts::System),
            Some(b"postgresql"),
        );
        let c = c.unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(c.alpn_protocols, [b"postgresql".to_vec()]);
    }

    #[test]
    fn names_the_url_gives_become_server_names() {
        assert!(matches!(
            server_name("127.0.0.1"),
            Ok(ServerName::IpAddress(_))
        ));
        assert!(matches!(server_name("::1"), Ok(ServerName::IpAddress(_))));
        assert!(matches!(
            server_name("db.example.com"),
            Ok(ServerName::DnsName(_))
        ));
        assert!(matches!(server_name("bad name"), Err(Failure::Refused(_))));
        assert_eq!(presented_name("DnsName(\"localhost\")"), "localhost");
        assert_eq!(presented_name("IpAddress(10.0.0.1)"), "10.0.0.1");
    }
}
