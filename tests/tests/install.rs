//! docs/install.md as a reader runs it. Every release file it names is one `cargo xtask dist`
//! makes for this version. Its checksum command passes on the release's files and refuses one
//! changed by a byte; its tarball block installs the agent on a booted Debian root (as on any
//! Linux with systemd) and the unit serves; its Amazon Linux 2023 x86_64 command installs the
//! .rpm with dnf (on a root with Debian's dnf and rpm) and the unit it then starts serves. The
//! files are dist's when it has made them, else stand-ins (`health_agent_tests::release`).

use std::{fs, path::Path, time::Duration};

use health_agent_tests::{
    free_port, get, markdown::fenced, nspawn, release, require_root, wait_until, workspace, Machine,
};

const VERSION: &str = env!("CARGO_PKG_VERSION");

fn page() -> String {
    fs::read_to_string(workspace().join("docs/install.md")).expect("docs/install.md")
}

/// The names dist gives this version's files, `$arch` standing for either architecture where a
/// command computes it.
fn release_names() -> Vec<String> {
    let mut names = Vec::new();
    for (arch, debarch) in [("x86_64", "amd64"), ("aarch64", "arm64")] {
        names.push(format!("health-agent-{VERSION}-1.{arch}.rpm"));
        names.push(format!("health-agent_{VERSION}-1_{debarch}.deb"));
        names.push(format!("health-agent-{VERSION}-{arch}.tar.gz"));
        names.push(format!("health-agent-{VERSION}-{arch}"));
        names.push(format!("health-agent-{VERSION}-oci-{debarch}.tar"));
        names.push(format!("health-agent:{VERSION}-{debarch}"));
    }
    for generic in [
        format!("health-agent-{VERSION}-$arch.tar.gz"),
        format!("health-agent-{VERSION}-$arch"),
        format!("health-agent-{VERSION}-<arch>"),
        format!("health-agent-{VERSION}-oci-$arch.tar"),
        format!("health-agent:{VERSION}-$arch"),
        format!("health-agent:{VERSION}"),
    ] {
        names.push(generic);
    }
    names
}

/// Every `health-agent-<digit>…` or `health-agent_<digit>…` name on the page, as far as a
/// file name's characters go.
fn named_files(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for prefix in ["health-agent-", "health-agent_", "health-agent:"] {
        for (at, _) in text.match_indices(prefix) {
            let rest = &text[at + prefix.len()..];
            if !rest.starts_with(|c: char| c.is_ascii_digit()) {
                continue;
            }
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || "._-$<>".contains(c)))
                .unwrap_or(rest.len());
            let name = format!("{prefix}{}", rest[..end].trim_end_matches('.'));
            out.push(name);
        }
    }
    out
}

#[test]
fn install_md_names_the_release_files_of_this_version() {
    let text = page();
    let names = named_files(&text);
    assert!(names.len() >= 20, "only {names:?}");
    let known = release_names();
    for name in &names {
        assert!(
            known.contains(name),
            "docs/install.md names {name}, which is not a file of release {VERSION}: {known:?}"
        );
    }
    for file in [
        format!("health-agent-{VERSION}-1.x86_64.rpm"),
        format!("health-agent-{VERSION}-1.aarch64.rpm"),
        format!("health-agent_{VERSION}-1_amd64.deb"),
        format!("health-agent_{VERSION}-1_arm64.deb"),
    ] {
        assert!(names.contains(&file), "docs/install.md never names {file}");
    }
    // dist's own list, when it has run: every concrete name is in its SHA256SUMS.
    if let Ok(sums) = fs::read_to_string(workspace().join("dist/SHA256SUMS")) {
        for name in names.iter().filter(|n| {
            !n.contains('$')
                && !n.contains('<')
                && [".rpm", ".deb", ".tar.gz", ".tar"]
                    .iter()
                    .any(|x| n.ends_with(x))
        }) {
            assert!(
                sums.lines().any(|l| l.ends_with(&format!("  {name}"))),
                "{name} is not in dist/SHA256SUMS"
            );
        }
    }
}

/// The page's ```sh block containing `marker`.
fn block(marker: &str) -> String {
    fenced(&page(), "sh")
        .into_iter()
        .find(|b| b.contains(marker))
        .unwrap_or_else(|| panic!("docs/install.md has no sh block with {marker:?}"))
}

/// The command the table gives for `distribution` on `arch`: the row's last code span.
fn table_command(distribution: &str, arch: &str) -> String {
    let text = page();
    let row = text
        .lines()
        .find(|l| {
            l.starts_with(&format!("| {distribution} |")) && l.contains(&format!("| {arch} |"))
        })
        .unwrap_or_else(|| panic!("docs/install.md has no row for {distribution} on {arch}"));
    // Outside and inside code spans alternate, outside first and last: the last span is the
    // one before the row's end.
    let spans: Vec<&str> = row.split('`').collect();
    spans
        .len()
        .checked_sub(2)
        .filter(|i| i % 2 == 1)
        .map(|i| spans[i].to_string())
        .unwrap_or_else(|| panic!("no command in {row}"))
}

/// `script` run by sh in `dir` inside the machine: exit code and what it printed.
fn sh_in(machine: &Machine, dir: &str, script: &str) -> (i32, String) {
    let out = machine.exec(&["sh", "-c", &format!("cd {dir} && {script}")]);
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// The release's files as a download leaves them: `files` and their `SHA256SUMS`, copied to
/// /root/release in the machine.
fn download(machine: &Machine, files: &[&Path]) {
    let names: Vec<String> = files
        .iter()
        .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    let mut sums = String::new();
    for (file, name) in files.iter().zip(&names) {
        sums.push_str(&format!("{}  {name}\n", release::sha256(file)));
    }
    machine.run(&["mkdir", "-p", "/root/release"]);
    machine.write("/root/release/SHA256SUMS", &sums);
    for (file, name) in files.iter().zip(&names) {
        let at = format!("/proc/{}/root/root/release/{name}", machine.leader());
        fs::copy(file, &at).unwrap_or_else(|e| panic!("copying {name} in: {e}"));
    }
}

/// A drop-in that keeps the installed agent on loopback, on a port of its own: the default
/// 0.0.0.0:8080 would be the host's (the machine shares its network).
fn listen_on_loopback(machine: &Machine) -> u16 {
    let port = free_port();
    machine.run(&["mkdir", "-p", "/etc/health-agent/conf.d"]);
    machine.write(
        "/etc/health-agent/conf.d/90-test.toml",
        &format!("[server]\nlisten = \"127.0.0.1:{port}\"\n"),
    );
    port
}

fn assert_serves(machine: &Machine, port: u16) {
    assert_eq!(
        machine.unit_property("health-agent.service", "ActiveState"),
        "active"
    );
    let (code, body) = wait_until(Duration::from_secs(30), "/health", || {
        get(port, "/health").ok()
    });
    println!("/health {code}: {}", &body[..body.len().min(160)]);
    assert!(body.contains("\"status\""), "{body}");
}

#[test]
fn install_md_checks_and_installs_the_tarball_as_written() {
    require_root();
    let dir = tempfile::tempdir().expect("tempdir");
    let tarball = release::tarball(dir.path());
    println!("artifact: {} ({})", tarball.name(), tarball.origin);
    let machine = Machine::boot(&nspawn::rootfs(), &[]);
    download(&machine, &[&tarball.path]);

    let check = block("sha256sum -c");
    let (code, said) = sh_in(&machine, "/root/release", &check);
    println!("$ {}{said}", check);
    assert_eq!(code, 0, "{said}");
    assert!(said.contains(&format!("{}: OK", tarball.name())), "{said}");
    // One byte changed: FAILED, and a failing exit.
    machine.run(&[
        "sh",
        "-c",
        &format!(
            "cd /root/release && printf x | dd of={} bs=1 seek=1000 conv=notrunc 2>/dev/null",
            tarball.name()
        ),
    ]);
    let (code, said) = sh_in(&machine, "/root/release", &check);
    println!("tampered: {said}");
    assert_ne!(code, 0, "{said}");
    assert!(
        said.contains(&format!("{}: FAILED", tarball.name())),
        "{said}"
    );
    download(&machine, &[&tarball.path]);

    let port = listen_on_loopback(&machine);
    let install = block("tar -xzf");
    let (code, said) = sh_in(&machine, "/root/release", &format!("set -e\n{install}"));
    println!("the tarball block exited {code}: {said}");
    assert_eq!(code, 0, "{said}");
    assert_serves(&machine, port);
}

#[test]
fn install_md_installs_the_rpm_on_amazon_linux_2023_as_written() {
    require_root();
    let dir = tempfile::tempdir().expect("tempdir");
    let rpm = release::rpm(dir.path(), release::ARCH);
    println!("artifact: {} ({})", rpm.name(), rpm.origin);
    let machine = Machine::boot(&nspawn::dnf_rootfs(), &[]);
    let requires = release::requires(&rpm.path);
    let base = (!requires.is_empty()).then(|| release::base_stand_in(dir.path(), &requires));
    let mut files = vec![rpm.path.as_path()];
    files.extend(base.as_deref());
    download(&machine, &files);
    if let Some(base) = &base {
        let name = base.file_name().unwrap().to_string_lossy().into_owned();
        sh_in(
            &machine,
            "/root/release",
            &format!("dnf install -q -y --disablerepo='*' ./{name}"),
        );
    }

    let command = table_command("Amazon Linux 2023", "x86_64");
    assert!(
        command.contains(rpm.name()),
        "{command} installs another file"
    );
    let (code, said) = sh_in(&machine, "/root/release", &command);
    println!("$ {command}\n{said}");
    assert_eq!(code, 0, "{said}");
    let port = listen_on_loopback(&machine);
    machine.run(&["systemctl", "enable", "--now", "health-agent"]);
    assert_serves(&machine, port);
}
