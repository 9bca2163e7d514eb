//! Live processes and HTTP for the verbs that run the product (demo, bench): child processes
//! that are stopped on drop, a tiny HTTP/1.1 client for loopback, and starters for the agent
//! and the bundled backend.

use std::{
    fs,
    io::{Read, Write},
    net::TcpStream,
    path::Path,
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use serde_json::Value;

/// A child process, continued (if stopped) and terminated on drop.
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        // SAFETY: signalling our own child; CONT first so a stopped process can die.
        unsafe {
            libc::kill(self.0.id() as i32, libc::SIGCONT);
            libc::kill(self.0.id() as i32, libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            thread::sleep(Duration::from_millis(20));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn get(port: u16, path: &str) -> Result<(u16, String)> {
    get_with_timeout(port, path, Duration::from_secs(3))
}

/// GET on 127.0.0.1 with one deadline for connect, write and read.
pub fn get_with_timeout(port: u16, path: &str, timeout: Duration) -> Result<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), timeout)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = String::new();
    s.read_to_string(&mut raw)?;
    let code = raw
        .get(9..12)
        .and_then(|c| c.parse().ok())
        .context("bad HTTP answer")?;
    let body = raw
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    Ok((code, body))
}

pub fn health(port: u16) -> Result<(u16, Value)> {
    let (code, body) = get(port, "/health")?;
    Ok((code, serde_json::from_str(&body)?))
}

pub fn start_backend(bin: &Path, port: u16, pid_file: &Path) -> Result<Proc> {
    let child = Command::new(bin)
        .args([
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--control",
            &format!("127.0.0.1:{}", port + 1),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    fs::write(pid_file, child.id().to_string())?;
    let deadline = Instant::now() + Duration::from_secs(5);
    while get(port, "/up").is_err() {
        if Instant::now() > deadline {
            bail!("the bundled backend did not start on 127.0.0.1:{port} — is the port in use? try --backend-port");
        }
        thread::sleep(Duration::from_millis(50));
    }
    Ok(Proc(child))
}

pub fn start_agent(bin: &Path, config: &Path, log: &Path, port: u16) -> Result<Proc> {
    let child = Command::new(bin)
        .arg("--config")
        .arg(config)
        .arg("serve")
        .env("HEALTH_AGENT_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(fs::File::create(log)?)
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    let mut agent = Proc(child);
    let deadline = Instant::now() + Duration::from_secs(15);
    while get(port, "/livez").is_err() {
        if let Ok(Some(status)) = agent.0.try_wait() {
            bail!(
                "the agent exited ({status}): {}",
                fs::read_to_string(log).unwrap_or_default()
            );
        }
        if Instant::now() > deadline {
            bail!("the agent did not answer on 127.0.0.1:{port} — is the port in use? try --port");
        }
        thread::sleep(Duration::from_millis(50));
    }
    Ok(agent)
}
