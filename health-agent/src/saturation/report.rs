//! What S is made of and how it is reported: the parts, the largest, and the report
//! `/health`, `/metrics` and CloudWatch show (or why it is withheld).

use std::time::Duration;

use serde::Serialize;

use super::{round2, Basis, Capacity, Estimate, WebLoad, INSTANT};

/// The parts of S, each a ratio (1.0 = that resource at capacity).
#[derive(Debug, Clone, PartialEq, Serialize, Default)]
pub struct Parts {
    /// The web backend's workers: λ·E[S]/c.
    #[serde(serialize_with = "crate::text::shown::ratio_opt")]
    pub web: Option<f64>,
    /// The web backend's processes' CPU over the cores they can use.
    #[serde(serialize_with = "crate::text::shown::ratio_opt")]
    pub backend_cpu: Option<f64>,
    /// The host's CPU, averaged over the window (busy fraction of every core).
    #[serde(serialize_with = "crate::text::shown::ratio_opt")]
    pub cpu: Option<f64>,
    /// The host's memory between `scaling.memory_low_percent` (0) and
    /// `scaling.memory_high_percent` (1.0): memory in use is no load until it nears the limit.
    #[serde(serialize_with = "crate::text::shown::ratio_opt")]
    pub memory: Option<f64>,
}

impl Parts {
    /// Each part by name, in a fixed order.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, Option<f64>)> {
        [
            ("web", self.web),
            ("backend_cpu", self.backend_cpu),
            ("cpu", self.cpu),
            ("memory", self.memory),
        ]
        .into_iter()
    }

    /// The largest part and its name.
    pub fn largest(&self) -> Option<(&'static str, f64)> {
        self.iter().filter_map(|(n, v)| v.map(|v| (n, v))).fold(
            None,
            |best: Option<(&str, f64)>, (n, v)| match best {
                Some((_, b)) if b >= v => best,
                _ => Some((n, v)),
            },
        )
    }

    fn rounded(&self) -> Self {
        let r = |v: Option<f64>| v.map(round2);
        Self {
            web: r(self.web),
            backend_cpu: r(self.backend_cpu),
            cpu: r(self.cpu),
            memory: r(self.memory),
        }
    }
}

/// `details.saturation`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SaturationReport {
    /// S averaged over the window; None while withheld or unknown.
    #[serde(serialize_with = "crate::text::shown::ratio_opt")]
    pub ratio: Option<f64>,
    /// S over the latest few seconds (shown while withheld too: what the blocked work looks
    /// like).
    #[serde(serialize_with = "crate::text::shown::ratio_opt")]
    pub instant: Option<f64>,
    /// The part S is, by name.
    pub largest: Option<&'static str>,
    pub parts: Parts,
    pub capacity: Capacity,
    /// Why S is not published now (a dependency fault holds), or null.
    pub withheld: Option<String>,
    #[serde(serialize_with = "crate::text::shown::hundredths")]
    pub window_seconds: f64,
    /// The web backend's load as the kernel saw it over the window.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub web: Option<WebLoad>,
    /// What the web part cannot see, when something.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// Host CPU and memory, averaged over the window (percent).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HostLoad {
    pub cpu_percent: f64,
    pub memory_percent: f64,
}

/// Inputs of [`assess`] other than the meter's estimates.
#[derive(Debug, Clone)]
pub struct Context {
    pub host: Option<HostLoad>,
    pub memory_low_percent: f64,
    pub memory_high_percent: f64,
    /// Why S must not be published now, if a dependency fault holds.
    pub withheld: Option<String>,
    /// The kernel view is not running (no web part can be had).
    pub no_kernel: Option<String>,
    pub window: Duration,
}

/// S and its parts from the window's and the latest seconds' estimates.
pub fn assess(
    window: Option<&Estimate>,
    latest: Option<&Estimate>,
    capacity: Capacity,
    cx: &Context,
) -> SaturationReport {
    let host = |e: Option<&Estimate>| Parts {
        web: e.and_then(|e| e.web),
        backend_cpu: e.and_then(|e| e.backend_cpu),
        cpu: cx.host.map(|h| h.cpu_percent / 100.0),
        memory: cx.host.map(|h| {
            let span = (cx.memory_high_percent - cx.memory_low_percent).max(1.0);
            ((h.memory_percent - cx.memory_low_percent) / span).max(0.0)
        }),
    };
    let parts = host(window);
    let largest = parts.largest();
    let instant = host(latest).largest().map(|(_, v)| round2(v));
    let note = if let Some(why) = &cx.no_kernel {
        Some(format!("no web part without the kernel view: {why}"))
    } else if window.is_some_and(|e| e.unsure && e.web.is_none()) {
        Some(
            "web part unknown: keep-alive requests follow their answers within a jiffy (4 ms) \
             while the connection programs are detached (web.socket_tracing = \"on_suspicion\"), \
             and sock_diag's timers cannot tell such a request in service from one answered; \
             \"always\" counts every exchange"
                .into(),
        )
    } else if capacity.basis == Basis::Unknown {
        Some(
            "web part unknown: no work has waited in the accept queue yet, so the number of \
             workers is not learned — either the backend was never full, or it reads requests \
             before a worker is free (Puma's reactor, an event loop), where the kernel cannot \
             see the hand-over: set web.workers"
                .into(),
        )
    } else {
        None
    };
    SaturationReport {
        ratio: largest
            .filter(|_| cx.withheld.is_none())
            .map(|(_, v)| round2(v)),
        instant,
        largest: largest.map(|(n, _)| n),
        parts: parts.rounded(),
        capacity,
        withheld: cx.withheld.clone(),
        window_seconds: cx.window.as_secs_f64(),
        web: window.map(|e| e.load.clone()),
        note,
    }
}

impl SaturationReport {
    /// Before the first round (and in `health-agent check`): nothing measured.
    pub fn unknown(window: Duration) -> Self {
        assess(
            None,
            None,
            Capacity {
                workers: None,
                basis: Basis::Unknown,
                cores: 0.0,
                cores_basis: Basis::Unknown,
            },
            &Context {
                host: None,
                memory_low_percent: 30.0,
                memory_high_percent: 90.0,
                withheld: None,
                no_kernel: None,
                window,
            },
        )
    }

    /// This report with S withheld for `why`, unless it already is (the first reason stands).
    pub fn withheld_for(self, why: &str) -> Self {
        if self.withheld.is_some() {
            return self;
        }
        Self {
            withheld: Some(why.into()),
            ratio: None,
            ..self
        }
    }

    /// `checks.saturation`: "42%", "withheld" or "unknown".
    pub fn summary(&self) -> String {
        match (self.ratio, &self.withheld) {
            (_, Some(_)) => "withheld".into(),
            (Some(r), None) => format!("{:.0}%", r * 100.0),
            (None, None) => "unknown".into(),
        }
    }

    pub fn instant_window() -> Duration {
        INSTANT
    }
}
