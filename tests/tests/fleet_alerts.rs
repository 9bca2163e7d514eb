//! One page per fleet incident. Three agents with `[fleet]` (fleet `shop`), each on its own
//! loopback address and under its own host name (web-1, web-2, web-3, each in a UTS namespace
//! of its own), all alerting to the same local Slack, PagerDuty, GitHub and webhook receivers,
//! as a fleet sharing one routing key and one repository does. A PostgreSQL outage they share is
//! one incident for the fleet: one trigger and one resolve at each destination, sent by one
//! agent. A fault of one host's own (a full disk) stays that host's incident, one per host. The
//! agent reporting a shared incident killed mid-way: another takes it over, and the resolve
//! still goes out, once.

use std::{
    net::{Ipv4Addr, SocketAddr},
    time::{Duration, Instant},
};

use health_agent_tests::{
    free_port_on, loopback, require_root, tail, wait_until, Agent, AlertReceivers, Postgres,
    Recorded, Tmpfs,
};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(40);
const FLEET: &str = "shop";
const KEY: &str = "health-agent/fleet/shop/infrastructure_issue";
const ISSUES: &str = "/repos/acme/shop/issues";
/// Longer than the fleet's lease (3 × (fleet.interval + fleet.timeout) = 6 s) and its settle
/// (2 × interval + timeout = 3 s): whatever a second agent would send, it has sent by then.
const QUIET: Duration = Duration::from_secs(10);

/// Three agents of fleet `shop` sharing one PostgreSQL, each with a small disk of its own.
/// Field order is drop order: the agents before the database and the disks.
struct Fleet {
    agents: Vec<Agent>,
    rx: AlertReceivers,
    disks: Vec<Tmpfs>,
    pg: Postgres,
}

impl Fleet {
    fn start() -> Self {
        let pg = Postgres::start();
        let rx = AlertReceivers::start();
        let disks: Vec<Tmpfs> = (0..3).map(|_| Tmpfs::mount("4m")).collect();
        let addrs: Vec<SocketAddr> = (0..3u8)
            .map(|i| SocketAddr::new(loopback(2 + i), free_port_on(Ipv4Addr::UNSPECIFIED.into())))
            .collect();
        let agents = addrs
            .iter()
            .zip(&disks)
            .enumerate()
            .map(|(i, (me, disk))| {
                let peers: Vec<String> = addrs
                    .iter()
                    .filter(|a| *a != me)
                    .map(ToString::to_string)
                    .collect();
                let config = format!(
                    "[checks]\ninterval = \"500ms\"\nrecover_after = \"0s\"\n\
                     [disk]\npaths = [{:?}]\n\
                     [database]\nurl = \"{}\"\ninterval = \"1s\"\ntimeout = \"1s\"\nfail_after = 1\n\
                     [fleet]\nname = \"{FLEET}\"\npeers = {peers:?}\ninterval = \"1s\"\ntimeout = \"1s\"\n{}",
                    disk.path.display().to_string(),
                    pg.url(),
                    rx.config("resolve_after = \"3s\"\n"),
                );
                Agent::start_named(
                    *me,
                    &format!("web-{}", i + 1),
                    &config,
                    &[
                        ("PGPASSWORD", pg.password.as_str()),
                        ("GITHUB_TOKEN", "ghp_testtoken123"),
                    ],
                )
            })
            .collect();
        Self {
            agents,
            rx,
            disks,
            pg,
        }
    }

    /// Every agent's log tail: what a failed wait prints.
    fn explain(&self) -> String {
        self.agents
            .iter()
            .enumerate()
            .map(|(i, a)| format!("\n--- web-{} ({}):\n{}", i + 1, a.addr, tail(&a.logs(), 25)))
            .collect()
    }

    /// Every agent 200 with the database connected and both peers answering.
    fn wait_ready(&self) {
        for (i, a) in self.agents.iter().enumerate() {
            a.wait_health(WAIT, &format!("web-{} ready", i + 1), |c, b| {
                c == 200
                    && b["checks"]["database"] == "connected"
                    && b["details"]["fleet"]["peers_answered"]
                        .as_array()
                        .is_some_and(|p| p.len() == 2)
            });
        }
    }

    /// Waits for the `n`-th (from 1) request at `r` that `pred` accepts.
    fn wait_post(
        &self,
        what: &str,
        r: &health_agent_tests::Receiver,
        n: usize,
        pred: impl Fn(&Recorded) -> bool,
    ) -> Recorded {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(p) = r.posts().into_iter().filter(|p| pred(p)).nth(n - 1) {
                return p;
            }
            assert!(
                Instant::now() < deadline,
                "no {what} within {WAIT:?}; received: {:?}{}",
                r.posts().iter().map(|p| &p.body).collect::<Vec<_>>(),
                self.explain()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Requests at each destination so far: (PagerDuty, Slack, GitHub issues opened, GitHub
    /// comments, webhook).
    fn counts(&self) -> (usize, usize, usize, usize, usize) {
        let gh = self.rx.github.posts();
        (
            self.rx.pagerduty.posts().len(),
            self.rx.slack.posts().len(),
            gh.iter().filter(|r| r.path == ISSUES).count(),
            gh.iter().filter(|r| r.path.ends_with("/comments")).count(),
            self.rx.webhook.posts().len(),
        )
    }

    /// The agent running as `host` (`web-2`).
    fn index_of(&self, host: &str) -> usize {
        host.strip_prefix("web-")
            .and_then(|n| n.parse::<usize>().ok())
            .filter(|n| (1..=3).contains(n))
            .unwrap_or_else(|| panic!("reported by {host:?}, not one of web-1..3"))
            - 1
    }
}

fn action(r: &Recorded) -> &str {
    r.body["event_action"].as_str().unwrap_or("")
}

fn text(r: &Recorded) -> &str {
    r.body["text"].as_str().unwrap_or("")
}

/// The shared outage: every agent judges it shared and holds the fleet's incident (its log says
/// so), and one PagerDuty trigger comes, in the documented format, with the fleet's key.
fn outage_paged_once(f: &Fleet) -> (Recorded, Instant) {
    let stopped = Instant::now();
    f.pg.stop();
    for (i, a) in f.agents.iter().enumerate() {
        a.wait_health(
            WAIT,
            &format!("web-{}: the outage judged shared", i + 1),
            |c, b| {
                c == 200
                    && b["recommendation"] == "infrastructure_issue"
                    && b["details"]["fleet"]["judgements"]
                        .as_array()
                        .is_some_and(|j| j.iter().any(|j| j["scope"] == "shared"))
            },
        );
    }
    let pd = f.wait_post("PagerDuty trigger", &f.rx.pagerduty, 1, |r| {
        action(r) == "trigger"
    });
    let paged = stopped.elapsed();
    assert_eq!(pd.path, "/v2/enqueue");
    assert_eq!(pd.body["routing_key"], "R0UT1NGKEY0123456789abcdefABCDEF");
    assert_eq!(pd.body["dedup_key"], KEY, "{}", pd.body);
    let p = &pd.body["payload"];
    assert!(
        p["summary"]
            .as_str()
            .is_some_and(|s| s.len() <= 1024 && s.starts_with("fleet shop")),
        "{p}"
    );
    assert_eq!(p["source"], "fleet shop");
    assert_eq!(p["severity"], "warning");
    assert_eq!(p["class"], "infrastructure_issue");
    assert!(
        p["custom_details"]["instances"]
            .as_u64()
            .is_some_and(|n| (2..=3).contains(&n)),
        "{p}"
    );
    for (i, a) in f.agents.iter().enumerate() {
        wait_until(
            WAIT,
            &format!("web-{} holding the fleet's incident", i + 1),
            || {
                a.logs()
                    .contains("shared by fleet shop: seen here")
                    .then_some(())
            },
        );
    }
    println!(
        "paged {:.1} s after the database stopped, by {}: {}",
        paged.as_secs_f64(),
        p["custom_details"]["reported_by"],
        p["summary"]
    );
    (pd, Instant::now())
}

#[test]
fn a_shared_database_outage_is_one_trigger_and_one_resolve_per_destination() {
    require_root();
    let f = Fleet::start();
    f.wait_ready();
    let (pd, _) = outage_paged_once(&f);
    let reporter = pd.body["payload"]["custom_details"]["reported_by"]
        .as_str()
        .expect("reported_by")
        .to_string();

    let slack = f.wait_post("Slack message", &f.rx.slack, 1, |_| true);
    assert!(
        text(&slack).contains("across fleet `shop` — triggered")
            && text(&slack).contains("infrastructure_issue")
            && text(&slack).contains(&format!("reported by `{reporter}`")),
        "{}",
        slack.body
    );
    let issue = f.wait_post("GitHub issue", &f.rx.github, 1, |r| r.path == ISSUES);
    assert!(
        issue.body["title"]
            .as_str()
            .is_some_and(|t| t.starts_with("[health-agent] fleet shop: infrastructure issue")),
        "{}",
        issue.body["title"]
    );
    let body = issue.body["body"].as_str().unwrap_or("");
    assert!(
        body.contains(&format!("<!-- fingerprint: {KEY} -->")),
        "{body}"
    );
    let labels = issue.body["labels"].to_string();
    assert!(
        labels.contains("incident") && labels.contains("p3"),
        "{labels}"
    );
    let hook = f.wait_post("webhook", &f.rx.webhook, 1, |_| true);
    assert_eq!(hook.body["event"], "incident.triggered");
    assert_eq!(hook.body["payload"]["incident"]["scope"], "fleet");
    assert_eq!(hook.body["payload"]["incident"]["fingerprint"], KEY);

    // The outage goes on past the lease: nobody sends it again.
    std::thread::sleep(QUIET);
    assert_eq!(
        f.counts(),
        (1, 1, 1, 0, 1),
        "one of each while it lasts{}",
        f.explain()
    );

    let resumed = Instant::now();
    f.pg.resume();
    let resolve = f.wait_post("PagerDuty resolve", &f.rx.pagerduty, 1, |r| {
        action(r) == "resolve"
    });
    let took = resumed.elapsed();
    assert_eq!(resolve.body["dedup_key"], KEY);
    let resolved = f.wait_post("Slack resolved", &f.rx.slack, 2, |_| true);
    assert!(
        text(&resolved).contains("across fleet `shop` — resolved"),
        "{}",
        resolved.body
    );
    let comment = f.wait_post("GitHub comment", &f.rx.github, 1, |r| {
        r.path.ends_with("/comments")
    });
    assert_eq!(comment.path, format!("{ISSUES}/1/comments"));
    assert!(
        comment.body["body"]
            .as_str()
            .is_some_and(|b| b.starts_with("**Resolved**")),
        "{}",
        comment.body
    );
    f.wait_post("webhook resolved", &f.rx.webhook, 2, |_| true);
    std::thread::sleep(QUIET);
    let counts = f.counts();
    println!(
        "resolved {:.1} s after the database came back; PagerDuty, Slack, GitHub issues, \
         GitHub comments, webhook: {counts:?}; slack: {:?}",
        took.as_secs_f64(),
        f.rx.slack.posts().iter().map(text).collect::<Vec<_>>()
    );
    assert_eq!(
        counts,
        (2, 2, 1, 1, 2),
        "one trigger and one resolve each{}",
        f.explain()
    );
}

#[test]
fn a_fault_of_one_host_is_that_hosts_incident_one_per_host() {
    require_root();
    let f = Fleet::start();
    f.wait_ready();
    let key = |host: &str| format!("health-agent/{host}/unhealthy");
    // web-2's disk fills, then web-3's: each its own incident, under its own key.
    for (n, i) in [(1, 1), (2, 2)] {
        std::fs::write(f.disks[i].path.join("fill"), vec![0u8; 3_800_000]).expect("filling");
        f.agents[i].wait_health(WAIT, "503 for the full disk", |c, _| c == 503);
        let host = format!("web-{}", i + 1);
        let pd = f.wait_post("PagerDuty trigger", &f.rx.pagerduty, n, |r| {
            action(r) == "trigger"
        });
        assert_eq!(pd.body["dedup_key"], key(&host).as_str(), "{}", pd.body);
        assert_eq!(pd.body["payload"]["source"], host.as_str());
    }
    let (code, body) = f.agents[0].health();
    assert_eq!(code, 200, "web-1's disk is fine: {body}");
    std::thread::sleep(Duration::from_secs(3));
    let issues: Vec<String> =
        f.rx.github
            .posts()
            .iter()
            .filter(|r| r.path == ISSUES)
            .map(|r| r.body["title"].as_str().unwrap_or("").to_string())
            .collect();
    assert_eq!(issues.len(), 2, "one issue per host: {issues:?}");
    assert!(
        issues[0].contains("web-2") && issues[1].contains("web-3"),
        "{issues:?}"
    );
    let slack: Vec<String> =
        f.rx.slack
            .posts()
            .iter()
            .map(|r| text(r).to_string())
            .collect();
    assert_eq!(slack.len(), 2, "{slack:?}");
    assert!(
        slack[0].contains("on `web-2`") && slack[1].contains("on `web-3`"),
        "{slack:?}"
    );

    for i in [1, 2] {
        std::fs::remove_file(f.disks[i].path.join("fill")).expect("emptying");
    }
    for n in [1, 2] {
        f.wait_post("PagerDuty resolve", &f.rx.pagerduty, n, |r| {
            action(r) == "resolve"
        });
    }
    std::thread::sleep(Duration::from_secs(3));
    let keys: Vec<(String, String)> =
        f.rx.pagerduty
            .posts()
            .iter()
            .map(|r| {
                (
                    action(r).to_string(),
                    r.body["dedup_key"].as_str().unwrap_or("").to_string(),
                )
            })
            .collect();
    println!("PagerDuty, a full disk on web-2 then web-3: {keys:?}");
    let mut resolved: Vec<&str> = keys
        .iter()
        .filter(|k| k.0 == "resolve")
        .map(|k| k.1.as_str())
        .collect();
    resolved.sort();
    assert_eq!(resolved, [key("web-2"), key("web-3")]);
    assert_eq!(
        f.counts(),
        (4, 4, 2, 2, 4),
        "a trigger and a resolve per host{}",
        f.explain()
    );
}

/// What `GET /fleet/v1/view` of agent `a` says of the fleet's incident: (reporter, trigger).
fn claim(a: &Agent) -> Option<(String, String)> {
    let (_, body) = a.view_proven().ok()?;
    let v: Value = serde_json::from_str(&body).ok()?;
    let c = v["alerts"].as_array()?.first()?.clone();
    Some((
        c["reporter"].as_str()?.to_string(),
        c["trigger"].as_str()?.to_string(),
    ))
}

fn instance(a: &Agent) -> String {
    let (_, body) = a.view_proven().expect("the view");
    let v: Value = serde_json::from_str(&body).expect("a JSON view");
    v["instance"].as_str().expect("instance").to_string()
}

#[test]
fn the_reporter_killed_mid_incident_is_replaced_and_the_resolve_goes_out_once() {
    require_root();
    let f = Fleet::start();
    f.wait_ready();
    let (pd, _) = outage_paged_once(&f);
    let sender = pd.body["payload"]["custom_details"]["reported_by"]
        .as_str()
        .expect("reported_by")
        .to_string();
    // The reporter all three name, the trigger known to have gone out: the one to kill.
    let ids: Vec<String> = f.agents.iter().map(instance).collect();
    let named = wait_until(
        WAIT,
        "all three naming one reporter, the trigger sent",
        || {
            let claims: Vec<(String, String)> = f.agents.iter().filter_map(claim).collect();
            (claims.len() == 3 && claims.iter().all(|c| c.0 == claims[0].0 && c.1 == "sent"))
                .then(|| claims[0].0.clone())
        },
    );
    let dead = ids
        .iter()
        .position(|id| *id == named)
        .expect("the reporter is one of them");
    let reporter = format!("web-{}", dead + 1);
    let survivors: Vec<usize> = (0..3).filter(|i| *i != dead).collect();
    let heir = survivors
        .iter()
        .min_by_key(|i| &ids[**i])
        .map(|i| (ids[*i].clone(), format!("web-{}", i + 1)))
        .expect("two survivors");
    assert_eq!(
        f.index_of(&heir.1),
        ids.iter().position(|id| *id == heir.0).unwrap()
    );

    f.agents[dead].kill();
    let killed = Instant::now();
    let took = wait_until(WAIT, "a survivor taking over", || {
        survivors
            .iter()
            .all(|i| claim(&f.agents[*i]).is_some_and(|(who, _)| who == heir.0))
            .then(|| killed.elapsed())
    });
    println!(
        "the trigger sent by {sender}; the reporter {reporter} killed: both survivors name {} \
         (the lowest id left) after {:.1} s",
        heir.1,
        took.as_secs_f64()
    );
    assert!(
        took < Duration::from_secs(12),
        "taken over after {took:?}: the lease is 6 s"
    );
    std::thread::sleep(QUIET);
    assert_eq!(
        f.counts(),
        (1, 1, 1, 0, 1),
        "the trigger went out already: not again{}",
        f.explain()
    );

    f.pg.resume();
    f.wait_post("PagerDuty resolve", &f.rx.pagerduty, 1, |r| {
        action(r) == "resolve"
    });
    let resolved = f.wait_post("Slack resolved", &f.rx.slack, 2, |_| true);
    let by = text(&resolved)
        .split("reported by `")
        .nth(1)
        .and_then(|r| r.split('`').next())
        .unwrap_or_default()
        .to_string();
    assert_eq!(by, heir.1, "the heir resolves: {}", resolved.body);
    f.wait_post("GitHub comment", &f.rx.github, 1, |r| {
        r.path.ends_with("/comments")
    });
    std::thread::sleep(QUIET);
    let counts = f.counts();
    println!(
        "trigger by {sender}, {reporter} killed, resolve by {by}; PagerDuty, Slack, GitHub \
         issues, GitHub comments, webhook: {counts:?}"
    );
    assert_eq!(
        counts,
        (2, 2, 1, 1, 2),
        "one trigger and one resolve each{}",
        f.explain()
    );
}
