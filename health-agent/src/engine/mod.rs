//! The container engines the agent asks about containers and restarts them through: the Docker
//! Engine API (`docker`, which Podman also serves) and containerd's own API (`containerd`),
//! chosen by the address configured or, when none is, by the socket that exists.

pub mod containerd;
pub mod docker;
mod types;

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

pub use types::{ContainerNet, EngineError};

use self::{containerd::Containerd, docker::Docker};

/// The Engine API sockets tried first, in order: Docker's, then rootful Podman's.
pub const ENGINE_API_SOCKETS: [&str; 2] = ["/var/run/docker.sock", "/run/podman/podman.sock"];

/// Where the engine is: an Engine API address (`unix://…`, `http://…`) or containerd's socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Address {
    Api(String),
    Containerd(String),
}

impl std::fmt::Display for Address {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Api(a) => write!(f, "{a}"),
            Self::Containerd(s) => write!(f, "containerd at {s}"),
        }
    }
}

/// The engine `docker_host` / `containerd_socket` name; with neither set, the first socket
/// that exists of Docker's, rootful Podman's, rootless Podman's (`$XDG_RUNTIME_DIR`, then
/// `/run/user/UID`, lowest UID first) and containerd's — Docker's when none does, so the error
/// names the usual one.
pub fn address(docker_host: &str, containerd_socket: &str) -> Address {
    let mut api: Vec<PathBuf> = ENGINE_API_SOCKETS.iter().map(PathBuf::from).collect();
    api.extend(rootless_podman_sockets(
        std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from),
        Path::new("/run/user"),
    ));
    address_among(
        docker_host,
        containerd_socket,
        &api,
        Path::new(containerd::SOCKET),
    )
}

fn address_among(
    docker_host: &str,
    containerd_socket: &str,
    api: &[PathBuf],
    containerd: &Path,
) -> Address {
    if !docker_host.is_empty() {
        return Address::Api(docker_host.to_string());
    }
    if !containerd_socket.is_empty() {
        return Address::Containerd(containerd_socket.to_string());
    }
    if let Some(found) = api.iter().find(|p| p.exists()) {
        return Address::Api(format!("unix://{}", found.display()));
    }
    if containerd.exists() {
        return Address::Containerd(containerd.display().to_string());
    }
    Address::Api(format!("unix://{}", ENGINE_API_SOCKETS[0]))
}

/// Rootless Podman's API sockets: `$XDG_RUNTIME_DIR/podman/podman.sock`, then each
/// `/run/user/UID/podman/podman.sock` by UID.
fn rootless_podman_sockets(xdg_runtime_dir: Option<PathBuf>, run_user: &Path) -> Vec<PathBuf> {
    let mut uids: Vec<u32> = std::fs::read_dir(run_user)
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    uids.sort_unstable();
    xdg_runtime_dir
        .into_iter()
        .chain(uids.into_iter().map(|u| run_user.join(u.to_string())))
        .map(|d| d.join("podman/podman.sock"))
        .collect()
}

/// A connected engine client.
#[derive(Clone)]
pub enum Engine {
    Api(Docker),
    Containerd(Containerd),
}

impl Engine {
    /// A client for `address`. Lazy: this fails only on a malformed address, never because the
    /// engine is down.
    pub fn connect(
        address: &Address,
        namespaces: &[String],
        timeout: Duration,
    ) -> Result<Self, EngineError> {
        match address {
            Address::Api(host) => Docker::connect(host, timeout).map(Self::Api),
            Address::Containerd(socket) => {
                let path = socket.strip_prefix("unix://").unwrap_or(socket);
                if !path.starts_with('/') {
                    return Err(EngineError::Address {
                        key: "containers.containerd_socket",
                        address: socket.clone(),
                        reason: "use an absolute path such as /run/containerd/containerd.sock"
                            .into(),
                    });
                }
                Ok(Self::Containerd(Containerd::new(path, namespaces, timeout)))
            }
        }
    }

    /// Which engine answers, with its version ("Docker 20.10.24", "Podman 4.3.1",
    /// "containerd 1.6.20"); None when it does not answer.
    pub async fn engine(&self) -> Option<String> {
        match self {
            Self::Api(d) => d.engine().await,
            Self::Containerd(c) => c.engine().await,
        }
    }

    /// Restarts `name` within `timeout`.
    pub async fn restart(&self, name: &str, timeout: Duration) -> Result<(), EngineError> {
        match self {
            Self::Api(d) => d.restart(name, timeout).await,
            Self::Containerd(c) => c.restart(name, timeout).await,
        }
    }

    /// Where `name`'s network lives, re-read every round (a restarted container has a new
    /// process and namespace).
    pub async fn network_of(&self, name: &str) -> Result<ContainerNet, EngineError> {
        match self {
            Self::Api(d) => d.network_of(name).await,
            Self::Containerd(c) => c.network_of(name).await,
        }
    }

    /// The client's name in what a restart is called: "docker" (the Engine API, whichever
    /// engine serves it) or "containerd".
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Api(_) => "docker",
            Self::Containerd(_) => "containerd",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_configured_address_wins_then_the_first_socket_that_exists() {
        let dir = tempfile::tempdir().unwrap();
        let docker = dir.path().join("docker.sock");
        let podman = dir.path().join("podman.sock");
        let containerd = dir.path().join("containerd.sock");
        let api = [docker.clone(), podman.clone()];
        let pick = |dh: &str, cs: &str| address_among(dh, cs, &api, &containerd);
        assert_eq!(
            pick("", ""),
            Address::Api("unix:///var/run/docker.sock".into()),
            "none exists: Docker's, named in the error"
        );
        std::fs::write(&containerd, "").unwrap();
        assert_eq!(
            pick("", ""),
            Address::Containerd(containerd.display().to_string()),
            "a containerd-only node"
        );
        std::fs::write(&podman, "").unwrap();
        assert_eq!(
            pick("", ""),
            Address::Api(format!("unix://{}", podman.display()))
        );
        std::fs::write(&docker, "").unwrap();
        assert_eq!(
            pick("", ""),
            Address::Api(format!("unix://{}", docker.display()))
        );
        assert_eq!(
            pick("http://127.0.0.1:2375", ""),
            Address::Api("http://127.0.0.1:2375".into())
        );
        assert_eq!(
            pick("", "/host/run/containerd/containerd.sock"),
            Address::Containerd("/host/run/containerd/containerd.sock".into())
        );
    }

    #[test]
    fn rootless_podman_is_looked_for_in_the_runtime_dir_then_by_uid() {
        let run_user = tempfile::tempdir().unwrap();
        for d in ["1001", "1000", "not-a-uid"] {
            std::fs::create_dir(run_user.path().join(d)).unwrap();
        }
        let got = rootless_podman_sockets(Some("/run/user/0".into()), run_user.path());
        assert_eq!(
            got,
            [
                PathBuf::from("/run/user/0/podman/podman.sock"),
                run_user.path().join("1000/podman/podman.sock"),
                run_user.path().join("1001/podman/podman.sock"),
            ]
        );
        assert!(rootless_podman_sockets(None, Path::new("/nonexistent")).is_empty());
    }

    #[test]
    fn a_relative_containerd_socket_is_refused_naming_the_key() {
        let e = Engine::connect(
            &Address::Containerd("run/c.sock".into()),
            &[],
            Duration::from_secs(1),
        )
        .err()
        .expect("refused");
        assert!(
            e.to_string().contains("containers.containerd_socket"),
            "{e}"
        );
    }
}
