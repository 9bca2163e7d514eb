//! No secret can be read from anything the agent prints. A real PostgreSQL refuses a wrong
//! database password, given as `PGPASSWORD` or in the URL, for passwords of one to three
//! characters, a digit, a common word, a word of the message itself, the user name and
//! non-ASCII; every surface is then read: `check` (table and JSON), `/health`, `/metrics`, the
//! log (as text, and as JSON lines when the password is in the URL), and what Slack,
//! PagerDuty, GitHub (the incident issue) and a webhook received.
//!
//! Two properties, for every secret and surface: nothing shown depends on the secret (`check`
//! with the secret and with another one print the same, digits aside), so no secret can be
//! read back whatever its length or content; and nothing is masked (no `***`, no
//! `[redacted]`), so no mask pattern can give one away. The server's message stays whole:
//! `password authentication failed for user "app"`, the user name included when it is the
//! password too.

use std::{process::Command, time::Duration};

use health_agent_tests::{agent_binary, require_root, Agent, AlertReceivers, Postgres};

/// The passwords tried: the shortest, a digit, common words, words of the message ("password",
/// "for"), the user name, non-ASCII.
const SECRETS: &[&str] = &["e", "7", "ab", "xyz", "password", "for", "app", "pässwörd"];
/// What every other secret's output is compared with.
const REFERENCE: &str = "Reference-Secret-Q";
const REFUSED: &str = "password authentication failed for user \\\"app\\\"";
const WAIT: Duration = Duration::from_secs(40);

/// Where the password is given.
#[derive(Clone, Copy, Debug)]
enum Via {
    Env,
    Url,
}

struct Setup {
    pg: Postgres,
}

impl Setup {
    /// A private PostgreSQL with a role `app` whose password is none of [`SECRETS`].
    fn start() -> Self {
        let pg = Postgres::start();
        pg.psql("CREATE ROLE app LOGIN PASSWORD 'the-right-one-4711'");
        Self { pg }
    }

    fn url(&self, via: Via, secret: &str) -> String {
        match via {
            Via::Env => format!("postgres://app@127.0.0.1:{}/postgres", self.pg.port),
            Via::Url => format!(
                "postgres://app:{}@127.0.0.1:{}/postgres",
                encoded(secret),
                self.pg.port
            ),
        }
    }

    fn env(via: Via, secret: &str) -> Vec<(&'static str, String)> {
        match via {
            Via::Env => vec![("PGPASSWORD", secret.to_string())],
            Via::Url => Vec::new(),
        }
    }
}

fn encoded(secret: &str) -> String {
    secret
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// `health-agent check` and `check --json` on a config with only the database: their output,
/// with every run of digits made `0` (latencies differ from run to run).
fn check(dir: &std::path::Path, url: &str, env: &[(&str, String)]) -> String {
    let cfg = dir.join("health-agent.toml");
    std::fs::write(
        &cfg,
        // A generous timeout: a busy machine's SCRAM exchange must not read as an outage.
        format!("[server]\ndetails = \"always\"\n[database]\nurl = \"{url}\"\ntimeout = \"20s\"\n"),
    )
    .expect("config");
    let mut out = String::new();
    for json in [false, true] {
        let mut c = Command::new(agent_binary());
        c.arg("--config").arg(&cfg).arg("check");
        if json {
            c.arg("--json");
        }
        let run = c
            .env_remove("PGPASSWORD")
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .output()
            .expect("health-agent check");
        out.push_str(&String::from_utf8_lossy(&run.stdout));
        out.push_str(&String::from_utf8_lossy(&run.stderr));
    }
    digits_as_zero(&out)
}

fn digits_as_zero(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut in_digits = false;
    for c in text.chars() {
        match (c.is_ascii_digit(), in_digits) {
            (true, true) => {}
            (true, false) => out.push('0'),
            (false, _) => out.push(c),
        }
        in_digits = c.is_ascii_digit();
    }
    out
}

/// What no surface may show for `secret`: a mask, or the secret where a password sits.
fn assert_nothing_reveals(surface: &str, text: &str, secret: &str) {
    for mask in ["***", "[redacted]"] {
        assert!(
            !text.contains(mask),
            "{surface}, secret {secret:?}: a mask {mask:?} in\n{text}"
        );
    }
    for place in [
        format!(":{secret}@"),
        format!(":{}@", encoded(secret)),
        format!("PGPASSWORD={secret}"),
        format!("password={secret}"),
        format!("password={}", encoded(secret)),
    ] {
        assert!(
            !text.contains(&place),
            "{surface}, secret {secret:?}: {place:?} in\n{text}"
        );
    }
}

/// `check`: for each secret, by either route, the same output as for another secret, and the
/// server's refusal readable in it.
#[test]
fn check_prints_the_same_whatever_the_password() {
    require_root();
    let setup = Setup::start();
    let dir = tempfile::tempdir().expect("tempdir");
    for via in [Via::Env, Via::Url] {
        let reference = check(
            dir.path(),
            &setup.url(via, REFERENCE),
            &Setup::env(via, REFERENCE),
        );
        assert!(
            reference.contains(REFUSED),
            "{via:?}: the refusal is not readable:\n{reference}"
        );
        println!("{via:?}, any password:\n{reference}");
        for secret in SECRETS {
            let out = check(
                dir.path(),
                &setup.url(via, secret),
                &Setup::env(via, secret),
            );
            assert_nothing_reveals("check", &out, secret);
            assert_eq!(
                out, reference,
                "{via:?}: `check` with password {secret:?} differs from another password's"
            );
        }
    }
}

/// The running agent: `/health`, `/metrics`, the log, and the four alert destinations, for
/// every secret by either route, all agents side by side.
#[test]
fn no_surface_of_the_running_agent_reveals_the_password() {
    require_root();
    let setup = Setup::start();
    let mut runs = Vec::new();
    for via in [Via::Env, Via::Url] {
        for secret in SECRETS {
            let rx = AlertReceivers::start();
            let env = Setup::env(via, secret);
            let mut env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
            env.push(("GITHUB_TOKEN", "ghp_testtoken4711"));
            // The password in the URL, logged as JSON: a log shipper indexes each field.
            if let Via::Url = via {
                env.push(("HEALTH_AGENT_LOG_FORMAT", "json"));
            }
            let agent = Agent::start_with_env(
                &format!(
                    "[checks]\ninterval = \"500ms\"\n[database]\nurl = \"{}\"\ninterval = \"2s\"\n\
                     timeout = \"20s\"\n{}",
                    setup.url(via, secret),
                    rx.config("")
                ),
                &env,
            );
            runs.push((via, *secret, agent, rx));
        }
    }
    for (via, secret, agent, rx) in &runs {
        let (_, body) = agent.wait_health(WAIT, "the password refused", |_, b| {
            b["checks"]["database"] == "misconfigured"
                && b["details"]["database"]["reason"]
                    .as_str()
                    .is_some_and(|r| r.contains("password authentication failed"))
        });
        let posts = rx.wait_all(WAIT);
        let surfaces = [
            ("/health", body.to_string()),
            ("/metrics", agent.metrics()),
            ("the log", agent.logs()),
            ("slack", posts[0].clone()),
            ("pagerduty", posts[1].clone()),
            ("github", posts[2].clone()),
            ("webhook", posts[3].clone()),
        ];
        for (surface, text) in &surfaces {
            assert_nothing_reveals(&format!("{via:?} {surface}"), text, secret);
        }
        if let Via::Url = via {
            for line in surfaces[2].1.lines() {
                let v: serde_json::Value = serde_json::from_str(line)
                    .unwrap_or_else(|e| panic!("a log line that is not JSON ({e}): {line}"));
                assert!(v["message"].is_string(), "{line}");
            }
        }
        for (surface, text) in [&surfaces[0], &surfaces[4], &surfaces[5]] {
            assert!(
                text.contains(REFUSED) || text.contains(&REFUSED.replace("\\\"", "\"")),
                "{via:?} {surface}, secret {secret:?}: the refusal is not readable:\n{text}"
            );
        }
    }
}

/// The AWS secrets of each credential source: a secret access key and session token (from the
/// environment, a profile's file, the container endpoint), the container's authorization
/// token, the web identity token.
const AWS_SECRETS: &[&str] = &[
    "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    "Aws-Secret-4711",
    "pässwörd-ünïcode",
];

/// `check` and the running agent, for each AWS credential source: no secret on any surface,
/// and `check` prints the same whatever the secret (the source named, never a key).
#[test]
fn no_aws_credential_source_reveals_its_secrets() {
    use health_agent_tests::{moto::WEB_IDENTITY_TOKEN, Moto, Receiver};
    use std::sync::{Arc, Mutex};
    require_root();
    let moto = Moto::start();
    let dir = tempfile::tempdir().expect("tempdir");
    // PutMetricData accepted, whatever the keys: the secrets only have to travel.
    let cloudwatch = Receiver::start(|_, _| (200, "<PutMetricDataResponse/>".into()));
    let toml = format!(
        "[scaling.cloudwatch]\nenabled = true\nregion = \"us-east-1\"\nauto_scaling_group = \"g\"\n\
         interval = \"10s\"\nhigh_resolution = true\nendpoint = \"{}\"\n",
        cloudwatch.url("")
    );
    let served = Arc::new(Mutex::new(String::new()));
    let secret_of = served.clone();
    let container = Receiver::start(move |req, _| {
        let s = secret_of.lock().unwrap().clone();
        if req.header("authorization") != Some(format!("auth-{s}").as_str()) {
            return (401, "{}".into());
        }
        let body = serde_json::json!({"AccessKeyId": "ASIACONTAINER", "SecretAccessKey": s,
            "Token": format!("token-{s}"), "Expiration": "2099-01-01T00:00:00Z"});
        (200, body.to_string())
    });
    let write = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).expect("write");
        p.display().to_string()
    };
    let web_token = write("web-token", WEB_IDENTITY_TOKEN);
    // (source, its environment for a secret).
    type EnvOf<'a> = Box<dyn Fn(&str) -> Vec<(&'static str, String)> + 'a>;
    let sources: Vec<(&str, EnvOf)> = vec![
        (
            "environment",
            Box::new(|s: &str| {
                vec![
                    ("AWS_ACCESS_KEY_ID", "AKIDSECRETSTEST".into()),
                    ("AWS_SECRET_ACCESS_KEY", s.into()),
                    ("AWS_SESSION_TOKEN", format!("token-{s}")),
                ]
            }),
        ),
        (
            "profile",
            Box::new(|s: &str| {
                let f = write(
                    "credentials",
                    &format!(
                        "[default]\naws_access_key_id = AKIDPROFILE\naws_secret_access_key = {s}\n\
                         aws_session_token = token-{s}\n"
                    ),
                );
                vec![("AWS_SHARED_CREDENTIALS_FILE", f)]
            }),
        ),
        (
            "container",
            Box::new(|s: &str| {
                *served.lock().unwrap() = s.to_string();
                vec![
                    (
                        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
                        container.url("/creds"),
                    ),
                    (
                        "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
                        write("auth", &format!("auth-{s}")),
                    ),
                ]
            }),
        ),
        (
            // moto's STS takes only its own token: the secret here is that token.
            "web identity",
            Box::new(|_: &str| {
                vec![
                    ("AWS_WEB_IDENTITY_TOKEN_FILE", web_token.clone()),
                    (
                        "AWS_ROLE_ARN",
                        "arn:aws:iam::123456789012:role/agent".into(),
                    ),
                    ("AWS_ENDPOINT_URL_STS", moto.endpoint()),
                ]
            }),
        ),
    ];
    let cfg = dir.path().join("aws.toml");
    std::fs::write(&cfg, &toml).expect("config");
    let check = |env: &[(&'static str, String)]| {
        let mut c = Command::new(agent_binary());
        for (var, _) in std::env::vars_os() {
            if var.to_string_lossy().starts_with("AWS_") {
                c.env_remove(var);
            }
        }
        let none = dir.path().join("none");
        let run = c
            .env("AWS_CONFIG_FILE", &none)
            .env("AWS_SHARED_CREDENTIALS_FILE", &none)
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .arg("--config")
            .arg(&cfg)
            .arg("check")
            .output()
            .expect("health-agent check");
        digits_as_zero(&format!(
            "{}{}",
            String::from_utf8_lossy(&run.stdout),
            String::from_utf8_lossy(&run.stderr)
        ))
    };
    for (source, env_of) in &sources {
        let reference = check(&env_of("Reference-Secret-Q"));
        assert!(
            reference.contains("aws credentials") && reference.contains(" — ok"),
            "{source}: the keys were not had:\n{reference}"
        );
        println!("{source}:\n{reference}");
        for secret in AWS_SECRETS {
            let env = env_of(secret);
            let out = check(&env);
            for s in [
                secret.to_string(),
                format!("token-{secret}"),
                WEB_IDENTITY_TOKEN.into(),
            ] {
                assert!(!out.contains(&s), "{source}: `check` shows {s:?}:\n{out}");
            }
            assert_eq!(out, reference, "{source}: `check` depends on the secret");
            if *secret != AWS_SECRETS[0] {
                // The running agent with one of them: its surfaces take a published interval.
                continue;
            }
            let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let mut env = env;
            env.push(("AWS_EC2_METADATA_DISABLED", "true"));
            let agent = Agent::start_with_env(&toml, &env);
            let (_, body) = agent.wait_health(WAIT, "a published interval", |_, b| {
                b["details"]["scaling"]["cloudwatch"]["published_data"].as_u64() >= Some(1)
            });
            assert!(body.to_string().contains("credentials"), "{body}");
            let token = format!("token-{secret}");
            agent.assert_shows_none(&[secret, &token, WEB_IDENTITY_TOKEN]);
        }
    }
}
