//! Where the web backend listens: the network namespace (the agent's own, `web.netns`, or
//! `web.container`'s, found through Docker and found again when the container restarts), the
//! port inside it (a published host port maps to the container's port), a sock_diag socket
//! made in that namespace, and the address the probe should use.
//!
//! Without `web.netns` or `web.container` the agent looks only in its own namespace. It does
//! not search the host's other namespaces for a listener on the port: every pod or container
//! may listen on the same number, so whichever it found would be a guess, and a wrong guess
//! watches someone else's server. `details.web.namespace` says where it looked.

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    path::{Path, PathBuf},
    sync::Arc,
};

use serde::Serialize;

use crate::{config::WebConfig, engine::ContainerNet, net::Listener, netns::Namespace};

/// `details.web.namespace`: where the backend was looked for.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct NamespaceView {
    /// `own`, `netns` or `container`.
    pub source: &'static str,
    pub path: String,
    pub inode: u64,
    /// The port watched inside the namespace.
    pub port: u16,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
    /// Set when `web.port` was a host port the container publishes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub published_port: Option<u16>,
}

/// A resolved target: the namespace, and the port in it (the watching reads it there with a
/// sock_diag socket of its own, `reader::PortSocket`).
pub struct Target {
    pub ns: Arc<Namespace>,
    pub port: u16,
    pub view: NamespaceView,
}

impl Target {
    fn new(
        ns: Namespace,
        port: u16,
        source: &'static str,
        container: Option<String>,
        published_port: Option<u16>,
    ) -> Arc<Self> {
        let view = NamespaceView {
            source,
            path: ns.path().display().to_string(),
            inode: ns.inode(),
            port,
            container,
            published_port,
        };
        Arc::new(Self {
            ns: Arc::new(ns),
            port,
            view,
        })
    }
}

/// Why there is no target (yet): the agent's own problem or a container that is not running.
#[derive(Debug, Clone, PartialEq)]
pub enum Unresolved {
    /// Not known yet, or the agent could not look (Docker not answering, a namespace that
    /// cannot be opened): never a verdict on the backend.
    Unknown(String),
    /// The backend's container is not running: nothing can listen.
    NotRunning(String),
    /// What `web.container` or `web.netns` names does not exist (or is not a namespace): a
    /// configuration mistake, or a container being recreated (the monitor tells these apart by
    /// whether it was ever found). Never a verdict on the backend.
    NotFound { key: &'static str, what: String },
    /// The agent's own error: it cannot open the namespace (no permission). Never evidence
    /// against the backend.
    AgentError(String),
}

/// Finds the target for the configured source, keeping the current one while it still holds.
pub fn resolve(
    cfg: &WebConfig,
    current: Option<Arc<Target>>,
    container: Option<&Result<ContainerNet, crate::engine::EngineError>>,
) -> Result<Arc<Target>, Unresolved> {
    let unknown = |what: String| Unresolved::Unknown(what);
    if !cfg.container.is_empty() {
        let net = match container {
            None => {
                return Err(unknown(format!(
                    "waiting for the container engine to report container {}",
                    cfg.container
                )))
            }
            Some(Err(crate::engine::EngineError::NoSuchContainer { engine, name })) => {
                return Err(Unresolved::NotFound {
                    key: "web.container",
                    what: format!("container {name:?} not found ({engine} has none of that name)"),
                })
            }
            Some(Err(e)) => return Err(unknown(e.to_string())),
            Some(Ok(net)) => net,
        };
        let Some(pid) = net.pid else {
            return Err(Unresolved::NotRunning(format!(
                "container {} is not running",
                cfg.container
            )));
        };
        let (port, published) = net.inside_port(cfg.port);
        let path = if net.host_network {
            PathBuf::from("/proc/self/ns/net")
        } else {
            PathBuf::from(format!("/proc/{pid}/ns/net"))
        };
        if let Some(t) = current.filter(|t| {
            t.port == port && t.view.published_port == published && same_namespace(&t.ns, &path)
        }) {
            return Ok(t);
        }
        let ns = Namespace::open(&path).map_err(|e| {
            let why = format!(
                "opening container {}'s network namespace {}: {e}",
                cfg.container,
                path.display()
            );
            // Gone: the process Docker last named has exited (a restart under way); the next
            // Docker report names the new one. Anything else is the agent's own trouble.
            if e.kind() == std::io::ErrorKind::NotFound {
                Unresolved::Unknown(why)
            } else {
                Unresolved::AgentError(why)
            }
        })?;
        return Ok(Target::new(
            ns,
            port,
            "container",
            Some(cfg.container.clone()),
            published,
        ));
    }
    if let Some(t) = current {
        return Ok(t);
    }
    if !cfg.netns.is_empty() {
        let path = Path::new(&cfg.netns);
        let ns = Namespace::open(path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => Unresolved::NotFound {
                key: "web.netns",
                what: format!("{} not found", path.display()),
            },
            std::io::ErrorKind::InvalidInput => Unresolved::NotFound {
                key: "web.netns",
                what: e.to_string(),
            },
            _ => Unresolved::AgentError(format!("opening web.netns {}: {e}", path.display())),
        })?;
        return Ok(Target::new(ns, cfg.port, "netns", None, None));
    }
    let ns = Namespace::own()
        .map_err(|e| Unresolved::AgentError(format!("the agent's namespace: {e}")))?;
    Ok(Target::new(ns, cfg.port, "own", None, None))
}

/// Whether `path` is (still) the namespace `ns`: a restarted container has a new one.
fn same_namespace(ns: &Namespace, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).is_ok_and(|m| m.ino() == ns.inode())
}

/// Where the probe should connect: the listener's own address, and where to go when that
/// cannot even be tried. An IPv4 wildcard or loopback listener is probed on 127.0.0.1, an IPv6
/// wildcard on ::1, anything else on the address it is bound to — inside its namespace, that
/// is the address the server answers on. A `::` listener is dual-stack by default, and the
/// namespace may have no IPv6 at all (Docker turns it off in containers): then `::1` cannot be
/// assigned and the probe goes to 127.0.0.1, the fallback, instead.
pub fn probe_addr(listeners: &[Listener], port: u16) -> Option<(SocketAddr, Option<SocketAddr>)> {
    let pick = |l: &Listener| match l.addr {
        IpAddr::V4(a) if a.is_unspecified() => (IpAddr::V4(Ipv4Addr::LOCALHOST), None),
        IpAddr::V6(a) if a.is_unspecified() => (
            IpAddr::V6(Ipv6Addr::LOCALHOST),
            Some(IpAddr::V4(Ipv4Addr::LOCALHOST)),
        ),
        a => (a, None),
    };
    // Loopback first (no route involved), then IPv4, then anything.
    let rank = |(a, _): &(IpAddr, Option<IpAddr>)| (!a.is_loopback(), !a.is_ipv4());
    listeners
        .iter()
        .map(pick)
        .min_by_key(rank)
        .map(|(ip, fallback)| {
            (
                SocketAddr::new(ip, port),
                fallback.map(|f| SocketAddr::new(f, port)),
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listener(addr: &str) -> Listener {
        Listener {
            addr: addr.parse().unwrap(),
            port: 9000,
            queue: 0,
            max_queue: 128,
            inode: 1,
        }
    }

    #[test]
    fn the_probe_goes_to_the_listeners_own_address() {
        let at = |addrs: &[&str]| {
            let ls: Vec<Listener> = addrs.iter().map(|a| listener(a)).collect();
            probe_addr(&ls, 9000).map(|(a, _)| a.to_string())
        };
        assert_eq!(at(&["0.0.0.0"]), Some("127.0.0.1:9000".into()));
        assert_eq!(at(&["::"]), Some("[::1]:9000".into()));
        assert_eq!(at(&["::1"]), Some("[::1]:9000".into()));
        assert_eq!(at(&["10.213.0.2"]), Some("10.213.0.2:9000".into()));
        assert_eq!(at(&["10.213.0.2", "::1"]), Some("[::1]:9000".into()));
        assert_eq!(at(&["::", "0.0.0.0"]), Some("127.0.0.1:9000".into()));
        assert_eq!(at(&[]), None);
    }

    /// A dual-stack `::` listener in a namespace without IPv6 is reached on 127.0.0.1; every
    /// other listener has one address only.
    #[test]
    fn a_wildcard_ipv6_listener_falls_back_to_ipv4_loopback() {
        let fallback = |addr: &str| probe_addr(&[listener(addr)], 9000).and_then(|(_, f)| f);
        assert_eq!(fallback("::"), Some("127.0.0.1:9000".parse().unwrap()));
        for one in ["0.0.0.0", "::1", "127.0.0.1", "10.213.0.2", "fd00::2"] {
            assert_eq!(fallback(one), None, "{one}");
        }
    }

    #[test]
    fn a_container_that_is_not_running_or_unknown_is_said_so() {
        let cfg = WebConfig {
            port: 9000,
            container: "web".into(),
            ..WebConfig::default()
        };
        assert!(matches!(
            resolve(&cfg, None, None),
            Err(Unresolved::Unknown(_))
        ));
        let stopped = Ok(ContainerNet {
            pid: None,
            host_network: false,
            published: Vec::new(),
        });
        assert!(matches!(
            resolve(&cfg, None, Some(&stopped)),
            Err(Unresolved::NotRunning(m)) if m.contains("web")
        ));
        let docker_down = Err(crate::engine::EngineError::Call {
            engine: "docker",
            call: "inspect",
            name: "web".into(),
            reason: "connection refused".into(),
        });
        assert!(matches!(
            resolve(&cfg, None, Some(&docker_down)),
            Err(Unresolved::Unknown(m)) if m.contains("connection refused")
        ));
        // The process Docker named is gone (the container restarts): not the agent's error,
        // just a view to refresh. Above pid_max: no such process, ever.
        let gone = Ok(ContainerNet {
            pid: Some(4_194_305),
            host_network: false,
            published: Vec::new(),
        });
        assert!(matches!(
            resolve(&cfg, None, Some(&gone)),
            Err(Unresolved::Unknown(m)) if m.contains("/proc/4194305/ns/net")
        ));
    }

    #[test]
    fn a_container_or_namespace_that_does_not_exist_is_not_found_naming_the_key() {
        let cfg = WebConfig {
            port: 9000,
            container: "wbe".into(),
            ..WebConfig::default()
        };
        let missing = Err(crate::engine::EngineError::NoSuchContainer {
            engine: "Docker".into(),
            name: "wbe".into(),
        });
        assert!(matches!(
            resolve(&cfg, None, Some(&missing)),
            Err(Unresolved::NotFound { key: "web.container", what }) if what.contains("wbe")
        ));
        let cfg = WebConfig {
            port: 9000,
            netns: "/var/run/netns/no-such-namespace".into(),
            ..WebConfig::default()
        };
        assert!(matches!(
            resolve(&cfg, None, None),
            Err(Unresolved::NotFound { key: "web.netns", what }) if what.contains("no-such-namespace")
        ));
        // A file that is not a namespace is the same mistake.
        let cfg = WebConfig {
            port: 9000,
            netns: "/etc/hostname".into(),
            ..WebConfig::default()
        };
        assert!(matches!(
            resolve(&cfg, None, None),
            Err(Unresolved::NotFound { key: "web.netns", what }) if what.contains("not a namespace")
        ));
    }

    #[test]
    fn a_host_network_container_is_watched_in_the_agents_namespace() {
        let cfg = WebConfig {
            port: 9000,
            container: "web".into(),
            ..WebConfig::default()
        };
        let host = Ok(ContainerNet {
            pid: Some(std::process::id()),
            host_network: true,
            published: Vec::new(),
        });
        let t = resolve(&cfg, None, Some(&host)).unwrap();
        assert!(t.ns.is_own());
        assert_eq!((t.view.source, t.port), ("container", 9000));
    }
}
