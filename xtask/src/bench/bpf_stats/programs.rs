//! The agent's programs by the kernel's statistics: the programs the agent's process holds,
//! and their counters.

use super::*;

/// One program's counters: (run_cnt, run_time_ns).
pub(super) type Counters = (u64, u64);

/// The full name of a program whose name the kernel (or an older bpftool) may have cut to 15
/// characters, among the names of the other programs in the same listing (`others`): its type
/// tells the raw from the classic state hook, and a full name another program already shows is
/// not this one's. A cut name two programs still share is given as both.
pub(super) fn full_name(name: &str, kind: &str, others: &[&str]) -> String {
    if name.len() != KERNEL_NAME_LEN {
        return name.to_string();
    }
    let raw = kind == "raw_tracepoint";
    let candidates: Vec<&str> = FULL_NAMES
        .iter()
        .copied()
        // Another program showing a longer name whole has it; a 15-character one may be cut.
        .filter(|n| n.starts_with(name) && !(n.len() > KERNEL_NAME_LEN && others.contains(n)))
        .filter(|n| [RECV, SEND, "inet_sock_set_state_raw"].contains(n) == raw)
        .collect();
    match candidates.as_slice() {
        [] => format!("{name}… (cut by the kernel)"),
        [one] => one.to_string(),
        many => many.join(" or "),
    }
}

/// The ids of the programs `pid` holds: its program descriptors and the programs its link
/// descriptors attach.
pub(super) fn program_ids(pid: u32) -> Result<BTreeSet<u32>> {
    let mut ids = BTreeSet::new();
    let fds = fs::read_dir(format!("/proc/{pid}/fd"))
        .with_context(|| format!("listing the descriptors of process {pid}"))?;
    for fd in fds.flatten() {
        let Ok(target) = fs::read_link(fd.path()) else {
            continue;
        };
        let target = target.to_string_lossy();
        if !(target.contains("bpf-prog") || target.contains("bpf-link")) {
            continue;
        }
        let info = fs::read_to_string(format!(
            "/proc/{pid}/fdinfo/{}",
            fd.file_name().to_string_lossy()
        ))
        .unwrap_or_default();
        ids.extend(info.lines().filter_map(|l| {
            l.strip_prefix("prog_id:")
                .and_then(|v| v.trim().parse::<u32>().ok())
        }));
    }
    Ok(ids)
}

/// The counters of every program `pid` holds, by full name (programs of one name summed).
pub(super) fn agent_programs(pid: u32) -> Result<BTreeMap<String, Counters>> {
    let ids = program_ids(pid)?;
    let out = cmd::stdout(Command::new("bpftool").args(["-j", "prog", "show"]))
        .context("bpftool (apt-get install bpftool; cargo xtask setup does)")?;
    let progs: serde_json::Value = serde_json::from_str(&out).context("bpftool's JSON")?;
    let ours: Vec<&serde_json::Value> = progs
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| {
            let id = p["id"].as_u64().unwrap_or(0) as u32;
            let owned = p["pids"]
                .as_array()
                .is_some_and(|o| o.iter().any(|o| o["pid"].as_u64() == Some(u64::from(pid))));
            ids.contains(&id) || owned
        })
        .collect();
    let names: Vec<&str> = ours
        .iter()
        .map(|p| p["name"].as_str().unwrap_or("?"))
        .collect();
    let mut by_name = BTreeMap::new();
    for (i, p) in ours.iter().enumerate() {
        let others: Vec<&str> = names
            .iter()
            .enumerate()
            .filter(|&(j, _)| j != i)
            .map(|(_, n)| *n)
            .collect();
        let name = full_name(names[i], p["type"].as_str().unwrap_or(""), &others);
        // bpftool leaves the counters out while they are zero.
        let c: &mut Counters = by_name.entry(name).or_default();
        c.0 += p["run_cnt"].as_u64().unwrap_or(0);
        c.1 += p["run_time_ns"].as_u64().unwrap_or(0);
    }
    if by_name.is_empty() {
        bail!("the agent (pid {pid}) holds no eBPF programs");
    }
    Ok(by_name)
}

pub(super) fn diff(
    before: &BTreeMap<String, Counters>,
    after: &BTreeMap<String, Counters>,
) -> BTreeMap<String, Counters> {
    after
        .iter()
        .map(|(name, &(cnt, ns))| {
            let (c0, n0) = before.get(name).copied().unwrap_or_default();
            (
                name.clone(),
                (cnt.saturating_sub(c0), ns.saturating_sub(n0)),
            )
        })
        .collect()
}

/// What the kernel counted during one measured load with an agent.
pub(super) struct Counted {
    pub(super) requests: u64,
    pub(super) programs: BTreeMap<String, Counters>,
}

impl Counted {
    /// Host socket calls in the run, when the per-call programs fired for all of them: every
    /// request is at least one receive and one send, so fewer runs than 2 per request means
    /// they were not attached (or not for the whole run).
    pub(super) fn socket_calls(&self) -> Option<u64> {
        let get = |n: &str| self.programs.get(n).map_or(0, |c| c.0);
        let calls = get(RECV) + get(SEND);
        (calls >= 2 * self.requests && self.requests > 0).then_some(calls)
    }
}
