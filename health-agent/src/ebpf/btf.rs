//! Just enough of a BTF reader to find where a few fields of `struct sock` sit in the running
//! kernel (`/sys/kernel/btf/vmlinux`). Rust eBPF has no CO-RE relocations, so the raw
//! tracepoints get these offsets from user space at start-up instead of compiling them in.
//!
//! Format: include/uapi/linux/btf.h and Documentation/bpf/btf.rst. A header, then a type
//! section of variable-length records (type ids count from 1), then a string section.

use std::path::{Path, PathBuf};

/// Why the kernel's BTF did not say where a field sits. The agent then runs the slower classic
/// tracepoint (or matches ports in any namespace) and says why in the kernel status.
#[derive(Debug, thiserror::Error)]
pub enum BtfError {
    #[error("{}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("BTF too short")]
    TooShort,
    #[error("not little-endian BTF (magic {found:#06x}, expected {MAGIC:#06x})")]
    Magic { found: u16 },
    #[error("BTF truncated at byte {0}")]
    Truncated(usize),
    #[error("BTF section runs past the end of the data")]
    SectionPastEnd,
    #[error("BTF type section truncated")]
    TypeSectionTruncated,
    #[error("unknown BTF kind {kind} at type {id}")]
    UnknownKind { kind: u32, id: usize },
    #[error("struct {0} is not in the kernel's BTF")]
    NoStruct(String),
    #[error("struct {strukt} has no field {field}")]
    NoField { strukt: String, field: String },
    #[error("{strukt}.{field} is a bitfield on this kernel")]
    Bitfield { strukt: String, field: String },
    #[error("{strukt}.{field} is {size} bytes, expected {expected}")]
    Size {
        strukt: &'static str,
        field: &'static str,
        size: u32,
        expected: u32,
    },
    #[error(
        "sock_common.skc_net is {0} bytes, not a pointer (a kernel without network namespaces?)"
    )]
    NetNotPointer(u32),
}

/// The offsets the raw tracepoints read, in bytes from the start of `struct sock`.
#[derive(Debug)]
pub struct SockOffsets {
    /// `__sk_common.skc_num`: the local port, host byte order.
    pub num: u32,
    /// `sk_protocol`.
    pub protocol: u32,
    /// `__sk_common.skc_net` (the `struct net *`) and, in `struct net`, `ns.inum` (the
    /// namespace's inode), or why they could not be found: then watched ports match in any
    /// namespace.
    pub net: Result<(u32, u32), BtfError>,
}

const MAGIC: u16 = 0xeb9f;

const KIND_INT: u32 = 1;
const KIND_PTR: u32 = 2;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_RESTRICT: u32 = 11;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_VAR: u32 = 14;
const KIND_DATASEC: u32 = 15;
const KIND_DECL_TAG: u32 = 17;
const KIND_TYPE_TAG: u32 = 18;
const KIND_ENUM64: u32 = 19;

#[derive(Debug, Clone, Copy)]
struct Member {
    name_off: u32,
    type_id: u32,
    /// In bits from the start of the enclosing struct or union.
    bit_offset: u32,
    /// Non-zero for a bitfield.
    bitfield_size: u32,
}

#[derive(Debug, Clone)]
struct Type {
    name_off: u32,
    kind: u32,
    /// For STRUCT/UNION: member offsets carry a bitfield size in their top byte.
    kind_flag: bool,
    /// Size for INT/STRUCT/UNION/ENUM, the referenced type for modifiers.
    size_or_type: u32,
    /// Byte range of the member records for STRUCT/UNION.
    members: std::ops::Range<usize>,
}

/// A parsed BTF blob: where each type record starts, its type section and its string section.
/// Records are decoded when looked at: the kernel has well over 100,000 types and only a
/// handful are wanted, so the index is all that is kept.
pub struct Btf<'a> {
    starts: Vec<u32>,
    type_data: &'a [u8],
    strings: &'a [u8],
}

/// The type record at `at` (type `id`, for messages) and where the next one starts.
fn decode(type_data: &[u8], at: usize, id: usize) -> Result<(Type, usize), BtfError> {
    let name_off = u32_at(type_data, at)?;
    let info = u32_at(type_data, at + 4)?;
    let size_or_type = u32_at(type_data, at + 8)?;
    let vlen = (info & 0xffff) as usize;
    let kind = (info >> 24) & 0x1f;
    let body = at + 12;
    let extra = match kind {
        KIND_INT | KIND_VAR | KIND_DECL_TAG => 4,
        KIND_ARRAY => 12,
        KIND_STRUCT | KIND_UNION | KIND_DATASEC | KIND_ENUM64 => 12 * vlen,
        KIND_ENUM | KIND_FUNC_PROTO => 8 * vlen,
        KIND_PTR | KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG => 0,
        // FWD, FUNC, FLOAT carry nothing more; anything newer is unknown.
        7 | 12 | 16 => 0,
        other => return Err(BtfError::UnknownKind { kind: other, id }),
    };
    let next = body + extra;
    if next > type_data.len() {
        return Err(BtfError::TypeSectionTruncated);
    }
    let t = Type {
        name_off,
        kind,
        kind_flag: info >> 31 == 1,
        size_or_type,
        members: if matches!(kind, KIND_STRUCT | KIND_UNION) {
            body..next
        } else {
            0..0
        },
    };
    Ok((t, next))
}

fn u32_at(b: &[u8], at: usize) -> Result<u32, BtfError> {
    b.get(at..at + 4)
        .map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
        .ok_or(BtfError::Truncated(at))
}

impl<'a> Btf<'a> {
    pub fn parse(data: &'a [u8]) -> Result<Self, BtfError> {
        let magic = data
            .get(0..2)
            .map(|s| u16::from_le_bytes([s[0], s[1]]))
            .ok_or(BtfError::TooShort)?;
        if magic != MAGIC {
            return Err(BtfError::Magic { found: magic });
        }
        let hdr_len = u32_at(data, 4)? as usize;
        let (type_off, type_len) = (u32_at(data, 8)? as usize, u32_at(data, 12)? as usize);
        let (str_off, str_len) = (u32_at(data, 16)? as usize, u32_at(data, 20)? as usize);
        let section = |off: usize, len: usize| {
            data.get(hdr_len + off..hdr_len + off + len)
                .ok_or(BtfError::SectionPastEnd)
        };
        let type_data = section(type_off, type_len)?;
        let strings = section(str_off, str_len)?;

        let mut starts = Vec::new();
        let mut at = 0;
        while at < type_data.len() {
            let (_, next) = decode(type_data, at, starts.len() + 1)?;
            starts.push(at as u32);
            at = next;
        }
        Ok(Self {
            starts,
            type_data,
            strings,
        })
    }

    fn name(&self, off: u32) -> &str {
        let rest = self.strings.get(off as usize..).unwrap_or_default();
        let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
        std::str::from_utf8(&rest[..end]).unwrap_or_default()
    }

    fn get(&self, id: u32) -> Option<Type> {
        let at = *self.starts.get((id as usize).checked_sub(1)?)?;
        decode(self.type_data, at as usize, id as usize)
            .ok()
            .map(|(t, _)| t)
    }

    /// Follows typedefs and qualifiers to the type they name.
    fn resolve(&self, mut id: u32) -> Option<Type> {
        for _ in 0..32 {
            let t = self.get(id)?;
            match t.kind {
                KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG => {
                    id = t.size_or_type
                }
                _ => return Some(t),
            }
        }
        None
    }

    fn members(&self, t: &Type) -> impl Iterator<Item = Member> + '_ {
        let kind_flag = t.kind_flag;
        self.type_data[t.members.clone()]
            .chunks_exact(12)
            .map(move |m| {
                let word = |i: usize| u32::from_le_bytes([m[i], m[i + 1], m[i + 2], m[i + 3]]);
                let offset = word(8);
                let (bit_offset, bitfield_size) = if kind_flag {
                    (offset & 0x00ff_ffff, offset >> 24)
                } else {
                    // Without kind_flag a bitfield's size lives in its INT type; the fields read
                    // here are plain u16s, which `field_offset` checks by size.
                    (offset, 0)
                };
                Member {
                    name_off: word(0),
                    type_id: word(4),
                    bit_offset,
                    bitfield_size,
                }
            })
    }

    /// The struct (not a forward declaration) called `name`.
    fn find_struct(&self, name: &str) -> Option<Type> {
        (1..=self.starts.len() as u32)
            .filter_map(|id| self.get(id))
            .find(|t| {
                t.kind == KIND_STRUCT && !t.members.is_empty() && self.name(t.name_off) == name
            })
    }

    /// `field` of `t` (bit offset, bitfield size, type), looking through anonymous structs
    /// and unions.
    fn field_in(&self, t: &Type, field: &str, depth: u32) -> Option<Member> {
        if depth > 8 {
            return None;
        }
        for m in self.members(t) {
            if self.name(m.name_off) == field {
                return Some(m);
            }
            if m.name_off != 0 {
                continue;
            }
            let Some(inner) = self
                .resolve(m.type_id)
                .filter(|i| matches!(i.kind, KIND_STRUCT | KIND_UNION))
            else {
                continue;
            };
            if let Some(found) = self.field_in(&inner, field, depth + 1) {
                return Some(Member {
                    bit_offset: m.bit_offset + found.bit_offset,
                    ..found
                });
            }
        }
        None
    }

    /// Byte offset of `field` in `struct strukt`, and the byte size of its (integer) type.
    pub fn field_offset(&self, strukt: &str, field: &str) -> Result<(u32, u32), BtfError> {
        let t = self
            .find_struct(strukt)
            .ok_or_else(|| BtfError::NoStruct(strukt.into()))?;
        let m = self
            .field_in(&t, field, 0)
            .ok_or_else(|| BtfError::NoField {
                strukt: strukt.into(),
                field: field.into(),
            })?;
        if m.bitfield_size != 0 || m.bit_offset % 8 != 0 {
            return Err(BtfError::Bitfield {
                strukt: strukt.into(),
                field: field.into(),
            });
        }
        let size = self
            .resolve(m.type_id)
            .filter(|t| matches!(t.kind, KIND_INT | KIND_ENUM | KIND_STRUCT | KIND_UNION))
            .map_or(0, |t| t.size_or_type);
        Ok((m.bit_offset / 8, size))
    }
}

/// Where `skc_num` and `sk_protocol` sit in this kernel's `struct sock`.
pub fn sock_offsets(path: &Path) -> Result<SockOffsets, BtfError> {
    let data = std::fs::read(path).map_err(|source| BtfError::Read {
        path: path.into(),
        source,
    })?;
    let btf = Btf::parse(&data)?;
    let sized = |strukt: &'static str, field: &'static str, expected: u32| match btf
        .field_offset(strukt, field)?
    {
        (off, size) if size == expected => Ok(off),
        (_, size) => Err(BtfError::Size {
            strukt,
            field,
            size,
            expected,
        }),
    };
    let (common, _) = btf.field_offset("sock", "__sk_common")?;
    let net = || {
        // possible_net_t is a struct holding just the pointer (with CONFIG_NET_NS).
        let (skc_net, size) = btf.field_offset("sock_common", "skc_net")?;
        if size != 8 {
            return Err(BtfError::NetNotPointer(size));
        }
        let (ns, _) = btf.field_offset("net", "ns")?;
        let inum = sized("ns_common", "inum", 4)?;
        Ok((common + skc_net, ns + inum))
    };
    Ok(SockOffsets {
        num: common + sized("sock_common", "skc_num", 2)?,
        protocol: sized("sock", "sk_protocol", 2)?,
        net: net(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const VMLINUX: &str = "/sys/kernel/btf/vmlinux";

    /// Reads the running kernel's BTF (world-readable: no root needed). On a kernel built
    /// without BTF this fails rather than pass having checked nothing.
    #[test]
    fn finds_the_sock_fields_in_the_running_kernel() {
        assert!(
            Path::new(VMLINUX).exists(),
            "{VMLINUX} is missing: this kernel has no BTF, so this test cannot check anything \
             (skip it by name on such a kernel)"
        );
        let off = sock_offsets(Path::new(VMLINUX)).unwrap();
        let data = std::fs::read(VMLINUX).unwrap();
        let btf = Btf::parse(&data).unwrap();
        // skc_num follows skc_dport in the same anonymous struct (the port pair).
        let (dport, size) = btf.field_offset("sock_common", "skc_dport").unwrap();
        assert_eq!((size, off.num), (2, dport + 2), "{off:?}");
        // sk_protocol lies past sock_common, inside struct sock.
        let (_, sock_common_size) = btf.field_offset("sock", "__sk_common").unwrap();
        assert!(off.protocol >= sock_common_size, "{off:?}");
        // skc_net lies within sock_common; ns.inum within struct net.
        let (skc_net, inum) = *off.net.as_ref().expect("namespace offsets");
        assert!(skc_net < sock_common_size, "{off:?}");
        let (ns, ns_size) = btf.field_offset("net", "ns").unwrap();
        assert!((ns..ns + ns_size).contains(&inum), "{off:?}");
    }

    #[test]
    fn bad_input_is_an_error_not_a_panic() {
        assert!(Btf::parse(b"").is_err());
        assert!(Btf::parse(b"\x9f\xeb\x01\x00\x18\x00\x00\x00").is_err());
        let mut header = vec![0x9f, 0xeb, 1, 0];
        for v in [24u32, 0, 1000, 0, 0] {
            header.extend_from_slice(&v.to_le_bytes());
        }
        let err = Btf::parse(&header)
            .err()
            .expect("a section past the end is refused");
        assert!(matches!(err, BtfError::SectionPastEnd), "{err}");
        let err = sock_offsets(Path::new("/nonexistent/vmlinux")).unwrap_err();
        assert!(
            matches!(&err, BtfError::Read { path, .. } if path == Path::new("/nonexistent/vmlinux")),
            "{err}"
        );
        // The message names the file, for the kernel status.
        assert!(err.to_string().contains("/nonexistent/vmlinux"), "{err}");
    }
}
