//! The Debian packages the tests and the bench use, installed when missing.

use std::{fs, path::PathBuf, process::Command};

use anyhow::{ensure, Context, Result};

use crate::cmd::{self, Outcome};

/// For the integration tests and the bench: the backends (Puma and its PostgreSQL driver), the
/// load generator, `ss`, `curl`. The demo needs none of them.
const PACKAGES: &[&str] = &[
    "docker.io",
    // The container tests' second engine: rootful Podman's Docker-compatible API socket
    // (`cargo xtask services` writes its containers.conf and starts `podman system service`).
    "podman",
    // The third: containerd's own API, on its own socket as on a Kubernetes node (dockerd runs
    // another containerd of its own, under /run/docker); `ctr` drives it in the tests.
    "containerd",
    "nginx-light",
    "puma",
    "ruby-pg",
    "postgresql",
    "wrk",
    "caddy",
    "haproxy",
    "iproute2",
    // The deploy checks' offline namespace counts what tries to leave it (xtask/src/deploy.rs).
    "nftables",
    "curl",
    // The database TLS tests: a TLS-only Redis, certificates made at test time, system roots.
    "redis-server",
    "openssl",
    "ca-certificates",
    // tests/tests/prometheus.rs: a real Prometheus scrapes agents and evaluates the shipped
    // rules; promtool checks /metrics, deploy/prometheus' rules and their unit tests (the
    // deploy stage). The tests run their own server on their own ports.
    "prometheus",
    // The README's first-day walk-through pipes /health through it (tests/tests/first_day.rs).
    "jq",
    // The service: `systemd-analyze verify` of the unit, a venv for the deploy-file linters.
    "systemd",
    "python3-venv",
    // deploy/drain/rolling-restart.sh, checked as POSIX sh.
    "shellcheck",
    // tests/tests/systemd.rs: a Debian root file system, booted with systemd-nspawn; bpftool
    // sees what the agent left in the kernel after `systemctl stop`.
    "mmdebstrap",
    "systemd-container",
    "bpftool",
    // cargo xtask image: the static (musl) agent; ring's C parts need musl-gcc.
    "musl-tools",
    // tests/tests/old_kernel.rs and arm64_kernel.rs: Debian's 6.1 kernels booted under qemu
    // (TCG), with busybox as the guest's /bin/sh (the agent's restart_command runs under it;
    // the arm64 guest's busybox is unpacked from busybox-static:arm64, see test_roots).
    "qemu-system-x86",
    "qemu-system-arm",
    "busybox-static",
    // cargo xtask dist: the aarch64 static build's C parts (ring, the allocator) and its
    // linker, musl's headers for aarch64 with the `aarch64-linux-musl-gcc` wrapper over that gcc
    // (a foreign-architecture package: setup adds arm64 to dpkg first), and the package checks
    // (rpmbuild, rpmlint, lintian).
    "gcc-aarch64-linux-gnu",
    "musl-dev:arm64",
    "rpm",
    "rpmlint",
    "lintian",
];

fn installed(package: &str) -> bool {
    cmd::stdout(Command::new("dpkg-query").args(["-W", "-f=${Status}", package]))
        .is_ok_and(|status| status.trim() == "install ok installed")
}

pub(super) fn packages() -> Result<Outcome> {
    let missing: Vec<&str> = PACKAGES.iter().copied().filter(|p| !installed(p)).collect();
    if missing.is_empty() {
        return Ok(Outcome::Ok("already present"));
    }
    println!("setup: debian packages: installing {}", missing.join(" "));
    ensure!(
        cmd::is_root(),
        "installing packages needs root — run: sudo cargo xtask setup"
    );
    let apt_get = || {
        let mut apt = Command::new("apt-get");
        apt.env("DEBIAN_FRONTEND", "noninteractive");
        apt
    };
    for arch in missing
        .iter()
        .filter_map(|p| p.split_once(':').map(|(_, arch)| arch))
    {
        let foreign = cmd::stdout(Command::new("dpkg").arg("--print-foreign-architectures"))?;
        if !foreign.lines().any(|a| a.trim() == arch) {
            cmd::run(Command::new("dpkg").args(["--add-architecture", arch]))?;
        }
    }
    // qemu's packages share qemu-system-common with qemu-utils: when the machine's qemu-utils
    // came from backports (it breaks the stable qemu-system-common), theirs come from there too.
    let backports = qemu_backports()?;
    let (qemu, rest): (Vec<&str>, Vec<&str>) = missing
        .iter()
        .partition(|p| backports.is_some() && p.starts_with("qemu-"));
    cmd::run(apt_get().arg("update"))
        .context("apt-get update failed — check the network and /etc/apt/sources.list*")?;
    if !rest.is_empty() {
        cmd::run(apt_get().args(["install", "-y"]).args(&rest))
            .context("apt-get install failed — see apt's message above")?;
    }
    if let Some(suite) = backports.filter(|_| !qemu.is_empty()) {
        cmd::run(apt_get().args(["install", "-y", "-t", &suite]).args(&qemu)).with_context(
            || format!("apt-get install -t {suite} failed — see apt's message above"),
        )?;
    }
    Ok(Outcome::Done("installed"))
}

/// Where the installed qemu-utils came from, when it is a backport (`1:10.0.2+…~bpo12+1`): the
/// backports suite, whose source this adds to apt (`/etc/apt/sources.list.d/`) when missing.
fn qemu_backports() -> Result<Option<String>> {
    let version = Command::new("dpkg-query")
        .args(["-W", "-f", "${Version}", "qemu-utils"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    if !version.contains("~bpo") {
        return Ok(None);
    }
    let release = fs::read_to_string("/etc/os-release").context("reading /etc/os-release")?;
    let codename = release
        .lines()
        .find_map(|l| l.strip_prefix("VERSION_CODENAME="))
        .map(|c| c.trim_matches('"').to_owned())
        .context("/etc/os-release names no VERSION_CODENAME")?;
    let suite = format!("{codename}-backports");
    let listed = fs::read_dir("/etc/apt/sources.list.d")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .chain([PathBuf::from("/etc/apt/sources.list")])
        .any(|p| fs::read_to_string(p).is_ok_and(|t| t.contains(&suite)));
    if !listed {
        let source = format!(
            "Types: deb\nURIs: http://deb.debian.org/debian\nSuites: {suite}\nComponents: main\n\
             Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n"
        );
        fs::write(
            "/etc/apt/sources.list.d/health-agent-backports.sources",
            source,
        )
        .context("adding the backports source")?;
        println!("setup: qemu-utils {version} is a backport: qemu's packages come from {suite}");
    }
    Ok(Some(suite))
}
