//! The saturation published to CloudWatch, end to end: the agent's PutMetricData against moto
//! (a real implementation of the CloudWatch API) read back with boto3, credentials and
//! placement from an IMDSv2 stub, and local stubs standing in for a CloudWatch that throttles,
//! stalls or refuses — where the retries must stay bounded and `/health` fast.

use std::{
    net::{SocketAddr, TcpListener},
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use health_agent_tests::{
    free_port,
    moto::{imds_stub, Metadata, Role},
    request_at, require_root, wait_until, Agent, Moto, Receiver,
};
use serde_json::{json, Value};

const KEY_ID: &str = "AKIDHEALTHAGENTTEST";
const SECRET: &str = "secret-key-never-shown-0123456789";

/// Credentials from the environment; the metadata service off (nothing may leave loopback).
fn env_credentials() -> Vec<(&'static str, &'static str)> {
    vec![
        ("AWS_ACCESS_KEY_ID", KEY_ID),
        ("AWS_SECRET_ACCESS_KEY", SECRET),
        ("AWS_SESSION_TOKEN", ""),
        ("AWS_REGION", ""),
        ("AWS_DEFAULT_REGION", ""),
        ("AWS_EC2_METADATA_DISABLED", "true"),
    ]
}

fn config(endpoint: &str, more: &str) -> String {
    format!(
        "[scaling.cloudwatch]\nenabled = true\nendpoint = \"{endpoint}\"\n\
         interval = \"10s\"\nhigh_resolution = true\n{more}\n"
    )
}

fn cloudwatch(agent: &Agent) -> Value {
    let (_, body) = agent.health();
    body["details"]["scaling"]["cloudwatch"].clone()
}

/// What the agent reports as its saturation, in percent.
fn saturation_percent(body: &Value) -> Option<f64> {
    let d = &body["details"];
    if let Some(r) = d["saturation"]["ratio"].as_f64() {
        return Some(r * 100.0);
    }
    // Before the saturation estimator: the larger of CPU and memory, which the agent sends.
    let cpu = d["system"]["cpu_avg_percent"].as_f64()?;
    let mem = d["system"]["memory_avg_percent"].as_f64()?;
    Some(cpu.max(mem))
}

/// p99 of `n` sequential `GET /health` round trips.
fn health_p99(agent: &Agent, n: usize) -> Duration {
    let mut times: Vec<Duration> = (0..n)
        .map(|_| {
            let t = Instant::now();
            let (code, _, _) =
                request_at(agent.addr, "GET", "/health", &[], Duration::from_secs(5))
                    .expect("GET /health");
            assert!(code == 200 || code == 503, "{code}");
            t.elapsed()
        })
        .collect();
    times.sort();
    times[(n * 99 / 100).min(n - 1)]
}

#[test]
fn saturation_arrives_in_moto_with_namespace_dimension_and_unit() {
    require_root();
    let moto = Moto::start();
    let agent = Agent::start_with_env(
        &config(
            &moto.endpoint(),
            "region = \"us-east-1\"\nauto_scaling_group = \"web-asg\"",
        ),
        &env_credentials(),
    );
    // What the agent itself says while it publishes: the values moto gets must be these.
    let mut seen: Vec<f64> = Vec::new();
    let status = wait_until(Duration::from_secs(45), "two published intervals", || {
        let (_, body) = agent.health();
        seen.extend(saturation_percent(&body));
        let cw = body["details"]["scaling"]["cloudwatch"].clone();
        (cw["published_data"].as_u64() >= Some(2)).then_some(cw)
    });
    assert_eq!(status["enabled"], true);
    assert_eq!(status["auto_scaling_group"], "web-asg");
    assert_eq!(status["credentials"], "environment");
    assert!(status["last_success"].is_string(), "{status}");

    let back = moto.read_back("us-east-1", "HealthAgent");
    assert_eq!(
        back["metrics"],
        json!([{
            "Namespace": "HealthAgent",
            "MetricName": "Saturation",
            "Dimensions": [{"Name": "AutoScalingGroupName", "Value": "web-asg"}],
        }]),
        "one metric, named as SPEC.md says: {back}"
    );
    let points = back["datapoints"].as_array().expect("datapoints");
    assert_eq!(points.len(), 1, "only under unit Percent: {back}");
    let p = &points[0];
    assert_eq!(p["Unit"], "Percent");
    assert_eq!(p["QueriedUnit"], "Percent");
    // Two or more intervals of 10 s, a sample a second (the first interval may be cut short).
    let count = p["SampleCount"].as_f64().expect("SampleCount");
    assert!((10.0..=80.0).contains(&count), "samples: {p}");
    let (avg, min, max) = (
        p["Average"].as_f64().unwrap(),
        p["Minimum"].as_f64().unwrap(),
        p["Maximum"].as_f64().unwrap(),
    );
    assert!(min <= avg && avg <= max, "{p}");
    let lo = seen.iter().cloned().fold(f64::INFINITY, f64::min);
    let hi = seen.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    assert!(
        min >= lo - 2.0 && max <= hi + 2.0,
        "moto got {min}..{max} %, the agent showed {lo}..{hi} %"
    );
    println!(
        "moto read back: SampleCount {count}, Average {avg:.2} %, Min {min:.2}, Max {max:.2}; \
         /health showed {lo:.2}..{hi:.2} %"
    );
    agent.assert_shows_none(&[SECRET]);
}

#[test]
fn instance_role_region_and_group_come_from_imdsv2() {
    require_root();
    let moto = Moto::start();
    let (role_secret, session) = ("role-secret-never-shown", "SESSION-TOKEN-never-shown");
    let imds = imds_stub(Metadata {
        token: "TOKEN-v2",
        instance_id: "i-0123456789abcdef0".into(),
        region: "eu-west-1".into(),
        group_tag: Some("asg-from-tags".into()),
        role: Some(Role {
            name: "web-role".into(),
            access_key_id: "ASIAROLEKEY",
            secret_access_key: role_secret,
            session_token: session,
        }),
        lifecycle_state: None,
    });
    let env = [
        ("AWS_ACCESS_KEY_ID", ""),
        ("AWS_SECRET_ACCESS_KEY", ""),
        ("AWS_REGION", ""),
        ("AWS_DEFAULT_REGION", ""),
        ("AWS_EC2_METADATA_DISABLED", ""),
        ("AWS_EC2_METADATA_SERVICE_ENDPOINT", &imds.url("")),
    ];
    let agent = Agent::start_with_env(&config(&moto.endpoint(), ""), &env);
    let status = wait_until(Duration::from_secs(45), "a published interval", || {
        let cw = cloudwatch(&agent);
        (cw["published_data"].as_u64() >= Some(1)).then_some(cw)
    });
    assert_eq!(status["credentials"], "instance role (IMDSv2)");
    assert_eq!(status["region"], "eu-west-1");
    assert_eq!(status["auto_scaling_group"], "asg-from-tags");

    let back = moto.read_back("eu-west-1", "HealthAgent");
    assert_eq!(
        back["metrics"][0]["Dimensions"],
        json!([{"Name": "AutoScalingGroupName", "Value": "asg-from-tags"}]),
        "{back}"
    );
    assert_eq!(back["datapoints"][0]["Unit"], "Percent", "{back}");
    let elsewhere = moto.read_back("us-east-1", "HealthAgent");
    assert_eq!(
        elsewhere["metrics"],
        json!([]),
        "only in the instance's region"
    );

    let reqs = imds.requests();
    assert_eq!(
        reqs[0].method, "PUT",
        "IMDSv2: the token first: {:?}",
        reqs[0]
    );
    for r in reqs.iter().filter(|r| r.method == "GET") {
        assert_eq!(
            r.header("X-aws-ec2-metadata-token"),
            Some("TOKEN-v2"),
            "{r:?}"
        );
    }
    let tokens = reqs.iter().filter(|r| r.method == "PUT").count();
    assert_eq!(tokens, 1, "the token is reused, not asked for per read");
    agent.assert_shows_none(&[role_secret, session]);
}

/// A CloudWatch that throttles every request (HTTP 400, code Throttling, as AWS answers).
fn throttling() -> Receiver {
    Receiver::start(|_, _| {
        (
            400,
            "<ErrorResponse xmlns=\"http://monitoring.amazonaws.com/doc/2010-08-01/\"><Error>\
             <Type>Sender</Type><Code>Throttling</Code><Message>Rate exceeded</Message></Error>\
             <RequestId>x</RequestId></ErrorResponse>"
                .into(),
        )
    })
}

/// Accepts connections and never answers: a CloudWatch that stalls. Counts connections.
fn stalling() -> (SocketAddr, Arc<AtomicUsize>) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    let n = Arc::new(AtomicUsize::new(0));
    let counted = n.clone();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in l.incoming().flatten() {
            counted.fetch_add(1, Ordering::SeqCst);
            held.push(s);
        }
    });
    (addr, n)
}

/// Waits for two batches given up, then checks the retries were bounded and /health fast.
/// `sent` counts what reached the server, where there is one.
fn check_bounded(agent: &Agent, sent: Option<&dyn Fn() -> usize>, error_says: &str) {
    let max_retries = 2;
    let started = Instant::now();
    let status = wait_until(Duration::from_secs(60), "two batches given up", || {
        let cw = cloudwatch(agent);
        (cw["batches"].as_u64()? >= 2 && cw["requests"].as_u64()? >= 2 * (1 + max_retries))
            .then_some(cw)
    });
    let p99 = health_p99(agent, 300);
    let elapsed = started.elapsed();
    let status_now = cloudwatch(agent);
    let n = |k: &str| status_now[k].as_u64().unwrap_or(0);
    let (batches, requests, retries) = (n("batches"), n("requests"), n("retries"));
    println!(
        "{error_says}: {requests} requests ({batches} batches, {retries} retries) in {elapsed:?}; \
         /health p99 {p99:?}; status {status_now}"
    );
    assert!(
        requests <= batches * (1 + max_retries),
        "at most {max_retries} retries per batch: {status_now}"
    );
    // One batch per 10 s interval at most, so no retry storm.
    let intervals = elapsed.as_secs() / 10 + 2;
    assert!(batches <= intervals, "one batch per interval: {status_now}");
    if let Some(sent) = sent {
        let n = sent() as u64;
        assert!(
            // Read a moment apart from the status: one request may be in flight either way.
            n + 1 >= requests && n <= batches * (1 + max_retries) + 1,
            "{n} requests reached the server: {status_now}"
        );
    }
    let error = status["last_error"].as_str().unwrap_or("");
    assert!(error.contains(error_says), "last_error: {status}");
    assert_eq!(status["published_data"], 0);
    assert!(
        status["pending_data"].as_u64() >= Some(1),
        "kept for later: {status}"
    );
    assert!(
        p99 < Duration::from_millis(100),
        "/health p99 {p99:?} while CloudWatch fails: it must never wait on it"
    );
    agent.assert_shows_none(&[SECRET]);
}

/// An agent publishing to CloudWatch at `endpoint` (`us-east-1`, group `g`) with 2 retries of
/// 1 s each.
fn retrying_agent(endpoint: &str) -> Agent {
    let cloudwatch =
        "region = \"us-east-1\"\nauto_scaling_group = \"g\"\nmax_retries = 2\ntimeout = \"1s\"";
    Agent::start_with_env(&config(endpoint, cloudwatch), &env_credentials())
}

#[test]
fn throttling_is_retried_a_bounded_number_of_times_and_health_stays_fast() {
    require_root();
    let stub = throttling();
    let agent = retrying_agent(&stub.url(""));
    check_bounded(&agent, Some(&|| stub.posts().len()), "Throttling");
    // What arrived was a signed PutMetricData.
    let first = &stub.posts()[0];
    let auth = first.header("authorization").unwrap_or("");
    assert!(
        auth.starts_with(&format!("AWS4-HMAC-SHA256 Credential={KEY_ID}/"))
            && auth.contains("/us-east-1/monitoring/aws4_request"),
        "{auth}"
    );
}

#[test]
fn stalling_cloudwatch_times_out_and_health_stays_fast() {
    require_root();
    let (addr, connections) = stalling();
    let agent = retrying_agent(&format!("http://{addr}"));
    check_bounded(
        &agent,
        Some(&|| connections.load(Ordering::SeqCst)),
        "timed out",
    );
}

#[test]
fn refusing_cloudwatch_is_retried_boundedly() {
    require_root();
    // Nothing listens there: connection refused.
    let port = free_port();
    let agent = retrying_agent(&format!("http://127.0.0.1:{port}"));
    check_bounded(&agent, None, "cannot connect");
}

#[test]
fn nothing_is_published_while_the_saturation_is_withheld() {
    require_root();
    let moto = Moto::start();
    // A database nobody answers: a shared dependency fault, so the saturation is withheld.
    let db = free_port();
    let agent = Agent::start_with_env(
        &format!(
            "{}\n[database]\nurl = \"postgres://app@127.0.0.1:{db}/app\"\ninterval = \"500ms\"\n\
             timeout = \"200ms\"\nfail_after = 1\n",
            config(
                &moto.endpoint(),
                "region = \"us-east-1\"\nauto_scaling_group = \"web-asg\""
            )
        ),
        &env_credentials(),
    );
    agent.wait_health(Duration::from_secs(20), "infrastructure_issue", |_, b| {
        b["recommendation"] == "infrastructure_issue"
    });
    let status = wait_until(Duration::from_secs(40), "two intervals withheld", || {
        let (_, body) = agent.health();
        assert_eq!(body["recommendation"], "infrastructure_issue", "{body}");
        let cw = body["details"]["scaling"]["cloudwatch"].clone();
        (cw["withheld_samples"].as_u64() >= Some(22)).then_some(cw)
    });
    assert_eq!(status["published_data"], 0, "{status}");
    assert_eq!(status["requests"], 0, "{status}");
    let back = moto.read_back("us-east-1", "HealthAgent");
    assert_eq!(
        back["metrics"],
        json!([]),
        "nothing reached CloudWatch: {back}"
    );
}

#[test]
fn config_validate_refuses_bad_namespace_and_dimension_with_exit_2() {
    let dir = tempfile::tempdir().expect("tempdir");
    let run = |toml: &str| {
        let path = dir.path().join("c.toml");
        std::fs::write(&path, toml).expect("write");
        let out = std::process::Command::new(health_agent_tests::agent_binary())
            .args(["config", "--validate"])
            .arg(&path)
            .output()
            .expect("running health-agent");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    for (toml, key, says) in [
        (
            "[scaling.cloudwatch]\nnamespace = \"AWS/EC2\"\n",
            "scaling.cloudwatch.namespace",
            "reserved",
        ),
        (
            "[scaling.cloudwatch]\nnamespace = \"Health|Agent\"\n",
            "scaling.cloudwatch.namespace",
            "'|'",
        ),
        (
            "[scaling.cloudwatch]\nauto_scaling_group = \"   \"\n",
            "scaling.cloudwatch.auto_scaling_group",
            "white space",
        ),
        (
            "[scaling.cloudwatch]\nauto_scaling_group = \"web-ä\"\n",
            "scaling.cloudwatch.auto_scaling_group",
            "ASCII",
        ),
        (
            "[scaling.cloudwatch]\ninterval = \"5s\"\nhigh_resolution = true\n",
            "scaling.cloudwatch.interval",
            "allowed 10s",
        ),
    ] {
        let (code, err) = run(toml);
        assert_eq!(code, Some(2), "{toml}: {err}");
        assert!(err.contains(key) && err.contains(says), "{toml}: {err}");
    }
    let (code, err) =
        run("[scaling.cloudwatch]\nenabled = true\nauto_scaling_group = \"web-asg\"\n");
    assert_eq!(code, Some(0), "{err}");
}

/// What CloudWatch answers a PutMetricData it accepts.
const ACCEPTED: &str = "<PutMetricDataResponse xmlns=\"http://monitoring.amazonaws.com/doc/2010-08-01/\"><ResponseMetadata><RequestId>r</RequestId></ResponseMetadata></PutMetricDataResponse>";

#[test]
fn botocore_computes_the_same_sigv4_signature() {
    require_root();
    let cloudwatch_stub = Receiver::start(|_, _| (200, ACCEPTED.into()));
    let session = "SESSION-token-for-signing";
    let mut env = env_credentials();
    env.retain(|(k, _)| *k != "AWS_SESSION_TOKEN");
    env.push(("AWS_SESSION_TOKEN", session));
    let agent = Agent::start_with_env(
        &config(
            &cloudwatch_stub.url(""),
            "region = \"eu-central-1\"\nauto_scaling_group = \"g\"",
        ),
        &env,
    );
    wait_until(Duration::from_secs(40), "a published interval", || {
        (cloudwatch(&agent)["published_data"].as_u64() >= Some(1)).then_some(())
    });
    let request = cloudwatch_stub.requests()[0].clone();
    let header = |name: &str| {
        let value = request.header(name);
        value.unwrap_or_else(|| panic!("no {name} header in {:?}", request.headers))
    };
    assert_eq!(header("x-amz-security-token"), session);
    let input = json!({
        "url": format!("http://{}/", header("host")),
        "body": String::from_utf8(request.raw.clone()).expect("a form body is ASCII"),
        "content_type": header("content-type"),
        "amz_date": header("x-amz-date"),
        "token": session,
        "key": KEY_ID,
        "secret": SECRET,
    });
    // botocore's own SigV4 (the AWS SDK for Python), over the request as it arrived.
    let script = r#"
import json, sys
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
i = json.load(sys.stdin)
req = AWSRequest(method="POST", url=i["url"], data=i["body"].encode(), headers={
    "Content-Type": i["content_type"], "X-Amz-Date": i["amz_date"],
    "X-Amz-Security-Token": i["token"]})
req.context["timestamp"] = i["amz_date"]
auth = SigV4Auth(Credentials(i["key"], i["secret"], i["token"]), "monitoring", "eu-central-1")
creq = auth.canonical_request(req)
sts = auth.string_to_sign(req, creq)
print(json.dumps({"signature": auth.signature(sts, req),
                  "signed_headers": auth.signed_headers(auth.headers_to_sign(req))}))
"#;
    let mut child = std::process::Command::new(health_agent_tests::moto::python())
        .args(["-c", script])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python3 with botocore (cargo xtask setup installs moto, which brings it)");
    {
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.to_string().as_bytes())
            .unwrap();
    }
    let out = child.wait_with_output().expect("botocore");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let theirs: Value = serde_json::from_slice(&out.stdout).expect("JSON from botocore");
    let auth = header("authorization");
    println!("agent: {auth}\nbotocore: {theirs}");
    assert!(
        auth.starts_with(&format!(
            "AWS4-HMAC-SHA256 Credential={KEY_ID}/{}/eu-central-1/monitoring/aws4_request, ",
            &header("x-amz-date")[..8]
        )),
        "{auth}"
    );
    assert!(
        auth.contains(&format!(
            "SignedHeaders={},",
            theirs["signed_headers"].as_str().unwrap()
        )),
        "{auth} vs {theirs}"
    );
    assert!(
        auth.ends_with(&format!(
            "Signature={}",
            theirs["signature"].as_str().unwrap()
        )),
        "{auth} vs {theirs}"
    );
}
