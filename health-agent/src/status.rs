//! The vocabulary of states every module shares: what a check found (`WebVerdict`, `DiskLevel`,
//! `DbState`, `ContainersState`, `Pressure`), where healing stands (`HealPhase`), what the
//! policy answers (`Status`, `Recommendation`) and how the peers judge a fault (`FaultClass`,
//! `Scope`). A leaf: it imports nothing of the crate, so checks, policy, fleet, alerts and
//! metrics can all use it without importing each other.
//!
//! Each state's name is written once: it is the JSON value (serde), `as_str` (metrics, the
//! seed's summaries, reasons) and an entry of `ALL` (metrics state sets).

/// Declares a state enum whose variants each name their wire spelling once. Generates the
/// serde renames, `as_str` and `ALL` (every variant, in declaration order) from that one list,
/// so the three cannot drift apart.
macro_rules! states {
    (
        $(#[$meta:meta])*
        pub enum $name:ident {
            $(
                $(#[$vmeta:meta])*
                $variant:ident => $wire:literal,
            )+
        }
    ) => {
        $(#[$meta])*
        #[derive(
            Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
        )]
        pub enum $name {
            $(
                $(#[$vmeta])*
                #[serde(rename = $wire)]
                $variant,
            )+
        }

        impl $name {
            /// Every state, in declaration order.
            pub const ALL: [Self; [$($name::$variant),+].len()] = [$(Self::$variant),+];

            /// The state as JSON, metrics and the reasons spell it.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(Self::$variant => $wire,)+
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

states! {
    /// The web backend as the kernel view and the probe see it.
    pub enum WebVerdict {
        /// `web.port` is 0: nothing to check.
        NotConfigured => "not_configured",
        /// Listening, but no evidence yet either way.
        Unknown => "unknown",
        Up => "up",
        Slow => "slow",
        /// Its own outbound requests (database, cache, API) go unanswered: a dependency's fault.
        Waiting => "waiting",
        /// Some of the server's processes answer while one holds work that does not move (a
        /// stopped, frozen or deadlocked worker): half capacity, which replacing that one
        /// worker fixes, not a new instance and not scaling up.
        PartialHang => "partial_hang",
        /// It answers, but its real answers are mostly 5xx (the status classes the kernel
        /// sees, the probe path's requests left out) while its probe passes: a bad box, or a
        /// bad deploy when the peers err too.
        Erroring => "erroring",
        Hung => "hung",
        Unresponsive => "unresponsive",
        Down => "down",
    }
}

impl WebVerdict {
    /// A fault of the backend itself, which a restart or a new instance may fix.
    pub fn is_fault(self) -> bool {
        matches!(self, Self::Hung | Self::Unresponsive | Self::Down)
    }
}

states! {
    /// The worst configured mount against the warn/fail thresholds.
    pub enum DiskLevel {
        Ok => "ok",
        Warn => "warn",
        Fail => "fail",
        Unknown => "unknown",
    }
}

states! {
    /// The configured databases, worst first (unreachable > slow > unknown > connected).
    pub enum DbState {
        NotConfigured => "not_configured",
        Connected => "connected",
        Slow => "slow",
        Unreachable => "unreachable",
        /// The database answered and refused us (authentication failed, unknown database, TLS
        /// refused): a configuration error to fix, not an outage. Alerted, never a 503, and it
        /// never hides a web fault.
        Misconfigured => "misconfigured",
        /// Not checked yet.
        Unknown => "unknown",
    }
}

states! {
    /// The expected containers.
    pub enum ContainersState {
        NotConfigured => "not_configured",
        AllRunning => "all_running",
        /// An expected container is missing, exited or unhealthy.
        Faulty => "faulty",
        /// The Docker daemon did not answer: a warning, not a fault.
        Unknown => "unknown",
    }
}

states! {
    /// Sustained CPU and memory use against the scaling thresholds.
    pub enum Pressure {
        High => "high",
        Normal => "normal",
        Low => "low",
    }
}

states! {
    /// Where self-healing stands for the current fault.
    pub enum HealPhase {
        /// Nothing is being healed (no target, disabled, or no fault).
        Idle => "idle",
        /// A restart was issued and is within `heal.timeout`.
        Recovering => "recovering",
        /// Restarts were tried and failed, or the budget is spent.
        Exhausted => "exhausted",
    }
}

states! {
    /// The instance's status, as `/health` reports it.
    pub enum Status {
        Healthy => "healthy",
        Degraded => "degraded",
        Unhealthy => "unhealthy",
        Booting => "booting",
        Recovering => "recovering",
        /// Taken out on purpose (`health-agent drain`, the lifecycle hook): 503, not an
        /// incident.
        Draining => "draining",
    }
}

states! {
    /// What the scaling group should do.
    pub enum Recommendation {
        Stable => "stable",
        ScaleUp => "scale_up",
        ScaleDown => "scale_down",
        InfrastructureIssue => "infrastructure_issue",
    }
}

states! {
    /// The kinds of fault compared with the peers, each decided on its own.
    pub enum FaultClass {
        /// A dependency: the database unreachable or slow, or the web backend waiting on its
        /// own outbound requests. Compared by kind, not endpoint: every instance may reach the
        /// same database through a different path.
        Dependency => "dependency",
        /// The web backend hung, unresponsive or down.
        Web => "web",
        /// An expected container not running.
        Containers => "containers",
        /// The web backend erroring: its real answers mostly 5xx.
        Errors => "errors",
    }
}

states! {
    /// Whether the peers share a fault.
    pub enum Scope {
        /// Most peers that answered do not have it: this instance's own.
        Local => "local",
        /// Most peers that answered have it too: the fleet's.
        Shared => "shared",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `CamelCase` → `camel_case`, as serde's `rename_all = "snake_case"` spelled these states
    /// before they were listed here.
    fn snake(name: &str) -> String {
        let mut out = String::new();
        for (i, c) in name.char_indices() {
            if c.is_ascii_uppercase() && i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        }
        out
    }

    fn check<T>(all: &[T], as_str: fn(&T) -> &'static str)
    where
        T: std::fmt::Debug + serde::Serialize + serde::de::DeserializeOwned + PartialEq,
    {
        for v in all {
            let s = as_str(v);
            assert_eq!(
                s,
                snake(&format!("{v:?}")),
                "{v:?}: the JSON name is unchanged"
            );
            assert_eq!(serde_json::to_value(v).unwrap(), s, "{v:?}");
            let back: T = serde_json::from_value(serde_json::Value::from(s)).unwrap();
            assert_eq!(&back, v);
        }
    }

    #[test]
    fn every_state_is_spelled_once_the_way_json_always_did() {
        check(&WebVerdict::ALL, |v| v.as_str());
        check(&DiskLevel::ALL, |v| v.as_str());
        check(&DbState::ALL, |v| v.as_str());
        check(&ContainersState::ALL, |v| v.as_str());
        check(&Pressure::ALL, |v| v.as_str());
        check(&HealPhase::ALL, |v| v.as_str());
        check(&Status::ALL, |v| v.as_str());
        check(&Recommendation::ALL, |v| v.as_str());
        check(&FaultClass::ALL, |v| v.as_str());
        check(&Scope::ALL, |v| v.as_str());
        assert_eq!(WebVerdict::ALL.len(), 10);
        assert_eq!(DbState::ALL.len(), 6);
        assert_eq!(Status::Recovering.to_string(), "recovering");
    }
}
