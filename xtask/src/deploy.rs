//! `cargo xtask test`'s deploy stage: each deploy/ file through its own validator, where nothing
//! can leave the machine.
//!
//! A validator may do more than parse: `caddy validate` provisions the config, and that starts
//! the active health checks against the example's upstreams (10.0.0.11–13, someone else's
//! network wherever CI runs). So every validator runs in a network namespace of its own
//! ([`offline`]) whose only way out is a counter that drops what it counts; the Caddyfile is
//! validated as a copy whose upstreams are moved onto loopback ([`loopback_upstreams`]); and the
//! stage fails if a packet tried to leave or a validator's output names a dial to an address
//! outside ([`dial_out`]). The shipped examples keep their realistic addresses.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context, Result};

use crate::{cmd, setup};

/// The Kubernetes manifests, validated each alone and checked together (`kubectl apply -f
/// deploy/kubernetes/` applies them all).
pub const KUBERNETES: &[&str] = &[
    "deploy/kubernetes/health-agent.yaml",
    "deploy/kubernetes/saturation-hpa.yaml",
    "deploy/kubernetes/drain-prestop.yaml",
];

/// Each deploy/ file through its own validator, offline; warnings fail too.
pub fn run() -> Result<()> {
    let deploy = cmd::root().join("deploy");
    let scratch = Scratch::new("deploy")?;

    let caddyfile = scratch.0.join("Caddyfile");
    std::fs::write(
        &caddyfile,
        loopback_upstreams(&std::fs::read_to_string(deploy.join("caddy/Caddyfile"))?),
    )?;

    let mut checks: Vec<(String, Vec<PathBuf>)> = Vec::new();
    let arg = |s: &str| PathBuf::from(s);
    checks.push((
        "cfn-lint".into(),
        vec![
            setup::pip_tool("cfn-lint")?,
            deploy.join("aws/cloudformation.yaml"),
        ],
    ));
    let mut validate_k8s = vec![
        setup::pip_tool("kubernetes-validate")?,
        arg("--strict"),
        arg("--quiet"),
    ];
    validate_k8s.extend(KUBERNETES.iter().map(|f| cmd::root().join(f)));
    checks.push(("kubernetes-validate".into(), validate_k8s));
    checks.push((
        "shellcheck".into(),
        vec![
            arg("shellcheck"),
            arg("--shell=sh"),
            arg("--severity=style"),
            deploy.join("drain/rolling-restart.sh"),
        ],
    ));
    checks.push((
        "haproxy".into(),
        vec![
            arg("haproxy"),
            arg("-c"),
            arg("-f"),
            deploy.join("haproxy/haproxy.cfg"),
        ],
    ));
    checks.push(("caddy".into(), caddy_validate(&caddyfile)));
    let prometheus = deploy.join("prometheus");
    for (verb, file) in [
        ("check", "health-agent.rules.yml"),
        ("test", "health-agent.rules.test.yml"),
    ] {
        checks.push((
            format!("promtool {verb} rules"),
            vec![
                arg("promtool"),
                arg(verb),
                arg("rules"),
                prometheus.join(file),
            ],
        ));
    }

    for (name, argv) in checks {
        validate(&name, &argv)?;
    }
    grafana_dashboard(&deploy.join("grafana/health-agent.json"))?;
    let objects = crate::manifests::check(cmd::root(), KUBERNETES)?;
    eprintln!(
        "kubernetes manifests applied together: {objects} objects in {} files, none defined twice",
        KUBERNETES.len()
    );
    drain_dropin(&deploy.join("systemd/drain-before-stop.conf"), &scratch.0)
}

/// The Grafana dashboard parses, and every panel queries something (tests/tests/prometheus.rs
/// runs the queries against a live Prometheus).
fn grafana_dashboard(path: &Path) -> Result<()> {
    let text = std::fs::read_to_string(path).with_context(|| format!("{}", path.display()))?;
    let dash: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))?;
    let panels = dash["panels"].as_array().map_or(&[][..], Vec::as_slice);
    if panels.is_empty() {
        bail!("{}: no panels", path.display());
    }
    for p in panels {
        let exprs = p["targets"].as_array().map_or(0, |t| {
            t.iter()
                .filter(|t| t["expr"].as_str().is_some_and(|e| !e.is_empty()))
                .count()
        });
        if exprs == 0 {
            bail!("{}: panel {} has no query", path.display(), p["title"]);
        }
    }
    println!(
        "grafana: {} parses, {} panels",
        path.display(),
        panels.len()
    );
    Ok(())
}

/// `caddy validate` of a Caddyfile.
fn caddy_validate(caddyfile: &Path) -> Vec<PathBuf> {
    ["caddy", "validate", "--adapter", "caddyfile", "--config"]
        .into_iter()
        .map(PathBuf::from)
        .chain([caddyfile.to_path_buf()])
        .collect()
}

/// Runs `argv` [`offline`], prints what it said, and fails if it failed, if a packet tried to
/// leave, or if [`dial_out`] finds an attempt to reach an address off the machine in its output.
fn validate(name: &str, argv: &[PathBuf]) -> Result<String> {
    let mut command = offline(argv);
    let shown: Vec<_> = argv.iter().map(|a| a.display().to_string()).collect();
    eprintln!("+ (offline) {}", shown.join(" "));
    let out = command
        .stdin(std::process::Stdio::null())
        .output()
        .with_context(|| format!("could not start {name} (unshare, from util-linux)"))?;
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    print!("{said}");
    let fix = "the deploy checks may reach loopback only; point the checked copy's addresses \
               at 127.0.0.0/8";
    match left(&said) {
        Some(0) => {}
        Some(n) => bail!("{name}: {n} packets tried to leave the machine ({fix})"),
        None => bail!("{name}: the offline namespace was not set up (ip and nft, as root)"),
    }
    if let Some(line) = dial_out(&said) {
        bail!("{name} tried to reach an address outside the machine ({fix}):\n{line}");
    }
    if !out.status.success() {
        bail!("{name} failed ({})", out.status);
    }
    Ok(said)
}

/// The script [`offline`] runs: loopback up, and a way out that leads nowhere (a default route,
/// IPv4 and IPv6, into a veth pair whose two ends are both in the namespace) where an nftables
/// rule counts and drops every TCP, UDP and ICMP packet before it is sent. Without a route a
/// connect fails before any hook sees it; with this one every attempt is counted, even one the
/// tool never reports. The validator gets at most 120 s; the count is the last line.
const OFFLINE: &str = r#"set -e
ip link set lo up
ip link add out0 type veth peer name out1
ip link set out0 addrgenmode none
ip link set out1 addrgenmode none
ip link set out1 up
ip link set out0 up
ip addr add 192.0.2.1/24 dev out0
ip route add default dev out0
ip -6 addr add 2001:db8::1/64 dev out0 nodad
ip -6 route add default dev out0
nft add table inet guard
nft add chain inet guard out '{ type filter hook output priority 0; }'
nft add rule inet guard out oifname out0 meta l4proto '{ tcp, udp, icmp }' counter drop
set +e
timeout 120 "$@"
rc=$?
echo "offline: $(nft list chain inet guard out | sed -n 's/.*packets \([0-9]*\).*/\1/p') packets tried to leave" >&2
exit $rc
"#;

/// `argv` in a new network namespace of its own ([`OFFLINE`]): loopback, and a route out that
/// ends in a counter. Nothing sent there leaves the namespace.
fn offline(argv: &[PathBuf]) -> Command {
    let mut c = Command::new("unshare");
    c.args(["--net", "--", "sh", "-c", OFFLINE, "offline"])
        .args(argv);
    c
}

/// How many packets tried to leave, from the count [`OFFLINE`] prints last.
fn left(output: &str) -> Option<u64> {
    output
        .lines()
        .rev()
        .find_map(|l| {
            l.strip_prefix("offline: ")?
                .strip_suffix(" packets tried to leave")
        })
        .and_then(|n| n.parse().ok())
}

/// The first line of a validator's output that says it tried to reach an address off the
/// machine: in a namespace with loopback only, a connection to another address ends in "network
/// is unreachable" and a name lookup fails; and a request cut short before its dial (caddy
/// cancels its health checks when validation ends: "context canceled") still names its host. A
/// refused or cancelled connection on loopback is no such line.
pub fn dial_out(output: &str) -> Option<&str> {
    const SIGNS: &[&str] = &[
        "network is unreachable",
        "no route to host",
        "no such host",
        "temporary failure in name resolution",
        "name or service not known",
        "could not resolve host",
    ];
    output.lines().find(|line| {
        let lower = line.to_ascii_lowercase();
        SIGNS.iter().any(|sign| lower.contains(sign)) || dialed_hosts(line).any(|h| !loopback(h))
    })
}

/// The hosts a log line says were dialed or requested: after `http://`, `https://`, `dial tcp `
/// and in a JSON `"host":"…"` field.
fn dialed_hosts(line: &str) -> impl Iterator<Item = &str> {
    ["http://", "https://", "dial tcp ", "\"host\":\""]
        .into_iter()
        .flat_map(move |marker| {
            line.match_indices(marker)
                .map(move |(i, _)| i + marker.len())
        })
        .map(move |start| {
            let rest = &line[start..];
            let end = if rest.starts_with('[') {
                rest.find(']').map_or(rest.len(), |i| i + 1)
            } else {
                rest.find([':', '/', '"', ' ', '\\']).unwrap_or(rest.len())
            };
            &rest[..end]
        })
}

fn loopback(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// A Caddyfile with every IPv4 address outside 127.0.0.0/8 moved onto loopback, its last three
/// octets kept (10.0.0.11:80 → 127.0.0.11:80): what `caddy validate` provisions, active health
/// checks included, then dials only this machine. Everything else, syntax mistakes included, is
/// checked as written.
pub fn loopback_upstreams(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find(|c: char| c.is_ascii_digit()) {
        let (before, from) = rest.split_at(start);
        out.push_str(before);
        let end = from
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(from.len());
        let (token, after) = from.split_at(end);
        // A digit right after a letter is part of a word (`web1`), not an address.
        let in_word = out.ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_');
        match ipv4(token.trim_end_matches('.')) {
            Some(octets) if !in_word && octets[0] != 127 => {
                out.push_str(&format!("127.{}.{}.{}", octets[1], octets[2], octets[3]));
                out.push_str(&token[token.trim_end_matches('.').len()..]);
            }
            _ => out.push_str(token),
        }
        rest = after;
    }
    out.push_str(rest);
    out
}

fn ipv4(token: &str) -> Option<[u8; 4]> {
    let parts: Vec<u8> = token
        .split('.')
        .map(|p| p.parse().ok())
        .collect::<Option<_>>()?;
    parts.try_into().ok()
}

/// The app unit's drain drop-in, under `systemd-analyze verify` on a stand-in app unit (it
/// exits 0 on unknown keys, so anything it says fails the check).
fn drain_dropin(dropin: &Path, scratch: &Path) -> Result<()> {
    let dir = scratch.join("units");
    let unit_dir = dir.join("app-stand-in.service.d");
    std::fs::create_dir_all(&unit_dir)?;
    std::fs::write(
        dir.join("app-stand-in.service"),
        "[Service]\nExecStart=/bin/true\n",
    )?;
    std::fs::copy(dropin, unit_dir.join("drain.conf"))?;
    let mut verify = offline(&[
        "systemd-analyze".into(),
        "verify".into(),
        "app-stand-in.service".into(),
    ]);
    let out = verify
        .env("SYSTEMD_UNIT_PATH", format!("{}:", dir.display()))
        .current_dir(&dir)
        .output()?;
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if left(&said) != Some(0) {
        bail!("systemd-analyze verify, offline: {said}");
    }
    let said: Vec<&str> = said
        .lines()
        .filter(|l| !l.starts_with("offline: "))
        .collect();
    if !out.status.success() || !said.is_empty() {
        bail!(
            "systemd-analyze verify of {}: {}",
            dropin.display(),
            said.join("\n")
        );
    }
    println!("{}: systemd-analyze verify clean", dropin.display());
    Ok(())
}

/// A directory under the system's temp dir, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(what: &str) -> Result<Self> {
        let dir = std::env::temp_dir().join(format!("health-agent-{what}-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        Ok(Self(dir))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstreams_move_onto_loopback_and_nothing_else_changes() {
        let text = "# 10.0.0.1 in a comment moves too\n:80 {\n\treverse_proxy 10.0.0.11:80 \
                    192.168.1.2 127.0.0.1:9000 [::1]:8080 {\n\t\thealth_port 8080\n\t\t\
                    health_interval 5s\n\t}\n}\nserver web1 10.1.2.3:80.\nversion 1.2.3\n";
        assert_eq!(
            loopback_upstreams(text),
            "# 127.0.0.1 in a comment moves too\n:80 {\n\treverse_proxy 127.0.0.11:80 \
             127.168.1.2 127.0.0.1:9000 [::1]:8080 {\n\t\thealth_port 8080\n\t\t\
             health_interval 5s\n\t}\n}\nserver web1 127.1.2.3:80.\nversion 1.2.3\n"
        );
    }

    #[test]
    fn a_dial_out_is_named_and_a_refused_loopback_is_not() {
        let caddy = r#"{"level":"info","logger":"http.handlers.reverse_proxy.health_checker.active","msg":"HTTP request failed","host":"10.0.0.1:8080","error":"Get \"http://10.0.0.1:8080/health\": dial tcp 10.0.0.1:8080: connect: network is unreachable"}"#;
        assert_eq!(
            dial_out(&format!("Valid configuration\n{caddy}\n")),
            Some(caddy)
        );
        assert_eq!(
            dial_out("lookup db.example.com: Temporary failure in name resolution"),
            Some("lookup db.example.com: Temporary failure in name resolution")
        );
        // Cancelled before its dial: the host still tells.
        let cancelled = r#"{"msg":"HTTP request failed","host":"10.0.0.13:8080","error":"Get \"http://10.0.0.13:8080/health\": context canceled"}"#;
        assert_eq!(dial_out(cancelled), Some(cancelled));
        let refused = r#"{"msg":"HTTP request failed","host":"127.0.0.11:8080","error":"dial tcp 127.0.0.11:8080: connect: connection refused"}"#;
        let ipv6 = r#"{"msg":"HTTP request failed","host":"[::1]:8080","error":"Get \"http://[::1]:8080/health\": context canceled"}"#;
        assert_eq!(
            dial_out(&format!("{refused}\n{ipv6}\nValid configuration\n")),
            None
        );
    }

    fn require_root() {
        assert!(
            nix_is_root(),
            "run as root: the guard needs a network namespace of its own"
        );
    }

    /// The namespace itself: a TCP connect and a UDP datagram to 10.0.0.1 are counted (and
    /// dropped there), a refused connection on loopback is not.
    #[test]
    fn the_offline_namespace_counts_what_tries_to_leave() {
        require_root();
        let sh = |script: &str| -> Vec<PathBuf> { vec!["bash".into(), "-c".into(), script.into()] };
        for script in [
            "timeout 1 bash -c 'echo > /dev/tcp/10.0.0.1/80'; true",
            "echo > /dev/udp/10.0.0.1/53",
        ] {
            let err = validate("probe", &sh(script))
                .expect_err(script)
                .to_string();
            assert!(
                err.contains("packets tried to leave the machine"),
                "{script}: {err}"
            );
        }
        let said = validate(
            "probe",
            &sh("bash -c 'echo > /dev/tcp/127.0.0.1/9' 2>/dev/null; true"),
        )
        .expect("a refused connection on loopback is no dial out");
        assert_eq!(left(&said), Some(0), "{said}");
    }

    /// The guard at work on a real `caddy validate` offline (root, caddy, ip and nft, as CI
    /// has): the shipped Caddyfile's loopback copy passes, its health checks dialing only
    /// loopback; the same copy with an upstream at 10.0.0.1 is caught; a broken one still fails.
    /// Caddy cancels its health checks when validation ends, mostly before their first dial:
    /// with 20 validations, none dialed in 1 run of 25 on an idle machine (about one validation
    /// in seven dials), so the dial out is given 80 to happen.
    #[test]
    fn caddy_validate_offline_catches_a_dial_out() {
        require_root();
        let scratch = Scratch::new("deploy-guard").expect("scratch dir");
        let shipped = std::fs::read_to_string(cmd::root().join("deploy/caddy/Caddyfile"))
            .expect("deploy/caddy/Caddyfile");
        let copy = loopback_upstreams(&shipped);
        let file = |name: &str, text: &str| {
            let path = scratch.0.join(name);
            std::fs::write(&path, text).expect("writing a Caddyfile");
            path
        };

        let ok = file("ok.Caddyfile", &copy);
        for _ in 0..3 {
            let said =
                validate("caddy", &caddy_validate(&ok)).expect("the loopback copy validates");
            assert!(said.contains("Valid configuration"), "{said}");
        }

        let leaky = copy.replacen("reverse_proxy ", "reverse_proxy 10.0.0.1:80 ", 1);
        assert_ne!(
            leaky, copy,
            "the Caddyfile has no reverse_proxy line to add to"
        );
        let leaky = file("leaky.Caddyfile", &leaky);
        let caught = (0..80).find_map(|_| validate("caddy", &caddy_validate(&leaky)).err());
        let err = caught
            .expect("80 validations dialing 10.0.0.1 passed the guard")
            .to_string();
        assert!(
            err.contains("packets tried to leave") || err.contains("10.0.0.1"),
            "{err}"
        );

        let broken = file(
            "broken.Caddyfile",
            &copy.replacen("lb_policy", "lb_polcy", 1),
        );
        let err = validate("caddy", &caddy_validate(&broken))
            .expect_err("a broken Caddyfile passed")
            .to_string();
        assert!(err.contains("caddy failed"), "{err}");
    }

    #[allow(unsafe_code)]
    fn nix_is_root() -> bool {
        // SAFETY: geteuid has no preconditions and cannot fail.
        unsafe { libc::geteuid() == 0 }
    }
}
