//! What the VM tests assert on a scenario's record (`tests/tests/old_kernel.rs` on x86_64,
//! `tests/tests/arm64_kernel.rs` on arm64): the same scenarios, judged the same way on both
//! architectures' 6.1 kernels. Each assertion prints the scenario's story (one line per change
//! of answer) and the agent's log when it fails.

use serde_json::Value;

use super::VmRun;

pub fn t(v: &Value) -> f64 {
    v["t"].as_f64().unwrap_or(f64::NAN)
}

/// The answers from `ready` on, and a one-line-per-change story of them: a change of code,
/// status or webserver, or of the reasons' wording (their figures left out, which move every
/// answer), so a failed assertion shows what the agent said all along, not only at the first
/// answer of each status. Each line ends with what sock_diag saw of the port's connections then,
/// which tells the evidence of an answer going out apart from what the kernel counted.
pub fn answers(r: &Value) -> (Vec<Value>, String) {
    let ready = r["ready"].as_f64().expect("ready");
    let samples: Vec<Value> = r["samples"]
        .as_array()
        .expect("samples")
        .iter()
        .filter(|s| t(s) >= ready)
        .cloned()
        .collect();
    let mut story = String::new();
    let mut last = String::new();
    for s in &samples {
        let wording: String = s["reasons"]
            .to_string()
            .chars()
            .filter(|c| !c.is_ascii_digit() && *c != '.')
            .collect();
        let said = format!("{} {} {}", s["code"], s["status"], s["webserver"]);
        let now = format!("{said} {wording}");
        if now != last {
            story.push_str(&format!(
                "  {:6.2}s {said} {} sockets {}\n",
                t(s),
                s["reasons"],
                s["sockets"]
            ));
            last = now;
        }
    }
    (samples, story)
}

/// What a failed assertion prints: the scenario, its load, restarts, kernel view, story and the
/// agent's log.
pub fn ctx(r: &Value, story: &str) -> String {
    format!(
        "\nscenario {}; load {}; restarts {}; kernel {}\n{story}agent log:\n{}",
        r["scenario"],
        r["load"],
        r["restarts"],
        r["kernel"],
        r["agent_log"].as_str().unwrap_or_default()
    )
}

/// Every answer before `at` (when `what` happened) was 200; the first 503 at or after it, and
/// how long after `at` it came.
pub fn first_503<'a>(samples: &'a [Value], at: f64, what: &str, c: &str) -> (&'a Value, f64) {
    if let Some(s) = samples.iter().find(|s| t(s) < at && s["code"] != 200) {
        panic!("{} before {what}: {s}{c}", s["code"]);
    }
    let first = samples
        .iter()
        .find(|s| t(s) >= at && s["code"] == 503)
        .unwrap_or_else(|| panic!("no 503 after {what}{c}"));
    (first, t(first) - at)
}

/// Scenario `name`'s record, its answers from `ready` on, their story and what a failed
/// assertion prints; the tier asserted.
pub fn scenario<'a>(vm: &'a VmRun, name: &str) -> (&'a Value, Vec<Value>, String, String) {
    let r = vm.result(name);
    let (samples, story) = answers(r);
    let c = ctx(r, &story);
    assert_tier(r, &c);
    (r, samples, story, c)
}

/// What every scenario shares: the tier, and why; the agent's first log line says it too.
pub fn assert_tier(r: &Value, ctx: &str) {
    assert_eq!(
        r["kernel"]["tier"], "sock_diag",
        "6.1 lacks the socket-call tracepoints: the tier is sock_diag{ctx}"
    );
    let missing = r["kernel"]["missing"].to_string();
    assert!(
        missing.contains("socket-call tracepoints") && missing.contains("Linux 6.3"),
        "details.web.kernel.missing does not say what is missing and why: {missing}{ctx}"
    );
    let first = r["agent_log"]
        .as_str()
        .unwrap_or_default()
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned();
    assert!(
        first.contains("kernel tier sock_diag"),
        "the agent's first log line does not name the tier: {first:?}{ctx}"
    );
}

/// `health-agent check`'s output in record `r` names the tier and why, at once.
pub fn assert_check_names_tier(r: &Value, ctx: &str) {
    let check = r["check"].as_str().unwrap_or_default();
    assert!(
        check
            .lines()
            .any(|l| l.contains("kernel tier") && l.contains("sock_diag") && l.contains("6.3")),
        "`health-agent check` does not say the tier and why: {check}{ctx}"
    );
}

/// The `busy` scenario (2 workers, 3 s requests, 4 clients, 40 s): `slow`, never a 503, never
/// restarted; the answer programs (cgroup-skb) passed the verifier and count the status
/// classes. `on` names the kernel in what is printed.
pub fn assert_busy(vm: &VmRun, on: &str) {
    let busy = vm.result("busy");
    let (samples, story) = answers(busy);
    let c = ctx(busy, &story);
    println!("busy pool on {on}: load {}\n{story}", busy["load"]);
    assert_tier(busy, &c);
    assert!(
        // 2 workers × 40 s / 3 s is 26 at most, and the agent's probes take their turns too.
        busy["load"]["200"].as_u64().unwrap_or(0) >= 8,
        "the load got too few answers (harness problem){c}"
    );
    let loaded: Vec<&Value> = samples
        .iter()
        .filter(|s| t(s) >= busy["load_start"].as_f64().unwrap())
        .collect();
    // /health is asked every 100 ms after the previous answer: what limits the count is the
    // emulated machine's speed (2 vCPUs on one host thread, shared with the backend, the load
    // and the agent), so it is judged by its gaps: the whole load is seen.
    let (start, end) = (
        busy["load_start"].as_f64().unwrap(),
        busy["load_end"].as_f64().unwrap(),
    );
    let during: Vec<f64> = loaded.iter().map(|s| t(s)).filter(|&x| x <= end).collect();
    let gap = [start]
        .iter()
        .chain(&during)
        .zip(during.iter().chain([&end]))
        .map(|(a, b)| b - a)
        .fold(0.0, f64::max);
    println!(
        "{} /health answers during the {:.1} s load, at most {gap:.2} s apart",
        during.len(),
        end - start
    );
    assert!(
        during.len() >= 60 && gap <= 1.5,
        "too few /health answers to judge: {} during the {:.1} s load, at most {gap:.2} s \
         apart{c}",
        during.len(),
        end - start
    );
    if let Some(s) = samples.iter().find(|s| s["code"] != 200) {
        panic!("a busy (not broken) backend got {s}{c}");
    }
    if let Some(s) = samples
        .iter()
        .find(|s| s["webserver"] == "hung" || s["webserver"] == "unresponsive")
    {
        panic!("a busy backend was called {}: {s}{c}", s["webserver"]);
    }
    assert!(
        loaded.iter().any(|s| s["webserver"] == "slow"),
        "never `slow` while every request waited seconds for a worker{c}"
    );
    assert_eq!(busy["restarts"], 0, "a busy backend was restarted{c}");
    let seen = &busy["answers"];
    println!("details.web.answers at the end: {seen}");
    assert_eq!(
        seen["status_visible"], true,
        "the answers' status is not visible on {on}: {seen}{c}"
    );
    assert!(
        seen["total_by_class"]["2xx"].as_u64().unwrap_or(0) >= 1,
        "the backend's 200s were not counted: {seen}{c}"
    );
    assert!(
        samples.iter().all(|s| s["heal"].as_u64().unwrap_or(0) == 0),
        "details.heal counts restart attempts{c}"
    );
}

/// The `frozen` scenario (SIGSTOP under 10 requests/s, no restart command): every answer 200
/// before the signal, 503 `hung` within 2 s of it, 200 again after SIGCONT. Returns the
/// record and the seconds from the signal to the 503.
pub fn assert_frozen<'a>(vm: &'a VmRun, on: &str) -> (&'a Value, f64) {
    let (frozen, samples, story, c) = scenario(vm, "frozen");
    let stopped = frozen["stopped"].as_f64().unwrap();
    let (first, took) = first_503(&samples, stopped, "the SIGSTOP", &c);
    println!(
        "frozen on {on}: SIGSTOP → 503 {} in {took:.2} s; load {}\n{story}",
        first["webserver"], frozen["load"]
    );
    assert_eq!(first["webserver"], "hung", "{first}{c}");
    assert!(
        took <= 2.0,
        "503 came {took:.2} s after the SIGSTOP (≤ 2 s){c}"
    );
    let continued = frozen["continued"].as_f64().unwrap();
    let back = samples
        .iter()
        .find(|s| t(s) >= continued && s["code"] == 200)
        .unwrap_or_else(|| panic!("no 200 after SIGCONT{c}"));
    println!("SIGCONT → 200 in {:.2} s", t(back) - continued);
    (frozen, took)
}
