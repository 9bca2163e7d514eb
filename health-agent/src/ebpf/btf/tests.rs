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
    let BtfError::Missing { what, stopped } = &err else {
        panic!("{err:?}")
    };
    assert_eq!(what, "struct sock is not in the kernel's BTF");
    let stopped = stopped.as_deref().unwrap_or_default();
    assert!(stopped.contains("unknown BTF kind 20 at type 1"), "{err}");
    assert!(stopped.contains("no layout section"), "{err}");
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
    let BtfError::Missing { what, stopped } = &err else {
        panic!("{err:?}")
    };
    assert_eq!(what, "the type of sock.sk_protocol was not read");
    assert!(
        stopped
            .as_deref()
            .unwrap_or_default()
            .contains("unknown BTF kind 30"),
        "{err}"
    );
}

#[test]
fn an_unknown_kind_is_skipped_by_the_layout_section() {
    let blob = sample::future_kind(true);
    let btf = Btf::parse(&blob).unwrap();
    assert_eq!(btf.stopped(), None);
    assert_eq!(sock_offsets_in(&blob), Ok(expected()));
    let err = sock_offsets_in(&sample::future_kind(false)).unwrap_err();
    assert!(
        matches!(&err, BtfError::Missing { stopped: Some(s), .. } if s.contains("unknown BTF kind 25 at type 1")),
        "{err}"
    );
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
    assert_eq!(sock_offsets_in(&with(4, 8)), Err(BtfError::ShortHeader(8)));
    assert_eq!(
        sock_offsets_in(&with(16, u32::MAX)),
        Err(BtfError::SectionPastEnd),
        "str_off"
    );
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
    assert!(
        matches!(&err, BtfError::Missing { what, .. } if what == "struct sock has no field __sk_common"),
        "{err}"
    );
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
    assert!(
        matches!(&err, BtfError::Missing { what, .. } if what == "struct sock has no field sk_protocol"),
        "{err}"
    );
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
    assert_eq!(err, BtfError::SectionPastEnd);
    assert!(matches!(
        sock_offsets(Path::new("/nonexistent/vmlinux")),
        Err(BtfError::Read { path, .. }) if path == "/nonexistent/vmlinux"
    ));
}
