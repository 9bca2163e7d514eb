//! The Consul catalog as a source of peers (`fleet.consul_addr` + `fleet.consul_service`):
//! `GET /v1/catalog/service/:service`, with the ACL token as `X-Consul-Token` when one is
//! configured (`fleet.consul_token_file`'s first line, else the variable
//! `fleet.consul_token_env` names). The token is read once, at start, and appears in no error,
//! log line or response: the errors name where it was to come from, never what it is.

use reqwest::header::HeaderValue;
use serde::Deserialize;

use super::exchange::{short, DiscoveryError};
use crate::config::FleetConfig;

/// The most of a catalog answer read: thousands of instances fit, a runaway answer does not
/// grow the agent's memory.
const MAX_BODY: usize = 4 << 20;
const TOKEN_HEADER: &str = "X-Consul-Token";

pub struct Consul {
    /// `…/v1/catalog/service/<service>`, the service name escaped as a path segment.
    url: reqwest::Url,
    service: String,
    token: Option<HeaderValue>,
    http: reqwest::Client,
}

impl Consul {
    /// The catalog client when `fleet.consul_addr` is set.
    pub fn from_config(
        cfg: &FleetConfig,
        http: &reqwest::Client,
    ) -> Result<Option<Self>, DiscoveryError> {
        if cfg.consul_addr.is_empty() {
            return Ok(None);
        }
        Self::new(cfg, http.clone()).map(Some)
    }

    pub fn new(cfg: &FleetConfig, http: reqwest::Client) -> Result<Self, DiscoveryError> {
        let error = |reason: String| DiscoveryError::Consul {
            service: cfg.consul_service.clone(),
            reason,
        };
        let base = cfg.consul_addr.trim_end_matches('/');
        let base = if base.contains("://") {
            base.to_string()
        } else {
            format!("http://{base}")
        };
        let mut url = reqwest::Url::parse(&base)
            .map_err(|e| error(format!("fleet.consul_addr is not a URL: {e}")))?;
        url.path_segments_mut()
            .map_err(|()| error("fleet.consul_addr cannot take a path".into()))?
            .pop_if_empty()
            .extend(["v1", "catalog", "service", &cfg.consul_service]);
        let token = read_token(cfg)?;
        Ok(Self {
            url,
            service: cfg.consul_service.clone(),
            token,
            http,
        })
    }

    /// `host:port` of every instance the catalog lists (unchecked: the caller checks them).
    pub async fn peers(&self) -> Result<Vec<String>, DiscoveryError> {
        let mut req = self.http.get(self.url.clone());
        if let Some(t) = &self.token {
            req = req.header(TOKEN_HEADER, t.clone());
        }
        let resp = req
            .send()
            .await
            .and_then(|r| r.error_for_status())
            .map_err(|e| self.error(short(&e)))?;
        let body = crate::capped::body(resp, MAX_BODY)
            .await
            .map_err(|e| match e {
                crate::capped::CappedError::Transport(e) => self.error(short(&e)),
                too_large => self.error(too_large.to_string()),
            })?;
        let entries: Vec<CatalogEntry> = serde_json::from_slice(&body)
            .map_err(|e| self.error(format!("not a catalog answer: {e}")))?;
        Ok(entries.iter().filter_map(CatalogEntry::peer).collect())
    }

    fn error(&self, reason: String) -> DiscoveryError {
        DiscoveryError::Consul {
            service: self.service.clone(),
            reason,
        }
    }
}

/// The token, marked sensitive (kept out of reqwest's Debug output), or None. The file must be
/// readable and hold one; the variable counts when set and not empty.
fn read_token(cfg: &FleetConfig) -> Result<Option<HeaderValue>, DiscoveryError> {
    let error = |reason: String| DiscoveryError::Consul {
        service: cfg.consul_service.clone(),
        reason,
    };
    let (token, from) = if !cfg.consul_token_file.is_empty() {
        let path = &cfg.consul_token_file;
        let text = std::fs::read_to_string(path)
            .map_err(|e| error(format!("fleet.consul_token_file {path}: {e}")))?;
        let first = text.lines().next().unwrap_or("").trim().to_string();
        if first.is_empty() {
            return Err(error(format!(
                "fleet.consul_token_file {path}: its first line holds no token"
            )));
        }
        (first, format!("fleet.consul_token_file {path}"))
    } else if !cfg.consul_token_env.is_empty() {
        match std::env::var(&cfg.consul_token_env) {
            Ok(t) if !t.trim().is_empty() => (
                t.trim().to_string(),
                format!(
                    "the variable {} (fleet.consul_token_env)",
                    cfg.consul_token_env
                ),
            ),
            _ => return Ok(None),
        }
    } else {
        return Ok(None);
    };
    let mut value = HeaderValue::from_str(&token).map_err(|_| {
        error(format!(
            "the token in {from} holds characters a header cannot carry"
        ))
    })?;
    value.set_sensitive(true);
    Ok(Some(value))
}

/// One entry of Consul's `GET /v1/catalog/service/:service` (only the fields used).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct CatalogEntry {
    #[serde(default)]
    address: String,
    #[serde(default)]
    service_address: String,
    #[serde(default)]
    service_port: u16,
}

impl CatalogEntry {
    /// The service's own address when registered with one, else its node's.
    fn peer(&self) -> Option<String> {
        let host = if self.service_address.is_empty() {
            &self.address
        } else {
            &self.service_address
        };
        if host.is_empty() || self.service_port == 0 {
            return None;
        }
        Some(match host.parse::<std::net::IpAddr>() {
            Ok(ip) => super::addr::join(ip, self.service_port),
            _ => format!("{host}:{}", self.service_port),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    #[test]
    fn consul_entries_prefer_the_service_address() {
        let entries: Vec<CatalogEntry> = serde_json::from_str(
            r#"[{"Node":"a","Address":"10.0.0.1","ServiceAddress":"","ServicePort":8080},
                {"Node":"b","Address":"10.0.0.2","ServiceAddress":"10.1.0.2","ServicePort":8080},
                {"Node":"c","Address":"fd00::3","ServiceAddress":"","ServicePort":8080},
                {"Node":"d","Address":"10.0.0.4","ServicePort":0}]"#,
        )
        .unwrap();
        let peers: Vec<String> = entries.iter().filter_map(CatalogEntry::peer).collect();
        assert_eq!(peers, ["10.0.0.1:8080", "10.1.0.2:8080", "[fd00::3]:8080"]);
    }

    /// A stand-in for Consul on loopback: answers one request with `status` and `body`, and
    /// hands back the request's head.
    async fn stub(
        status: &'static str,
        body: &'static str,
    ) -> (String, tokio::task::JoinHandle<String>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let served = tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            let mut head = Vec::new();
            let mut buf = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = conn.read(&mut buf).await.unwrap();
                assert!(n > 0, "the request ended early");
                head.extend_from_slice(&buf[..n]);
            }
            let answer = format!(
                "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
                 Connection: close\r\n\r\n{body}",
                body.len()
            );
            conn.write_all(answer.as_bytes()).await.unwrap();
            String::from_utf8_lossy(&head).to_lowercase()
        });
        (addr, served)
    }

    const CATALOG: &str = r#"[{"Address":"10.0.0.1","ServiceAddress":"","ServicePort":8080}]"#;

    fn catalog(addr: &str) -> FleetConfig {
        FleetConfig {
            consul_addr: addr.into(),
            consul_service: "web app".into(),
            ..FleetConfig::default()
        }
    }

    #[tokio::test]
    async fn the_token_from_its_file_is_sent_as_x_consul_token() {
        let (addr, served) = stub("200 OK", CATALOG).await;
        let mut file = tempfile::NamedTempFile::new().unwrap();
        writeln!(file, "s3cr3t-t0ken\nsecond line ignored").unwrap();
        let cfg = FleetConfig {
            consul_token_file: file.path().display().to_string(),
            ..catalog(&addr)
        };
        let consul = Consul::new(&cfg, reqwest::Client::new()).unwrap();
        assert_eq!(consul.peers().await.unwrap(), ["10.0.0.1:8080"]);
        let head = served.await.unwrap();
        assert!(
            head.starts_with("get /v1/catalog/service/web%20app http/1.1"),
            "{head}"
        );
        assert!(
            head.contains("\r\nx-consul-token: s3cr3t-t0ken\r\n"),
            "{head}"
        );
    }

    #[tokio::test]
    async fn the_token_from_its_variable_is_sent_and_none_without_one() {
        let (addr, served) = stub("200 OK", CATALOG).await;
        let var = "HEALTH_AGENT_TEST_CONSUL_TOKEN_7f3a";
        std::env::set_var(var, "from-env");
        let cfg_env = FleetConfig {
            consul_token_env: var.into(),
            ..catalog(&addr)
        };
        let consul = Consul::new(&cfg_env, reqwest::Client::new()).unwrap();
        std::env::remove_var(var);
        consul.peers().await.unwrap();
        assert!(served
            .await
            .unwrap()
            .contains("\r\nx-consul-token: from-env\r\n"));

        // Named but unset: no token, no header.
        let (addr, served) = stub("200 OK", CATALOG).await;
        let consul = Consul::new(
            &FleetConfig {
                consul_token_env: var.into(),
                ..catalog(&addr)
            },
            reqwest::Client::new(),
        )
        .unwrap();
        assert_eq!(consul.peers().await.unwrap(), ["10.0.0.1:8080"]);
        let head = served.await.unwrap();
        assert!(!head.contains("x-consul-token"), "{head}");
    }

    #[tokio::test]
    async fn no_error_shows_the_token() {
        let (addr, served) = stub("403 Forbidden", "ACL not found").await;
        let mut file = tempfile::NamedTempFile::new().unwrap();
        writeln!(file, "s3cr3t-t0ken").unwrap();
        let cfg = FleetConfig {
            consul_token_file: file.path().display().to_string(),
            ..catalog(&addr)
        };
        let consul = Consul::new(&cfg, reqwest::Client::new()).unwrap();
        let e = consul.peers().await.unwrap_err().to_string();
        served.await.unwrap();
        assert!(e.contains("403"), "{e}");
        assert!(!e.contains("s3cr3t"), "{e}");

        // A file that is not there is an error naming the file, not a request without a token.
        let gone = FleetConfig {
            consul_token_file: "/nonexistent/consul-token".into(),
            ..catalog(&addr)
        };
        let e = Consul::new(&gone, reqwest::Client::new())
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("fleet.consul_token_file /nonexistent/consul-token"),
            "{e}"
        );
        // A token a header cannot carry is refused without being shown.
        let mut bad = tempfile::NamedTempFile::new().unwrap();
        write!(bad, "s3cr3t\u{1}x").unwrap();
        let e = Consul::new(
            &FleetConfig {
                consul_token_file: bad.path().display().to_string(),
                ..catalog(&addr)
            },
            reqwest::Client::new(),
        )
        .err()
        .unwrap()
        .to_string();
        assert!(e.contains("cannot carry") && !e.contains("s3cr3t"), "{e}");
    }
}
