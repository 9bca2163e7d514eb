//! HAProxy's agent-check (`server ... agent-check agent-port P`): on every connection, one line
//! from the cached snapshot, then close. It owns the listener thread and the mapping from a
//! snapshot to that line; nothing is computed per connection beyond formatting it.
//!
//! The line, in HAProxy's agent syntax (configuration.txt, "agent-check"):
//!
//! | snapshot | line |
//! |---|---|
//! | older than `checks.stale_after` (the check loop stopped) | `down #health-agent: no snapshot for Ns ...` |
//! | `unhealthy` (the 503 of `/health`) | `down #<first reason>` |
//! | `booting` with a 503 (the backend has not served yet), `recovering`, `draining` | `drain` |
//! | `healthy`, `degraded`, `booting` with a 200 | `up ready N%` |
//!
//! `up` only undoes a `down` and `ready` only undoes a `drain`: HAProxy lets only the agent
//! revert what the agent set, so a good answer says both. N is [`weight`].

use std::{
    net::SocketAddr,
    sync::Arc,
    time::{Duration, Instant},
};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    sync::Semaphore,
};
use tokio_util::sync::CancellationToken;

use crate::{
    snapshot::{SharedSnapshot, Snapshot},
    status::{Status, WebVerdict},
};

/// Connections answered with a proper goodbye at once; beyond that a connection gets its line
/// written straight from the accept loop and is closed.
const MAX_IN_FLIGHT: usize = 64;
/// A balancer that neither reads its line nor closes is cut off after this.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(2);
/// HAProxy keeps the description for its stats page; a long one helps nobody there.
const MAX_REASON: usize = 160;
/// The lowest weight a healthy instance advertises: 0 % would be a drain, which is `drain`'s
/// job.
const MIN_WEIGHT: u32 = 10;

/// The weight percentage for an instance in rotation, from load pressure.
///
/// Pressure is the higher of CPU and memory use, each averaged over `scaling.window` (a steady
/// figure, so the weight does not flap with every sample): up to 50 % the weight is 100 %, then
/// it falls in a straight line to 10 % at 100 % pressure. A `slow` web backend (answers still go
/// out, but p99 is over `slow_after` or work queues) halves it. Never below 10 %. Unknown CPU
/// or memory counts as no pressure.
pub fn weight(cpu_percent: Option<f64>, memory_percent: Option<f64>, web: WebVerdict) -> u32 {
    let pressure = cpu_percent
        .unwrap_or(0.0)
        .max(memory_percent.unwrap_or(0.0))
        .clamp(0.0, 100.0);
    let mut w = if pressure <= 50.0 {
        100.0
    } else {
        100.0 - (pressure - 50.0) * 1.8
    };
    if web == WebVerdict::Slow {
        w /= 2.0;
    }
    (w.round() as u32).clamp(MIN_WEIGHT, 100)
}

/// The agent's answer for a snapshot `age` old.
pub fn line(snap: &Snapshot, age: Duration, stale_after: Duration) -> String {
    if age > stale_after {
        return format!(
            "down #health-agent: no snapshot for {}s (over checks.stale_after), the check loop stopped\n",
            age.as_secs()
        );
    }
    let decision = &snap.decision;
    match decision.status {
        Status::Unhealthy => {
            let why = decision.reasons.first().map_or("unhealthy", String::as_str);
            format!("down #{}\n", one_line(why))
        }
        Status::Booting if decision.http >= 500 => "drain\n".to_owned(),
        Status::Recovering | Status::Draining => "drain\n".to_owned(),
        Status::Healthy | Status::Degraded | Status::Booting => {
            let system = snap.report.system.as_ref();
            let w = weight(
                system.map(|s| s.cpu_avg_percent),
                system.map(|s| s.memory_avg_percent),
                snap.report.web.verdict,
            );
            format!("up ready {w}%\n")
        }
    }
}

/// A reason as HAProxy's description: printable ASCII on one line, bounded.
fn one_line(reason: &str) -> String {
    let mut out: String = reason
        .chars()
        .map(|c| if c.is_ascii_graphic() { c } else { ' ' })
        .take(MAX_REASON)
        .collect();
    if reason.chars().count() > MAX_REASON {
        out.push_str("...");
    }
    out
}

/// Binds the agent-check port before anything starts, so a taken port fails early.
pub fn bind(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    let listener = std::net::TcpListener::bind(addr)?;
    listener.set_nonblocking(true)?;
    Ok(listener)
}

/// Serves the agent check on its own thread and runtime until `shutdown`: a check loop that
/// stopped (or a busy main runtime) still gets `down` said for it.
pub fn spawn(
    listener: std::net::TcpListener,
    snapshot: SharedSnapshot,
    stale_after: Duration,
    shutdown: CancellationToken,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    std::thread::Builder::new()
        .name("agent-check".into())
        .spawn(move || {
            rt.block_on(async move {
                match TcpListener::from_std(listener) {
                    Ok(l) => serve(l, snapshot, stale_after, shutdown).await,
                    Err(e) => {
                        tracing::error!("the agent-check thread cannot use its listener: {e}")
                    }
                }
            })
        })
}

async fn serve(
    listener: TcpListener,
    snapshot: SharedSnapshot,
    stale_after: Duration,
    shutdown: CancellationToken,
) {
    let slots = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    loop {
        let stream = tokio::select! {
            _ = shutdown.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    tracing::warn!("agent-check accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let snap = snapshot.load();
        let age = Instant::now().saturating_duration_since(snap.created);
        let answer = line(&snap, age, stale_after);
        match slots.clone().try_acquire_owned() {
            Ok(permit) => {
                tokio::spawn(async move {
                    let _permit = permit;
                    let _ = tokio::time::timeout(ANSWER_TIMEOUT, say(stream, &answer)).await;
                });
            }
            // Every slot is held by a client that does not close: answer from here. A short
            // line always fits a fresh socket's send buffer; what the client sent so far is
            // read, so the close is a FIN after the line (later bytes would make it a RST).
            Err(_) => {
                let _ = stream.try_write(answer.as_bytes());
                if let Ok(std) = stream.into_std() {
                    let _ = std.shutdown(std::net::Shutdown::Write);
                    let mut sink = [0u8; 512];
                    while matches!(std::io::Read::read(&mut &std, &mut sink), Ok(n) if n > 0) {}
                }
            }
        }
    }
}

/// Writes the line, then waits for the balancer to close. Closing with its bytes (an
/// `agent-send` string) unread would send a RST, which may discard the line before it is read.
async fn say(mut stream: TcpStream, answer: &str) -> std::io::Result<()> {
    stream.write_all(answer.as_bytes()).await?;
    stream.shutdown().await?;
    let mut sink = [0u8; 512];
    while stream.read(&mut sink).await? > 0 {}
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        checks::{
            disk::DiskReport, system::SystemReport, web::WebReport, ContainersReport,
            DatabaseReport, Report,
        },
        heal::HealLog,
        policy::Decision,
        status::{DiskLevel, Pressure, Recommendation},
    };
    use arc_swap::ArcSwap;

    fn snap(status: Status, http: u16, reasons: &[&str], cpu: f64, web: WebVerdict) -> Snapshot {
        let mut report = Report {
            web: WebReport::not_configured(),
            disk: DiskReport {
                level: DiskLevel::Ok,
                mounts: Vec::new(),
            },
            system: Some(SystemReport {
                cpu_percent: cpu,
                memory_percent: 20.0,
                cpu_avg_percent: cpu,
                memory_avg_percent: 20.0,
                cpu_high: false,
                memory_high: false,
                window_seconds: 60.0,
                load1: 0.0,
                load5: 0.0,
                cpus: 2,
                memory_total_bytes: 1 << 30,
                memory_available_bytes: 1 << 29,
                pressure: Pressure::Normal,
            }),
            containers: ContainersReport::not_configured(),
            database: DatabaseReport::not_configured(),
        };
        report.web.verdict = web;
        Snapshot::new(
            Decision {
                status,
                http,
                recommendation: Recommendation::Stable,
                reasons: reasons.iter().map(|r| r.to_string()).collect(),
                faults: Vec::new(),
                shared_dependency: false,
                erroring_alone: false,
            },
            report,
            HealLog::default(),
            1,
            1,
        )
    }

    #[test]
    fn weight_falls_with_pressure_and_halves_when_slow() {
        use WebVerdict::*;
        let table = [
            (None, None, Up, 100),
            (Some(10.0), Some(30.0), Up, 100),
            (Some(50.0), Some(20.0), Up, 100),
            (Some(75.0), Some(20.0), Up, 55),
            (Some(20.0), Some(75.0), Up, 55),
            (Some(100.0), Some(20.0), Up, 10),
            (Some(250.0), None, Up, 10),
            (Some(10.0), Some(10.0), Slow, 50),
            (Some(75.0), Some(10.0), Slow, 28),
            (Some(100.0), Some(100.0), Slow, 10),
            (Some(10.0), Some(10.0), Waiting, 100),
        ];
        for (cpu, memory, web, want) in table {
            assert_eq!(weight(cpu, memory, web), want, "{cpu:?} {memory:?} {web:?}");
        }
    }

    #[test]
    fn line_follows_the_status() {
        use Status::*;
        let fresh = Duration::from_millis(300);
        let stale = Duration::from_secs(10);
        let cases = [
            (
                Healthy,
                200,
                &[][..],
                10.0,
                WebVerdict::Up,
                "up ready 100%\n",
            ),
            (
                Degraded,
                200,
                &["cpu high"][..],
                75.0,
                WebVerdict::Up,
                "up ready 55%\n",
            ),
            (
                Degraded,
                200,
                &[][..],
                10.0,
                WebVerdict::Slow,
                "up ready 50%\n",
            ),
            (Booting, 503, &[][..], 10.0, WebVerdict::Unknown, "drain\n"),
            (
                Booting,
                200,
                &[][..],
                10.0,
                WebVerdict::Up,
                "up ready 100%\n",
            ),
            (Recovering, 200, &[][..], 10.0, WebVerdict::Down, "drain\n"),
            (
                Unhealthy,
                503,
                &["web server hung:\n7 connections wait", "disk"][..],
                10.0,
                WebVerdict::Hung,
                "down #web server hung: 7 connections wait\n",
            ),
            (
                Unhealthy,
                503,
                &[][..],
                10.0,
                WebVerdict::Down,
                "down #unhealthy\n",
            ),
        ];
        for (status, http, reasons, cpu, web, want) in cases {
            assert_eq!(
                line(&snap(status, http, reasons, cpu, web), fresh, stale),
                want,
                "{status:?} {http}"
            );
        }
    }

    #[test]
    fn a_stale_snapshot_is_down_whatever_it_says() {
        let s = snap(Status::Healthy, 200, &[], 10.0, WebVerdict::Up);
        let l = line(&s, Duration::from_secs(12), Duration::from_secs(10));
        assert!(
            l.starts_with("down #health-agent: no snapshot for 12s"),
            "{l}"
        );
        assert!(l.ends_with('\n') && l.matches('\n').count() == 1, "{l}");
    }

    #[test]
    fn a_long_reason_is_cut_to_one_bounded_line() {
        let long = "x".repeat(1000);
        let l = line(
            &snap(Status::Unhealthy, 503, &[&long], 10.0, WebVerdict::Hung),
            Duration::ZERO,
            Duration::from_secs(10),
        );
        assert_eq!(l.len(), "down #".len() + MAX_REASON + "...\n".len());
    }

    /// Reads one answer the way HAProxy does: connect, send `agent-send` if any, read until
    /// the agent closes.
    async fn ask_sending(addr: SocketAddr, agent_send: &[u8]) -> String {
        let mut s = TcpStream::connect(addr).await.expect("connect");
        s.write_all(agent_send).await.expect("agent-send");
        let mut out = String::new();
        tokio::time::timeout(Duration::from_secs(2), s.read_to_string(&mut out))
            .await
            .expect("the agent closes after one line")
            .expect("read");
        out
    }

    async fn ask(addr: SocketAddr) -> String {
        ask_sending(addr, b"be_web/srv1\n").await
    }

    #[tokio::test]
    async fn answers_each_connection_from_the_cached_snapshot_and_a_stuck_client_blocks_nobody() {
        let listener = bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = listener.local_addr().unwrap();
        let shared: SharedSnapshot = Arc::new(ArcSwap::from_pointee(snap(
            Status::Healthy,
            200,
            &[],
            10.0,
            WebVerdict::Up,
        )));
        let shutdown = CancellationToken::new();
        let thread = spawn(
            listener,
            shared.clone(),
            Duration::from_millis(600),
            shutdown.clone(),
        )
        .unwrap();

        assert_eq!(ask(addr).await, "up ready 100%\n");
        // Clients that connect and never read or close do not hold up the next one, even once
        // they hold every slot.
        let mut stuck = Vec::new();
        for _ in 0..MAX_IN_FLIGHT + 8 {
            stuck.push(TcpStream::connect(addr).await.unwrap());
        }
        assert_eq!(ask_sending(addr, b"").await, "up ready 100%\n");
        drop(stuck);
        tokio::time::sleep(Duration::from_millis(100)).await;

        shared.store(Arc::new(snap(
            Status::Unhealthy,
            503,
            &["web server hung"],
            10.0,
            WebVerdict::Hung,
        )));
        assert_eq!(ask(addr).await, "down #web server hung\n");

        // Nobody replaces the snapshot: it goes stale, and the answer with it.
        tokio::time::sleep(Duration::from_millis(700)).await;
        let stale = ask(addr).await;
        assert!(
            stale.starts_with("down #health-agent: no snapshot"),
            "{stale}"
        );

        shutdown.cancel();
        tokio::task::spawn_blocking(move || thread.join())
            .await
            .unwrap()
            .expect("the agent-check thread ends on shutdown");
    }
}
