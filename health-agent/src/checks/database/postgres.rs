//! Postgres: connect, authenticate, `SELECT 1` (tokio-postgres, no TLS yet).

use std::time::{Duration, Instant};

use super::{ms, no_answer, target::Target, Failure, Good};
use crate::dburl::error_chain;

pub(super) async fn round_trip(
    t: &Target,
    password: Option<&str>,
    timeout: Duration,
) -> Result<Good, Failure> {
    // Parsed with the URL (`DbUrl::parse` refuses a Postgres URL tokio-postgres cannot read).
    let mut cfg = t
        .postgres
        .clone()
        .ok_or_else(|| Failure::Outage("not a Postgres URL".into()))?;
    if cfg.get_password().is_none() {
        if let Some(p) = password {
            cfg.password(p);
        }
    }
    if cfg.get_application_name().is_none() {
        cfg.application_name("health-agent");
    }
    cfg.connect_timeout(timeout);
    let start = Instant::now();
    let (client, connection) = tokio::time::timeout(timeout, cfg.connect(tokio_postgres::NoTls))
        .await
        .map_err(|_| no_answer("connect", timeout))?
        .map_err(|e| {
            let message = format!("connect: {}", error_chain(&e));
            if refused_by_postgres(&e) {
                Failure::Refused(message)
            } else {
                Failure::Outage(message)
            }
        })?;
    let connected = start.elapsed();
    let mut driver = tokio::spawn(async move {
        let _ = connection.await;
    });
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
            "connect {}, SELECT 1 {}",
            ms(connected),
            ms(latency.saturating_sub(connected))
        )),
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
