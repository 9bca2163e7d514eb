//! The fleet's peers from the auto-scaling group (`fleet.peers_from = "asg"`), against moto (a
//! real implementation of the Auto Scaling and EC2 APIs) with the instance's metadata from an
//! IMDSv2 stub; and the shipped CloudFormation template's UserData run on the installed .deb
//! under real systemd (`the_cloudformation_user_data_*`).
//!
//! moto's instances live in a subnet of 127.0.0.0/16, so the private addresses the agent finds
//! and asks are loopback ones: nothing leaves this host.

use std::time::{Duration, Instant};

use health_agent_tests::{
    moto::{imds_stub, Metadata, Role},
    require_root, wait_until, Agent, Moto, Receiver,
};
use serde_json::Value;

const REGION: &str = "eu-west-1";
const ROLE_SECRET: &str = "role-secret-never-shown";
const SESSION: &str = "SESSION-TOKEN-never-shown";

fn role() -> Role {
    Role {
        name: "web-role",
        access_key_id: "ASIAROLEKEY",
        secret_access_key: ROLE_SECRET,
        session_token: SESSION,
    }
}

/// The agent's environment: no keys of its own, the metadata service at `imds`.
fn env(imds: &Receiver) -> Vec<(&'static str, String)> {
    vec![
        ("AWS_ACCESS_KEY_ID", String::new()),
        ("AWS_SECRET_ACCESS_KEY", String::new()),
        ("AWS_SESSION_TOKEN", String::new()),
        ("AWS_REGION", String::new()),
        ("AWS_DEFAULT_REGION", String::new()),
        ("AWS_EC2_METADATA_DISABLED", String::new()),
        ("AWS_EC2_METADATA_SERVICE_ENDPOINT", imds.url("")),
    ]
}

/// An agent whose peers are the group's members, listed every 5 s through `endpoint`.
fn agent(endpoint: &str, imds: &Receiver) -> Agent {
    let env = env(imds);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    Agent::start_with_env(
        &format!(
            "[fleet]\npeers_from = \"asg\"\naws_endpoint = \"{endpoint}\"\npeers_refresh = \"5s\"\n\
             interval = \"1s\"\ntimeout = \"300ms\"\nsample = 20\n"
        ),
        &env,
    )
}

fn fleet(agent: &Agent) -> (u16, Value) {
    let (code, body) = agent.health();
    (code, body["details"]["fleet"].clone())
}

fn asked(fleet: &Value) -> Vec<String> {
    let mut v: Vec<String> = fleet["peers_asked"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|p| p.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

fn assert_no_secret(agent: &Agent) {
    let (_, body) = agent.get("/health").expect("GET /health");
    let logs = agent.logs();
    for s in [ROLE_SECRET, SESSION] {
        assert!(!body.contains(s), "/health shows a credential: {body}");
        assert!(!logs.contains(s), "the log shows a credential:\n{logs}");
    }
}

#[test]
fn asg_in_service_members_are_the_peers_and_one_put_in_standby_leaves() {
    require_root();
    let moto = Moto::start();
    let group = moto.auto_scaling_group(REGION, "web-asg", 1, 4);
    // This agent plays the group's first instance; metadata tags are off, so the group is
    // found through DescribeAutoScalingInstances.
    let (own_id, own_ip) = group.members[0].clone();
    let imds = imds_stub(Metadata {
        token: "TOKEN-asg",
        instance_id: own_id.clone(),
        region: REGION.into(),
        group_tag: None,
        role: Some(role()),
    });
    let started = Instant::now();
    let agent = agent(&moto.endpoint(), &imds);
    let port = agent.port;
    let at = |ip: &str| format!("{ip}:{port}");
    let mut want: Vec<String> = group.members[1..].iter().map(|(_, ip)| at(ip)).collect();
    want.sort();
    let mut codes = Vec::new();
    let found = wait_until(Duration::from_secs(20), "the group's members asked", || {
        let (code, f) = fleet(&agent);
        codes.push(code);
        (asked(&f) == want).then_some(f)
    });
    println!(
        "asg: {} of {} members asked {:.1} s after start ({own_id} at {own_ip} is this one): {}",
        want.len(),
        group.members.len(),
        started.elapsed().as_secs_f64(),
        found
    );
    assert!(
        !asked(&found).contains(&at(&own_ip)),
        "this instance never asks itself: {found}"
    );

    // One member to Standby: gone from the peers after the next listing (every 5 s).
    let (standby_id, standby_ip) = group.members[2].clone();
    moto.enter_standby(&group, &standby_id);
    let moved = Instant::now();
    want.retain(|p| *p != at(&standby_ip));
    wait_until(
        Duration::from_secs(20),
        "the Standby member left out",
        || {
            let (code, f) = fleet(&agent);
            codes.push(code);
            (asked(&f) == want).then_some(())
        },
    );
    let took = moved.elapsed();
    println!(
        "asg: {standby_id} ({standby_ip}) in Standby, no longer asked {:.1} s later",
        took.as_secs_f64()
    );
    assert!(
        took <= Duration::from_secs(5 + 1 + 3),
        "left out after {took:?}: want within peers_refresh (5 s, ±10 %) and a round"
    );

    // AWS unreachable: the last list is kept, and the fleet view says so.
    drop(moto);
    let stale = wait_until(Duration::from_secs(20), "the listing failure said", || {
        let (code, f) = fleet(&agent);
        codes.push(code);
        f.to_string().contains("listing failed").then_some(f)
    });
    println!("asg: moto stopped: {stale}");
    assert_eq!(asked(&stale), want, "the last good list is still asked");
    assert!(
        stale.to_string().contains("cannot connect"),
        "the cause is said: {stale}"
    );
    let imds_token_puts = imds.requests().iter().filter(|r| r.method == "PUT").count();
    assert_eq!(imds_token_puts, 1, "one IMDSv2 token for every read");
    // No answering peer, no [web], nothing wrong here: never a 503 for a listing problem.
    assert!(codes.iter().all(|c| *c == 200), "/health codes: {codes:?}");
    assert_no_secret(&agent);
}

/// AWS answering every call with `status` and an error `code`, as Auto Scaling does.
fn refusing(status: u16, code: &'static str) -> Receiver {
    Receiver::start(move |_, _| {
        (
            status,
            format!(
                "<ErrorResponse><Error><Type>Sender</Type><Code>{code}</Code>\
                 <Message>User: arn:aws:sts::123456789012:assumed-role/web-role/i-1 with key \
                 ASIAROLEKEY is not allowed</Message></Error><RequestId>r</RequestId></ErrorResponse>"
            ),
        )
    })
}

/// Waits for details.fleet to mention `says`, /health 200 all along; the fleet view then.
fn wait_note(agent: &Agent, says: &[&str]) -> Value {
    let mut codes = Vec::new();
    let f = wait_until(Duration::from_secs(15), &format!("{says:?} said"), || {
        let (code, f) = fleet(agent);
        codes.push(code);
        let text = f.to_string();
        says.iter().all(|s| text.contains(s)).then_some(f)
    });
    assert!(codes.iter().all(|c| *c == 200), "/health codes: {codes:?}");
    assert_eq!(f["configured"], true, "{f}");
    assert_no_secret(agent);
    f
}

#[test]
fn asg_access_denied_no_role_and_throttling_are_fleet_notes_not_503s() {
    require_root();
    let metadata = |role: Option<Role>| Metadata {
        token: "TOKEN-err",
        instance_id: "i-0aaaaaaaaaaaaaaaa".into(),
        region: REGION.into(),
        group_tag: Some("web-asg".into()),
        role,
    };

    // A role without the Describe permissions.
    let aws = refusing(403, "AccessDenied");
    let imds = imds_stub(metadata(Some(role())));
    let a = agent(&aws.url("/"), &imds);
    let f = wait_note(
        &a,
        &[
            "AccessDenied",
            "autoscaling:DescribeAutoScalingGroups",
            "ec2:DescribeInstances",
        ],
    );
    println!("access denied: {f}");
    let log = a.logs();
    assert!(
        log.contains("AccessDenied") && !log.contains("ASIAROLEKEY"),
        "the log says why, without the key:\n{log}"
    );
    drop(a);

    // No instance profile.
    let imds = imds_stub(metadata(None));
    let a = agent(&aws.url("/"), &imds);
    let f = wait_note(&a, &["no credentials", "attach an instance profile"]);
    println!("no role: {f}");
    drop(a);

    // Throttled: said, and not retried before the next refresh.
    let aws = refusing(400, "Throttling");
    let imds = imds_stub(metadata(Some(role())));
    let a = agent(&aws.url("/"), &imds);
    let f = wait_note(&a, &["throttled"]);
    let first = Instant::now();
    std::thread::sleep(Duration::from_secs(8));
    let calls = aws.posts().len();
    println!(
        "throttled: {calls} calls in {:.1} s after the first: {f}",
        first.elapsed().as_secs_f64()
    );
    assert!(
        calls <= 3,
        "{calls} calls: a throttled listing waits a full peers_refresh (5 s)"
    );
}
