//! tracefs: find it (mounting it when a fresh machine has not), and read tracepoint record
//! layouts from `events/<category>/<name>/format` so no field offset is compiled in.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
};

use super::KernelError;

const CANDIDATES: [&str; 2] = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];

/// Returns the tracefs root, mounting it at /sys/kernel/tracing when nothing is mounted.
pub fn ensure_mounted() -> Result<PathBuf, KernelError> {
    for root in CANDIDATES.iter().map(Path::new) {
        match std::fs::metadata(root.join("events")) {
            Ok(m) if m.is_dir() => return Ok(root.to_path_buf()),
            // Mounted, and root's alone (mode 0700): mounting again cannot help.
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                return Err(KernelError::Tracefs(format!(
                    "no privilege: tracefs at {} is mounted but not readable ({e}); run as \
                     root, or with CAP_BPF and CAP_PERFMON as uid 0",
                    root.display()
                )));
            }
            _ => {}
        }
    }
    if let Err(e) = crate::sys::mount_tracefs() {
        return Err(KernelError::Tracefs(format!(
            "tracefs is not mounted and mounting it at /sys/kernel/tracing failed: {} \
             (run as root, or `mount -t tracefs nodev /sys/kernel/tracing`)",
            e
        )));
    }
    tracing::info!("mounted tracefs at /sys/kernel/tracing (it was not mounted)");
    Ok(PathBuf::from("/sys/kernel/tracing"))
}

/// One field of a tracepoint record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Field {
    pub offset: u32,
    pub size: u32,
}

/// The fields of one tracepoint, by name.
#[derive(Debug, Default)]
pub struct Format {
    pub tracepoint: String,
    pub fields: HashMap<String, Field>,
}

impl Format {
    pub fn read(root: &Path, category: &str, name: &str) -> Result<Self, KernelError> {
        let path = root.join("events").join(category).join(name).join("format");
        let text = std::fs::read_to_string(&path).map_err(|e| {
            KernelError::Tracefs(format!(
                "tracepoint {category}:{name} is not available ({}: {e}); this kernel is too old or built without it",
                path.display()
            ))
        })?;
        Ok(Self::parse(&format!("{category}:{name}"), &text))
    }

    /// Parses lines such as `field:const void * skaddr; offset:8; size:8; signed:0;` (tab-separated).
    pub fn parse(tracepoint: &str, text: &str) -> Self {
        let mut fields = HashMap::new();
        for line in text.lines() {
            let mut decl = None;
            let mut offset = None;
            let mut size = None;
            for part in line.split(';').map(str::trim) {
                if let Some(d) = part.strip_prefix("field:") {
                    decl = Some(d);
                } else if let Some(o) = part.strip_prefix("offset:") {
                    offset = o.parse().ok();
                } else if let Some(s) = part.strip_prefix("size:") {
                    size = s.parse().ok();
                }
            }
            if let (Some(decl), Some(offset), Some(size)) = (decl, offset, size) {
                let name = decl
                    .rsplit(|c: char| c.is_whitespace() || c == '*')
                    .next()
                    .unwrap_or(decl);
                let name = name.split('[').next().unwrap_or(name);
                fields.insert(name.to_string(), Field { offset, size });
            }
        }
        Self {
            tracepoint: tracepoint.to_string(),
            fields,
        }
    }

    /// Offset of `name`, checking the size the program reads it with.
    pub fn offset(&self, name: &str, size: u32) -> Result<u32, KernelError> {
        let f = self.fields.get(name).ok_or_else(|| {
            KernelError::Tracefs(format!("{} has no field `{name}`", self.tracepoint))
        })?;
        if f.size != size {
            return Err(KernelError::Tracefs(format!(
                "{} field `{name}` is {} bytes, the program reads {size}",
                self.tracepoint, f.size
            )));
        }
        Ok(f.offset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SET_STATE: &str = "name: inet_sock_set_state
ID: 1416
format:
	field:unsigned short common_type;	offset:0;	size:2;	signed:0;
	field:unsigned char common_flags;	offset:2;	size:1;	signed:0;
	field:int common_pid;	offset:4;	size:4;	signed:1;

	field:const void * skaddr;	offset:8;	size:8;	signed:0;
	field:int oldstate;	offset:16;	size:4;	signed:1;
	field:int newstate;	offset:20;	size:4;	signed:1;
	field:__u16 sport;	offset:24;	size:2;	signed:0;
	field:__u8 saddr[4];	offset:32;	size:4;	signed:0;
";

    #[test]
    fn parses_names_offsets_and_arrays() {
        let f = Format::parse("sock:inet_sock_set_state", SET_STATE);
        assert_eq!(f.offset("skaddr", 8).unwrap(), 8);
        assert_eq!(f.offset("newstate", 4).unwrap(), 20);
        assert_eq!(f.offset("sport", 2).unwrap(), 24);
        assert_eq!(
            f.fields["saddr"],
            Field {
                offset: 32,
                size: 4
            }
        );
        assert!(f
            .offset("sport", 4)
            .unwrap_err()
            .to_string()
            .contains("2 bytes"));
        assert!(f.offset("nope", 4).is_err());
    }
}
