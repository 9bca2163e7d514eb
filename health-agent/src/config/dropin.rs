//! Drop-in files: `conf.d/*.toml` beside the main config file, merged over it in file-name
//! order so that tools (a CloudFormation UserData script, configuration management) can add
//! keys without editing the packaged file. A later file wins key by key: tables merge, a
//! scalar or an array replaces. Each file is parsed and checked for unknown keys on its own,
//! so an error names the file it is in; the cross-checks run on the merged whole and name the
//! file that sets the key. Every file and `conf.d/` itself is read only once trust.rs trusts
//! it: no user but root (or the agent's own) may be able to change it.

use std::path::{Path, PathBuf};

use super::{secrets, trust, world_readable_warning, Config, ConfigError, FromEnv, DEFAULT_PATH};

/// The directory of drop-ins for the config file `path`: `conf.d` beside it.
pub fn dropin_dir(path: &Path) -> PathBuf {
    path.parent().unwrap_or(Path::new("")).join("conf.d")
}

/// A configuration as loaded, with the files it was made of.
#[derive(Debug, Clone)]
pub struct Loaded {
    /// What the agent runs with: the files merged, the secrets they leave out taken from the
    /// environment.
    pub config: Config,
    /// The files merged, as written (`config --effective` prints it).
    pub written: Config,
    /// Where each secret came from, and notes on the variables (env.rs).
    pub from_env: FromEnv,
    /// The main file as given; `main_found` is false when it is absent (the default path).
    pub main: PathBuf,
    pub main_found: bool,
    /// The drop-ins merged over it, in order.
    pub dropins: Vec<PathBuf>,
}

impl Loaded {
    /// "/etc/health-agent/health-agent.toml + /etc/health-agent/conf.d/50-aws.toml": which
    /// files made the configuration, for the start-up log and `config --effective`.
    pub fn describe(&self) -> String {
        let mut s = self.main.display().to_string();
        if !self.main_found {
            s.push_str(" (absent: defaults)");
        }
        if self.dropins.is_empty() {
            s.push_str(&format!(
                ", no drop-ins in {}",
                dropin_dir(&self.main).display()
            ));
        }
        s + &joined(&self.dropins)
    }
}

/// " + a.toml + b.toml", the drop-ins after the main file's name.
fn joined(dropins: &[PathBuf]) -> String {
    dropins
        .iter()
        .map(|p| format!(" + {}", p.display()))
        .collect()
}

/// One file's text and the name its errors carry.
pub(super) struct Source {
    pub shown: String,
    pub text: String,
}

/// Loads `path` and its drop-ins. A missing main file at the default path is an empty config;
/// a missing `conf.d` is no drop-ins. A file or `conf.d` that another user could change is
/// refused (trust.rs). Files that hold secrets and that every user may read are warned of,
/// each by its own keys.
pub(super) fn load(path: &Path) -> Result<Loaded, ConfigError> {
    let (main_text, main_found) = match trust::read(path) {
        Ok(t) => (t, true),
        Err(ConfigError::Read { ref error, .. })
            if error.kind() == std::io::ErrorKind::NotFound && path == Path::new(DEFAULT_PATH) =>
        {
            (String::new(), false)
        }
        Err(e) => return Err(e),
    };
    let dropins = list(&dropin_dir(path))?;
    let mut files = vec![(
        path.to_path_buf(),
        Source {
            shown: path.display().to_string(),
            text: main_text,
        },
    )];
    for p in &dropins {
        let text = trust::read(p)?;
        let shown = p.display().to_string();
        files.push((p.clone(), Source { shown, text }));
    }
    for (p, f) in &files {
        // Each file by what it sets itself: the warning names its keys.
        let alone = toml::from_str::<Config>(&f.text).unwrap_or_default();
        if let Some(warning) = world_readable_warning(p, &alone) {
            tracing::warn!("{warning}");
        }
    }
    let sources: Vec<Source> = files.into_iter().map(|(_, s)| s).collect();
    let whole = format!("{}{}", path.display(), joined(&dropins));
    let config = merge(&sources, &whole)?;
    Ok(Loaded {
        written: config.clone(),
        config,
        from_env: FromEnv::default(),
        main: path.to_path_buf(),
        main_found,
        dropins,
    })
}

/// The `*.toml` files of `dir` in file-name order (bytes, as `LC_ALL=C ls`). Hidden files
/// (editor locks such as `.#x.toml`) and any other suffix (`.dpkg-old`, `~`) are skipped, and
/// so never judged. `dir` itself must be trusted: whoever can write it can add a drop-in.
fn list(dir: &Path) -> Result<Vec<PathBuf>, ConfigError> {
    let read_error = |error| ConfigError::Read {
        path: dir.display().to_string(),
        error,
    };
    if !trust::check_dir(dir)? {
        return Ok(Vec::new());
    }
    let entries = std::fs::read_dir(dir).map_err(read_error)?;
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(read_error)?;
        let name = entry.file_name();
        let hidden = name.as_encoded_bytes().starts_with(b".");
        if !hidden && Path::new(&name).extension().is_some_and(|e| e == "toml") {
            out.push(entry.path());
        }
    }
    out.sort();
    Ok(out)
}

/// The files merged in order into one validated config. `whole` names them all, for an error
/// no one file causes (a key left at its default that another key rules out).
pub(super) fn merge(files: &[Source], whole: &str) -> Result<Config, ConfigError> {
    let mut merged = toml::Table::new();
    for f in files {
        let parse_error = |e: toml::de::Error| ConfigError::Parse {
            path: f.shown.clone(),
            // toml's own rendering quotes the offending line, which may hold a secret.
            message: secrets::parse_error(&f.text, &e),
        };
        // Alone first: unknown keys and wrong types are this file's, with its line numbers.
        toml::from_str::<Config>(&f.text).map_err(parse_error)?;
        let table: toml::Table = toml::from_str(&f.text).map_err(parse_error)?;
        overlay(&mut merged, table);
    }
    let cfg: Config = toml::Value::Table(merged)
        .try_into()
        .map_err(|e| ConfigError::Parse {
            path: whole.to_string(),
            message: secrets::parse_error("", &e),
        })?;
    cfg.validate(whole).map_err(|e| match e {
        ConfigError::Invalid { key, message, .. } => {
            // The last file that sets the key decides its value.
            let (path, line) = files
                .iter()
                .rev()
                .find_map(|f| secrets::line_of(&f.text, key).map(|l| (f.shown.clone(), Some(l))))
                .unwrap_or_else(|| (whole.to_string(), None));
            ConfigError::Invalid {
                path,
                line,
                key,
                // The checks name a URL only redacted; any other is cut here too.
                message: crate::dburl::redact_urls_in(&message),
            }
        }
        other => other,
    })?;
    Ok(cfg)
}

/// `over` merged into `base`: tables key by key, anything else replaced.
fn overlay(base: &mut toml::Table, over: toml::Table) {
    for (k, v) in over {
        match (base.get_mut(&k), v) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => overlay(b, o),
            (_, v) => {
                base.insert(k, v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A main file and its conf.d/ in a temporary directory.
    fn setup(main: &str, dropins: &[(&str, &str)]) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("health-agent.toml");
        std::fs::write(&path, main).unwrap();
        if !dropins.is_empty() {
            std::fs::create_dir(dir.path().join("conf.d")).unwrap();
        }
        for (name, text) in dropins {
            std::fs::write(dir.path().join("conf.d").join(name), text).unwrap();
        }
        (dir, path)
    }

    fn err(main: &str, dropins: &[(&str, &str)]) -> String {
        let (_dir, path) = setup(main, dropins);
        Config::load(&path).unwrap_err().to_string()
    }

    #[test]
    fn dropins_merge_in_name_order_key_by_key() {
        let (_dir, path) = setup(
            "[web]\nport = 9000\nprobe_path = \"/health\"\n\n[disk]\npaths = [\"/\", \"/var\"]\n\n\
             [scaling.cloudwatch]\nnamespace = \"Shop\"\n",
            &[
                (
                    "50-aws.toml",
                    "[web]\nport = 8000\nworkers = 16\n\n[scaling.cloudwatch]\nenabled = true\n",
                ),
                // Byte order: "10-" sorts before "50-", "9-" after it.
                (
                    "10-early.toml",
                    "web.port = 7000\ndisk.paths = [\"/data\"]\n",
                ),
                ("9-late.toml", "[heal]\nmax_restarts = 5\n"),
                // Not drop-ins: other suffixes, hidden files, directories' other files.
                ("60-old.toml.dpkg-old", "not toml at all ["),
                ("61-edit.toml~", "not toml at all ["),
                (".#62-lock.toml", "not toml at all ["),
                ("README", "not toml at all ["),
            ],
        );
        let loaded = Config::load_all(&path).unwrap();
        let c = &loaded.config;
        assert_eq!(c.web.port, 8000, "50-aws.toml is after 10-early.toml");
        assert_eq!(c.web.workers, 16);
        assert_eq!(c.web.probe_path, "/health", "a table merges key by key");
        assert_eq!(c.disk.paths, ["/data"], "an array replaces");
        assert!(c.scaling.cloudwatch.enabled);
        assert_eq!(
            c.scaling.cloudwatch.namespace, "Shop",
            "nested tables merge"
        );
        assert_eq!(c.heal.max_restarts, 5);
        let names: Vec<String> = loaded
            .dropins
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["10-early.toml", "50-aws.toml", "9-late.toml"]);
        let said = loaded.describe();
        assert!(
            said.starts_with(&path.display().to_string())
                && said.contains("conf.d/10-early.toml + ")
                && said.ends_with("conf.d/9-late.toml"),
            "{said}"
        );
    }

    #[test]
    fn a_missing_conf_d_is_no_dropins_and_a_missing_main_file_is_an_error() {
        let (dir, path) = setup("[web]\nport = 9000\n", &[]);
        let loaded = Config::load_all(&path).unwrap();
        assert_eq!(loaded.config.web.port, 9000);
        assert!(loaded.dropins.is_empty());
        assert!(
            loaded.describe().contains("no drop-ins in"),
            "{}",
            loaded.describe()
        );
        // Only the default path may be absent.
        let e = Config::load(&dir.path().join("nope.toml"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("nope.toml") && e.contains("cannot read"), "{e}");
        // conf.d that is not a directory is an error, not silence.
        std::fs::write(dir.path().join("conf.d"), "").unwrap();
        let e = Config::load(&path).unwrap_err().to_string();
        assert!(e.contains("conf.d"), "{e}");
    }

    #[test]
    fn files_and_conf_d_another_user_could_change_are_refused() {
        use std::os::unix::fs::PermissionsExt as _;
        let chmod = |p: &Path, mode| {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap()
        };
        let (dir, path) = setup(
            "[web]\nport = 9000\n",
            &[("50-x.toml", "[web]\nrestart_command = \"touch pwned\"\n")],
        );
        let conf_d = dir.path().join("conf.d");
        let dropin = conf_d.join("50-x.toml");
        let refused = |named: &Path, says: &str| {
            let e = Config::load(&path).unwrap_err();
            assert!(matches!(e, ConfigError::Untrusted { .. }), "{e}");
            let e = e.to_string();
            assert!(
                e.starts_with(&format!("{} is ", named.display())) && e.contains(says),
                "{e}"
            );
        };
        for p in [&path, &dropin] {
            chmod(p, 0o644);
        }
        chmod(&conf_d, 0o755);
        let c = Config::load(&path).expect("root's files, writable by root alone");
        assert_eq!(c.web.restart_command, "touch pwned");
        chmod(&dropin, 0o666);
        refused(&dropin, "mode 0666");
        chmod(&dropin, 0o664);
        refused(&dropin, "chmod go-w");
        chmod(&dropin, 0o644);
        // Whoever can write conf.d/ can add a drop-in.
        chmod(&conf_d, 0o777);
        refused(&conf_d, "mode 0777");
        chmod(&conf_d, 0o755);
        chmod(&path, 0o646);
        refused(&path, "mode 0646");
        chmod(&path, 0o644);
        // What is not a drop-in is not read, so not judged.
        let lock = conf_d.join(".#50-x.toml");
        std::fs::write(&lock, "").unwrap();
        chmod(&lock, 0o666);
        Config::load(&path).expect("an editor's lock file is no drop-in");
        if crate::sys::effective_uid() != 0 {
            eprintln!("not root: chown to another user is not ours to test");
            return;
        }
        std::os::unix::fs::chown(&dropin, Some(65534), None).unwrap();
        refused(&dropin, "owned by uid 65534, not root");
        std::os::unix::fs::chown(&dropin, Some(0), None).unwrap();
        std::os::unix::fs::chown(&conf_d, Some(65534), None).unwrap();
        refused(&conf_d, "chown root");
    }

    #[test]
    fn errors_name_the_dropin_they_come_from() {
        let main = "[web]\nport = 9000\n";
        // Syntax.
        let e = err(main, &[("50-aws.toml", "[web\nport = 1\n")]);
        assert!(
            e.contains("conf.d/50-aws.toml") && e.contains("line 1"),
            "{e}"
        );
        // An unknown key, whose value may be a secret.
        let e = err(
            main,
            &[("20-alerts.toml", "[alerts]\n\nslack_webhok_url = \"https://hooks.slack.com/services/T1/B2/S3cr3tH00k\"\n")],
        );
        assert!(
            e.contains("conf.d/20-alerts.toml") && e.contains("line 3"),
            "{e}"
        );
        assert!(
            e.contains("slack_webhok_url") && !e.contains("S3cr3tH00k"),
            "{e}"
        );
        // A wrong type or value out of its type's range.
        let e = err(main, &[("50-aws.toml", "[web]\nport = 70000\n")]);
        assert!(
            e.contains("conf.d/50-aws.toml") && e.contains("70000"),
            "{e}"
        );
        // Out of bounds: the file that sets the key, and its line.
        let e = err(
            "[heal]\nwindow = \"10m\"\n",
            &[
                ("10-a.toml", "[heal]\nwindow = \"5m\"\n"),
                ("20-b.toml", "\n[heal]\nwindow = \"0s\"\n"),
            ],
        );
        assert!(e.contains("conf.d/20-b.toml: line 3: `heal.window`"), "{e}");
        // An invalid database URL in a drop-in: named, its password never shown.
        let e = err(
            main,
            &[(
                "30-db.toml",
                "[database]\nurl = \"http://u:Sekr1tPw@db/x\"\n",
            )],
        );
        assert!(
            e.contains("conf.d/30-db.toml") && e.contains("`database.url`"),
            "{e}"
        );
        assert!(!e.contains("Sekr1tPw"), "{e}");
        // Keys that go together, each set in another file: valid together.
        let (_dir, path) = setup(
            "[fleet]\nconsul_addr = \"http://127.0.0.1:8500\"\n",
            &[("40-consul.toml", "[fleet]\nconsul_service = \"web\"\n")],
        );
        Config::load(&path).unwrap();
        // ... and a missing partner, set nowhere, names every file.
        let e = err(
            main,
            &[(
                "40-consul.toml",
                "[fleet]\nconsul_addr = \"http://127.0.0.1:8500\"\n",
            )],
        );
        assert!(
            e.contains("health-agent.toml + ") && e.contains("40-consul.toml"),
            "{e}"
        );
        assert!(e.contains("fleet.consul_service"), "{e}");
    }
}
