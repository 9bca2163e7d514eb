//! moto in server mode: a real implementation of the CloudWatch, Auto Scaling and EC2 APIs on a
//! free loopback port, and boto3 (from the same venv) as a separate client that sets up groups and
//! reads back what arrived; and an IMDSv2 stub, the metadata service of the instance the agent
//! plays.

use std::{
    net::TcpStream,
    path::PathBuf,
    process::{Command, Stdio},
    sync::{Arc, Mutex},
    time::Duration,
};

use serde_json::Value;

use crate::{free_port, stdout_of, succeed, wait_until, Proc, Receiver, Recorded};

/// moto_server from `cargo xtask setup`'s venv (the deploy validators'), else from PATH; the
/// python3 beside it has boto3 (a dependency of moto).
fn moto_server() -> PathBuf {
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
    let venv = PathBuf::from(home).join(".local/share/health-agent/deploy-tools/bin/moto_server");
    if venv.is_file() {
        return venv;
    }
    std::env::var_os("PATH")
        .and_then(|path| {
            std::env::split_paths(&path)
                .map(|d| d.join("moto_server"))
                .find(|p| p.is_file())
        })
        .unwrap_or_else(|| {
            panic!("moto_server is not installed: run `cargo xtask setup` (it installs moto[server] from PyPI)")
        })
}

/// The venv's python3, which has boto3 and botocore.
pub fn python() -> PathBuf {
    moto_server().with_file_name("python3")
}

/// moto_server's `main`, with the one Auto Scaling action moto 5 lacks (it raises
/// NotImplementedError): `CompleteLifecycleAction`, refused as AWS does when the group has no
/// such hook or the instance is not the group's, and recorded with the time it arrived (one
/// JSON line each) in `$HA_TEST_MOTO_LIFECYCLE_LOG`.
const MOTO_MAIN: &str = r#"
import json, os, sys, time, uuid
from moto.autoscaling.responses import AutoScalingResponse
from moto.autoscaling.exceptions import ValidationError

def complete_lifecycle_action(self):
    group = self._get_param("AutoScalingGroupName")
    hook = self._get_param("LifecycleHookName")
    instance = self._get_param("InstanceId")
    result = self._get_param("LifecycleActionResult")
    groups = self.autoscaling_backend.describe_auto_scaling_groups([group])
    members = [s.instance.id for g in groups for s in g.instance_states]
    if not self.autoscaling_backend.describe_lifecycle_hooks(group, [hook]) or instance not in members:
        raise ValidationError(f"No active Lifecycle Action found with instance ID {instance}")
    if result not in ("CONTINUE", "ABANDON"):
        raise ValidationError(f"LifecycleActionResult {result!r} is not CONTINUE or ABANDON")
    with open(os.environ["HA_TEST_MOTO_LIFECYCLE_LOG"], "a") as f:
        f.write(json.dumps({"at": time.time(), "group": group, "hook": hook,
                            "instance": instance, "result": result}) + "\n")
    return ('<CompleteLifecycleActionResponse xmlns="http://autoscaling.amazonaws.com/doc/2011-01-01/">'
            '<CompleteLifecycleActionResult/><ResponseMetadata><RequestId>' + str(uuid.uuid4())
            + '</RequestId></ResponseMetadata></CompleteLifecycleActionResponse>')

AutoScalingResponse.complete_lifecycle_action = complete_lifecycle_action

# STS AssumeRoleWithWebIdentity is unsigned in AWS (the token is the proof): exempt from the
# signature check once auth is on, and its token checked against $HA_TEST_MOTO_WEB_IDENTITY_TOKEN
# (moto checks none); each call recorded in $HA_TEST_MOTO_WEB_IDENTITY_LOG.
from moto.sts.responses import TokenResponse
from moto.sts.exceptions import STSClientError

_authenticate = TokenResponse._authenticate_and_authorize_normal_action
def authenticate(self, *args, **kwargs):
    if self._get_action() == "AssumeRoleWithWebIdentity":
        return
    return _authenticate(self, *args, **kwargs)
TokenResponse._authenticate_and_authorize_normal_action = authenticate

_web_identity = TokenResponse.assume_role_with_web_identity
def assume_role_with_web_identity(self):
    token = self._get_param("WebIdentityToken")
    with open(os.environ["HA_TEST_MOTO_WEB_IDENTITY_LOG"], "a") as f:
        f.write(json.dumps({"at": time.time(), "role": self._get_param("RoleArn"),
                            "session": self._get_param("RoleSessionName"),
                            "token": token}) + "\n")
    if token != os.environ.get("HA_TEST_MOTO_WEB_IDENTITY_TOKEN", token):
        raise STSClientError("InvalidIdentityToken", "Couldn't verify the web identity token")
    return _web_identity(self)
TokenResponse.assume_role_with_web_identity = assume_role_with_web_identity

from moto.server import main
main(sys.argv[1:])
"#;

/// moto's CloudFormation lacks `AWS::SecretsManager::Secret`; this teaches it, run before
/// [`MOTO_MAIN`] in the server's process.
const STACK_SECRET: &str = include_str!("moto_stack_secret.py");

/// A moto server (all services; the tests use CloudWatch and Auto Scaling). Stopped on drop.
pub struct Moto {
    pub port: u16,
    python: PathBuf,
    _child: Proc,
    pub log: PathBuf,
    /// The `CompleteLifecycleAction` calls it took, one JSON line each.
    lifecycle_log: PathBuf,
    /// The `AssumeRoleWithWebIdentity` calls it took, one JSON line each.
    web_identity_log: PathBuf,
    /// The keys boto3 reads back with: any until [`Moto::enforce_auth`], then an admin's.
    keys: Mutex<(String, String)>,
    _dir: tempfile::TempDir,
}

/// The token moto's STS takes in `AssumeRoleWithWebIdentity`: any other is refused
/// (`InvalidIdentityToken`).
pub const WEB_IDENTITY_TOKEN: &str = "eyJhbGciOiJSUzI1NiJ9.web-identity-token-never-shown.sig";

/// What [`Moto::iam`] made: an admin, a user and a role allowed what the agent calls, and
/// temporary keys of that role as ECS, EKS or EC2 would hand them out.
#[derive(Debug, Clone)]
pub struct Iam {
    pub admin: Keys,
    /// A user allowed the agent's calls and `sts:AssumeRole` on the role.
    pub user: Keys,
    pub role_arn: String,
    /// `AssumeRole` of the role, one set per request.
    pub role_keys: Vec<Keys>,
}

#[derive(Debug, Clone)]
pub struct Keys {
    pub id: String,
    pub secret: String,
    pub token: Option<String>,
    /// RFC 3339, for temporary keys.
    pub expiration: Option<String>,
}

impl Moto {
    pub fn start() -> Self {
        let server = moto_server();
        // boto3 beside moto_server: the same venv.
        let python = server.with_file_name("python3");
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("moto.log");
        let port = free_port();
        let lifecycle_log = dir.path().join("lifecycle.jsonl");
        let web_identity_log = dir.path().join("web-identity.jsonl");
        let child = Command::new(&python)
            .args(["-c", &format!("{STACK_SECRET}\n{MOTO_MAIN}")])
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .env("HA_TEST_MOTO_LIFECYCLE_LOG", &lifecycle_log)
            .env("HA_TEST_MOTO_WEB_IDENTITY_LOG", &web_identity_log)
            .env("HA_TEST_MOTO_WEB_IDENTITY_TOKEN", WEB_IDENTITY_TOKEN)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&log).expect("moto log"))
            .stderr(Stdio::from(
                std::fs::File::options()
                    .append(true)
                    .open(&log)
                    .expect("moto log"),
            ))
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", server.display()));
        let moto = Self {
            port,
            python,
            _child: Proc(child),
            log,
            lifecycle_log,
            web_identity_log,
            keys: Mutex::new(("reader".into(), "reader".into())),
            _dir: dir,
        };
        wait_until(Duration::from_secs(30), "moto to listen", || {
            TcpStream::connect(("127.0.0.1", port)).ok()
        });
        moto
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Runs a boto3 `script` (its `sys.argv[1]` is moto's endpoint, then `args`) and reads
    /// the JSON it prints.
    pub fn boto3(&self, script: &str, args: &[&str]) -> Value {
        let (id, secret) = self.keys.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let out = succeed(
            Command::new(&self.python)
                .args(["-c", script, &self.endpoint()])
                .args(args)
                .env("AWS_EC2_METADATA_DISABLED", "true")
                .env("AWS_ACCESS_KEY_ID", id)
                .env("AWS_SECRET_ACCESS_KEY", secret)
                .env_remove("AWS_SESSION_TOKEN")
                .env_remove("AWS_PROFILE"),
        );
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "boto3 printed no JSON ({e}): {}",
                String::from_utf8_lossy(&out.stdout)
            )
        })
    }

    /// An auto-scaling group of `size` instances in a VPC of 127.0.0.0/16, subnet
    /// `127.0.<net>.0/24`: moto gives each instance a private address there, so asking one
    /// stays on this host's loopback.
    pub fn auto_scaling_group(&self, region: &str, name: &str, net: u8, size: u32) -> Group {
        let script = r#"
import json, sys, boto3
endpoint, region, name, net, size = sys.argv[1:6]
kw = dict(endpoint_url=endpoint, region_name=region,
          aws_access_key_id="setup", aws_secret_access_key="setup")
ec2, asg = boto3.client("ec2", **kw), boto3.client("autoscaling", **kw)
vpc = ec2.create_vpc(CidrBlock="127.0.0.0/16")["Vpc"]["VpcId"]
subnet = ec2.create_subnet(VpcId=vpc, CidrBlock=f"127.0.{net}.0/24",
                           AvailabilityZone=region + "a")["Subnet"]["SubnetId"]
ec2.create_launch_template(LaunchTemplateName=name + "-template", LaunchTemplateData={
    "ImageId": "ami-12c6146b", "InstanceType": "t3.small"})
asg.create_auto_scaling_group(AutoScalingGroupName=name,
    LaunchTemplate={"LaunchTemplateName": name + "-template"}, MinSize=0, MaxSize=20,
    DesiredCapacity=int(size), VPCZoneIdentifier=subnet)
ids = [i["InstanceId"] for i in
       asg.describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"][0]["Instances"]]
found = ec2.describe_instances(InstanceIds=ids)["Reservations"]
ip = {i["InstanceId"]: i["PrivateIpAddress"] for r in found for i in r["Instances"]}
print(json.dumps([[i, ip[i]] for i in ids]))
"#;
        let members = self.boto3(script, &[region, name, &net.to_string(), &size.to_string()]);
        let members: Vec<(String, String)> =
            serde_json::from_value(members).expect("[[id, address], ...]");
        assert_eq!(members.len(), size as usize, "moto made {members:?}");
        Group {
            name: name.into(),
            region: region.into(),
            members,
        }
    }

    /// Moves `instance` to Standby (out of service, still in the group), as an operator does
    /// before working on it.
    pub fn enter_standby(&self, group: &Group, instance: &str) {
        let script = r#"
import json, sys, boto3
endpoint, region, name, instance = sys.argv[1:5]
asg = boto3.client("autoscaling", endpoint_url=endpoint, region_name=region,
                   aws_access_key_id="setup", aws_secret_access_key="setup")
asg.enter_standby(AutoScalingGroupName=name, InstanceIds=[instance],
                  ShouldDecrementDesiredCapacity=True)
g = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"][0]
print(json.dumps({i["InstanceId"]: i["LifecycleState"] for i in g["Instances"]}))
"#;
        let states = self.boto3(script, &[&group.region, &group.name, instance]);
        assert_eq!(states[instance], "Standby", "{states}");
    }

    /// Gives `group` a termination lifecycle hook named `hook`.
    pub fn termination_hook(&self, group: &Group, hook: &str) {
        let script = r#"
import json, sys, boto3
endpoint, region, name, hook = sys.argv[1:5]
asg = boto3.client("autoscaling", endpoint_url=endpoint, region_name=region,
                   aws_access_key_id="setup", aws_secret_access_key="setup")
asg.put_lifecycle_hook(AutoScalingGroupName=name, LifecycleHookName=hook,
                       LifecycleTransition="autoscaling:EC2_INSTANCE_TERMINATING",
                       HeartbeatTimeout=300, DefaultResult="ABANDON")
print(json.dumps(asg.describe_lifecycle_hooks(AutoScalingGroupName=name)["LifecycleHooks"]))
"#;
        let hooks = self.boto3(script, &[&group.region, &group.name, hook]);
        assert_eq!(hooks[0]["LifecycleHookName"], hook, "{hooks}");
    }

    /// The `CompleteLifecycleAction` calls moto took, in order: `{at (Unix seconds), group,
    /// hook, instance, result}`.
    pub fn lifecycle_actions(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.lifecycle_log)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("a JSON line"))
            .collect()
    }

    /// Everything moto holds under `namespace` in `region`, read with boto3:
    /// `{"metrics": ListMetrics, "datapoints": GetMetricStatistics of each metric}`.
    pub fn read_back(&self, region: &str, namespace: &str) -> Value {
        let script = r#"
import json, sys, datetime, boto3
endpoint, region, namespace = sys.argv[1:4]
cw = boto3.client("cloudwatch", endpoint_url=endpoint, region_name=region)
now = datetime.datetime.now(datetime.timezone.utc)
out = {"metrics": [], "datapoints": []}
for m in cw.list_metrics(Namespace=namespace)["Metrics"]:
    out["metrics"].append(m)
    for unit in ("Percent", "None"):
        r = cw.get_metric_statistics(
            Namespace=namespace, MetricName=m["MetricName"], Dimensions=m["Dimensions"],
            StartTime=now - datetime.timedelta(hours=1), EndTime=now + datetime.timedelta(hours=1),
            Period=3600, Statistics=["SampleCount", "Sum", "Average", "Minimum", "Maximum"],
            Unit=unit)
        for d in r["Datapoints"]:
            d.pop("Timestamp", None)
            d["MetricName"] = m["MetricName"]
            d["QueriedUnit"] = unit
            out["datapoints"].append(d)
print(json.dumps(out))
"#;
        self.boto3(script, &[region, namespace])
    }

    /// Makes the IAM side of [`Iam`], with `role_keys` temporary keys of the role. Before
    /// [`Moto::enforce_auth`]: nothing is checked yet.
    pub fn iam(&self, role_keys: usize) -> Iam {
        let script = r#"
import json, sys, boto3
endpoint, n = sys.argv[1], int(sys.argv[2])
kw = dict(endpoint_url=endpoint, region_name="us-east-1",
          aws_access_key_id="setup", aws_secret_access_key="setup")
iam, sts = boto3.client("iam", **kw), boto3.client("sts", **kw)
def doc(actions):
    return json.dumps({"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": actions, "Resource": "*"}]})
# moto names CloudWatch's actions by the signing name, monitoring:; AWS by cloudwatch:.
agent = ["cloudwatch:PutMetricData", "monitoring:PutMetricData",
         "autoscaling:DescribeAutoScalingGroups", "autoscaling:DescribeAutoScalingInstances",
         "autoscaling:CompleteLifecycleAction", "ec2:DescribeInstances"]
iam.create_user(UserName="admin")
iam.put_user_policy(UserName="admin", PolicyName="all", PolicyDocument=doc("*"))
admin = iam.create_access_key(UserName="admin")["AccessKey"]
role = iam.create_role(RoleName="health-agent", AssumeRolePolicyDocument=json.dumps({
    "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Principal": {"AWS": "*"},
    "Action": ["sts:AssumeRole", "sts:AssumeRoleWithWebIdentity"]}]}))["Role"]["Arn"]
iam.put_role_policy(RoleName="health-agent", PolicyName="agent", PolicyDocument=doc(agent))
iam.create_user(UserName="agent")
iam.put_user_policy(UserName="agent", PolicyName="agent",
                    PolicyDocument=doc(agent + ["sts:AssumeRole"]))
user = iam.create_access_key(UserName="agent")["AccessKey"]
keys = lambda k: {"id": k["AccessKeyId"], "secret": k["SecretAccessKey"],
                  "token": k.get("SessionToken"),
                  "expiration": k["Expiration"].strftime("%Y-%m-%dT%H:%M:%SZ") if "Expiration" in k else None}
temp = [keys(sts.assume_role(RoleArn=role, RoleSessionName=f"stand-in-{i}")["Credentials"])
        for i in range(n)]
print(json.dumps({"admin": keys(admin), "user": keys(user), "role_arn": role, "role_keys": temp}))
"#;
        let v = self.boto3(script, &[&role_keys.to_string()]);
        let keys = |k: &Value| Keys {
            id: k["id"].as_str().expect("id").into(),
            secret: k["secret"].as_str().expect("secret").into(),
            token: k["token"].as_str().map(String::from),
            expiration: k["expiration"].as_str().map(String::from),
        };
        Iam {
            admin: keys(&v["admin"]),
            user: keys(&v["user"]),
            role_arn: v["role_arn"].as_str().expect("role_arn").into(),
            role_keys: v["role_keys"]
                .as_array()
                .expect("role_keys")
                .iter()
                .map(keys)
                .collect(),
        }
    }

    /// From now on every request must be signed with keys moto issued (an IAM user's or STS's)
    /// and be allowed by their policies, as AWS checks; boto3 reads back as `admin`.
    pub fn enforce_auth(&self, admin: &Keys) {
        let script = "import sys, urllib.request\n\
            print(urllib.request.urlopen(urllib.request.Request(sys.argv[1] + \
            '/moto-api/reset-auth', data=b'0', method='POST', \
            headers={'Content-Type': 'text/plain'})).read().decode())";
        succeed(
            Command::new(&self.python)
                .args(["-c", script, &self.endpoint()])
                .env("NO_PROXY", "*"),
        );
        *self.keys.lock().unwrap_or_else(|e| e.into_inner()) =
            (admin.id.clone(), admin.secret.clone());
    }

    /// The `AssumeRoleWithWebIdentity` calls moto took: `{at, role, session, token}`.
    pub fn web_identity_calls(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.web_identity_log)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("a JSON line"))
            .collect()
    }
}

/// An auto-scaling group made in moto, and its members (instance id, private address).
#[derive(Debug, Clone)]
pub struct Group {
    pub name: String,
    pub region: String,
    pub members: Vec<(String, String)>,
}

/// What the IMDSv2 stub tells the agent about "its" instance.
#[derive(Debug, Clone)]
pub struct Metadata {
    /// The session token it hands out; every read must carry it.
    pub token: &'static str,
    pub instance_id: String,
    pub region: String,
    /// The `aws:autoscaling:groupName` tag; None: instance metadata tags are off (404).
    pub group_tag: Option<String>,
    /// The instance profile's role and its temporary keys; None: no role attached (404).
    pub role: Option<Role>,
    /// `autoscaling/target-lifecycle-state`, changed by the test as the group would; None:
    /// not in a group (404).
    pub lifecycle_state: Option<Arc<Mutex<String>>>,
}

#[derive(Debug, Clone)]
pub struct Role {
    pub name: String,
    pub access_key_id: &'static str,
    pub secret_access_key: &'static str,
    pub session_token: &'static str,
}

/// An IMDSv2 stub on 127.0.0.1: the token first (a PUT with a TTL), then every read with it
/// (401 without); the instance id, region, group tag and role keys of `m`, 404 for the rest.
pub fn imds_stub(m: Metadata) -> Receiver {
    Receiver::start(move |req: &Recorded, _| {
        if req.method == "PUT" && req.path == "/latest/api/token" {
            return match req.header("X-aws-ec2-metadata-token-ttl-seconds") {
                Some(_) => (200, m.token.into()),
                None => (400, "missing TTL".into()),
            };
        }
        if req.header("X-aws-ec2-metadata-token") != Some(m.token) {
            return (401, String::new());
        }
        let path = req.path.strip_prefix("/latest/meta-data/").unwrap_or("");
        match (path, &m.group_tag, &m.role) {
            ("instance-id", ..) => (200, m.instance_id.clone()),
            ("placement/region", ..) => (200, m.region.clone()),
            ("tags/instance/aws:autoscaling:groupName", Some(g), _) => (200, g.clone()),
            ("autoscaling/target-lifecycle-state", ..) if m.lifecycle_state.is_some() => (
                200,
                m.lifecycle_state
                    .as_ref()
                    .map(|s| s.lock().unwrap_or_else(|e| e.into_inner()).clone())
                    .unwrap_or_default(),
            ),
            ("iam/security-credentials/", _, Some(r)) => (200, r.name.clone()),
            (p, _, Some(r)) if p.strip_prefix("iam/security-credentials/") == Some(&r.name) => (
                200,
                serde_json::json!({
                    "Code": "Success",
                    "Type": "AWS-HMAC",
                    "AccessKeyId": r.access_key_id,
                    "SecretAccessKey": r.secret_access_key,
                    "Token": r.session_token,
                    "Expiration": time_in(3600),
                })
                .to_string(),
            ),
            _ => (404, String::new()),
        }
    })
}

/// An agent's environment on the instance `imds` plays: no keys of its own (the role's come from
/// the metadata), no region but the metadata's.
pub fn instance_env(imds: &Receiver) -> Vec<(&'static str, String)> {
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

/// RFC 3339 UTC `secs` from now, with `date` (no date crate in the tests).
pub fn time_in(secs: u64) -> String {
    stdout_of(Command::new("date").args([
        "-u",
        "-d",
        &format!("+{secs} seconds"),
        "+%Y-%m-%dT%H:%M:%SZ",
    ]))
}

/// `details.fleet.peers_asked`, sorted: the peers the agent asked (from the group's members).
pub fn peers_asked(fleet: &serde_json::Value) -> Vec<String> {
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
