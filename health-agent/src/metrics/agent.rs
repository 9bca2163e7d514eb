//! The agent itself: what runs (`health_agent_build_info`) and its process (`process_*`).

use super::{Out, Snapshot, SocketTracing};

/// What runs: 1, with the version, commit, kernel tier and `web.socket_tracing` as labels.
pub(super) fn build_info(o: &mut Out, s: &Snapshot, socket_tracing: SocketTracing) {
    let tier = s.report.web.kernel.tier.map_or("none", |t| t.as_str());
    let tracing = match socket_tracing {
        SocketTracing::Always => "always",
        SocketTracing::OnSuspicion => "on_suspicion",
    };
    o.labeled(
        "build_info",
        "The agent that runs: version, commit, kernel view tier, web.socket_tracing",
        vec![(
            vec![
                ("version", env!("CARGO_PKG_VERSION").to_string()),
                ("commit", env!("HEALTH_AGENT_COMMIT").to_string()),
                ("kernel_tier", tier.to_string()),
                ("socket_tracing", tracing.to_string()),
            ],
            1.0,
        )],
    );
}

/// The agent's own process, named as every client library names it (no prefix).
pub(super) fn process_metrics(o: &mut Out) {
    let Some(p) = super::process::read() else {
        return;
    };
    o.float_counter(
        "process_cpu_seconds",
        "Total user and system CPU time spent in seconds",
        p.cpu_seconds,
    );
    o.gauge(
        "process_resident_memory_bytes",
        "Resident memory size in bytes",
        p.resident_bytes,
    );
    let optional = [
        (
            "process_open_fds",
            "Number of open file descriptors",
            p.open_fds,
        ),
        (
            "process_max_fds",
            "Maximum number of open file descriptors",
            p.max_fds,
        ),
        (
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds",
            p.start_time,
        ),
    ];
    for (name, help, v) in optional {
        if let Some(v) = v {
            o.gauge(name, help, v);
        }
    }
}
