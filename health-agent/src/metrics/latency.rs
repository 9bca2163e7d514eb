//! The web backend's answer latency as a real Prometheus histogram, from the kernel's
//! log-scale buckets.

use super::Out;

/// The answers' server latency as a Prometheus histogram, log-scale buckets from 1 ms to 60 s:
/// every answer the programs counted since the agent started (all of them with
/// `socket_tracing = "always"`, those of the counting windows with `"on_suspicion"`). Each
/// kernel bucket (two per power of two) falls into the first `le` at or above its midpoint;
/// `_sum` adds the midpoints (the kernel keeps counts, not the latencies themselves).
pub(super) fn histogram(o: &mut Out, h: &health_common::LatencyHist) {
    const LE: [f64; 15] = [
        0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 60.0,
    ];
    let mut buckets: Vec<(f64, u64)> = LE.iter().map(|&le| (le, 0)).collect();
    buckets.push((f64::INFINITY, 0));
    let (mut sum, mut count) = (0.0, 0);
    for (i, &n) in h.buckets.iter().enumerate().filter(|(_, n)| **n > 0) {
        let lo = health_common::latency_bucket_floor(i) as f64;
        let hi = if i + 1 < health_common::LATENCY_BUCKETS {
            health_common::latency_bucket_floor(i + 1) as f64
        } else {
            lo
        };
        let mid = (lo + hi) / 2.0 / 1e6;
        sum += mid * n as f64;
        count += n;
        let at = LE.iter().position(|&le| mid <= le).unwrap_or(LE.len());
        buckets[at].1 += n;
    }
    o.reg.register(
        "web_latency_seconds",
        "Server latency of the web backend's answers, request read to first response byte \
         (kernel-seen), since the agent started",
        LatencyHistogram {
            sum,
            count,
            buckets,
        },
    );
}

/// A histogram whose buckets are counted elsewhere (the kernel), encoded as one.
#[derive(Debug)]
struct LatencyHistogram {
    sum: f64,
    count: u64,
    /// (upper bound, count in that bucket alone): the encoder makes them cumulative.
    buckets: Vec<(f64, u64)>,
}

impl prometheus_client::encoding::EncodeMetric for LatencyHistogram {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::MetricEncoder,
    ) -> Result<(), std::fmt::Error> {
        encoder.encode_histogram::<prometheus_client::encoding::NoLabelSet>(
            self.sum,
            self.count,
            &self.buckets,
            None,
        )
    }

    fn metric_type(&self) -> prometheus_client::metrics::MetricType {
        prometheus_client::metrics::MetricType::Histogram
    }
}
