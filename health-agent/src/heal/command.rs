//! `web.restart_command`: `sh -c` in a process group of its own, with a scrubbed environment,
//! bounded output and a deadline that kills the whole group.

use std::{process::Stdio, time::Duration};

use tokio::io::AsyncReadExt;

/// Output kept in the heal log, after both streams are joined.
const OUTPUT_LIMIT: usize = 2048;

/// Why a restart command failed. The messages are what the heal log shows.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    #[error("cannot run restart_command: {0}")]
    Spawn(#[source] std::io::Error),
    #[error(
        "restart_command did not finish within {}s; its process group was killed: {output}",
        timeout.as_secs()
    )]
    TimedOut { timeout: Duration, output: String },
    #[error("restart_command exited with {status}: {output}")]
    Exited {
        status: std::process::ExitStatus,
        output: String,
    },
    #[error("restart_command: {0}")]
    Wait(#[source] std::io::Error),
}

/// What a restart command may see of the agent's environment: the variables a shell and the
/// usual restart tools (`systemctl`, `docker`, `service`) need, nothing else. An allowlist, not
/// a denylist: the agent's secrets (the variables every `_env` key of the config names,
/// `PGPASSWORD`, and whatever the unit file adds) have names only the operator knows, and a command that needs more can set it itself.
const ENV_ALLOWLIST: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "LANG",
    "LANGUAGE",
    "TZ",
    "TMPDIR",
    "XDG_RUNTIME_DIR",
    "DOCKER_HOST",
];

fn passed_to_command(name: &str) -> bool {
    ENV_ALLOWLIST.contains(&name) || name.starts_with("LC_")
}

/// Output kept per stream; the rest is read and counted, so a chatty command never stalls on a
/// full pipe.
const CAPTURE_LIMIT: usize = 64 * 1024;

/// Once the shell has exited, how long its output may take to reach end of file. A background
/// child that kept the pipes open is not waited for: reading stops, and its next write fails.
const OUTPUT_GRACE: Duration = Duration::from_millis(200);

#[derive(Default)]
struct Captured {
    kept: Vec<u8>,
    dropped: u64,
}

async fn capture<R: tokio::io::AsyncRead + Unpin>(pipe: Option<R>, into: &mut Captured) {
    let Some(mut pipe) = pipe else { return };
    let mut buf = [0u8; 8192];
    loop {
        match pipe.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                let take = n.min(CAPTURE_LIMIT.saturating_sub(into.kept.len()));
                into.kept.extend_from_slice(&buf[..take]);
                into.dropped = into.dropped.saturating_add((n - take) as u64);
            }
        }
    }
}

/// SIGKILLs the command's whole process group when dropped armed: on timeout, and when the
/// future running the command is dropped (the healer gave up on it), so nothing it started
/// in the foreground or background outlives it.
struct GroupKiller(Option<libc::pid_t>);

impl Drop for GroupKiller {
    fn drop(&mut self) {
        if let Some(pgid) = self.0.filter(|p| *p > 1) {
            // The group may be gone already: nothing left to kill then.
            let _ = crate::sys::kill(-pgid, libc::SIGKILL);
        }
    }
}

/// Runs `sh -c cmd` in a process group of its own with a scrubbed environment, capturing
/// (truncated) stdout and stderr read concurrently; non-zero exit is a failure. On timeout, or
/// if this future is dropped, the whole group is killed.
pub async fn run_command(cmd: &str, timeout: Duration) -> Result<String, CommandError> {
    let env: Vec<_> = std::env::vars_os().collect();
    run_command_with_env(cmd, timeout, env).await
}

async fn run_command_with_env(
    cmd: &str,
    timeout: Duration,
    agent_env: Vec<(std::ffi::OsString, std::ffi::OsString)>,
) -> Result<String, CommandError> {
    let mut child = tokio::process::Command::new("/bin/sh")
        .arg("-c")
        .arg(cmd)
        .env_clear()
        .envs(
            agent_env
                .into_iter()
                .filter(|(k, _)| k.to_str().is_some_and(passed_to_command)),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .map_err(CommandError::Spawn)?;
    let mut group = GroupKiller(child.id().and_then(|p| libc::pid_t::try_from(p).ok()));
    let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
    let (mut out, mut err) = (Captured::default(), Captured::default());
    let finished = {
        let reading = async {
            tokio::join!(capture(stdout, &mut out), capture(stderr, &mut err));
        };
        tokio::pin!(reading);
        let work = async {
            let mut read_all = false;
            let status = tokio::select! {
                s = child.wait() => s,
                () = &mut reading => {
                    read_all = true;
                    child.wait().await
                }
            };
            if !read_all {
                let _ = tokio::time::timeout(OUTPUT_GRACE, &mut reading).await;
            }
            status
        };
        tokio::time::timeout(timeout, work).await
    };
    let mut text = String::from_utf8_lossy(&out.kept).trim().to_string();
    let err_text = String::from_utf8_lossy(&err.kept);
    if !err_text.trim().is_empty() {
        if !text.is_empty() {
            text.push('\n');
        }
        text.push_str(err_text.trim());
    }
    let mut text = crate::text::truncate(&text, OUTPUT_LIMIT);
    let dropped = out.dropped.saturating_add(err.dropped);
    if dropped > 0 {
        text.push_str(&format!(" [{dropped} more bytes not kept]"));
    }
    let status = match finished {
        Ok(status) => status,
        Err(_) => {
            // `group` kills the process group as it goes out of scope.
            return Err(CommandError::TimedOut {
                timeout,
                output: text,
            });
        }
    };
    // The shell exited: leave alone what it started in the background (a server it restarted).
    group.0 = None;
    match status {
        Ok(s) if s.success() => Ok(text),
        Ok(status) => Err(CommandError::Exited {
            status,
            output: text,
        }),
        Err(e) => Err(CommandError::Wait(e)),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    /// Some process of group `pgid` is alive (zombies waiting for a reaper do not count).
    fn group_alive(pgid: i32) -> bool {
        std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
            let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
                return false;
            };
            let Some((_, rest)) = stat.rsplit_once(')') else {
                return false;
            };
            let f: Vec<&str> = rest.split_whitespace().collect();
            f.first() != Some(&"Z") && f.get(2).and_then(|p| p.parse().ok()) == Some(pgid)
        })
    }

    fn alive(pid: i32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
            s.rsplit_once(')')
                .is_some_and(|(_, r)| !r.trim_start().starts_with('Z'))
        })
    }

    async fn read_pid(path: &std::path::Path) -> i32 {
        for _ in 0..200 {
            if let Some(pid) = std::fs::read_to_string(path)
                .ok()
                .and_then(|s| s.trim().parse().ok())
            {
                return pid;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("{} never written", path.display());
    }

    async fn gone_within(d: Duration, what: impl Fn() -> bool) -> bool {
        let deadline = Instant::now() + d;
        while Instant::now() < deadline {
            if !what() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        !what()
    }

    #[tokio::test]
    async fn restart_command_sees_none_of_the_agents_secrets() {
        let agent_env = [
            ("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
            ("LC_ALL", "C"),
            ("HEALTH_AGENT_TOKEN", "tok-s3cr3t-1"),
            ("GITHUB_TOKEN", "ghp_s3cr3t2"),
            ("PGPASSWORD", "pg-s3cr3t-3"),
            ("PEER_TOKEN", "fleet-s3cr3t-4"),
            ("AWS_SECRET_ACCESS_KEY", "aws-s3cr3t-5"),
        ]
        .map(|(k, v)| (k.into(), v.into()))
        .to_vec();
        let out = run_command_with_env("env", Duration::from_secs(10), agent_env)
            .await
            .unwrap();
        assert!(!out.contains("s3cr3t"), "{out}");
        assert!(
            out.contains("PATH=/usr/sbin") && out.contains("LC_ALL=C"),
            "{out}"
        );
        // The real path, with this process's own environment: only allowlisted names pass
        // (and what the shell itself sets).
        let out = run_command("env", Duration::from_secs(10)).await.unwrap();
        for line in out.lines() {
            let name = line.split_once('=').map_or(line, |(n, _)| n);
            assert!(
                passed_to_command(name) || matches!(name, "PWD" | "SHLVL" | "_"),
                "{name} reached the restart command"
            );
        }
    }

    #[tokio::test]
    async fn a_megabyte_on_stderr_finishes_normally() {
        let started = Instant::now();
        let out = run_command(
            "head -c 1000000 /dev/zero | tr '\\0' x >&2; echo done",
            Duration::from_secs(20),
        )
        .await
        .unwrap();
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        assert!(
            out.starts_with("done\nxxxx"),
            "{}",
            &out[..20.min(out.len())]
        );
        assert!(out.len() < OUTPUT_LIMIT + 100, "kept small: {}", out.len());
        assert!(
            out.ends_with(&format!(
                "[{} more bytes not kept]",
                1_000_000 - CAPTURE_LIMIT
            )),
            "{}",
            &out[out.len() - 60..]
        );
    }

    #[tokio::test]
    async fn a_hanging_command_is_killed_with_its_children() {
        let dir = tempfile::tempdir().unwrap();
        let (bg, sh) = (dir.path().join("bg"), dir.path().join("sh"));
        let cmd = format!(
            "sleep 300 & echo $! > {}; echo $$ > {}; sleep 300",
            bg.display(),
            sh.display()
        );
        let started = Instant::now();
        let err = run_command(&cmd, Duration::from_secs(1)).await.unwrap_err();
        assert!(
            matches!(&err, CommandError::TimedOut { timeout, .. } if timeout.as_secs() == 1),
            "{err}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "{:?}",
            started.elapsed()
        );
        assert!(
            err.to_string().contains("did not finish within 1s"),
            "{err}"
        );
        let (bg, pgid) = (read_pid(&bg).await, read_pid(&sh).await);
        assert!(
            gone_within(Duration::from_secs(3), || alive(bg)).await,
            "background sleep {bg} survived"
        );
        assert!(
            gone_within(Duration::from_secs(3), || group_alive(pgid)).await,
            "process group {pgid} survived"
        );
    }

    #[tokio::test]
    async fn a_dropped_restart_kills_the_group() {
        let dir = tempfile::tempdir().unwrap();
        let sh = dir.path().join("sh");
        let cmd = format!("echo $$ > {}; sleep 300 & sleep 300", sh.display());
        let task = tokio::spawn(async move { run_command(&cmd, Duration::from_secs(600)).await });
        let pgid = read_pid(&sh).await;
        assert!(group_alive(pgid));
        // What the healer does when heal.timeout passes first.
        task.abort();
        assert!(
            gone_within(Duration::from_secs(3), || group_alive(pgid)).await,
            "process group {pgid} survived"
        );
    }

    #[tokio::test]
    async fn a_background_child_holding_stdout_is_not_waited_for() {
        let dir = tempfile::tempdir().unwrap();
        let bg = dir.path().join("bg");
        let cmd = format!("sleep 300 & echo $! > {}; echo started", bg.display());
        let started = Instant::now();
        let out = run_command(&cmd, Duration::from_secs(20)).await.unwrap();
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(out, "started");
        // Left running: it may be the server the command just started.
        let bg = read_pid(&bg).await;
        assert!(alive(bg));
        crate::sys::kill(bg, libc::SIGKILL).expect("killing the sleep this test started");
    }
}
