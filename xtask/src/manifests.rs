//! The Kubernetes manifests in deploy/kubernetes/ applied together (`kubectl apply -f
//! deploy/kubernetes/`): no two documents may define the same object, kind + namespace + name,
//! or the later one silently replaces the earlier. kubernetes-validate checks each document
//! alone; this checks them against each other.
//!
//! It reads what it needs of each document without a YAML library: the top-level `kind:` and
//! the `name:` / `namespace:` directly under a block `metadata:`. A document it cannot read that
//! way is an error, never skipped.

use std::{collections::BTreeMap, path::Path};

use anyhow::{bail, Context, Result};

/// One object a manifest defines, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Object {
    pub kind: String,
    /// Empty: none written (a cluster-scoped kind, or the namespace `kubectl` is given).
    pub namespace: String,
    pub name: String,
    /// `file#document` (1-based), for the error.
    pub at: String,
}

/// The objects of `text` (one file, `---`-separated documents), `file` naming it in errors.
pub fn objects(file: &str, text: &str) -> Result<Vec<Object>> {
    let mut out = Vec::new();
    for (i, doc) in documents(text).into_iter().enumerate() {
        let at = format!("{file}#{}", i + 1);
        if let Some(o) = object(&doc, &at)? {
            out.push(o);
        }
    }
    Ok(out)
}

/// The documents of a stream: split at lines that are `---`, comments and blank lines dropped.
fn documents(text: &str) -> Vec<Vec<&str>> {
    let mut docs = vec![Vec::new()];
    for line in text.lines() {
        if line.trim_end() == "---" {
            docs.push(Vec::new());
        } else if !line.trim().is_empty() && !line.trim_start().starts_with('#') {
            docs.last_mut().expect("one at least").push(line);
        }
    }
    docs.into_iter().filter(|d| !d.is_empty()).collect()
}

/// A scalar as written: trailing comment and quotes off.
fn scalar(v: &str) -> String {
    let v = v.split(" #").next().unwrap_or(v).trim();
    v.trim_matches(|c| c == '"' || c == '\'').to_string()
}

fn object(doc: &[&str], at: &str) -> Result<Option<Object>> {
    let top = |key: &str| {
        doc.iter()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(':').map(scalar))
    };
    let Some(kind) = top("kind") else {
        bail!("{at}: a document without a top-level `kind:`");
    };
    let start = doc
        .iter()
        .position(|l| l.trim_end() == "metadata:")
        .with_context(|| {
            format!("{at}: {kind} without a block `metadata:` (flow style is not read)")
        })?;
    let block: Vec<&str> = doc[start + 1..]
        .iter()
        .take_while(|l| l.starts_with(' '))
        .copied()
        .collect();
    let indent = block.first().map_or(0, |l| l.len() - l.trim_start().len());
    let field = |key: &str| {
        block
            .iter()
            .filter(|l| l.len() - l.trim_start().len() == indent)
            .find_map(|l| {
                l.trim_start()
                    .strip_prefix(key)?
                    .strip_prefix(':')
                    .map(scalar)
            })
    };
    let Some(name) = field("name").filter(|n| !n.is_empty()) else {
        bail!("{at}: {kind} without metadata.name");
    };
    Ok(Some(Object {
        kind,
        namespace: field("namespace").unwrap_or_default(),
        name,
        at: at.to_string(),
    }))
}

/// Every kind + namespace + name defined more than once, with where: one line each.
pub fn collisions(objects: &[Object]) -> Vec<String> {
    let mut seen: BTreeMap<(&str, &str, &str), Vec<&str>> = BTreeMap::new();
    for o in objects {
        seen.entry((&o.kind, &o.namespace, &o.name))
            .or_default()
            .push(&o.at);
    }
    seen.into_iter()
        .filter(|(_, at)| at.len() > 1)
        .map(|((kind, ns, name), at)| {
            let ns = if ns.is_empty() { "(none)" } else { ns };
            format!(
                "{kind} {name} in namespace {ns} is defined by {}",
                at.join(" and ")
            )
        })
        .collect()
}

/// The check of the deploy stage: the objects of `files` (under `root`, named relative to it),
/// none defined twice. Returns how many objects there are.
pub fn check(root: &Path, files: &[&str]) -> Result<usize> {
    let mut all = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(root.join(f)).with_context(|| format!("reading {f}"))?;
        all.extend(objects(f, &text)?);
    }
    let twice = collisions(&all);
    if !twice.is_empty() {
        bail!(
            "the Kubernetes manifests cannot be applied together: the later would replace the \
             earlier (give each example its own names):\n{}",
            twice.join("\n")
        );
    }
    Ok(all.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEPLOYMENT: &str = "# a comment\napiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web # the app\n  namespace: web\n  labels:\n    name: not-this\nspec:\n  template:\n    metadata:\n      name: nor-this\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: \"web-health-agent\"\n  namespace: web\n";

    #[test]
    fn reads_kind_namespace_and_name_of_each_document() {
        let o = objects("a.yaml", DEPLOYMENT).unwrap();
        let keys: Vec<_> = o
            .iter()
            .map(|o| (o.kind.as_str(), o.namespace.as_str(), o.name.as_str()))
            .collect();
        assert_eq!(
            keys,
            [
                ("Deployment", "web", "web"),
                ("ConfigMap", "web", "web-health-agent")
            ]
        );
        assert_eq!(o[1].at, "a.yaml#2");
    }

    #[test]
    fn the_same_object_in_two_files_is_a_collision_naming_both() {
        let mut all = objects("drain.yaml", DEPLOYMENT).unwrap();
        all.extend(objects("hpa.yaml", DEPLOYMENT).unwrap());
        let twice = collisions(&all);
        assert_eq!(twice.len(), 2, "{twice:?}");
        assert!(
            twice.iter().any(|c| c
                == "Deployment web in namespace web is defined by drain.yaml#1 and hpa.yaml#1"),
            "{twice:?}"
        );
        // Another namespace or another kind is another object.
        let other = DEPLOYMENT.replace("namespace: web", "namespace: shop");
        let mut all = objects("drain.yaml", DEPLOYMENT).unwrap();
        all.extend(objects("hpa.yaml", &other).unwrap());
        assert!(collisions(&all).is_empty());
    }

    #[test]
    fn a_document_it_cannot_read_is_an_error() {
        assert!(objects("x.yaml", "apiVersion: v1\nmetadata:\n  name: a\n").is_err());
        assert!(objects("x.yaml", "kind: ConfigMap\nmetadata: {name: a}\n").is_err());
        assert!(objects(
            "x.yaml",
            "kind: ConfigMap\nmetadata:\n  labels:\n    a: b\n"
        )
        .is_err());
    }

    #[test]
    fn the_shipped_manifests_apply_together_and_each_is_checked() {
        let root = crate::cmd::root();
        let n = check(root, crate::deploy::KUBERNETES).unwrap();
        assert!(n >= 10, "{n} objects");
        let mut shipped: Vec<String> = std::fs::read_dir(root.join("deploy/kubernetes"))
            .unwrap()
            .map(|e| {
                format!(
                    "deploy/kubernetes/{}",
                    e.unwrap().file_name().to_string_lossy()
                )
            })
            .filter(|f| f.ends_with(".yaml"))
            .collect();
        shipped.sort();
        let mut listed: Vec<String> = crate::deploy::KUBERNETES
            .iter()
            .map(|f| f.to_string())
            .collect();
        listed.sort();
        assert_eq!(shipped, listed, "deploy::KUBERNETES lists every manifest");
    }

    /// What `script` prints (JSON) with `input` on its stdin, run by the Python that runs
    /// kubernetes-validate: xtask has no YAML library, that interpreter has PyYAML (the
    /// validator's dependency) and tomllib.
    fn python(script: &str, input: &str) -> serde_json::Value {
        use std::io::Write;
        let validator = crate::setup::pip_tool("kubernetes-validate").unwrap();
        let shebang = std::fs::read_to_string(&validator).unwrap_or_default();
        let interpreter = shebang
            .lines()
            .next()
            .and_then(|l| l.strip_prefix("#!"))
            .map(str::trim)
            .filter(|p| Path::new(p).is_file())
            .unwrap_or("python3")
            .to_owned();
        let mut child = std::process::Command::new(&interpreter)
            .args(["-c", script])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("running {interpreter}: {e}"));
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(input.as_bytes())
            .expect("writing to python");
        let out = child.wait_with_output().expect("python's output");
        assert!(out.status.success(), "{interpreter} -c {script} failed");
        serde_json::from_slice(&out.stdout).expect("JSON")
    }

    /// The DaemonSet's agent takes the fleet key from the Secret health-agent-fleet-key (key
    /// fleet.key) in the variable its config reads it from, optional so that a cluster without
    /// the Secret still runs the agent. Read as YAML, and the ConfigMap's config as TOML.
    #[test]
    fn the_daemonset_takes_the_fleet_key_from_its_secret() {
        let file = crate::cmd::root().join("deploy/kubernetes/health-agent.yaml");
        let text = std::fs::read_to_string(&file).unwrap();
        let docs = python(
            "import json, sys, yaml; print(json.dumps([d for d in yaml.safe_load_all(sys.stdin) if d]))",
            &text,
        );
        let docs = docs.as_array().expect("documents");
        let kind = |k: &str| docs.iter().find(|d| d["kind"] == k).expect(k);
        let pod = &kind("DaemonSet")["spec"]["template"]["spec"];
        let agent = pod["containers"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["name"] == "health-agent"))
            .expect("the health-agent container");
        let key: Vec<_> = agent["env"]
            .as_array()
            .map(|env| {
                env.iter()
                    .filter(|e| e["name"] == "HEALTH_AGENT_FLEET_KEY")
                    .collect()
            })
            .unwrap_or_default();
        assert_eq!(key.len(), 1, "one HEALTH_AGENT_FLEET_KEY: {}", agent["env"]);
        assert_eq!(
            key[0]["valueFrom"],
            serde_json::json!({"secretKeyRef": {
                "name": "health-agent-fleet-key", "key": "fleet.key", "optional": true}}),
            "from the Secret, never a value in the manifest: {}",
            key[0]
        );
        assert!(key[0].get("value").is_none(), "{}", key[0]);

        // The config the ConfigMap mounts reads the key from that variable: no key_file, and
        // key_env left at its default or naming it.
        let config_map = pod["volumes"]
            .as_array()
            .and_then(|v| v.iter().find_map(|v| v["configMap"]["name"].as_str()))
            .expect("the config's ConfigMap");
        let toml = docs
            .iter()
            .find(|d| d["kind"] == "ConfigMap" && d["metadata"]["name"] == config_map)
            .and_then(|d| d["data"]["health-agent.toml"].as_str())
            .expect("the ConfigMap's health-agent.toml");
        let config = python(
            "import json, sys, tomllib; print(json.dumps(tomllib.loads(sys.stdin.read())))",
            toml,
        );
        let fleet = &config["fleet"];
        assert!(
            fleet["key_file"].as_str().unwrap_or_default().is_empty(),
            "the config reads a key_file, not the variable the DaemonSet sets: {fleet}"
        );
        assert!(
            matches!(
                fleet["key_env"].as_str(),
                None | Some("HEALTH_AGENT_FLEET_KEY")
            ),
            "the config reads another variable than the DaemonSet sets: {fleet}"
        );
    }
}
