//! The database check against a real PostgreSQL: password from the URL, `PGPASSWORD` or
//! `database.password_file`, a wrong password as a configuration error, every database checked
//! with the worst deciding. Each test starts its own private server (`Postgres`, root needed
//! for `runuser`), so the library's unit tests need no PostgreSQL at all; Redis and MySQL are
//! tested there against in-process fakes.
//!
//! TLS against real servers: a TLS-only PostgreSQL (`ssl = on`, `hostssl` lines only) and a
//! `redis-server` with only its `tls-port`, both with certificates a CA made at test time signed
//! (`Ca`); each `sslmode`, the wrong CA, the wrong host name, TLS refused either way, and a
//! frozen path (`TcpProxy` under SIGSTOP) that must read as an outage, never as misconfigured.

use std::time::{Duration, Instant};

use health_agent::{
    checks::{
        database::{DatabaseMonitor, DbKind},
        DatabaseReport,
    },
    config::DatabaseConfig,
    status::DbState,
};
use health_agent_tests::{
    free_port, require_root, Agent, Ca, Fixture, Postgres, Receiver, Redis, TcpProxy,
};

// cfg, monitor, assert_no_secret: the same helpers the check's unit tests use.
#[path = "../../health-agent/src/checks/database/test_helpers.rs"]
mod test_helpers;
use test_helpers::{assert_no_secret, cfg, monitor};

/// The server's superuser URL, with `password` in it if given.
fn pg_url(pg: &Postgres, password: Option<&str>) -> String {
    match password {
        Some(p) => format!("postgres://postgres:{p}@127.0.0.1:{}/postgres", pg.port),
        None => pg.url(),
    }
}

fn started() -> Postgres {
    require_root();
    Postgres::start()
}

/// `PGPASSWORD` is process-global: tests that read or set it hold this lock.
static ENV_LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Sets (or removes) an environment variable and puts the old value back on drop.
struct EnvVar(&'static str, Option<String>);

impl EnvVar {
    fn set(key: &'static str, value: Option<&str>) -> Self {
        let old = std::env::var(key).ok();
        match value {
            Some(v) => std::env::set_var(key, v),
            None => std::env::remove_var(key),
        }
        Self(key, old)
    }
}

impl Drop for EnvVar {
    fn drop(&mut self) {
        match &self.1 {
            Some(v) => std::env::set_var(self.0, v),
            None => std::env::remove_var(self.0),
        }
    }
}

#[tokio::test]
async fn postgres_connected_with_password_in_url() {
    let pg = started();
    let mut m = monitor(&cfg(&[&pg_url(&pg, Some(&pg.password))]));
    let r = m.check().await;
    assert_eq!(r.state, DbState::Connected, "{r:?}");
    let db = &r.databases[0];
    assert_eq!(db.name, pg.url());
    assert_eq!(db.kind, DbKind::Postgres);
    assert!(db.latency_ms.is_some_and(|l| l > 0.0), "{db:?}");
    assert!(db.detail.as_deref().unwrap().contains("SELECT 1"), "{db:?}");
    assert!(db.last_checked.as_deref().unwrap().contains('T'), "{db:?}");
    assert_no_secret(&r, &[&pg.password]);
    assert!(!format!("{m:?}").contains(&pg.password));
}

#[tokio::test]
async fn postgres_wrong_password_is_a_configuration_error_with_a_sanitized_error() {
    let pg = started();
    let wrong = "wrong-Secret-42";
    let mut m = monitor(&cfg(&[&pg_url(&pg, Some(wrong))]));
    // The server answered and refused: a configuration error, not an outage.
    let r = m.check().await;
    assert_eq!(r.state, DbState::Misconfigured, "{r:?}");
    let err = r.databases[0].error.clone().unwrap();
    assert!(err.contains("password authentication failed"), "{err}");
    assert_no_secret(&r, &[wrong, &pg.password]);
}

#[tokio::test]
async fn postgres_unknown_database_is_misconfigured_naming_the_path_to_fix() {
    let pg = started();
    let url = format!(
        "postgres://postgres:{}@127.0.0.1:{}/nosuchdb",
        pg.password, pg.port
    );
    let r = first_of_three_rounds(&url).await;
    assert_eq!(r.state, DbState::Misconfigured, "{r:?}");
    let why = r.misconfigured_reason().unwrap();
    println!("{why}");
    assert!(
        why.contains("database \"nosuchdb\" does not exist")
            && why.contains("fix the database name (the URL's path) in database.urls[0]"),
        "{why}"
    );
    assert_no_secret(&r, &[&pg.password]);
}

#[tokio::test]
async fn postgres_password_from_pgpassword() {
    let pg = started();
    let _env = ENV_LOCK.lock().await;
    let mut m = monitor(&cfg(&[&pg_url(&pg, None)]));
    {
        let _pw = EnvVar::set("PGPASSWORD", Some(&pg.password));
        let r = m.check().await;
        assert_eq!(r.state, DbState::Connected, "{r:?}");
        assert_no_secret(&r, &[&pg.password]);
    }
    let wrong = "wrong-env-Secret";
    let _pw = EnvVar::set("PGPASSWORD", Some(wrong));
    let r = m.check().await;
    assert_eq!(r.state, DbState::Misconfigured, "{r:?}");
    let reason = r.reason.clone().unwrap();
    assert!(
        reason.contains("password authentication failed"),
        "{reason}"
    );
    // Which password was refused: the operator knows where to look.
    assert!(
        reason.contains("the password came from PGPASSWORD"),
        "{reason}"
    );
    assert_no_secret(&r, &[wrong]);
    // A password in the URL wins over the environment.
    let r = monitor(&cfg(&[&pg_url(&pg, Some(&pg.password))]))
        .check()
        .await;
    assert_eq!(r.state, DbState::Connected, "{r:?}");
}

#[tokio::test]
async fn postgres_password_from_file() {
    let pg = started();
    let _env = ENV_LOCK.lock().await;
    let _pw = EnvVar::set("PGPASSWORD", None);
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("db-password");
    std::fs::write(&file, format!("  {}  \nnot-this-line\n", pg.password)).unwrap();
    let c = DatabaseConfig {
        password_file: file.display().to_string(),
        ..cfg(&[&pg_url(&pg, None)])
    };
    let mut m = monitor(&c);
    let r = m.check().await;
    assert_eq!(r.state, DbState::Connected, "{r:?}");
    assert_no_secret(&r, &[&pg.password]);
    // Read on every round: a rotated (here wrong) password shows at once, redacted.
    let wrong = "wrong-file-Secret";
    std::fs::write(&file, format!("{wrong}\n")).unwrap();
    let r = m.check().await;
    assert_eq!(r.state, DbState::Misconfigured, "{r:?}");
    let err = r.databases[0].error.clone().unwrap();
    assert!(
        err.contains(&format!(
            "the password came from database.password_file {}",
            file.display()
        )),
        "{err}"
    );
    assert_no_secret(&r, &[wrong]);
    std::fs::remove_file(&file).unwrap();
    let r = m.check().await;
    let err = r.databases[0].error.clone().unwrap();
    assert!(err.contains("cannot read database.password_file"), "{err}");
}

#[tokio::test]
async fn postgres_and_others_are_all_checked_and_the_worst_wins() {
    let pg = started();
    // Nothing listens there.
    let down = free_port();
    let c = DatabaseConfig {
        url: pg_url(&pg, Some(&pg.password)),
        ..cfg(&[&format!("redis://127.0.0.1:{down}")])
    };
    let r = monitor(&c).check().await;
    assert_eq!(r.state, DbState::Unreachable, "{r:?}");
    let kinds: Vec<DbKind> = r.databases.iter().map(|d| d.kind).collect();
    assert_eq!(kinds, [DbKind::Postgres, DbKind::Redis]);
    let states: Vec<DbState> = r.databases.iter().map(|d| d.state).collect();
    assert_eq!(states, [DbState::Connected, DbState::Unreachable]);
    assert_no_secret(&r, &[&pg.password]);
}

// --- TLS --------------------------------------------------------------------------------------

/// A CA, and a TLS-only PostgreSQL whose certificate it signed for `localhost` alone.
fn tls_postgres() -> (Ca, Postgres) {
    require_root();
    let ca = Ca::new("health-agent test CA");
    let server = ca.server("localhost", &["DNS:localhost"]);
    (ca, Postgres::start_tls(&server))
}

/// The superuser URL of `pg` at `host`, with the password and `query`.
fn pg_tls_url(pg: &Postgres, host: &str, query: &str) -> String {
    format!(
        "postgres://postgres:{}@{host}:{}/postgres?{query}",
        pg.password, pg.port
    )
}

/// One round of the check against `url` (fail_after 1: a failure shows at once).
async fn one_round(url: &str) -> DatabaseReport {
    monitor(&cfg(&[url])).check().await
}

/// One round at `url`, judged with `fail_after = 3`: what is misconfigured says so at once.
async fn first_of_three_rounds(url: &str) -> DatabaseReport {
    monitor(&DatabaseConfig {
        fail_after: 3,
        ..cfg(&[url])
    })
    .check()
    .await
}

/// One round at `url`: misconfigured; the report and its error (printed).
async fn misconfigured(url: &str) -> (DatabaseReport, String) {
    let r = one_round(url).await;
    assert_eq!(r.state, DbState::Misconfigured, "{r:?}");
    let err = error_of(&r);
    (r, err)
}

/// The first database's error, also printed: the words an operator reads.
fn error_of(r: &DatabaseReport) -> String {
    let err = r.databases[0].error.clone().unwrap_or_default();
    eprintln!("{} {:?}: {err}", r.databases[0].name, r.state);
    err
}

#[tokio::test]
async fn postgres_require_and_prefer_connect_over_tls_to_a_hostssl_only_server() {
    let (_ca, pg) = tls_postgres();
    for mode in ["require", "prefer"] {
        let r = one_round(&pg_tls_url(&pg, "127.0.0.1", &format!("sslmode={mode}"))).await;
        assert_eq!(r.state, DbState::Connected, "sslmode={mode}: {r:?}");
        let detail = r.databases[0].detail.clone().unwrap();
        eprintln!("sslmode={mode}: {detail}");
        assert!(
            detail.contains(&format!("over TLSv1_3 ({mode})")),
            "{detail}"
        );
        assert_no_secret(&r, &[&pg.password]);
    }
}

#[tokio::test]
async fn postgres_verify_full_with_the_ca_connects_and_verify_ca_ignores_the_name() {
    let (ca, pg) = tls_postgres();
    // verify-ca checks the chain only: 127.0.0.1 is not a name the certificate carries, and
    // need not be.
    for (host, mode) in [("localhost", "verify-full"), ("127.0.0.1", "verify-ca")] {
        let params = format!("sslmode={mode}&sslrootcert={}", ca.cert.display());
        let r = one_round(&pg_tls_url(&pg, host, &params)).await;
        assert_eq!(r.state, DbState::Connected, "{mode} to {host}: {r:?}");
        let detail = r.databases[0].detail.as_deref().unwrap_or_default();
        assert!(detail.contains(&format!("({mode})")), "{detail}");
    }
}

#[tokio::test]
async fn postgres_verify_full_with_another_ca_is_misconfigured_not_trusted() {
    let (_ca, pg) = tls_postgres();
    let other = Ca::new("some other CA");
    let url = pg_tls_url(
        &pg,
        "localhost",
        &format!("sslmode=verify-full&sslrootcert={}", other.cert.display()),
    );
    // Not damped: a certificate the client does not trust is not an outage, so the first round
    // says so even with fail_after = 3.
    let mut m = monitor(&DatabaseConfig {
        fail_after: 3,
        ..cfg(&[&url])
    });
    let r = m.check().await;
    assert_eq!(r.state, DbState::Misconfigured, "{r:?}");
    let err = error_of(&r);
    assert!(err.contains("certificate is not trusted"), "{err}");
    assert!(err.contains(&other.cert.display().to_string()), "{err}");
    let reason = r.reason.clone().unwrap();
    assert!(
        reason.contains("the TLS settings are in database.urls[0]"),
        "{reason}"
    );
    assert_no_secret(&r, &[&pg.password]);
}

#[tokio::test]
async fn postgres_verify_full_to_an_address_the_certificate_does_not_name_is_a_host_name_mismatch()
{
    let (ca, pg) = tls_postgres();
    let url = pg_tls_url(
        &pg,
        "127.0.0.1",
        &format!("sslmode=verify-full&sslrootcert={}", ca.cert.display()),
    );
    let (r, err) = misconfigured(&url).await;
    assert!(err.contains("host name mismatch"), "{err}");
    assert!(
        err.contains("127.0.0.1") && err.contains("localhost"),
        "{err}"
    );
    assert_no_secret(&r, &[&pg.password]);
}

/// The URL: `sslmode=require`, no password anywhere. The server asks for one inside
/// TLS: misconfigured on the first round (fail_after 3), saying where a password goes.
#[tokio::test]
async fn postgres_require_without_any_password_is_misconfigured_at_once() {
    let (_ca, pg) = tls_postgres();
    let _env = ENV_LOCK.lock().await;
    let _pw = EnvVar::set("PGPASSWORD", None);
    let url = format!(
        "postgres://postgres@localhost:{}/postgres?sslmode=require",
        pg.port
    );
    let r = first_of_three_rounds(&url).await;
    assert_eq!(r.state, DbState::Misconfigured, "{r:?}");
    let err = error_of(&r);
    assert!(
        err.starts_with("the server asks for a password and none is set: put PGPASSWORD=..."),
        "{err}"
    );
}

#[tokio::test]
async fn postgres_sslmode_disable_against_a_hostssl_only_server_is_misconfigured() {
    let (_ca, pg) = tls_postgres();
    let (r, err) = misconfigured(&pg_tls_url(&pg, "127.0.0.1", "sslmode=disable")).await;
    // The server's own words, and what to do.
    assert!(err.contains("no encryption"), "{err}");
    assert!(err.contains("set sslmode=require"), "{err}");
    assert_no_secret(&r, &[&pg.password]);
}

#[tokio::test]
async fn postgres_require_against_a_server_without_tls_is_misconfigured() {
    let pg = started();
    let (_, err) = misconfigured(&format!(
        "postgres://postgres:{}@127.0.0.1:{}/postgres?sslmode=require",
        pg.password, pg.port
    ))
    .await;
    assert!(err.contains("does not accept TLS"), "{err}");
    // prefer falls back to the clear, as libpq does.
    let r = one_round(&pg_url(&pg, Some(&pg.password))).await;
    assert_eq!(r.state, DbState::Connected, "{r:?}");
    assert!(!r.databases[0].detail.as_deref().unwrap().contains("TLS"));
}

#[tokio::test]
async fn postgres_client_certificate_logs_in_without_a_password_and_its_absence_is_misconfigured() {
    require_root();
    let ca = Ca::new("health-agent test CA");
    let server = ca.server("localhost", &["DNS:localhost"]);
    let pg = Postgres::start_tls_client_cert(&server, &ca.cert, "monitor");
    let client = ca.client("monitor");
    let base = format!(
        "postgres://monitor@localhost:{}/postgres?sslmode=verify-full&sslrootcert={}",
        pg.port,
        ca.cert.display()
    );
    let _env = ENV_LOCK.lock().await;
    let _pw = EnvVar::set("PGPASSWORD", None);
    let r = one_round(&format!(
        "{base}&sslcert={}&sslkey={}",
        client.cert.display(),
        client.key.display()
    ))
    .await;
    assert_eq!(r.state, DbState::Connected, "{r:?}");
    // No certificate: the server's `cert` line refuses the login.
    let (_, err) = misconfigured(&base).await;
    assert!(err.contains("requires a valid client certificate"), "{err}");
    assert!(
        err.contains("give database.urls[0] sslcert and sslkey"),
        "{err}"
    );
}

/// A CA, and a TLS-only Redis whose certificate it signed for `localhost` and `127.0.0.1`.
fn tls_redis() -> (Ca, Redis) {
    require_root();
    let ca = Ca::new("health-agent test CA");
    let server = ca.server("localhost", &["DNS:localhost", "IP:127.0.0.1"]);
    let redis = Redis::start_tls(&server, &ca.cert);
    (ca, redis)
}

#[tokio::test]
async fn rediss_connects_with_the_ca_and_is_misconfigured_with_another() {
    let (ca, redis) = tls_redis();
    let url = |host: &str, root: &std::path::Path| {
        format!(
            "rediss://:{}@{host}:{}/0?sslrootcert={}",
            redis.password,
            redis.port,
            root.display()
        )
    };
    for host in ["127.0.0.1", "localhost"] {
        let r = one_round(&url(host, &ca.cert)).await;
        assert_eq!(
            r.state,
            DbState::Connected,
            "{host}: {r:?}\n{}",
            redis.log()
        );
        let detail = r.databases[0].detail.clone().unwrap();
        eprintln!("{host}: {detail}");
        assert!(detail.contains("over TLSv1_3 (verify-full)"), "{detail}");
        assert_no_secret(&r, &[&redis.password]);
    }
    let other = Ca::new("some other CA");
    let (r, err) = misconfigured(&url("127.0.0.1", &other.cert)).await;
    assert!(err.contains("certificate is not trusted"), "{err}");
    assert_no_secret(&r, &[&redis.password]);
    // Plain redis:// to the TLS port: the server hangs up, and a handshake there succeeds.
    let (r, err) = misconfigured(&format!(
        "redis://:{}@127.0.0.1:{}",
        redis.password, redis.port
    ))
    .await;
    assert!(err.contains("use rediss://"), "{err}");
    assert_no_secret(&r, &[&redis.password]);
}

#[tokio::test]
async fn rediss_to_a_redis_without_tls_is_misconfigured() {
    require_root();
    let redis = Redis::start_plain();
    let timeout = Duration::from_secs(2);
    let mut m = monitor(&DatabaseConfig {
        timeout,
        fail_after: 3,
        ..cfg(&[&format!(
            "rediss://:{}@127.0.0.1:{}?sslmode=require",
            redis.password, redis.port
        )])
    });
    let start = Instant::now();
    let r = m.check().await;
    let took = start.elapsed();
    eprintln!("  round took {took:?}");
    assert_eq!(r.state, DbState::Misconfigured, "{r:?}\n{}", redis.log());
    let err = error_of(&r);
    assert!(err.contains("does not speak TLS on this port"), "{err}");
    assert!(took < timeout, "took {took:?}");
    assert_no_secret(&r, &[&redis.password]);
}

/// A frozen path to a TLS database: the kernel completes the proxy's TCP handshakes, nothing
/// more. Two rounds of `timeout` each: the first counts one failure (not misconfigured), the
/// second makes it unreachable; each round ends within the timeout.
async fn frozen_path_is_an_outage(url: &str, proxy: &TcpProxy) {
    let timeout = Duration::from_secs(1);
    let mut m = monitor(&DatabaseConfig {
        fail_after: 2,
        timeout,
        ..cfg(&[url])
    });
    let r = m.check().await;
    assert_eq!(
        r.state,
        DbState::Connected,
        "through the thawed proxy: {r:?}"
    );
    proxy.freeze();
    let mut seen = Vec::new();
    for _ in 0..2 {
        let start = Instant::now();
        let r = m.check().await;
        let took = start.elapsed();
        assert!(
            took < timeout + Duration::from_millis(900),
            "a round took {took:?} with timeout {timeout:?}"
        );
        let err = error_of(&r);
        eprintln!("  round took {took:?}");
        assert!(err.contains("no answer within 1s"), "{err}");
        seen.push(r.state);
    }
    proxy.thaw();
    assert_eq!(seen, [DbState::Connected, DbState::Unreachable], "{url}");
}

#[tokio::test]
async fn a_frozen_tls_path_is_unreachable_after_damping_not_misconfigured() {
    let (ca, pg) = tls_postgres();
    let proxy = TcpProxy::start(pg.port);
    let (password, port, root) = (&pg.password, proxy.port, ca.cert.display());
    let url = format!("postgres://postgres:{password}@localhost:{port}/postgres?sslmode=verify-full&sslrootcert={root}");
    frozen_path_is_an_outage(&url, &proxy).await;

    let (ca, redis) = tls_redis();
    let proxy = TcpProxy::start(redis.port);
    let (password, port, root) = (&redis.password, proxy.port, ca.cert.display());
    let url = format!("rediss://:{password}@127.0.0.1:{port}?sslrootcert={root}");
    frozen_path_is_an_outage(&url, &proxy).await;
}

/// End to end through the agent: a database URL that trusts the wrong CA is 200 `degraded`,
/// `stable`, with a `config_error` alert that names the cause — and it hides no web fault: a
/// stopped backend is still 503.
#[test]
fn untrusted_database_certificate_is_200_misconfigured_with_an_alert_and_hides_no_web_fault() {
    let (_ca, pg) = tls_postgres();
    let other = Ca::new("some other CA");
    let backend = Fixture::start("normal");
    let webhook = Receiver::ok();
    let agent = Agent::start_with_env(
        &format!(
            "[checks]\ninterval = \"500ms\"\nrecover_after = \"1s\"\n[web]\nport = {}\n\
             [heal]\nenabled = false\n\
             [database]\nurl = \"postgres://postgres@localhost:{}/postgres?sslmode=verify-full&sslrootcert={}\"\n\
             interval = \"1s\"\ntimeout = \"2s\"\n[alerts]\nwebhook_url = \"{}\"\n",
            backend.port,
            pg.port,
            other.cert.display(),
            webhook.url("/hook")
        ),
        &[("PGPASSWORD", pg.password.as_str())],
    );
    let wait = Duration::from_secs(40);
    let (code, body) = agent.wait_health(wait, "database misconfigured, web up", |_, b| {
        b["checks"]["database"] == "misconfigured" && b["checks"]["webserver"] == "up"
    });
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["status"], "degraded", "{body}");
    assert_eq!(body["recommendation"], "stable", "{body}");
    // The summary says misconfigured; the details (loopback sees them) say why.
    let why = body["details"]["database"]["reason"].to_string();
    eprintln!("reasons: {} / details: {why}", body["reasons"]);
    assert!(why.contains("certificate is not trusted"), "{body}");
    let alert = health_agent_tests::wait_until(wait, "the config_error alert", || {
        webhook
            .posts()
            .into_iter()
            .find(|p| p.body.to_string().contains("config_error"))
    });
    let alert = alert.body.to_string();
    assert!(alert.contains("certificate is not trusted"), "{alert}");

    backend.signal(libc::SIGSTOP);
    let (code, body) = agent.wait_health(wait, "503 for the stopped backend", |c, _| c == 503);
    backend.signal(libc::SIGCONT);
    assert_eq!(body["status"], "unhealthy", "{body}");
    assert_eq!(body["checks"]["database"], "misconfigured", "{body}");
    assert_eq!(code, 503);
    let text = format!("{body}{alert}{}", agent.logs());
    assert!(!text.contains(&pg.password), "the database password leaked");
}
