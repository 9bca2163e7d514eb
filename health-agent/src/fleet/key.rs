//! The fleet key: the secret every agent of a fleet holds, and with which each side of the peer
//! exchange proves itself (`proof`). Read once at start from `fleet.key_file`, else from the
//! variable `fleet.key_env` names; never from the configuration's own text.
//!
//! A source holds one key, or two during a rotation: the first signs, both are accepted. A
//! key is at least 32 printable ASCII characters without whitespace (`openssl rand -base64 32`
//! gives 44). The file must be owned by root or by the agent's own user and carry no group or
//! other permission bits: a key others can read is no secret, and one others can write lets
//! them join the fleet.

use std::{os::unix::fs::MetadataExt as _, path::Path, sync::Arc};

use ring::{digest, hmac};

use crate::config::FleetConfig;

/// The shortest key accepted: 32 characters of base64 carry 192 bits.
pub const MIN_KEY_LEN: usize = 32;
/// A key longer than this is a mistake (a whole PEM file), not a key.
const MAX_KEY_LEN: usize = 512;
/// The current key, and the next or the previous one while a rotation is under way.
const MAX_KEYS: usize = 2;
/// A key file is read whole; nothing legitimate is larger.
const MAX_FILE_BYTES: u64 = 16 * 1024;

/// Why this agent holds no usable fleet key. With none, no peer is counted and the peer view is
/// closed; the message says which key to set.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error(
        "no fleet key: fleet.key_file is \"\" and fleet.key_env is \"\"; set one (docs/fleet.md, \
         \"The fleet key\")"
    )]
    NoSource,
    #[error(
        "no fleet key: fleet.key_file is \"\" and the variable {var} (fleet.key_env) is unset or \
         empty; set it, or fleet.key_file (docs/fleet.md, \"The fleet key\")"
    )]
    Unset { var: String },
    #[error("cannot read fleet.key_file {path}: {error}")]
    Read { path: String, error: String },
    #[error(
        "fleet.key_file {path} is mode {mode:04o}: a key that others may read or write is no \
         secret; chmod 600 {path}"
    )]
    Mode { path: String, mode: u32 },
    #[error(
        "fleet.key_file {path} is owned by uid {uid}, neither root nor this agent's user: whoever \
         owns it can join the fleet; chown root {path}"
    )]
    Owner { path: String, uid: u32 },
    #[error("{from} holds no fleet key")]
    Empty { from: String },
    #[error(
        "{from}: key {n} is {len} characters; a fleet key has {MIN_KEY_LEN} to {MAX_KEY_LEN} \
         (e.g. `openssl rand -base64 32`)"
    )]
    Length { from: String, n: usize, len: usize },
    #[error("{from}: key {n} holds a character that is not printable ASCII")]
    Characters { from: String, n: usize },
    #[error(
        "{from} holds {count} keys; at most {MAX_KEYS}: the current one, and the next or the \
         previous one during a rotation"
    )]
    TooMany { from: String, count: usize },
}

/// One key: its public id (the first 4 bytes of a hash of it, in hex: it names which key
/// signed, and tells nothing of the key) and the HMAC-SHA256 key.
pub struct Key {
    id: String,
    mac: hmac::Key,
}

impl Key {
    fn new(secret: &str) -> Self {
        let mut d = digest::Context::new(&digest::SHA256);
        d.update(b"health-agent fleet key id\n");
        d.update(secret.as_bytes());
        Self {
            id: crate::aws::sigv4::hex(&d.finish().as_ref()[..4]),
            mac: hmac::Key::new(hmac::HMAC_SHA256, secret.as_bytes()),
        }
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    pub(super) fn mac(&self) -> &hmac::Key {
        &self.mac
    }
}

impl std::fmt::Debug for Key {
    // Never the key itself.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Key({})", self.id)
    }
}

/// The keys this agent holds: the first signs, every one is accepted.
#[derive(Debug)]
pub struct Keyring {
    keys: Vec<Key>,
}

impl Keyring {
    /// The keys in `text` (a key file's or a variable's value): separated by whitespace or
    /// commas, lines that begin with `#` left out. `from` names the source in errors.
    pub fn parse(text: &str, from: &str) -> Result<Self, KeyError> {
        let secrets: Vec<&str> = text
            .lines()
            .filter(|l| !l.trim_start().starts_with('#'))
            .flat_map(|l| l.split(|c: char| c.is_whitespace() || c == ','))
            .filter(|s| !s.is_empty())
            .collect();
        let from = from.to_string();
        if secrets.is_empty() {
            return Err(KeyError::Empty { from });
        }
        if secrets.len() > MAX_KEYS {
            return Err(KeyError::TooMany {
                from,
                count: secrets.len(),
            });
        }
        for (i, s) in secrets.iter().enumerate() {
            let n = i + 1;
            if !(MIN_KEY_LEN..=MAX_KEY_LEN).contains(&s.len()) {
                return Err(KeyError::Length {
                    from,
                    n,
                    len: s.len(),
                });
            }
            if !s.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(KeyError::Characters { from, n });
            }
        }
        Ok(Self {
            keys: secrets.into_iter().map(Key::new).collect(),
        })
    }

    /// The keys `[fleet]` names: `key_file`, else the variable `key_env` names.
    pub fn load(cfg: &FleetConfig) -> Result<Self, KeyError> {
        if !cfg.key_file.is_empty() {
            let text = read_key_file(Path::new(&cfg.key_file))?;
            return Self::parse(&text, &format!("fleet.key_file {}", cfg.key_file));
        }
        if cfg.key_env.is_empty() {
            return Err(KeyError::NoSource);
        }
        match std::env::var(&cfg.key_env) {
            Ok(v) if !v.trim().is_empty() => {
                Self::parse(&v, &format!("the variable {}", cfg.key_env))
            }
            _ => Err(KeyError::Unset {
                var: cfg.key_env.clone(),
            }),
        }
    }

    /// The key that signs what this agent sends.
    pub fn signing(&self) -> &Key {
        // `parse` keeps at least one.
        &self.keys[0]
    }

    /// The key with this id, if this agent holds it.
    pub fn get(&self, id: &str) -> Option<&Key> {
        self.keys.iter().find(|k| k.id == id)
    }

    /// The ids of the keys held, the signing one first.
    pub fn ids(&self) -> Vec<&str> {
        self.keys.iter().map(|k| k.id.as_str()).collect()
    }
}

/// The key file's text, refused unless only root (or this agent's user) can read or write it.
/// A symlink is judged by its target.
fn read_key_file(path: &Path) -> Result<String, KeyError> {
    let shown = path.display().to_string();
    let read_error = |e: std::io::Error| KeyError::Read {
        path: shown.clone(),
        error: e.to_string(),
    };
    let meta = std::fs::metadata(path).map_err(read_error)?;
    trusted(&shown, meta.mode(), meta.uid(), current_uid())?;
    if meta.len() > MAX_FILE_BYTES {
        return Err(KeyError::Read {
            path: shown,
            error: format!("{} bytes: not a key file", meta.len()),
        });
    }
    std::fs::read_to_string(path).map_err(read_error)
}

/// The key file's mode and owner as `read_key_file` judges them.
fn trusted(path: &str, mode: u32, uid: u32, own_uid: u32) -> Result<(), KeyError> {
    if mode & 0o077 != 0 {
        return Err(KeyError::Mode {
            path: path.to_string(),
            mode: mode & 0o7777,
        });
    }
    if crate::config::foreign_owner(uid, own_uid) {
        return Err(KeyError::Owner {
            path: path.to_string(),
            uid,
        });
    }
    Ok(())
}

fn current_uid() -> u32 {
    crate::sys::effective_uid()
}

/// What this agent holds of the fleet key: keys, or why none (then no peer is counted and the
/// peer view is closed).
#[derive(Debug, Clone)]
pub enum FleetKey {
    Held(Arc<Keyring>),
    Missing(KeyError),
}

impl FleetKey {
    pub fn load(cfg: &FleetConfig) -> Self {
        match Keyring::load(cfg) {
            Ok(k) => Self::Held(Arc::new(k)),
            Err(e) => Self::Missing(e),
        }
    }

    pub fn held(&self) -> bool {
        matches!(self, Self::Held(_))
    }

    /// What the first log line, `check` and `details.fleet` say of it.
    pub fn describe(&self) -> String {
        match self {
            Self::Held(k) => format!(
                "fleet key held (id {}): peers' answers are counted only when signed with it",
                k.ids().join(", ")
            ),
            Self::Missing(e) => {
                format!("{e}: no peer is counted (judged alone) and /fleet/v1/view is closed")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "k4BXzRk0J1lHq3Qm6mQbC4sDq4kU5Xo2cTgR1Y0vZ8I=";
    const B: &str = "Zq0m3wN2b7f1Hk9Xc4Vt6Ls8Pa5Rd0Ey2Uj7Io3Gh1=";

    #[test]
    fn one_or_two_keys_the_first_signs() {
        let one = Keyring::parse(&format!("# the fleet key\n{A}\n"), "f").unwrap();
        assert_eq!(one.ids().len(), 1);
        let two = Keyring::parse(&format!("{B}\n{A}\n"), "f").unwrap();
        assert_eq!(two.signing().id(), Keyring::parse(B, "f").unwrap().ids()[0]);
        assert!(
            two.get(one.ids()[0]).is_some(),
            "the second key is accepted"
        );
        // From a variable: commas or spaces.
        assert_eq!(
            Keyring::parse(&format!("{A},{B}"), "v")
                .unwrap()
                .ids()
                .len(),
            2
        );
        // The id tells the keys apart, and is not the key.
        assert_ne!(two.ids()[0], two.ids()[1]);
        assert!(!A.contains(one.ids()[0]));
        assert!(!format!("{two:?}").contains(A));
    }

    #[test]
    fn short_strange_or_too_many_keys_are_refused_naming_the_source() {
        let e = Keyring::parse("s3cret", "the variable K").unwrap_err();
        assert!(
            e.to_string()
                .contains("the variable K: key 1 is 6 characters"),
            "{e}"
        );
        assert!(!e.to_string().contains("s3cret"));
        let e = Keyring::parse(&format!("{A} {B} {A}"), "f").unwrap_err();
        assert!(matches!(e, KeyError::TooMany { count: 3, .. }), "{e}");
        let e = Keyring::parse("# nothing\n\n", "f").unwrap_err();
        assert!(matches!(e, KeyError::Empty { .. }), "{e}");
        let e = Keyring::parse(&format!("{A}\u{e9}"), "f").unwrap_err();
        assert!(matches!(e, KeyError::Characters { n: 1, .. }), "{e}");
    }

    #[test]
    fn a_key_file_others_may_read_or_write_or_own_is_refused() {
        assert!(trusted("/k", 0o100600, 0, 0).is_ok());
        assert!(trusted("/k", 0o100400, 1000, 1000).is_ok());
        let e = trusted("/k", 0o100644, 0, 0).unwrap_err();
        assert!(e.to_string().contains("mode 0644") && e.to_string().contains("chmod 600 /k"));
        assert!(matches!(
            trusted("/k", 0o100620, 0, 0),
            Err(KeyError::Mode { .. })
        ));
        let e = trusted("/k", 0o100600, 1000, 0).unwrap_err();
        assert!(e.to_string().contains("uid 1000"), "{e}");
    }

    #[test]
    fn a_key_file_is_read_and_judged_through_a_symlink() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("fleet.key");
        std::fs::write(&file, format!("{A}\n")).unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        let cfg = FleetConfig {
            key_file: link.display().to_string(),
            ..FleetConfig::default()
        };
        assert!(matches!(FleetKey::load(&cfg), FleetKey::Held(_)));
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        let FleetKey::Missing(e) = FleetKey::load(&cfg) else {
            panic!("a 0644 key file was accepted");
        };
        assert!(matches!(e, KeyError::Mode { mode: 0o644, .. }), "{e}");
        let missing = FleetConfig {
            key_env: String::new(),
            ..FleetConfig::default()
        };
        assert!(matches!(
            FleetKey::load(&missing),
            FleetKey::Missing(KeyError::NoSource)
        ));
    }
}
