//! The checks that run what `dist` built: the static binary serving `/health` from a root that
//! holds nothing but itself and its config ([`serve`]), and the images loaded into Docker
//! ([`images`]).

use std::{
    fs,
    io::{Read, Write},
    net::{Shutdown, TcpListener, TcpStream},
    path::Path,
    process::{Command, Stdio},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, ensure, Context, Result};
use health_agent_tests::{free_port, Proc};

use super::{check::file_name, oci, roots, Artifacts};
use crate::{cmd, live::get, services};

/// The binary in a directory holding only it and its config, chrooted into in a mount
/// namespace of its own with /proc and /sys mounted (its own view of processes, BTF and
/// tracefs), watching a backend on loopback: `/health` must answer 200 with the kernel view
/// active. No libc, no loader, no /etc, no /tmp: what it needs it carries.
pub fn serve(bin: &Path) -> Result<()> {
    let backend = Backend::start()?;
    let dir = roots::scratch_dir("bare")?;
    let root = dir.join("root");
    fs::create_dir_all(&root)?;
    fs::copy(bin, root.join("health-agent"))?;
    let port = free_port();
    fs::write(
        root.join("health-agent.toml"),
        format!(
            "[server]\nlisten = \"127.0.0.1:{port}\"\n\n[checks]\nboot_grace = \"0s\"\n\n\
             [web]\nport = {}\nprobe_path = \"/\"\n",
            backend.port
        ),
    )?;
    for mount_point in ["proc", "sys"] {
        fs::create_dir(root.join(mount_point))?;
    }
    let listing = list(&root)?;
    let log = dir.join("agent.log");
    let script = format!(
        "mount -t proc proc '{0}/proc' && mount -t sysfs sysfs '{0}/sys' && \
         exec chroot '{0}' /health-agent --config /health-agent.toml serve",
        root.display()
    );
    let child = Command::new("unshare")
        .args(["--mount", "--fork", "--kill-child=SIGTERM", "sh", "-c"])
        .arg(&script)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("HEALTH_AGENT_LOG", "info")
        .stdin(Stdio::null())
        .stdout(fs::File::create(&log)?)
        .stderr(fs::File::create(&log)?)
        .spawn()
        .context("cannot run unshare (util-linux)")?;
    let agent = Proc(child);
    let deadline = Instant::now() + Duration::from_secs(30);
    let (code, body) = loop {
        if let Ok((code, body)) = get(port, "/health") {
            let json: serde_json::Value = serde_json::from_str(&body)
                .with_context(|| format!("/health answered {code} with no JSON: {body}"))?;
            if code == 200 && json["details"]["web"]["kernel"]["state"] == "active" {
                break (code, json);
            }
            if Instant::now() > deadline {
                bail!("no 200 with the kernel view active in 30 s: {code} {json}");
            }
        } else if Instant::now() > deadline {
            bail!(
                "the agent in the bare root never answered: {}",
                fs::read_to_string(&log).unwrap_or_default()
            );
        }
        thread::sleep(Duration::from_millis(200));
    };
    println!(
        "check: a root holding only {listing} (+ /proc, /sys mounted): chroot, serve → /health \
         {code} {} webserver {}, kernel view {} (tier {})",
        body["status"],
        body["checks"]["webserver"],
        body["details"]["web"]["kernel"]["state"],
        body["details"]["web"]["kernel"]["tier"]
    );
    drop(agent);
    drop(backend);
    let _ = fs::remove_dir_all(dir);
    Ok(())
}

/// The root's entries before the agent runs, for the report.
fn list(root: &Path) -> Result<String> {
    let mut names: Vec<String> = fs::read_dir(root)?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<Result<_, _>>()?;
    names.sort();
    names.retain(|n| n != "proc" && n != "sys");
    ensure!(
        names == ["health-agent", "health-agent.toml"],
        "the bare root holds more than the binary and its config: {names:?}"
    );
    Ok(names.join(" and "))
}

/// A web backend on loopback that answers 200 to every request, on threads that stop on drop.
struct Backend {
    port: u16,
    stop: Arc<AtomicBool>,
}

impl Backend {
    fn start() -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        thread::spawn(move || {
            for conn in listener.incoming() {
                if stopping.load(Ordering::Relaxed) {
                    break;
                }
                let Ok(mut conn) = conn else { continue };
                thread::spawn(move || {
                    let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
                    let mut buf = [0u8; 4096];
                    let _ = conn.read(&mut buf);
                    let _ = conn.write_all(
                        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok",
                    );
                    let _ = conn.shutdown(Shutdown::Both);
                });
            }
        });
        Ok(Self { port, stop })
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wakes the accept loop so it sees the flag.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

/// Each image loaded with `docker load`, of its architecture; the host's started once.
pub fn images(a: &Artifacts) -> Result<()> {
    services::dockerd("check")?;
    for arch in &a.per_arch {
        let loaded = cmd::stdout(Command::new("docker").arg("load").arg("-i").arg(&arch.oci))
            .with_context(|| format!("docker load -i {}", arch.oci.display()))?;
        let tag = oci::tag(&a.release, arch.arch);
        let platform = cmd::stdout(Command::new("docker").args([
            "image",
            "inspect",
            "-f",
            "{{.Os}}/{{.Architecture}} {{json .Config.Entrypoint}} {{.Size}}",
            &tag,
        ]))?;
        ensure!(
            platform.starts_with(&format!("linux/{} ", arch.arch.oci)),
            "{tag} is {platform}"
        );
        println!(
            "check: docker load -i {}: {}; {tag} is {}",
            file_name(&arch.oci),
            loaded.trim(),
            platform.trim()
        );
    }
    let host = &a.per_arch[0];
    let tag = oci::tag(&a.release, host.arch);
    let version = cmd::stdout(Command::new("docker").args([
        "run",
        "--rm",
        "--network",
        "none",
        &tag,
        "--version",
    ]))?;
    ensure!(
        version.trim() == format!("health-agent {}", a.release.version),
        "{tag} --version said {version:?}"
    );
    println!("check: docker run {tag} --version: {}", version.trim());
    Ok(())
}
