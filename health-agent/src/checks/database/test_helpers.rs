//! Test helpers shared by this module's unit tests and the integration tests against real
//! servers: `tests/tests/database.rs` includes this file by path, since neither may see the
//! other's code. The includer brings the database types into scope.

use std::time::Duration;

use super::{DatabaseConfig, DatabaseMonitor, DatabaseReport};

pub(crate) fn cfg(urls: &[&str]) -> DatabaseConfig {
    DatabaseConfig {
        urls: urls.iter().map(|u| u.to_string()).collect(),
        fail_after: 1,
        recover_after: 1,
        // Only a test that wants "slow" lowers it: a busy machine must not turn a good round
        // trip slow.
        slow_after: Duration::from_secs(30),
        ..DatabaseConfig::default()
    }
}

pub(crate) fn monitor(c: &DatabaseConfig) -> DatabaseMonitor {
    DatabaseMonitor::new(c)
        .expect("valid database config")
        .expect("a database is configured")
}

/// Fails if any secret shows in the report (names, errors, reasons: all of its JSON).
pub(crate) fn assert_no_secret(r: &DatabaseReport, secrets: &[&str]) {
    let json = serde_json::to_string(r).expect("report serialises");
    for s in secrets {
        assert!(!json.contains(s), "secret {s:?} leaked into {json}");
    }
}
