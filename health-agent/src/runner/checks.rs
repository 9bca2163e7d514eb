//! One wiring of every check, used by `serve` (`runner::start` runs them on their cadences)
//! and by `health-agent check` (`oneshot::run` runs each once): the web monitor on the kernel
//! view loaded here, the system sampler, the Docker client, the database monitor and the fleet
//! exchange. A check that cannot be built says why; each caller decides what that means for
//! its report.

use std::sync::Arc;

use crate::{
    checks::{
        database::DatabaseMonitor,
        disk::{self, DiskReport},
        probe::ProbeLedger,
        system::SystemMonitor,
        web::{load_kernel, PortWatch, WebMonitor},
    },
    config::{Config, DatabaseConfig, DiskConfig, WebConfig},
    engine::{self, Engine},
    fleet::exchange::Exchange,
};

/// How the checks will run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// On their cadences, for as long as the agent runs: the kernel view, damping, peers.
    Serve,
    /// Each once (`health-agent check`): no history, so no kernel view, no damping of the
    /// database's answers, and no peers to ask.
    Once,
}

/// The database check as configured.
pub enum Database {
    NotConfigured,
    /// The URLs do not parse (config validation refuses them; only a hand-built `Config`
    /// gets here).
    Broken(String),
    On(DatabaseMonitor),
}

pub struct Checks {
    /// The judge of the web backend, and the watching of its port.
    pub web: (WebMonitor, PortWatch),
    /// The probe's ledger: written by the probe task, read by the port's watching and the drain.
    pub probes: ProbeLedger,
    pub system: SystemMonitor,
    /// For the container check, `web.container` and container restarts; None when nothing
    /// needs a container engine or its client could not be made (`engine_error` then says why).
    pub engine: Option<Engine>,
    pub engine_error: Option<crate::engine::EngineError>,
    pub database: Database,
    /// The peers' views (`fleet`), serve only.
    pub fleet: Option<Arc<Exchange>>,
    /// Why the fleet exchange could not be made.
    pub fleet_error: Option<crate::fleet::exchange::DiscoveryError>,
    /// The fleet key as read at start (`[fleet]` configured, serve only).
    pub fleet_key: Option<crate::fleet::key::FleetKey>,
}

impl Checks {
    /// Builds every check `cfg` configures. In `Mode::Serve` this loads the kernel programs.
    pub fn build(cfg: &Config, mode: Mode) -> Self {
        let web_cfg = match mode {
            Mode::Serve => cfg.web.clone(),
            // The kernel view needs history.
            Mode::Once => WebConfig {
                kernel: false,
                ..cfg.web.clone()
            },
        };
        let (kernel, kernel_status) = load_kernel(&web_cfg);
        let probes = ProbeLedger::default();
        let web = (
            WebMonitor::new(web_cfg.clone()),
            PortWatch::new(web_cfg, kernel, kernel_status, probes.clone()),
        );

        let (engine, engine_error) = if wants_engine(cfg) {
            match Engine::connect(
                &engine_address(cfg),
                &cfg.containers.containerd_namespaces,
                cfg.checks.timeout,
            ) {
                Ok(d) => (Some(d), None),
                Err(e) => (None, Some(e)),
            }
        } else {
            (None, None)
        };

        let db_cfg = match mode {
            Mode::Serve => cfg.database.clone(),
            // One round trip per database decides: there is no history to damp here.
            Mode::Once => DatabaseConfig {
                fail_after: 1,
                recover_after: 1,
                ..cfg.database.clone()
            },
        };
        let database = match DatabaseMonitor::new(&db_cfg) {
            Ok(Some(m)) => Database::On(m),
            Ok(None) => Database::NotConfigured,
            Err(e) => Database::Broken(e.to_string()),
        };

        // The key is read once, here: the exchange proves its asks with it, the server its
        // answers (`runner::Agent::fleet_key`).
        let fleet_key = (mode == Mode::Serve && cfg.fleet.enabled())
            .then(|| crate::fleet::key::FleetKey::load(&cfg.fleet));
        let (fleet, fleet_error) = match &fleet_key {
            Some(key) => match Exchange::new(&cfg.fleet, cfg.server.listen, key.clone()) {
                Ok(e) => (Some(Arc::new(e)), None),
                Err(e) => (None, Some(e)),
            },
            None => (None, None),
        };

        Self {
            web,
            probes,
            system: SystemMonitor::new(cfg.scaling.clone()),
            engine,
            engine_error,
            database,
            fleet,
            fleet_error,
            fleet_key,
        }
    }
}

/// The container engine `[containers]` names or the host has.
pub fn engine_address(cfg: &Config) -> engine::Address {
    engine::address(
        &cfg.containers.docker_host,
        &cfg.containers.containerd_socket,
    )
}

/// Whether any check or restart needs a container engine's client.
fn wants_engine(cfg: &Config) -> bool {
    containers_wanted(cfg) || !cfg.web.container.is_empty()
}

/// Whether the container check is configured.
pub fn containers_wanted(cfg: &Config) -> bool {
    !cfg.containers.names.is_empty() || !cfg.containers.labels.is_empty()
}

/// Whether the probe is configured.
pub fn probe_wanted(cfg: &Config) -> bool {
    cfg.web.port != 0 && !cfg.web.probe_path.is_empty()
}

/// One disk round, off the async threads (a dead NFS mount blocks its thread, not them).
pub async fn check_disk(cfg: DiskConfig) -> DiskReport {
    tokio::task::spawn_blocking(move || disk::check(&cfg))
        .await
        .unwrap_or_else(|_| DiskReport::unknown())
}
