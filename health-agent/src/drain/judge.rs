//! When a drain is done, and how that is said: `judge` (drained, timed out or not yet), the
//! command's progress line, and `details.drain`.

use std::{
    net::IpAddr,
    time::{Duration, Instant},
};

use serde::{Deserialize, Serialize};

use super::{Progress, RECENT};

/// Where a drain stands, as a command or the hook waits for it.
#[derive(Debug, Clone, PartialEq)]
pub enum Judgement {
    Draining,
    /// Nothing new for `quiet` and nothing in flight.
    Drained(String),
    /// `timeout` passed first: what still arrives, and from where.
    TimedOut(String),
}

/// `details.drain`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct DrainReport {
    /// `draining`, `drained`, `timed_out` (still held out), `returning` (undrained, waiting
    /// for the backend to answer).
    pub state: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub by: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub started: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub persisted: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub in_flight: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub new_last_second: Option<u32>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub peers_last_second: Vec<PeerCount>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_new_request_ago_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub in_flight_at_start: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Which judgement `result` is (see `Drain::until_shown`); not shown.
    #[serde(skip)]
    pub judged: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PeerCount {
    /// The peer's address; `unseen` for arrivals the kernel counted between two reads.
    pub addr: String,
    pub requests: u32,
}

/// A peer as the lines and `details.drain` name it.
pub fn peer_name(peer: Option<IpAddr>) -> String {
    peer.map_or_else(|| UNSEEN.to_string(), |a| a.to_string())
}

/// Arrivals the kernel counted whose connection no read saw.
pub const UNSEEN: &str = "unseen";

/// What `unseen` means, said where it first shows: docs/drain.md is not at hand on a console.
pub fn unseen_means() -> String {
    format!(
        "{UNSEEN} = new requests the kernel counted on connections that opened and closed between \
         two of the agent's looks at the port (every {} ms), so their sender is not known",
        super::watch::READ_EVERY.as_millis()
    )
}

pub(super) fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

/// Peers and their counts as `10.0.0.5 (30), 10.0.0.6 (7)`.
pub fn peer_list(peers: &[(Option<IpAddr>, u32)]) -> String {
    peers
        .iter()
        .map(|(a, n)| format!("{} ({n})", peer_name(*a)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// When a drain is done, for a caller that asked at `since` with `quiet` and `timeout`:
/// drained once the port has been read twice since, nothing is in flight and
/// nothing new arrived for `quiet` (counted from the drain's start at the earliest); timed out
/// once `timeout` has passed since `since`.
pub fn judge(
    p: &Progress,
    started_at: Instant,
    since: Instant,
    now: Instant,
    quiet: Duration,
    timeout: Duration,
    watched: bool,
) -> Judgement {
    let waited = now.saturating_duration_since(since);
    if !watched {
        return if waited >= quiet {
            Judgement::Drained(format!(
                "drained in {:.1} s (web.port is 0: no backend traffic could be watched, so \
                 this only waited --quiet)",
                now.saturating_duration_since(started_at).as_secs_f64()
            ))
        } else {
            Judgement::Draining
        };
    }
    let quiet_from = p.last_new.map_or(started_at, |t| t.max(started_at));
    let quiet_for = now.saturating_duration_since(quiet_from);
    let fresh = p.read_at.is_some_and(|t| t >= since) && p.reads >= 2;
    if fresh && p.error.is_none() && p.in_flight == 0 && quiet_for >= quiet {
        let last = match p.last_new {
            Some(t) => format!(
                "last new request {:.1} s ago",
                now.saturating_duration_since(t).as_secs_f64()
            ),
            None => "no new request since it began".into(),
        };
        return Judgement::Drained(format!(
            "drained in {:.1} s ({last}; {} were in flight at the start)",
            now.saturating_duration_since(started_at).as_secs_f64(),
            p.in_flight_at_start.unwrap_or(0)
        ));
    }
    if waited < timeout {
        return Judgement::Draining;
    }
    let recent = p.peers_within(now, RECENT);
    let arrivals: u32 = recent.iter().map(|(_, n)| n).sum();
    // One clock, the drain's, as the progress lines count: a command that asked later (a
    // second `drain` while drained) says when its own timeout ran out.
    let total = format!(
        "{:.1}",
        now.saturating_duration_since(started_at).as_secs_f64()
    );
    let own = format!("{:.1}", waited.as_secs_f64());
    let mut why = format!("not drained after {total} s");
    if own != total {
        why.push_str(&format!(" (timed out {own} s after this command asked)"));
    }
    why.push_str(": ");
    if let Some(e) = &p.error {
        why.push_str(&format!("the backend's connections cannot be read ({e})"));
    } else if arrivals > 0 {
        why.push_str(&format!(
            "{arrivals} new requests in the last {} s from {}",
            RECENT.as_secs(),
            peer_list(&recent)
        ));
    } else {
        why.push_str(&format!(
            "no new request in the last {} s",
            RECENT.as_secs()
        ));
    }
    why.push_str(&format!("; {} in flight", p.in_flight));
    if p.error.is_none() && recent.iter().any(|(a, _)| a.is_none()) {
        why.push_str(&format!(" ({})", unseen_means()));
    }
    Judgement::TimedOut(why)
}

/// The command's progress lines, one a second: the first that names `unseen` senders says
/// what they are.
#[derive(Debug, Default)]
pub struct ProgressLines {
    unseen_told: bool,
}

impl ProgressLines {
    pub fn next(&mut self, p: &Progress, started_at: Instant, now: Instant) -> String {
        let (line, names_unseen) = progress_line(p, started_at, now, !self.unseen_told);
        self.unseen_told |= names_unseen;
        line
    }
}

/// A progress line, on the drain's clock, and whether it names `unseen` senders (explained
/// when `explain_unseen`).
pub fn progress_line(
    p: &Progress,
    started_at: Instant,
    now: Instant,
    explain_unseen: bool,
) -> (String, bool) {
    let peers = p.peers_within(now, Duration::from_secs(1));
    let new: u32 = peers.iter().map(|(_, n)| n).sum();
    let mut line = format!(
        "draining {:.1}s: {} in flight, {new} new in the last second",
        now.saturating_duration_since(started_at).as_secs_f64(),
        p.in_flight
    );
    if new > 0 {
        line.push_str(&format!(" from {}", peer_list(&peers)));
    }
    match p.last_new {
        Some(t) => line.push_str(&format!(
            ", last new request {:.1}s ago",
            now.saturating_duration_since(t).as_secs_f64()
        )),
        None => line.push_str(", no new request since the drain began"),
    }
    if let Some(e) = &p.error {
        line.push_str(&format!(" (cannot read the connections: {e})"));
    }
    let names_unseen = peers.iter().any(|(a, _)| a.is_none());
    if names_unseen && explain_unseen {
        line.push_str(&format!(" ({})", unseen_means()));
    }
    (line, names_unseen)
}
