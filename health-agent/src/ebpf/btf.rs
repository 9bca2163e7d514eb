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
    pub net: Result<(u32, u32), String>,
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
fn decode(type_data: &[u8], layout: &[u8], at: usize, id: usize) -> Result<(Type, usize), String> {
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
                .ok_or_else(|| {
                    format!(
                        "unknown BTF kind {kind} at type {id} and no layout section entry to skip it"
                    )
                })?;
            entry[0] as usize + entry[1] as usize * vlen
        }
    };
    let next = body + extra;
    if next > type_data.len() {
        return Err(format!("BTF type section truncated in type {id}"));
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

fn u32_at(b: &[u8], at: usize) -> Result<u32, String> {
    at.checked_add(4)
        .and_then(|end| b.get(at..end))
        .map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
        .ok_or_else(|| format!("BTF truncated at byte {at}"))
}

impl<'a> Btf<'a> {
    /// Checks the header and indexes the type section. Fails only when the header or the
    /// section bounds are wrong; a bad record ends the index (see [`Btf`]).
    pub fn parse(data: &'a [u8]) -> Result<Self, String> {
        let magic = data
            .get(0..2)
            .map(|s| u16::from_le_bytes([s[0], s[1]]))
            .ok_or("BTF too short")?;
        if magic != MAGIC {
            return Err(format!(
                "not little-endian BTF (magic {magic:#06x}, expected {MAGIC:#06x})"
            ));
        }
        let hdr_len = u32_at(data, 4)? as usize;
        if hdr_len < HEADER_V1 {
            return Err(format!(
                "BTF header is {hdr_len} bytes, shorter than the {HEADER_V1} of every version"
            ));
        }
        let field = |at: usize| -> Result<usize, String> { Ok(u32_at(data, at)? as usize) };
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
                .ok_or_else(|| "BTF section runs past the end of the data".to_string())
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

    /// Why indexing ended before the type section did, if it did.
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

    /// `message`, with why indexing stopped early when it did: the likely reason a type or
    /// field is missing.
    fn missing(&self, message: String) -> String {
        match &self.stopped {
            Some(why) => format!("{message} (BTF read stopped early: {why})"),
            None => message,
        }
    }

    /// Byte offset of `field` in `struct strukt`, and the byte size of its (integer) type.
    pub fn field_offset(&self, strukt: &str, field: &str) -> Result<(u32, u32), String> {
        let t = self
            .find_struct(strukt)
            .ok_or_else(|| self.missing(format!("struct {strukt} is not in the kernel's BTF")))?;
        let m = self
            .field_in(&t, field, 0, &mut 100_000)
            .ok_or_else(|| self.missing(format!("struct {strukt} has no field {field}")))?;
        if m.bitfield_size != 0 || m.bit_offset % 8 != 0 {
            return Err(format!("{strukt}.{field} is a bitfield on this kernel"));
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
pub fn sock_offsets(path: &Path) -> Result<SockOffsets, String> {
    let data = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    sock_offsets_in(&data)
}

/// [`sock_offsets`] on a BTF blob already in memory.
pub fn sock_offsets_in(data: &[u8]) -> Result<SockOffsets, String> {
    let btf = Btf::parse(data)?;
    let u16_field = |strukt: &str, field: &str| -> Result<u32, String> {
        match btf.field_offset(strukt, field)? {
            (off, 2) => Ok(off),
            (_, size) => Err(format!("{strukt}.{field} is {size} bytes, expected 2")),
        }
    };
    let inside = |outer: u32, inner: u32, what: &str| {
        outer
            .checked_add(inner)
            .ok_or_else(|| format!("{what}: offset {outer} + {inner} overflows"))
    };
    let (common, _) = btf.field_offset("sock", "__sk_common")?;
    let net = || -> Result<(u32, u32), String> {
        // possible_net_t is a struct holding just the pointer (with CONFIG_NET_NS).
        let (skc_net, size) = btf.field_offset("sock_common", "skc_net")?;
        if size != 8 {
            return Err(format!(
                "sock_common.skc_net is {size} bytes, not a pointer (a kernel without network namespaces?)"
            ));
        }
        let (ns, _) = btf.field_offset("net", "ns")?;
        match btf.field_offset("ns_common", "inum")? {
            (inum, 4) => Ok((
                inside(common, skc_net, "sock.__sk_common.skc_net")?,
                inside(ns, inum, "net.ns.inum")?,
            )),
            (_, size) => Err(format!("ns_common.inum is {size} bytes, expected 4")),
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

/// Hand-built BTF blobs for tests and fuzz seeds: a few types shaped like the kernel's.
#[cfg(any(test, feature = "fuzzing"))]
pub mod sample {
    /// Builds a blob record by record; ids count from 1 in the order records are added.
    #[derive(Default)]
    pub struct Builder {
        types: Vec<u8>,
        strings: Vec<u8>,
        count: u32,
        /// (info_sz, elem_sz) per kind, written as a layout section when set.
        pub layout: Option<Vec<(u8, u8)>>,
    }

    impl Builder {
        pub fn new() -> Self {
            Self {
                strings: vec![0],
                ..Self::default()
            }
        }

        fn name(&mut self, name: &str) -> u32 {
            if name.is_empty() {
                return 0;
            }
            let off = self.strings.len() as u32;
            self.strings.extend_from_slice(name.as_bytes());
            self.strings.push(0);
            off
        }

        /// Any record: the 12-byte header, then `trailing` as given.
        pub fn raw(
            &mut self,
            name: &str,
            kind: u32,
            vlen: u32,
            kind_flag: bool,
            size_or_type: u32,
            trailing: &[u8],
        ) -> u32 {
            let name_off = self.name(name);
            let info = vlen | kind << 24 | u32::from(kind_flag) << 31;
            for word in [name_off, info, size_or_type] {
                self.types.extend_from_slice(&word.to_le_bytes());
            }
            self.types.extend_from_slice(trailing);
            self.count += 1;
            self.count
        }

        pub fn int(&mut self, name: &str, size: u32) -> u32 {
            let encoding = size * 8; // nr_bits in the low byte, offset 0, unsigned
            self.raw(
                name,
                super::KIND_INT,
                0,
                false,
                size,
                &encoding.to_le_bytes(),
            )
        }

        pub fn ptr(&mut self, to: u32) -> u32 {
            self.raw("", super::KIND_PTR, 0, false, to, &[])
        }

        /// A struct with `members` (name, type id, byte offset).
        pub fn strukt(&mut self, name: &str, size: u32, members: &[(&str, u32, u32)]) -> u32 {
            let mut trailing = Vec::new();
            for &(member, type_id, byte_offset) in members {
                let name_off = self.name(member);
                for word in [name_off, type_id, byte_offset * 8] {
                    trailing.extend_from_slice(&word.to_le_bytes());
                }
            }
            let kind = super::KIND_STRUCT;
            self.raw(name, kind, members.len() as u32, false, size, &trailing)
        }

        pub fn blob(&self) -> Vec<u8> {
            let layout: Vec<u8> = self
                .layout
                .iter()
                .flatten()
                .flat_map(|&(info, elem)| [info, elem, 0, 0])
                .collect();
            let hdr_len = if self.layout.is_some() { 32u32 } else { 24 };
            let types = self.types.len() as u32;
            let mut out = vec![0x9f, 0xeb, 1, 0];
            // types, then the layout section, then strings, as libbpf lays them out.
            let mut header = vec![hdr_len, 0, types, types + layout.len() as u32];
            header.push(self.strings.len() as u32);
            if self.layout.is_some() {
                header.extend([types, layout.len() as u32]);
            }
            for word in header {
                out.extend_from_slice(&word.to_le_bytes());
            }
            out.extend_from_slice(&self.types);
            out.extend_from_slice(&layout);
            out.extend_from_slice(&self.strings);
            out
        }

        /// The types `sock_offsets` needs, laid out as on x86-64 Linux 6.x: `skc_num` at 14,
        /// `skc_net` at 48, `sk_protocol` at 522, `net.ns` at 120 and `ns_common.inum` at 16.
        pub fn kernel_like(&mut self) {
            let u16_t = self.int("unsigned short", 2);
            let u32_t = self.int("unsigned int", 4);
            let u64_t = self.int("long long unsigned int", 8);
            let ports = self.strukt("", 4, &[("skc_dport", u16_t, 0), ("skc_num", u16_t, 2)]);
            let net_fwd = self.raw("net", super::KIND_FWD, 0, false, 0, &[]);
            let net_ptr = self.ptr(net_fwd);
            let possible_net = self.strukt("possible_net_t", 8, &[("net", net_ptr, 0)]);
            let sock_common = self.strukt(
                "sock_common",
                136,
                &[
                    ("skc_addrpair", u64_t, 0),
                    ("skc_hash", u32_t, 8),
                    ("", ports, 12),
                    ("skc_net", possible_net, 48),
                ],
            );
            let ns_common = self.strukt("ns_common", 24, &[("inum", u32_t, 16)]);
            self.strukt("net", 4096, &[("ns", ns_common, 120)]);
            self.strukt(
                "sock",
                776,
                &[("__sk_common", sock_common, 0), ("sk_protocol", u16_t, 522)],
            );
        }
    }

    /// A blob with just [`Builder::kernel_like`].
    pub fn kernel_like() -> Vec<u8> {
        let mut b = Builder::new();
        b.kernel_like();
        b.blob()
    }

    /// One record of every kind 1..=19 with vlen 2 and its documented trailing data (0xff
    /// bytes: a wrong size misreads the next header), then [`Builder::kernel_like`].
    pub fn every_known_kind() -> Vec<u8> {
        let mut b = Builder::new();
        for kind in 1..=19 {
            let trailing = super::known_trailing(kind, 2).unwrap_or_default();
            b.raw("x", kind, 2, false, 0, &vec![0xff; trailing]);
        }
        b.kernel_like();
        b.blob()
    }

    /// A kind-25 record (4-byte info, two 8-byte elements) before [`Builder::kernel_like`],
    /// with or without the layout section that says how to skip it.
    pub fn future_kind(with_layout: bool) -> Vec<u8> {
        let mut b = Builder::new();
        if with_layout {
            let mut layout: Vec<(u8, u8)> = (0..=19)
                .map(
                    |kind| match super::known_trailing(kind, 1).unwrap_or(0) as u8 {
                        n if matches!(
                            kind,
                            super::KIND_INT
                                | super::KIND_VAR
                                | super::KIND_DECL_TAG
                                | super::KIND_ARRAY
                        ) =>
                        {
                            (n, 0)
                        }
                        n => (0, n),
                    },
                )
                .collect();
            layout.extend([(0, 0); 5]);
            layout.push((4, 8));
            b.layout = Some(layout);
        }
        b.raw("future", 25, 2, false, 0, &[0xff; 4 + 2 * 8]);
        b.kernel_like();
        b.blob()
    }
}

#[cfg(test)]
mod tests {
    use super::{sample::Builder, *};

    const VMLINUX: &str = "/sys/kernel/btf/vmlinux";

    fn expected() -> SockOffsets {
        SockOffsets {
            num: 14,
            protocol: 522,
            net: Ok((48, 136)),
        }
    }

    #[test]
    fn finds_the_sock_fields_in_the_running_kernel() {
        if !Path::new(VMLINUX).exists() {
            // Silently passing here once hid a kernel without BTF on a test machine.
            assert_eq!(
                std::env::var("HEALTH_AGENT_NO_BTF_OK").as_deref(),
                Ok("1"),
                "{VMLINUX} is missing: this kernel has no BTF. Set HEALTH_AGENT_NO_BTF_OK=1 if \
                 that is expected on this machine"
            );
            return;
        }
        let off = sock_offsets(Path::new(VMLINUX)).unwrap();
        let data = std::fs::read(VMLINUX).unwrap();
        let btf = Btf::parse(&data).unwrap();
        assert_eq!(
            btf.stopped(),
            None,
            "the running kernel's BTF reads to the end"
        );
        // skc_num follows skc_dport in the same anonymous struct (the port pair).
        let (dport, size) = btf.field_offset("sock_common", "skc_dport").unwrap();
        assert_eq!((size, off.num), (2, dport + 2), "{off:?}");
        // sk_protocol lies past sock_common, inside struct sock.
        let (_, sock_common_size) = btf.field_offset("sock", "__sk_common").unwrap();
        assert!(off.protocol >= sock_common_size, "{off:?}");
        // skc_net lies within sock_common; ns.inum within struct net.
        let (skc_net, inum) = off.net.clone().expect("namespace offsets");
        assert!(skc_net < sock_common_size, "{off:?}");
        let (ns, ns_size) = btf.field_offset("net", "ns").unwrap();
        assert!((ns..ns + ns_size).contains(&inum), "{off:?}");
    }

    #[test]
    fn a_hand_built_blob_gives_its_offsets() {
        let blob = sample::kernel_like();
        assert_eq!(sock_offsets_in(&blob), Ok(expected()));
        assert_eq!(Btf::parse(&blob).unwrap().stopped(), None);
    }

    #[test]
    fn every_known_kind_is_skipped_by_its_documented_size() {
        let blob = sample::every_known_kind();
        let btf = Btf::parse(&blob).unwrap();
        assert_eq!(btf.stopped(), None);
        assert_eq!(btf.starts.len(), 19 + 11);
        assert_eq!(sock_offsets_in(&blob), Ok(expected()));
    }

    #[test]
    fn an_unknown_kind_after_the_needed_types_keeps_them() {
        let mut b = Builder::new();
        b.kernel_like();
        b.raw("future", 25, 3, false, 0, &[0xff; 40]);
        b.int("int", 4);
        let blob = b.blob();
        let btf = Btf::parse(&blob).unwrap();
        let stopped = btf.stopped().expect("stops at the unknown kind");
        assert!(
            stopped.contains("unknown BTF kind 25 at type 12"),
            "{stopped}"
        );
        assert_eq!(sock_offsets_in(&blob), Ok(expected()));
    }

    #[test]
    fn an_unknown_kind_before_the_needed_types_is_the_reported_reason() {
        let mut b = Builder::new();
        b.raw("future", 20, 0, false, 0, &[]);
        b.kernel_like();
        let err = sock_offsets_in(&b.blob()).unwrap_err();
        assert!(
            err.contains("struct sock is not in the kernel's BTF"),
            "{err}"
        );
        assert!(err.contains("unknown BTF kind 20 at type 1"), "{err}");
        assert!(err.contains("no layout section"), "{err}");
    }

    #[test]
    fn a_needed_type_past_an_unknown_kind_is_reported_not_guessed() {
        // The structs come first but a member's type id points past the unknown kind.
        let mut b = Builder::new();
        let sock = b.strukt("sock", 776, &[("sk_protocol", 3, 522)]);
        assert_eq!(sock, 1);
        b.raw("future", 30, 0, false, 0, &[]);
        b.int("unsigned short", 2);
        let btf_blob = b.blob();
        let btf = Btf::parse(&btf_blob).unwrap();
        let err = btf.field_offset("sock", "sk_protocol").unwrap_err();
        assert!(err.contains("was not read"), "{err}");
        assert!(err.contains("unknown BTF kind 30"), "{err}");
    }

    #[test]
    fn an_unknown_kind_is_skipped_by_the_layout_section() {
        let blob = sample::future_kind(true);
        let btf = Btf::parse(&blob).unwrap();
        assert_eq!(btf.stopped(), None);
        assert_eq!(sock_offsets_in(&blob), Ok(expected()));
        let err = sock_offsets_in(&sample::future_kind(false)).unwrap_err();
        assert!(err.contains("unknown BTF kind 25 at type 1"), "{err}");
    }

    #[test]
    fn every_truncation_is_an_error_not_a_panic() {
        let blob = sample::kernel_like();
        for len in 0..blob.len() {
            let cut = &blob[..len];
            assert!(
                sock_offsets_in(cut).is_err(),
                "{len} of {} bytes",
                blob.len()
            );
        }
        // The type section cut short by its own header: the record in it is incomplete.
        let mut short = blob.clone();
        let type_len = u32::from_le_bytes(short[12..16].try_into().unwrap());
        short[12..16].copy_from_slice(&(type_len - 5).to_le_bytes());
        let btf = Btf::parse(&short).unwrap();
        assert!(
            btf.stopped().unwrap().contains("truncated"),
            "{:?}",
            btf.stopped()
        );
    }

    #[test]
    fn offsets_past_the_end_are_errors_not_panics() {
        let blob = sample::kernel_like();
        let with = |at: usize, value: u32| {
            let mut b = blob.clone();
            b[at..at + 4].copy_from_slice(&value.to_le_bytes());
            b
        };
        for (at, what) in [(4, "hdr_len"), (8, "type_off"), (12, "type_len")] {
            for value in [u32::MAX, u32::MAX - 3, blob.len() as u32] {
                assert!(
                    sock_offsets_in(&with(at, value)).is_err(),
                    "{what} = {value}"
                );
            }
        }
        let err = sock_offsets_in(&with(4, 8)).unwrap_err();
        assert!(err.contains("shorter than the 24"), "{err}");
        let err = sock_offsets_in(&with(16, u32::MAX)).unwrap_err();
        assert!(err.contains("past the end"), "str_off: {err}");
        // A name offset past the string section is no name, not a panic.
        let mut b = Builder::new();
        b.int("unsigned short", 2);
        let mut blob = b.blob();
        blob[24..28].copy_from_slice(&u32::MAX.to_le_bytes()); // name_off of type 1
        let btf = Btf::parse(&blob).unwrap();
        assert_eq!(btf.name(u32::MAX), "");
        // Member type ids past the last type.
        let mut b = Builder::new();
        b.strukt("sock", 8, &[("sk_protocol", u32::MAX, 0)]);
        let err = sock_offsets_in(&b.blob()).unwrap_err();
        assert!(err.contains("no field __sk_common"), "{err}");
        let btf_blob = b.blob();
        let btf = Btf::parse(&btf_blob).unwrap();
        assert_eq!(btf.field_offset("sock", "sk_protocol"), Ok((0, 0)));
    }

    #[test]
    fn bit_offsets_that_overflow_through_anonymous_members_are_not_found() {
        let mut b = Builder::new();
        let u16_t = b.int("unsigned short", 2);
        let inner = b.strukt("", 2, &[("sk_protocol", u16_t, 0x1fff_ffff)]);
        b.strukt("sock", 8, &[("", inner, 0x1fff_ffff)]);
        let blob = b.blob();
        let btf = Btf::parse(&blob).unwrap();
        let err = btf.field_offset("sock", "sk_protocol").unwrap_err();
        assert!(err.contains("no field sk_protocol"), "{err}");
    }

    #[test]
    fn anonymous_members_nesting_into_themselves_end() {
        // struct sock { struct sock; × 1000 } (anonymous): members^depth without the budget.
        let mut b = Builder::new();
        let members: Vec<(&str, u32, u32)> = (0..1000).map(|_| ("", 1, 0)).collect();
        b.strukt("sock", 8, &members);
        let blob = b.blob();
        let btf = Btf::parse(&blob).unwrap();
        let start = std::time::Instant::now();
        assert!(btf.field_offset("sock", "sk_protocol").is_err());
        assert!(start.elapsed() < std::time::Duration::from_secs(2));
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
        assert!(err.contains("past the end"), "{err}");
        assert!(sock_offsets(Path::new("/nonexistent/vmlinux"))
            .unwrap_err()
            .contains("/nonexistent/vmlinux"));
    }
}
