//! The database check against a real PostgreSQL: password from the URL, `PGPASSWORD` or
//! `database.password_file`, a wrong password as a configuration error, every database checked
//! with the worst deciding. Each test starts its own private server (`Postgres`, root needed
//! for `runuser`), so the library's unit tests need no PostgreSQL at all; Redis and MySQL are
//! tested there against in-process fakes.

use std::time::Duration;

use health_agent::{
    checks::{
        database::{DatabaseMonitor, DbKind},
        DatabaseReport,
    },
    config::DatabaseConfig,
    status::DbState,
};
use health_agent_tests::{free_port, require_root, Postgres};

fn cfg(urls: &[&str]) -> DatabaseConfig {
    DatabaseConfig {
        urls: urls.iter().map(|u| u.to_string()).collect(),
        fail_after: 1,
        recover_after: 1,
        // A busy machine must not turn a good round trip "slow".
        slow_after: Duration::from_secs(30),
        ..DatabaseConfig::default()
    }
}

fn monitor(c: &DatabaseConfig) -> DatabaseMonitor {
    DatabaseMonitor::new(c)
        .expect("valid database config")
        .expect("a database is configured")
}

/// Fails if any secret shows in the report (names, errors, reasons: all of its JSON).
fn assert_no_secret(r: &DatabaseReport, secrets: &[&str]) {
    let json = serde_json::to_string(r).expect("report serialises");
    for s in secrets {
        assert!(!json.contains(s), "secret {s:?} leaked into {json}");
    }
}

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
    assert!(r
        .reason
        .as_deref()
        .unwrap()
        .contains("password authentication failed"));
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
