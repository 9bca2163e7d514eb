//! The checks. Each produces a serialisable report; `Report` is one round of all of them,
//! the input of the policy and the body of `/health`.

pub mod containers;
pub mod database;
pub mod disk;
pub mod probe;
pub mod system;
pub mod web;

use serde::Serialize;

pub use containers::{ContainerInfo, ContainersReport};

use crate::status::DbState;

/// Database slot: filled by the database check when `database.url` or `database.urls` is set.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct DatabaseReport {
    /// The worst of `databases` (unreachable > slow > unknown > connected).
    pub state: DbState,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub databases: Vec<database::DatabaseEntry>,
}

impl DatabaseReport {
    pub fn not_configured() -> Self {
        Self {
            state: DbState::NotConfigured,
            reason: None,
            databases: Vec::new(),
        }
    }

    /// The seed's `checks.database`.
    pub fn summary(&self) -> &'static str {
        self.state.as_str()
    }
}

/// One round of every check.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Report {
    pub web: web::WebReport,
    pub disk: disk::DiskReport,
    pub system: Option<system::SystemReport>,
    pub containers: ContainersReport,
    pub database: DatabaseReport,
}
