//! One round: find the backend, take its listeners and the port's sample from the watching,
//! gather the evidence, decide, and report.

use super::*;

/// Why there are no listeners to read this round.
enum NoListeners {
    Unresolved(Unresolved),
    /// sock_diag failed: the agent's own error.
    AgentError(String),
}

/// What the round found of the backend's listeners.
#[derive(Debug, Clone)]
pub struct Found {
    /// Where they were looked for.
    pub namespace: target::NamespaceView,
    /// Something listens on the port.
    pub listening: bool,
    /// Connections in their accept queues, and the queues' room.
    pub queue: u32,
    pub queue_max: u32,
}

impl WebMonitor {
    /// Finds (or keeps) the target; the watching of the port follows it (`PortWatch::listeners`).
    fn resolve_target(&mut self) -> Result<&Target, Unresolved> {
        let before = self.target.as_ref().map(|t| (t.view.inode, t.port));
        let target = target::resolve(&self.cfg, self.target.take(), self.container_net.as_ref())?;
        self.found_once = true;
        self.missing_since = None;
        let now = (target.view.inode, target.port);
        if before != Some(now) {
            let v = &target.view;
            tracing::info!(
                "watching the web backend on port {} in {} (namespace {}, inode {}{})",
                v.port,
                v.path,
                v.source,
                v.inode,
                v.container
                    .as_ref()
                    .map_or(String::new(), |c| format!(", container {c}"))
            );
            self.owners.clear();
            self.owners_inode = 0;
        }
        Ok(self.target.insert(target))
    }

    /// A report without a look at the backend: why there is nothing to look at.
    fn without_target(
        &mut self,
        verdict: WebVerdict,
        detail: String,
        sample: &PortSample,
    ) -> WebReport {
        self.last_verdict = verdict;
        self.next_look = None;
        self.kernel_loaded = sample.kernel_loaded;
        WebReport {
            verdict,
            detail,
            served: self.served,
            kernel: sample.status.clone(),
            probe: self.probed.shown(),
            responses_total: sample.responses_total.clone(),
            signs: self.signs(sample),
            ..WebReport::not_configured()
        }
        .with_port(self.cfg.port)
    }

    /// What `web.container` / `web.netns` names does not exist. Not found since the agent
    /// started: a configuration mistake. Found before: being recreated, until GONE_FOR_GOOD.
    /// Either way the agent cannot look, so the verdict is `unknown`, never evidence.
    fn not_found(
        &mut self,
        (key, what): (&'static str, String),
        sample: &PortSample,
        now: Instant,
    ) -> WebReport {
        let gone = now.saturating_duration_since(*self.missing_since.get_or_insert(now));
        let config_error = if !self.found_once {
            Some(format!(
                "{key}: {what}, not since the agent started: check {key}"
            ))
        } else if gone >= GONE_FOR_GOOD {
            Some(format!(
                "{key}: {what} for {}s (it was found before): check {key}",
                gone.as_secs()
            ))
        } else {
            None
        };
        let detail = match &config_error {
            Some(e) => e.clone(),
            None => format!(
                "{key}: {what} for {:.1}s; it was found before (being recreated?)",
                gone.as_secs_f64()
            ),
        };
        let mut r = self.without_target(WebVerdict::Unknown, detail, sample);
        r.config_error = config_error;
        r
    }

    /// One round: the backend found, its listeners and the port's sample from `port` (the
    /// watching), and the judgement of both.
    pub fn evaluate(&mut self, port: &mut PortWatch, now: Instant) -> WebReport {
        if self.cfg.port == 0 {
            return WebReport::not_configured();
        }
        let namespace = match self.resolve_target() {
            Ok(target) => target.view.clone(),
            Err(why) => {
                return self.no_listeners(NoListeners::Unresolved(why), &port.at_rest(), now)
            }
        };
        let listeners = match port.listeners(self.sight()) {
            Ok(listeners) => listeners,
            Err(e) => {
                let why = format!(
                    "sock_diag in {} failed: {e} (the agent's own error, not the backend's)",
                    namespace.path
                );
                return self.no_listeners(NoListeners::AgentError(why), &port.at_rest(), now);
            }
        };
        self.aim_probe(&listeners);
        let found = self.note_listeners(namespace, &listeners, now);
        let sample = port.sample(now, self.sight(), &listeners);
        self.judge(&found, &sample, now, &mut || port.connections())
    }

    /// The verdict on what the round `found` of the listeners and the port's `sample`, with
    /// the probe's latest result and, while work is stuck, a look at the server's processes.
    /// `connections` reads the namespace's connections when the look needs them.
    pub fn judge(
        &mut self,
        found: &Found,
        sample: &PortSample,
        now: Instant,
        connections: Connections<'_>,
    ) -> WebReport {
        self.kernel_loaded = sample.kernel_loaded;
        let listening = found.listening;
        let mut evidence = Evidence {
            answers: Some(sample.answers_basis),
            erroring: sample.erroring,
            listening,
            queue: found.queue,
            queue_busy_for: self
                .queue_busy_since
                .map(|s| now.saturating_duration_since(s)),
            kernel: sample.kernel.clone(),
            probe: self.probed.latest().cloned(),
            probe_failing_for: self.probed.failing_for(now),
            ..Evidence::default()
        };
        let processes = self.look_at_processes(&mut evidence, now, connections);
        let (verdict, detail) = verdict::decide(&evidence, &self.cfg);
        let detail = self.explain(detail, listening, &found.namespace);
        let stuck_worker = (verdict == WebVerdict::PartialHang)
            .then(|| verdict::stuck_process(&evidence, &self.cfg))
            .flatten();
        self.last_verdict = verdict;
        self.next_look = verdict::next_look(&evidence, &self.cfg, now);
        self.served |= self.has_served(listening, &evidence);
        // Nothing but the agent's own trouble to go on: say so, so the policy never reads it
        // as the backend's failure.
        let agent_error = verdict == WebVerdict::Unknown && self.probed.trouble().is_some();
        WebReport {
            config_error: self.probe_path_error(),
            answers: sample.answers.clone(),
            figures: sample.figures.clone(),
            responses_total: sample.responses_total.clone(),
            port: self.cfg.port,
            namespace: Some(found.namespace.clone()),
            verdict,
            detail,
            served: self.served,
            listening,
            pids: self.owners.clone(),
            process: self.owner_name.clone(),
            accept_queue: found.queue,
            accept_queue_max: found.queue_max,
            listen_overflows: sample.listen_drops.0,
            listen_drops: sample.listen_drops.1,
            kernel: sample.status.clone(),
            disagreement: verdict::disagreement(verdict, &evidence),
            counters: sample.counters.clone(),
            probe: self.probed.shown(),
            dependencies: std::mem::take(&mut evidence.dependencies),
            processes,
            stuck_worker,
            agent_error,
            signs: self.signs(sample),
        }
    }

    /// Points the probe at the listeners seen (see `target::probe_addr`).
    fn aim_probe(&mut self, listeners: &[net::Listener]) {
        let Some(target) = self.target.as_ref() else {
            return;
        };
        if let Some((addr, fallback)) = target::probe_addr(listeners, target.port) {
            let ns = target.ns.clone();
            let mut shared = self.probe_target.lock().unwrap_or_else(|e| e.into_inner());
            if shared.as_ref().is_none_or(|t| {
                t.addr != addr || t.fallback != fallback || !Arc::ptr_eq(&t.ns, &ns)
            }) {
                *shared = Some(ProbeTarget { addr, fallback, ns });
            }
        }
    }

    /// The report when the agent could not look at the listeners: never a verdict on the
    /// backend, except a container that is not running (down) or never found.
    fn no_listeners(&mut self, why: NoListeners, sample: &PortSample, now: Instant) -> WebReport {
        match why {
            NoListeners::Unresolved(Unresolved::Unknown(why)) => {
                self.without_target(WebVerdict::Unknown, why, sample)
            }
            NoListeners::Unresolved(Unresolved::AgentError(why)) | NoListeners::AgentError(why) => {
                tracing::warn!("{why}");
                let mut r = self.without_target(WebVerdict::Unknown, why, sample);
                r.agent_error = true;
                r
            }
            NoListeners::Unresolved(Unresolved::NotRunning(why)) => {
                self.without_target(WebVerdict::Down, why, sample)
            }
            NoListeners::Unresolved(Unresolved::NotFound { key, what }) => {
                self.not_found((key, what), sample, now)
            }
        }
    }

    /// Notes what the listeners say: how long the queue has held connections, and the
    /// processes holding them (looked up again when the listener or one of them changed).
    fn note_listeners(
        &mut self,
        namespace: target::NamespaceView,
        listeners: &[net::Listener],
        now: Instant,
    ) -> Found {
        let queue: u32 = listeners.iter().map(|l| l.queue).sum();
        let queue_max: u32 = listeners.iter().map(|l| l.max_queue).sum();
        if queue > 0 {
            self.queue_busy_since.get_or_insert(now);
        } else {
            self.queue_busy_since = None;
        }
        if let Some(first) = listeners.first() {
            // One stat per owner per round: a worker that died (and was replaced) is noticed.
            let gone = self
                .owners
                .iter()
                .any(|p| !std::path::Path::new(&format!("/proc/{p}")).exists());
            if first.inode != self.owners_inode || self.owners.is_empty() || gone {
                self.scan_owners(first.inode, now);
            }
        } else {
            self.owners.clear();
            self.owners_inode = 0;
            self.owner_name = None;
        }
        Found {
            namespace,
            listening: !listeners.is_empty(),
            queue,
            queue_max,
        }
    }

    /// The verdict's detail, with what the agent could not do and where it looked.
    fn explain(
        &self,
        mut detail: String,
        listening: bool,
        namespace: &target::NamespaceView,
    ) -> String {
        if let Some(err) = self.probed.trouble().and_then(|p| p.error.as_deref()) {
            detail.push_str(&format!(
                "; the agent could not probe ({err}: its own error, not the backend's)"
            ));
        }
        if !listening && namespace.source == "own" {
            detail.push_str(
                " in the agent's network namespace (a container: set web.container; another \
                 namespace: web.netns)",
            );
        } else if !listening {
            detail.push_str(&format!(" in {}", namespace.path));
        }
        detail
    }

    /// Ready once it has served: the probe (a readiness path) got an answer that is not a
    /// server error. Without a probe nothing would ever ask it while the balancer holds
    /// traffic back, so a listener is all the readiness there is to see. While the agent
    /// cannot make the probe (its own error), answers the kernel saw go out are the readiness
    /// there is: the agent's trouble must not keep it "never served".
    fn has_served(&self, listening: bool, evidence: &Evidence) -> bool {
        if self.cfg.probe_path.is_empty() {
            return listening;
        }
        self.probed
            .latest()
            .is_some_and(|p| p.status.is_some_and(|s| s < 500) || p.misconfigured.is_some())
            || (self.probed.trouble().is_some()
                && evidence.kernel.as_ref().is_some_and(|k| k.answered > 0))
    }

    /// The probe's answer proves the server answers and says the probe is set up wrong: what,
    /// and the key to set.
    fn probe_path_error(&self) -> Option<String> {
        self.probed.latest()?.misconfigured.clone()
    }
}
