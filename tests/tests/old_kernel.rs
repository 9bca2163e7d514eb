//! The judgement on a real old kernel: Debian 12's own Linux 6.1 (the kernel of Amazon Linux
//! 2023 and Debian 12), booted under qemu (`tests/src/qemu/`), with the static agent (the
//! image's binary) and the fixture backend inside. 6.1 has no `sock_send_length` /
//! `sock_recv_length`, so the agent runs the `sock_diag` tier; nothing is forced.
//!
//! One boot runs six scenarios, each with a fresh backend and agent (`tests/src/bin/vm-init/`):
//! - the .deb's own binary (glibc) with its shipped configuration: it starts, and both `check`
//!   and its first log line name the tier;
//! - a busy pool (2 workers, 3 s requests, 4 clients): `slow`, never a 503, never restarted;
//! - the backend frozen (SIGSTOP) under traffic: 503 `hung` within 2 s, 200 after SIGCONT;
//! - the same with a restart command that replaces it: healed without a 503;
//! - under traffic, a backend that reads requests and never answers (`unresponsive`), and one
//!   that keeps its port and never accepts (`hung`), at the product's thresholds: 503, then 200
//!   once it serves again; before the 503 the unanswered requests are `slow`, named, never
//!   `healthy` or `unknown`.
//!
//! Every `/health` answer of each scenario is asserted.

use std::time::Duration;

use health_agent_tests::{
    qemu::{self, verdicts::*, Arch},
    require_root, unanswered_reason,
};
use serde_json::Value;

/// Issue 47 item 2d: while requests are read and left unanswered, every answer from the
/// moment the first one is `web.slow_after` (1 s) old until the 503 is 200 `degraded`,
/// webserver `slow`, its reason naming how many requests wait and since when nothing was
/// answered — never `healthy`, `up` or `unknown`. The emulated machine gets 2 s to say so (a
/// tick, the snapshot, 100 ms polls, TCG). Returns how many answers were asserted.
fn assert_slow_until_503(samples: &[Value], switched: f64, first_503: f64, c: &str) -> usize {
    let from = switched + 1.0 + 2.0;
    let between: Vec<&Value> = samples
        .iter()
        .filter(|s| t(s) >= from && t(s) < first_503)
        .collect();
    assert!(
        between.len() >= 30,
        "only {} answers between the first slow request and the 503{c}",
        between.len()
    );
    for s in &between {
        assert!(
            s["code"] == 200 && s["status"] == "degraded" && s["webserver"] == "slow",
            "requests wait unanswered, yet {s}{c}"
        );
        let (n, quiet) = unanswered_reason(&s["reasons"]).unwrap_or_else(|| {
            panic!("the reason does not say how many requests wait and for how long: {s}{c}")
        });
        // Nothing answered since the switch: the clock the reason names runs with the
        // fault's, to within the snapshot's age and sock_diag's reads.
        let since = t(s) - switched;
        assert!(
            n >= 1 && quiet >= since - 1.5 && quiet <= since + 2.5,
            "{n} requests unanswered, nothing answered for {quiet} s, {since:.2} s after the \
             switch: {s}{c}"
        );
    }
    between.len()
}

#[test]
fn on_debian_12s_6_1_kernel_a_frozen_backend_is_503_within_2s_and_a_busy_pool_never() {
    require_root();
    let vm = qemu::boot(
        Arch::X86_64,
        &[
            "deb",
            "busy",
            "frozen",
            "frozen_restarted",
            "unresponsive",
            "never_accepts",
            "drain",
        ],
        Duration::from_secs(600),
    );
    println!(
        "{}: kernel {}, BTF {}; initramfs built in {:.1} s, guest init {:.1} s after qemu started, \
         the VM's run {:.0} s, whole test {:.0} s",
        vm.package,
        vm.ready["kernel"],
        vm.ready["btf"],
        vm.setup.as_secs_f64(),
        vm.boot.as_secs_f64(),
        vm.run.as_secs_f64(),
        vm.total.as_secs_f64()
    );
    assert!(
        vm.ready["kernel"]
            .as_str()
            .unwrap_or_default()
            .starts_with("6.1."),
        "not a 6.1 kernel: {}",
        vm.ready
    );

    // The .deb's binary with its shipped configuration: it starts, `check` and the first log
    // line name the tier, and it serves.
    let deb = vm.result("deb");
    let c = ctx(deb, "");
    println!(
        "the .deb on 6.1, `health-agent check`:\n{}",
        deb["check"].as_str().unwrap_or_default()
    );
    assert_tier(deb, &c);
    assert_check_names_tier(deb, &c);

    // A busy pool: slow, never 503, never restarted; the answer programs (cgroup-skb) pass
    // 6.1's verifier: the status classes are seen.
    assert_busy(&vm, "6.1");

    // Frozen under traffic: 503 hung within 2 s; 200 again after SIGCONT.
    assert_frozen(&vm, "6.1");

    // Frozen with a restart command that replaces it: healed, never a 503.
    let (healed, samples, story, c) = scenario(&vm, "frozen_restarted");
    let stopped = healed["stopped"].as_f64().unwrap();
    let again = samples
        .iter()
        .find(|s| {
            t(s) > stopped && s["status"] == "healthy" && s["heal"].as_u64().unwrap_or(0) >= 1
        })
        .unwrap_or_else(|| panic!("never healthy again after the restart{c}"));
    println!(
        "frozen with a real restart on 6.1: {} restart(s), healthy again {:.2} s after the SIGSTOP\n{story}",
        healed["restarts"],
        t(again) - stopped
    );
    assert!(
        healed["restarts"].as_u64().unwrap_or(0) >= 1,
        "never restarted{c}"
    );
    assert_ne!(
        healed["backend_pid_at_end"], healed["frozen_pid"],
        "the frozen backend still serves{c}"
    );
    if let Some(s) = samples.iter().find(|s| s["code"] == 503) {
        panic!("a backend healed by a restart still got a 503: {s}{c}");
    }

    // A backend that stops answering, and one that stops accepting: 503 at the product's
    // thresholds, 200 again once it serves. Unanswered: the probe fails from its first timeout
    // (probe_timeout 2 s) for unanswered_after (10 s), and 2 s for the emulated machine.
    // Never accepting: hung_after (2 s), and 2 s.
    for (name, verdict, within) in [
        ("unresponsive", "unresponsive", 14.0),
        ("never_accepts", "hung", 4.0),
    ] {
        let (r, samples, story, c) = scenario(&vm, name);
        let switched = r["switched"].as_f64().unwrap();
        let mended = r["mended"].as_f64().unwrap();
        let (first, took) = first_503(&samples, switched, name, &c);
        println!(
            "{name} on 6.1: 503 {} in {took:.2} s\n{story}",
            first["webserver"]
        );
        assert_eq!(first["webserver"], verdict, "{first}{c}");
        assert!(
            took <= within,
            "503 came {took:.2} s after the fault (≤ {within} s){c}"
        );
        if name == "unresponsive" {
            let named = assert_slow_until_503(&samples, switched, t(first), &c);
            println!("{named} answers between the first slow request and the 503: 200 slow, named");
        }
        assert!(
            samples.iter().any(|s| t(s) >= mended && s["code"] == 200),
            "no 200 once the backend served again{c}"
        );
    }

    // A drain, sock_diag alone: back only after the last request and the quiet.
    let (r, samples, story, c) = scenario(&vm, "drain");
    let f = |k: &str| r[k].as_f64().unwrap_or_else(|| panic!("no {k}{c}"));
    let (start, load_end, answered_end, end) = (
        f("drain_start"),
        f("load_end"),
        f("answered_end"),
        f("drain_end"),
    );
    let said = r["drain_stdout"].as_str().unwrap_or_default();
    println!(
        "drain on 6.1: started {start:.1} s, load stopped {load_end:.1} s (answered by \
         {answered_end:.1} s), drain returned {end:.1} s; load {}\n{said}{story}",
        r["load"]
    );
    assert_eq!(r["drain_exit"], 0, "{said}{}{c}", r["drain_stderr"]);
    assert!(
        said.lines()
            .last()
            .unwrap_or_default()
            .starts_with("drained in "),
        "{said}{c}"
    );
    // The last request came at most 1.2 s before the load stopped, then 2 s of quiet.
    assert!(
        end >= load_end + 0.8,
        "drained {:.2} s after the load stopped: before 2 s of quiet{c}",
        end - load_end
    );
    assert!(
        end < answered_end + 6.0,
        "drained {:.1} s after the last answer: too slow{c}",
        end - answered_end
    );
    assert!(
        samples
            .iter()
            .any(|s| t(s) > start && s["code"] == 503 && s["status"] == "draining"),
        "never 503 draining{c}"
    );
    assert!(
        r["load"]["200"].as_u64().unwrap_or(0) >= 4,
        "the load got too few answers (harness problem){c}"
    );
}
