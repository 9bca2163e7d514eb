//! GitHub incident issues (REST API, `Authorization: Bearer`, API version 2022-11-28).
//!
//! Dedup: before opening an issue the sender lists the open issues labelled `health-agent`
//! and looks for the incident's fingerprint (`health-agent/<host>/<condition>`, or
//! `health-agent/fleet/<fleet>/<condition>` for a fault the fleet shares: whichever agent
//! reports it finds the same issue; a hidden marker plus a visible line in the body). Found: the new incident becomes a comment there
//! ("recurred", with the fresh report). Not found: a new issue labelled `incident`, `p1`…`p3`
//! and `health-agent`.
//!
//! Resolve: a "resolved" comment on that issue; the issue stays **open**. The agent knows the
//! condition went away, not why it came — an incident report is closed by the person who has
//! read it. A recurrence while it is open lands in the same thread, which is the point of the
//! fingerprint. (Labels need push access: with a read-only token GitHub drops them and the
//! dedup list, filtered by label, finds nothing — give the token `issues: write`.)

use std::{collections::HashMap, time::Duration};

use reqwest::{header::ACCEPT, Method, RequestBuilder};
use serde_json::{json, Value};

use super::{
    error::AlertError,
    evidence::Pending,
    http::{Http, Pacer},
    incident::{human, Event, Kind},
    markdown, report,
};
use crate::text::{clean, rfc3339};

/// How long a trigger waits for its process evidence before reporting without it.
const EVIDENCE_WAIT: Duration = Duration::from_secs(10);
const PER_PAGE: usize = 100;
const MAX_PAGES: usize = 5;

struct Api {
    base: String,
    owner: String,
    repo: String,
    token: String,
}

impl Api {
    fn req(&self, c: &reqwest::Client, method: Method, path: &str) -> RequestBuilder {
        c.request(
            method,
            format!("{}/repos/{}/{}{path}", self.base, self.owner, self.repo),
        )
        .bearer_auth(&self.token)
        .header(ACCEPT, "application/vnd.github+json")
        .header("X-GitHub-Api-Version", "2022-11-28")
    }
}

pub struct GitHub {
    api: Api,
    pacer: Pacer,
    /// Fingerprint → the issue this agent opened or found for it.
    issues: HashMap<String, u64>,
    evidence_interval: Duration,
}

impl GitHub {
    /// `repo` is `owner/name` (validated by the config).
    pub fn new(
        api_url: &str,
        repo: &str,
        token: &str,
        pacer: Pacer,
        evidence_interval: Duration,
    ) -> Self {
        let (owner, name) = repo.split_once('/').unwrap_or((repo, ""));
        Self {
            api: Api {
                base: api_url.trim_end_matches('/').to_string(),
                owner: owner.to_string(),
                repo: name.to_string(),
                token: token.to_string(),
            },
            pacer,
            issues: HashMap::new(),
            evidence_interval,
        }
    }

    async fn call(
        &mut self,
        http: &Http,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Value, AlertError> {
        let api = &self.api;
        http.send(&mut self.pacer, |c| {
            let r = api.req(c, method.clone(), path);
            match body {
                Some(b) => r.json(b),
                None => r,
            }
        })
        .await
        .map(|r| r.json())
    }

    /// The open issue carrying `fingerprint`, if any.
    async fn find_open(
        &mut self,
        http: &Http,
        fingerprint: &str,
    ) -> Result<Option<u64>, AlertError> {
        for page in 1..=MAX_PAGES {
            let path =
                format!("/issues?state=open&labels=health-agent&per_page={PER_PAGE}&page={page}");
            let list = self.call(http, Method::GET, &path, None).await?;
            let items = list.as_array().cloned().unwrap_or_default();
            let found = items.iter().find(|i| {
                i.get("pull_request").is_none()
                    && i["body"]
                        .as_str()
                        .is_some_and(|b| report::carries_fingerprint(b, fingerprint))
            });
            if let Some(n) = found.and_then(|i| i["number"].as_u64()) {
                return Ok(Some(n));
            }
            if items.len() < PER_PAGE {
                break;
            }
        }
        Ok(None)
    }

    async fn comment(&mut self, http: &Http, number: u64, body: String) -> Result<(), AlertError> {
        let path = format!("/issues/{number}/comments");
        self.call(http, Method::POST, &path, Some(&json!({ "body": body })))
            .await
            .map(drop)
    }

    async fn create(&mut self, http: &Http, issue: &Value) -> Result<u64, AlertError> {
        let created = self
            .call(http, Method::POST, "/issues", Some(issue))
            .await?;
        created["number"].as_u64().ok_or(AlertError::NoIssueNumber)
    }

    pub async fn deliver(&mut self, http: &Http, ev: &Event) -> Result<(), AlertError> {
        let fp = ev.fingerprint();
        match ev.kind {
            Kind::Trigger => {
                let pending = ev
                    .evidence
                    .clone()
                    .or_else(|| Pending::start(self.evidence_interval));
                let evidence = match pending {
                    Some(p) => p.get(EVIDENCE_WAIT).await,
                    None => None,
                };
                let body = report::body(ev, evidence.as_deref());
                match self.find_open(http, &fp).await? {
                    Some(n) => {
                        let text = format!(
                            "**Recurred** at {}: a new `{}` incident {}.\n\n{body}",
                            rfc3339(ev.at),
                            ev.condition.key(),
                            report::place(ev)
                        );
                        self.comment(http, n, text).await?;
                        self.issues.insert(fp, n);
                    }
                    None => {
                        let issue = json!({
                            "title": report::title(ev),
                            "body": body,
                            "labels": report::labels(ev, evidence.as_deref()),
                        });
                        let n = self.create(http, &issue).await?;
                        self.issues.insert(fp, n);
                    }
                }
                Ok(())
            }
            Kind::Resolve => {
                let number = match self.issues.get(&fp) {
                    Some(n) => Some(*n),
                    None => self.find_open(http, &fp).await?,
                };
                let Some(n) = number else {
                    tracing::warn!(
                        incident = %ev.describe(),
                        "github: no open issue for {fp}, nothing to mark resolved"
                    );
                    return Ok(());
                };
                self.comment(http, n, resolved_comment(ev)).await
            }
        }
    }

    /// Opens a test issue and closes it again: proves the token may create issues in the repo.
    pub async fn send_test(&mut self, http: &Http, host: &str) -> Result<(), AlertError> {
        let issue = json!({
            "title": format!("[health-agent] test alert from {}", clean(host)),
            "body": format!(
                "health-agent test message from {} (`health-agent alert test`): incident \
                 issues reach this repository. Closed automatically.",
                markdown::code(host)
            ),
            "labels": ["health-agent"],
        });
        let n = self.create(http, &issue).await?;
        let path = format!("/issues/{n}");
        self.call(
            http,
            Method::PATCH,
            &path,
            Some(&json!({ "state": "closed", "state_reason": "completed" })),
        )
        .await
        .map(drop)
    }
}

fn resolved_comment(ev: &Event) -> String {
    let (who, recurrence) = match &ev.fleet {
        Some(_) => (
            format!("reported by {}, now", markdown::code(&ev.host)),
            "in this fleet",
        ),
        None => ("Now".to_string(), "on this host"),
    };
    let mut s = format!(
        "**Resolved** at {}: `{}` {} cleared after {}.\n\n{who}: {} (HTTP {}), recommendation `{}`.",
        rfc3339(ev.at),
        ev.condition.key(),
        report::place(ev),
        human(ev.duration()),
        ev.status.as_str(),
        ev.http,
        ev.recommendation.as_str(),
    );
    for r in &ev.reasons {
        s.push_str(&format!("\n- {}", markdown::cell(r)));
    }
    s.push_str(&format!(
        "\n\nThe issue stays open for review; close it once the cause is understood. \
         A recurrence {recurrence} is reported here.\n"
    ));
    s
}
