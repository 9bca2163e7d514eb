//! The fleet's peers from the auto-scaling group (`fleet.peers_from = "asg"`), against moto (a
//! real implementation of the Auto Scaling and EC2 APIs) with the instance's metadata from an
//! IMDSv2 stub; and the shipped CloudFormation template's UserData run on the installed .deb
//! under real systemd (`the_cloudformation_user_data_*`).
//!
//! moto's instances live in a subnet of 127.0.0.0/16, so the private addresses the agent finds
//! and asks are loopback ones: nothing leaves this host.

use std::{
    path::Path,
    time::{Duration, Instant},
};

use health_agent_tests::{
    free_port, get,
    moto::{imds_stub, instance_env, Metadata, Role},
    require_root, wait_until, Agent, Machine, Moto, Receiver,
};
use serde_json::Value;

const REGION: &str = "eu-west-1";
const ROLE_SECRET: &str = "role-secret-never-shown";
const SESSION: &str = "SESSION-TOKEN-never-shown";

fn role() -> Role {
    Role {
        name: "web-role".into(),
        access_key_id: "ASIAROLEKEY",
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

/// The shipped template, deployed in moto: its group's InService members, the UserData of its
/// launch template as CloudFormation substituted it, whether the instances' security group lets
/// them reach each other's 8080, and every action the instance role may take.
struct Stack {
    group: String,
    members: Vec<(String, String)>,
    user_data: String,
    peers_reach_8080: bool,
    role: String,
    role_actions: Vec<String>,
}

fn deploy_template(moto: &Moto, app_port: u16, app_workers: u32) -> Stack {
    let template = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/aws/cloudformation.yaml");
    let script = r#"
import ast, base64, json, sys, boto3
endpoint, region, template, port, workers = sys.argv[1:6]
kw = dict(endpoint_url=endpoint, region_name=region,
          aws_access_key_id="setup", aws_secret_access_key="setup")
ec2, cfn = boto3.client("ec2", **kw), boto3.client("cloudformation", **kw)
asg, iam = boto3.client("autoscaling", **kw), boto3.client("iam", **kw)
vpc = ec2.create_vpc(CidrBlock="127.0.0.0/16")["Vpc"]["VpcId"]
subnets = [ec2.create_subnet(VpcId=vpc, CidrBlock=f"127.0.{n}.0/24",
                             AvailabilityZone=region + az)["Subnet"]["SubnetId"]
           for n, az in ((3, "a"), (4, "b"))]
params = {"VpcId": vpc, "Subnets": ",".join(subnets), "ImageId": "ami-12c6146b",
          "AppPort": port, "AppWorkers": workers}
cfn.create_stack(StackName="web", TemplateBody=open(template).read(),
                 Capabilities=["CAPABILITY_IAM"],
                 Parameters=[{"ParameterKey": k, "ParameterValue": v} for k, v in params.items()])
stack = cfn.describe_stacks(StackName="web")["Stacks"][0]
assert stack["StackStatus"] == "CREATE_COMPLETE", stack
res = {r["LogicalResourceId"]: r["PhysicalResourceId"]
       for r in cfn.list_stack_resources(StackName="web")["StackResourceSummaries"]}
group = res["AutoScalingGroup"]
# Three instances rather than the template's two: two peers for the one the agent plays.
asg.set_desired_capacity(AutoScalingGroupName=group, DesiredCapacity=3)
members = [i["InstanceId"] for i in
           asg.describe_auto_scaling_groups(AutoScalingGroupNames=[group])["AutoScalingGroups"][0]["Instances"]
           if i["LifecycleState"] == "InService"]
found = ec2.describe_instances(InstanceIds=members)["Reservations"]
ip = {i["InstanceId"]: i["PrivateIpAddress"] for r in found for i in r["Instances"]}
data = ec2.describe_launch_template_versions(LaunchTemplateId=res["LaunchTemplate"])
user_data = base64.b64decode(data["LaunchTemplateVersions"][0]["LaunchTemplateData"]["UserData"]).decode()
sg = res["InstanceSecurityGroup"]
rules = ec2.describe_security_groups(GroupIds=[sg])["SecurityGroups"][0]["IpPermissions"]
reach = any(r["IpProtocol"] == "tcp" and r["FromPort"] <= 8080 <= r["ToPort"]
            and any(p["GroupId"] == sg for p in r["UserIdGroupPairs"]) for r in rules)
role = res["InstanceRole"]
actions = []
for name in iam.list_role_policies(RoleName=role)["PolicyNames"]:
    doc = iam.get_role_policy(RoleName=role, PolicyName=name)["PolicyDocument"]
    if isinstance(doc, str):
        # moto hands back the document as CloudFormation's Python repr, not JSON.
        doc = ast.literal_eval(doc)
    for st in doc["Statement"]:
        a = st["Action"]
        actions += a if isinstance(a, list) else [a]
print(json.dumps({"group": group, "members": [[m, ip[m]] for m in members],
                  "user_data": user_data, "reach": reach, "role": role, "actions": actions}))
"#;
    let v = moto.boto3(
        script,
        &[
            REGION,
            template.to_str().expect("a UTF-8 path"),
            &app_port.to_string(),
            &app_workers.to_string(),
        ],
    );
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    };
    Stack {
        group: v["group"].as_str().expect("group").into(),
        members: serde_json::from_value(v["members"].clone()).expect("members"),
        user_data: v["user_data"].as_str().expect("UserData").into(),
        peers_reach_8080: v["reach"] == true,
        role: v["role"].as_str().expect("role").into(),
        role_actions: strings(&v["actions"]),
    }
}

/// `/health` from the host (the container shares its network namespace).
fn health_at(port: u16) -> Option<(u16, Value)> {
    let (code, body) = get(port, "/health").ok()?;
    Some((code, serde_json::from_str(&body).ok()?))
}

/// What the template grants: the role may publish and list the group, and the instances'
/// security group lets the group's members reach each other's 8080.
fn assert_peers_may_list_and_reach_each_other(stack: &Stack) {
    assert!(
        stack.peers_reach_8080,
        "the instances' security group lets the group reach 8080"
    );
    for action in [
        "cloudwatch:PutMetricData",
        "autoscaling:DescribeAutoScalingGroups",
        "ec2:DescribeInstances",
    ] {
        assert!(
            stack.role_actions.iter().any(|a| a == action),
            "the instance role may {action}: {:?}",
            stack.role_actions
        );
    }
    assert_eq!(stack.members.len(), 3, "{:?}", stack.members);
}

/// The instance as the AMI would have it before UserData runs: the application on `app`, and
/// what it has that this host lacks, AWS. The metadata service's address in the unit's
/// environment file, and a drop-in after the template's naming moto as the endpoint (and a
/// free port for the agent: the container shares this host's network).
fn prepare_instance(machine: &Machine, app: u16, listen: u16, imds: &Receiver, moto: &Moto) {
    machine.start_fixture("app", app, free_port(), &[]);
    machine.write(
        "/etc/health-agent/environment",
        &format!("AWS_EC2_METADATA_SERVICE_ENDPOINT={}\n", imds.url("")),
    );
    machine.run(&["mkdir", "-p", "/etc/health-agent/conf.d"]);
    machine.write(
        "/etc/health-agent/conf.d/90-test-aws-endpoints.toml",
        &format!(
            "[server]\nlisten = \"127.0.0.1:{listen}\"\n\
             [scaling.cloudwatch]\nendpoint = \"{moto}\"\ninterval = \"10s\"\nhigh_resolution = true\n\
             [fleet]\naws_endpoint = \"{moto}\"\n",
            moto = moto.endpoint()
        ),
    );
}

#[test]
fn the_cloudformation_user_data_configures_the_packaged_agent_under_systemd() {
    require_root();
    let started = Instant::now();
    let moto = Moto::start();
    let (app, listen) = (free_port(), free_port());
    let workers = 16;
    let stack = deploy_template(&moto, app, workers);
    assert_peers_may_list_and_reach_each_other(&stack);
    // The agent plays the group's first instance: its metadata as EC2 would serve it (the
    // template turns instance metadata tags on).
    let (own_id, _) = stack.members[0].clone();
    let imds = imds_stub(Metadata {
        token: "TOKEN-stack",
        instance_id: own_id.clone(),
        region: REGION.into(),
        group_tag: Some(stack.group.clone()),
        role: Some(Role {
            name: stack.role.clone(),
            ..role()
        }),
        // The template sets a lifecycle hook: the instance is in service, as AWS says then.
        lifecycle_state: Some(std::sync::Arc::new(std::sync::Mutex::new(
            "InService".into(),
        ))),
    });

    let machine = Machine::with_package();
    let packaged = machine.run(&["cat", "/etc/health-agent/health-agent.toml"]);
    prepare_instance(&machine, app, listen, &imds, &moto);

    // The UserData, as cloud-init runs it: as root, once.
    machine.write("/var/lib/user-data", &stack.user_data);
    machine.run(&["sh", "-e", "/var/lib/user-data"]);
    assert_eq!(
        machine.unit_property("health-agent.service", "ActiveState"),
        "active",
        "{}",
        journal(&machine)
    );
    assert_eq!(
        machine.run(&["cat", "/etc/health-agent/health-agent.toml"]),
        packaged,
        "the UserData leaves the packaged config as dpkg installed it"
    );
    let effective = machine.run(&["health-agent", "config", "--effective"]);
    let doc: toml_edit::DocumentMut = effective.parse().expect("config --effective is TOML");
    println!(
        "stack: group {} of {:?}; config --effective: web.port {}, web.workers {}, \
         scaling.cloudwatch.enabled {}, fleet.peers_from {}",
        stack.group,
        stack.members,
        doc["web"]["port"],
        doc["web"]["workers"],
        doc["scaling"]["cloudwatch"]["enabled"],
        doc["fleet"]["peers_from"]
    );
    assert_eq!(doc["web"]["port"].as_integer(), Some(i64::from(app)));
    assert_eq!(doc["web"]["workers"].as_integer(), Some(i64::from(workers)));
    assert_eq!(
        doc["scaling"]["cloudwatch"]["enabled"].as_bool(),
        Some(true)
    );
    assert_eq!(doc["fleet"]["peers_from"].as_str(), Some("asg"));

    // Some traffic for the agent to see.
    for _ in 0..5 {
        let _ = get(app, "/");
    }
    let mut want: Vec<String> = stack.members[1..]
        .iter()
        .map(|(_, ip)| format!("{ip}:{listen}"))
        .collect();
    want.sort();
    let body = wait_until(
        Duration::from_secs(60),
        "a published interval and the group's peers",
        || {
            let (_, b) = health_at(listen)?;
            let published = b["details"]["scaling"]["cloudwatch"]["published_data"].as_u64();
            (published >= Some(1) && asked(&b["details"]["fleet"]) == want).then_some(b)
        },
    );
    let cw = &body["details"]["scaling"]["cloudwatch"];
    println!(
        "agent: /health {} {}; cloudwatch {}; fleet {}",
        body["status"], body["checks"]["webserver"], cw, body["details"]["fleet"]
    );
    assert_eq!(cw["auto_scaling_group"], stack.group.as_str());
    assert_eq!(cw["credentials"], "instance role (IMDSv2)");
    let back = moto.read_back(REGION, "HealthAgent");
    assert_eq!(
        back["metrics"][0]["MetricName"], "Saturation",
        "moto received the metric: {back}"
    );
    assert_eq!(
        back["metrics"][0]["Dimensions"][0]["Value"],
        stack.group.as_str(),
        "{back}"
    );
    let log = journal(&machine);
    for s in [ROLE_SECRET, SESSION] {
        assert!(!log.contains(s), "the journal shows a credential:\n{log}");
    }
    println!(
        "moto: {}; {} in all",
        back["datapoints"],
        format_args!("{:.1} s", started.elapsed().as_secs_f64())
    );
}

fn journal(machine: &Machine) -> String {
    machine.run(&[
        "journalctl",
        "-u",
        "health-agent.service",
        "--no-pager",
        "-o",
        "cat",
    ])
}
