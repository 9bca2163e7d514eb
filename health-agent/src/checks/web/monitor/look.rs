//! The look at the processes holding the listener: their state and CPU, the pre-fork
//! master's workers, and, while work is stuck, their own outbound requests and held
//! connections.

use super::*;

impl WebMonitor {
    /// A pre-fork master's workers come and go: adds the children of the processes holding the
    /// listener that hold it too. One read of /proc/*/stat, and the fds of those children
    /// only, far cheaper than `socket_owners`' look at every process's fds.
    pub(super) fn add_new_workers(&mut self, now: Instant) {
        self.owners_scanned = Some(now);
        let listener = self.owners_inode;
        let new: Vec<u32> = process::children_of(&self.owners)
            .into_iter()
            .filter(|c| !self.owners.contains(c) && net::socket_inodes(*c).contains(&listener))
            .collect();
        if !new.is_empty() {
            self.owners.extend(new);
            self.owners.sort_unstable();
        }
    }

    pub(super) fn scan_owners(&mut self, inode: u64, now: Instant) {
        self.owners = net::socket_owners(inode);
        self.owners_inode = inode;
        self.owners_scanned = Some(now);
        self.owner_name = self.owners.first().and_then(|&p| net::process_name(p));
        let owners = &self.owners;
        self.worker_cpu.retain(|p, _| owners.contains(p));
    }

    /// While the backend's work is stuck, looks at its processes: stopped or frozen, CPU,
    /// outbound requests waiting for an answer. A healthy server costs none of these reads.
    pub(super) fn look_at_processes(
        &mut self,
        e: &mut Evidence,
        now: Instant,
        connections: Connections<'_>,
    ) -> Option<ProcessView> {
        let stuck = e
            .kernel
            .as_ref()
            .and_then(|k| {
                let queued = k.oldest_waiting.filter(|_| e.queue > 0);
                [queued, k.oldest_pending].into_iter().flatten().max()
            })
            .or(e.queue_busy_for.filter(|_| e.queue > 0))
            .is_some_and(|d| d >= LOOK_AFTER)
            || e.probe.as_ref().is_some_and(|p| p.timed_out);
        // A worker that accepted connections and stopped before reading them leaves them
        // waiting with the accept queue empty: worth a look at the workers, nothing more.
        let held = e
            .kernel
            .as_ref()
            .and_then(|k| k.oldest_waiting)
            .is_some_and(|d| d >= LOOK_AFTER);
        if !(stuck || held) || self.owners.is_empty() {
            self.cpu.clear();
            self.worker_cpu.clear();
            self.held_found_nothing = None;
            // Nothing waits, yet a pre-fork worker may be stopped while it held nothing (its
            // siblings take every connection): its share of the capacity is gone all the
            // same. One small read per process says so.
            e.workers = self.stopped_workers(now);
            return None;
        }
        // Held connections only, and the last look found nobody holding a request: the
        // processes' state and CPU (one small read each) still, the connections not yet.
        let look_at_connections = stuck
            || self
                .held_found_nothing
                .is_none_or(|t| now.saturating_duration_since(t) >= HELD_LOOK_EVERY);
        if self.owners.len() > 1
            && self
                .owners_scanned
                .is_none_or(|t| now.saturating_duration_since(t) >= OWNERS_FRESH)
        {
            self.add_new_workers(now);
        }
        if let Some(p) = process::look_at(&self.owners) {
            if stuck {
                e.frozen = p.frozen;
            }
            self.cpu.observe(now, p.cpu_ticks);
        }
        e.cpu_percent = self.cpu.percent();
        // Requests sent long before the server last moved (an idle LISTEN, a long poll) are
        // not what it waits on now.
        let since_progress = e
            .kernel
            .as_ref()
            .and_then(|k| [k.since_claim, k.since_answer].into_iter().flatten().min());
        let sent_within = since_progress.map(|d| d + SENT_BEFORE_STALL);
        let mut error = None;
        let web_port = self.target.as_ref().map_or(self.cfg.port, |t| t.port);
        let workers = self.owners.len() > 1 && look_at_connections;
        if !(stuck || workers) {
            e.workers = self.stopped_workers(now);
            return Some(ProcessView {
                frozen: e.frozen.clone(),
                cpu_percent: e.cpu_percent,
                error,
            });
        }
        let conns = match connections() {
            Some(Ok(conns)) => conns,
            Some(Err(err)) => {
                error = Some(format!("reading the server's connections failed: {err}"));
                Vec::new()
            }
            None => Vec::new(),
        };
        if stuck {
            e.dependencies = process::dependency_waits(&self.owners, &conns, web_port, sent_within);
        }
        if workers && error.is_none() {
            e.workers = self.look_at_workers(&conns, web_port, now);
        }
        // Only held connections brought this look (it was due): when it found nobody
        // holding a request, the next waits HELD_LOOK_EVERY.
        self.held_found_nothing = (!stuck && e.workers.is_empty()).then_some(now);
        Some(ProcessView {
            frozen: e.frozen.clone(),
            cpu_percent: e.cpu_percent,
            error,
        })
    }

    /// Each process holding the listener, when there are several (a pre-fork server): which of
    /// them hold requests nobody answers, whether they can run, their CPU, their own outbound
    /// requests, and whether their parent (a master) holds the listener too.
    pub(super) fn look_at_workers(
        &mut self,
        conns: &[net::TcpConn],
        web_port: u16,
        now: Instant,
    ) -> Vec<WorkerView> {
        let stats: Vec<(u32, process::Stat)> = self
            .owners
            .iter()
            .filter_map(|&p| process::stat(p).map(|s| (p, s)))
            .collect();
        let workers = worker_count(&stats);
        self.note_frozen(&stats, now);
        let mut out = Vec::new();
        for &(pid, st) in &stats {
            let meter = self.worker_cpu.entry(pid).or_default();
            meter.observe(now, st.ticks);
            let cpu_percent = meter.percent();
            let inodes: HashSet<u64> = net::socket_inodes(pid).into_iter().collect();
            let (unanswered, oldest, last_sent) =
                process::web_connections(&inodes, conns, web_port);
            let frozen = process::frozen_why(pid, st.state).map(str::to_string);
            let oldest = match oldest.filter(|_| unanswered > 0) {
                Some(oldest) => oldest,
                // Stopped while it held nothing: stuck all the same.
                None if frozen.is_some() => 0,
                None => continue,
            };
            let parent_holds_listener = self.owners.contains(&st.parent);
            let parent_unable = parent_holds_listener
                .then(|| parent_unable(st.parent))
                .flatten();
            let outbound_waiting = process::dependency_waits(&[pid], conns, web_port, None)
                .iter()
                .map(|w| w.connections)
                .sum();
            out.push(WorkerView {
                pid,
                command: process::command(pid).unwrap_or_else(|| "?".into()),
                parent: st.parent,
                parent_holds_listener,
                parent_unable,
                is_master: stats.iter().any(|(_, s)| s.parent == pid),
                frozen_ms: self.frozen_ms(pid, st.start, now),
                frozen,
                workers,
                unanswered,
                oldest_unanswered_ms: oldest,
                last_sent_ms: last_sent,
                cpu_percent,
                outbound_waiting,
                start: st.start,
                listener: self.owners_inode,
            });
        }
        out
    }

    /// The stopped or frozen workers of a pre-fork server (several processes holding the
    /// listener, none of them the only one stopped: that is the whole server, judged by the
    /// hang rules), seen with nothing waiting: what `decide` names as a partial hang once one
    /// has been stopped for FREEZE_CONFIRM.
    fn stopped_workers(&mut self, now: Instant) -> Vec<WorkerView> {
        if self.owners.len() < 2 {
            self.frozen_since.clear();
            return Vec::new();
        }
        let stats: Vec<(u32, process::Stat)> = self
            .owners
            .iter()
            .filter_map(|&p| process::stat(p).map(|s| (p, s)))
            .collect();
        self.note_frozen(&stats, now);
        let workers = worker_count(&stats);
        let mut out = Vec::new();
        for &(pid, st) in &stats {
            let Some(frozen) = process::frozen_why(pid, st.state) else {
                continue;
            };
            let parent_holds_listener = self.owners.contains(&st.parent);
            let parent_unable = parent_holds_listener
                .then(|| parent_unable(st.parent))
                .flatten();
            out.push(WorkerView {
                pid,
                command: process::command(pid).unwrap_or_else(|| "?".into()),
                parent: st.parent,
                parent_holds_listener,
                parent_unable,
                is_master: stats.iter().any(|(_, s)| s.parent == pid),
                frozen: Some(frozen.to_string()),
                frozen_ms: self.frozen_ms(pid, st.start, now),
                workers,
                unanswered: 0,
                oldest_unanswered_ms: 0,
                last_sent_ms: None,
                cpu_percent: None,
                outbound_waiting: 0,
                start: st.start,
                listener: self.owners_inode,
            });
        }
        out
    }

    /// Keeps when each process of `stats` was first seen stopped or frozen; forgets the others.
    fn note_frozen(&mut self, stats: &[(u32, process::Stat)], now: Instant) {
        let frozen: Vec<(u32, u64)> = stats
            .iter()
            .filter(|(pid, st)| process::frozen_why(*pid, st.state).is_some())
            .map(|(pid, st)| (*pid, st.start))
            .collect();
        self.frozen_since.retain(|k, _| frozen.contains(k));
        for k in frozen {
            self.frozen_since.entry(k).or_insert(now);
        }
    }

    fn frozen_ms(&self, pid: u32, start: u64, now: Instant) -> u64 {
        self.frozen_since
            .get(&(pid, start))
            .map_or(0, |t| now.saturating_duration_since(*t).as_millis() as u64)
    }
}

/// The processes of `stats` that are no master of the others: the workers.
fn worker_count(stats: &[(u32, process::Stat)]) -> u32 {
    stats
        .iter()
        .filter(|(pid, _)| !stats.iter().any(|(_, s)| s.parent == *pid))
        .count() as u32
}

/// Why a worker's parent (its master) cannot replace it: stopped, frozen, gone.
fn parent_unable(parent: u32) -> Option<String> {
    match process::stat(parent) {
        Some(ps) => process::frozen_why(parent, ps.state).map(str::to_string),
        None => Some("gone".into()),
    }
}
