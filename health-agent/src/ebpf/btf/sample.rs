//! Hand-built BTF blobs for tests and fuzz seeds: a few types shaped like the kernel's.

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
