//! The `health-agent` binary: parse the command line, load the config, start.
#![forbid(unsafe_code)]

use std::{path::PathBuf, process::ExitCode, sync::Arc};

use anyhow::Context as _;
use clap::{ArgGroup, Parser, Subcommand};
use health_agent::{
    agent_check, alerts,
    config::{self, Config},
    drain, logging, oneshot, runner, sd_notify, server,
};
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

/// The static (musl) build runs on mimalloc: musl's own malloc serialises the runtime's threads
/// and costs up to a quarter of `/health` throughput (docs/BENCHMARKS.md, section 1). The glibc
/// build keeps glibc's.
#[cfg(target_env = "musl")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Node health agent: an honest GET /health for the load balancer, from eBPF and local checks.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    /// Config file (TOML) [default: /etc/health-agent/health-agent.toml], with the drop-ins
    /// conf.d/*.toml beside it merged over it in name order. A missing file at the default path
    /// means all defaults. Before or after the command.
    // Global, so `serve --config F` and `--config F serve` mean the same. An Option, so that
    // `config --dump` (the built-in defaults) and `config --validate FILE` can refuse a
    // second, contradicting file instead of ignoring it.
    #[arg(long, global = true, value_name = "FILE")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the daemon: background checks and the HTTP server.
    Serve,
    /// Run every check once and print the verdict. Exit code 0 healthy/degraded, 1 a 503
    /// (unhealthy, or a drain kept on disk), 2 error.
    Check {
        /// Print the answer as JSON, in the shape of `/health` with details (`status`, `checks`,
        /// `recommendation`, `reasons`, `details`...), instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Print the documented default config or the effective one, or validate a file.
    #[command(group(ArgGroup::new("action").required(true).args(["dump", "effective", "validate"])))]
    Config {
        /// Print the full default configuration, commented (reads no file).
        #[arg(long)]
        dump: bool,
        /// Print the configuration the agent runs with: --config and its conf.d/ drop-ins
        /// merged, as TOML, secrets hidden.
        #[arg(long)]
        effective: bool,
        /// Validate FILE (default: --config) and its conf.d/ drop-ins; exit 0 (valid) or 2
        /// (invalid).
        #[arg(long, value_name = "FILE", num_args = 0..=1)]
        validate: Option<Option<PathBuf>>,
    },
    /// Alert destinations ([alerts] in the config).
    Alert {
        #[command(subcommand)]
        command: AlertCommand,
    },
    /// Take this instance out of the load balancer and wait until the kernel shows nothing
    /// new reaching the web backend and nothing in flight. /health answers 503 `draining`
    /// until `undrain`. Exit code 0 drained, 1 timed out (what still arrives is named), 2
    /// error. Root only ([drain] control_socket).
    Drain {
        /// Give up after this long (exit 1); the instance stays drained.
        #[arg(long, default_value = "120s", value_parser = humantime::parse_duration)]
        timeout: std::time::Duration,
        /// Drained once no new request or connection has reached the backend for this long
        /// and none is in flight. Make it at least the balancer's check interval.
        #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
        quiet: std::time::Duration,
    },
    /// End a drain: /health answers 200 again once the web backend answers. Exit code 0, 2
    /// error.
    Undrain,
}

#[derive(Subcommand)]
enum AlertCommand {
    /// Send one test message to every configured destination. Exit code 0 all ok, 1 any
    /// failed, 2 none configured.
    Test,
}

fn main() -> ExitCode {
    #[cfg(target_env = "musl")]
    health_agent::sys::tune_mimalloc();
    let cli = Cli::parse();
    let (format, bad_format) =
        match logging::Format::parse(std::env::var(logging::FORMAT_VAR).ok().as_deref()) {
            Ok(f) => (f, None),
            Err(e) => (logging::Format::Text, Some(e)),
        };
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_env("HEALTH_AGENT_LOG").unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        // Colour only for a person at a terminal: the journal and log files get plain text.
        .with_ansi(
            format == logging::Format::Text && std::io::IsTerminal::is_terminal(&std::io::stderr()),
        )
        .event_format(logging::Lines::new(format, logging::stderr_is_journal()))
        .init();
    if let Some(e) = bad_format {
        tracing::error!("{e}");
    }
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("health-agent: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let given = cli.config.clone();
    let path = given
        .clone()
        .unwrap_or_else(|| PathBuf::from(config::DEFAULT_PATH));
    match cli.command {
        Command::Config { dump: true, .. } => {
            if let Some(file) = given {
                anyhow::bail!(
                    "config --dump prints the built-in defaults and reads no file; to see {} \
                     with its drop-ins, use config --effective",
                    file.display()
                );
            }
            print!("{}", config::DEFAULT_TOML);
            Ok(ExitCode::SUCCESS)
        }
        Command::Config {
            validate: Some(file),
            ..
        } => {
            let file = match (file, given) {
                (Some(f), Some(g)) if f != g => anyhow::bail!(
                    "two files to validate: --validate {} and --config {}; give one",
                    f.display(),
                    g.display()
                ),
                (Some(f), _) => f,
                (None, _) => path,
            };
            let loaded = Config::load_all(&file)?;
            println!("{}: valid", loaded.describe());
            // Valid either way: without the key the agent still starts and judges alone. But a
            // key file another user may read, or a variable not set, is worth saying here.
            match oneshot::fleet_key(&loaded.config) {
                Some(k) if k.held() => println!("{}", k.describe()),
                Some(k) => eprintln!("warning: {}", k.describe()),
                None => {}
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Config { .. } => {
            // --effective: the group makes one of the three required.
            print!("{}", Config::load_all(&path)?.effective_toml()?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Check { json } => {
            let loaded = Config::load_all(&path)?;
            let rt = runtime()?;
            let snap = rt.block_on(oneshot::run(&loaded.config));
            let fleet = oneshot::fleet_key(&loaded.config).map(|k| k.describe());
            if json {
                println!("{}", oneshot::json(&snap));
                for note in &loaded.from_env.notes {
                    eprintln!("hint: {note}");
                }
                if let Some(f) = &fleet {
                    eprintln!("fleet: {f}");
                }
            } else {
                print!("{}", oneshot::table(&snap.decision, &snap.report));
                if let Some(f) = &fleet {
                    println!("{:<15} {f}", "fleet");
                }
                print!("{}", oneshot::environment_rows(&loaded.from_env));
                print!("{}", rt.block_on(oneshot::aws_rows(&loaded.config)));
            }
            Ok(ExitCode::from(if snap.decision.http >= 500 {
                1
            } else {
                0
            }))
        }
        Command::Alert {
            command: AlertCommand::Test,
        } => {
            let loaded = Config::load_all(&path)?;
            let cfg = &loaded.config;
            let rt = runtime()?;
            let results = rt.block_on(alerts::send_test(&cfg.alerts, &alerts::hostname()));
            if results.is_empty() {
                eprintln!("{}", alerts::none_configured(&cfg.alerts));
                return Ok(ExitCode::from(2));
            }
            // Where each destination's secret came from, never the secret.
            for source in &loaded.from_env.secrets {
                let alerting =
                    source.secret.starts_with("alerts.") || source.env_key.starts_with("alerts.");
                if alerting && source.origin != config::Origin::Unset {
                    println!("{}", source.describe());
                }
            }
            for (destination, result) in &results {
                match result {
                    Ok(()) => println!("{destination}: ok"),
                    Err(e) => println!("{destination}: failed: {e}"),
                }
            }
            let all_ok = results.iter().all(|(_, r)| r.is_ok());
            Ok(ExitCode::from(if all_ok { 0 } else { 1 }))
        }
        Command::Drain { timeout, quiet } => {
            let cfg = Config::load(&path)?;
            let request = drain::control::Request::Drain {
                quiet_ms: quiet.as_millis() as u64,
                timeout_ms: timeout.as_millis() as u64,
            };
            control(&cfg, &request)
        }
        Command::Undrain => {
            let cfg = Config::load(&path)?;
            control(&cfg, &drain::control::Request::Undrain)
        }
        Command::Serve => {
            let loaded = Config::load_all(&path)?;
            // Which files made the configuration (a drop-in a tool wrote shows here), and the
            // kernel view this kernel offers: the first line says where the judgement stands.
            tracing::info!(
                "configuration: {}; {}{}",
                loaded.describe(),
                health_agent::oneshot::tier_line(&loaded.config.web),
                health_agent::oneshot::fleet_key(&loaded.config)
                    .map(|k| format!("; {}", k.describe()))
                    .unwrap_or_default()
            );
            let from_env: Vec<String> = loaded
                .from_env
                .secrets
                .iter()
                .filter(|s| s.origin != config::Origin::Unset)
                .map(|s| s.describe())
                .collect();
            if !from_env.is_empty() {
                tracing::info!("secrets: {}", from_env.join("; "));
            }
            for note in &loaded.from_env.notes {
                tracing::warn!("{note}");
            }
            let cfg = Arc::new(loaded.config);
            // The background checks are light and mostly waiting: one thread is plenty, and it
            // wakes fewer threads per tick than a work-stealing pool. HTTP has its own threads.
            let rt = runtime()?;
            rt.block_on(serve(cfg))?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// `drain` and `undrain`: the request to the agent, its progress lines as they come, then
/// its answer; the exit code from that answer.
fn control(cfg: &Config, request: &drain::control::Request) -> anyhow::Result<ExitCode> {
    use drain::control::ReplyKind;
    let reply = drain::control::request(&cfg.drain.control_socket, request, |r| match r.kind {
        ReplyKind::Warning => eprintln!("warning: {}", r.message),
        _ => println!("{}", r.message),
    })?;
    match reply.kind {
        ReplyKind::Drained | ReplyKind::Undrained | ReplyKind::NotDraining => {
            println!("{}", reply.message);
            Ok(ExitCode::SUCCESS)
        }
        ReplyKind::TimedOut => {
            println!("{}", reply.message);
            Ok(ExitCode::from(1))
        }
        _ => anyhow::bail!("{}", reply.message),
    }
}

/// Every command runs on one current-thread runtime: the work is light and mostly waiting.
fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}

async fn serve(cfg: Arc<Config>) -> anyhow::Result<()> {
    let shutdown = CancellationToken::new();
    spawn_signal_handler(shutdown.clone())?;
    let threads = match cfg.server.threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    };
    // Before anything opens a file: a flood on the health port must not leave the checks
    // without descriptors.
    let max_connections = connection_cap(&cfg);
    let (listeners, agent_check_listener) = bind_ports(&cfg, threads)?;
    let token = details_token(&cfg);
    warn_when_nothing_is_watched(&cfg);
    let agent = runner::start(cfg.clone(), shutdown.clone()).await;
    let _lifecycle = drain::lifecycle::spawn(&cfg.drain, agent.drain.clone(), shutdown.clone());
    let control = spawn_control_socket(&cfg, &agent.drain, &shutdown);
    let app = Arc::new(server::App {
        snapshot: agent.snapshot.clone(),
        details: cfg.server.details,
        token,
        stale_after: cfg.checks.stale_after,
        fleet_access: server::FleetAccess::of(agent.fleet_key.as_ref()),
        fresh_gate: server::FreshGate::new(cfg.fleet.interval),
        host: health_agent::alerts::hostname(),
        witness: agent.witness.clone(),
        socket_tracing: cfg.web.socket_tracing,
    });
    tracing::info!(listen = %cfg.server.listen, web_port = cfg.web.port, "serving /health");
    let limits = server::Limits {
        slots: Arc::new(tokio::sync::Semaphore::new(max_connections)),
        clients: Arc::new(server::Clients::new(cfg.server.max_connections_per_client)),
        header_timeout: cfg.server.request_timeout,
    };
    let mut threads = server::run_threads(listeners, server::router(app), limits, shutdown.clone())
        .context("starting the HTTP threads")?;
    if let Some(listener) = agent_check_listener {
        tracing::info!(listen = %cfg.server.agent_check_listen, "serving the HAProxy agent check");
        threads.push(
            agent_check::spawn(
                listener,
                agent.snapshot.clone(),
                cfg.checks.stale_after,
                shutdown.clone(),
            )
            .context("starting the agent-check thread")?,
        );
    }
    // The first snapshot exists (runner::start) and both ports answer: ready for systemd.
    match sd_notify::notify("READY=1\nSTATUS=serving /health") {
        Ok(true) => tracing::info!("told systemd we are ready"),
        Ok(false) => {}
        Err(e) => tracing::warn!("telling systemd we are ready failed: {e}"),
    }
    shutdown.cancelled().await;
    let _ = sd_notify::notify("STOPPING=1");
    tokio::task::spawn_blocking(move || {
        for t in threads {
            let _ = t.join();
        }
    })
    .await
    .context("joining the HTTP threads")?;
    // Wait for the composer so the kernel programs are detached before exit.
    let _ = agent.composer.await;
    if let Some(c) = control {
        let _ = c.await;
    }
    tracing::info!("stopped");
    Ok(())
}

/// Raises the open-files limit and returns `server.max_connections`, lowered (with a warning)
/// to what that limit leaves once the checks' descriptors are reserved.
fn connection_cap(cfg: &Config) -> usize {
    let open_files = match health_agent::sys::raise_open_files_limit() {
        Ok(n) => n,
        Err(e) => {
            tracing::warn!("cannot read or raise the open-files limit: {e}");
            1024
        }
    };
    let max_connections = server::connection_cap(cfg.server.max_connections, open_files);
    if max_connections < cfg.server.max_connections {
        tracing::warn!(
            "server.max_connections lowered from {} to {max_connections}: the open-files limit \
             is {open_files} and {} stay reserved for the checks (raise LimitNOFILE)",
            cfg.server.max_connections,
            server::RESERVED_FDS
        );
    }
    max_connections
}

/// The health port (one listener per thread) and, when configured, the HAProxy agent check's.
fn bind_ports(
    cfg: &Config,
    threads: usize,
) -> anyhow::Result<(Vec<std::net::TcpListener>, Option<std::net::TcpListener>)> {
    let listeners = server::bind(cfg.server.listen, threads).with_context(|| {
        format!(
            "binding {} failed — is another process using the port? Change server.listen",
            cfg.server.listen
        )
    })?;
    let agent_check_listener = cfg
        .server
        .agent_check_addr()
        .map(|addr| {
            agent_check::bind(addr).with_context(|| {
                format!(
                    "binding the agent check on {addr} failed — is another process using the \
                     port? Change server.agent_check_listen"
                )
            })
        })
        .transpose()?;
    Ok((listeners, agent_check_listener))
}

/// The token that opens full diagnostics (`server.details = "token"`), if one is set.
fn details_token(cfg: &Config) -> Option<String> {
    match cfg.server.details {
        config::Details::Token => {
            let t = std::env::var(&cfg.server.token_env)
                .ok()
                .filter(|t| !t.is_empty());
            if t.is_none() {
                tracing::warn!(
                    "server.details = \"token\" but {} is empty: nobody gets full diagnostics",
                    cfg.server.token_env
                );
            }
            t
        }
        _ => None,
    }
}

fn warn_when_nothing_is_watched(cfg: &Config) {
    if cfg.web.port == 0 && cfg.containers.names.is_empty() && cfg.containers.labels.is_empty() {
        tracing::warn!(
            "web.port is 0 and no containers are configured: nothing this instance serves is \
             watched, so /health answers 200 degraded, never healthy; set web.port to the \
             backend's listen port (in the config file or a conf.d/ drop-in)"
        );
    } else if cfg.web.port == 0 {
        tracing::warn!(
            "web.port is 0: no web backend is watched, so /health vouches only for disk, \
             containers, database and load; set web.port to the backend's listen port"
        );
    }
}

/// The drain's control socket: /health does not depend on it, so a socket that cannot be
/// bound is an error in the log, not a reason to stop serving.
fn spawn_control_socket(
    cfg: &Config,
    drain: &drain::Drain,
    shutdown: &CancellationToken,
) -> Option<tokio::task::JoinHandle<()>> {
    let control_path = cfg.drain.control_socket.clone();
    match drain::control::bind(&control_path) {
        Ok(listener) => drain::control::spawn(
            listener,
            control_path.clone(),
            drain.clone(),
            shutdown.clone(),
        )
        .map_err(|e| tracing::error!("the drain control socket: {e}"))
        .ok(),
        Err(e) => {
            tracing::error!(
                "cannot bind the drain control socket {}: {e}; `health-agent drain` will not \
                 reach this agent (set [drain] control_socket)",
                control_path.display()
            );
            None
        }
    }
}

fn spawn_signal_handler(token: CancellationToken) -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
            _ = int.recv() => tracing::info!("SIGINT: shutting down"),
        }
        token.cancel();
    });
    Ok(())
}
