//! What both engine clients answer in: where a container's network lives, its resource use,
//! and what went wrong asking.

/// Where a container's network lives: its main process (whose network namespace is the
/// container's) and the ports it publishes on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerNet {
    /// Its main process on the host; None while it is not running.
    pub pid: Option<u32>,
    /// `--network host`: it shares the host's namespace.
    pub host_network: bool,
    /// (container port, host port) for every TCP port published on the host.
    pub published: Vec<(u16, u16)>,
}

impl ContainerNet {
    /// The port inside the container for `port`: a published host port maps to its container
    /// port (and is returned as the second value), any other port is taken as the container's.
    pub fn inside_port(&self, port: u16) -> (u16, Option<u16>) {
        match self.published.iter().find(|&&(_, host)| host == port) {
            Some(&(inside, host)) if !self.host_network => (inside, Some(host)),
            _ => (port, None),
        }
    }
}

/// What went wrong asking the container engine. Cloneable (results travel through watch
/// channels), so the client's own error is kept as its message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    /// The configured address cannot be used (`key` names the setting).
    #[error("{key} {address:?}: {reason}")]
    Address {
        key: &'static str,
        address: String,
        reason: String,
    },
    /// A call failed: `engine` is "docker" (the Engine API, Podman's too) or "containerd".
    #[error("{engine} {call} {name}: {reason}")]
    Call {
        engine: &'static str,
        call: &'static str,
        name: String,
        reason: String,
    },
    /// The engine did not answer within the check's deadline.
    #[error("the container engine did not answer within {0}s")]
    Timeout(u64),
    /// The engine answered: it has no container of that name (a typo, or one being recreated).
    #[error("{engine} has no container named {name:?}")]
    NoSuchContainer { engine: String, name: String },
}

/// A container's resource use from one look.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Usage {
    pub cpu_percent: Option<f64>,
    pub memory_bytes: Option<u64>,
    pub memory_percent: Option<f64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_published_host_port_maps_to_the_container_port() {
        let net = ContainerNet {
            pid: Some(42),
            host_network: false,
            published: vec![(80, 8081), (9000, 19000)],
        };
        assert_eq!(net.inside_port(19000), (9000, Some(19000)));
        assert_eq!(
            net.inside_port(9000),
            (9000, None),
            "the container's own port"
        );
        let host = ContainerNet {
            host_network: true,
            ..net
        };
        assert_eq!(
            host.inside_port(19000),
            (19000, None),
            "host network: no mapping"
        );
    }
}
