//! A local HTTP server standing in for Slack, PagerDuty, GitHub or a webhook.

use std::{
    io::{Read, Write},
    net::{TcpListener, TcpStream},
    time::Duration,
};

use serde_json::Value;

/// One request a [`Receiver`] got.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    /// The body as JSON (`Null` when it is not JSON).
    pub body: Value,
    /// The body as sent.
    pub raw: Vec<u8>,
}

impl Recorded {
    pub fn header(&self, name: &str) -> Option<&str> {
        crate::http::header(&self.headers, name)
    }
}

type Responder = dyn Fn(&Recorded, &[Recorded]) -> (u16, String) + Send + Sync;

/// A local HTTP server standing in for Slack, PagerDuty, GitHub or a webhook (this network
/// reaches none of them): records every request and answers through `respond`, which also
/// sees everything recorded before (so it can keep state, like GitHub's issue list).
pub struct Receiver {
    pub port: u16,
    seen: std::sync::Arc<std::sync::Mutex<Vec<Recorded>>>,
}

impl Receiver {
    pub fn start(
        respond: impl Fn(&Recorded, &[Recorded]) -> (u16, String) + Send + Sync + 'static,
    ) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("binding a receiver");
        let port = listener.local_addr().expect("addr").port();
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let respond: std::sync::Arc<Responder> = std::sync::Arc::new(respond);
        let s = seen.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (s, respond) = (s.clone(), respond.clone());
                std::thread::spawn(move || serve_receiver(stream, &s, &*respond));
            }
        });
        Self { port, seen }
    }

    /// GitHub's issues API for `repo` (`owner/name`), statefully: issues created by POST are
    /// listed by GET, comments are taken.
    pub fn github_issues(repo: &str) -> Self {
        let issues = format!("/repos/{repo}/issues");
        Self::start(move |req: &Recorded, before: &[Recorded]| {
            let created: Vec<&Recorded> = before
                .iter()
                .filter(|r| r.method == "POST" && r.path == issues)
                .collect();
            match (req.method.as_str(), req.path.as_str()) {
                ("GET", p) if p.starts_with(&format!("{issues}?")) => {
                    let list: Vec<Value> = created
                        .iter()
                        .enumerate()
                        .map(|(i, r)| serde_json::json!({"number": i + 1, "state": "open", "title": r.body["title"], "body": r.body["body"]}))
                        .collect();
                    (200, Value::Array(list).to_string())
                }
                ("POST", p) if p == issues => (
                    201,
                    serde_json::json!({"number": created.len() + 1}).to_string(),
                ),
                ("POST", p) if p.starts_with(&format!("{issues}/")) && p.ends_with("/comments") => {
                    (201, serde_json::json!({"id": before.len()}).to_string())
                }
                _ => (404, "{}".into()),
            }
        })
    }

    /// Answers 200 `{}` to everything.
    pub fn ok() -> Self {
        Self::start(|_, _| (200, "{}".into()))
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.seen.lock().map(|v| v.clone()).unwrap_or_default()
    }

    /// Requests other than GETs (what was delivered).
    pub fn posts(&self) -> Vec<Recorded> {
        self.requests()
            .into_iter()
            .filter(|r| r.method != "GET")
            .collect()
    }
}

fn serve_receiver(
    mut stream: TcpStream,
    seen: &std::sync::Mutex<Vec<Recorded>>,
    respond: &Responder,
) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
            match stream.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
            continue;
        };
        let head = String::from_utf8_lossy(&buf[..end]).to_string();
        let mut lines = head.lines();
        let mut first = lines.next().unwrap_or("").split_whitespace();
        let method = first.next().unwrap_or("").to_string();
        let path = first.next().unwrap_or("").to_string();
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
            .collect();
        let len: usize = headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(0);
        while buf.len() < end + 4 + len {
            match stream.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        let raw: Vec<u8> = buf.drain(..end + 4 + len).skip(end + 4).collect();
        let body = serde_json::from_slice(&raw).unwrap_or(Value::Null);
        let rec = Recorded {
            method,
            path,
            headers,
            body,
            raw,
        };
        let (code, reply) = {
            let mut all = match seen.lock() {
                Ok(g) => g,
                Err(_) => return,
            };
            let answer = respond(&rec, &all);
            all.push(rec);
            answer
        };
        let resp = format!(
            "HTTP/1.1 {code} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{reply}",
            reply.len()
        );
        if stream.write_all(resp.as_bytes()).is_err() {
            return;
        }
    }
}

/// Slack, PagerDuty (202 `Event processed`), GitHub's issues API for `acme/shop` and a
/// webhook, each a [`Receiver`] on loopback: every alert destination of one agent.
pub struct AlertReceivers {
    pub slack: Receiver,
    pub pagerduty: Receiver,
    pub github: Receiver,
    pub webhook: Receiver,
}

impl AlertReceivers {
    pub fn start() -> Self {
        Self {
            slack: Receiver::ok(),
            pagerduty: Receiver::start(|_, _| {
                (
                    202,
                    serde_json::json!({"status": "success", "message": "Event processed"})
                        .to_string(),
                )
            }),
            github: Receiver::github_issues("acme/shop"),
            webhook: Receiver::ok(),
        }
    }

    /// The `[alerts]` section that sends to all four, with `extra` lines of its own
    /// (`resolve_after = "3s"`).
    pub fn config(&self, extra: &str) -> String {
        format!(
            "[alerts]\nslack_webhook_url = \"{}\"\npagerduty_routing_key = \"R0UT1NGKEY0123456789abcdefABCDEF\"\n\
             pagerduty_url = \"{}\"\ngithub_repo = \"acme/shop\"\ngithub_api_url = \"{}\"\nwebhook_url = \"{}\"\n{extra}",
            self.slack.url("/services/T000/B000/XXXXSECRET"),
            self.pagerduty.url("/v2/enqueue"),
            self.github.url(""),
            self.webhook.url("/hook"),
        )
    }

    /// Once each destination has been posted to (within `within`): what each received, the
    /// bodies as sent, in the order slack, pagerduty, github, webhook.
    pub fn wait_all(&self, within: std::time::Duration) -> [String; 4] {
        [&self.slack, &self.pagerduty, &self.github, &self.webhook].map(|r| {
            crate::wait_until(within, "an alert at each destination", || {
                let posts = r.posts();
                (!posts.is_empty()).then(|| {
                    posts
                        .iter()
                        .map(|p| String::from_utf8_lossy(&p.raw).into_owned())
                        .collect::<Vec<_>>()
                        .join("\n")
                })
            })
        })
    }
}
