//! Just enough of a BTF reader to find where a few fields of `struct sock` sit in the running
//! kernel (`/sys/kernel/btf/vmlinux`). Rust eBPF has no CO-RE relocations, so the raw
//! tracepoints get these offsets from user space at start-up instead of compiling them in.
//!
//! Format: include/uapi/linux/btf.h and Documentation/bpf/btf.rst. A header, then a type
//! section of variable-length records (type ids count from 1), then a string section; since 2026
//! the header may also point at a layout section giving each kind's record size.

use std::path::Path;

/// The offsets the raw tracepoints read, in bytes from the start of `struct sock`.
#[derive(Debug, Clone, PartialEq, Eq)]
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

/// Why the offsets could not be read. Messages name the kernel's own types and fields.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BtfError {
    #[error("{path}: {reason}")]
    Read { path: String, reason: String },
    #[error("BTF too short")]
    TooShort,
    #[error("not little-endian BTF (magic {0:#06x}, expected {MAGIC:#06x})")]
    Magic(u16),
    #[error("BTF header is {0} bytes, shorter than the {HEADER_V1} of every version")]
    ShortHeader(usize),
    #[error("BTF truncated at byte {0}")]
    Truncated(usize),
    #[error("BTF section runs past the end of the data")]
    SectionPastEnd,
    #[error("unknown BTF kind {kind} at type {id} and no layout section entry to skip it")]
    UnknownKind { kind: u32, id: usize },
    #[error("BTF type section truncated in type {0}")]
    TypeTruncated(usize),
    /// A type or field is not there; `stopped` says why indexing ended early, when it did
    /// (the likely reason).
    #[error("{what}{}", stopped.as_ref().map(|s| format!(" (BTF read stopped early: {s})")).unwrap_or_default())]
    Missing {
        what: String,
        stopped: Option<String>,
    },
    /// The field is there but not what the programs read: a bitfield, another size, an
    /// offset that overflows.
    #[error("{0}")]
    Shape(String),
}

const MAGIC: u16 = 0xeb9f;
/// The header every BTF since Linux 4.18 has: magic, version, flags, hdr_len, and the offsets
/// and lengths of the type and string sections.
const HEADER_V1: usize = 24;
/// Newer kernels (uapi btf.h, 2026) append `layout_off`/`layout_len`: a table of `struct
/// btf_layout` (info_sz u8, elem_sz u8, flags u16) indexed by kind, so that a reader can skip
/// kinds newer than itself.
const HEADER_WITH_LAYOUT: usize = 32;
const LAYOUT_ENTRY: usize = 4;

const KIND_INT: u32 = 1;
const KIND_PTR: u32 = 2;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_FWD: u32 = 7;
const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_RESTRICT: u32 = 11;
const KIND_FUNC: u32 = 12;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_VAR: u32 = 14;
const KIND_DATASEC: u32 = 15;
const KIND_FLOAT: u32 = 16;
const KIND_DECL_TAG: u32 = 17;
const KIND_TYPE_TAG: u32 = 18;
const KIND_ENUM64: u32 = 19;

/// Bytes following the 12-byte `struct btf_type` of a known kind (Documentation/bpf/btf.rst,
/// section 2.2), or None for a kind newer than this reader.
fn known_trailing(kind: u32, vlen: usize) -> Option<usize> {
    Some(match kind {
        // u32 encoding word; struct btf_var (linkage); struct btf_decl_tag (component_idx).
        KIND_INT | KIND_VAR | KIND_DECL_TAG => 4,
        // struct btf_array: type, index_type, nelems.
        KIND_ARRAY => 12,
        // vlen × btf_member / btf_var_secinfo / btf_enum64, 12 bytes each.
        KIND_STRUCT | KIND_UNION | KIND_DATASEC | KIND_ENUM64 => 12 * vlen,
        // vlen × btf_enum / btf_param, 8 bytes each.
        KIND_ENUM | KIND_FUNC_PROTO => 8 * vlen,
        KIND_PTR | KIND_FWD | KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT
        | KIND_FUNC | KIND_FLOAT | KIND_TYPE_TAG => 0,
        _ => return None,
    })
}

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
///
/// A kind newer than this reader is skipped by the size the blob's own layout section gives
/// it (kernels since 2026). Without one its size is unknowable, so the index stops there and keeps the
/// types before it: type ids are positions, so nothing after an unskippable record can be
/// numbered. The structs this module needs are core types that usually come early, and every
/// lookup that fails says indexing stopped and why — so a newer kernel costs the fast path only
/// when it truly has to.
pub struct Btf<'a> {
    starts: Vec<u32>,
    type_data: &'a [u8],
    strings: &'a [u8],
    /// The layout section (empty when the blob has none).
    layout: &'a [u8],
    /// Why the index ends before the type section does.
    stopped: Option<String>,
}

/// The type record at `at` (type `id`, for messages) and where the next one starts.
fn decode(
    type_data: &[u8],
    layout: &[u8],
    at: usize,
    id: usize,
) -> Result<(Type, usize), BtfError> {
    let name_off = u32_at(type_data, at)?;
    let info = u32_at(type_data, at + 4)?;
    let size_or_type = u32_at(type_data, at + 8)?;
    // btf.h (2026) widened vlen to bits 0-23 and kind to bits 24-30; older BTF leaves those
    // bits zero, so reading the wide fields is right for both.
    let vlen = (info & 0x00ff_ffff) as usize;
    let kind = (info >> 24) & 0x7f;
    let body = at + 12;
    let extra = match known_trailing(kind, vlen) {
        Some(extra) => extra,
        None => {
            let entry = layout
                .get(kind as usize * LAYOUT_ENTRY..kind as usize * LAYOUT_ENTRY + 2)
                .ok_or(BtfError::UnknownKind { kind, id })?;
            entry[0] as usize + entry[1] as usize * vlen
        }
    };
    let next = body + extra;
    if next > type_data.len() {
        return Err(BtfError::TypeTruncated(id));
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
    at.checked_add(4)
        .and_then(|end| b.get(at..end))
        .map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
        .ok_or(BtfError::Truncated(at))
}

impl<'a> Btf<'a> {
    /// Checks the header and indexes the type section. Fails only when the header or the
    /// section bounds are wrong; a bad record ends the index (see [`Btf`]).
    pub fn parse(data: &'a [u8]) -> Result<Self, BtfError> {
        let magic = data
            .get(0..2)
            .map(|s| u16::from_le_bytes([s[0], s[1]]))
            .ok_or(BtfError::TooShort)?;
        if magic != MAGIC {
            return Err(BtfError::Magic(magic));
        }
        let hdr_len = u32_at(data, 4)? as usize;
        if hdr_len < HEADER_V1 {
            return Err(BtfError::ShortHeader(hdr_len));
        }
        let field = |at: usize| -> Result<usize, BtfError> { Ok(u32_at(data, at)? as usize) };
        let (type_off, type_len) = (field(8)?, field(12)?);
        let (str_off, str_len) = (field(16)?, field(20)?);
        let (layout_off, layout_len) = if hdr_len >= HEADER_WITH_LAYOUT {
            (field(24)?, field(28)?)
        } else {
            (0, 0)
        };
        // Offsets count from the end of the header; u32 + u32 + u32 cannot overflow a 64-bit
        // usize, checked_add keeps it honest on 32-bit targets.
        let section = |off: usize, len: usize| {
            hdr_len
                .checked_add(off)
                .and_then(|start| Some(start..start.checked_add(len)?))
                .and_then(|range| data.get(range))
                .ok_or(BtfError::SectionPastEnd)
        };
        let type_data = section(type_off, type_len)?;
        let strings = section(str_off, str_len)?;
        let layout = section(layout_off, layout_len)?;

        let mut starts = Vec::new();
        let mut stopped = None;
        let mut at = 0;
        while at < type_data.len() {
            match decode(type_data, layout, at, starts.len() + 1) {
                Ok((_, next)) => {
                    starts.push(at as u32);
                    at = next;
                }
                Err(e) => {
                    stopped = Some(format!(
                        "{e}; only the {} types before it were read",
                        starts.len()
                    ));
                    break;
                }
            }
        }
        Ok(Self {
            starts,
            type_data,
            strings,
            layout,
            stopped,
        })
    }

    /// Why indexing ended before the type section did, if it did. (The agent itself learns it
    /// through the errors of the lookups it needed.)
    #[cfg(test)]
    pub fn stopped(&self) -> Option<&str> {
        self.stopped.as_deref()
    }

    fn name(&self, off: u32) -> &str {
        let rest = self.strings.get(off as usize..).unwrap_or_default();
        let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
        std::str::from_utf8(&rest[..end]).unwrap_or_default()
    }

    fn get(&self, id: u32) -> Option<Type> {
        let at = *self.starts.get((id as usize).checked_sub(1)?)?;
        decode(self.type_data, self.layout, at as usize, id as usize)
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
        self.type_data
            .get(t.members.clone())
            .unwrap_or_default()
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
    /// and unions. `budget` bounds the members looked at: a malformed blob whose anonymous
    /// members nest back into their own struct would otherwise take members^depth steps.
    fn field_in(&self, t: &Type, field: &str, depth: u32, budget: &mut u32) -> Option<Member> {
        if depth > 8 {
            return None;
        }
        for m in self.members(t) {
            *budget = budget.checked_sub(1)?;
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
            if let Some(found) = self.field_in(&inner, field, depth + 1, budget) {
                return Some(Member {
                    bit_offset: m.bit_offset.checked_add(found.bit_offset)?,
                    ..found
                });
            }
        }
        None
    }

    /// `what` is missing, with why indexing stopped early when it did.
    fn missing(&self, what: String) -> BtfError {
        BtfError::Missing {
            what,
            stopped: self.stopped.clone(),
        }
    }

    /// Byte offset of `field` in `struct strukt`, and the byte size of its (integer) type.
    pub fn field_offset(&self, strukt: &str, field: &str) -> Result<(u32, u32), BtfError> {
        let t = self
            .find_struct(strukt)
            .ok_or_else(|| self.missing(format!("struct {strukt} is not in the kernel's BTF")))?;
        let m = self
            .field_in(&t, field, 0, &mut 100_000)
            .ok_or_else(|| self.missing(format!("struct {strukt} has no field {field}")))?;
        if m.bitfield_size != 0 || m.bit_offset % 8 != 0 {
            return Err(BtfError::Shape(format!(
                "{strukt}.{field} is a bitfield on this kernel"
            )));
        }
        let size = match self.resolve(m.type_id) {
            Some(t) if matches!(t.kind, KIND_INT | KIND_ENUM | KIND_STRUCT | KIND_UNION) => {
                t.size_or_type
            }
            // Its type lies past where indexing stopped: the size is unknown, not zero.
            None if self.stopped.is_some() => {
                return Err(self.missing(format!("the type of {strukt}.{field} was not read")))
            }
            _ => 0,
        };
        Ok((m.bit_offset / 8, size))
    }
}

/// Where `skc_num` and `sk_protocol` sit in this kernel's `struct sock`.
pub fn sock_offsets(path: &Path) -> Result<SockOffsets, BtfError> {
    let data = std::fs::read(path).map_err(|e| BtfError::Read {
        path: path.display().to_string(),
        reason: e.to_string(),
    })?;
    sock_offsets_in(&data)
}

/// [`sock_offsets`] on a BTF blob already in memory.
pub fn sock_offsets_in(data: &[u8]) -> Result<SockOffsets, BtfError> {
    let btf = Btf::parse(data)?;
    let u16_field = |strukt: &str, field: &str| -> Result<u32, BtfError> {
        match btf.field_offset(strukt, field)? {
            (off, 2) => Ok(off),
            (_, size) => Err(BtfError::Shape(format!(
                "{strukt}.{field} is {size} bytes, expected 2"
            ))),
        }
    };
    let inside = |outer: u32, inner: u32, what: &str| {
        outer
            .checked_add(inner)
            .ok_or_else(|| BtfError::Shape(format!("{what}: offset {outer} + {inner} overflows")))
    };
    let (common, _) = btf.field_offset("sock", "__sk_common")?;
    let net = || -> Result<(u32, u32), BtfError> {
        // possible_net_t is a struct holding just the pointer (with CONFIG_NET_NS).
        let (skc_net, size) = btf.field_offset("sock_common", "skc_net")?;
        if size != 8 {
            return Err(BtfError::Shape(format!(
                "sock_common.skc_net is {size} bytes, not a pointer (a kernel without network namespaces?)"
            )));
        }
        let (ns, _) = btf.field_offset("net", "ns")?;
        match btf.field_offset("ns_common", "inum")? {
            (inum, 4) => Ok((
                inside(common, skc_net, "sock.__sk_common.skc_net")?,
                inside(ns, inum, "net.ns.inum")?,
            )),
            (_, size) => Err(BtfError::Shape(format!(
                "ns_common.inum is {size} bytes, expected 4"
            ))),
        }
    };
    Ok(SockOffsets {
        num: inside(
            common,
            u16_field("sock_common", "skc_num")?,
            "sock.__sk_common.skc_num",
        )?,
        protocol: u16_field("sock", "sk_protocol")?,
        net: net(),
    })
}

/// Hand-built BTF blobs for tests and fuzz seeds.
#[cfg(test)]
pub mod sample;

#[cfg(test)]
mod tests;
