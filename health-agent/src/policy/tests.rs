//! The status table and the flap guard, one row per case.

use std::ops::{Deref, DerefMut};
use std::time::{Duration, Instant};

use super::*;
use crate::status::HealPhase;

/// A case as the runner judges it: the policy's decision, then the heal phase the case names
/// applied the way the runner applies it (`heal::applied`); without one, the policy's decision
/// as it is.
struct Round {
    input: PolicyInput,
    heal: Option<HealPhase>,
}

impl Round {
    fn decide(&self) -> Decision {
        let raw = evaluate(&self.input);
        match self.heal {
            Some(phase) => crate::heal::applied(raw, phase),
            None => raw,
        }
    }
}

impl From<PolicyInput> for Round {
    fn from(input: PolicyInput) -> Self {
        Self { input, heal: None }
    }
}

impl Deref for Round {
    type Target = PolicyInput;
    fn deref(&self) -> &PolicyInput {
        &self.input
    }
}

impl DerefMut for Round {
    fn deref_mut(&mut self) -> &mut PolicyInput {
        &mut self.input
    }
}

/// `input` judged with the heal phase `phase`.
fn healing(phase: HealPhase, input: PolicyInput) -> Round {
    Round {
        input,
        heal: Some(phase),
    }
}

fn input() -> PolicyInput {
    PolicyInput {
        web: WebVerdict::Up,
        database: DbState::Connected,
        containers: ContainersState::AllRunning,
        ..PolicyInput::default()
    }
}

/// One row per line of the status table in docs/verdicts.md (and the edges around it).
#[test]
fn status_table() {
    use Recommendation::*;
    use Status::*;
    type Case = (&'static str, fn(&mut Round), Status, u16, Recommendation);
    let cases: &[Case] = &[
        ("all fine", |_| {}, Healthy, 200, Stable),
        (
            "one worker stuck, the others answer",
            |i| i.web = WebVerdict::PartialHang,
            Degraded,
            200,
            Stable,
        ),
        (
            "one worker stuck while the rest run hot: still no scale_up",
            |i| {
                i.web = WebVerdict::PartialHang;
                i.pressure = Pressure::High;
            },
            Degraded,
            200,
            Stable,
        ),
        (
            "one worker stuck while the database is down: the database's issue",
            |i| {
                i.web = WebVerdict::PartialHang;
                i.database = DbState::Unreachable;
            },
            Degraded,
            200,
            InfrastructureIssue,
        ),
        (
            "all fine, sustained low use",
            |i| i.pressure = Pressure::Low,
            Healthy,
            200,
            ScaleDown,
        ),
        (
            "web down, no heal possible",
            |i| i.web = WebVerdict::Down,
            Unhealthy,
            503,
            Stable,
        ),
        (
            "web down, heal failed",
            |i| {
                i.web = WebVerdict::Down;
                i.heal = Some(HealPhase::Exhausted);
            },
            Unhealthy,
            503,
            Stable,
        ),
        (
            "container not running",
            |i| i.containers = ContainersState::Faulty,
            Unhealthy,
            503,
            Stable,
        ),
        (
            "web hung after heal failed",
            |i| {
                i.web = WebVerdict::Hung;
                i.heal = Some(HealPhase::Exhausted);
            },
            Unhealthy,
            503,
            Stable,
        ),
        (
            "web unresponsive after heal failed",
            |i| {
                i.web = WebVerdict::Unresponsive;
                i.heal = Some(HealPhase::Exhausted);
            },
            Unhealthy,
            503,
            Stable,
        ),
        (
            "disk at fail threshold",
            |i| i.disk = DiskLevel::Fail,
            Unhealthy,
            503,
            Stable,
        ),
        (
            "disk full while healing web: still 503",
            |i| {
                i.disk = DiskLevel::Fail;
                i.web = WebVerdict::Hung;
                i.heal = Some(HealPhase::Recovering);
            },
            Unhealthy,
            503,
            Stable,
        ),
        (
            "disk at warn threshold",
            |i| i.disk = DiskLevel::Warn,
            Degraded,
            200,
            Stable,
        ),
        (
            "disk unreadable",
            |i| i.disk = DiskLevel::Unknown,
            Degraded,
            200,
            Stable,
        ),
        (
            "database unreachable",
            |i| i.database = DbState::Unreachable,
            Degraded,
            200,
            InfrastructureIssue,
        ),
        (
            "database slow",
            |i| i.database = DbState::Slow,
            Degraded,
            200,
            InfrastructureIssue,
        ),
        (
            "web hung while database unreachable",
            |i| {
                i.web = WebVerdict::Hung;
                i.database = DbState::Unreachable;
            },
            Degraded,
            200,
            InfrastructureIssue,
        ),
        (
            "web unresponsive while database slow",
            |i| {
                i.web = WebVerdict::Unresponsive;
                i.database = DbState::Slow;
            },
            Degraded,
            200,
            InfrastructureIssue,
        ),
        (
            "web down while database unreachable",
            |i| {
                i.web = WebVerdict::Down;
                i.database = DbState::Unreachable;
            },
            Degraded,
            200,
            InfrastructureIssue,
        ),
        (
            "high cpu/memory",
            |i| i.pressure = Pressure::High,
            Degraded,
            200,
            ScaleUp,
        ),
        (
            "web slow",
            |i| i.web = WebVerdict::Slow,
            Degraded,
            200,
            ScaleUp,
        ),
        (
            "infrastructure beats scale_up",
            |i| {
                i.pressure = Pressure::High;
                i.database = DbState::Unreachable;
            },
            Degraded,
            200,
            InfrastructureIssue,
        ),
        (
            "low use but degraded: no scale_down",
            |i| {
                i.pressure = Pressure::Low;
                i.disk = DiskLevel::Warn;
            },
            Degraded,
            200,
            Stable,
        ),
        (
            "booting, the backend not yet seen serving: not ready",
            |i| {
                i.in_boot_grace = true;
                i.web_served = false;
                i.web = WebVerdict::Down;
            },
            Booting,
            503,
            Stable,
        ),
        (
            "booting, not yet serving, boot_status = 200 (no ASG grace period)",
            |i| {
                i.in_boot_grace = true;
                i.web_served = false;
                i.web = WebVerdict::Unknown;
                i.boot_status = 200;
            },
            Booting,
            200,
            Stable,
        ),
        (
            "booting, serving, other checks warming up",
            |i| {
                i.in_boot_grace = true;
                i.warming_up = true;
                i.database = DbState::Unknown;
            },
            Booting,
            200,
            Stable,
        ),
        (
            "booting, serving, every check in: still booting until the grace ends",
            |i| i.in_boot_grace = true,
            Booting,
            200,
            Stable,
        ),
        (
            "booting, serving, disk full: a fault is a fault",
            |i| {
                i.in_boot_grace = true;
                i.disk = DiskLevel::Fail;
            },
            Unhealthy,
            503,
            Stable,
        ),
        (
            "boot grace over, never served, database unreachable: still 503",
            |i| {
                i.web_served = false;
                i.web = WebVerdict::Waiting;
                i.database = DbState::Unreachable;
            },
            Unhealthy,
            503,
            Stable,
        ),
        (
            "the agent's own probe error while booting: not evidence, no 503",
            |i| {
                i.in_boot_grace = true;
                i.web_served = false;
                i.web = WebVerdict::Unknown;
                i.web_agent_error = true;
            },
            Booting,
            200,
            Stable,
        ),
        (
            "the agent's own probe error after the grace, never served: no 503",
            |i| {
                i.web_served = false;
                i.web = WebVerdict::Unknown;
                i.web_agent_error = true;
            },
            Degraded,
            200,
            Stable,
        ),
        (
            "waiting on a dependency",
            |i| i.web = WebVerdict::Waiting,
            Degraded,
            200,
            InfrastructureIssue,
        ),
        (
            "stopped server while the database is unreachable: local, 503",
            |i| {
                i.web = WebVerdict::Hung;
                i.web_stopped = true;
                i.database = DbState::Unreachable;
                i.heal = Some(HealPhase::Exhausted);
            },
            Unhealthy,
            503,
            Stable,
        ),
        (
            "database misconfigured",
            |i| i.database = DbState::Misconfigured,
            Degraded,
            200,
            Stable,
        ),
        (
            "database misconfigured never hides a web fault",
            |i| {
                i.database = DbState::Misconfigured;
                i.web = WebVerdict::Hung;
                i.heal = Some(HealPhase::Exhausted);
            },
            Unhealthy,
            503,
            Stable,
        ),
        (
            "self-heal in progress",
            |i| {
                i.web = WebVerdict::Hung;
                i.heal = Some(HealPhase::Recovering);
            },
            Recovering,
            200,
            Stable,
        ),
        (
            "docker unreachable is a warning",
            |i| i.containers = ContainersState::Unknown,
            Degraded,
            200,
            Stable,
        ),
        (
            "database not configured",
            |i| i.database = DbState::NotConfigured,
            Healthy,
            200,
            Stable,
        ),
        (
            "database not checked yet",
            |i| i.database = DbState::Unknown,
            Healthy,
            200,
            Stable,
        ),
        (
            "web not configured",
            |i| i.web = WebVerdict::NotConfigured,
            Healthy,
            200,
            Stable,
        ),
        (
            "web without evidence yet",
            |i| i.web = WebVerdict::Unknown,
            Healthy,
            200,
            Stable,
        ),
    ];
    for (name, set, status, http, rec) in cases {
        let mut i = Round::from(input());
        set(&mut i);
        let d = i.decide();
        assert_eq!(
            (d.status, d.http, d.recommendation),
            (*status, *http, *rec),
            "{name}: {d:?}"
        );
        if d.http == 503 {
            assert!(!d.reasons.is_empty(), "{name}: a 503 must say why");
        }
    }
}

#[test]
fn the_peers_decide_local_or_shared() {
    use Recommendation::*;
    use Status::*;
    let judged = |class, scope| Judgement {
        class,
        scope,
        peers_with: if scope == Scope::Shared { 2 } else { 0 },
        peers_answered: 2,
        reason: format!("{scope:?} by 2 peers"),
    };
    let cases: &[(&str, Round, Status, u16, Recommendation)] = &[
        (
            "waiting on a dependency only this instance cannot reach: 503 after heal",
            healing(
                HealPhase::Exhausted,
                PolicyInput {
                    web: WebVerdict::Waiting,
                    fleet: vec![judged(FaultClass::Dependency, Scope::Local)],
                    ..input()
                },
            ),
            Unhealthy,
            503,
            Stable,
        ),
        (
            "waiting on a dependency the peers wait on too: 200",
            PolicyInput {
                web: WebVerdict::Waiting,
                fleet: vec![judged(FaultClass::Dependency, Scope::Shared)],
                ..input()
            }
            .into(),
            Degraded,
            200,
            InfrastructureIssue,
        ),
        (
            "database unreachable from here only: 503, no restart can help",
            PolicyInput {
                database: DbState::Unreachable,
                fleet: vec![judged(FaultClass::Dependency, Scope::Local)],
                ..input()
            }
            .into(),
            Unhealthy,
            503,
            Stable,
        ),
        (
            "database unreachable for most peers too: 200",
            PolicyInput {
                database: DbState::Unreachable,
                fleet: vec![judged(FaultClass::Dependency, Scope::Shared)],
                ..input()
            }
            .into(),
            Degraded,
            200,
            InfrastructureIssue,
        ),
        (
            "every instance hung after a bad deploy: 200, no restart loop",
            PolicyInput {
                web: WebVerdict::Hung,
                fleet: vec![judged(FaultClass::Web, Scope::Shared)],
                ..input()
            }
            .into(),
            Degraded,
            200,
            InfrastructureIssue,
        ),
        (
            "hung here alone while the database is down everywhere: ours",
            healing(
                HealPhase::Exhausted,
                PolicyInput {
                    web: WebVerdict::Hung,
                    database: DbState::Unreachable,
                    fleet: vec![
                        judged(FaultClass::Web, Scope::Local),
                        judged(FaultClass::Dependency, Scope::Shared),
                    ],
                    ..input()
                },
            ),
            Unhealthy,
            503,
            Stable,
        ),
        (
            "an expected container down on most peers: 200",
            PolicyInput {
                containers: ContainersState::Faulty,
                fleet: vec![judged(FaultClass::Containers, Scope::Shared)],
                ..input()
            }
            .into(),
            Degraded,
            200,
            InfrastructureIssue,
        ),
    ];
    for (name, i, status, http, rec) in cases {
        let d = i.decide();
        assert_eq!(
            (d.status, d.http, d.recommendation),
            (*status, *http, *rec),
            "{name}: {d:?}"
        );
        assert!(
            d.reasons.iter().any(|r| r.contains("by 2 peers")),
            "{name}: the reasons name the peers' evidence: {:?}",
            d.reasons
        );
    }
    // A dependency only we cannot reach is not healed by restarting the web backend.
    let d = evaluate(&cases[2].1);
    assert_eq!(d.healable_fault(), None);
}

#[test]
fn a_fault_the_peers_are_still_asked_about_is_held_at_200_without_a_restart() {
    for (name, i) in [
        (
            "hung, the peers' word older than the hang",
            healing(
                HealPhase::Exhausted,
                PolicyInput {
                    web: WebVerdict::Hung,
                    fleet_asking: vec![FaultClass::Web],
                    ..input()
                },
            ),
        ),
        (
            "frozen: still asked, a whole fleet can freeze at once",
            PolicyInput {
                web: WebVerdict::Hung,
                web_stopped: true,
                fleet_asking: vec![FaultClass::Web],
                ..input()
            }
            .into(),
        ),
        (
            "an expected container down, the peers not yet answered",
            PolicyInput {
                containers: ContainersState::Faulty,
                fleet_asking: vec![FaultClass::Containers],
                ..input()
            }
            .into(),
        ),
    ] {
        let d = i.decide();
        assert_eq!(
            (d.status, d.http, d.recommendation),
            (Status::Degraded, 200, Recommendation::Stable),
            "{name}: {d:?}"
        );
        assert_eq!(d.healable_fault(), None, "{name}: no restart while asking");
        assert!(
            d.reasons.iter().any(|r| r.contains("asking the peers")),
            "{name}: {:?}",
            d.reasons
        );
    }
    // Asking about one class holds that class only: a full disk is this instance's alone.
    let d = evaluate(&PolicyInput {
        web: WebVerdict::Hung,
        disk: DiskLevel::Fail,
        fleet_asking: vec![FaultClass::Web],
        ..input()
    });
    assert_eq!(d.http, 503, "{d:?}");
}

#[test]
fn reasons_carry_the_web_evidence() {
    let d = evaluate(&PolicyInput {
        web: WebVerdict::Waiting,
        web_detail: "waiting on 10.0.3.7:5432 for 4.2s (12 connections)".into(),
        ..input()
    });
    assert!(d.shared_dependency);
    assert_eq!(d.healable_fault(), None, "no restart for a dependency");
    assert!(
        d.reasons.iter().any(|r| r.contains("10.0.3.7:5432")),
        "{:?}",
        d.reasons
    );
    let d = healing(
        HealPhase::Recovering,
        PolicyInput {
            web_served: false,
            web: WebVerdict::Hung,
            ..input()
        },
    )
    .decide();
    assert_eq!(d.faults, [Fault::NeverServed, Fault::Web(WebVerdict::Hung)]);
    assert_eq!(d.healable_fault(), Some(Fault::Web(WebVerdict::Hung)));
    assert_eq!(
        (d.status, d.http),
        (Status::Unhealthy, 503),
        "a restart of a backend that never served is no reason to take traffic"
    );
}

#[test]
fn guarded_fault_is_not_healable() {
    let d = evaluate(&PolicyInput {
        web: WebVerdict::Hung,
        database: DbState::Unreachable,
        ..input()
    });
    assert!(d.shared_dependency);
    assert_eq!(d.healable_fault(), None);
    let d = evaluate(&PolicyInput {
        web: WebVerdict::Hung,
        ..input()
    });
    assert_eq!(d.healable_fault(), Some(Fault::Web(WebVerdict::Hung)));
    let d = evaluate(&PolicyInput {
        disk: DiskLevel::Fail,
        ..input()
    });
    assert_eq!(d.healable_fault(), None, "a restart does not empty a disk");
}

/// Issue 18 §2: an error that is the agent's own (it cannot enter the namespace, make or bind
/// the probe socket, has no permission) never yields a 503 — during boot grace, after it, with
/// `boot_status` at its default — and the reason says whose error it is. The backend's own
/// failure to serve still does.
#[test]
fn an_agent_side_probe_error_never_yields_503() {
    let blind = |in_boot_grace: bool| {
        evaluate(&PolicyInput {
            web: WebVerdict::Unknown,
            web_detail: "listening; the agent could not probe (Cannot assign requested address \
                         (os error 99): its own error, not the backend's)"
                .into(),
            web_agent_error: true,
            web_served: false,
            in_boot_grace,
            ..input()
        })
    };
    for grace in [true, false] {
        let d = blind(grace);
        assert_eq!(d.http, 200, "boot grace {grace}: {d:?}");
        assert!(d.faults.is_empty(), "{d:?}");
        assert!(
            d.reasons
                .iter()
                .any(|r| r.contains("the agent's own error")),
            "{d:?}"
        );
    }
    assert_eq!(blind(true).status, Status::Booting);
    assert_eq!(blind(false).status, Status::Degraded);
    // The same `unknown` without the agent's error is the backend's silence: 503.
    let silent = evaluate(&PolicyInput {
        web: WebVerdict::Unknown,
        web_served: false,
        ..input()
    });
    assert_eq!((silent.status, silent.http), (Status::Unhealthy, 503));
    // An agent error does not hide what the backend itself shows.
    let refused = evaluate(&PolicyInput {
        web: WebVerdict::Down,
        web_agent_error: true,
        web_served: false,
        ..input()
    });
    assert_eq!(refused.http, 503);
}

/// Issue 23 item 14: while a recovery waits out `recover_after`, the reasons quote the hang
/// evidence as what the instance is recovering from, not as if it were current.
#[test]
fn the_recovery_hold_names_the_old_evidence_as_the_past() {
    let t0 = Instant::now();
    let s = Duration::from_secs(1);
    let hung = evaluate(&PolicyInput {
        web: WebVerdict::Hung,
        web_detail: "7 connections wait in the accept queue (oldest 7.7s)".into(),
        ..input()
    });
    let mut g = FlapGuard::new(Duration::ZERO, 4 * s);
    g.apply(evaluate(&input()), t0);
    let bad = g.apply(hung.clone(), t0);
    assert_eq!(bad.http, 503);
    assert!(bad.reasons[0].starts_with("web backend hung"), "{bad:?}");
    let held = g.apply(evaluate(&input()), t0 + s);
    assert_eq!(held.http, 503);
    assert!(
        held.reasons
            .iter()
            .any(|r| r.starts_with("recovering from: web backend hung") && r.contains("7.7s")),
        "{held:?}"
    );
    assert!(
        !held
            .reasons
            .iter()
            .any(|r| r.starts_with("web backend hung")),
        "the old evidence reads as current: {held:?}"
    );
    assert!(
        held.reasons.last().unwrap().contains("turning healthy"),
        "{held:?}"
    );
    // Held twice: said once.
    let again = g.apply(evaluate(&input()), t0 + 2 * s);
    assert!(
        !again
            .reasons
            .iter()
            .any(|r| r.contains("recovering from: recovering from")),
        "{again:?}"
    );
    assert_eq!(g.apply(evaluate(&input()), t0 + 5 * s).http, 200);
}

#[test]
fn flap_guard_holds_each_direction_for_its_time() {
    let t0 = Instant::now();
    let s = Duration::from_secs(1);
    let ok = evaluate(&input());
    let bad = evaluate(&PolicyInput {
        web: WebVerdict::Down,
        ..input()
    });
    let mut g = FlapGuard::new(2 * s, 4 * s);
    assert_eq!(g.apply(ok.clone(), t0).http, 200);
    // 503 only once it has held 2 s.
    assert_eq!(g.apply(bad.clone(), t0 + s).http, 200);
    assert_eq!(g.apply(bad.clone(), t0 + 2 * s).http, 200);
    assert_eq!(g.apply(bad.clone(), t0 + 3 * s).http, 503);
    // A single good evaluation does not bring it back…
    assert_eq!(g.apply(ok.clone(), t0 + 4 * s).http, 503);
    // …and a relapse restarts the clock.
    assert_eq!(g.apply(bad.clone(), t0 + 5 * s).http, 503);
    assert_eq!(g.apply(ok.clone(), t0 + 6 * s).http, 503);
    assert_eq!(g.apply(ok.clone(), t0 + 9 * s).http, 503);
    assert_eq!(g.apply(ok.clone(), t0 + 10 * s).http, 200);
}

#[test]
fn flap_guard_zero_fail_after_is_immediate() {
    let t0 = Instant::now();
    let mut g = FlapGuard::new(Duration::ZERO, Duration::from_secs(4));
    g.apply(evaluate(&input()), t0);
    let bad = evaluate(&PolicyInput {
        disk: DiskLevel::Fail,
        ..input()
    });
    let held = g.apply(bad, t0);
    assert_eq!(held.http, 503);
    assert!(held.reasons.iter().any(|r| r.contains("disk")));
}

#[test]
fn flap_guard_lets_an_instance_out_of_boot_at_once() {
    let t0 = Instant::now();
    let mut g = FlapGuard::new(Duration::ZERO, Duration::from_secs(4));
    let booting = evaluate(&PolicyInput {
        in_boot_grace: true,
        web_served: false,
        ..input()
    });
    assert_eq!(g.apply(booting, t0).http, 503);
    assert_eq!(g.apply(evaluate(&input()), t0).status, Status::Healthy);
}

#[test]
fn flap_guard_passes_changes_within_a_code() {
    let t0 = Instant::now();
    let mut g = FlapGuard::new(Duration::from_secs(2), Duration::from_secs(4));
    g.apply(evaluate(&input()), t0);
    let warn = evaluate(&PolicyInput {
        disk: DiskLevel::Warn,
        ..input()
    });
    assert_eq!(g.apply(warn, t0).status, Status::Degraded);
}

#[test]
fn a_misconfigured_database_names_its_cause_and_hides_no_web_fault() {
    let why = "database.url postgres://app@127.0.0.1:5432/app: the server asks for a password \
               and none is set: put PGPASSWORD=... in the agent's environment file";
    let i = PolicyInput {
        database: DbState::Misconfigured,
        database_reason: Some(why.into()),
        ..input()
    };
    let d = evaluate(&i);
    assert_eq!(
        (d.status, d.http, d.recommendation),
        (Status::Degraded, 200, Recommendation::Stable),
        "{d:?}"
    );
    assert_eq!(
        d.reasons,
        [format!("database check misconfigured: {why}")],
        "the reason says the cause and the key"
    );
    assert!(!d.shared_dependency, "{d:?}");
    // Every backend thread stuck: a misconfigured database explains nothing, so 503 as with a
    // good one, and never an infrastructure issue.
    for web in [WebVerdict::Unresponsive, WebVerdict::Hung] {
        let d = evaluate(&PolicyInput { web, ..i.clone() });
        assert_eq!(
            (d.status, d.http),
            (Status::Unhealthy, 503),
            "{web:?}: {d:?}"
        );
        assert_eq!(d.faults, [Fault::Web(web)], "{d:?}");
        assert_ne!(d.recommendation, Recommendation::InfrastructureIssue);
        assert!(
            d.reasons.iter().all(|r| !r.contains("shared dependency")),
            "{web:?}: {d:?}"
        );
    }
    // Without words from the check, the generic reason, never an empty one.
    let d = evaluate(&PolicyInput {
        database_reason: None,
        ..i.clone()
    });
    assert!(
        d.reasons
            .iter()
            .any(|r| r.starts_with("database check misconfigured (")),
        "{d:?}"
    );
    // The reason is read only for a misconfigured database.
    let d = evaluate(&PolicyInput {
        database: DbState::Connected,
        ..i
    });
    assert_eq!(d.status, Status::Healthy, "{d:?}");
    assert!(d.reasons.iter().all(|r| !r.contains("PGPASSWORD")), "{d:?}");
}

#[test]
fn a_web_config_error_is_degraded_never_503() {
    let e = Some("web.container: container \"wbe\" not found".to_string());
    // The backend cannot be found, so it cannot be said never to have served.
    let mut i = PolicyInput {
        web: WebVerdict::Unknown,
        web_served: false,
        web_config_error: e.clone(),
        ..input()
    };
    let d = evaluate(&i);
    assert_eq!((d.status, d.http), (Status::Degraded, 200), "{d:?}");
    assert_eq!(d.recommendation, Recommendation::Stable);
    assert!(
        d.reasons.iter().any(|r| r.contains("web.container")),
        "{d:?}"
    );
    i.in_boot_grace = true;
    assert_eq!(evaluate(&i).http, 200, "nor while booting");
    // A probe path that answers 404: the server is up, the path is wrong.
    let d = evaluate(&PolicyInput {
        web: WebVerdict::Up,
        web_config_error: Some("web.probe_path = \"/up\" answered 404".into()),
        ..input()
    });
    assert_eq!((d.status, d.http), (Status::Degraded, 200), "{d:?}");
    // It never hides a web fault.
    let d = evaluate(&PolicyInput {
        web: WebVerdict::Down,
        web_config_error: Some("web.probe_path = \"/up\" answered 404".into()),
        ..input()
    });
    assert_eq!(d.http, 503, "{d:?}");
}

#[test]
fn no_web_port_is_said_in_the_reasons() {
    let d = evaluate(&PolicyInput {
        web: WebVerdict::NotConfigured,
        ..input()
    });
    assert_eq!((d.status, d.http), (Status::Healthy, 200), "{d:?}");
    assert!(d.reasons.iter().any(|r| r.contains("web.port")), "{d:?}");
}

#[test]
fn the_recommendation_follows_saturation() {
    use Recommendation::*;
    let at = |s: Option<f64>, tweak: fn(&mut PolicyInput)| {
        let mut i = PolicyInput {
            saturation: s,
            ..input()
        };
        tweak(&mut i);
        let d = evaluate(&i);
        (d.status, d.http, d.recommendation)
    };
    assert_eq!(
        at(Some(0.8), |_| {}),
        (Status::Healthy, 200, ScaleUp),
        "at up_at"
    );
    assert_eq!(
        at(Some(1.7), |_| {}),
        (Status::Healthy, 200, ScaleUp),
        "busy is not unwell"
    );
    assert_eq!(at(Some(0.5), |_| {}), (Status::Healthy, 200, Stable));
    assert_eq!(
        at(Some(0.3), |_| {}),
        (Status::Healthy, 200, ScaleDown),
        "at down_at"
    );
    assert_eq!(
        at(Some(0.1), |i| i.disk = DiskLevel::Warn).2,
        Stable,
        "never scale_down with something degraded"
    );
    // S decides over the old CPU/memory "low": a quiet host with busy workers is not idle.
    assert_eq!(at(Some(0.5), |i| i.pressure = Pressure::Low).2, Stable);
    // Unknown or withheld: the pressure alone, as before.
    assert_eq!(at(None, |i| i.pressure = Pressure::Low).2, ScaleDown);
    assert_eq!(at(None, |_| {}).2, Stable);
    // A dependency fault outranks any load figure.
    assert_eq!(
        at(Some(2.0), |i| i.database = DbState::Unreachable).2,
        InfrastructureIssue
    );
    let custom = |i: &mut PolicyInput| {
        i.up_at = 0.6;
        i.down_at = 0.1;
    };
    assert_eq!(at(Some(0.65), custom).2, ScaleUp);
    assert_eq!(at(Some(0.2), custom).2, Stable);
}

/// `web.port = 0`: with no container watched either, nothing this instance serves is looked
/// at, so never `healthy` (the balancer reads only that word) and never `scale_down`; never a
/// 503 either. With containers watched, the reason is shown and the status is today's.
#[test]
fn watching_nothing_is_degraded_never_healthy() {
    use Recommendation::*;
    use Status::*;
    type Case = (
        &'static str,
        fn(&mut PolicyInput),
        Status,
        u16,
        Recommendation,
        &'static str,
    );
    let cases: &[Case] = &[
        (
            "no web port, no containers",
            |_| {},
            Degraded,
            200,
            Stable,
            NOTHING_WATCHED,
        ),
        (
            "no web port, no containers, an idle host",
            |i| i.pressure = Pressure::Low,
            Degraded,
            200,
            Stable,
            NOTHING_WATCHED,
        ),
        (
            "no web port, no containers, saturation at down_at",
            |i| i.saturation = Some(0.1),
            Degraded,
            200,
            Stable,
            NOTHING_WATCHED,
        ),
        (
            "no web port, no containers, the database down",
            |i| i.database = DbState::Unreachable,
            Degraded,
            200,
            InfrastructureIssue,
            NOTHING_WATCHED,
        ),
        (
            "no web port, no containers, disk full: still the disk's 503",
            |i| i.disk = DiskLevel::Fail,
            Unhealthy,
            503,
            Stable,
            "disk usage at or above the fail threshold",
        ),
        (
            "no web port, no containers, booting",
            |i| i.in_boot_grace = true,
            Booting,
            200,
            Stable,
            NOTHING_WATCHED,
        ),
        (
            "no web port, containers running: the reason, not degraded",
            |i| i.containers = ContainersState::AllRunning,
            Healthy,
            200,
            Stable,
            NO_WEB_PORT,
        ),
        (
            "no web port, containers running, an idle host",
            |i| {
                i.containers = ContainersState::AllRunning;
                i.pressure = Pressure::Low;
            },
            Healthy,
            200,
            ScaleDown,
            NO_WEB_PORT,
        ),
        (
            "a web port, no containers: healthy",
            |i| i.web = WebVerdict::Up,
            Healthy,
            200,
            Stable,
            "",
        ),
    ];
    for (name, tweak, status, http, recommendation, reason) in cases {
        let mut i = PolicyInput {
            web: WebVerdict::NotConfigured,
            containers: ContainersState::NotConfigured,
            database: DbState::Connected,
            ..PolicyInput::default()
        };
        tweak(&mut i);
        let d = evaluate(&i);
        assert_eq!(
            (d.status, d.http, d.recommendation),
            (*status, *http, *recommendation),
            "{name}: {d:?}"
        );
        if reason.is_empty() {
            assert!(d.reasons.is_empty(), "{name}: {d:?}");
        } else {
            assert!(d.reasons.iter().any(|r| r == reason), "{name}: {d:?}");
        }
    }
    assert!(
        NOTHING_WATCHED.contains("set web.port"),
        "{NOTHING_WATCHED}"
    );
}

#[test]
fn erroring_is_503_only_when_the_peers_serve() {
    use Recommendation::*;
    use Status::*;
    fn judged(scope: Scope) -> Judgement {
        Judgement {
            class: FaultClass::Errors,
            scope,
            peers_with: if scope == Scope::Shared { 2 } else { 0 },
            peers_answered: 2,
            reason: format!("{scope:?} by 2 peers"),
        }
    }
    let erroring = |f: fn(&mut Round)| {
        let mut i = Round::from(PolicyInput {
            web: WebVerdict::Erroring,
            web_detail: "100% of 40 real answers 5xx in 10s".into(),
            ..input()
        });
        f(&mut i);
        i
    };
    let cases: &[(&str, Round, Status, u16, Recommendation)] = &[
        (
            "only this instance errs, its restart did not help: 503",
            erroring(|i| {
                i.fleet = vec![judged(Scope::Local)];
                i.heal = Some(HealPhase::Exhausted);
            }),
            Unhealthy,
            503,
            Stable,
        ),
        (
            "only this instance errs, restarting: 200 recovering",
            erroring(|i| {
                i.fleet = vec![judged(Scope::Local)];
                i.heal = Some(HealPhase::Recovering);
            }),
            Recovering,
            200,
            Stable,
        ),
        (
            "most peers err too (a bad deploy): 200, nothing to scale",
            erroring(|i| i.fleet = vec![judged(Scope::Shared)]),
            Degraded,
            200,
            InfrastructureIssue,
        ),
        (
            "a fleet that 500s under load is never told to scale up",
            erroring(|i| {
                i.fleet = vec![judged(Scope::Shared)];
                i.pressure = Pressure::High;
                i.saturation = Some(1.4);
            }),
            Degraded,
            200,
            InfrastructureIssue,
        ),
        (
            "the peers are being asked: held at 200",
            erroring(|i| i.fleet_asking = vec![FaultClass::Errors]),
            Degraded,
            200,
            Stable,
        ),
        (
            "no peers, the one restart did not help: 200 degraded",
            erroring(|i| i.heal = Some(HealPhase::Exhausted)),
            Degraded,
            200,
            Stable,
        ),
    ];
    for (name, i, status, http, rec) in cases {
        let d = i.decide();
        assert_eq!(
            (d.status, d.http, d.recommendation),
            (*status, *http, *rec),
            "{name}: {:?}",
            d.reasons
        );
        assert!(
            d.reasons.iter().any(|r| r.contains("erroring")),
            "{name}: {:?}",
            d.reasons
        );
    }
    // Alone and not yet restarted, the raw decision asks for the restart (a healable fault);
    // with no restart to make, healing leaves it at 200 degraded.
    let raw = evaluate(&erroring(|_| {}));
    assert!(raw.erroring_alone, "{raw:?}");
    assert_eq!(raw.healable_fault(), Some(Fault::Web(WebVerdict::Erroring)));
    let d = crate::heal::applied(raw.clone(), HealPhase::Idle);
    assert_eq!((d.status, d.http), (Degraded, 200), "{d:?}");
    let d = crate::heal::applied(raw, HealPhase::Recovering);
    assert_eq!((d.status, d.http), (Recovering, 200), "{d:?}");
    // Peers that serve make it this instance's own: not `erroring_alone`.
    let mut i = erroring(|_| {});
    i.fleet = vec![judged(Scope::Local)];
    let local = evaluate(&i);
    assert!(!local.erroring_alone);
    assert_eq!(crate::heal::applied(local, HealPhase::Exhausted).http, 503);
}

#[test]
fn slow_against_its_peers_is_its_own_fault_never_capacity() {
    let slow = |capped: Option<&str>| SlowVsPeers {
        reason: "slow against its peers: answer latency median 48.0 ms over 300 answers, 9.6× \
                 the peers' median 5.0 ms (…)"
            .into(),
        capped: capped.map(str::to_string),
    };
    // (case, web verdict, slow against its peers, heal phase, http, status, recommendation)
    type Row<'a> = (
        &'a str,
        WebVerdict,
        Option<SlowVsPeers>,
        Option<HealPhase>,
        u16,
        Status,
        Recommendation,
    );
    let rows: &[Row] = &[
        (
            "a restart first",
            WebVerdict::Up,
            Some(slow(None)),
            Some(HealPhase::Recovering),
            200,
            Status::Recovering,
            Recommendation::Stable,
        ),
        (
            "then 503",
            WebVerdict::Up,
            Some(slow(None)),
            Some(HealPhase::Exhausted),
            503,
            Status::Unhealthy,
            Recommendation::Stable,
        ),
        (
            "its own slow verdict asks no capacity",
            WebVerdict::Slow,
            Some(slow(None)),
            Some(HealPhase::Exhausted),
            503,
            Status::Unhealthy,
            Recommendation::Stable,
        ),
        (
            "the cap holds it at 200, no scale_up",
            WebVerdict::Slow,
            Some(slow(Some("not taken out: at most 1 of the 3"))),
            None,
            200,
            Status::Degraded,
            Recommendation::Stable,
        ),
        (
            "the whole fleet slow alike: capacity, as before",
            WebVerdict::Slow,
            None,
            None,
            200,
            Status::Degraded,
            Recommendation::ScaleUp,
        ),
    ];
    for (case, web, s, phase, http, status, rec) in rows {
        let mut i = input();
        i.web = *web;
        i.slow_vs_peers = s.clone();
        i.saturation = Some(0.95);
        let round = match phase {
            Some(p) => healing(*p, i),
            None => Round::from(i),
        };
        let d = round.decide();
        assert_eq!(
            (d.http, d.status, d.recommendation),
            (*http, *status, *rec),
            "{case}: {d:?}"
        );
        if s.is_some() {
            assert!(
                d.reasons
                    .iter()
                    .any(|r| r.contains("9.6×") && r.contains("5.0 ms")),
                "{case}: the reason names the ratio: {:?}",
                d.reasons
            );
        }
    }
    // A fault that outranks it (hung) is judged as before.
    let mut i = input();
    i.web = WebVerdict::Hung;
    i.slow_vs_peers = Some(slow(None));
    let d = evaluate(&i);
    assert_eq!(d.faults, vec![Fault::Web(WebVerdict::Hung)]);
}
