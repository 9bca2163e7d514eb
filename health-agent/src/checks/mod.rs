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

use crate::{
    policy::PolicyInput,
    status::{DbState, DiskLevel, Pressure},
};

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

impl Report {
    /// The policy's input from this round. Boot tracking (`web_served`, `warming_up`) is the
    /// runner's to fill in: a one-shot check has no boot.
    pub fn policy_input(&self, in_boot_grace: bool) -> PolicyInput {
        PolicyInput {
            web: self.web.verdict,
            web_detail: self.web.detail.clone(),
            web_stopped: self
                .web
                .processes
                .as_ref()
                .is_some_and(|p| p.frozen.is_some()),
            disk: self.disk.level,
            database: self.database.state,
            containers: self.containers.state,
            pressure: self
                .system
                .as_ref()
                .map_or(Pressure::Normal, |s| s.pressure),
            in_boot_grace,
            ..PolicyInput::default()
        }
    }

    pub fn disk_unknown() -> disk::DiskReport {
        disk::DiskReport {
            level: DiskLevel::Unknown,
            mounts: Vec::new(),
        }
    }
}
