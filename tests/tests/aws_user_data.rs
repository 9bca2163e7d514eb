//! The shipped CloudFormation template's UserData, run for real. moto deploys the template and
//! substitutes its parameters; the UserData then runs as cloud-init runs it (as root, once) on a
//! Debian root booted with systemd-nspawn that has nothing of the agent, as a stock AMI has
//! not. There it downloads `AgentArtifactUrl`, checks it against `AgentArtifactSha256`, installs
//! it (a .tar.gz unpacked; an .rpm with dnf, on a root with Debian's dnf and rpm) and configures
//! and starts the agent under real systemd; an artifact whose checksum or architecture does not
//! match installs and starts nothing. shellcheck checks the script as rendered.
//!
//! The stack's fleet key reaches every instance: each writes the one secret's value to a file
//! only root reads, and names it in its config.
//!
//! Nothing here reaches AWS: S3, Parameter Store and Secrets Manager are an AWS CLI stand-in
//! serving the test's files and moto's secret (`health_agent_tests::stack`), the instance
//! metadata an IMDSv2 stub, and the APIs the agent calls are moto's. Everything else in the
//! UserData runs as written.

use std::{
    fs,
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use health_agent_tests::{
    free_port, get,
    moto::{imds_stub, Metadata, Role},
    nspawn,
    release::{self, Artifact},
    require_root,
    stack::{self, FleetKey, Stack, AWS_ARGS},
    succeed, wait_until, Machine, Moto, Receiver,
};
use serde_json::Value;

const REGION: &str = "eu-west-1";
const ROLE_SECRET: &str = "role-secret-never-shown";
const SESSION: &str = "SESSION-TOKEN-never-shown";
/// Every character systemd's environment file treats specially, and a space.
const PASSWORD: &str = r#"pa$s"w`o\r'd #1  x"#;
const PASSWORD_PARAMETER: &str = "/web/db/password";

/// Deploys the template with the application on `app`, the agent on `listen`, the password
/// parameter, and `more`.
fn deploy(moto: &Moto, name: &str, app: u16, listen: u16, more: &[(&str, &str)]) -> Stack {
    let (app, listen) = (app.to_string(), listen.to_string());
    let mut params = vec![
        ("AppPort", app.as_str()),
        ("AppWorkers", "16"),
        ("HealthPort", listen.as_str()),
        ("DatabasePasswordParameter", PASSWORD_PARAMETER),
    ];
    params.extend_from_slice(more);
    let stack = stack::deploy(moto, REGION, name, &params)
        .unwrap_or_else(|e| panic!("the stack was refused: {e}"));
    shellcheck(&stack.user_data);
    stack
}

/// The stack whose UserData installs `artifact`, and the role's grant to read it.
fn deploy_installing(moto: &Moto, name: &str, app: u16, listen: u16, artifact: &Artifact) -> Stack {
    let url = stack::artifact_url(artifact.name());
    let stack = deploy(
        moto,
        name,
        app,
        listen,
        &[
            ("AgentArtifactUrl", &url),
            ("AgentArtifactSha256", &artifact.sha256),
        ],
    );
    let object = format!("arn:aws:s3:::{}", url.trim_start_matches("s3://"));
    assert!(
        stack
            .role_grants
            .contains(&("s3:GetObject".into(), object.clone())),
        "the instance role may read {object}: {:?}",
        stack.role_grants
    );
    let readable: Vec<_> = stack
        .role_grants
        .iter()
        .filter(|(a, _)| a.starts_with("s3:"))
        .collect();
    assert_eq!(readable.len(), 1, "that object only: {readable:?}");
    stack
}

/// The stack's fleet key as moto holds it.
fn fleet_key(stack: &Stack) -> &FleetKey {
    stack
        .fleet_key
        .as_ref()
        .expect("moto holds the stack's fleet key secret")
}

/// shellcheck on the UserData as CloudFormation rendered it: no finding, style included.
fn shellcheck(script: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("user-data.sh");
    fs::write(&file, script).expect("writing the script");
    succeed(
        Command::new("shellcheck")
            .args(["--shell=sh", "--severity=style"])
            .arg(&file),
    );
}

fn role() -> Role {
    Role {
        name: "web-role".into(),
        access_key_id: "ASIAROLEKEYEXAMPLE01",
        secret_access_key: ROLE_SECRET,
        session_token: SESSION,
    }
}

/// The metadata of the group's first instance, as EC2 would serve it (the template turns
/// instance metadata tags on, and sets a lifecycle hook: the instance is in service).
fn metadata(stack: &Stack) -> Receiver {
    imds_stub(Metadata {
        token: "TOKEN-stack",
        instance_id: stack.members[0].0.clone(),
        region: REGION.into(),
        group_tag: Some(stack.group.clone()),
        role: Some(Role {
            name: stack.role.clone(),
            ..role()
        }),
        lifecycle_state: Some(std::sync::Arc::new(std::sync::Mutex::new(
            "InService".into(),
        ))),
    })
}

/// A directory laid out as the bucket: `releases/` and what `put` puts there.
fn bucket(put: impl FnOnce(&Path)) -> tempfile::TempDir {
    let objects = tempfile::tempdir().expect("tempdir");
    let releases = objects.path().join("releases");
    fs::create_dir_all(&releases).expect("releases/");
    put(&releases);
    objects
}

/// The instance as a stock AMI has it before UserData runs, plus the application on `app` and
/// what this host lacks, AWS: the metadata service's address in the unit's environment file,
/// and a drop-in after the template's naming moto as the endpoint and keeping the agent on
/// loopback (the template's 0.0.0.0 would also answer the addresses moto gave the group's other
/// members, all of them this host's).
fn prepare_instance(machine: &Machine, app: u16, listen: u16, imds: &Receiver, moto: &Moto) {
    machine.start_fixture("app", app, free_port(), &[]);
    machine.run(&["mkdir", "-p", "/etc/health-agent/conf.d"]);
    machine.write(
        "/etc/health-agent/environment",
        &format!("AWS_EC2_METADATA_SERVICE_ENDPOINT={}\n", imds.url("")),
    );
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

/// The file named `name` in the tarball, if it has one.
fn tar_member(tarball: &Path, name: &str) -> Option<Vec<u8>> {
    let dir = tempfile::tempdir().expect("tempdir");
    succeed(
        Command::new("tar")
            .arg("-xzf")
            .arg(tarball)
            .arg("-C")
            .arg(dir.path()),
    );
    let mut stack = vec![dir.path().to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if e.file_name() == name {
                return fs::read(&p).ok();
            }
        }
    }
    None
}

fn sha256_of(bytes: &[u8]) -> String {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("f");
    fs::write(&file, bytes).expect("writing");
    release::sha256(&file)
}

/// What the AWS CLI stand-in was asked, one call a line.
fn aws_calls(machine: &Machine) -> Vec<String> {
    machine
        .run(&["cat", AWS_ARGS])
        .lines()
        .map(String::from)
        .collect()
}

/// The download UserData asks for: `s3 cp` of `url` in the stack's region into its temporary
/// directory.
fn assert_downloaded(call: &str, url: &str) {
    let want = format!("s3 cp --only-show-errors --region {REGION} {url} /tmp/tmp.");
    assert!(
        call.starts_with(&want),
        "the download: {call:?}, want {want}…"
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

fn health_at(port: u16) -> Option<(u16, Value)> {
    let (code, body) = get(port, "/health").ok()?;
    Some((code, serde_json::from_str(&body).ok()?))
}

/// A refused artifact leaves the instance as the AMI had it: no agent, no unit, no drop-in,
/// nothing on HealthPort, the download removed, the password never read.
fn assert_nothing_installed(machine: &Machine, listen: u16) {
    for path in [
        "/usr/bin/health-agent",
        "/etc/systemd/system/health-agent.service",
        "/usr/lib/systemd/system/health-agent.service",
        "/etc/health-agent/health-agent.toml",
        "/etc/health-agent/conf.d/50-aws.toml",
        "/etc/health-agent/fleet.key",
    ] {
        assert!(
            !machine.exec(&["test", "-e", path]).status.success(),
            "{path} is there after a refused install"
        );
    }
    assert_eq!(
        machine.unit_property("health-agent.service", "LoadState"),
        "not-found"
    );
    assert!(
        get(listen, "/health").is_err(),
        "something answers on HealthPort"
    );
    assert_eq!(
        machine.run(&["sh", "-c", "ls -d /tmp/tmp.* 2>/dev/null | wc -l"]),
        "0",
        "the download is left in /tmp"
    );
    assert!(
        aws_calls(machine).iter().all(|c| c.starts_with("s3 cp ")),
        "a secret was read: {:?}",
        aws_calls(machine)
    );
}

#[test]
fn the_user_data_installs_the_tarball_from_s3_and_the_agent_runs_as_configured() {
    require_root();
    let started = Instant::now();
    let mut tarball = None;
    let objects = bucket(|dir| tarball = Some(release::tarball(dir)));
    let tarball = tarball.expect("the tarball");
    println!(
        "artifact: {} ({}), SHA-256 {}",
        tarball.name(),
        tarball.origin,
        tarball.sha256
    );
    let moto = Moto::start();
    let (app, listen) = (free_port(), free_port());
    let stack = deploy_installing(&moto, "web", app, listen, &tarball);
    assert_peers_may_list_and_reach_each_other(&stack);
    let imds = metadata(&stack);

    let machine = stack::boot_instance(
        &nspawn::rootfs(),
        objects.path(),
        PASSWORD,
        &[fleet_key(&stack)],
    );
    prepare_instance(&machine, app, listen, &imds, &moto);
    let (code, said) = stack::run_user_data(&machine, &stack.user_data);
    println!("UserData exited {code}:\n{said}");
    assert_eq!(code, 0, "{said}");
    let calls = aws_calls(&machine);
    assert_downloaded(&calls[0], &stack::artifact_url(tarball.name()));

    // The tarball's files where the unit expects them.
    let binary = tar_member(&tarball.path, "health-agent").expect("a binary in the tarball");
    let installed = machine.run(&["sha256sum", "/usr/bin/health-agent"]);
    assert!(
        installed.starts_with(&sha256_of(&binary)),
        "/usr/bin/health-agent is not the tarball's: {installed}"
    );
    let unit = tar_member(&tarball.path, "health-agent.service").expect("a unit");
    assert_eq!(
        machine.run(&["cat", "/etc/systemd/system/health-agent.service"]),
        String::from_utf8_lossy(&unit).trim()
    );
    let config = match tar_member(&tarball.path, "health-agent.toml") {
        Some(c) => String::from_utf8_lossy(&c).trim().to_owned(),
        None => machine.run(&["health-agent", "config", "--dump"]),
    };
    assert_eq!(
        machine.run(&["cat", "/etc/health-agent/health-agent.toml"]),
        config,
        "the default config, as the tarball has it"
    );
    assert_runs_as_the_stack_says(&machine, &stack, &moto, app, listen);
    println!("{:.1} s in all", started.elapsed().as_secs_f64());
}

/// The agent the UserData configured: active, its drop-in's ports, workers, CloudWatch and
/// fleet in effect, the password in its environment exactly as stored; moto receives the
/// metric, and the peers are the group's other members. No credential in the journal.
fn assert_runs_as_the_stack_says(
    machine: &Machine,
    stack: &Stack,
    moto: &Moto,
    app: u16,
    listen: u16,
) {
    assert_eq!(
        machine.unit_property("health-agent.service", "ActiveState"),
        "active",
        "{}",
        journal(machine)
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
    assert_eq!(doc["web"]["port"].as_integer(), Some(i64::from(app)));
    assert_eq!(doc["web"]["workers"].as_integer(), Some(16));
    assert_eq!(
        doc["scaling"]["cloudwatch"]["enabled"].as_bool(),
        Some(true)
    );
    assert_eq!(doc["fleet"]["peers_from"].as_str(), Some("asg"));

    // The password: read from Parameter Store in this region, written beside the file's other
    // lines, mode 600, and in the agent's environment exactly as stored.
    assert_eq!(
        aws_calls(machine).last().map(String::as_str),
        Some(
            format!(
                "ssm get-parameter --region {REGION} --name {PASSWORD_PARAMETER} \
                 --with-decryption --query Parameter.Value --output text"
            )
            .as_str()
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
            .any(|v| v.strip_prefix("PGPASSWORD=") == Some(PASSWORD)),
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
            (published >= Some(1)
                && health_agent_tests::moto::peers_asked(&b["details"]["fleet"]) == want)
                .then_some(b)
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
        capacity["workers"] == 16 && capacity["basis"] == "configured",
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
    let log = journal(machine);
    for s in [ROLE_SECRET, SESSION, PASSWORD, &fleet_key(stack).value] {
        assert!(!log.contains(s), "the journal shows a credential:\n{log}");
    }
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
    let arn = format!("arn:aws:ssm:{REGION}:123456789012:parameter{PASSWORD_PARAMETER}");
    assert!(
        stack
            .role_grants
            .contains(&("ssm:GetParameter".into(), arn.clone())),
        "the instance role may read {arn}: {:?}",
        stack.role_grants
    );
    assert_eq!(stack.members.len(), 3, "{:?}", stack.members);
}

/// The object in S3 is not the one the checksum names (a tampered or swapped file: one byte
/// changed, tar would still unpack it): the UserData says both sums, and installs and starts
/// nothing.
#[test]
fn the_user_data_installs_and_starts_nothing_when_the_checksum_differs() {
    require_root();
    let mut tarball = None;
    let objects = bucket(|dir| {
        let t = release::tarball(dir);
        let mut bytes = fs::read(&t.path).expect("the tarball");
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0x01;
        fs::write(&t.path, &bytes).expect("tampering");
        tarball = Some(t);
    });
    let tarball = tarball.expect("the tarball");
    let served = release::sha256(&tarball.path);
    let moto = Moto::start();
    let (app, listen) = (free_port(), free_port());
    let stack = deploy_installing(&moto, "tampered", app, listen, &tarball);

    let machine = stack::boot_instance(
        &nspawn::rootfs(),
        objects.path(),
        PASSWORD,
        &[fleet_key(&stack)],
    );
    let (code, said) = stack::run_user_data(&machine, &stack.user_data);
    println!("UserData exited {code}:\n{said}");
    assert_ne!(code, 0, "the UserData went on: {said}");
    let want = format!(
        "health-agent: {} has SHA-256 {served}, not AgentArtifactSha256 {}: nothing \
         installed, the agent not started",
        stack::artifact_url(tarball.name()),
        tarball.sha256
    );
    assert!(said.contains(&want), "{said}\nwant: {want}");
    assert_eq!(aws_calls(&machine).len(), 1, "one download");
    assert_nothing_installed(&machine, listen);
}

/// The .rpm path, on a root with dnf and rpm: an aarch64 package on this x86_64 instance (a
/// Graviton stack's artifact) is refused by its header before dnf runs; the x86_64 package is
/// installed by dnf and the agent runs as the stack configured it.
#[test]
fn the_user_data_installs_the_rpm_with_dnf_and_refuses_another_architectures() {
    require_root();
    let (mut native, mut foreign, mut base) = (None, None, None);
    let objects = bucket(|dir| {
        let rpm = release::rpm(dir, release::ARCH);
        // Debian's rpm database is empty where Amazon Linux's has glibc, bash and systemd.
        let requires = release::requires(&rpm.path);
        if !requires.is_empty() {
            base = Some(release::base_stand_in(dir, &requires));
        }
        native = Some(rpm);
        foreign = Some(release::rpm(dir, "aarch64"));
    });
    let (native, foreign) = (native.expect("rpm"), foreign.expect("rpm"));
    println!(
        "artifacts: {} ({}); {} ({})",
        native.name(),
        native.origin,
        foreign.name(),
        foreign.origin
    );
    let moto = Moto::start();
    let (app, listen) = (free_port(), free_port());
    let graviton = deploy_installing(&moto, "graviton", app, listen, &foreign);
    let stack = deploy_installing(&moto, "web", app, listen, &native);
    let imds = metadata(&stack);

    let machine = stack::boot_instance(
        &nspawn::dnf_rootfs(),
        objects.path(),
        PASSWORD,
        &[fleet_key(&stack)],
    );
    if let Some(base) = &base {
        let name = base.file_name().and_then(|n| n.to_str()).expect("name");
        let at = format!("{}/{}/releases/{name}", stack::S3_MOUNT, stack::BUCKET);
        machine.run(&["dnf", "install", "-q", "-y", "--disablerepo=*", &at]);
    }
    let (code, said) = stack::run_user_data(&machine, &graviton.user_data);
    println!("the aarch64 rpm: UserData exited {code}:\n{said}");
    assert_ne!(code, 0, "{said}");
    let want = format!(
        "{} is built for aarch64, this instance is x86_64: nothing installed",
        stack::artifact_url(foreign.name())
    );
    assert!(said.contains(&want), "{said}\nwant: {want}");
    assert!(
        !machine
            .exec(&["rpm", "-q", "health-agent"])
            .status
            .success(),
        "the aarch64 package is installed"
    );
    assert_nothing_installed(&machine, listen);

    machine.run(&["rm", "-f", AWS_ARGS]);
    prepare_instance(&machine, app, listen, &imds, &moto);
    let (code, said) = stack::run_user_data(&machine, &stack.user_data);
    println!("the x86_64 rpm: UserData exited {code}:\n{said}");
    assert_eq!(code, 0, "{said}");
    assert_downloaded(&aws_calls(&machine)[0], &stack::artifact_url(native.name()));
    let installed = machine.run(&["rpm", "-q", "health-agent"]);
    assert_eq!(
        format!("{installed}.rpm"),
        native.name(),
        "dnf installed the package"
    );
    assert_runs_as_the_stack_says(&machine, &stack, &moto, app, listen);
}

const KEY_FILE: &str = "/etc/health-agent/fleet.key";

/// The fleet key `key` as a stack's UserData left it on `machine`: read from its secret in the
/// stack's region, written to [`KEY_FILE`] (root's, mode 600, nothing in it but the secret's
/// value), named by the drop-in's `[fleet] key_file`, and accepted by the agent's config check;
/// the value is nowhere in what the UserData printed, in the stand-in's log of calls or in the
/// agent's journal.
fn assert_holds_the_fleet_key(machine: &Machine, key: &FleetKey, said: &str) {
    let want = format!(
        "secretsmanager get-secret-value --region {REGION} --secret-id {} \
         --query SecretString --output text",
        key.secret
    );
    let calls = aws_calls(machine);
    assert!(
        calls.contains(&want),
        "the UserData reads the stack's secret: {calls:?}, want {want}"
    );
    assert_eq!(
        machine.run(&["stat", "-c", "%a %U %G", KEY_FILE]),
        "600 root root",
        "{KEY_FILE}: root's, and only root reads it"
    );
    assert_eq!(
        machine.run(&["cat", KEY_FILE]),
        key.value,
        "{KEY_FILE} holds the secret's value"
    );
    assert_eq!(
        machine.run(&["sh", "-c", "ls /etc/health-agent | grep -c '^fleet.key'"]),
        "1",
        "no temporary copy of the key is left beside it"
    );
    let drop_in: toml_edit::DocumentMut = machine
        .run(&["cat", "/etc/health-agent/conf.d/50-aws.toml"])
        .parse()
        .expect("the stack's drop-in is TOML");
    assert_eq!(drop_in["fleet"]["key_file"].as_str(), Some(KEY_FILE));
    assert_eq!(drop_in["fleet"]["peers_from"].as_str(), Some("asg"));
    assert_eq!(
        drop_in["drain"]["lifecycle_hook"].as_str(),
        Some("health-agent-drain"),
        "[drain] keeps its key"
    );
    let config = "/etc/health-agent/health-agent.toml";
    let validate = machine.exec(&["health-agent", "config", "--validate", config]);
    assert!(
        validate.status.success(),
        "the agent refuses the stack's config: {}{}",
        String::from_utf8_lossy(&validate.stdout),
        String::from_utf8_lossy(&validate.stderr)
    );
    let effective: toml_edit::DocumentMut = machine
        .run(&["health-agent", "config", "--effective"])
        .parse()
        .expect("config --effective is TOML");
    assert_eq!(effective["fleet"]["key_file"].as_str(), Some(KEY_FILE));
    for (what, text) in [
        ("the UserData's output", said.to_owned()),
        ("the AWS CLI calls", aws_calls(machine).join("\n")),
        ("the agent's journal", journal(machine)),
    ] {
        assert!(!text.contains(&key.value), "{what} shows the fleet key");
    }
}

/// The fleet key the stack made (a Secrets Manager secret, 48 letters and digits) reaches every
/// instance: two of the group's instances, booted one after the other, each hold the same key in
/// a file only root reads, and their configs name it; a second stack given the first's secret
/// (FleetKeySecretArn) makes none of its own and its instance holds the same key, one fleet; a
/// secret's name there, not its ARN, is refused. The instance role may read that secret and no
/// other.
#[test]
fn the_stacks_fleet_key_reaches_each_instance_in_a_file_only_root_reads() {
    require_root();
    let mut tarball = None;
    let objects = bucket(|dir| tarball = Some(release::tarball(dir)));
    let tarball = tarball.expect("the tarball");
    let moto = Moto::start();
    let (app, listen) = (free_port(), free_port());
    let web = deploy_installing(&moto, "web", app, listen, &tarball);
    let key = fleet_key(&web).clone();
    assert!(
        key.value.len() >= 32 && key.value.chars().all(|c| c.is_ascii_graphic()),
        "the generated key is at least 32 printable characters without whitespace ({} long)",
        key.value.len()
    );
    let secret_grants: Vec<_> = web
        .role_grants
        .iter()
        .filter(|(a, _)| a.starts_with("secretsmanager:"))
        .collect();
    assert_eq!(
        secret_grants,
        [&(
            "secretsmanager:GetSecretValue".to_owned(),
            key.secret.clone()
        )],
        "the instance role may read the fleet key's secret, and no other"
    );
    assert_eq!(web.outputs["FleetKeySecret"], key.secret.as_str());

    let url = stack::artifact_url(tarball.name());
    let shop = deploy(
        &moto,
        "shop",
        app,
        listen,
        &[
            ("AgentArtifactUrl", &url),
            ("AgentArtifactSha256", &tarball.sha256),
            ("FleetKeySecretArn", &key.secret),
        ],
    );
    assert_eq!(
        fleet_key(&shop).secret,
        key.secret,
        "the second stack reads the first's secret"
    );
    assert!(
        shop.role_grants
            .contains(&("secretsmanager:GetSecretValue".into(), key.secret.clone())),
        "{:?}",
        shop.role_grants
    );
    assert_eq!(shop.outputs["FleetKeySecret"], key.secret.as_str());
    // A secret's name is no ARN: the role's grant would name nothing.
    let refused = stack::deploy(
        &moto,
        REGION,
        "named",
        &[
            ("AppWorkers", "4"),
            ("FleetKeySecretArn", "health-agent-fleet-key"),
        ],
    );
    assert!(
        refused
            .as_ref()
            .is_err_and(|e| e.contains("Parameter 'FleetKeySecretArn' must match pattern")),
        "a secret's name for FleetKeySecretArn: {:?}",
        refused.err()
    );

    for (stack, instance) in [(&web, "web 1"), (&web, "web 2"), (&shop, "shop 1")] {
        let imds = metadata(stack);
        let machine = stack::boot_instance(&nspawn::rootfs(), objects.path(), PASSWORD, &[&key]);
        prepare_instance(&machine, app, listen, &imds, &moto);
        let (code, said) = stack::run_user_data(&machine, &stack.user_data);
        println!("{instance}: UserData exited {code}:\n{said}");
        assert_eq!(code, 0, "{said}");
        assert_holds_the_fleet_key(&machine, &key, &said);
        println!(
            "{instance}: {KEY_FILE} 600 root, the secret's {} characters",
            key.value.len()
        );
    }
}
