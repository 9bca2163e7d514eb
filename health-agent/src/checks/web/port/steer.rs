//! Steering the kernel programs: when sock_diag reads the port's connections, what is
//! suspicious, and when the programs that follow connections, trace accept() and read answers
//! attach and detach (counting windows, answer windows).

use super::*;
use crate::{
    checks::web::{
        cadence::{COUNT_EVERY, COUNT_FOR, COUNT_LONGEST, WINDOW_ANSWERS},
        Following,
    },
    config::{AcceptTracing, SocketTracing},
    net,
};

impl PortWatch {
    /// With `accept_tracing = "on_stall"`, attaches the accept tracepoints once a connection
    /// has waited unclaimed for WATCH_ACCEPTS_AFTER and detaches them after
    /// UNWATCH_ACCEPTS_AFTER without one.
    pub(super) fn steer_accept_tracing(&mut self, oldest_waiting: Option<Duration>, now: Instant) {
        if self.cfg.accept_tracing != AcceptTracing::OnStall || self.accept_tracing_failed {
            return;
        }
        let Some(k) = self.kernel.as_mut() else {
            return;
        };
        if oldest_waiting.is_some_and(|d| d >= WATCH_ACCEPTS_AFTER) {
            self.last_stall = Some(now);
        }
        let want = self
            .last_stall
            .is_some_and(|t| now.saturating_duration_since(t) < UNWATCH_ACCEPTS_AFTER);
        if want == k.accepts_watched() {
            return;
        }
        match k.watch_accepts(want) {
            Ok(()) if want => tracing::info!(
                "a connection waits unclaimed on port {}: tracing accept() until none has for {}s",
                self.cfg.port,
                UNWATCH_ACCEPTS_AFTER.as_secs()
            ),
            Ok(()) => tracing::info!("accept() tracing detached: connections are claimed promptly"),
            Err(e) => {
                self.accept_tracing_failed = true;
                tracing::warn!("accept() tracing unavailable, claims alone show progress: {e}");
            }
        }
    }

    /// Whether sock_diag reads the port's connections: with `socket_tracing = "on_suspicion"`
    /// (between the programs' attachments), and always below the `full` tier.
    pub(super) fn reads_sockets(&self) -> bool {
        self.cfg.socket_tracing == SocketTracing::OnSuspicion || self.tier != KernelTier::Full
    }

    /// In the `sock_diag` tier: whether a segment with a payload left the port since the
    /// previous tick (the answer programs count them): answers going out, between two reads
    /// of the connections or on a connection that opened and closed between them.
    pub(super) fn segments_sent(&mut self) -> bool {
        if self.tier != KernelTier::SockDiag {
            return false;
        }
        let (Some(k), Some(port)) = (&self.kernel, self.sight.target.as_ref().map(|t| t.port))
        else {
            return false;
        };
        let Ok(sent) = k.answer_counters(port).map(|c| c.sent) else {
            return false;
        };
        let moved = self.segments.is_some_and(|before| sent > before);
        self.segments = Some(sent);
        moved
    }

    /// With `socket_tracing = "on_suspicion"`, or below the `full` tier: reads the port's
    /// connections (`PortReader::read`) and returns what moved on them since the previous
    /// read; None when there is no target yet or sock_diag failed (the failure is itself a
    /// reason to follow, see `suspicion`). `shared`: this tick's connections, already read for
    /// the drain (see `port.rs`).
    pub(super) fn read_sockets(
        &mut self,
        now: Instant,
        shared: Option<Vec<net::TcpConn>>,
    ) -> Option<Moves> {
        if !self.reads_sockets() {
            return None;
        }
        let probes = &self.probes;
        self.reader
            .read(self.socket.as_ref(), || probes.own_sources(), shared, now)
    }

    /// Whether this tick reads the port's connections (`PortReader::due`).
    pub(super) fn sockets_due(&self, now: Instant) -> bool {
        self.reader.due(self.socket.as_ref(), now)
    }

    /// What, if anything, makes the programs that follow connections worth their cost now.
    pub(super) fn suspicion(&self) -> Option<String> {
        if let Some(e) = self.reader.error() {
            return Some(format!("the port's connections could not be read ({e})"));
        }
        if let Some(why) = self
            .reader
            .view()
            .and_then(|v| v.suspicion(self.cfg.slow_after / 2))
        {
            return Some(why);
        }
        // A probe set up wrong (a 4xx, a redirect) runs no failing clock: the server answers,
        // and the config error is said apart.
        if self.sight.probe.failing {
            return Some("the probe fails".into());
        }
        let wrong = !matches!(
            self.sight.verdict,
            WebVerdict::Up | WebVerdict::Unknown | WebVerdict::NotConfigured
        );
        wrong.then(|| format!("the backend is {}", self.sight.verdict.as_str()))
    }

    /// With `socket_tracing = "on_suspicion"`, attaches the programs that follow connections
    /// on a suspicion and detaches them after UNFOLLOW_AFTER without one. Attaching restarts
    /// their counts: what was learned from them before (quiet spells) stays, the latency
    /// window starts over.
    pub(super) fn steer_following(&mut self, suspicion: Option<String>, now: Instant) {
        if !self.reads_sockets() {
            return;
        }
        self.suspicious = suspicion.is_some();
        if let Some(why) = suspicion {
            self.last_suspicion = Some((now, why));
        }
        if self.tier != KernelTier::Full {
            // Nothing to attach: sock_diag (and the answer programs) are the view.
            self.kernel_status.following = Some(Following {
                mode: self.cfg.socket_tracing,
                attached: false,
                why: format!(
                    "the {} tier: sock_diag reads the port's connections",
                    self.tier.as_str()
                ),
                connections: self.reader.view().cloned(),
                quiet_read_every_ms: Some(self.reader.quiet_every().as_millis() as u64),
            });
            return;
        }
        let thin = self.cadence.counting() && self.window_too_thin(now);
        let window_figures = self
            .open_span(now)
            .map(|s| {
                format!(
                    "{} requests, {} answered, {} timed",
                    s.requests,
                    s.answered,
                    s.latency.buckets.iter().sum::<u64>()
                )
            })
            .unwrap_or_default();
        let Some(k) = self.kernel.as_mut() else {
            return;
        };
        let recent = self
            .last_suspicion
            .as_ref()
            .filter(|(t, _)| now.saturating_duration_since(*t) < UNFOLLOW_AFTER);
        // A counting window: opened while detached and sock_diag is unsure, closed after
        // COUNT_FOR (unless a suspicion keeps the programs on).
        let closed = self
            .cadence
            .tick(now, thin, k.following(), recent.is_some());
        let counting = self.cadence.counting() && recent.is_none();
        let want = (recent.is_some() || counting || self.held.is_some()) && !self.follow_failed;
        if want != k.following() {
            match k.follow(want) {
                Ok(()) if want => {
                    if let Some((_, why)) = recent {
                        tracing::info!(
                            "following every connection of port {}: {why}",
                            self.cfg.port
                        );
                    } else if let Some(why) = self.held {
                        tracing::info!(
                            "following every connection of port {}: {why}",
                            self.cfg.port
                        );
                    } else {
                        // Every COUNT_EVERY under keep-alive load: not worth the journal.
                        tracing::debug!(
                            "counting port {}'s exchanges for {} ms",
                            self.cfg.port,
                            COUNT_FOR.as_millis()
                        );
                    }
                    self.progress.rebase();
                    self.latency = LatencyWindow::default();
                    self.last_counters = None;
                }
                Ok(()) if closed => {
                    tracing::debug!(
                        "counting window of port {} closed: {}",
                        self.cfg.port,
                        window_figures
                    );
                }
                Ok(()) => tracing::info!(
                    "connection programs detached: nothing suspicious for {}s; sock_diag reads \
                     port {}'s connections",
                    UNFOLLOW_AFTER.as_secs(),
                    self.cfg.port
                ),
                Err(e) => {
                    self.follow_failed = true;
                    tracing::warn!(
                        "the connection programs could not attach ({e}): deciding from the \
                         probe, the accept queue and sock_diag"
                    );
                }
            }
        }
        let attached = k.following();
        let why = match (&self.last_suspicion, attached) {
            _ if self.follow_failed => "attaching failed; sock_diag and the probe only".into(),
            _ if attached && self.held.is_some() => self.held.unwrap_or_default().to_string(),
            _ if counting && attached => format!(
                "counting exchanges for {} ms (up to {} s until {WINDOW_ANSWERS} answers) every \
                 {} s: keep-alive requests come back to back, and sock_diag cannot tell those in \
                 service from those answered",
                COUNT_FOR.as_millis(),
                COUNT_LONGEST.as_secs(),
                COUNT_EVERY.as_secs()
            ),
            (Some((t, w)), true) => format!(
                "{w} ({:.1}s ago)",
                now.saturating_duration_since(*t).as_secs_f64()
            ),
            (Some((t, _)), false) => format!(
                "nothing suspicious for {:.0}s: sock_diag reads the port's connections",
                now.saturating_duration_since(*t).as_secs_f64()
            ),
            (None, _) => "nothing suspicious yet: sock_diag reads the port's connections".into(),
        };
        self.kernel_status.following = Some(Following {
            mode: self.cfg.socket_tracing,
            attached,
            why,
            connections: self.reader.view().cloned(),
            quiet_read_every_ms: Some(self.reader.quiet_every().as_millis() as u64),
        });
    }

    /// Whether the counting window open now saw requests arrive and fewer than WINDOW_ANSWERS
    /// answered: too few to say how fast the backend answers. A backend starved of CPU answers
    /// after the short window has closed, and its latency would never be seen.
    fn window_too_thin(&self, now: Instant) -> bool {
        self.open_span(now)
            .is_some_and(|s| s.requests > 0 && s.answered < WINDOW_ANSWERS)
    }

    /// With `socket_tracing = "on_suspicion"` in the full tier: attaches the answer programs
    /// for their sampling windows, while the connection programs are attached, and while the
    /// answers fail; detaches them otherwise. The window starts over at each attach: counters
    /// that stood still while detached are no evidence of an idle backend.
    pub(super) fn steer_answers(&mut self, now: Instant) {
        if self.cfg.socket_tracing != SocketTracing::OnSuspicion
            || self.tier != KernelTier::Full
            || self.answers_attach_failed.is_some()
        {
            return;
        }
        let Some(k) = self.kernel.as_mut() else {
            return;
        };
        if k.answers_unavailable().is_some() {
            return;
        }
        // They attach with the connection programs (a counting window every COUNT_EVERY, or
        // a suspicion): a box that answers only 5xx is seen within COUNT_EVERY. Due, their
        // longer sampling window opens with a counting window too (both at once cost less
        // than each on its own clock); they stay while the answers fail.
        let (want, due) = self.cadence.answers_wanted(
            now,
            k.following(),
            self.follow_failed,
            self.answers.failing(),
        );
        if want == k.answers_attached() {
            return;
        }
        if want && due {
            self.cadence.answers_opened(now);
        }
        match k.attach_answers(want) {
            Ok(()) if want => {
                self.answers_attaches += 1;
                self.answers.restart(now);
            }
            Ok(()) => {}
            Err(e) => {
                tracing::warn!("the answer programs: {e}; the answers' status is not sampled");
                self.kernel_status
                    .missing
                    .push(format!("{}: {e}", crate::ebpf::tier::ANSWERS_MISSING));
                self.answers_attach_failed = Some(e.to_string());
            }
        }
    }

    /// A peer's errors fault waits on this instance's word about its answers
    /// (`?fresh=answers`): with `"on_suspicion"` they are sampled only in windows, so the next
    /// tick opens a counting window with an answers sampling window (`Cadence::ask_soon`).
    pub fn sample_answers_soon(&mut self, now: Instant) {
        if self.cfg.socket_tracing == SocketTracing::OnSuspicion {
            self.cadence.ask_soon(now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checks::{probe::ProbeResult, web::WebMonitor};

    #[test]
    fn a_probe_answered_4xx_is_a_wrong_path_not_a_reason_to_follow_every_connection() {
        let cfg = WebConfig {
            port: 9000,
            kernel: false,
            ..WebConfig::default()
        };
        let (kernel, status) = load_kernel(&cfg);
        let mut port = PortWatch::new(cfg.clone(), kernel, status, ProbeLedger::default());
        let mut judge = WebMonitor::new(cfg);
        let t0 = Instant::now();
        let answered = |status: Option<u16>| ProbeResult {
            ok: false,
            status,
            error: status.is_none().then(|| "connection reset by peer".into()),
            misconfigured: status.filter(|s| *s < 500).map(|s| format!("answered {s}")),
            target: "127.0.0.1:9000".into(),
            ..ProbeResult::default()
        };
        let mut after = |p, at| {
            judge.record_probe(p, at);
            port.see(judge.sight());
            port.suspicion()
        };
        assert_eq!(
            after(answered(Some(404)), t0),
            None,
            "the server answers: only the path is wrong"
        );
        assert_eq!(
            after(answered(Some(503)), t0 + Duration::from_secs(1)).as_deref(),
            Some("the probe fails")
        );
        assert_eq!(
            after(answered(None), t0 + Duration::from_secs(2)).as_deref(),
            Some("the probe fails")
        );
    }
}
