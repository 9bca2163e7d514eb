//! The shared config and credentials files, as the AWS SDKs and CLI read them: the profile
//! `AWS_PROFILE` names (else `default`), its properties from `AWS_CONFIG_FILE` (else
//! `~/.aws/config`, sections `[default]` and `[profile NAME]`) and `AWS_SHARED_CREDENTIALS_FILE`
//! (else `~/.aws/credentials`, sections `[NAME]`), the credentials file winning where both set
//! a key. Lines starting `#` or `;` are comments, and so is the rest of a value after a
//! whitespace and `#` or `;`; indented lines under a key (nested settings such as `s3 =`) are
//! not used here. Errors name the file and line, never the line's text (it may hold a key).

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProfileError {
    #[error("{file}: {reason}")]
    Unreadable { file: String, reason: String },
    #[error("{file} line {line}: {what}")]
    Syntax {
        file: String,
        line: usize,
        what: &'static str,
    },
}

/// Where the two files are; None when neither the variable nor `HOME` says.
#[derive(Debug, Clone, Default)]
pub struct Files {
    pub config: Option<PathBuf>,
    pub credentials: Option<PathBuf>,
}

impl Files {
    pub fn from_env(env: &dyn Fn(&str) -> Option<String>) -> Self {
        let var = |k: &str| {
            env(k)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        let home = var("HOME");
        let path = |var_name: &str, default: &str| -> Option<PathBuf> {
            match var(var_name) {
                Some(p) => match (p.strip_prefix("~/"), &home) {
                    (Some(rest), Some(h)) => Some(Path::new(h).join(rest)),
                    _ => Some(PathBuf::from(p)),
                },
                None => home.as_ref().map(|h| Path::new(h).join(default)),
            }
        };
        Self {
            config: path("AWS_CONFIG_FILE", ".aws/config"),
            credentials: path("AWS_SHARED_CREDENTIALS_FILE", ".aws/credentials"),
        }
    }

    /// "~/.aws/config or ~/.aws/credentials", as they are here.
    pub fn describe(&self) -> String {
        let shown = |p: &Option<PathBuf>| p.as_ref().map(|p| p.display().to_string());
        [shown(&self.config), shown(&self.credentials)]
            .into_iter()
            .flatten()
            .collect::<Vec<_>>()
            .join(" or ")
    }
}

/// The profile to use: `AWS_PROFILE` (or the CLI's older `AWS_DEFAULT_PROFILE`), else
/// `default`; true when a variable named it.
pub fn selected(env: &dyn Fn(&str) -> Option<String>) -> (String, bool) {
    let var = |k: &str| {
        env(k)
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    };
    match var("AWS_PROFILE").or_else(|| var("AWS_DEFAULT_PROFILE")) {
        Some(p) => (p, true),
        None => ("default".into(), false),
    }
}

/// One property and the file it came from.
#[derive(Clone)]
struct Prop {
    value: String,
    file: PathBuf,
}

/// One profile, merged from both files. No `Debug`: values may be secret keys.
#[derive(Clone, Default)]
pub struct Profile {
    props: BTreeMap<String, Prop>,
}

impl Profile {
    /// A property's value (keys are lower case), None when unset or empty.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.props
            .get(key)
            .map(|p| p.value.as_str())
            .filter(|v| !v.is_empty())
    }

    /// The file that set `key`.
    pub fn file_of(&self, key: &str) -> Option<&Path> {
        self.props.get(key).map(|p| p.file.as_path())
    }
}

/// Every profile of both files, by name.
#[derive(Clone, Default)]
pub struct Profiles {
    map: BTreeMap<String, Profile>,
}

impl Profiles {
    /// Reads both files; a file that does not exist is empty.
    pub fn load(files: &Files) -> Result<Self, ProfileError> {
        let mut out = Self::default();
        // The config file first: the credentials file wins where both set a key.
        for (path, is_config) in [(&files.config, true), (&files.credentials, false)] {
            let Some(path) = path else { continue };
            let text = match std::fs::read_to_string(path) {
                Ok(t) => t,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => {
                    return Err(ProfileError::Unreadable {
                        file: path.display().to_string(),
                        reason: e.to_string(),
                    })
                }
            };
            out.parse(&text, path, is_config)?;
        }
        Ok(out)
    }

    pub fn get(&self, name: &str) -> Option<&Profile> {
        self.map.get(name)
    }

    pub fn parse(&mut self, text: &str, path: &Path, is_config: bool) -> Result<(), ProfileError> {
        let err = |line: usize, what: &'static str| ProfileError::Syntax {
            file: path.display().to_string(),
            line,
            what,
        };
        // The profile the lines belong to; None: before any section, or a section that is not
        // a profile (`[sso-session x]`, `[services x]`).
        let mut current: Option<String> = None;
        let mut in_property = false;
        for (i, raw) in text.lines().enumerate() {
            let n = i + 1;
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
                continue;
            }
            if let Some(inner) = line.strip_prefix('[') {
                let end = inner
                    .find(']')
                    .ok_or(err(n, "a section header without ']'"))?;
                let rest = inner[end + 1..].trim();
                if !(rest.is_empty() || rest.starts_with('#') || rest.starts_with(';')) {
                    return Err(err(n, "text after a section header"));
                }
                current = profile_name(inner[..end].trim(), is_config);
                if let Some(name) = &current {
                    self.map.entry(name.clone()).or_default();
                }
                in_property = false;
                continue;
            }
            if raw.starts_with([' ', '\t']) && in_property {
                // A nested setting under the key above: not used by the agent.
                continue;
            }
            let eq = line
                .find('=')
                .ok_or(err(n, "neither a [section] nor key = value"))?;
            let key = line[..eq].trim().to_ascii_lowercase();
            if key.is_empty() {
                return Err(err(n, "a value without a key"));
            }
            in_property = true;
            if let Some(name) = &current {
                let value = without_comment(line[eq + 1..].trim()).to_string();
                let profile = self.map.entry(name.clone()).or_default();
                profile.props.insert(
                    key,
                    Prop {
                        value,
                        file: path.to_path_buf(),
                    },
                );
            }
        }
        Ok(())
    }
}

/// A section's profile name: in the config file `default` or `profile NAME`, in the
/// credentials file the name itself.
fn profile_name(section: &str, is_config: bool) -> Option<String> {
    if !is_config {
        return (!section.is_empty()).then(|| section.to_string());
    }
    if section == "default" {
        return Some("default".into());
    }
    let rest = section.strip_prefix("profile")?;
    rest.starts_with([' ', '\t'])
        .then(|| rest.trim().to_string())
        .filter(|n| !n.is_empty())
}

/// `value # comment` → `value`.
fn without_comment(value: &str) -> &str {
    let bytes = value.as_bytes();
    for (i, b) in bytes.iter().enumerate() {
        if (*b == b'#' || *b == b';') && i > 0 && bytes[i - 1].is_ascii_whitespace() {
            return value[..i].trim_end();
        }
    }
    value
}

/// The region of the selected profile, if the files say one.
pub fn region(env: &dyn Fn(&str) -> Option<String>) -> Option<String> {
    let profiles = Profiles::load(&Files::from_env(env)).ok()?;
    let (name, _) = selected(env);
    profiles.get(&name)?.get("region").map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONFIG: &str = "\
# a comment
[default]
region = eu-west-1 # the home region
[profile prod]
region=us-east-2
role_arn = arn:aws:iam::123456789012:role/agent
source_profile = base
s3 =
  max_concurrent_requests = 20
[sso-session corp]
sso_region = us-east-1
[profile  spaced ]
region = ap-south-1
[notaprofile]
region = nowhere
";
    const CREDENTIALS: &str = "\
; keys
[base]
aws_access_key_id = AKIDBASE
aws_secret_access_key = se;cret#with/marks
[default]
aws_access_key_id=AKIDDEFAULT
aws_secret_access_key=SECRETDEFAULT
region = us-west-2
[profile odd]
aws_access_key_id = AKIDODD
";

    fn profiles() -> Profiles {
        let mut p = Profiles::default();
        p.parse(CONFIG, Path::new("/h/.aws/config"), true).unwrap();
        p.parse(CREDENTIALS, Path::new("/h/.aws/credentials"), false)
            .unwrap();
        p
    }

    #[test]
    fn both_files_merge_with_the_credentials_file_winning() {
        let p = profiles();
        let d = p.get("default").unwrap();
        assert_eq!(d.get("aws_access_key_id"), Some("AKIDDEFAULT"));
        assert_eq!(
            d.get("region"),
            Some("us-west-2"),
            "the credentials file wins"
        );
        assert_eq!(
            d.file_of("aws_access_key_id"),
            Some(Path::new("/h/.aws/credentials"))
        );
        let prod = p.get("prod").unwrap();
        assert_eq!(prod.get("region"), Some("us-east-2"));
        assert_eq!(prod.get("source_profile"), Some("base"));
        assert_eq!(
            prod.get("max_concurrent_requests"),
            None,
            "nested, not used"
        );
        assert_eq!(
            p.get("base").unwrap().get("aws_secret_access_key"),
            Some("se;cret#with/marks"),
            "a mark without white space before it is part of the value"
        );
        assert_eq!(p.get("spaced").unwrap().get("region"), Some("ap-south-1"));
        assert!(
            p.get("notaprofile").is_none(),
            "config sections need `profile `"
        );
        assert!(p.get("corp").is_none(), "sso-session is not a profile");
        assert_eq!(
            p.get("profile odd").unwrap().get("aws_access_key_id"),
            Some("AKIDODD"),
            "the credentials file takes the section name as it is"
        );
    }

    #[test]
    fn errors_name_the_file_and_line_but_not_its_text() {
        let mut p = Profiles::default();
        let e = p
            .parse(
                "[default]\nAKIDLEAKED SECRETLEAKED\n",
                Path::new("/x/credentials"),
                false,
            )
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "/x/credentials line 2: neither a [section] nor key = value"
        );
        let e = p
            .parse("[default\n", Path::new("/x/config"), true)
            .unwrap_err();
        assert!(e.to_string().contains("line 1"), "{e}");
    }

    #[test]
    fn files_and_profile_come_from_the_environment() {
        let env = |k: &str| match k {
            "HOME" => Some("/home/u".to_string()),
            "AWS_CONFIG_FILE" => Some("~/cfg".to_string()),
            "AWS_PROFILE" => Some("prod".to_string()),
            _ => None,
        };
        let f = Files::from_env(&env);
        assert_eq!(f.config, Some(PathBuf::from("/home/u/cfg")));
        assert_eq!(
            f.credentials,
            Some(PathBuf::from("/home/u/.aws/credentials"))
        );
        assert_eq!(selected(&env), ("prod".to_string(), true));
        assert_eq!(selected(&|_| None), ("default".to_string(), false));
        let nothing = Files::from_env(&|_| None);
        assert!(nothing.config.is_none() && nothing.credentials.is_none());
    }
}
