//! The fleet's peers from the auto-scaling group (`fleet.peers_from = "asg"`), against moto (a
//! real implementation of the Auto Scaling and EC2 APIs) with the instance's metadata from an
//! IMDSv2 stub; and the shipped CloudFormation template's parameters, deployed in moto
//! (`the_cloudformation_template_*`). Its UserData runs for real in `aws_user_data.rs`.
//!
//! moto's instances live in a subnet of 127.0.0.0/16, so the private addresses the agent finds
//! and asks are loopback ones: nothing leaves this host.

use std::time::{Duration, Instant};

use health_agent_tests::{
    moto::{imds_stub, instance_env, Metadata, Role},
    require_root,
    stack::{self, Stack},
    wait_until, Agent, Moto, Receiver,
};
use serde_json::Value;

const REGION: &str = "eu-west-1";
const ROLE_SECRET: &str = "role-secret-never-shown";
const SESSION: &str = "SESSION-TOKEN-never-shown";

fn role() -> Role {
    Role {
        name: "web-role".into(),
        access_key_id: "ASIAROLEKEYEXAMPLE01",
        secret_access_key: ROLE_SECRET,
        session_token: SESSION,
    }
}

/// An agent whose peers are the group's members, listed every 5 s through `endpoint`.
fn agent(endpoint: &str, imds: &Receiver) -> Agent {
    let env = instance_env(imds);
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
        lifecycle_state: None,
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
        (health_agent_tests::moto::peers_asked(&f) == want).then_some(f)
    });
    println!(
        "asg: {} of {} members asked {:.1} s after start ({own_id} at {own_ip} is this one): {}",
        want.len(),
        group.members.len(),
        started.elapsed().as_secs_f64(),
        found
    );
    assert!(
        !health_agent_tests::moto::peers_asked(&found).contains(&at(&own_ip)),
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
            (health_agent_tests::moto::peers_asked(&f) == want).then_some(())
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
    assert_eq!(
        health_agent_tests::moto::peers_asked(&stale),
        want,
        "the last good list is still asked"
    );
    assert!(
        stale.to_string().contains("cannot connect"),
        "the cause is said: {stale}"
    );
    let imds_token_puts = imds.requests().iter().filter(|r| r.method == "PUT").count();
    assert_eq!(imds_token_puts, 1, "one IMDSv2 token for every read");
    // No answering peer, no [web], nothing wrong here: never a 503 for a listing problem.
    assert!(codes.iter().all(|c| *c == 200), "/health codes: {codes:?}");
    agent.assert_shows_none(&[ROLE_SECRET, SESSION]);
}

/// AWS answering every call with `status` and an error `code`, as Auto Scaling does.
fn refusing(status: u16, code: &'static str) -> Receiver {
    Receiver::start(move |_, _| {
        (
            status,
            format!(
                "<ErrorResponse><Error><Type>Sender</Type><Code>{code}</Code>\
                 <Message>User: arn:aws:sts::123456789012:assumed-role/web-role/i-1 with key \
                 ASIAROLEKEYEXAMPLE01 is not allowed</Message></Error><RequestId>r</RequestId></ErrorResponse>"
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
    agent.assert_shows_none(&[ROLE_SECRET, SESSION]);
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
        lifecycle_state: None,
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
        log.contains("AccessDenied") && !log.contains("ASIAROLEKEYEXAMPLE01"),
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
    // Counted over a window of its own: the calls before it depend on how long the agent took
    // to start and the note to be seen.
    let (before, first) = (aws.posts().len(), Instant::now());
    std::thread::sleep(Duration::from_secs(8));
    let calls = aws.posts().len() - before;
    println!(
        "throttled: {calls} calls in the {:.1} s after the note: {f}",
        first.elapsed().as_secs_f64()
    );
    assert!(
        calls <= 2,
        "{calls} calls in 8 s: a throttled listing waits a full peers_refresh (5 s)"
    );
}

/// The parameters a real deployment turns: AppWorkers asked for; the balancer's subnets, the
/// subnet's own public-address setting, a hop limit of 1 and no Parameter Store grant unless
/// told; private subnets, an explicit public address, another health port and a hop limit of 2
/// when told. moto enforces no `Rules` (AppPort = HealthPort): cfn-lint checks their form.
#[test]
fn the_cloudformation_template_asks_for_workers_and_deploys_in_private_subnets() {
    require_root();
    let moto = Moto::start();

    let private_params = [
        ("AppWorkers", "10"),
        ("InstanceSubnets", "spare"),
        ("AssociatePublicIpAddress", "false"),
        ("HealthPort", "9090"),
        ("MetadataHopLimit", "2"),
    ];
    let [no_workers, plain, private]: [Result<Stack, String>; 3] = stack::deploy_each(
        &moto,
        REGION,
        &[
            ("no-workers", &[]),
            ("plain", &[("AppWorkers", "10")]),
            ("private", &private_params),
        ],
    )
    .try_into()
    .unwrap_or_else(|v: Vec<_>| panic!("{} answers for 3 stacks", v.len()));
    let refused = no_workers.err();
    println!("without AppWorkers: {refused:?}");
    assert!(
        refused.as_deref().is_some_and(|e| e.contains("AppWorkers")),
        "a stack without AppWorkers is refused: {refused:?}"
    );

    let plain = plain.unwrap_or_else(|e| panic!("the stack was refused: {e}"));
    println!("defaults: launch template {}", plain.launch);
    assert_eq!(plain.group_subnets, plain.balancer_subnets);
    assert_eq!(
        plain.launch["MetadataOptions"]["HttpPutResponseHopLimit"],
        1
    );
    assert_eq!(plain.launch["MetadataOptions"]["HttpTokens"], "required");
    assert_eq!(
        plain.launch["SecurityGroupIds"],
        serde_json::json!([plain.security_group])
    );
    assert!(
        plain.launch.get("NetworkInterfaces").is_none(),
        "the subnet decides the public address: {}",
        plain.launch
    );
    assert_eq!(plain.health_check_port, "8080");
    assert!(plain.balancer_reaches_health_port && plain.peers_reach_health_port);
    assert!(
        !plain.may("ssm:GetParameter"),
        "no Parameter Store grant without DatabasePasswordParameter: {:?}",
        plain.role_grants
    );
    assert!(
        !plain.user_data.contains("parameter='/"),
        "no parameter to read: {}",
        plain.user_data
    );
    assert_eq!(
        plain.outputs["InstanceSecurityGroupId"],
        plain.security_group.as_str(),
        "the output names the instances' security group: {}",
        plain.outputs
    );

    let private = private.unwrap_or_else(|e| panic!("the stack was refused: {e}"));
    println!("private subnets: launch template {}", private.launch);
    assert_eq!(private.group_subnets, private.spare_subnets);
    assert_eq!(
        private.launch["NetworkInterfaces"],
        serde_json::json!([{
            "AssociatePublicIpAddress": false,
            "DeleteOnTermination": true,
            "DeviceIndex": 0,
            "Groups": [private.security_group],
        }])
    );
    assert!(
        private.launch.get("SecurityGroupIds").is_none(),
        "the security group goes on the network interface: {}",
        private.launch
    );
    assert_eq!(
        private.launch["MetadataOptions"]["HttpPutResponseHopLimit"],
        2
    );
    assert_eq!(private.health_check_port, "9090");
    assert!(private.balancer_reaches_health_port && private.peers_reach_health_port);
    assert!(private.user_data.contains("listen = \"0.0.0.0:9090\""));
}

/// The instances boot the stock Amazon Linux 2023 of their type's architecture (AWS's public
/// SSM parameter, as moto has it), the Architecture output names it, and the names `cargo xtask
/// dist` gives each architecture's .rpm and .tar.gz are accepted as the artifact. Graviton
/// families have a g after their generation; the x86 GPU families start with one; a1 and g5g
/// are the exceptions.
#[test]
fn the_cloudformation_template_boots_amazon_linux_2023_of_the_instance_types_architecture() {
    require_root();
    let moto = Moto::start();
    let rpm = |arch: &str| format!("health-agent-0.1.0-1.{arch}.rpm");
    let tar = |arch: &str| format!("health-agent-0.1.0-{arch}.tar.gz");
    let cases = [
        ("t3.small", "x86_64", rpm("x86_64")),
        ("m7i-flex.large", "x86_64", tar("x86_64")),
        ("g4dn.xlarge", "x86_64", rpm("x86_64")),
        ("g6e.xlarge", "x86_64", tar("x86_64")),
        ("t4g.small", "aarch64", rpm("aarch64")),
        ("m7g.large", "aarch64", tar("aarch64")),
        ("c6gn.large", "aarch64", rpm("aarch64")),
        ("r8gd.xlarge", "aarch64", tar("aarch64")),
        ("im4gn.large", "aarch64", rpm("aarch64")),
        ("a1.large", "aarch64", tar("aarch64")),
        ("g5g.xlarge", "aarch64", rpm("aarch64")),
    ];
    let sha256 = "4f".repeat(32);
    let urls: Vec<String> = cases.iter().map(|c| stack::artifact_url(&c.2)).collect();
    let names: Vec<String> = (0..cases.len()).map(|n| format!("arch-{n}")).collect();
    let params: Vec<[(&str, &str); 4]> = cases
        .iter()
        .zip(&urls)
        .map(|((instance_type, _, _), url)| {
            [
                ("AppWorkers", "10"),
                ("InstanceType", *instance_type),
                ("AgentArtifactUrl", url.as_str()),
                ("AgentArtifactSha256", sha256.as_str()),
            ]
        })
        .collect();
    let stacks: Vec<(&str, &[(&str, &str)])> = names
        .iter()
        .zip(&params)
        .map(|(n, p)| (n.as_str(), &p[..]))
        .collect();
    let deployed = stack::deploy_each(&moto, REGION, &stacks);
    for (((instance_type, arch, artifact), url), stack) in cases.iter().zip(&urls).zip(deployed) {
        let stack =
            stack.unwrap_or_else(|e| panic!("{instance_type} with {artifact}: refused: {e}"));
        let ami_arch = if *arch == "aarch64" {
            "arm64"
        } else {
            "x86_64"
        };
        println!(
            "{instance_type}: {} (Amazon Linux 2023 {ami_arch}: {}), Architecture {}",
            stack.launch["ImageId"], stack.al2023[ami_arch], stack.outputs["Architecture"]
        );
        assert_eq!(stack.launch["InstanceType"], *instance_type);
        assert_eq!(
            stack.launch["ImageId"], stack.al2023[ami_arch],
            "{instance_type}: not the {ami_arch} AMI"
        );
        assert_eq!(stack.outputs["Architecture"], *arch, "{instance_type}");
        assert!(
            stack.user_data.contains(&format!("artifact='{url}'")),
            "{}",
            stack.user_data
        );
    }
    assert_ne!(cases[0].1, cases[4].1);
}

/// The artifact's parameters are required, and refused unless they name what UserData can
/// install: an S3 URL of an .rpm or a .tar.gz whose key needs no quoting and is no wildcard,
/// and a SHA-256 as SHA256SUMS prints it. Each refusal names the parameter.
#[test]
fn the_cloudformation_template_refuses_an_artifact_it_cannot_install() {
    require_root();
    let moto = Moto::start();
    let good_url = stack::artifact_url("health-agent-0.1.0-1.x86_64.rpm");
    let sha256 = "4f".repeat(32);
    let bad: [(&str, &str); 10] = [
        ("AgentArtifactUrl", "absent"),
        ("AgentArtifactSha256", "absent"),
        (
            "AgentArtifactUrl",
            "s3://releases/health-agent_0.1.0_amd64.deb",
        ),
        (
            "AgentArtifactUrl",
            "https://releases.example.com/health-agent-0.1.0-1.x86_64.rpm",
        ),
        ("AgentArtifactUrl", "s3://releases/health-agent-0.1.0.zip"),
        ("AgentArtifactUrl", "s3://releases/*.rpm"),
        ("AgentArtifactUrl", "s3://releases/a'$(reboot)'.rpm"),
        ("AgentArtifactSha256", &"4F".repeat(32)),
        ("AgentArtifactSha256", &sha256[1..]),
        ("InstanceType", "t3small"),
    ];
    let names: Vec<String> = (0..bad.len()).map(|n| format!("bad-{n}")).collect();
    let params: Vec<Vec<(&str, &str)>> = bad
        .iter()
        .map(|(param, value)| {
            let mut params = vec![
                ("AppWorkers", "10"),
                ("AgentArtifactUrl", good_url.as_str()),
                ("AgentArtifactSha256", sha256.as_str()),
            ];
            params.retain(|(k, _)| k != param);
            params.push((param, value));
            params
        })
        .collect();
    let stacks: Vec<(&str, &[(&str, &str)])> = names
        .iter()
        .zip(&params)
        .map(|(n, p)| (n.as_str(), &p[..]))
        .collect();
    for ((param, value), answer) in bad.iter().zip(stack::deploy_each(&moto, REGION, &stacks)) {
        let refused = answer.err();
        println!("{param} = {value:?}: {refused:?}");
        assert!(
            refused.as_deref().is_some_and(|e| e.contains(param)),
            "{param} = {value:?} is not refused: {refused:?}"
        );
    }
}
