//! What kind of machine this instance is, so that latency is compared like with like: in a
//! mixed-instances group a small type answers slower than a large one without being sick.
//!
//! `fleet.instance_type` when set; else the EC2 instance type the firmware names (on Nitro
//! instances the DMI product name is the type, e.g. `m5.large`); else the processor model and
//! count from `/proc/cpuinfo`, which tells the types of other clouds and of bare metal apart
//! as far as latency goes. Reading files only: nothing is asked of the network.

/// The instance type latency is compared by, and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceType {
    pub name: String,
    pub source: &'static str,
}

const DMI: &str = "/sys/devices/virtual/dmi/id";

/// The configured type, else what the host says (None: nothing readable).
pub fn detect(configured: &str) -> Option<InstanceType> {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    from_host(
        configured,
        &read(&format!("{DMI}/sys_vendor")),
        &read(&format!("{DMI}/product_name")),
        &read("/proc/cpuinfo"),
    )
}

/// `detect` on the files' contents.
pub fn from_host(
    configured: &str,
    vendor: &str,
    product: &str,
    cpuinfo: &str,
) -> Option<InstanceType> {
    let configured = configured.trim();
    if !configured.is_empty() {
        return Some(InstanceType {
            name: configured.to_string(),
            source: "fleet.instance_type",
        });
    }
    let product = product.trim();
    if vendor.trim() == "Amazon EC2" && is_ec2_type(product) {
        return Some(InstanceType {
            name: product.to_string(),
            source: "the EC2 instance type (DMI product name)",
        });
    }
    let field = |name: &str| {
        cpuinfo.lines().find_map(|l| {
            let (key, value) = l.split_once(':')?;
            (key.trim() == name).then(|| value.split_whitespace().collect::<Vec<_>>().join(" "))
        })
    };
    let count = cpuinfo
        .lines()
        .filter(|l| {
            l.split_once(':')
                .is_some_and(|(k, _)| k.trim() == "processor")
        })
        .count();
    // arm64 names no model: its implementer and part codes do.
    let model = field("model name").or_else(|| {
        Some(format!(
            "CPU implementer {} part {}",
            field("CPU implementer")?,
            field("CPU part")?
        ))
    })?;
    Some(InstanceType {
        name: format!("{count} × {model}"),
        source: "the processors (/proc/cpuinfo)",
    })
}

/// `m5.large`, `c7gn.16xlarge`, `u-6tb1.metal`: a family, a dot, a size. Xen-era instances
/// say `HVM domU` instead.
fn is_ec2_type(s: &str) -> bool {
    let Some((family, size)) = s.split_once('.') else {
        return false;
    };
    let ok = |p: &str| {
        !p.is_empty()
            && p.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    };
    ok(family) && ok(size)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CPUINFO: &str = "processor\t: 0\nmodel name\t: Intel(R) Xeon(R)  Platinum 8259CL CPU @ \
                           2.50GHz\n\nprocessor\t: 1\nmodel name\t: Intel(R) Xeon(R)  Platinum \
                           8259CL CPU @ 2.50GHz\n";

    #[test]
    fn the_configured_type_wins() {
        let t = from_host(" c5.large ", "Amazon EC2", "m5.large", CPUINFO).unwrap();
        assert_eq!(t.name, "c5.large");
        assert_eq!(t.source, "fleet.instance_type");
    }

    #[test]
    fn a_nitro_instance_names_its_type() {
        let t = from_host("", "Amazon EC2\n", "m5.large\n", CPUINFO).unwrap();
        assert_eq!(t.name, "m5.large");
    }

    #[test]
    fn elsewhere_the_processors_tell_the_type() {
        for (vendor, product) in [("Xen", "HVM domU"), ("QEMU", "Standard PC (Q35)"), ("", "")] {
            let t = from_host("", vendor, product, CPUINFO).unwrap();
            assert_eq!(t.name, "2 × Intel(R) Xeon(R) Platinum 8259CL CPU @ 2.50GHz");
            assert_eq!(t.source, "the processors (/proc/cpuinfo)");
        }
        // A Xen-era EC2 instance says nothing of its type in the firmware.
        assert!(from_host("", "Amazon EC2", "HVM domU", CPUINFO)
            .unwrap()
            .name
            .starts_with("2 ×"));
        // arm64 names its implementer and part instead.
        let arm = "processor\t: 0\nCPU implementer\t: 0x41\nCPU part\t: 0xd0c\n\n\
                   processor\t: 1\nCPU implementer\t: 0x41\nCPU part\t: 0xd0c\n";
        assert_eq!(
            from_host("", "", "", arm).unwrap().name,
            "2 × CPU implementer 0x41 part 0xd0c"
        );
        assert_eq!(from_host("", "", "", "processor\t: 0\n"), None);
    }

    #[test]
    fn ec2_type_names() {
        for ok in ["m5.large", "c7gn.16xlarge", "u-6tb1.metal", "t3a.nano"] {
            assert!(is_ec2_type(ok), "{ok}");
        }
        for bad in ["HVM domU", "", "m5", ".large", "M5.Large", "m5.large.x y"] {
            assert!(!is_ec2_type(bad), "{bad}");
        }
    }
}
