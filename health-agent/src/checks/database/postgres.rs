//! Postgres: connect (over TLS as the URL's `sslmode` asks), authenticate, `SELECT 1`
//! (tokio-postgres; TLS through `super::tls`).
//!
//! A refusal says what to change: a password the server asks for and none is set (tokio-postgres
//! says "password missing" only once the server has asked for one), a password or user it
//! refused (and where that password came from), an unknown database, a login method the check
//! does not speak.

use std::time::{Duration, Instant};

use tokio::task::JoinHandle;
use tokio_postgres::{tls::MakeTlsConnect, Client, Socket};

use super::{
    ms, no_answer,
    target::{Login, Target},
    tls::{self, PgTls, TlsFailure},
    Failure, Good,
};
use crate::dburl::{error_chain, SslMode};

/// What libpq's ALPN for Postgres is; servers since 17 check it when it is sent.
const ALPN: &[u8] = b"postgresql";

pub(super) async fn round_trip(
    t: &Target,
    login: &Login,
    timeout: Duration,
) -> Result<Good, Failure> {
    // Parsed with the URL (`DbUrl::parse` refuses a Postgres URL tokio-postgres cannot read).
    let mut cfg = t
        .postgres
        .clone()
        .ok_or_else(|| Failure::Outage("not a Postgres URL".into()))?;
    if cfg.get_password().is_none() {
        if let Some(p) = &login.password {
            cfg.password(p);
        }
    }
    if cfg.get_application_name().is_none() {
        cfg.application_name("health-agent");
    }
    cfg.connect_timeout(timeout);
    let negotiated = tls::Negotiated::default();
    let start = Instant::now();
    // The deadline bounds the TCP connect, the TLS handshake and the login together.
    let deadline = start + timeout;
    let why = |e: &tokio_postgres::Error| classify(e, t, login);
    let (client, mut driver) = match t.tls.mode {
        SslMode::Disable => connect(&cfg, tokio_postgres::NoTls, deadline, timeout, why)
            .await
            .map_err(|(f, _)| f)?,
        mode => {
            let config = tls::client_config(&t.tls, Some(ALPN))
                .map_err(|f| f.map(|m| format!("{m} (set in {})", t.key)))?;
            let make = PgTls {
                config,
                negotiated: negotiated.clone(),
            };
            match connect(&cfg, make, deadline, timeout, why).await {
                Ok(c) => c,
                // libpq's prefer: a handshake that fails is tried again in the clear (NoTls
                // never offers TLS), within the same deadline.
                Err((_, true)) if mode == SslMode::Prefer => {
                    connect(&cfg, tokio_postgres::NoTls, deadline, timeout, why)
                        .await
                        .map_err(|(f, _)| f)?
                }
                Err((f, _)) => return Err(f),
            }
        }
    };
    let connected = start.elapsed();
    let transport = match negotiated.lock().ok().and_then(|n| n.clone()) {
        Some(version) => format!(" over {version} ({})", t.tls.mode.as_str()),
        None => String::new(),
    };
    let query = tokio::time::timeout(timeout, client.simple_query("SELECT 1")).await;
    let latency = start.elapsed();
    drop(client);
    // Give the connection a moment to send Terminate, so the server logs no unexpected EOF.
    if tokio::time::timeout(Duration::from_millis(500), &mut driver)
        .await
        .is_err()
    {
        driver.abort();
    }
    let messages = query
        .map_err(|_| no_answer("SELECT 1", timeout))?
        .map_err(|e| Failure::Outage(format!("SELECT 1: {}", error_chain(&e))))?;
    let one = messages.iter().any(|m| match m {
        tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0) == Some("1"),
        _ => false,
    });
    if !one {
        return Err(Failure::Outage("SELECT 1 did not return 1".into()));
    }
    Ok(Good {
        latency,
        detail: Some(format!(
            "connect {}{transport}, SELECT 1 {}",
            ms(connected),
            ms(latency.saturating_sub(connected))
        )),
    })
}

/// Connects through `tls` by `deadline` (`timeout` after the round began) and drives the
/// connection on a task of its own. The error says whether the TLS handshake was what failed.
async fn connect<T>(
    cfg: &tokio_postgres::Config,
    tls: T,
    deadline: Instant,
    timeout: Duration,
    classify: impl Fn(&tokio_postgres::Error) -> (Failure, bool),
) -> Result<(Client, JoinHandle<()>), (Failure, bool)>
where
    T: MakeTlsConnect<Socket>,
    T::Stream: Send + 'static,
{
    let (client, connection) = tokio::time::timeout_at(deadline.into(), cfg.connect(tls))
        .await
        .map_err(|_| (no_answer("connect", timeout), false))?
        .map_err(|e| classify(&e))?;
    let driver = tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok((client, driver))
}

/// A failed connect: refused by the server or by TLS (a configuration error), else an outage;
/// and whether the TLS handshake failed.
fn classify(e: &tokio_postgres::Error, t: &Target, login: &Login) -> (Failure, bool) {
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(TlsFailure(f)) = s.downcast_ref::<TlsFailure>() {
            return (
                match f {
                    Failure::Refused(m) => {
                        Failure::Refused(format!("connect: {m}; the TLS settings are in {}", t.key))
                    }
                    Failure::Outage(m) => Failure::Outage(format!("connect: {m}")),
                },
                true,
            );
        }
        source = s.source();
    }
    (classify_answer(e, t, login), false)
}

/// A connect that failed outside the TLS handshake.
fn classify_answer(e: &tokio_postgres::Error, t: &Target, login: &Login) -> Failure {
    let chain = error_chain(e);
    // tokio-postgres's words (a `Config` error) once the server asked for a password (cleartext,
    // MD5 or SCRAM) and the config has none: the server answered, this is ours to fix.
    if chain.contains("password missing") {
        return Failure::Refused(login.missing(t));
    }
    // Kerberos, GSS or SSPI (or a SASL mechanism other than SCRAM): the check cannot log in.
    if chain.contains("unsupported authentication method")
        || chain.contains("unsupported SASL mechanism")
    {
        return Failure::Refused(format!(
            "connect: {chain}: the server asks this user for a login the check does not speak;              let it log in with a password (scram-sha-256 or md5 in pg_hba.conf) or a client              certificate"
        ));
    }
    // tokio-postgres says so in words only: the server answered "no" to the TLS request.
    if chain.contains("server does not support TLS") {
        return Failure::Refused(
            "connect: the server does not accept TLS (its ssl setting is off), and the URL's \
             sslmode requires it"
                .into(),
        );
    }
    let message = format!("connect: {chain}");
    if !refused_by_postgres(e) {
        return Failure::Outage(message);
    }
    let key = &t.key;
    // pg_hba.conf allows this client only over TLS (a `hostssl` line).
    if chain.contains("no encryption") {
        return Failure::Refused(format!(
            "{message} (the server accepts this client only over TLS: set sslmode=require or \
             stronger in {key})"
        ));
    }
    // A `cert` line: this user logs in with a client certificate.
    if chain.contains("requires a valid client certificate") {
        return Failure::Refused(format!(
            "{message} (give {key} sslcert and sslkey, a certificate the server's CA signed \
             whose CN is the user)"
        ));
    }
    use tokio_postgres::error::SqlState;
    Failure::Refused(match e.code() {
        Some(c) if *c == SqlState::INVALID_PASSWORD => format!("{message}: {}", login.refused(t)),
        Some(c) if *c == SqlState::INVALID_CATALOG_NAME => {
            format!("{message}: fix the database name (the URL's path) in {key}")
        }
        // An unknown role, or no pg_hba.conf line for this client.
        _ => format!("{message}: fix the user in {key}, or let it in in the server's pg_hba.conf"),
    })
}

/// The server answered and refused us: wrong credentials, unknown role or database.
fn refused_by_postgres(e: &tokio_postgres::Error) -> bool {
    use tokio_postgres::error::SqlState;
    e.code().is_some_and(|c| {
        [
            SqlState::INVALID_PASSWORD,
            SqlState::INVALID_AUTHORIZATION_SPECIFICATION,
            SqlState::INVALID_CATALOG_NAME,
        ]
        .contains(c)
    })
}
