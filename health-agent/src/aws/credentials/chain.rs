//! Which source the keys come from: the first one set, in the SDKs' order (environment, web
//! identity, shared profile, container, instance role). A source that is set but unusable (a
//! web identity token without a role, a profile that does not exist or needs SSO) stops the
//! chain with its error, as in the SDKs, rather than the keys silently coming from the next.

use std::path::PathBuf;

use super::{
    container::Container,
    sts::{self, Role, WebIdentity},
    Base, Source,
};
use crate::aws::{
    profile::{self, Files, Profile, Profiles},
    sigv4::Credentials,
};

/// `role_arn` → `source_profile` hops followed at most.
const MAX_HOPS: usize = 8;

pub(super) fn select(env: &dyn Fn(&str) -> Option<String>) -> Source {
    let var = |k: &str| {
        env(k)
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    };
    if let Some(c) = environment(env) {
        return Source::Environment(c);
    }
    if let Some(token_file) = var("AWS_WEB_IDENTITY_TOKEN_FILE") {
        return match var("AWS_ROLE_ARN") {
            Some(role_arn) => Source::WebIdentity(WebIdentity {
                role_arn,
                token_file: token_file.into(),
                session_name: var("AWS_ROLE_SESSION_NAME").unwrap_or_else(sts::session_name),
            }),
            None => Source::Unusable {
                what: "web identity".into(),
                reason: "AWS_WEB_IDENTITY_TOKEN_FILE is set but AWS_ROLE_ARN is not".into(),
            },
        };
    }
    if let Some(s) = from_profile(env) {
        return s;
    }
    match Container::from_env(env) {
        Some(Ok(c)) => Source::Container(c),
        Some(Err(reason)) => Source::Unusable {
            what: "container credentials".into(),
            reason,
        },
        None => Source::Instance,
    }
}

/// `AWS_ACCESS_KEY_ID` and `AWS_SECRET_ACCESS_KEY` (and `AWS_SESSION_TOKEN`), both set.
pub(super) fn environment(env: &dyn Fn(&str) -> Option<String>) -> Option<Credentials> {
    let var = |k: &str| {
        env(k)
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    };
    Some(Credentials {
        access_key_id: var("AWS_ACCESS_KEY_ID")?,
        secret_access_key: var("AWS_SECRET_ACCESS_KEY")?,
        session_token: var("AWS_SESSION_TOKEN"),
    })
}

/// The selected profile's source; None when it is not named and has no credentials (or the
/// files do not exist): the chain goes on.
fn from_profile(env: &dyn Fn(&str) -> Option<String>) -> Option<Source> {
    let files = Files::from_env(env);
    let (name, named) = profile::selected(env);
    let what = format!("profile {name}");
    let unusable = |reason: String| {
        Some(Source::Unusable {
            what: what.clone(),
            reason,
        })
    };
    let profiles = match Profiles::load(&files) {
        Ok(p) => p,
        Err(e) => return unusable(e.to_string()),
    };
    let Some(p) = profiles.get(&name) else {
        return if named {
            unusable(format!("not found in {}", files.describe()))
        } else {
            None
        };
    };
    match resolve(&profiles, &name, p, env, &mut Vec::new()) {
        Ok(Some((base, roles))) => {
            let file = p
                .file_of(if roles.is_empty() {
                    "aws_access_key_id"
                } else {
                    "role_arn"
                })
                .map(PathBuf::from)
                .unwrap_or_default();
            Some(Source::Profile {
                name,
                file,
                base,
                roles,
            })
        }
        Ok(None) if named => unusable(format!(
            "has no credentials (aws_access_key_id and aws_secret_access_key, or role_arn) in {}",
            files.describe()
        )),
        Ok(None) => None,
        Err(reason) => unusable(reason),
    }
}

/// A profile's keys: a base, then the roles assumed in turn (the last is the one used).
type Resolved = (Base, Vec<Role>);

fn resolve(
    profiles: &Profiles,
    name: &str,
    p: &Profile,
    env: &dyn Fn(&str) -> Option<String>,
    seen: &mut Vec<String>,
) -> Result<Option<Resolved>, String> {
    if seen.len() > MAX_HOPS {
        return Err(format!("more than {MAX_HOPS} source_profile hops"));
    }
    seen.push(name.to_string());
    let Some(role_arn) = p.get("role_arn") else {
        if p.get("sso_session").is_some() || p.get("sso_start_url").is_some() {
            return Err(format!(
                "profile {name} signs in with IAM Identity Center (sso_session / sso_start_url), \
                 which health-agent does not support: give it static keys or a role_arn, or use \
                 another source"
            ));
        }
        if p.get("credential_process").is_some() {
            return Err(format!(
                "profile {name} runs a credential_process, which health-agent does not support: \
                 give it static keys or a role_arn, or use another source"
            ));
        }
        if p.get("login_session").is_some() {
            return Err(format!(
                "profile {name} uses a console login session, which health-agent does not support"
            ));
        }
        return Ok(static_keys(name, p).map(|c| (c, Vec::new())));
    };
    let role = Role {
        role_arn: role_arn.to_string(),
        session_name: p
            .get("role_session_name")
            .map(str::to_string)
            .unwrap_or_else(sts::session_name),
        external_id: p.get("external_id").map(str::to_string),
        profile: name.to_string(),
    };
    if let Some(token_file) = p.get("web_identity_token_file") {
        let w = WebIdentity {
            role_arn: role.role_arn,
            token_file: token_file.into(),
            session_name: role.session_name,
        };
        return Ok(Some((Base::WebIdentity(w), Vec::new())));
    }
    let (base, mut roles) = if let Some(src) = p.get("source_profile") {
        if src == name {
            // A profile may be its own source: its static keys assume its role.
            let base = static_keys(name, p).ok_or_else(|| {
                format!("profile {name} is its own source_profile but has no static keys")
            })?;
            (base, Vec::new())
        } else if seen.iter().any(|s| s == src) {
            return Err(format!("source_profile loop at profile {src}"));
        } else {
            let sp = profiles
                .get(src)
                .ok_or_else(|| format!("profile {name}: source_profile {src} does not exist"))?;
            resolve(profiles, src, sp, env, seen)?
                .ok_or_else(|| format!("profile {name}: source_profile {src} has no credentials"))?
        }
    } else if let Some(cs) = p.get("credential_source") {
        let base = match cs {
            "Environment" => {
                Base::Environment(super::chain::environment(env).ok_or_else(|| {
                    format!(
                        "profile {name}: credential_source = Environment, but AWS_ACCESS_KEY_ID / \
                     AWS_SECRET_ACCESS_KEY are not set"
                    )
                })?)
            }
            "EcsContainer" => match Container::from_env(env) {
                Some(Ok(c)) => Base::Container(c),
                Some(Err(e)) => return Err(format!("profile {name}: {e}")),
                None => {
                    return Err(format!(
                        "profile {name}: credential_source = EcsContainer, but no \
                         AWS_CONTAINER_CREDENTIALS_RELATIVE_URI / _FULL_URI is set"
                    ))
                }
            },
            "Ec2InstanceMetadata" => Base::Instance,
            other => {
                return Err(format!(
                    "profile {name}: credential_source {other:?} is not Environment, \
                     Ec2InstanceMetadata or EcsContainer"
                ))
            }
        };
        (base, Vec::new())
    } else {
        return Err(format!(
            "profile {name} has role_arn but neither source_profile, credential_source nor \
             web_identity_token_file"
        ));
    };
    roles.push(role);
    Ok(Some((base, roles)))
}

fn static_keys(name: &str, p: &Profile) -> Option<Base> {
    let credentials = Credentials {
        access_key_id: p.get("aws_access_key_id")?.to_string(),
        secret_access_key: p.get("aws_secret_access_key")?.to_string(),
        session_token: p.get("aws_session_token").map(str::to_string),
    };
    Some(Base::Static {
        profile: name.to_string(),
        file: p
            .file_of("aws_access_key_id")
            .map(PathBuf::from)
            .unwrap_or_default(),
        credentials,
    })
}
