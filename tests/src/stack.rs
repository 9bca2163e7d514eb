//! The shipped CloudFormation template (`deploy/aws/cloudformation.yaml`) deployed in moto
//! ([`deploy`], [`Stack`]), and what its UserData needs on an instance that has no AWS: an AWS
//! CLI stand-in ([`aws_cli_stand_in`]) that serves `s3 cp` from a directory the test fills,
//! `ssm get-parameter` from the test's password and `secretsmanager get-secret-value` from the
//! fleet key moto holds. It stands in for S3, Parameter Store and Secrets Manager only because
//! nothing here reaches AWS; everything else in the UserData runs as written.

use std::path::Path;

use serde_json::Value;

use crate::{Machine, Moto};

/// The bucket the tests' artifacts are "in": the stand-in serves `s3://BUCKET/KEY` from
/// `S3_MOUNT/BUCKET/KEY`.
pub const BUCKET: &str = "health-agent-releases";
/// Where the instance finds the stand-in's objects (a read-only bind of the test's directory).
pub const S3_MOUNT: &str = "/mnt/s3";
/// Where the stand-in appends each call's arguments, one line per call.
pub const AWS_ARGS: &str = "/var/lib/aws-args";

/// `s3://BUCKET/releases/NAME`: the URL of an artifact named `name`.
pub fn artifact_url(name: &str) -> String {
    format!("s3://{BUCKET}/releases/{name}")
}

/// The shipped template, deployed in moto: its group's InService members, the UserData of its
/// launch template as CloudFormation substituted it, the rest of that launch template, the
/// group's subnets, what the instances' security group lets in on the health port, every grant
/// of the instance role, the stack's outputs, and the AMIs AWS's public SSM parameters name.
pub struct Stack {
    pub group: String,
    pub members: Vec<(String, String)>,
    pub user_data: String,
    /// The launch template's data without its UserData.
    pub launch: Value,
    /// The VPC's subnets: the two given as `Subnets`, the two others (`"spare"` in a
    /// parameter's value names them).
    pub balancer_subnets: Vec<String>,
    pub spare_subnets: Vec<String>,
    pub group_subnets: Vec<String>,
    pub security_group: String,
    /// The target group's HealthCheckPort.
    pub health_check_port: String,
    pub balancer_reaches_health_port: bool,
    pub peers_reach_health_port: bool,
    pub role: String,
    /// (action, resource) for every statement of the role's policies.
    pub role_grants: Vec<(String, String)>,
    pub outputs: Value,
    /// The fleet key's secret (the one the stack made, or `FleetKeySecretArn`) and its value
    /// in moto; None when moto holds no such secret.
    pub fleet_key: Option<FleetKey>,
    /// The latest Amazon Linux 2023 AMI (kernel-default) per architecture ("x86_64", "arm64"),
    /// as moto's copy of AWS's public SSM parameters has it.
    pub al2023: Value,
}

impl Stack {
    pub fn may(&self, action: &str) -> bool {
        self.role_grants.iter().any(|(a, _)| a == action)
    }
}

/// A Secrets Manager secret in moto: its ARN, and the value `get-secret-value` answers.
#[derive(Clone)]
pub struct FleetKey {
    pub secret: String,
    pub value: String,
}

/// Deploys the template as stack `name` in `region` with `params` besides the VPC and its
/// subnets; the error CloudFormation (moto) answered if it refused. A value `"spare"` is the
/// two subnets not given to the balancer; `"absent"` leaves the parameter out. Without
/// `AgentArtifactUrl` and `AgentArtifactSha256` the stack gets a placeholder artifact.
///
/// moto does not check a value against its parameter's `AllowedPattern`; the script does, as
/// CloudFormation would (the whole value must match), and refuses with CloudFormation's words.
pub fn deploy(
    moto: &Moto,
    region: &str,
    name: &str,
    params: &[(&str, &str)],
) -> Result<Stack, String> {
    deploy_each(moto, region, &[(name, params)])
        .pop()
        .expect("one stack")
}

/// [`deploy`] for each (name, params) of `stacks`, in one boto3 run.
pub fn deploy_each(
    moto: &Moto,
    region: &str,
    stacks: &[(&str, &[(&str, &str)])],
) -> Vec<Result<Stack, String>> {
    let template = crate::workspace().join("deploy/aws/cloudformation.yaml");
    let stacks: Vec<Value> = stacks
        .iter()
        .map(|(name, params)| {
            let params: serde_json::Map<String, Value> = params
                .iter()
                .map(|(k, v)| (k.to_string(), Value::from(*v)))
                .collect();
            serde_json::json!([name, params])
        })
        .collect();
    let v = moto.boto3(
        DEPLOY,
        &[
            region,
            template.to_str().expect("a UTF-8 path"),
            &Value::from(stacks).to_string(),
        ],
    );
    v.as_array()
        .expect("one answer per stack")
        .iter()
        .map(stack_of)
        .collect()
}

/// The boto3 script behind [`deploy_each`]: one JSON answer per stack, `{"refused": why}` or
/// what [`Stack`] holds.
const DEPLOY: &str = r#"
import ast, base64, json, re, sys, boto3, yaml
endpoint, region, template, stacks = sys.argv[1:5]
kw = dict(endpoint_url=endpoint, region_name=region,
          aws_access_key_id="setup", aws_secret_access_key="setup")
ec2, cfn = boto3.client("ec2", **kw), boto3.client("cloudformation", **kw)
asg, iam = boto3.client("autoscaling", **kw), boto3.client("iam", **kw)
elb, ssm = boto3.client("elbv2", **kw), boto3.client("ssm", **kw)
sm = boto3.client("secretsmanager", **kw)
body = open(template).read()
# CloudFormation's short forms (!Ref, !Sub...) as plain values: only the parameters are read.
def short_form(loader, tag, node):
    if isinstance(node, yaml.ScalarNode):
        return {tag: loader.construct_scalar(node)}
    if isinstance(node, yaml.SequenceNode):
        return {tag: loader.construct_sequence(node, deep=True)}
    return {tag: loader.construct_mapping(node, deep=True)}
yaml.add_multi_constructor("!", short_form, Loader=yaml.SafeLoader)
declared = yaml.safe_load(body)["Parameters"]
latest = "/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-"
al2023 = {arch: ssm.get_parameter(Name=latest + arch)["Parameter"]["Value"]
          for arch in ("x86_64", "arm64")}

def deploy(name, given):
    vpc = ec2.create_vpc(CidrBlock="127.0.0.0/16")["Vpc"]["VpcId"]
    subnets = [ec2.create_subnet(VpcId=vpc, CidrBlock=f"127.0.{n}.0/24",
                                 AvailabilityZone=region + az)["Subnet"]["SubnetId"]
               for n, az in ((3, "a"), (4, "b"), (5, "a"), (6, "b"))]
    balancer, spare = subnets[:2], subnets[2:]
    params = {"VpcId": vpc, "Subnets": ",".join(balancer),
              "AgentArtifactUrl": "s3://health-agent-releases/releases/placeholder.rpm",
              "AgentArtifactSha256": "0" * 64}
    params.update({k: ",".join(spare) if v == "spare" else v for k, v in given.items()})
    params = {k: v for k, v in params.items() if v != "absent"}
    for k, v in params.items():
        pattern = declared.get(k, {}).get("AllowedPattern")
        if pattern is not None and re.fullmatch(pattern, v) is None:
            return {"refused": f"Parameter '{k}' must match pattern {pattern}"}
    try:
        cfn.create_stack(StackName=name, TemplateBody=body, Capabilities=["CAPABILITY_IAM"],
                         Parameters=[{"ParameterKey": k, "ParameterValue": v}
                                     for k, v in params.items()])
    except Exception as e:
        return {"refused": str(e)}
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
    secret, fleet_key = params.get("FleetKeySecretArn") or res.get("FleetKey"), None
    try:
        if secret:
            fleet_key = [secret, sm.get_secret_value(SecretId=secret)["SecretString"]]
    except sm.exceptions.ResourceNotFoundException:
        pass  # a FleetKeySecretArn moto does not hold
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
    return {"group": group, "members": [[m, ip[m]] for m in members],
            "user_data": user_data, "launch": launch,
            "balancer_subnets": balancer, "spare_subnets": spare,
            "group_subnets": described["VPCZoneIdentifier"].split(","),
            "security_group": sg, "health_check_port": target_group["HealthCheckPort"],
            "balancer_reaches": reaches(lb_sg), "peers_reach": reaches(sg),
            "role": role, "grants": grants, "outputs": outputs, "fleet_key": fleet_key,
            "al2023": al2023}

print(json.dumps([deploy(name, given) for name, given in json.loads(stacks)]))
"#;

/// One answer of [`DEPLOY`].
fn stack_of(v: &Value) -> Result<Stack, String> {
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
        fleet_key: v["fleet_key"].as_array().map(|k| FleetKey {
            secret: k[0].as_str().expect("the secret's ARN").into(),
            value: k[1].as_str().expect("the secret's value").into(),
        }),
        al2023: v["al2023"].clone(),
    })
}

/// An AWS CLI for an instance that reaches no AWS, at `/usr/local/bin/aws`: `s3 cp [OPTIONS]
/// s3://BUCKET/KEY FILE` copies [`S3_MOUNT`]`/BUCKET/KEY` (failing as the CLI does when it is
/// not there), `ssm get-parameter` prints `password`, `secretsmanager get-secret-value
/// --secret-id ARN` prints the value of that secret of `secrets` (failing as the CLI does for
/// any other); each call's arguments are appended to [`AWS_ARGS`].
pub fn aws_cli_stand_in(password: &str, secrets: &[&FleetKey]) -> String {
    let served: String = secrets
        .iter()
        .map(|k| {
            format!(
                "  '{}')\n    cat <<'END'\n{}\nEND\n    ;;\n",
                k.secret, k.value
            )
        })
        .collect();
    format!(
        r#"#!/bin/sh
printf '%s\n' "$*" >> {AWS_ARGS}
case "$1 $2" in
"s3 cp")
  shift 2
  while [ "${{1#--}}" != "$1" ]; do
    case "$1" in --region) shift 2 ;; *) shift ;; esac
  done
  if ! cp "{S3_MOUNT}/${{1#s3://}}" "$2" 2>/dev/null; then
    echo "fatal error: An error occurred (404) when calling the HeadObject operation: Key \"${{1#s3://*/}}\" does not exist" >&2
    exit 1
  fi
  ;;
"ssm get-parameter")
  cat <<'END'
{password}
END
  ;;
"secretsmanager get-secret-value")
  id=
  while [ $# -gt 0 ]; do
    if [ "$1" = --secret-id ]; then id=$2; fi
    shift
  done
  case "$id" in
{served}  *)
    echo "An error occurred (ResourceNotFoundException) when calling the GetSecretValue operation: Secrets Manager can't find the specified secret." >&2
    exit 254
    ;;
  esac
  ;;
*)
  echo "aws stand-in: $* is not served here" >&2
  exit 2
  ;;
esac
"#
    )
}

/// Boots `rootfs` as an instance of the stack: `objects` (a directory of the bucket's keys)
/// under [`S3_MOUNT`]`/`[`BUCKET`], the fixture backend, and the AWS CLI stand-in answering
/// `password` and `secrets`. Nothing of the agent is installed: the UserData does that.
pub fn boot_instance(
    rootfs: &Path,
    objects: &Path,
    password: &str,
    secrets: &[&FleetKey],
) -> Machine {
    let fixture = crate::binary("fixture-backend", "health-agent-tests");
    let bucket = format!("{S3_MOUNT}/{BUCKET}");
    let machine = Machine::boot(
        rootfs,
        &[
            (objects, bucket.as_str()),
            (&fixture, "/usr/local/bin/fixture-backend"),
        ],
    );
    machine.write("/usr/local/bin/aws", &aws_cli_stand_in(password, secrets));
    machine.run(&["chmod", "755", "/usr/local/bin/aws"]);
    machine
}

/// The UserData as cloud-init runs it, as root, once: its exit code and what it printed (stdout
/// and stderr, as /var/log/cloud-init-output.log has them).
pub fn run_user_data(machine: &Machine, user_data: &str) -> (i32, String) {
    machine.write("/var/lib/user-data", user_data);
    machine.run(&["chmod", "755", "/var/lib/user-data"]);
    let out = machine.exec(&["/var/lib/user-data"]);
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}
