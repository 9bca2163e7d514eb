//! What the programs watch (the ports) and which of them are attached: the accept tracepoints,
//! the programs that follow connections, the answer programs.

use aya::{
    maps::{MapData, PerCpuArray, PerCpuValues},
    programs::{RawTracePoint, TracePoint},
};
use health_common::{maps, port_bit, AcceptKey, WatchKey, MAX_PORTS};

use super::{
    answers, map_err, typed, FollowLink, KernelError, KernelView, NoSocketCalls, ACCEPT_PROGRAMS,
    RAW_PROGRAMS, STATE_CLASSIC, STATE_RAW,
};

impl KernelView {
    /// Watches `ports`, each a listen port in the network namespace with inode `netns`, instead
    /// of whatever was watched before (a restarted container has a new namespace). Slots follow
    /// the order given; counters of a slot carry on.
    pub fn watch(&mut self, ports: &[(u64, u16)]) -> Result<(), KernelError> {
        if ports.len() > MAX_PORTS as usize {
            return Err(KernelError::TooManyPorts);
        }
        let keys: Vec<WatchKey> = ports
            .iter()
            .map(|&(netns, port)| {
                // Namespace inodes are 32-bit in the kernel (`ns.inum`).
                WatchKey::new(if self.netns_keyed { netns as u32 } else { 0 }, port)
            })
            .collect();
        if keys == self.watched {
            return Ok(());
        }
        for old in std::mem::take(&mut self.watched) {
            let _ = self.watched_map.remove(&old);
            let (word, _) = port_bit(old.port);
            self.bitmap
                .set(word, 0, 0)
                .map_err(map_err(maps::PORT_BITMAP))?;
        }
        for (key, slot) in keys.iter().zip(0u32..) {
            self.watched_map
                .insert(key, slot, 0)
                .map_err(map_err(maps::WATCHED_PORTS))?;
            let (word, mask) = port_bit(key.port);
            let bits = self
                .bitmap
                .get(&word, 0)
                .map_err(map_err(maps::PORT_BITMAP))?;
            self.bitmap
                .set(word, bits | mask, 0)
                .map_err(map_err(maps::PORT_BITMAP))?;
        }
        let watched: Vec<String> = keys
            .iter()
            .map(|k| match k.netns {
                0 => format!("port {} in any namespace", k.port),
                ns => format!("port {} in namespace inode {ns}", k.port),
            })
            .collect();
        tracing::info!("kernel programs watch {}", watched.join(", "));
        self.watched = keys;
        Ok(())
    }

    /// Why the answers' status classes are not visible, when they are not.
    pub fn answers_unavailable(&self) -> Option<&answers::AnswersError> {
        self.answers.as_ref().err()
    }

    /// Whether the answer programs are attached now.
    pub fn answers_attached(&self) -> bool {
        self.answers.as_ref().is_ok_and(answers::Answers::attached)
    }

    /// Attaches or detaches the answer programs (sampling windows with `on_suspicion`).
    pub fn attach_answers(&mut self, on: bool) -> Result<(), answers::AnswersError> {
        match self.answers.as_mut() {
            Ok(a) => a.attach(&mut self.ebpf, on),
            Err(e) => Err(e.clone()),
        }
    }

    /// Tells the answer programs to count every segment sent (the `sock_diag` tier).
    pub fn count_segments_sent(&mut self) {
        if let Ok(a) = self.answers.as_mut() {
            if let Err(e) = a.count_sent(true) {
                tracing::warn!("segments sent will not be counted: {e}");
            }
        }
    }

    /// Tells the answer programs the probe path: its requests are not real traffic.
    pub fn set_probe_path(&mut self, path: &str) {
        if let Ok(a) = self.answers.as_mut() {
            if let Err(e) = a.set_probe_path(path) {
                tracing::warn!("the probe's requests will count as real traffic: {e}");
            }
        }
    }

    /// Why the socket-call tracepoints cannot attach (the `sock_diag` tier), when they cannot.
    pub fn socket_calls_missing(&self) -> Option<&NoSocketCalls> {
        self.socket_calls.as_ref().err()
    }

    /// Whether connections are told apart by network namespace.
    pub fn netns_keyed(&self) -> bool {
        self.netns_keyed
    }

    /// Whether the accept tracepoints are attached.
    pub fn accepts_watched(&self) -> bool {
        !self.accept_links.is_empty()
    }

    /// Attaches or detaches the accept tracepoints. Attaching starts the accept statistics
    /// afresh: accepts made while detached were not seen, so older figures would mislead.
    pub fn watch_accepts(&mut self, on: bool) -> Result<(), KernelError> {
        if on == self.accepts_watched() {
            return Ok(());
        }
        if on {
            let stale: Vec<AcceptKey> = self.accepts.keys().filter_map(Result::ok).collect();
            for key in stale {
                let _ = self.accepts.remove(&key);
            }
            for (name, category, tracepoint) in ACCEPT_PROGRAMS {
                let link = self
                    .tracepoint(name)?
                    .attach(category, tracepoint)
                    .map_err(|source| KernelError::Program { name, source });
                match link {
                    Ok(link) => self.accept_links.push((name, link)),
                    Err(e) => {
                        let _ = self.watch_accepts(false);
                        return Err(e);
                    }
                }
            }
        } else {
            for (name, link) in std::mem::take(&mut self.accept_links) {
                self.tracepoint(name)?
                    .detach(link)
                    .map_err(|source| KernelError::Program { name, source })?;
            }
        }
        Ok(())
    }

    fn tracepoint(&mut self, name: &'static str) -> Result<&mut TracePoint, KernelError> {
        typed(&mut self.ebpf, name)
    }

    fn raw_tracepoint(&mut self, name: &'static str) -> Result<&mut RawTracePoint, KernelError> {
        typed(&mut self.ebpf, name)
    }

    /// Whether the TCP state and send/receive programs are attached.
    pub fn following(&self) -> bool {
        !self.follow_links.is_empty()
    }

    /// Attaches or detaches the programs that follow connections: the TCP state hook and the
    /// send/receive raw tracepoints. Attaching starts afresh: the connection table is emptied
    /// (connections closed while detached would otherwise stay in it for ever) and the
    /// counters and latency histogram restart from zero, so what they count is consistent —
    /// every connection in them was seen from its handshake, or taken up at its first socket
    /// call after it (its exchanges only: see `tcp_state::adopt` in the programs); sock_diag
    /// covers what happened on it before.
    pub fn follow(&mut self, on: bool) -> Result<(), KernelError> {
        if on == self.following() {
            return Ok(());
        }
        if let (true, Err(why)) = (on, &self.socket_calls) {
            return Err(KernelError::Tracefs(why.to_string()));
        }
        if !on {
            for link in std::mem::take(&mut self.follow_links) {
                match link {
                    FollowLink::Raw(name, id) => self
                        .raw_tracepoint(name)?
                        .detach(id)
                        .map_err(|source| KernelError::Program { name, source })?,
                    FollowLink::Classic(name, id) => self
                        .tracepoint(name)?
                        .detach(id)
                        .map_err(|source| KernelError::Program { name, source })?,
                }
            }
            return Ok(());
        }
        self.restart_counts()?;
        // The state hook first: a connection is in the table before its first read is seen.
        let state = self.state_hook;
        let link = if state == STATE_RAW {
            self.raw_tracepoint(state)?
                .attach(STATE_CLASSIC)
                .map(|id| FollowLink::Raw(state, id))
        } else {
            self.tracepoint(state)?
                .attach("sock", STATE_CLASSIC)
                .map(|id| FollowLink::Classic(state, id))
        };
        let link = link.map_err(|source| KernelError::Program {
            name: state,
            source,
        })?;
        self.follow_links.push(link);
        for name in RAW_PROGRAMS {
            match self.raw_tracepoint(name)?.attach(name) {
                Ok(id) => self.follow_links.push(FollowLink::Raw(name, id)),
                Err(source) => {
                    let _ = self.follow(false);
                    return Err(KernelError::Program { name, source });
                }
            }
        }
        Ok(())
    }

    /// Empties the connection table and zeroes the counters and histograms (nothing is
    /// attached to change them meanwhile).
    fn restart_counts(&mut self) -> Result<(), KernelError> {
        let stale: Vec<u64> = self.conns.keys().filter_map(Result::ok).collect();
        for key in stale {
            let _ = self.conns.remove(&key);
        }
        let cpus = aya::util::nr_cpus().map_err(|(_, e)| KernelError::Map {
            name: maps::PORT_COUNTERS,
            detail: format!("counting CPUs: {e}"),
        })?;
        for slot in 0..MAX_PORTS {
            zero_slot(&mut self.counters, slot, cpus, maps::PORT_COUNTERS)?;
            zero_slot(&mut self.latency, slot, cpus, maps::LATENCY)?;
        }
        Ok(())
    }
}

/// Sets every CPU's copy of `slot` in the per-CPU array `name` to zeros.
fn zero_slot<T: aya::Pod + Default + Clone>(
    map: &mut PerCpuArray<MapData, T>,
    slot: u32,
    cpus: usize,
    name: &'static str,
) -> Result<(), KernelError> {
    let zeros = PerCpuValues::try_from(vec![T::default(); cpus]).map_err(|e| KernelError::Map {
        name,
        detail: e.to_string(),
    })?;
    map.set(slot, zeros, 0).map_err(map_err(name))
}
