//! CPU, memory and load, averaged over `scaling.window`, turned into a `Pressure` with a little
//! hysteresis so the recommendation does not flap around a threshold.

use std::{
    collections::VecDeque,
    time::{Duration, Instant},
};

use serde::Serialize;
use sysinfo::{CpuRefreshKind, MemoryRefreshKind, RefreshKind, System};

use crate::{config::ScalingConfig, status::Pressure, text::round1};

/// Points below a threshold needed to leave High (or above to leave Low).
const HYSTERESIS: f64 = 5.0;

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct SystemReport {
    /// Latest sample.
    pub cpu_percent: f64,
    pub memory_percent: f64,
    /// Averages over the window (what decides pressure).
    pub cpu_avg_percent: f64,
    pub memory_avg_percent: f64,
    pub window_seconds: f64,
    pub load1: f64,
    pub load5: f64,
    pub cpus: usize,
    pub memory_total_bytes: u64,
    pub memory_available_bytes: u64,
    pub pressure: Pressure,
}

pub struct SystemMonitor {
    sys: Option<System>,
    samples: VecDeque<(Instant, f64, f64)>,
    cfg: ScalingConfig,
    pressure: Pressure,
}

impl SystemMonitor {
    pub fn new(cfg: ScalingConfig) -> Self {
        let kinds = RefreshKind::nothing()
            .with_cpu(CpuRefreshKind::nothing().with_usage())
            .with_memory(MemoryRefreshKind::nothing().with_ram());
        let sys = System::new_with_specifics(kinds)
            .map_err(|e| tracing::warn!("CPU and memory are unavailable: {e}"))
            .ok();
        Self {
            sys,
            samples: VecDeque::new(),
            cfg,
            pressure: Pressure::Normal,
        }
    }

    /// None when the host's CPU and memory figures cannot be read at all.
    pub fn sample(&mut self, now: Instant) -> Option<SystemReport> {
        let sys = self.sys.as_mut()?;
        sys.refresh_cpu_usage();
        sys.refresh_memory();
        let cpu = sys.global_cpu_usage() as f64;
        let total = sys.total_memory();
        let avail = sys.available_memory();
        let cpus = sys.cpus().len();
        let mem = if total == 0 {
            0.0
        } else {
            (total - avail.min(total)) as f64 * 100.0 / total as f64
        };
        self.samples.push_back((now, cpu, mem));
        while self
            .samples
            .front()
            .is_some_and(|(t, _, _)| now.saturating_duration_since(*t) > self.cfg.window)
        {
            self.samples.pop_front();
        }
        let n = self.samples.len() as f64;
        let cpu_avg = self.samples.iter().map(|s| s.1).sum::<f64>() / n;
        let mem_avg = self.samples.iter().map(|s| s.2).sum::<f64>() / n;
        let span = self.samples.front().map_or(Duration::ZERO, |(t, _, _)| {
            now.saturating_duration_since(*t)
        });
        self.pressure = next_pressure(self.pressure, cpu_avg, mem_avg, span, &self.cfg);
        let (load1, load5) = System::load_average().map_or((0.0, 0.0), |l| (l.one, l.five));
        Some(SystemReport {
            cpu_percent: round1(cpu),
            memory_percent: round1(mem),
            cpu_avg_percent: round1(cpu_avg),
            memory_avg_percent: round1(mem_avg),
            window_seconds: span.as_secs_f64().round(),
            load1,
            load5,
            cpus,
            memory_total_bytes: total,
            memory_available_bytes: avail,
            pressure: self.pressure,
        })
    }
}

/// Sustained means: averaged over at least half the window. Before that, Normal.
fn next_pressure(
    prev: Pressure,
    cpu: f64,
    mem: f64,
    span: Duration,
    cfg: &ScalingConfig,
) -> Pressure {
    if span < cfg.window / 2 {
        return Pressure::Normal;
    }
    let high = cpu >= cfg.cpu_high_percent || mem >= cfg.memory_high_percent;
    let still_high =
        cpu >= cfg.cpu_high_percent - HYSTERESIS || mem >= cfg.memory_high_percent - HYSTERESIS;
    let low = cpu <= cfg.cpu_low_percent && mem <= cfg.memory_low_percent;
    let still_low =
        cpu <= cfg.cpu_low_percent + HYSTERESIS && mem <= cfg.memory_low_percent + HYSTERESIS;
    match prev {
        _ if high => Pressure::High,
        Pressure::High if still_high => Pressure::High,
        _ if low => Pressure::Low,
        Pressure::Low if still_low => Pressure::Low,
        _ => Pressure::Normal,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pressure_needs_a_sustained_window_and_has_hysteresis() {
        let cfg = ScalingConfig::default();
        let full = cfg.window;
        let p = |prev, cpu, mem, span| next_pressure(prev, cpu, mem, span, &cfg);
        assert_eq!(
            p(Pressure::Normal, 99.0, 50.0, Duration::from_secs(1)),
            Pressure::Normal
        );
        assert_eq!(p(Pressure::Normal, 90.0, 50.0, full), Pressure::High);
        assert_eq!(p(Pressure::Normal, 50.0, 95.0, full), Pressure::High);
        // Just under the threshold keeps High; clearly under releases it.
        assert_eq!(p(Pressure::High, 82.0, 50.0, full), Pressure::High);
        assert_eq!(p(Pressure::High, 70.0, 50.0, full), Pressure::Normal);
        assert_eq!(p(Pressure::Normal, 5.0, 20.0, full), Pressure::Low);
        assert_eq!(p(Pressure::Low, 12.0, 20.0, full), Pressure::Low);
        assert_eq!(p(Pressure::Normal, 12.0, 20.0, full), Pressure::Normal);
        assert_eq!(p(Pressure::Low, 40.0, 20.0, full), Pressure::Normal);
    }

    #[test]
    fn samples_real_numbers() {
        let mut m = SystemMonitor::new(ScalingConfig::default());
        let r = m.sample(Instant::now()).expect("sysinfo works on Linux");
        assert!(r.memory_total_bytes > 0 && r.cpus > 0);
        assert!((0.0..=100.0).contains(&r.memory_percent));
    }
}
