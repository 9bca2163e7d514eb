//! The DaemonSet's image (`cargo xtask image`) run by Docker with exactly what
//! deploy/kubernetes/health-agent.yaml asks for, each field translated to its `docker run` flag
//! (docs/deploy.md, "The DaemonSet", lists the same table): `/health` answers, the kernel view is
//! active, and a backend on the host frozen with SIGSTOP turns it 503 `hung`.

use std::{
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use health_agent_tests::{
    background_requests, docker, free_port, get, newest, require_root, succeed, wait_health_at,
    wait_hung_at, workspace, Fixture,
};

const WAIT: Duration = Duration::from_secs(30);
const MANIFEST: &str = "deploy/kubernetes/health-agent.yaml";

/// The container, removed on drop (its logs printed first, for a failed assertion).
struct Agent {
    name: String,
}

impl Drop for Agent {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let logs = Command::new("docker").args(["logs", &self.name]).output();
            if let Ok(out) = logs {
                eprintln!(
                    "agent container logs:\n{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
        let _ = Command::new("docker")
            .args(["rm", "-f", &self.name])
            .output();
    }
}

/// The image the manifest names, which `cargo xtask image` tags.
fn manifest_image() -> String {
    let manifest = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(MANIFEST),
    )
    .expect("the DaemonSet manifest");
    manifest
        .lines()
        .find_map(|l| l.trim().strip_prefix("image: "))
        .expect("the manifest names an image")
        .trim()
        .to_owned()
}

/// An image built before the agent's last source change would test old code.
fn assert_newer_than_sources(image: &str) {
    let built: u64 = docker(&[
        "image",
        "inspect",
        "-f",
        "{{index .Config.Labels \"health-agent.built-unix\"}}",
        image,
    ])
    .parse()
    .unwrap_or_else(|_| panic!("{image} has no build time label: run `cargo xtask image`"));
    let root = workspace();
    let sources = ["health-agent", "health-common", "health-agent-ebpf"]
        .iter()
        .map(|c| {
            newest(&root.join(c).join("src"))
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs())
        })
        .max()
        .unwrap_or(0);
    assert!(
        built >= sources,
        "{image} is older than the agent's sources: run `cargo xtask image`"
    );
}

#[test]
fn the_image_runs_as_the_daemonset_asks_and_turns_503_for_a_frozen_host_backend() {
    require_root();
    let image = manifest_image();
    assert_eq!(
        image,
        format!("health-agent:{}", env!("CARGO_PKG_VERSION")),
        "{MANIFEST} names the image `cargo xtask image` builds"
    );
    let inspect = Command::new("docker")
        .args(["image", "inspect", "-f", "{{.Size}} {{.Created}}", &image])
        .output()
        .expect("running docker");
    assert!(
        inspect.status.success(),
        "no image {image}: run `cargo xtask image` (cargo xtask test does)"
    );
    println!(
        "image {image}: {}",
        String::from_utf8_lossy(&inspect.stdout).trim()
    );
    assert_newer_than_sources(&image);

    // The backend on the host, in the host's network namespace (hostNetwork: true).
    let fixture = Fixture::start_with("normal", &["--backlog", "128"]);
    let listen = free_port();
    let config = tempfile::tempdir().expect("tempdir");
    // The ConfigMap, with ports this test picked free (tests run in parallel on the host network).
    std::fs::write(
        config.path().join("health-agent.toml"),
        format!(
            "[server]\nlisten = \"127.0.0.1:{listen}\"\n[web]\nport = {}\nprobe_path = \"/\"\n",
            fixture.port
        ),
    )
    .expect("writing the config");
    // DirectoryOrCreate, as the kubelet does for the netns hostPath.
    std::fs::create_dir_all("/var/run/netns").expect("/var/run/netns");
    // HostToContainer propagation (rslave) needs the host's netns directory on a shared
    // mount. A host with systemd has / shared; this one need not, so make it what `ip netns`
    // makes it the first time it runs: a shared bind mount of itself.
    if !is_mount_point("/var/run/netns") {
        for args in [
            &["--bind", "/var/run/netns", "/var/run/netns"][..],
            &["--make-shared", "/var/run/netns"][..],
        ] {
            succeed(Command::new("mount").args(args));
        }
    }

    let name = format!("ha-test-image-{}", std::process::id());
    let config_mount = format!("{}:/etc/health-agent:ro", config.path().display());
    // The drain's hostPaths (DirectoryOrCreate), here directories of this test's own.
    let control = tempfile::tempdir().expect("tempdir");
    let state = tempfile::tempdir().expect("tempdir");
    let control_mount = format!("{}:/run/health-agent", control.path().display());
    let state_mount = format!("{}:/var/lib/health-agent", state.path().display());
    #[rustfmt::skip]
    let args: Vec<&str> = vec![
        "run", "--detach", "--name", &name,
        // hostNetwork: true / hostPID: true
        "--network", "host",
        "--pid", "host",
        // securityContext
        "--user", "0:0",                                       // runAsUser: 0
        "--security-opt", "no-new-privileges",                 // allowPrivilegeEscalation: false
        "--read-only",                                         // readOnlyRootFilesystem: true
        "--cap-drop", "ALL",                                   // capabilities.drop: [ALL]
        "--cap-add", "SYS_PTRACE", "--cap-add", "SYS_ADMIN",   // capabilities.add, and below
        // seccompProfile: RuntimeDefault: no flag, Docker's default profile
        "--security-opt", "apparmor=unconfined",               // appArmorProfile: Unconfined
        // env
        "--env", "HEALTH_AGENT_LOG=info",
        // resources.limits.memory: 128Mi; requests.cpu: 20m as CPU shares (20/1000 of 1024)
        "--memory", "128m", "--cpu-shares", "20",
        // terminationGracePeriodSeconds: 20
        "--stop-timeout", "20",
        // volumeMounts
        "--volume", &config_mount,
        "--volume", "/sys/kernel/btf:/sys/kernel/btf:ro",
        "--volume", "/sys/kernel/tracing:/sys/kernel/tracing:ro",
        "--volume", "/sys/kernel/debug:/sys/kernel/debug:ro",
        "--volume", "/sys/fs/cgroup:/sys/fs/cgroup:ro",
        "--volume", "/run:/host/run:ro",                        // the host's /run, for Docker's socket
        "--volume", "/var/run/netns:/var/run/netns:ro,rslave",   // mountPropagation: HostToContainer
        "--volume", &control_mount,
        "--volume", &state_mount,
        &image,
        // args
        "--config", "/etc/health-agent/health-agent.toml", "serve",
    ];
    let _agent = Agent { name: name.clone() };
    let started = Instant::now();
    let with_bpf: Vec<&str> = {
        let at = args
            .iter()
            .position(|a| *a == "SYS_ADMIN")
            .expect("the cap-adds")
            + 1;
        let mut with = args.clone();
        with.splice(at..at, ["--cap-add", "BPF", "--cap-add", "PERFMON"]);
        with
    };
    let run = Command::new("docker")
        .args(&with_bpf)
        .output()
        .expect("running docker");
    let mut want_caps = (1u64 << 19) | (1 << 21) | (1 << 38) | (1 << 39);
    if !run.status.success() {
        let err = String::from_utf8_lossy(&run.stderr);
        // Debian 12's Docker 20.10 predates CAP_BPF and CAP_PERFMON and refuses their names. The
        // kernel (since 5.8) grants what they allow to CAP_SYS_ADMIN as well, which the DaemonSet
        // asks for too: the nearest Docker can do, and the same powers.
        assert!(
            err.contains("unknown capability: \"CAP_BPF\""),
            "docker run failed: {err}"
        );
        println!("image: this Docker refuses BPF and PERFMON ({}); running with SYS_ADMIN and SYS_PTRACE, which grant the same", err.lines().next().unwrap_or_default().trim());
        let _ = Command::new("docker").args(["rm", "-f", &name]).output();
        docker(&args);
        want_caps = (1 << 19) | (1 << 21);
    }
    let pid = docker(&["inspect", "-f", "{{.State.Pid}}", &name]);
    let status =
        std::fs::read_to_string(format!("/proc/{pid}/status")).expect("the agent's status");
    let cap_eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .map(|hex| u64::from_str_radix(hex.trim(), 16).expect("hex"))
        .expect("CapEff");
    println!("image: the agent's CapEff {cap_eff:016x}");
    assert_eq!(cap_eff, want_caps, "exactly the capabilities asked for");

    for _ in 0..5 {
        let _ = get(fixture.port, "/");
    }
    // The answer programs reach the host's cgroup hierarchy from the container's own cgroup
    // namespace (through the host's init: hostPID), and read the host backend's 200s.
    let (code, body) = wait_health_at(
        listen,
        WAIT,
        "200 with the kernel view active and the answers' status visible",
        |c, b| {
            // Real traffic all along (not the probe's path, "/": its answers are left out),
            // counted in the programs' counting windows (the first as the agent starts, then
            // every 15 s).
            let _ = get(fixture.port, "/orders");
            c == 200
                && b["details"]["web"]["kernel"]["state"] == "active"
                && b["details"]["web"]["figures"]["requests_per_second"].as_f64() > Some(0.0)
                && b["details"]["web"]["answers"]["status_visible"] == true
                && b["details"]["web"]["answers"]["total_by_class"]["2xx"].as_u64() > Some(0)
        },
    );
    println!(
        "image: /health {code} {} after {:.1} s, kernel view {}, figures {}, by class {}",
        body["status"],
        started.elapsed().as_secs_f64(),
        body["details"]["web"]["kernel"]["state"],
        body["details"]["web"]["figures"],
        body["details"]["web"]["answers"]["total_by_class"]
    );
    let (code, _) = get(listen, "/livez").expect("/livez");
    assert_eq!(code, 200, "the liveness probe's path");

    // Root in the pod drains through the socket on the read-only root's one writable path; the
    // state lands on its volume.
    let socket = control.path().join("control.sock");
    let mode = std::fs::metadata(&socket)
        .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o777)
        .expect("the control socket on its volume");
    assert_eq!(mode, 0o600, "root only");
    let config_arg = "/etc/health-agent/health-agent.toml";
    let said = docker(&[
        "exec",
        &name,
        "/usr/bin/health-agent",
        "--config",
        config_arg,
        "drain",
        "--quiet",
        "500ms",
        "--timeout",
        "10s",
    ]);
    assert!(said.contains("drained in "), "{said}");
    assert!(
        state.path().join("drain.json").exists(),
        "the drain kept on its volume"
    );
    wait_health_at(listen, WAIT, "503 draining", |c, b| {
        c == 503 && b["status"] == "draining"
    });
    docker(&[
        "exec",
        &name,
        "/usr/bin/health-agent",
        "--config",
        config_arg,
        "undrain",
    ]);
    wait_health_at(listen, WAIT, "200 after undrain", |c, _| c == 200);
    println!("image: {said}");

    fixture.signal(libc::SIGSTOP);
    let frozen = Instant::now();
    let stuck = background_requests(fixture.port, 4, Duration::from_secs(6));
    wait_hung_at(listen, WAIT, "image", frozen);
    fixture.signal(libc::SIGCONT);
    for t in stuck {
        let _ = t.join();
    }

    let stop = Instant::now();
    docker(&["stop", &name]);
    let exit = docker(&["inspect", "-f", "{{.State.ExitCode}}", &name]);
    println!(
        "image: docker stop took {:.1} s, exit code {exit}",
        stop.elapsed().as_secs_f64()
    );
    assert_eq!(exit, "0", "the agent exits cleanly on SIGTERM");
}

/// Whether `path` is itself a mount point (a line of /proc/self/mountinfo mounts it).
fn is_mount_point(path: &str) -> bool {
    let real = std::fs::canonicalize(path).unwrap_or_else(|_| path.into());
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .any(|mount| std::path::Path::new(mount) == real)
}
