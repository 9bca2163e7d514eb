//! A real Prometheus server (Debian's `prometheus`) on a loopback port of its own, scraping
//! the targets a test gives it every second and evaluating rule files every second; its HTTP
//! API read back (`query`, `alerts`). And `promtool check metrics` on a scrape.

use std::{
    io::Write as _,
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::{free_port, request_at, Logged};

/// A Prometheus server with its own data directory, killed and removed on drop.
pub struct Prometheus {
    server: Logged,
    dir: PathBuf,
    pub port: u16,
}

/// One scrape job: its name and its targets, each with its own labels.
pub struct Job<'a> {
    pub name: &'a str,
    pub targets: Vec<(SocketAddr, Vec<(&'a str, &'a str)>)>,
}

impl Prometheus {
    /// Starts a server scraping `jobs` every second and evaluating `rules` every second;
    /// waits until it is ready.
    pub fn start(jobs: &[Job], rules: &[&Path]) -> Self {
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("health-agent-prometheus-{port}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("a directory for Prometheus");
        let mut config = String::from(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n",
        );
        config.push_str("rule_files:\n");
        for r in rules {
            config.push_str(&format!("  - {}\n", r.display()));
        }
        config.push_str("scrape_configs:\n");
        for job in jobs {
            config.push_str(&format!(
                "  - job_name: {}\n    static_configs:\n",
                job.name
            ));
            for (addr, labels) in &job.targets {
                config.push_str(&format!("      - targets: ['{addr}']\n"));
                if !labels.is_empty() {
                    config.push_str("        labels:\n");
                    for (k, v) in labels {
                        config.push_str(&format!("          {k}: '{v}'\n"));
                    }
                }
            }
        }
        let file = dir.join("prometheus.yml");
        std::fs::write(&file, &config).expect("writing prometheus.yml");
        let server = Logged::spawn(
            Command::new("prometheus")
                .arg(format!("--config.file={}", file.display()))
                .arg(format!(
                    "--storage.tsdb.path={}",
                    dir.join("data").display()
                ))
                .arg(format!("--web.listen-address=127.0.0.1:{port}"))
                .arg("--log.level=warn"),
            dir.join("prometheus.log"),
            "prometheus",
        );
        let p = Self { server, dir, port };
        let deadline = Instant::now() + Duration::from_secs(30);
        while p.get("/-/ready").map(|(c, _)| c) != Some(200) {
            assert!(
                Instant::now() < deadline,
                "Prometheus not ready in 30 s:\n{config}\n{}",
                p.server.logs()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        p
    }

    fn get(&self, path: &str) -> Option<(u16, String)> {
        let addr: SocketAddr = ([127, 0, 0, 1], self.port).into();
        request_at(addr, "GET", path, &[], Duration::from_secs(10))
            .ok()
            .map(|(code, head, body)| {
                let chunked = head
                    .to_ascii_lowercase()
                    .contains("transfer-encoding: chunked");
                (code, if chunked { dechunk(&body) } else { body })
            })
    }

    fn api(&self, path: &str) -> Value {
        let (code, body) = self
            .get(path)
            .unwrap_or_else(|| panic!("GET {path} on Prometheus failed"));
        let v: Value = serde_json::from_str(&body)
            .unwrap_or_else(|e| panic!("GET {path}: not JSON ({e}): {body}"));
        assert!(
            code == 200 && v["status"] == "success",
            "GET {path}: {code} {body}"
        );
        v["data"].clone()
    }

    /// The instant vector `expr` evaluates to now: each series' labels and value.
    pub fn query(&self, expr: &str) -> Vec<(Value, f64)> {
        let data = self.api(&format!("/api/v1/query?query={}", encode(expr)));
        data["result"]
            .as_array()
            .map(|r| {
                r.iter()
                    .map(|s| {
                        let v = s["value"][1].as_str().and_then(|v| v.parse().ok());
                        (s["metric"].clone(), v.unwrap_or(f64::NAN))
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The alerts pending or firing now.
    pub fn alerts(&self) -> Vec<Value> {
        self.api("/api/v1/alerts")["alerts"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// The rule groups loaded, each rule with its query, type and health.
    pub fn api_rules(&self) -> Value {
        self.api("/api/v1/rules")["groups"].clone()
    }

    pub fn logs(&self) -> String {
        self.server.logs()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A chunked body's data (the API's larger answers come chunked).
fn dechunk(body: &str) -> String {
    let mut out = String::new();
    let mut rest = body;
    while let Some((size, after)) = rest.split_once("\r\n") {
        let n = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16).unwrap_or(0);
        let (Some(data), Some(next)) = (after.get(..n), after.get(n..)) else {
            break;
        };
        if n == 0 {
            break;
        }
        out.push_str(data);
        rest = next.strip_prefix("\r\n").unwrap_or(next);
    }
    out
}

/// A URL query value: everything but the unreserved characters percent-encoded.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// `promtool check metrics` on an exposition: (passed, what it printed).
pub fn check_metrics(text: &str) -> (bool, String) {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (cargo xtask setup installs the prometheus package)");
    child
        .stdin
        .take()
        .expect("stdin piped")
        .write_all(text.as_bytes())
        .expect("writing to promtool");
    let out = child.wait_with_output().expect("promtool's output");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success() && said.trim().is_empty(), said)
}
