//! What one read of the kernel programs' maps gives: per watched port, the accepts, and the
//! map-error counters. Plain data, built by `KernelView::sample`.

use std::time::Duration;

use health_common::{
    AcceptKey, AcceptStat, AnswerCounters, LatencyHist, MapErrorKind, PortCounters,
};
use serde::ser::{Serialize, SerializeMap, Serializer};

/// What the kernel saw for one watched port, at one instant.
#[derive(Debug, Clone, Default)]
pub struct PortSample {
    pub port: u16,
    pub counters: PortCounters,
    pub latency: LatencyHist,
    /// Established connections no process has touched yet (waiting in the accept queue).
    pub waiting: u32,
    pub oldest_waiting: Option<Duration>,
    /// Connections whose first request was read and not yet answered.
    pub pending: u32,
    pub oldest_pending: Option<Duration>,
    /// What the port answered, by status class (None: the answer programs are not attached).
    pub answers: Option<AnswerCounters>,
}

#[derive(Debug, Clone, Default)]
pub struct KernelSample {
    pub ports: Vec<PortSample>,
    /// Successful accepts per (process, listen fd); user space maps them to listen ports.
    pub accepts: Vec<(AcceptKey, AcceptStat)>,
    /// Map updates the programs could not make, since they loaded.
    pub map_errors: MapErrors,
    /// CLOCK_MONOTONIC of the sample, the kernel programs' clock.
    pub now_ns: u64,
}

/// Map updates the kernel programs could not make since they loaded, by kind: each one is an
/// observation lost (a connection not followed, an event not counted), so the counters that
/// depend on it read low. Serialized as `{"conn_insert": 0, ...}`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MapErrors([u64; MapErrorKind::COUNT as usize]);

impl MapErrors {
    /// Sums the per-CPU values of each kind's slot (`MAP_ERRORS` as read from the kernel).
    pub fn sum<'a>(per_cpu: impl IntoIterator<Item = (MapErrorKind, &'a [u64])>) -> Self {
        let mut sums = Self::default();
        for (kind, cpus) in per_cpu {
            sums.0[kind as usize] += cpus.iter().sum::<u64>();
        }
        sums
    }

    pub fn get(&self, kind: MapErrorKind) -> u64 {
        self.0[kind as usize]
    }

    /// Every kind with its count, zeros included, in `MapErrorKind::ALL` order.
    pub fn iter(&self) -> impl Iterator<Item = (MapErrorKind, u64)> + '_ {
        MapErrorKind::ALL.into_iter().map(|k| (k, self.get(k)))
    }
}

impl Serialize for MapErrors {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(MapErrorKind::ALL.len()))?;
        for (kind, n) in self.iter() {
            map.serialize_entry(kind.as_str(), &n)?;
        }
        map.end()
    }
}
