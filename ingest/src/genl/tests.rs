use std::path::Path;

use super::*;

/// Appends an attribute (padded to 4) the way the kernel's nla_put does.
fn attr(out: &mut Vec<u8>, ty: u16, payload: &[u8]) {
    out.extend_from_slice(&((4 + payload.len()) as u16).to_ne_bytes());
    out.extend_from_slice(&ty.to_ne_bytes());
    out.extend_from_slice(payload);
    while !out.len().is_multiple_of(4) {
        out.push(0);
    }
}

fn cstr(s: &str) -> Vec<u8> {
    let mut v = s.as_bytes().to_vec();
    v.push(0);
    v
}

/// A nlctrl message laid out like ctrl_fill_info / ctrl_fill_mcgrp_info (name, id, then the
/// nested groups, each nest typed by its 1-based index; NLA_F_NESTED is not set by the kernel's
/// nla_nest_start_noflag, we set it on one to check it is masked).
fn ctrl_msg(cmd: u8, seq: u32, name: &str, id: u16, groups: &[(&str, u32)]) -> Vec<u8> {
    let mut body = vec![cmd, 2, 0, 0];
    attr(&mut body, CTRL_ATTR_FAMILY_NAME, &cstr(name));
    attr(&mut body, CTRL_ATTR_FAMILY_ID, &id.to_ne_bytes());
    attr(&mut body, 3, &1u32.to_ne_bytes()); // CTRL_ATTR_VERSION, ignored
    if !groups.is_empty() {
        let mut list = Vec::new();
        for (i, (g, gid)) in groups.iter().enumerate() {
            let mut one = Vec::new();
            attr(&mut one, CTRL_ATTR_MCAST_GRP_ID, &gid.to_ne_bytes());
            attr(&mut one, CTRL_ATTR_MCAST_GRP_NAME, &cstr(g));
            attr(&mut list, (i + 1) as u16 | 1 << 15, &one);
        }
        attr(&mut body, CTRL_ATTR_MCAST_GROUPS, &list);
    }
    nl(GENL_ID_CTRL, seq, &body)
}

fn nl(ty: u16, seq: u32, body: &[u8]) -> Vec<u8> {
    let mut m = Vec::new();
    m.extend_from_slice(&((16 + body.len()) as u32).to_ne_bytes());
    m.extend_from_slice(&ty.to_ne_bytes());
    m.extend_from_slice(&0u16.to_ne_bytes());
    m.extend_from_slice(&seq.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes());
    m.extend_from_slice(body);
    m
}

fn all(d: &[u8]) -> Vec<Result<Message, ParseError>> {
    parse_datagram(d).collect()
}

#[test]
fn getfamily_request_layout() {
    let r = getfamily_request("sonic_stel", 7).unwrap();
    // 16 nlmsghdr + 4 genl + 4 nla hdr + "sonic_stel\0" (11) padded to 12.
    assert_eq!(r.len(), 36);
    assert_eq!(u32::from_ne_bytes(r[0..4].try_into().unwrap()), 36);
    assert_eq!(u16::from_ne_bytes([r[4], r[5]]), GENL_ID_CTRL);
    assert_eq!(u16::from_ne_bytes([r[6], r[7]]), NLM_F_REQUEST);
    assert_eq!(u32::from_ne_bytes(r[8..12].try_into().unwrap()), 7);
    assert_eq!(r[16], CTRL_CMD_GETFAMILY);
    assert_eq!(u16::from_ne_bytes([r[20], r[21]]), 15);
    assert_eq!(u16::from_ne_bytes([r[22], r[23]]), CTRL_ATTR_FAMILY_NAME);
    assert_eq!(&r[24..35], b"sonic_stel\0");
    assert_eq!(r[35], 0);
    assert!(getfamily_request("", 1).is_err());
    assert!(getfamily_request("a_name_of_16_byt", 1).is_err());
    assert!(getfamily_request("fifteen_bytes_x", 1).is_ok());
    assert!(getfamily_request("nul\0", 1).is_err());
}

#[test]
fn new_family_with_groups() {
    let d = ctrl_msg(
        CTRL_CMD_NEWFAMILY,
        3,
        "sonic_stel",
        0x1a,
        &[("ipfix", 5), ("other", 6)],
    );
    let info = FamilyInfo {
        id: 0x1a,
        name: "sonic_stel".into(),
        groups: vec![("ipfix".into(), 5), ("other".into(), 6)],
    };
    assert_eq!(info.group_id("other"), Some(6));
    assert_eq!(info.group_id("nope"), None);
    assert_eq!(
        all(&d),
        vec![Ok(Message::Ctrl {
            seq: 3,
            event: CtrlEvent::NewFamily(info)
        })]
    );
}

#[test]
fn del_family_and_group_events() {
    let mut d = ctrl_msg(
        CTRL_CMD_DELMCAST_GRP,
        0,
        "sonic_stel",
        0x1a,
        &[("ipfix", 5)],
    );
    d.extend(ctrl_msg(
        CTRL_CMD_DELFAMILY,
        0,
        "sonic_stel",
        0x1a,
        &[("ipfix", 5)],
    ));
    d.extend(ctrl_msg(CTRL_CMD_NEWMCAST_GRP, 0, "x", 1, &[("g", 9)]));
    let got: Vec<_> = all(&d).into_iter().map(Result::unwrap).collect();
    assert_eq!(
        got,
        vec![
            Message::Ctrl {
                seq: 0,
                event: CtrlEvent::DelGroup {
                    family: "sonic_stel".into(),
                    family_id: 0x1a,
                    group: "ipfix".into(),
                    group_id: 5
                }
            },
            Message::Ctrl {
                seq: 0,
                event: CtrlEvent::DelFamily {
                    name: "sonic_stel".into(),
                    id: 0x1a
                }
            },
            Message::Ctrl {
                seq: 0,
                event: CtrlEvent::NewGroup {
                    family: "x".into(),
                    family_id: 1,
                    group: "g".into(),
                    group_id: 9
                }
            },
        ]
    );
}

#[test]
fn error_done_and_other() {
    let mut d = nl(NLMSG_ERROR, 4, &(-libc::ENOENT).to_ne_bytes());
    d.extend(nl(NLMSG_DONE, 5, &0i32.to_ne_bytes()));
    d.extend(nl(0x20, 6, b"abcd"));
    d.extend(ctrl_msg(4, 7, "f", 1, &[])); // CTRL_CMD_NEWOPS: not ours
    d.extend(nl(NLMSG_ERROR, 8, &i32::MIN.to_ne_bytes())); // never panics on negation
    let got: Vec<_> = all(&d).into_iter().map(Result::unwrap).collect();
    assert_eq!(
        got,
        vec![
            Message::Error {
                seq: 4,
                errno: libc::ENOENT
            },
            Message::Done { seq: 5 },
            Message::Other { ty: 0x20, seq: 6 },
            Message::Other {
                ty: GENL_ID_CTRL,
                seq: 7
            },
            Message::Error {
                seq: 8,
                errno: i32::MIN
            },
        ]
    );
    assert!(matches!(
        all(&nl(NLMSG_ERROR, 1, &[0, 0]))[..],
        [Err(ParseError::Short { .. })]
    ));
}

#[test]
fn bad_message_lengths_stop_without_looping() {
    // Length 0, length < 16, length past the end, a short trailing header.
    for len in [0u32, 15, 1000] {
        let mut d = nl(0x20, 1, b"");
        d[0..4].copy_from_slice(&len.to_ne_bytes());
        assert!(matches!(
            all(&d)[..],
            [Err(ParseError::MessageLength { .. })]
        ));
    }
    let mut d = nl(0x20, 1, b"");
    d.extend_from_slice(&[1, 2, 3]);
    let got = all(&d);
    assert_eq!(got.len(), 2);
    assert!(matches!(got[1], Err(ParseError::Short { .. })));
    assert!(all(&[]).is_empty());
}

#[test]
fn malformed_attributes_are_errors_not_panics() {
    let good = ctrl_msg(CTRL_CMD_NEWFAMILY, 1, "sonic_stel", 0x1a, &[("ipfix", 5)]);
    // Every truncation of the message (with nlmsg_len fixed up) parses to one Ok or Err, never
    // to the complete event: a cut at an attribute boundary may still be a valid, smaller
    // message, a cut inside one is an error.
    let full = all(&good);
    assert!(matches!(full[..], [Ok(Message::Ctrl { .. })]));
    let mut errors = 0;
    for cut in 16..good.len() {
        let mut d = good[..cut].to_vec();
        d[0..4].copy_from_slice(&(cut as u32).to_ne_bytes());
        let r = all(&d);
        assert_eq!(r.len(), 1, "cut {cut}");
        assert_ne!(r[0], full[0], "cut {cut} parsed as complete");
        errors += r[0].is_err() as usize;
    }
    assert!(
        errors > good.len() / 2,
        "most cuts land inside an attribute: {errors}"
    );
    // Attribute length 0 and 3 (< header) and past the end, at top level and nested.
    for bad_len in [0u16, 3, 200] {
        let mut body = vec![CTRL_CMD_NEWFAMILY, 2, 0, 0];
        body.extend_from_slice(&bad_len.to_ne_bytes());
        body.extend_from_slice(&CTRL_ATTR_FAMILY_ID.to_ne_bytes());
        body.extend_from_slice(&[0; 4]);
        assert!(matches!(
            parse_ctrl(&body),
            Err(ParseError::AttrLength { .. })
        ));
    }
    let mut body = vec![CTRL_CMD_NEWFAMILY, 2, 0, 0];
    attr(&mut body, CTRL_ATTR_FAMILY_NAME, &cstr("f"));
    attr(&mut body, CTRL_ATTR_FAMILY_ID, &1u16.to_ne_bytes());
    let mut list = Vec::new();
    list.extend_from_slice(&0u16.to_ne_bytes());
    list.extend_from_slice(&1u16.to_ne_bytes());
    attr(&mut body, CTRL_ATTR_MCAST_GROUPS, &list);
    assert!(matches!(
        parse_ctrl(&body),
        Err(ParseError::AttrLength { len: 0, .. })
    ));
    // Short integer payloads.
    let mut body = vec![CTRL_CMD_NEWFAMILY, 2, 0, 0];
    attr(&mut body, CTRL_ATTR_FAMILY_ID, &[1]);
    assert!(matches!(
        parse_ctrl(&body),
        Err(ParseError::Short { need: 2, .. })
    ));
    // Group without an ID; family without a name; not UTF-8.
    let mut body = vec![CTRL_CMD_NEWFAMILY, 2, 0, 0];
    attr(&mut body, CTRL_ATTR_FAMILY_NAME, &cstr("f"));
    attr(&mut body, CTRL_ATTR_FAMILY_ID, &1u16.to_ne_bytes());
    let mut one = Vec::new();
    attr(&mut one, CTRL_ATTR_MCAST_GRP_NAME, &cstr("g"));
    let mut list = Vec::new();
    attr(&mut list, 1, &one);
    attr(&mut body, CTRL_ATTR_MCAST_GROUPS, &list);
    assert_eq!(
        parse_ctrl(&body),
        Err(ParseError::Missing("CTRL_ATTR_MCAST_GRP_ID"))
    );
    let mut body = vec![CTRL_CMD_DELFAMILY, 2, 0, 0];
    attr(&mut body, CTRL_ATTR_FAMILY_ID, &1u16.to_ne_bytes());
    assert_eq!(
        parse_ctrl(&body),
        Err(ParseError::Missing("CTRL_ATTR_FAMILY_NAME"))
    );
    let mut body = vec![CTRL_CMD_DELFAMILY, 2, 0, 0];
    attr(&mut body, CTRL_ATTR_FAMILY_ID, &1u16.to_ne_bytes());
    attr(&mut body, CTRL_ATTR_FAMILY_NAME, &[0xff, 0xfe, 0]);
    assert_eq!(
        parse_ctrl(&body),
        Err(ParseError::NotUtf8("CTRL_ATTR_FAMILY_NAME"))
    );
    // NEWMCAST_GRP without its group.
    let d = ctrl_msg(CTRL_CMD_NEWMCAST_GRP, 0, "f", 1, &[]);
    assert!(matches!(all(&d)[..], [Err(ParseError::Missing(_))]));
    // Short genlmsghdr.
    assert!(matches!(parse_ctrl(&[1, 2]), Err(ParseError::Short { .. })));
}

#[test]
fn exhaustive_byte_flips_never_panic() {
    let good = ctrl_msg(
        CTRL_CMD_NEWFAMILY,
        1,
        "sonic_stel",
        0x1a,
        &[("ipfix", 5), ("b", 6)],
    );
    for i in 0..good.len() {
        for v in [0u8, 1, 3, 4, 0x7f, 0x80, 0xff] {
            let mut d = good.clone();
            d[i] = v;
            for m in parse_datagram(&d) {
                let _ = m;
            }
        }
    }
}

const P: &str = "/etc/sonic/constants.yml";

fn yml(text: &str) -> Result<GenlConfig, ConstantsError> {
    GenlConfig::from_constants_str(text, Path::new(P))
}

fn g(family: &str, group: &str) -> GenlConfig {
    GenlConfig {
        family: family.into(),
        group: group.into(),
    }
}

fn parse_err(r: Result<GenlConfig, ConstantsError>) -> (usize, String) {
    match r {
        Err(ConstantsError::Parse { line, msg, path }) => {
            assert_eq!(path, Path::new(P));
            (line, msg)
        }
        other => panic!("expected a parse error, got {other:?}"),
    }
}

#[test]
fn constants_countersyncd_test_file() {
    // sonic-swss crates/countersyncd/tests/data/constants.yml
    let t = "constants:\n    high_frequency_telemetry:\n        genl_family: \"test_family\"\n        genl_multicast_group: \"test_group\"\n";
    assert_eq!(yml(t).unwrap(), g("test_family", "test_group"));
}

#[test]
fn constants_shipped_example_parses() {
    let t = include_str!("../../../deploy/constants.yml");
    assert_eq!(yml(t).unwrap(), g("sonic_stel", "ipfix"));
    // The same file with the HFT section renamed to the original HLD's still resolves.
    let legacy = t.replace("high_frequency_telemetry:", "stream_telemetry:");
    assert_eq!(yml(&legacy).unwrap(), g("sonic_stel", "ipfix"));
}

#[test]
fn constants_real_sonic_shape_with_unrelated_keys() {
    let t = r#"# managed by sonic-buildimage
---
constants:
  deployment_id_asn_map:
    "1" : 65432
    "2" : 65433
  bgp:
    traffic_shift_community: 12345:12345
    families:
      - ipv4
      - ipv6
    allow_list:
      default_action: "permit"   # or "deny"
      drop_community: 5060:12345  # value: with a colon
      default_pl_rules:
        v4:
          - "deny 0.0.0.0/0 le 17"
          - genl_family: not_this_one
    peers:
      general: # peer_type
        db_table: "BGP_NEIGHBOR"
    motd: |
      genl_family: not_this_either
        high_frequency_telemetry:
    inline: {genl_family: nope, x: [1,
       2]}
    multi: plain text that
      continues here: yes
  stream_telemetry:
    genl_family: 'old''s'   # original HLD
    genl_multicast_group: old_group
  high_frequency_telemetry:   # wins over stream_telemetry
    genl_family: "hft_fam" # comment
    # genl_multicast_group: commented_out
  other: x
"#;
    // Family from HFT; group falls back to stream_telemetry on its own.
    assert_eq!(yml(t).unwrap(), g("hft_fam", "old_group"));
}

#[test]
fn constants_defaults_and_nulls() {
    assert_eq!(yml("").unwrap(), GenlConfig::default());
    assert_eq!(
        yml("constants:\n  bgp: {}\n").unwrap(),
        GenlConfig::default()
    );
    let t =
        "constants:\n  high_frequency_telemetry:\n    genl_family: ~\n    genl_multicast_group:\n";
    assert_eq!(yml(t).unwrap(), g(DEFAULT_FAMILY, DEFAULT_GROUP));
    // Same key at the wrong depth is not ours.
    let t = "high_frequency_telemetry:\n  genl_family: top\nconstants:\n  x:\n    high_frequency_telemetry:\n      genl_family: deep\n";
    assert_eq!(yml(t).unwrap(), GenlConfig::default());
    // Windows line endings, BOM, a document end marker.
    let t = "\u{feff}constants:\r\n  high_frequency_telemetry:\r\n    genl_family: crlf\r\n...\nconstants: broken [\n";
    assert_eq!(yml(t).unwrap(), g("crlf", DEFAULT_GROUP));
}

#[test]
fn constants_errors_name_the_line() {
    let (line, msg) = parse_err(yml(
        "constants:\n  high_frequency_telemetry:\n    genl_family: \"unterminated\n",
    ));
    assert_eq!(line, 3);
    assert!(msg.contains("unterminated"), "{msg}");
    let (line, msg) = parse_err(yml(
        "constants:\n  high_frequency_telemetry:\n    genl_family: much_too_long_family_name\n",
    ));
    assert_eq!(line, 3);
    assert!(
        msg.contains("constants.high_frequency_telemetry.genl_family") && msg.contains("15"),
        "{msg}"
    );
    let (line, _) = parse_err(yml(
        "constants:\n  high_frequency_telemetry:\n    genl_family: ''\n",
    ));
    assert_eq!(line, 3);
    let (line, msg) = parse_err(yml("constants:\n\thigh_frequency_telemetry:\n"));
    assert_eq!((line, msg.as_str()), (2, "tab in indentation"));
    let (line, msg) = parse_err(yml(
        "constants:\n  high_frequency_telemetry: {genl_family: x}\n",
    ));
    assert_eq!(line, 2);
    assert!(msg.contains("flow"), "{msg}");
    let (line, _) = parse_err(yml(
        "constants:\n  high_frequency_telemetry:\n    genl_family: *alias\n",
    ));
    assert_eq!(line, 3);
    let (line, _) = parse_err(yml(
        "constants:\n  high_frequency_telemetry:\n    genl_family: |\n      x\n",
    ));
    assert_eq!(line, 3);
    let (line, msg) = parse_err(yml(
        "constants:\n  high_frequency_telemetry:\n    genl_family: two\n      lines\n",
    ));
    assert_eq!(line, 4);
    assert!(msg.contains("multi-line"), "{msg}");
    let (line, msg) = parse_err(yml("constants:\n  high_frequency_telemetry: oops\n"));
    assert_eq!(line, 2);
    assert!(msg.contains("must be a mapping"), "{msg}");
    let (line, _) = parse_err(yml(
        "constants:\n  high_frequency_telemetry:\n    genl_family: \"bad \\q escape\"\n",
    ));
    assert_eq!(line, 3);
}

#[test]
fn constants_file_missing_gives_defaults_unreadable_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("constants.yml");
    assert_eq!(
        GenlConfig::from_constants_file(&missing).unwrap(),
        GenlConfig::default()
    );
    std::fs::write(&missing, b"constants:\n  x: \xff\n").unwrap();
    match GenlConfig::from_constants_file(&missing) {
        Err(e @ ConstantsError::Parse { line: 2, .. }) => {
            assert!(e.to_string().starts_with(&missing.display().to_string()))
        }
        other => panic!("{other:?}"),
    }
    // A directory where the file should be: present but unreadable.
    let d = dir.path().join("d.yml");
    std::fs::create_dir(&d).unwrap();
    assert!(matches!(
        GenlConfig::from_constants_file(&d),
        Err(ConstantsError::Read { .. })
    ));
}
