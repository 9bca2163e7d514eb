//! A round's sample of the port: the programs' counters, sock_diag's view merged in, the
//! answers by status class, and the spans the figures are cut from.

use super::*;
use crate::{
    checks::web::{answers::Round, figures::Mark, tally::CLASSES as ANSWER_CLASSES},
    config::SocketTracing,
    ebpf::{KernelSample, PortSample as KernelPort},
    net,
};

impl PortWatch {
    /// One round: the port as `sight` says where it is and `listeners` were read there, and
    /// what the kernel programs, sock_diag and the answer programs saw of it. With `socket_tracing
    /// = "on_suspicion"` the connections are as this tick's `tick` read them (or read now),
    /// which may attach the programs before they are read.
    pub fn sample(
        &mut self,
        now: Instant,
        sight: Sight,
        listeners: &[net::Listener],
    ) -> PortSample {
        self.see(sight);
        self.reader.note_listeners(listeners);
        let Some(port) = self.sight.target.as_ref().map(|t| t.port) else {
            return self.at_rest();
        };
        let (counters, kernel) = self.kernel_evidence(port, listeners, now);
        self.observe_answers(port, !listeners.is_empty(), now);
        self.track_span(now);
        self.steer_accept_tracing(kernel.as_ref().and_then(|k| k.oldest_waiting), now);
        let answers = self.answers.report(&self.cfg);
        let figures = self.figures(now);
        self.tally_answers(&answers, figures.as_ref(), now);
        PortSample {
            kernel_loaded: self.kernel.is_some(),
            counters,
            kernel,
            answers_basis: self.answers.basis(),
            erroring: self.answers.erroring(),
            answers: Some(answers),
            figures,
            responses_total: self.tally.current(),
            status: self.kernel_status.clone(),
            listen_drops: self.listen_drops(now),
            signs: self.signs(),
        }
    }

    /// Listen overflows and drops since the agent started (the host's counters, read at most
    /// every DROPS_EVERY).
    fn listen_drops(&mut self, now: Instant) -> (u64, u64) {
        let stale = self
            .drops_seen
            .is_none_or(|(t, _)| now.saturating_duration_since(t) >= DROPS_EVERY);
        if stale {
            if let Ok(d) = net::listen_drops() {
                self.drops_seen = Some((now, d));
            }
        }
        match (self.drops_seen.map(|(_, d)| d), self.drops_baseline) {
            (Some(d), Some(b)) => (
                d.overflows.saturating_sub(b.overflows),
                d.drops.saturating_sub(b.drops),
            ),
            _ => (0, 0),
        }
    }

    /// The kernel's evidence this round: the programs' counters for `port` while they follow
    /// connections, and sock_diag's view of its connections merged in.
    fn kernel_evidence(
        &mut self,
        port: u16,
        listeners: &[net::Listener],
        now: Instant,
    ) -> (Option<KernelCounters>, Option<KernelEvidence>) {
        let fresh = self
            .reader
            .fresh(self.socket.as_ref(), self.cfg.eval_interval / 2, now);
        if !fresh {
            let seen = self.read_sockets(now, None);
            if let Some(mut seen) = seen {
                if !self.kernel.as_ref().is_some_and(KernelView::following) {
                    seen.answered |= self.segments_sent();
                    // Gone: served and closed between two reads (see `watch`).
                    seen.answered |= seen.gone && self.tier != KernelTier::SockDiag;
                    self.progress
                        .observe_moves(seen, now, self.cfg.latency_window);
                }
            }
        }
        let suspicion = self.suspicion();
        self.steer_following(suspicion, now);
        let following = self.kernel.as_ref().is_some_and(KernelView::following);
        let sample = self
            .kernel
            .as_ref()
            .filter(|_| following)
            .map(KernelView::sample);
        let counters = sample
            .as_ref()
            .and_then(|s| s.ports.iter().find(|p| p.port == port).cloned())
            .map(|p| self.kernel_counters(&p, sample.as_ref(), listeners, now));
        let mut kernel = counters.as_ref().map(|c| KernelEvidence {
            oldest_waiting: c.oldest_waiting_ms.map(Duration::from_millis),
            since_claim: [c.ms_since_last_accept, c.ms_since_last_claim]
                .into_iter()
                .flatten()
                .min()
                .map(Duration::from_millis),
            since_answer: c.ms_since_last_answer.map(Duration::from_millis),
            longest_quiet: Duration::from_millis(c.longest_quiet_ms),
            pending: c.pending,
            oldest_pending: c.oldest_pending_ms.map(Duration::from_millis),
            latency: c.latency.clone(),
            answered: c.answered,
        });
        if let Some(v) = self.reader.view() {
            kernel = Some(self.with_sockets(kernel, v, now));
        }
        // Attaching failed: sock_diag alone misses connections that opened and closed between
        // two reads, so it is not kernel evidence of progress (the probe and the accept queue
        // decide, as without eBPF).
        if self.follow_failed && !following {
            kernel = None;
        }
        (counters, kernel)
    }

    /// The programs' evidence merged with the port's connections as sock_diag shows them: the
    /// programs see nothing while they are detached, and of a connection opened before they
    /// attached only its exchanges from its next socket call on (not its handshake, claim or a
    /// request it had read); sock_diag sees every open one but none that closed. Ages take the
    /// older of the two, counts the larger, the last answer the more recent.
    pub(super) fn with_sockets(
        &self,
        kernel: Option<KernelEvidence>,
        v: &SocketView,
        now: Instant,
    ) -> KernelEvidence {
        let max = |a: Option<Duration>, b: Option<Duration>| a.max(b);
        // Without the programs' counters (detached, or a tier without them), what sock_diag
        // saw move between reads: answers sent, connections taken up (and, in the sock_diag
        // tier, segments the answer programs counted).
        let k = kernel.unwrap_or_else(|| KernelEvidence {
            longest_quiet: self.progress.longest_quiet(),
            since_answer: self.progress.since_answer(now),
            since_claim: self.progress.since_taken(now),
            ..KernelEvidence::default()
        });
        KernelEvidence {
            oldest_waiting: max(k.oldest_waiting, v.oldest_waiting()),
            since_answer: [k.since_answer, v.since_sent].into_iter().flatten().min(),
            pending: k.pending.max(v.pending),
            oldest_pending: max(k.oldest_pending, v.oldest_pending),
            ..k
        }
    }

    pub(super) fn kernel_counters(
        &mut self,
        p: &KernelPort,
        sample: Option<&KernelSample>,
        listeners: &[net::Listener],
        now: Instant,
    ) -> KernelCounters {
        let c: &PortCounters = &p.counters;
        // accept() progress on this port's listen sockets.
        let inodes: Vec<u64> = listeners.iter().map(|l| l.inode).collect();
        let mut accepted = 0;
        let mut last_ns = None::<u64>;
        let now_ns = sample.map_or(0, |s| s.now_ns);
        if let Some(s) = sample {
            self.accept_fds
                .retain(|k, _| s.accepts.iter().any(|(a, _)| a == k));
            for (key, stat) in &s.accepts {
                let inode = *self
                    .accept_fds
                    .entry(*key)
                    .or_insert_with(|| net::fd_socket_inode(key.tgid, key.fd));
                if inode.is_some_and(|i| inodes.contains(&i)) {
                    accepted += stat.count;
                    last_ns = Some(last_ns.map_or(stat.last_ns, |l: u64| l.max(stat.last_ns)));
                }
            }
        }
        let latency = self.latency.push(now, p.latency, self.cfg.latency_window);
        let ms = |d: Duration| d.as_millis() as u64;
        KernelCounters {
            established: c.established,
            accepted,
            claimed: c.claimed,
            requests: c.requests,
            answered: c.answered,
            closed_unanswered: c.closed_unanswered,
            closed_unaccepted: c.closed_unclaimed,
            sent: c.sent,
            received: c.received,
            exchanges_in: c.exchanges_in,
            exchanges_out: c.exchanges_out,
            exchanges_dropped: c.exchanges_dropped,
            in_service: c.in_service(),
            waiting: p.waiting,
            oldest_waiting_ms: p.oldest_waiting.map(ms),
            pending: p.pending,
            oldest_pending_ms: p.oldest_pending.map(ms),
            ms_since_last_accept: last_ns.map(|l| now_ns.saturating_sub(l) / 1_000_000),
            ms_since_last_claim: (c.last_claim_ns != 0)
                .then(|| now_ns.saturating_sub(c.last_claim_ns) / 1_000_000),
            ms_since_last_answer: self.progress.since_answer(now).map(ms),
            longest_quiet_ms: ms(self.progress.longest_quiet()),
            accepts_traced: self
                .kernel
                .as_ref()
                .is_some_and(KernelView::accepts_watched),
            latency,
            map_errors: sample.map(|s| s.map_errors).unwrap_or_default(),
        }
    }

    /// Reads what the port answered this round (one small map read). A restart (no listener,
    /// or a wholly new set of processes holding it) starts the window over.
    pub(super) fn observe_answers(&mut self, port: u16, listening: bool, now: Instant) {
        self.steer_answers(now);
        let replaced = !self.answers_pids.is_empty()
            && !self.sight.owners.is_empty()
            && !self
                .sight
                .owners
                .iter()
                .any(|p| self.answers_pids.contains(p));
        if !listening || replaced {
            self.answers.restart(now);
            self.figures.restart();
        }
        if !self.sight.owners.is_empty() || !listening {
            self.answers_pids.clone_from(&self.sight.owners);
        }
        let counters = match &self.kernel {
            Some(_) if self.answers_attach_failed.is_some() => {
                Round::Unavailable(self.answers_attach_failed.clone().unwrap_or_default())
            }
            Some(k) => match k.answer_counters(port) {
                Ok(c) => Round::Counters(c),
                Err(e) => Round::Unavailable(e.to_string()),
            },
            None => Round::Unavailable(
                self.kernel_status
                    .reason
                    .clone()
                    .unwrap_or_else(|| "the kernel view is not running".into()),
            ),
        };
        let probe_status = self.sight.probe.status;
        self.answers.observe(counters, probe_status, now, &self.cfg);
    }

    /// The cumulative readings a span is measured from: the port's counters and latency
    /// histogram, the answer programs' counters while they are attached, the probes made.
    pub(super) fn mark(&self, now: Instant) -> Option<Mark> {
        mark(
            self.kernel.as_ref(),
            self.sight.target.as_deref(),
            self.answers_attaches,
            self.sight.probe.answered,
            now,
        )
    }

    /// The figures' spans this tick (`Figures::track`), in the full tier.
    pub(super) fn track_span(&mut self, now: Instant) {
        if self.tier != KernelTier::Full {
            return;
        }
        let attached = self.kernel.as_ref().is_some_and(KernelView::following);
        let probe_class = self.sight.probe.class;
        let (kernel, target) = (self.kernel.as_ref(), self.sight.target.as_deref());
        let (attaches, probes) = (self.answers_attaches, self.sight.probe.answered);
        self.figures.track(
            now,
            attached,
            || mark(kernel, target, attaches, probes, now),
            probe_class,
            self.cfg.latency_window,
        );
    }

    /// The span in progress, counted up to `now` (None while the programs are detached).
    pub(super) fn open_span(&self, now: Instant) -> Option<crate::checks::web::figures::Span> {
        self.figures
            .open_span(|| self.mark(now), self.sight.probe.class)
    }

    /// Ends the span in progress at the next tick if it began before `t` (see
    /// `Figures::cut_span_after`).
    pub fn cut_span_after(&mut self, t: Instant) {
        self.figures.cut_span_after(t);
    }

    /// Adds this round's answers to the counter `/metrics` exports: the kernel's totals while
    /// the programs count all along, the windows' rates otherwise (see `tally`).
    pub(super) fn tally_answers(
        &mut self,
        answers: &AnswersReport,
        figures: Option<&FiguresReport>,
        now: Instant,
    ) {
        if !answers.status_visible {
            return;
        }
        if self.cfg.socket_tracing == SocketTracing::Always {
            let mut totals = [0; 6];
            for (i, class) in ANSWER_CLASSES.iter().enumerate().skip(1) {
                totals[i] = answers.total_by_class.get(class).copied().unwrap_or(0);
            }
            self.tally.observe(now, Some(totals), None);
        } else {
            self.tally.observe(now, None, figures);
        }
    }

    /// Whether the newest counting span, ended in the last few seconds, saw requests arrive and
    /// few answered (`Figures::newest_starved`): its latency is about to show.
    pub fn newest_span_starved(&self, now: Instant) -> bool {
        self.figures
            .newest_starved(now, std::time::Duration::from_secs(5))
    }

    /// The latest answers' latency, as the peers compare it (`Figures::latency_since`: the
    /// newest spans holding `enough` answers, begun at or after `since`, a restart's return):
    /// its percentiles, the seconds counted, the basis (`counted` or `windows`), and when the
    /// oldest of those spans began. None below the `full` tier.
    pub fn latency_since(
        &self,
        now: Instant,
        since: Option<Instant>,
        enough: u64,
    ) -> Option<(
        crate::checks::web::LatencySummary,
        f64,
        &'static str,
        Option<Instant>,
    )> {
        self.figures(now)?;
        let open = self.open_span(now);
        let (hist, seconds, began) =
            self.figures
                .latency_since(now, self.cfg.latency_window, since, enough, open.as_ref());
        let basis = if self.cfg.socket_tracing == SocketTracing::Always {
            "counted"
        } else {
            "windows"
        };
        Some((
            crate::checks::web::percentiles(&hist),
            seconds,
            basis,
            began,
        ))
    }

    /// The figures over `web.latency_window` (None below the `full` tier: no programs count
    /// requests there).
    pub(super) fn figures(&self, now: Instant) -> Option<FiguresReport> {
        (self.tier == KernelTier::Full && self.kernel.is_some()).then(|| {
            self.figures.report(
                now,
                self.cfg.latency_window,
                self.cfg.socket_tracing == SocketTracing::Always,
            )
        })
    }
}

/// The readings a span is measured from, off `kernel` for `target`'s port: None without either.
/// `answers_attaches`: the answer programs' attaches so far; `probes`: the probes made so far.
fn mark(
    kernel: Option<&KernelView>,
    target: Option<&Target>,
    answers_attaches: u64,
    probes: u64,
    now: Instant,
) -> Option<Mark> {
    let (k, port) = (kernel?, target?.port);
    let (c, latency) = k.port_totals(port);
    let answers = k
        .answers_attached()
        .then(|| k.answer_counters(port).ok())
        .flatten()
        .map(|a| (a, answers_attaches));
    Some(Mark {
        at: now,
        requests: c.arrivals(),
        answered: c.exchanges_out,
        latency,
        answers,
        probes,
    })
}
