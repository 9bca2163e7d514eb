//! CPU, memory and load, averaged over `scaling.window`, each judged against its own
//! threshold with a little hysteresis (so the recommendation does not flap around one), and
//! turned into a `Pressure`.

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
    #[serde(serialize_with = "crate::text::shown::percent")]
    pub cpu_percent: f64,
    #[serde(serialize_with = "crate::text::shown::percent")]
    pub memory_percent: f64,
    /// Averages over the window (what decides pressure).
    #[serde(serialize_with = "crate::text::shown::percent")]
    pub cpu_avg_percent: f64,
    #[serde(serialize_with = "crate::text::shown::percent")]
    pub memory_avg_percent: f64,
    /// Each resource against its own threshold (`scaling.cpu_high_percent`,
    /// `scaling.memory_high_percent`), sustained: busy CPU is no reason to call memory high.
    pub cpu_high: bool,
    pub memory_high: bool,
    #[serde(serialize_with = "crate::text::shown::hundredths")]
    pub window_seconds: f64,
    #[serde(serialize_with = "crate::text::shown::hundredths")]
    pub load1: f64,
    #[serde(serialize_with = "crate::text::shown::hundredths")]
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
    levels: Levels,
}

/// Where CPU and memory stand against their thresholds: each resource on its own, and the
/// pressure they make together (the previous round's, for the hysteresis).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Levels {
    cpu_high: bool,
    memory_high: bool,
    pressure: Pressure,
}

impl Levels {
    const NORMAL: Self = Self {
        cpu_high: false,
        memory_high: false,
        pressure: Pressure::Normal,
    };
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
            levels: Levels::NORMAL,
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
        self.levels = next_levels(self.levels, cpu_avg, mem_avg, span, &self.cfg);
        let (load1, load5) = System::load_average().map_or((0.0, 0.0), |l| (l.one, l.five));
        Some(SystemReport {
            cpu_percent: round1(cpu),
            memory_percent: round1(mem),
            cpu_avg_percent: round1(cpu_avg),
            memory_avg_percent: round1(mem_avg),
            cpu_high: self.levels.cpu_high,
            memory_high: self.levels.memory_high,
            window_seconds: span.as_secs_f64().round(),
            load1,
            load5,
            cpus,
            memory_total_bytes: total,
            memory_available_bytes: avail,
            pressure: self.levels.pressure,
        })
    }
}

/// Whether one resource is high: at or above its threshold, or still within HYSTERESIS of it
/// once it was.
fn high(was: bool, avg: f64, threshold: f64) -> bool {
    avg >= threshold || (was && avg >= threshold - HYSTERESIS)
}

/// Sustained means: averaged over at least half the window. Before that, Normal. High when
/// either resource is high on its own; Low only when both are low.
fn next_levels(prev: Levels, cpu: f64, mem: f64, span: Duration, cfg: &ScalingConfig) -> Levels {
    if span < cfg.window / 2 {
        return Levels::NORMAL;
    }
    let cpu_high = high(prev.cpu_high, cpu, cfg.cpu_high_percent);
    let memory_high = high(prev.memory_high, mem, cfg.memory_high_percent);
    let low = cpu <= cfg.cpu_low_percent && mem <= cfg.memory_low_percent;
    let still_low =
        cpu <= cfg.cpu_low_percent + HYSTERESIS && mem <= cfg.memory_low_percent + HYSTERESIS;
    let pressure = match prev.pressure {
        _ if cpu_high || memory_high => Pressure::High,
        _ if low => Pressure::Low,
        Pressure::Low if still_low => Pressure::Low,
        _ => Pressure::Normal,
    };
    Levels {
        cpu_high,
        memory_high,
        pressure,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pressure after `prev` (its resources high as it says), for averages of `cpu` and
    /// `mem` over `span`.
    fn pressure(prev: Pressure, cpu: f64, mem: f64, span: Duration) -> Pressure {
        let cfg = ScalingConfig::default();
        let was = Levels {
            cpu_high: prev == Pressure::High,
            memory_high: false,
            pressure: prev,
        };
        next_levels(was, cpu, mem, span, &cfg).pressure
    }

    #[test]
    fn pressure_needs_a_sustained_window_and_has_hysteresis() {
        let full = ScalingConfig::default().window;
        let p = pressure;
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
    fn cpu_and_memory_are_each_judged_by_their_own_threshold() {
        let cfg = ScalingConfig::default();
        let full = cfg.window;
        let step = |prev, cpu, mem| next_levels(prev, cpu, mem, full, &cfg);
        // Busy CPU, 4 % memory: only the CPU is high.
        let busy = step(Levels::NORMAL, 95.0, 4.0);
        assert_eq!(
            (busy.cpu_high, busy.memory_high, busy.pressure),
            (true, false, Pressure::High)
        );
        // Memory high, CPU idle: only the memory.
        let full_mem = step(Levels::NORMAL, 3.0, 92.0);
        assert_eq!(
            (full_mem.cpu_high, full_mem.memory_high, full_mem.pressure),
            (false, true, Pressure::High)
        );
        // Each keeps its own hysteresis: memory just under its threshold (90 - 3) after the
        // CPU was high is not high memory, and the CPU leaves High by its own figure.
        let after = step(busy, 50.0, 87.0);
        assert_eq!(
            (after.cpu_high, after.memory_high, after.pressure),
            (false, false, Pressure::Normal)
        );
        let held = step(full_mem, 50.0, 87.0);
        assert_eq!(
            (held.cpu_high, held.memory_high, held.pressure),
            (false, true, Pressure::High)
        );
    }

    #[test]
    fn samples_real_numbers() {
        let mut m = SystemMonitor::new(ScalingConfig::default());
        let r = m.sample(Instant::now()).expect("sysinfo works on Linux");
        assert!(r.memory_total_bytes > 0 && r.cpus > 0);
        assert!((0.0..=100.0).contains(&r.memory_percent));
    }
}
