//! The AWS credential chain against moto with its IAM checks on: after setup, moto takes only
//! requests signed with keys it issued (an IAM user's, or STS's temporary ones) and allowed by
//! their policies, as AWS does. For each source — the environment, web identity (moto's STS
//! `AssumeRoleWithWebIdentity`, its token checked), a shared profile's static keys, a profile's
//! `role_arn` (moto's STS `AssumeRole`, signed with the source profile's keys), container
//! credentials (a local stand-in for the ECS / EKS Pod Identity endpoint) and the instance role
//! (an IMDSv2 stand-in) — an agent signs real `PutMetricData` (read back with boto3) and
//! `DescribeAutoScalingGroups` / `DescribeInstances` (its peers are the group's other members),
//! with the endpoints from `AWS_ENDPOINT_URL` / `AWS_ENDPOINT_URL_<SERVICE>`; keys moto never
//! issued are refused. Temporary keys are fetched again before they expire; `check` names the
//! source, and a source that fails is named in the error.

use std::{
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use health_agent_tests::{
    agent_binary, free_port,
    moto::{imds_stub, time_in, Group, Iam, Keys, Metadata, Role, WEB_IDENTITY_TOKEN},
    require_root, wait_until, Agent, Moto, Receiver,
};
use serde_json::Value;

const REGION: &str = "eu-west-1";
/// What the container stand-in wants in `Authorization`.
const AUTH_TOKEN: &str = "container-authorization-token-never-shown";

/// moto with a group of three, the IAM side, `role_keys` temporary keys of the role, and its
/// checks on.
fn world(role_keys: usize) -> (Moto, Iam, Group) {
    let moto = Moto::start();
    let group = moto.auto_scaling_group(REGION, "web-asg", 7, 3);
    let iam = moto.iam(role_keys);
    moto.enforce_auth(&iam.admin);
    (moto, iam, group)
}

/// The metadata of the group's first instance; its role's keys when `role` is given.
fn imds(group: &Group, role: Option<&Keys>) -> Receiver {
    let leak = |s: &str| -> &'static str { s.to_string().leak() };
    imds_stub(Metadata {
        token: "TOKEN-creds",
        instance_id: group.members[0].0.clone(),
        region: REGION.into(),
        group_tag: Some(group.name.clone()),
        role: role.map(|k| Role {
            name: "instance-role".into(),
            access_key_id: leak(&k.id),
            secret_access_key: leak(&k.secret),
            session_token: leak(k.token.as_deref().unwrap_or("")),
        }),
        lifecycle_state: None,
    })
}

/// CloudWatch under `namespace` every 10 s, and the group's members as peers every 5 s.
fn config(namespace: &str) -> String {
    format!(
        "[scaling.cloudwatch]\nenabled = true\nnamespace = \"{namespace}\"\ninterval = \"10s\"\n\
         high_resolution = true\n\n[fleet]\npeers_from = \"asg\"\npeers_refresh = \"5s\"\n\
         interval = \"1s\"\ntimeout = \"300ms\"\n"
    )
}

/// The container endpoint's stand-in: the role's keys in turn, one set per request, each
/// expiring `expires_in` seconds after it is served; 401 without [`AUTH_TOKEN`].
fn container(keys: Vec<Keys>, expires_in: u64) -> Receiver {
    Receiver::start(move |req, before| {
        if req.header("authorization") != Some(AUTH_TOKEN) {
            return (
                401,
                "{\"Code\":\"Unauthorized\",\"Message\":\"bad token\"}".into(),
            );
        }
        let k = &keys[before.len() % keys.len()];
        let body = serde_json::json!({
            "AccessKeyId": k.id, "SecretAccessKey": k.secret, "Token": k.token,
            "Expiration": time_in(expires_in), "RoleArn": "arn:aws:iam::123456789012:role/x",
        });
        (200, body.to_string())
    })
}

/// A file in `dir` holding `text`; its path.
fn file(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("writing a test file");
    p.display().to_string()
}

/// The environment every agent here shares: the metadata stand-in, and moto for every service.
fn base_env(imds: &Receiver, moto: &Moto) -> Vec<(&'static str, String)> {
    vec![
        ("AWS_EC2_METADATA_SERVICE_ENDPOINT", imds.url("")),
        ("AWS_ENDPOINT_URL", moto.endpoint()),
    ]
}

/// One source under test: its name, environment, what the status must say.
struct Case {
    name: &'static str,
    env: Vec<(&'static str, String)>,
    says: String,
    /// Kept serving while the agent runs.
    _imds: Receiver,
}

fn cases(moto: &Moto, iam: &Iam, group: &Group, dir: &Path, stand_in: &Receiver) -> Vec<Case> {
    let user = &iam.user;
    let none = || imds(group, None);
    let mut out = Vec::new();

    let i = none();
    let mut env = base_env(&i, moto);
    env.extend([
        ("AWS_ACCESS_KEY_ID", user.id.clone()),
        ("AWS_SECRET_ACCESS_KEY", user.secret.clone()),
        ("AWS_REGION", REGION.into()),
    ]);
    out.push(Case {
        name: "environment",
        env,
        says: "environment".into(),
        _imds: i,
    });

    // Every service's own variable, and the common one pointing where nothing listens: the
    // service's wins.
    let i = none();
    let token_file = file(dir, "web-identity-token", WEB_IDENTITY_TOKEN);
    let mut env = vec![
        ("AWS_EC2_METADATA_SERVICE_ENDPOINT", i.url("")),
        (
            "AWS_ENDPOINT_URL",
            format!("http://127.0.0.1:{}", free_port()),
        ),
        ("AWS_WEB_IDENTITY_TOKEN_FILE", token_file),
        ("AWS_ROLE_ARN", iam.role_arn.clone()),
        ("AWS_ROLE_SESSION_NAME", "irsa-test".into()),
        ("AWS_REGION", REGION.into()),
    ];
    for var in [
        "AWS_ENDPOINT_URL_STS",
        "AWS_ENDPOINT_URL_CLOUDWATCH",
        "AWS_ENDPOINT_URL_AUTO_SCALING",
        "AWS_ENDPOINT_URL_EC2",
    ] {
        env.push((var, moto.endpoint()));
    }
    out.push(Case {
        name: "web-identity",
        env,
        says: format!("web identity (role {})", iam.role_arn),
        _imds: i,
    });

    // Static keys in the credentials file; the region from the config file's profile.
    let credentials = file(
        dir,
        "credentials",
        &format!(
            "[prod]\naws_access_key_id = {}\naws_secret_access_key = {}\n",
            user.id, user.secret
        ),
    );
    let config = file(
        dir,
        "config",
        &format!(
            "[profile prod]\nregion = {REGION}\n\n[profile assumer]\nregion = {REGION}\n\
             role_arn = {}\nsource_profile = prod\nrole_session_name = profile-test\n",
            iam.role_arn
        ),
    );
    for (name, profile, says) in [
        ("profile", "prod", format!("profile prod ({credentials})")),
        (
            "profile-role",
            "assumer",
            format!(
                "profile assumer ({config}): role {} assumed with the keys of profile prod \
                 ({credentials})",
                iam.role_arn
            ),
        ),
    ] {
        let i = none();
        let mut env = base_env(&i, moto);
        env.extend([
            ("AWS_PROFILE", profile.into()),
            ("AWS_CONFIG_FILE", config.clone()),
            ("AWS_SHARED_CREDENTIALS_FILE", credentials.clone()),
        ]);
        out.push(Case {
            name,
            env,
            says,
            _imds: i,
        });
    }

    let i = none();
    let mut env = base_env(&i, moto);
    env.extend([
        (
            "AWS_CONTAINER_CREDENTIALS_FULL_URI",
            stand_in.url("/v1/credentials"),
        ),
        (
            "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
            file(dir, "container-token", AUTH_TOKEN),
        ),
        ("AWS_REGION", REGION.into()),
    ]);
    out.push(Case {
        name: "container",
        env,
        says: format!(
            "container credentials ({})",
            stand_in.url("/v1/credentials")
        ),
        _imds: i,
    });

    // The region from the metadata too.
    let i = imds(group, iam.role_keys.last());
    out.push(Case {
        name: "instance-role",
        env: base_env(&i, moto),
        says: "instance role (IMDSv2)".into(),
        _imds: i,
    });
    out
}

fn pairs<'a>(env: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    env.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

/// `health-agent check` on `toml` with only `env` of AWS's variables: its table.
fn check(dir: &Path, toml: &str, env: &[(&'static str, String)]) -> String {
    let cfg = dir.join("check.toml");
    std::fs::write(&cfg, toml).expect("config");
    let mut c = Command::new(agent_binary());
    for (var, _) in std::env::vars_os() {
        if var.to_string_lossy().starts_with("AWS_") {
            c.env_remove(var);
        }
    }
    let no_file = dir.join("no-aws-file");
    let out = c
        .env("AWS_CONFIG_FILE", &no_file)
        .env("AWS_SHARED_CREDENTIALS_FILE", &no_file)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .arg("--config")
        .arg(&cfg)
        .arg("check")
        .output()
        .expect("health-agent check");
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The `aws credentials` row of a `check` table.
fn credentials_row(table: &str) -> String {
    table
        .lines()
        .find_map(|l| l.strip_prefix("aws credentials"))
        .map(|r| r.trim().to_string())
        .unwrap_or_else(|| panic!("no `aws credentials` row in:\n{table}"))
}

#[test]
fn every_source_signs_put_metric_data_and_describe_auto_scaling_groups_that_moto_checks() {
    require_root();
    let (moto, iam, group) = world(4);
    let dir = tempfile::tempdir().expect("tempdir");
    let stand_in = container(iam.role_keys[..2].to_vec(), 3600);
    let cases = cases(&moto, &iam, &group, dir.path(), &stand_in);

    // `check` first: the source named, the keys fetched, none of them shown.
    let secrets = [
        iam.user.secret.clone(),
        iam.role_keys[0].secret.clone(),
        iam.role_keys[0].token.clone().unwrap_or_default(),
        WEB_IDENTITY_TOKEN.to_string(),
        AUTH_TOKEN.to_string(),
    ];
    for case in &cases {
        let table = check(dir.path(), &config("Check"), &case.env);
        let row = credentials_row(&table);
        println!("check, {}: aws credentials {row}", case.name);
        assert!(
            row.starts_with(&format!("{} — ok", case.says)),
            "{}: {table}",
            case.name
        );
        for s in &secrets {
            assert!(
                !table.contains(s.as_str()),
                "{}: a secret in\n{table}",
                case.name
            );
        }
    }

    // Keys moto never issued: refused, which shows the checks are on.
    let unknown_imds = imds(&group, None);
    let mut unknown_env = base_env(&unknown_imds, &moto);
    unknown_env.extend([
        ("AWS_ACCESS_KEY_ID", "AKIAUNKNOWNKEY000000".to_string()),
        ("AWS_SECRET_ACCESS_KEY", "unknown-secret".to_string()),
        ("AWS_REGION", REGION.to_string()),
    ]);
    let unknown = Agent::start_with_env(&config("Src-unknown"), &pairs(&unknown_env));
    // The user's key id with another secret: the signature does not match.
    let mut forged_env = unknown_env.clone();
    forged_env
        .retain(|(k, _)| !k.starts_with("AWS_ACCESS_KEY_ID") && *k != "AWS_SECRET_ACCESS_KEY");
    forged_env.extend([
        ("AWS_ACCESS_KEY_ID", iam.user.id.clone()),
        ("AWS_SECRET_ACCESS_KEY", "not-the-users-secret".to_string()),
    ]);
    let forged = Agent::start_with_env(&config("Src-forged"), &pairs(&forged_env));

    let started = Instant::now();
    let agents: Vec<(&Case, Agent)> = cases
        .iter()
        .map(|c| {
            let namespace = format!("Src-{}", c.name);
            (
                c,
                Agent::start_with_env(&config(&namespace), &pairs(&c.env)),
            )
        })
        .collect();
    for (case, agent) in &agents {
        let port = agent.port;
        let mut want: Vec<String> = group.members[1..]
            .iter()
            .map(|(_, ip)| format!("{ip}:{port}"))
            .collect();
        want.sort();
        let (cw, fleet) = wait_until(Duration::from_secs(60), case.name, || {
            let (_, body) = agent.health();
            let cw = body["details"]["scaling"]["cloudwatch"].clone();
            let fleet = body["details"]["fleet"].clone();
            (cw["published_data"].as_u64() >= Some(1)
                && health_agent_tests::moto::peers_asked(&fleet) == want)
                .then_some((cw, fleet))
        });
        println!(
            "{}: published and peers listed {:.1} s after start; credentials {}; peers {}",
            case.name,
            started.elapsed().as_secs_f64(),
            cw["credentials"],
            fleet["peers_asked"]
        );
        assert_eq!(cw["credentials"], case.says.as_str(), "{}", case.name);
        assert_eq!(cw["region"], REGION, "{}", case.name);
        let back = moto.read_back(REGION, &format!("Src-{}", case.name));
        let points = back["datapoints"].as_array().cloned().unwrap_or_default();
        assert!(
            points.iter().any(|p| p["Unit"] == "Percent"),
            "{}: moto holds no datapoint: {back}",
            case.name
        );
        let mut shown: Vec<&str> = secrets.iter().map(String::as_str).collect();
        shown.push(&iam.role_keys[3].secret);
        agent.assert_shows_none(&shown);
    }

    // moto's STS took the token from the file, for the role, under the session name.
    let calls = moto.web_identity_calls();
    assert!(
        !calls.is_empty(),
        "no AssumeRoleWithWebIdentity reached moto"
    );
    for c in &calls {
        assert_eq!(c["token"], WEB_IDENTITY_TOKEN, "{c}");
        assert_eq!(c["role"], iam.role_arn.as_str(), "{c}");
        assert_eq!(c["session"], "irsa-test", "{c}");
    }
    // The container stand-in was asked with the token from the file, once per component.
    let asked_container = stand_in.requests();
    assert!(
        asked_container
            .iter()
            .all(|r| r.header("authorization") == Some(AUTH_TOKEN)),
        "{asked_container:?}"
    );

    for (agent, what, code) in [
        (&unknown, "unknown keys", "InvalidClientTokenId"),
        (&forged, "a wrong secret", "SignatureDoesNotMatch"),
    ] {
        let cw = wait_until(Duration::from_secs(40), what, || {
            let (_, body) = agent.health();
            let cw = body["details"]["scaling"]["cloudwatch"].clone();
            cw["last_error"].as_str().is_some().then_some(cw)
        });
        println!("{what}: {}", cw["last_error"]);
        assert!(
            cw["last_error"].as_str().is_some_and(|e| e.contains(code)),
            "{what}: {cw}"
        );
        assert_eq!(cw["published_data"], 0, "{cw}");
    }
}

/// Keys the container endpoint says expire just past the renewal margin (10 min) are fetched
/// again at the next use, each new set signing the next PutMetricData; keys valid for an hour
/// are fetched once.
#[test]
fn temporary_keys_are_fetched_again_before_they_expire() {
    require_root();
    let (moto, iam, group) = world(6);
    let dir = tempfile::tempdir().expect("tempdir");
    let cloudwatch_only = |namespace: &str| {
        format!(
            "[scaling.cloudwatch]\nenabled = true\nnamespace = \"{namespace}\"\n\
             interval = \"10s\"\nhigh_resolution = true\nauto_scaling_group = \"{}\"\n",
            group.name
        )
    };
    let token = file(dir.path(), "container-token", AUTH_TOKEN);
    let run = |expires_in: u64, namespace: &str| {
        let stand_in = container(iam.role_keys.clone(), expires_in);
        let i = imds(&group, None);
        let mut env = base_env(&i, &moto);
        env.extend([
            ("AWS_CONTAINER_CREDENTIALS_FULL_URI", stand_in.url("/creds")),
            ("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", token.clone()),
            ("AWS_REGION", REGION.into()),
        ]);
        let agent = Agent::start_with_env(&cloudwatch_only(namespace), &pairs(&env));
        let cw = wait_until(Duration::from_secs(60), "three published intervals", || {
            let (_, body) = agent.health();
            let cw = body["details"]["scaling"]["cloudwatch"].clone();
            (cw["published_data"].as_u64() >= Some(3)).then_some(cw)
        });
        let fetched = stand_in.requests().len();
        let back = moto.read_back(REGION, namespace);
        (cw, fetched, back)
    };
    // 600 s is the renewal margin: these are stale 4 s after they arrive.
    let (cw, fetched, back) = run(600 + 4, "Short");
    println!(
        "keys expiring in 10 min 4 s: {fetched} fetches for {} PutMetricData ({} requests); \
         moto holds {}",
        cw["published_data"], cw["requests"], back["datapoints"]
    );
    let requests = cw["requests"].as_u64().unwrap_or(0) as usize;
    assert!(
        fetched >= 3 && fetched + 1 >= requests,
        "fetched again before each use past the margin: {fetched} fetches, {cw}"
    );
    assert_eq!(
        cw["last_error"],
        Value::Null,
        "every set of keys signed: {cw}"
    );
    assert!(
        back["datapoints"][0]["SampleCount"].as_f64() >= Some(10.0),
        "{back}"
    );
    let (cw, fetched, _) = run(3600, "Long");
    println!(
        "keys valid for an hour: {fetched} fetch for {} PutMetricData",
        cw["published_data"]
    );
    assert_eq!(fetched, 1, "kept while far from expiry: {cw}");
}

/// A source that is set but fails, or cannot be used, is named with the reason in `check`;
/// nothing falls through to the next source.
#[test]
fn a_failing_source_is_named_in_check() {
    require_root();
    let moto = Moto::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let toml = "[scaling.cloudwatch]\nenabled = true\nregion = \"eu-west-1\"\n\
                auto_scaling_group = \"g\"\n";
    let broken = Receiver::start(|_, _| {
        (
            500,
            "{\"Code\":\"InternalError\",\"Message\":\"the agent is restarting\"}".into(),
        )
    });
    let metadata_off = ("AWS_EC2_METADATA_DISABLED", "true".to_string());
    let wrong_token = file(dir.path(), "wrong-token", "not-the-token");
    let role = "arn:aws:iam::123456789012:role/health-agent";
    let cases: Vec<(Vec<(&'static str, String)>, String)> = vec![
        (
            vec![
                ("AWS_WEB_IDENTITY_TOKEN_FILE", wrong_token),
                ("AWS_ROLE_ARN", role.into()),
                ("AWS_ENDPOINT_URL", moto.endpoint()),
                metadata_off.clone(),
            ],
            format!(
                "credentials from web identity (role {role}): STS AssumeRoleWithWebIdentity at \
                 {}/: refused: HTTP 400 InvalidIdentityToken",
                moto.endpoint()
            ),
        ),
        (
            vec![
                ("AWS_WEB_IDENTITY_TOKEN_FILE", "/nonexistent/token".into()),
                ("AWS_ROLE_ARN", role.into()),
                metadata_off.clone(),
            ],
            format!("credentials from web identity (role {role}): token file /nonexistent/token:"),
        ),
        (
            vec![
                ("AWS_CONTAINER_CREDENTIALS_FULL_URI", broken.url("/creds")),
                metadata_off.clone(),
            ],
            format!(
                "credentials from container credentials ({0}): {0}: HTTP 500 (InternalError: \
                 the agent is restarting)",
                broken.url("/creds")
            ),
        ),
        (
            // Not a host the SDKs send keys to over plain HTTP: refused before any request.
            vec![
                (
                    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
                    "http://192.0.2.7/creds".into(),
                ),
                metadata_off.clone(),
            ],
            "credentials from container credentials: AWS_CONTAINER_CREDENTIALS_FULL_URI: http:// \
             to 192.0.2.7 is refused"
                .into(),
        ),
        (
            vec![("AWS_PROFILE", "nope".into()), metadata_off.clone()],
            "credentials from profile nope: not found in".into(),
        ),
        (
            vec![metadata_off.clone()],
            "no credentials: neither AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, web identity, a \
             profile nor container credentials are set, and the instance role is unavailable: \
             instance metadata is off"
                .into(),
        ),
    ];
    for (env, says) in cases {
        let table = check(dir.path(), toml, &env);
        let row = credentials_row(&table);
        println!("aws credentials {row}");
        assert!(row.starts_with(&says), "want {says:?}, got:\n{table}");
        assert!(!table.contains("not-the-token"), "{table}");
    }
    assert_eq!(broken.requests().len(), 1);
}
