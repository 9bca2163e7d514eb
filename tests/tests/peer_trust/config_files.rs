//! Config files can set commands the agent runs as root (`web.restart_command`), so it reads
//! only files no user but root can change. Through the real binary: a drop-in any user may
//! write, a drop-in in a `conf.d/` any user may write, a drop-in owned by another user and a
//! main file any user may write are refused by every command that reads the config (`serve`
//! included, before it serves anything), each naming the file, what is wrong and the fix; the
//! packaged layout (root's files 0644 in a 0755 `conf.d/`) is valid.

use std::{
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    time::{Duration, Instant},
};

use health_agent_tests::{agent_binary, free_port, require_root, Proc};

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {mode:o} {}: {e}", path.display()));
}

fn write(path: &Path, text: &str, mode: u32) {
    std::fs::write(path, text).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    chmod(path, mode);
}

/// A main file and its `conf.d/` with one drop-in that sets `web.restart_command`, laid out as
/// the package lays them out: the files 0644, `conf.d/` 0755, all of them the test's (root's).
struct Layout {
    dir: tempfile::TempDir,
    main: PathBuf,
    conf_d: PathBuf,
    dropin: PathBuf,
}

impl Layout {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let main = dir.path().join("health-agent.toml");
        // Were the file wrongly taken, `serve` would stay on loopback and `drain` would knock
        // on a socket of this test's own.
        write(
            &main,
            &format!(
                "[server]\nlisten = \"127.0.0.1:{}\"\n\n[checks]\nboot_grace = \"0s\"\n\n\
                 [drain]\ncontrol_socket = \"{}\"\nstate_file = \"{}\"\n",
                free_port(),
                dir.path().join("control.sock").display(),
                dir.path().join("drain.json").display()
            ),
            0o644,
        );
        let conf_d = dir.path().join("conf.d");
        std::fs::create_dir(&conf_d).expect("mkdir conf.d");
        chmod(&conf_d, 0o755);
        let dropin = conf_d.join("50-restart.toml");
        write(
            &dropin,
            &format!(
                "[web]\nrestart_command = \"touch {}\"\n",
                dir.path().join("pwned").display()
            ),
            0o644,
        );
        Self {
            dir,
            main,
            conf_d,
            dropin,
        }
    }

    fn main(&self) -> &str {
        self.main.to_str().expect("a UTF-8 path")
    }

    fn agent(&self, args: &[&str]) -> Output {
        let args: Vec<&str> = args
            .iter()
            .map(|a| if *a == "F" { self.main() } else { a })
            .collect();
        Command::new(agent_binary())
            .args(&args)
            .env("HEALTH_AGENT_LOG", "warn")
            .stdin(Stdio::null())
            .output()
            .expect("running health-agent")
    }

    /// Every command that reads the config exits 2 and says `says` (each piece) on stderr;
    /// `serve` too, before serving anything.
    fn refused_by_every_command(&self, says: &[&str]) {
        for args in [
            &["config", "--validate", "--config", "F"][..],
            &["--config", "F", "config", "--effective"],
            &["--config", "F", "check"],
            &["check", "--json", "--config", "F"],
            &["--config", "F", "alert", "test"],
            &["--config", "F", "drain", "--timeout", "1s"],
            &["--config", "F", "undrain"],
        ] {
            let out = self.agent(args);
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{args:?} took it: {err}");
            for s in says {
                assert!(err.contains(s), "{args:?}: no {s:?} in: {err}");
            }
            assert!(
                err.contains("commands the agent runs as root"),
                "{args:?} says why: {err}"
            );
            assert!(
                !String::from_utf8_lossy(&out.stdout).contains("valid"),
                "{args:?}"
            );
        }
        self.serve_refuses(says);
    }

    /// `serve` exits 2 within seconds with `says` in its log, and runs no command.
    fn serve_refuses(&self, says: &[&str]) {
        let log = self.dir.path().join("serve.log");
        let mut agent = Proc(
            Command::new(agent_binary())
                .args(["--config", self.main(), "serve"])
                .env("HEALTH_AGENT_LOG", "info")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&log).expect("the serve log"))
                .spawn()
                .expect("starting health-agent serve"),
        );
        let deadline = Instant::now() + Duration::from_secs(20);
        let status = loop {
            if let Some(status) = agent.0.try_wait().expect("waiting for serve") {
                break status;
            }
            let logged = std::fs::read_to_string(&log).unwrap_or_default();
            assert!(
                Instant::now() < deadline,
                "serve still runs after 20 s with an untrusted config: {logged}"
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        let logged = std::fs::read_to_string(&log).unwrap_or_default();
        assert_eq!(status.code(), Some(2), "serve: {logged}");
        for s in says {
            assert!(logged.contains(s), "serve: no {s:?} in: {logged}");
        }
        assert!(
            !self.dir.path().join("pwned").exists(),
            "the restart command ran"
        );
    }
}

#[test]
fn a_dropin_any_user_may_write_is_refused_naming_it_and_its_mode() {
    let layout = Layout::new();
    chmod(&layout.dropin, 0o666);
    let dropin = layout.dropin.display().to_string();
    layout.refused_by_every_command(&[
        &format!("{dropin} is writable by group or others (mode 0666)"),
        &format!("chmod go-w {dropin}"),
    ]);
    // Group-writable is as good as anyone's: a member of the group can set the command.
    chmod(&layout.dropin, 0o664);
    let out = layout.agent(&["config", "--validate", "--config", "F"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains(&dropin) && err.contains("0664"), "{err}");
}

#[test]
fn a_dropin_in_a_conf_d_any_user_may_write_is_refused_naming_the_directory() {
    let layout = Layout::new();
    chmod(&layout.conf_d, 0o777);
    let conf_d = layout.conf_d.display().to_string();
    layout.refused_by_every_command(&[
        &format!("{conf_d} is writable by group or others (mode 0777)"),
        &format!("chmod go-w {conf_d}"),
    ]);
}

#[test]
fn a_main_file_any_user_may_write_is_refused() {
    let layout = Layout::new();
    chmod(&layout.main, 0o646);
    layout.refused_by_every_command(&[&format!("{} is writable", layout.main()), "mode 0646"]);
}

#[test]
fn a_dropin_owned_by_another_user_is_refused_naming_the_owner() {
    require_root();
    let layout = Layout::new();
    std::os::unix::fs::chown(&layout.dropin, Some(65534), Some(65534)).expect("chown");
    let dropin = layout.dropin.display().to_string();
    layout.refused_by_every_command(&[
        &format!("{dropin} is owned by uid 65534, not root"),
        &format!("chown root {dropin}"),
    ]);
}

#[test]
fn root_owned_files_only_root_can_write_are_valid() {
    let layout = Layout::new();
    let out = layout.agent(&["config", "--validate", "--config", "F"]);
    let said = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        said.contains("50-restart.toml") && said.trim_end().ends_with(": valid"),
        "{said}"
    );
    assert!(
        !err.contains("writable") && !err.contains("owned by"),
        "{err}"
    );
    // The drop-in's command is in the configuration the agent runs with.
    let out = layout.agent(&["--config", "F", "config", "--effective"]);
    let effective = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        effective.contains("restart_command = \"touch "),
        "{effective}"
    );
    // A symlinked drop-in is judged by its target: root's and 0644 here.
    let target = layout.dir.path().join("shared.toml");
    write(&target, "[heal]\nmax_restarts = 2\n", 0o644);
    std::os::unix::fs::symlink(&target, layout.conf_d.join("60-shared.toml")).expect("symlink");
    let out = layout.agent(&["config", "--validate", "--config", "F"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    chmod(&target, 0o666);
    let out = layout.agent(&["config", "--validate", "--config", "F"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("60-shared.toml is writable") && err.contains("0666"),
        "{err}"
    );
}
