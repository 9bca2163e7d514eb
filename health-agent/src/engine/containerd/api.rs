//! The few messages of containerd's API (v1, as containerd 1.6 and 2.x serve it) the client
//! sends and reads, with the field numbers of containerd's `.proto` files. Fields not declared
//! here are skipped when decoding, as protobuf allows.

use std::collections::HashMap;

pub const CONTAINERS_LIST: &str = "/containerd.services.containers.v1.Containers/List";
pub const TASKS_LIST: &str = "/containerd.services.tasks.v1.Tasks/List";
pub const TASKS_GET: &str = "/containerd.services.tasks.v1.Tasks/Get";
pub const TASKS_KILL: &str = "/containerd.services.tasks.v1.Tasks/Kill";
pub const TASKS_DELETE: &str = "/containerd.services.tasks.v1.Tasks/Delete";
pub const TASKS_CREATE: &str = "/containerd.services.tasks.v1.Tasks/Create";
pub const TASKS_START: &str = "/containerd.services.tasks.v1.Tasks/Start";
pub const TASKS_RESUME: &str = "/containerd.services.tasks.v1.Tasks/Resume";
pub const SNAPSHOTS_MOUNTS: &str = "/containerd.services.snapshots.v1.Snapshots/Mounts";
pub const VERSION: &str = "/containerd.services.version.v1.Version/Version";

/// google.protobuf.Empty.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Empty {}

/// google.protobuf.Timestamp.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, prost::Message)]
pub struct Timestamp {
    #[prost(int64, tag = "1")]
    pub seconds: i64,
    #[prost(int32, tag = "2")]
    pub nanos: i32,
}

/// containerd.services.containers.v1.Container (id, labels, snapshot, creation time).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Container {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(map = "string, string", tag = "2")]
    pub labels: HashMap<String, String>,
    #[prost(string, tag = "6")]
    pub snapshotter: String,
    #[prost(string, tag = "7")]
    pub snapshot_key: String,
    #[prost(message, optional, tag = "8")]
    pub created_at: Option<Timestamp>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ListContainersRequest {
    #[prost(string, repeated, tag = "1")]
    pub filters: Vec<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ListContainersResponse {
    #[prost(message, repeated, tag = "1")]
    pub containers: Vec<Container>,
}

/// containerd.v1.types.Status.
pub mod status {
    pub const CREATED: i32 = 1;
    pub const RUNNING: i32 = 2;
    pub const STOPPED: i32 = 3;
    pub const PAUSED: i32 = 4;
    pub const PAUSING: i32 = 5;
}

/// containerd.v1.types.Process: a task's main process.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Process {
    #[prost(string, tag = "1")]
    pub container_id: String,
    /// A task's own ID: its container's (containerd 1.6 sets only this one in Tasks/List).
    #[prost(string, tag = "2")]
    pub id: String,
    #[prost(uint32, tag = "3")]
    pub pid: u32,
    #[prost(int32, tag = "4")]
    pub status: i32,
    #[prost(uint32, tag = "9")]
    pub exit_status: u32,
}

impl Process {
    /// The container this task runs: `container_id`, or `id` when only that is set.
    pub fn container(&self) -> &str {
        if self.container_id.is_empty() {
            &self.id
        } else {
            &self.container_id
        }
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ListTasksRequest {
    #[prost(string, tag = "1")]
    pub filter: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ListTasksResponse {
    #[prost(message, repeated, tag = "1")]
    pub tasks: Vec<Process>,
}

/// Tasks/Get, and every call naming only a container (Delete, Resume, Start).
#[derive(Clone, PartialEq, prost::Message)]
pub struct TaskRequest {
    #[prost(string, tag = "1")]
    pub container_id: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct GetResponse {
    #[prost(message, optional, tag = "1")]
    pub process: Option<Process>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct KillRequest {
    #[prost(string, tag = "1")]
    pub container_id: String,
    #[prost(uint32, tag = "3")]
    pub signal: u32,
    /// Every process of the task, not only its main one.
    #[prost(bool, tag = "4")]
    pub all: bool,
}

/// containerd.types.Mount.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Mount {
    #[prost(string, tag = "1")]
    pub r#type: String,
    #[prost(string, tag = "2")]
    pub source: String,
    #[prost(string, tag = "3")]
    pub target: String,
    #[prost(string, repeated, tag = "4")]
    pub options: Vec<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct MountsRequest {
    #[prost(string, tag = "1")]
    pub snapshotter: String,
    #[prost(string, tag = "2")]
    pub key: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct MountsResponse {
    #[prost(message, repeated, tag = "1")]
    pub mounts: Vec<Mount>,
}

/// Tasks/Create. Empty stdio paths: the new task's output goes nowhere, as with `ctr run -d`
/// without a log.
#[derive(Clone, PartialEq, prost::Message)]
pub struct CreateTaskRequest {
    #[prost(string, tag = "1")]
    pub container_id: String,
    #[prost(message, repeated, tag = "3")]
    pub rootfs: Vec<Mount>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct VersionResponse {
    #[prost(string, tag = "1")]
    pub version: String,
}

#[cfg(test)]
mod tests {
    use prost::Message as _;

    use super::*;

    /// Bytes as containerd 1.6 (Go's protobuf) encodes a Tasks/Get answer for a running task:
    /// Process{container_id "web", id "web", pid 4242, status RUNNING, stdout "/dev/null"}.
    #[test]
    fn a_get_answer_with_fields_not_declared_here_decodes() {
        let mut process = Vec::new();
        process.extend_from_slice(&[0x0a, 3, b'w', b'e', b'b']); // 1: container_id
        process.extend_from_slice(&[0x12, 3, b'w', b'e', b'b']); // 2: id
        process.extend_from_slice(&[0x18, 0x92, 0x21]); // 3: pid 4242
        process.extend_from_slice(&[0x20, 2]); // 4: RUNNING
        process.extend_from_slice(&[0x2a, 0]); // 5: stdin "" (skipped)
        process.extend_from_slice(&[0x32, 9]); // 6: stdout (skipped)
        process.extend_from_slice(b"/dev/null");
        let mut answer = vec![0x0a, process.len() as u8];
        answer.extend_from_slice(&process);
        let got = GetResponse::decode(answer.as_slice()).unwrap();
        let p = got.process.unwrap();
        assert_eq!(
            (p.container_id.as_str(), p.pid, p.status),
            ("web", 4242, status::RUNNING)
        );
    }
}
