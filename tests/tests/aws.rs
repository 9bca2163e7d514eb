//! The fleet's peers from the auto-scaling group (`fleet.peers_from = "asg"`), against moto (a
//! real implementation of the Auto Scaling and EC2 APIs) with the instance's metadata from an
//! IMDSv2 stub; the shipped CloudFormation template's UserData run on the installed .deb under
//! real systemd (`the_cloudformation_user_data_*`); and its parameters, deployed in moto
//! (`the_cloudformation_template_*`).
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

/// The shipped template, deployed in moto: its group's InService members, the UserData of its
/// launch template as CloudFormation substituted it, the rest of that launch template, the
/// group's subnets, what the instances' security group lets in on the health port, every grant
/// of the instance role, and the stack's outputs.
struct Stack {
    group: String,
    members: Vec<(String, String)>,
    user_data: String,
    /// The launch template's data without its UserData.
    launch: Value,
    /// The VPC's subnets: the two given as `Subnets`, the two others (`"spare"` in a
    /// parameter's value names them).
    balancer_subnets: Vec<String>,
    spare_subnets: Vec<String>,
    group_subnets: Vec<String>,
    security_group: String,
    /// The target group's HealthCheckPort.
    health_check_port: String,
    balancer_reaches_health_port: bool,
    peers_reach_health_port: bool,
    role: String,
    /// (action, resource) for every statement of the role's policies.
    role_grants: Vec<(String, String)>,
    outputs: Value,
}

impl Stack {
    fn may(&self, action: &str) -> bool {
        self.role_grants.iter().any(|(a, _)| a == action)
    }
}

/// Deploys the template as stack `name` with `params` besides the VPC, its subnets and the
/// image; the error CloudFormation (moto) answered if it refused.
fn deploy_template(moto: &Moto, name: &str, params: &[(&str, &str)]) -> Result<Stack, String> {
    let template = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/aws/cloudformation.yaml");
    let script = r#"
import ast, base64, json, sys, boto3
endpoint, region, template, name, given = sys.argv[1:6]
given = json.loads(given)
kw = dict(endpoint_url=endpoint, region_name=region,
          aws_access_key_id="setup", aws_secret_access_key="setup")
ec2, cfn = boto3.client("ec2", **kw), boto3.client("cloudformation", **kw)
asg, iam = boto3.client("autoscaling", **kw), boto3.client("iam", **kw)
elb = boto3.client("elbv2", **kw)
vpc = ec2.create_vpc(CidrBlock="127.0.0.0/16")["Vpc"]["VpcId"]
subnets = [ec2.create_subnet(VpcId=vpc, CidrBlock=f"127.0.{n}.0/24",
                             AvailabilityZone=region + az)["Subnet"]["SubnetId"]
           for n, az in ((3, "a"), (4, "b"), (5, "a"), (6, "b"))]
balancer, spare = subnets[:2], subnets[2:]
params = {"VpcId": vpc, "Subnets": ",".join(balancer), "ImageId": "ami-12c6146b"}
params.update({k: ",".join(spare) if v == "spare" else v for k, v in given.items()})
try:
    cfn.create_stack(StackName=name, TemplateBody=open(template).read(),
                     Capabilities=["CAPABILITY_IAM"],
                     Parameters=[{"ParameterKey": k, "ParameterValue": v} for k, v in params.items()])
except Exception as e:
    print(json.dumps({"refused": str(e)}))
    sys.exit(0)
stack = cfn.describe_stacks(StackName=name)["Stacks"][0]
assert stack["StackStatus"] == "CREATE_COMPLETE", stack
outputs = {o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs", [])}
res = {r["LogicalResourceId"]: r["PhysicalResourceId"]
       for r in cfn.list_stack_resources(StackName=name)["StackResourceSummaries"]}
group = res["AutoScalingGroup"]
# Three instances rather than the template's two: two peers for the one the agent plays.
asg.set_desired_capacity(AutoScalingGroupName=group, DesiredCapacity=3)
described = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[group])["AutoScalingGroups"][0]
members = [i["InstanceId"] for i in described["Instances"] if i["LifecycleState"] == "InService"]
found = ec2.describe_instances(InstanceIds=members)["Reservations"]
ip = {i["InstanceId"]: i["PrivateIpAddress"] for r in found for i in r["Instances"]}
data = ec2.describe_launch_template_versions(LaunchTemplateId=res["LaunchTemplate"])
launch = data["LaunchTemplateVersions"][0]["LaunchTemplateData"]
user_data = base64.b64decode(launch.pop("UserData")).decode()
health_port = int(params.get("HealthPort", 8080))
sg, lb_sg = res["InstanceSecurityGroup"], res["LoadBalancerSecurityGroup"]
rules = ec2.describe_security_groups(GroupIds=[sg])["SecurityGroups"][0]["IpPermissions"]
def reaches(source):
    return any(r["IpProtocol"] == "tcp" and r["FromPort"] <= health_port <= r["ToPort"]
               and any(p["GroupId"] == source for p in r["UserIdGroupPairs"]) for r in rules)
target_group = elb.describe_target_groups(TargetGroupArns=[res["TargetGroup"]])["TargetGroups"][0]
role = res["InstanceRole"]
grants = []
for policy in iam.list_role_policies(RoleName=role)["PolicyNames"]:
    doc = iam.get_role_policy(RoleName=role, PolicyName=policy)["PolicyDocument"]
    if isinstance(doc, str):
        # moto hands back the document as CloudFormation's Python repr, not JSON.
        doc = ast.literal_eval(doc)
    for st in doc["Statement"]:
        listed = lambda v: v if isinstance(v, list) else [v]
        grants += [[a, r] for a in listed(st["Action"]) for r in listed(st["Resource"])]
print(json.dumps({"group": group, "members": [[m, ip[m]] for m in members],
                  "user_data": user_data, "launch": launch,
                  "balancer_subnets": balancer, "spare_subnets": spare,
                  "group_subnets": described["VPCZoneIdentifier"].split(","),
                  "security_group": sg, "health_check_port": target_group["HealthCheckPort"],
                  "balancer_reaches": reaches(lb_sg), "peers_reach": reaches(sg),
                  "role": role, "grants": grants, "outputs": outputs}))
"#;
    let params: serde_json::Map<String, Value> = params
        .iter()
        .map(|(k, v)| (k.to_string(), Value::from(*v)))
        .collect();
    let v = moto.boto3(
        script,
        &[
            REGION,
            template.to_str().expect("a UTF-8 path"),
            name,
            &Value::Object(params).to_string(),
        ],
    );
    if let Some(refused) = v["refused"].as_str() {
        return Err(refused.into());
    }
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    };
    Ok(Stack {
        group: v["group"].as_str().expect("group").into(),
        members: serde_json::from_value(v["members"].clone()).expect("members"),
        user_data: v["user_data"].as_str().expect("UserData").into(),
        launch: v["launch"].clone(),
        balancer_subnets: strings(&v["balancer_subnets"]),
        spare_subnets: strings(&v["spare_subnets"]),
        group_subnets: strings(&v["group_subnets"]),
        security_group: v["security_group"].as_str().expect("security group").into(),
        health_check_port: v["health_check_port"].as_str().expect("port").into(),
        balancer_reaches_health_port: v["balancer_reaches"] == true,
        peers_reach_health_port: v["peers_reach"] == true,
        role: v["role"].as_str().expect("role").into(),
        role_grants: serde_json::from_value(v["grants"].clone()).expect("grants"),
        outputs: v["outputs"].clone(),
    })
}

/// `/health` from the host (the container shares its network namespace).
fn health_at(port: u16) -> Option<(u16, Value)> {
    let (code, body) = get(port, "/health").ok()?;
    Some((code, serde_json::from_str(&body).ok()?))
}

/// What the template grants: the role may publish and list the group, the balancer reaches the
/// health port, and so do the group's members each other's.
fn assert_peers_may_list_and_reach_each_other(stack: &Stack) {
    assert!(
        stack.balancer_reaches_health_port,
        "the instances' security group lets the balancer reach the health port"
    );
    assert!(
        stack.peers_reach_health_port,
        "the instances' security group lets the group reach the health port"
    );
    for action in [
        "cloudwatch:PutMetricData",
        "autoscaling:DescribeAutoScalingGroups",
        "ec2:DescribeInstances",
    ] {
        assert!(
            stack.may(action),
            "the instance role may {action}: {:?}",
            stack.role_grants
        );
    }
    assert_eq!(stack.members.len(), 3, "{:?}", stack.members);
}

/// The instance as the AMI would have it before UserData runs: the application on `app`, and
/// what it has that this host lacks, AWS. The metadata service's address in the unit's
/// environment file; a drop-in after the template's naming moto as the endpoint, and keeping
/// the agent on loopback (the template's 0.0.0.0 would also answer the addresses moto gave
/// the group's other members, all of them this host's); and an AWS CLI that answers
/// `get-parameter` with `password` and keeps its arguments in /var/lib/aws-args.
fn prepare_instance(
    machine: &Machine,
    app: u16,
    listen: u16,
    imds: &Receiver,
    moto: &Moto,
    password: &str,
) {
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
    machine.write(
        "/usr/local/bin/aws",
        &format!(
            "#!/bin/sh\nprintf '%s\\n' \"$*\" > /var/lib/aws-args\ncat <<'END'\n{password}\nEND\n"
        ),
    );
    machine.run(&["chmod", "755", "/usr/local/bin/aws"]);
}

#[test]
fn the_cloudformation_user_data_configures_the_packaged_agent_under_systemd() {
    require_root();
    let started = Instant::now();
    let moto = Moto::start();
    let (app, listen) = (free_port(), free_port());
    let workers = 16;
    let parameter = "/web/db/password";
    // Every character systemd's environment file treats specially, and a space.
    let password = r#"pa$s"w`o\r'd #1  x"#;
    let stack = deploy_template(
        &moto,
        "web",
        &[
            ("AppPort", &app.to_string()),
            ("AppWorkers", &workers.to_string()),
            ("HealthPort", &listen.to_string()),
            ("DatabasePasswordParameter", parameter),
        ],
    )
    .unwrap_or_else(|e| panic!("the stack was refused: {e}"));
    assert_peers_may_list_and_reach_each_other(&stack);
    assert_eq!(stack.health_check_port, listen.to_string());
    let arn = format!("arn:aws:ssm:{REGION}:123456789012:parameter{parameter}");
    assert!(
        stack
            .role_grants
            .contains(&("ssm:GetParameter".into(), arn.clone())),
        "the instance role may read {arn}: {:?}",
        stack.role_grants
    );
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
    prepare_instance(&machine, app, listen, &imds, &moto, password);

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
    let drop_in: toml_edit::DocumentMut = machine
        .run(&["cat", "/etc/health-agent/conf.d/50-aws.toml"])
        .parse()
        .expect("the stack's drop-in is TOML");
    assert_eq!(
        drop_in["server"]["listen"].as_str(),
        Some(format!("0.0.0.0:{listen}").as_str()),
        "the agent listens on HealthPort"
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

    // The password: read from Parameter Store in this region, written beside the file's other
    // lines, mode 600, and in the agent's environment exactly as stored.
    assert_eq!(
        machine.run(&["cat", "/var/lib/aws-args"]),
        format!(
            "ssm get-parameter --region {REGION} --name {parameter} --with-decryption \
             --query Parameter.Value --output text"
        )
    );
    assert_eq!(
        machine.run(&["stat", "-c", "%a", "/etc/health-agent/environment"]),
        "600"
    );
    assert!(
        machine
            .run(&["cat", "/etc/health-agent/environment"])
            .starts_with("AWS_EC2_METADATA_SERVICE_ENDPOINT="),
        "the environment file keeps its other lines"
    );
    let pid = machine.unit_property("health-agent.service", "MainPID");
    let environ = machine.run(&["cat", &format!("/proc/{pid}/environ")]);
    assert!(
        environ
            .split('\0')
            .any(|v| v.strip_prefix("PGPASSWORD=") == Some(password)),
        "the agent's PGPASSWORD is not the stored password"
    );

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
    let capacity = &body["details"]["saturation"]["capacity"];
    assert!(
        capacity["workers"] == workers && capacity["basis"] == "configured",
        "saturation is measured against AppWorkers: {}",
        body["details"]["saturation"]
    );
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
    for s in [ROLE_SECRET, SESSION, password] {
        assert!(!log.contains(s), "the journal shows a credential:\n{log}");
    }
    println!(
        "moto: {}; {} in all",
        back["datapoints"],
        format_args!("{:.1} s", started.elapsed().as_secs_f64())
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

    let refused = deploy_template(&moto, "no-workers", &[]).err();
    println!("without AppWorkers: {refused:?}");
    assert!(
        refused.as_deref().is_some_and(|e| e.contains("AppWorkers")),
        "a stack without AppWorkers is refused: {refused:?}"
    );

    let plain = deploy_template(&moto, "plain", &[("AppWorkers", "10")])
        .unwrap_or_else(|e| panic!("the stack was refused: {e}"));
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

    let private = deploy_template(
        &moto,
        "private",
        &[
            ("AppWorkers", "10"),
            ("InstanceSubnets", "spare"),
            ("AssociatePublicIpAddress", "false"),
            ("HealthPort", "9090"),
            ("MetadataHopLimit", "2"),
        ],
    )
    .unwrap_or_else(|e| panic!("the stack was refused: {e}"));
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
