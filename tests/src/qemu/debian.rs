//! What the guest boots and runs from Debian's archive, per architecture: Debian 12's cloud
//! kernel and, for a foreign guest, the architecture's `busybox-static`. `cargo xtask setup`
//! downloads them (`apt-get download` from the host's mirror; the arm64 ones need
//! `dpkg --add-architecture arm64`, which setup does) and unpacks each once under
//! `/var/cache/health-agent`, so the test stage reaches no mirror.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use super::Arch;
use crate::{stdout_of, succeed};

const CACHE: &str = "/var/cache/health-agent";
/// The host's `busybox-static` (x86_64, like the host).
const HOST_BUSYBOX: &str = "/bin/busybox";

/// Where the kernel package for `arch` is unpacked, and the package's name (without an
/// architecture qualifier).
fn kernel_dir(arch: Arch) -> (PathBuf, String) {
    let meta = format!("linux-image-cloud-{}:{}", arch.debian(), arch.debian());
    let depends = stdout_of(Command::new("apt-cache").args(["depends", &meta]));
    let package = depends
        .lines()
        .find_map(|l| l.trim().strip_prefix("Depends: "))
        // A foreign architecture's dependency is named with its qualifier (`…:arm64`).
        .map(|p| p.split(':').next().unwrap_or(p).to_owned())
        .unwrap_or_else(|| {
            panic!(
                "apt-cache depends {meta}: no kernel package (cargo xtask setup adds the \
                 architecture and runs apt-get update)"
            )
        });
    assert!(
        package.starts_with("linux-image-6.1."),
        "{meta} depends on {package}: not Debian 12's 6.1 kernel"
    );
    (
        PathBuf::from(CACHE).join(format!("kernel-{package}")),
        package,
    )
}

/// Whether [`kernel`] and [`busybox`] have their packages unpacked already (they then download
/// nothing).
pub fn cached(arch: Arch) -> bool {
    kernel_dir(arch).0.join("boot").exists()
        && (arch == Arch::X86_64 || busybox_dir(arch).join("bin/busybox").exists())
}

/// `package` of `arch` downloaded from the host's Debian mirror and unpacked into `dir`,
/// unless `dir` holds it already (`marker` exists under it).
fn unpacked(package: &str, arch: Arch, dir: &Path, marker: &str) {
    if dir.join(marker).exists() {
        return;
    }
    fs::create_dir_all(CACHE).expect("cache dir");
    let tmp = PathBuf::from(format!("{}.tmp-{}", dir.display(), std::process::id()));
    fs::create_dir_all(&tmp).expect("tmp dir");
    succeed(
        Command::new("apt-get")
            .args(["download", &format!("{package}:{}", arch.debian())])
            .current_dir(&tmp),
    );
    let deb = fs::read_dir(&tmp)
        .expect("tmp dir")
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "deb"))
        .expect("the downloaded .deb");
    let root = tmp.join("root");
    succeed(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&root));
    let _ = fs::remove_dir_all(dir);
    fs::rename(&root, dir).expect("rename the unpacked package into the cache");
    let _ = fs::remove_dir_all(&tmp);
}

/// Debian 12's 6.1 cloud kernel for `arch`: `(vmlinuz, the kernel's modules directory, the
/// package name)`, downloaded and unpacked when missing.
pub fn kernel(arch: Arch) -> (PathBuf, PathBuf, String) {
    let (dir, package) = kernel_dir(arch);
    unpacked(&package, arch, &dir, "boot");
    let version = package.trim_start_matches("linux-image-");
    (
        dir.join(format!("boot/vmlinuz-{version}")),
        dir.join(format!("lib/modules/{version}")),
        package,
    )
}

fn busybox_dir(arch: Arch) -> PathBuf {
    PathBuf::from(CACHE).join(format!("busybox-static-{}", arch.debian()))
}

/// Debian's static busybox for `arch` (the guest's `/bin/sh`): the host's own for x86_64
/// (setup installs `busybox-static`), else the architecture's package, downloaded and unpacked
/// when missing.
pub fn busybox(arch: Arch) -> PathBuf {
    if arch == Arch::X86_64 {
        assert!(
            Path::new(HOST_BUSYBOX).exists(),
            "{HOST_BUSYBOX} missing: Debian's busybox-static (cargo xtask setup installs it)"
        );
        return PathBuf::from(HOST_BUSYBOX);
    }
    let dir = busybox_dir(arch);
    unpacked("busybox-static", arch, &dir, "bin/busybox");
    dir.join("bin/busybox")
}
