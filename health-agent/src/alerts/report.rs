//! The incident report (a GitHub issue body): everything an engineer needs after the scaling
//! group has already destroyed the instance — every check from the snapshot, disks, system,
//! containers, database, the self-heal log, the top processes by CPU and memory, suspicious
//! processes, and the fingerprint that deduplicates issues.
//!
//! The process evidence itself is collected by `evidence`.

use std::fmt::Write as _;

use serde_json::Value;

use super::{
    evidence::{Evidence, TOP},
    incident::{human, instances, priority, Event, Kind},
    markdown::{cell, code, fenced},
};
use crate::text::{clean, rfc3339, truncate};

/// GitHub rejects bodies above 65536 characters.
const BODY_LIMIT: usize = 60_000;

fn bytes(b: u64) -> String {
    const U: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i < U.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    format!("{v:.1} {}", U[i])
}

fn text(v: &Value) -> String {
    match v {
        Value::Null => "–".into(),
        Value::String(s) => s.clone(),
        Value::Number(n) => n
            .as_f64()
            .filter(|f| f.fract() != 0.0)
            .map_or_else(|| n.to_string(), |f| format!("{f:.1}")),
        other => other.to_string(),
    }
}

fn json_block(out: &mut String, v: &Value) {
    let pretty = serde_json::to_string_pretty(v).unwrap_or_default();
    let _ = writeln!(out, "{}\n", fenced("json", &pretty));
}

/// The hidden marker a later trigger looks for.
pub fn marker(fingerprint: &str) -> String {
    format!("<!-- fingerprint: {fingerprint} -->")
}

/// Whether an issue body belongs to this fingerprint (the hidden marker, or the visible line
/// should someone have edited the marker away).
pub fn carries_fingerprint(body: &str, fingerprint: &str) -> bool {
    body.contains(&marker(fingerprint)) || body.contains(&format!("fingerprint: `{fingerprint}`"))
}

/// Where the incident is, in Markdown: ``on `web-1` `` or ``across fleet `shop` ``.
pub fn place(ev: &Event) -> String {
    match &ev.fleet {
        Some(f) => format!("across fleet {}", code(&f.name)),
        None => format!("on {}", code(&ev.host)),
    }
}

pub fn title(ev: &Event) -> String {
    let whose = match &ev.fleet {
        Some(f) => format!("fleet {}", f.name),
        None => ev.host.to_string(),
    };
    let mut t = format!("[health-agent] {whose}: {}", ev.condition.title());
    if let Some(r) = ev.reasons.first() {
        let _ = write!(t, " — {r}");
    }
    // A title is plain text, but one line of it.
    truncate(&clean(&t), 250)
}

pub fn labels(ev: &Event, evidence: Option<&Evidence>) -> Vec<&'static str> {
    let suspicious = evidence.is_some_and(|e| !e.suspicious.is_empty());
    vec![
        "incident",
        priority(ev.condition, suspicious),
        "health-agent",
    ]
}

/// The full incident report in Markdown.
pub fn body(ev: &Event, evidence: Option<&Evidence>) -> String {
    let fp = ev.fingerprint();
    let snap = ev.snapshot();
    let details = &snap["details"];
    let mut o = String::new();
    summary(&mut o, ev, evidence, &snap);
    reasons_and_checks(&mut o, ev);
    web_disks_system(&mut o, details);
    containers_database_fleet(&mut o, details);
    processes(&mut o, evidence);
    self_heal(&mut o, details);
    let footer = format!("fingerprint: `{fp}`\n{}\n", marker(&fp));
    let full = serde_json::to_string_pretty(&snap).unwrap_or_default();
    let room = BODY_LIMIT.saturating_sub(o.len() + footer.len() + 200);
    if room > 1000 {
        let (full, note) = if full.len() > room {
            (truncate(&full, room), " (truncated)")
        } else {
            (full, "")
        };
        let _ = writeln!(
            o,
            "<details><summary>Full snapshot{note}</summary>\n\n{}\n</details>\n",
            fenced("json", &full)
        );
    }
    if o.len() + footer.len() > BODY_LIMIT {
        o = truncate(&o, BODY_LIMIT - footer.len() - 2);
        o.push('\n');
    }
    o.push_str(&footer);
    o
}

/// The heading and the table of what happened where.
fn summary(o: &mut String, ev: &Event, evidence: Option<&Evidence>, snap: &Value) {
    let heading = match ev.kind {
        Kind::Trigger => "Incident",
        Kind::Resolve => "Resolved",
    };
    let _ = writeln!(o, "## {heading}: {} {}\n", ev.condition.title(), place(ev));
    let prio = labels(ev, evidence)[1].to_uppercase();
    let _ = writeln!(o, "| | |\n|---|---|");
    if let Some(f) = &ev.fleet {
        let _ = writeln!(
            o,
            "| fleet | {}: seen by {}, reported by this host; the rest of this report is this host's |",
            code(&f.name),
            instances(f.instances)
        );
    }
    let _ = writeln!(o, "| host | {} |", code(&ev.host));
    let _ = writeln!(o, "| condition | `{}` |", ev.condition.key());
    let _ = writeln!(o, "| priority | {prio} |");
    let _ = writeln!(o, "| status | {} (HTTP {}) |", ev.status.as_str(), ev.http);
    let _ = writeln!(o, "| recommendation | `{}` |", ev.recommendation.as_str());
    let _ = writeln!(o, "| opened | {} |", rfc3339(ev.opened_at));
    if ev.kind == Kind::Resolve {
        let _ = writeln!(
            o,
            "| resolved | {} (after {}) |",
            rfc3339(ev.at),
            human(ev.duration())
        );
    }
    let _ = writeln!(o, "| snapshot | {} |\n", text(&snap["generated_at"]));
}

fn reasons_and_checks(o: &mut String, ev: &Event) {
    let _ = writeln!(o, "### Reasons\n");
    if ev.reasons.is_empty() {
        let _ = writeln!(o, "none\n");
    }
    for r in &ev.reasons {
        let _ = writeln!(o, "- {}", cell(r));
    }
    o.push('\n');

    let _ = writeln!(o, "### Checks\n\n| check | value |\n|---|---|");
    if let Value::Object(m) = ev.checks() {
        for (k, v) in m {
            let _ = writeln!(o, "| {k} | {} |", cell(&text(&v)));
        }
    }
    o.push('\n');
}

fn web_disks_system(o: &mut String, details: &Value) {
    let web = &details["web"];
    let _ = writeln!(
        o,
        "### Web backend\n\nverdict **{}** — {}\n",
        text(&web["verdict"]),
        cell(&text(&web["detail"]))
    );
    json_block(o, web);

    let _ = writeln!(
        o,
        "### Disks\n\n| mount | used | total | available | level | error |\n|---|---|---|---|---|---|"
    );
    for m in details["disk"]["mounts"].as_array().into_iter().flatten() {
        let _ = writeln!(
            o,
            "| {} | {}% | {} | {} | {} | {} |",
            code(&text(&m["path"])),
            text(&m["used_percent"]),
            bytes(m["total_bytes"].as_u64().unwrap_or(0)),
            bytes(m["available_bytes"].as_u64().unwrap_or(0)),
            text(&m["level"]),
            cell(m["error"].as_str().unwrap_or(""))
        );
    }
    o.push('\n');

    let _ = writeln!(o, "### System\n");
    let sys = &details["system"];
    if sys.is_null() {
        let _ = writeln!(o, "not sampled yet\n");
    } else {
        let _ = writeln!(
            o,
            "cpu {}% (avg {}%), memory {}% (avg {}%), load {} / {} on {} cpus, pressure `{}`\n",
            text(&sys["cpu_percent"]),
            text(&sys["cpu_avg_percent"]),
            text(&sys["memory_percent"]),
            text(&sys["memory_avg_percent"]),
            text(&sys["load1"]),
            text(&sys["load5"]),
            text(&sys["cpus"]),
            text(&sys["pressure"]),
        );
    }
}

fn containers_database_fleet(o: &mut String, details: &Value) {
    let c = &details["containers"];
    let _ = writeln!(o, "### Containers\n\n{}\n", cell(&text(&c["summary"])));
    if let Some(list) = c["containers"].as_array().filter(|l| !l.is_empty()) {
        let _ = writeln!(
            o,
            "| name | state | health | restarts | cpu | memory |\n|---|---|---|---|---|---|"
        );
        for x in list {
            let _ = writeln!(
                o,
                "| {} | {} | {} | {} | {} | {} |",
                code(&text(&x["name"])),
                text(&x["state"]),
                text(&x["health"]),
                text(&x["restart_count"]),
                text(&x["cpu_percent"]),
                x["memory_bytes"].as_u64().map_or("–".into(), bytes),
            );
        }
        o.push('\n');
    }

    let db = &details["database"];
    let _ = writeln!(
        o,
        "### Database\n\n{}{}\n",
        text(&db["state"]),
        // The server's own words may be in it.
        db["reason"]
            .as_str()
            .map(|r| format!(" — {}", code(r)))
            .unwrap_or_default()
    );

    let fleet = &details["fleet"];
    if fleet["configured"] == true {
        let list = |v: &serde_json::Value| {
            let names: Vec<String> = v
                .as_array()
                .map(|a| a.iter().map(|p| code(&text(p))).collect())
                .unwrap_or_default();
            if names.is_empty() {
                "none".to_string()
            } else {
                names.join(", ")
            }
        };
        let _ = writeln!(
            o,
            "### Fleet\n\nasked: {}; answered: {}\n",
            list(&fleet["peers_asked"]),
            list(&fleet["peers_answered"])
        );
        for j in fleet["judgements"].as_array().into_iter().flatten() {
            let _ = writeln!(
                o,
                "- {} fault, {}: {}",
                text(&j["class"]),
                text(&j["scope"]),
                cell(&text(&j["reason"]))
            );
        }
        if let Some(note) = fleet["note"].as_str() {
            let _ = writeln!(o, "- {}", cell(note));
        }
        o.push('\n');
    }
}

/// Suspicious processes, and the top ones by CPU and by memory.
fn processes(o: &mut String, evidence: Option<&Evidence>) {
    let _ = writeln!(o, "### Suspicious processes\n");
    match evidence {
        None => {
            let _ = writeln!(o, "not collected\n");
        }
        Some(e) if e.suspicious.is_empty() => {
            let _ = writeln!(o, "none found\n");
        }
        Some(e) => {
            let _ = writeln!(
                o,
                "| pid | name | executable | why | command line |\n|---|---|---|---|---|"
            );
            for p in &e.suspicious {
                let _ = writeln!(
                    o,
                    "| {} | {} | {} | {} | {} |",
                    p.pid,
                    code(&p.name),
                    code(p.exe.as_deref().unwrap_or("?")),
                    cell(&p.reasons.join("; ")),
                    code(&p.cmdline)
                );
            }
            o.push('\n');
        }
    }

    for (what, rows) in [
        ("CPU", evidence.map(|e| &e.top_cpu)),
        ("memory", evidence.map(|e| &e.top_memory)),
    ] {
        let _ = writeln!(o, "### Top {TOP} processes by {what}\n");
        let Some(rows) = rows else {
            let _ = writeln!(o, "not collected\n");
            continue;
        };
        let _ = writeln!(
            o,
            "| pid | name | cpu % | rss | executable |\n|---|---|---|---|---|"
        );
        for r in rows {
            let _ = writeln!(
                o,
                "| {} | {} | {:.1} | {} | {} |",
                r.pid,
                code(&r.name),
                r.cpu_percent,
                bytes(r.rss_bytes),
                r.exe.as_deref().map_or("–".into(), code)
            );
        }
        o.push('\n');
    }
    if let Some(e) = evidence {
        let _ = writeln!(o, "CPU sampled over {} ms.\n", e.sample_ms);
    }
}

fn self_heal(o: &mut String, details: &Value) {
    let heal = &details["heal"];
    let _ = writeln!(
        o,
        "### Self-heal log\n\nphase `{}`, {} restart(s) in window of {} allowed, budget spent: {}\n",
        text(&heal["phase"]),
        text(&heal["restarts_in_window"]),
        text(&heal["max_restarts"]),
        text(&heal["budget_spent"]),
    );
    if let Some(list) = heal["attempts"].as_array().filter(|l| !l.is_empty()) {
        let _ = writeln!(
            o,
            "| started | action | outcome | error | reason |\n|---|---|---|---|---|"
        );
        for a in list {
            let _ = writeln!(
                o,
                "| {} | {} | {} | {} | {} |",
                text(&a["started_at"]),
                code(&text(&a["action"])),
                text(&a["outcome"]),
                cell(a["error"].as_str().unwrap_or("")),
                cell(&text(&a["reason"])),
            );
        }
        o.push('\n');
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        alerts::{evidence::ProcRow, incident::Condition, tests::unhealthy_snapshot},
        suspicious::SuspiciousProcess,
    };

    #[test]
    fn the_report_says_what_the_peers_said() {
        let snap = unhealthy_snapshot().with_fleet(crate::fleet::FleetReport {
            configured: true,
            peers_asked: vec!["10.0.0.3:8080".into(), "10.0.0.4:8080".into()],
            peers_answered: vec!["10.0.0.3:8080".into()],
            judgements: vec![crate::policy::Judgement {
                class: crate::status::FaultClass::Web,
                scope: crate::status::Scope::Local,
                peers_with: 0,
                peers_answered: 1,
                reason: "1/1 peers answering have no web fault".into(),
            }],
            ..Default::default()
        });
        let t = super::super::incident::Transition {
            kind: Kind::Trigger,
            condition: Condition::Unhealthy,
            scope: super::super::incident::Scope::Host,
            incident: 1,
            opened_at: std::time::SystemTime::now(),
        };
        let b = body(&Event::new(&t, &snap, "web-1".into(), None), None);
        assert!(
            b.contains(
                "### Fleet\n\nasked: `10.0.0.3:8080`, `10.0.0.4:8080`; answered: `10.0.0.3:8080`"
            ),
            "{b}"
        );
        assert!(
            b.contains("- web fault, local: 1/1 peers answering have no web fault"),
            "{b}"
        );
        // Without [fleet], no section.
        assert!(!body(&event(), None).contains("### Fleet"));
    }

    #[test]
    fn what_peers_and_servers_said_cannot_write_markdown() {
        let evil = "x`](http://evil)\n# hi";
        let mut snap = unhealthy_snapshot().with_fleet(crate::fleet::FleetReport {
            configured: true,
            peers_asked: vec![evil.into()],
            peers_answered: vec![evil.into()],
            judgements: vec![crate::policy::Judgement {
                class: crate::status::FaultClass::Web,
                scope: crate::status::Scope::Local,
                peers_with: 0,
                peers_answered: 1,
                reason: format!("1/1 peers answering ({evil}) have no web fault"),
            }],
            ..Default::default()
        });
        snap.decision.reasons = vec![format!("database unreachable: \x1b[2J```\n# owned {evil}")];
        let t = super::super::incident::Transition {
            kind: Kind::Trigger,
            condition: Condition::Unhealthy,
            scope: super::super::incident::Scope::Host,
            incident: 1,
            opened_at: std::time::SystemTime::now(),
        };
        let ev = Event::new(&t, &snap, "web-1".into(), None);
        let b = body(&ev, None);
        assert!(
            b.contains("asked: `x'](http://evil) # hi`; answered: `x'](http://evil) # hi`\n"),
            "{b}"
        );
        assert!(
            b.contains(
                "- web fault, local: 1/1 peers answering (x\\`\\](http://evil) \\# hi) have"
            ),
            "{b}"
        );
        assert!(
            b.contains("- database unreachable: \\[2J\\`\\`\\` \\# owned x\\`"),
            "{b}"
        );
        // No line the outside wrote starts a heading; every fence opened is closed by its own.
        assert!(!b.lines().any(|l| l.starts_with("# ")), "{b}");
        assert!(
            b.contains("\n````json\n"),
            "the fence outlasts the snapshot's ```: {b}"
        );
        assert!(!title(&ev).contains('\n'));
        // Every destination has the reasons without control characters, on one line each.
        let slack = super::super::slack::payload(&ev).to_string();
        let pd = super::super::pagerduty::payload(&ev, "k").to_string();
        let hook = super::super::webhook::payload(&ev)["payload"]["reasons"].to_string();
        assert!(!b.contains('\x1b'), "{b:?}");
        for sent in [&slack, &pd, &hook, &title(&ev)] {
            assert!(
                !sent.contains("\\u001b") && !sent.contains('\x1b'),
                "{sent}"
            );
        }
        assert!(slack.contains("[2J``` # owned"), "{slack}");
    }

    fn event() -> Event {
        let snap = unhealthy_snapshot();
        let t = super::super::incident::Transition {
            kind: Kind::Trigger,
            condition: Condition::Unhealthy,
            scope: super::super::incident::Scope::Host,
            incident: 1,
            opened_at: std::time::SystemTime::now(),
        };
        Event::new(&t, &snap, "web-1".into(), None)
    }

    #[test]
    fn report_has_every_section_and_the_fingerprint() {
        let evidence = Evidence {
            top_cpu: vec![ProcRow {
                pid: 42,
                name: "ruby | `@team`".into(),
                cpu_percent: 99.5,
                rss_bytes: 3 << 20,
                exe: Some("/usr/bin/ruby".into()),
            }],
            top_memory: Vec::new(),
            suspicious: vec![SuspiciousProcess {
                pid: 7,
                name: "xmrig".into(),
                exe: Some("/tmp/xmrig".into()),
                cmdline: "/tmp/xmrig -o stratum+tcp://pool".into(),
                reasons: vec!["known crypto-miner name `xmrig`".into()],
            }],
            sample_ms: 500,
        };
        let ev = event();
        let b = body(&ev, Some(&evidence));
        for s in [
            "### Reasons",
            "### Checks",
            "### Web backend",
            "### Disks",
            "### System",
            "### Containers",
            "### Database",
            "### Suspicious processes",
            "### Top 10 processes by CPU",
            "### Top 10 processes by memory",
            "### Self-heal log",
            "Full snapshot",
            "| `/tmp/xmrig` |",
            "fingerprint: `health-agent/web-1/unhealthy`",
            "<!-- fingerprint: health-agent/web-1/unhealthy -->",
            "| priority | P1 |",
            "disk usage",
        ] {
            assert!(b.contains(s), "missing {s:?} in\n{b}");
        }
        // A hostile process name neither breaks the table nor pings anyone.
        assert!(b.contains("`ruby \\| '@team'`"), "{b}");
        assert!(carries_fingerprint(&b, &ev.fingerprint()));
        assert!(!carries_fingerprint(&b, "health-agent/web-1/heal_failed"));
        assert_eq!(
            labels(&ev, Some(&evidence)),
            vec!["incident", "p1", "health-agent"]
        );
        assert_eq!(labels(&ev, None), vec!["incident", "p2", "health-agent"]);
        assert!(title(&ev).starts_with("[health-agent] web-1: unhealthy (503) — "));
    }
}
