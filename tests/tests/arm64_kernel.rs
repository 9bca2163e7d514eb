//! The judgement on arm64: Debian 12's own Linux 6.1 for arm64 (`linux-image-6.1.0-*-cloud-arm64`,
//! the flavour for EC2's Graviton instances; Amazon Linux 2023 runs 6.1 there too), booted
//! under qemu-system-aarch64 (TCG, a Neoverse N1: Graviton 2's core) as `old_kernel.rs` boots
//! the x86_64 one (`tests/src/qemu/`), with the aarch64 static agent, and the fixture backend and
//! `vm-init` built for aarch64 inside. 6.1 has no socket-call tracepoints, so the agent runs the
//! `sock_diag` tier, as on x86_64; nothing is forced.
//!
//! One boot, the same scenarios (`tests/src/bin/vm-init/`) and the same assertions
//! (`qemu::verdicts`) as on x86_64, each scenario with a fresh backend and agent:
//! - `health-agent check`: names the tier and why, at once;
//! - a busy pool (2 workers, 3 s requests, 4 clients): `slow`, never a 503, never restarted, the
//!   answer programs (cgroup-skb) loaded and counting;
//! - the backend frozen (SIGSTOP) under traffic: 503 `hung` within 2 s, 200 after SIGCONT; the
//!   accept syscall tracepoints attach on suspicion (arm64's syscall table has `accept` and
//!   `accept4`, both traced).
//!
//! Every `/health` answer of each scenario is asserted.

use std::time::Duration;

use health_agent_tests::{
    qemu::{self, verdicts::*, Arch},
    require_root,
};

#[test]
fn on_debian_12s_arm64_kernel_a_frozen_backend_is_503_within_2s_and_a_busy_pool_never() {
    require_root();
    let vm = qemu::boot(
        Arch::Aarch64,
        &["check", "busy", "frozen"],
        Duration::from_secs(900),
    );
    println!(
        "{}: kernel {} on {}, BTF {}; binaries and initramfs {:.1} s, guest init {:.1} s after \
         qemu started, the VM's run {:.0} s, whole test {:.0} s",
        vm.package,
        vm.ready["kernel"],
        vm.ready["machine"],
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
    assert_eq!(vm.ready["btf"], true, "no BTF: {}", vm.ready);

    // The static agent's `check`: the tier and why, at once.
    let check = vm.result("check");
    println!(
        "`health-agent check` on arm64 6.1 (exit {}):\n{}",
        check["check_status"],
        check["check"].as_str().unwrap_or_default()
    );
    assert_check_names_tier(
        check,
        &format!("\nstderr: {}", check["check_stderr"].as_str().unwrap_or("")),
    );

    // A busy pool: slow, never 503, never restarted; the answer programs (cgroup-skb) pass
    // arm64 6.1's verifier and JIT: the status classes are seen.
    assert_busy(&vm, "arm64 6.1");
    let log = vm.result("busy")["agent_log"].as_str().unwrap_or_default();
    assert!(
        log.contains("kernel programs loaded"),
        "the eBPF programs did not load on arm64:\n{log}"
    );
    println!(
        "the agent's first log line on arm64 6.1: {}",
        log.lines().next().unwrap_or_default()
    );

    // Frozen under traffic: 503 hung within 2 s; 200 again after SIGCONT. Connections wait
    // unclaimed, so the accept tracepoints attach (on suspicion) and detach once claimed.
    let (frozen, _) = assert_frozen(&vm, "arm64 6.1");
    let log = frozen["agent_log"].as_str().unwrap_or_default();
    assert!(
        log.contains("tracing accept()") && !log.contains("accept() tracing unavailable"),
        "the accept syscall tracepoints did not attach on arm64:\n{log}"
    );
}
