//! The map reads: counters, latency, the connection table, answers and map errors, into plain
//! samples.

use std::time::Duration;

use health_common::{maps, ConnState, LatencyHist, MapErrorKind, PortCounters, WatchKey};

use super::{answers, KernelSample, KernelView, MapErrors, PortSample};

impl KernelView {
    /// What `port` answered since the programs loaded, by status class (every namespace it
    /// is watched in), or why that is not visible.
    pub fn answer_counters(
        &self,
        port: u16,
    ) -> Result<health_common::AnswerCounters, answers::AnswersError> {
        let a = self.answers.as_ref().map_err(Clone::clone)?;
        let mut sum = health_common::AnswerCounters::default();
        for (slot, key) in (0u32..).zip(&self.watched) {
            if key.port == port {
                sum.add(&a.counters(slot));
            }
        }
        Ok(sum)
    }

    /// The counters of every watched port, in the order given to `load`: one map read, cheap
    /// enough for every tick.
    pub fn counters(&self) -> Vec<PortCounters> {
        (0..self.watched.len() as u32)
            .map(|slot| self.port_counters(slot))
            .collect()
    }

    fn port_counters(&self, slot: u32) -> PortCounters {
        let mut counters = PortCounters::default();
        if let Ok(per_cpu) = self.counters.get(&slot, 0) {
            for c in per_cpu.iter() {
                counters.add(c);
            }
        }
        counters
    }

    /// One port's counters and latency histogram, summed over its slots (no connection-table
    /// read): what the figures of a span are made of.
    pub fn port_totals(&self, port: u16) -> (PortCounters, LatencyHist) {
        let (mut counters, mut latency) = (PortCounters::default(), LatencyHist::default());
        for (slot, key) in (0u32..).zip(&self.watched) {
            if key.port != port {
                continue;
            }
            counters.add(&self.port_counters(slot));
            if let Ok(per_cpu) = self.latency.get(&slot, 0) {
                for h in per_cpu.iter() {
                    for (sum, b) in latency.buckets.iter_mut().zip(h.buckets.iter()) {
                        *sum += b;
                    }
                }
            }
        }
        (counters, latency)
    }

    /// Reads every map once. Cost grows with the connection table only while connections wait
    /// or requests are pending; otherwise it is a handful of syscalls.
    pub fn sample(&self) -> KernelSample {
        let now_ns = monotonic_ns();
        let mut ports: Vec<PortSample> = self
            .watched
            .iter()
            .zip(0u32..)
            .map(|(&WatchKey { port, .. }, slot)| {
                let counters = self.port_counters(slot);
                let mut latency = LatencyHist::default();
                if let Ok(per_cpu) = self.latency.get(&slot, 0) {
                    for h in per_cpu.iter() {
                        for (sum, b) in latency.buckets.iter_mut().zip(h.buckets.iter()) {
                            *sum += b;
                        }
                    }
                }
                PortSample {
                    port,
                    counters,
                    latency,
                    answers: self.answers.as_ref().ok().map(|a| a.counters(slot)),
                    ..PortSample::default()
                }
            })
            .collect();

        let maybe_busy = ports
            .iter()
            .any(|p| p.counters.waiting() > 0 || p.counters.pending() > 0);
        if maybe_busy {
            for conn in self.conn_entries() {
                let Some(p) = ports.get_mut(conn.slot as usize) else {
                    continue;
                };
                if conn.claimed_ns == 0 {
                    p.waiting += 1;
                    let age = Duration::from_nanos(now_ns.saturating_sub(conn.established_ns));
                    p.oldest_waiting = Some(p.oldest_waiting.map_or(age, |o| o.max(age)));
                } else if conn.first_request_ns != 0 && conn.first_response_ns == 0 {
                    p.pending += 1;
                    let age = Duration::from_nanos(now_ns.saturating_sub(conn.first_request_ns));
                    p.oldest_pending = Some(p.oldest_pending.map_or(age, |o| o.max(age)));
                }
            }
        }
        let accepts = self.accepts.iter().filter_map(Result::ok).collect();
        KernelSample {
            ports,
            accepts,
            map_errors: self.map_errors(),
            now_ns,
        }
    }

    /// Every entry of the connection table: in a few batch reads where the kernel has them,
    /// else entry by entry (two syscalls each).
    pub(super) fn conn_entries(&self) -> Vec<ConnState> {
        use std::{os::fd::AsFd, sync::atomic::Ordering};
        if let Some(fd) = self
            .conns_fd
            .as_ref()
            .filter(|_| !self.conns_batch_failed.load(Ordering::Relaxed))
        {
            match crate::sys::bpf::lookup_all::<u64, ConnState>(fd.as_fd()) {
                Ok(entries) => return entries.into_iter().map(|(_, c)| c).collect(),
                Err(e) => {
                    self.conns_batch_failed.store(true, Ordering::Relaxed);
                    tracing::info!(
                        "the connection table cannot be read in batches ({e}): entry by entry"
                    );
                }
            }
        }
        self.conns
            .iter()
            .filter_map(Result::ok)
            .map(|(_, c)| c)
            .collect()
    }

    /// The map-error counters, summed over CPUs: one small map read. A slot that cannot be
    /// read counts as 0 (the map is the programs' own; a failed read is the agent's trouble,
    /// logged at debug, and must not turn into a figure).
    pub fn map_errors(&self) -> MapErrors {
        let per_cpu: Vec<(MapErrorKind, aya::maps::PerCpuValues<u64>)> = MapErrorKind::ALL
            .into_iter()
            .filter_map(|kind| match self.map_errors.get(&(kind as u32), 0) {
                Ok(v) => Some((kind, v)),
                Err(e) => {
                    tracing::debug!("reading {} {kind:?}: {e}", maps::MAP_ERRORS);
                    None
                }
            })
            .collect();
        MapErrors::sum(per_cpu.iter().map(|(kind, v)| (*kind, &v[..])))
    }
}

/// CLOCK_MONOTONIC in nanoseconds: the clock of `bpf_ktime_get_ns`.
pub fn monotonic_ns() -> u64 {
    crate::sys::monotonic().as_nanos() as u64
}
