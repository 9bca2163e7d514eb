//! Builds the kernel programs (`health-agent-ebpf`, nightly + bpf-linker) and leaves the object
//! in OUT_DIR for `include_bytes_aligned!`. `cargo xtask setup` installs what this needs.

use anyhow::Context as _;

fn main() -> anyhow::Result<()> {
    let manifest_dir = std::env::var("CARGO_MANIFEST_DIR").context("CARGO_MANIFEST_DIR not set")?;
    let root = std::path::Path::new(&manifest_dir)
        .parent()
        .context("health-agent has no parent directory")?
        .join("health-agent-ebpf");
    let root = root
        .to_str()
        .context("non-UTF-8 path to health-agent-ebpf")?;
    println!("cargo:rerun-if-changed=../health-common/src");
    let ebpf = aya_build::Package {
        name: "health-agent-ebpf",
        root_dir: root,
        ..Default::default()
    };
    aya_build::build_ebpf([ebpf], aya_build::Toolchain::Custom("nightly")).context(
        "building the eBPF programs failed: run `cargo xtask setup` (nightly rust-src and bpf-linker)",
    )
}
