//! The answer programs (cgroup-skb, `health-agent-ebpf/src/answers.rs`): attached to the root
//! of the cgroup v2 hierarchy, where they see every socket of the host, containers included,
//! and count what the watched ports answer by status class. With `socket_tracing =
//! "on_suspicion"` they attach in sampling windows and on a suspicion (`checks::web::monitor`). They are optional: where
//! they cannot attach (no cgroup v2, a kernel or a sandbox that refuses the program type), the
//! rest of the kernel view works and the answers say why they are not visible.

use std::path::{Path, PathBuf};

use aya::{
    maps::{Array, MapData, PerCpuArray},
    programs::{cgroup_skb::CgroupSkbLinkId, CgroupAttachMode, CgroupSkb, CgroupSkbAttachType},
    Ebpf,
};
use health_common::{maps, AnswerCounters, ProbePath, PROBE_PATH_MAX};

/// Program names in the object, and the direction each attaches to.
const PROGRAMS: [(&str, CgroupSkbAttachType); 2] = [
    ("answers_egress", CgroupSkbAttachType::Egress),
    ("answers_ingress", CgroupSkbAttachType::Ingress),
];

/// Why the answer programs cannot count: the reason `details.web.answers` gives for a status
/// that is not visible. Clone, because the kernel view keeps it and hands it on at every read.
#[derive(Debug, Clone, thiserror::Error)]
pub enum AnswersError {
    /// The object lacks a map or a program, or it has another type: a build problem.
    #[error("{0}")]
    Object(String),
    #[error("reading {}: {detail}", path.display())]
    Mountinfo { path: PathBuf, detail: String },
    #[error("{}", super::tier::NO_NET_ADMIN)]
    NoNetAdmin,
    #[error("no cgroup v2 hierarchy is mounted (cgroup2 at its root)")]
    NoCgroup2,
    #[error(
        "the agent runs in its own cgroup namespace, and the host's init does not show the \
         host's hierarchy ({0}): run it in the host's PID namespace (hostPID, --pid host) or \
         its cgroup namespace (--cgroupns host)"
    )]
    HostHierarchyHidden(Box<AnswersError>),
    #[error(
        "the agent runs in its own cgroup namespace and cannot reach the host's hierarchy at \
         {} ({detail}): it needs the host's PID namespace and CAP_SYS_PTRACE, or the host's \
         cgroup namespace (--cgroupns host)",
        path.display()
    )]
    HostHierarchyUnreachable { path: PathBuf, detail: String },
    #[error("opening the cgroup v2 root {}: {detail}", path.display())]
    OpenRoot { path: PathBuf, detail: String },
    #[error("loading {program}: {detail}")]
    Load {
        program: &'static str,
        detail: String,
    },
    #[error("attaching {program} to {}: {detail}", root.display())]
    Attach {
        program: &'static str,
        root: PathBuf,
        detail: String,
    },
    #[error("detaching {program}: {detail}")]
    Detach {
        program: &'static str,
        detail: String,
    },
    #[error("map {map}: {detail}")]
    Settings { map: &'static str, detail: String },
}

impl From<super::KernelError> for AnswersError {
    fn from(e: super::KernelError) -> Self {
        Self::Object(e.to_string())
    }
}

/// aya's error with its causes, as one line.
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    crate::dburl::error_chain(e)
}

pub struct Answers {
    counters: PerCpuArray<MapData, AnswerCounters>,
    probe: Array<MapData, ProbePath>,
    /// What the programs are told (the probe path, whether to count every segment sent).
    settings: ProbePath,
    /// The root cgroup the programs attach to.
    cgroup: std::fs::File,
    root: PathBuf,
    /// Their links while attached.
    links: Vec<(&'static str, CgroupSkbLinkId)>,
}

impl Answers {
    /// Loads the programs and attaches them to the root cgroup (or, `attach` false, leaves
    /// them ready to), or says why not.
    pub fn load(ebpf: &mut Ebpf, attach: bool) -> Result<Self, AnswersError> {
        // They would load, and every attach would fail with EPERM: say what is missing.
        if super::tier::no_net_admin() {
            return Err(AnswersError::NoNetAdmin);
        }
        let counters = super::take(ebpf, maps::ANSWERS)?;
        let probe = super::take(ebpf, maps::ANSWER_PROBE)?;
        let root = host_cgroup_root()?;
        let cgroup = std::fs::File::open(&root).map_err(|e| AnswersError::OpenRoot {
            path: root.clone(),
            detail: e.to_string(),
        })?;
        for (name, _) in PROGRAMS {
            let program: &mut CgroupSkb = super::typed(ebpf, name)?;
            program.load().map_err(|e| AnswersError::Load {
                program: name,
                detail: chain(&e),
            })?;
        }
        let mut answers = Self {
            counters,
            probe,
            settings: ProbePath::default(),
            cgroup,
            root,
            links: Vec::new(),
        };
        if attach {
            answers.attach(ebpf, true)?;
        }
        Ok(answers)
    }

    /// Whether the programs are attached.
    pub fn attached(&self) -> bool {
        !self.links.is_empty()
    }

    /// Attaches or detaches the programs. The counters carry on: while detached they stand
    /// still.
    pub fn attach(&mut self, ebpf: &mut Ebpf, on: bool) -> Result<(), AnswersError> {
        if on == self.attached() {
            return Ok(());
        }
        if !on {
            for (name, link) in std::mem::take(&mut self.links) {
                let program: &mut CgroupSkb = super::typed(ebpf, name)?;
                program.detach(link).map_err(|e| AnswersError::Detach {
                    program: name,
                    detail: chain(&e),
                })?;
            }
            return Ok(());
        }
        for (name, direction) in PROGRAMS {
            let program: &mut CgroupSkb = super::typed(ebpf, name)?;
            // A link (5.7+, aya's choice there): it runs beside any program systemd or a
            // container runtime attaches, and the kernel refuses attach flags on links, so
            // the mode must say none.
            let link = program
                .attach(&self.cgroup, direction, CgroupAttachMode::Single)
                .map_err(|e| AnswersError::Attach {
                    program: name,
                    root: self.root.clone(),
                    detail: chain(&e),
                })?;
            self.links.push((name, link));
        }
        Ok(())
    }

    /// Sets the probe path whose requests are not real traffic ("" for none). A path longer
    /// than the programs compare is left unset: its requests then count as real ones.
    pub fn set_probe_path(&mut self, path: &str) -> Result<(), AnswersError> {
        let path = path.split('?').next().unwrap_or_default().as_bytes();
        self.settings.len = 0;
        self.settings.path = [0; PROBE_PATH_MAX];
        if path.len() <= PROBE_PATH_MAX && path.starts_with(b"/") {
            // The whole path, slash included, follows `GET ` or `HEAD `.
            self.settings.len = path.len() as u32;
            self.settings.path[..path.len()].copy_from_slice(path);
        }
        self.write_settings()
    }

    /// Counts every segment sent (the `sock_diag` tier's evidence of answers going out).
    pub fn count_sent(&mut self, on: bool) -> Result<(), AnswersError> {
        self.settings.count_sent = u32::from(on);
        self.write_settings()
    }

    fn write_settings(&mut self) -> Result<(), AnswersError> {
        self.probe
            .set(0, self.settings, 0)
            .map_err(|e| AnswersError::Settings {
                map: maps::ANSWER_PROBE,
                detail: e.to_string(),
            })
    }

    /// The counters of `slot`, summed over CPUs (zeros when the read fails).
    pub fn counters(&self, slot: u32) -> AnswerCounters {
        let mut sum = AnswerCounters::default();
        if let Ok(per_cpu) = self.counters.get(&slot, 0) {
            for c in per_cpu.iter() {
                sum.add(c);
            }
        }
        sum
    }
}

/// The root of the host's cgroup v2 hierarchy, as a path the agent can open. In the host's
/// cgroup namespace that is its own mount. In a container's own namespace (Docker's default on
/// cgroup v2, every Kubernetes pod) its mounts show that container's cgroup, whose programs see
/// its sockets alone: then the host's root is reached through the host's init
/// (`/proc/1/root`, which needs the host's PID namespace and `CAP_SYS_PTRACE`).
fn host_cgroup_root() -> Result<PathBuf, AnswersError> {
    let ns = |pid: &str| std::fs::read_link(format!("/proc/{pid}/ns/cgroup")).ok();
    match (ns("self"), ns("1")) {
        (Some(own), Some(init)) if own != init => {
            let at = cgroup2_root(Path::new("/proc/1/mountinfo"))
                .map_err(|e| AnswersError::HostHierarchyHidden(Box::new(e)))?;
            let root = Path::new("/proc/1/root").join(at.strip_prefix("/").unwrap_or(&at));
            match std::fs::metadata(&root) {
                Ok(_) => Ok(root),
                Err(e) => Err(AnswersError::HostHierarchyUnreachable {
                    path: root,
                    detail: e.to_string(),
                }),
            }
        }
        _ => cgroup2_root(Path::new("/proc/self/mountinfo")),
    }
}

/// Where the cgroup v2 hierarchy is mounted (`/sys/fs/cgroup`, or `/sys/fs/cgroup/unified`
/// on hosts that still mount v1 controllers beside it), from a mountinfo file: the mount of
/// its root.
pub fn cgroup2_root(mountinfo: &Path) -> Result<PathBuf, AnswersError> {
    let text = std::fs::read_to_string(mountinfo).map_err(|e| AnswersError::Mountinfo {
        path: mountinfo.to_path_buf(),
        detail: e.to_string(),
    })?;
    text.lines()
        .filter_map(|line| {
            // ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER
            let (left, right) = line.split_once(" - ")?;
            let fields: Vec<&str> = left.split(' ').collect();
            let fstype = right.split(' ').next()?;
            let mountpoint = fields.get(4)?;
            (fstype == "cgroup2" && fields.get(3) == Some(&"/"))
                .then(|| PathBuf::from(unescape(mountpoint)))
        })
        .next()
        .ok_or(AnswersError::NoCgroup2)
}

/// Mountinfo escapes spaces, tabs, newlines and backslashes as octal.
fn unescape(s: &str) -> String {
    s.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_cgroup2_root_pure_or_hybrid() {
        let dir = tempfile::tempdir().unwrap();
        let hybrid = dir.path().join("hybrid");
        std::fs::write(
            &hybrid,
            "25 1 0:22 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755\n\
             26 25 0:23 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw\n\
             27 25 0:24 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n",
        )
        .unwrap();
        assert_eq!(
            cgroup2_root(&hybrid).unwrap(),
            PathBuf::from("/sys/fs/cgroup/unified")
        );
        // A container's own cgroup mounted below the root is not the root.
        let nested = dir.path().join("nested");
        std::fs::write(
            &nested,
            "30 1 0:30 /docker/abc /sys/fs/cgroup rw shared:1 - cgroup2 cgroup2 rw\n",
        )
        .unwrap();
        assert!(matches!(
            cgroup2_root(&nested),
            Err(AnswersError::NoCgroup2)
        ));
        let pure = dir.path().join("pure");
        std::fs::write(
            &pure,
            "35 24 0:30 / /sys/fs/cgroup rw,nosuid shared:9 - cgroup2 cgroup2 rw,nsdelegate\n",
        )
        .unwrap();
        assert_eq!(
            cgroup2_root(&pure).unwrap(),
            PathBuf::from("/sys/fs/cgroup")
        );
    }
}
