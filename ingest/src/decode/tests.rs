use super::*;
use stel_emu::{EmuConfig, Emulator, Encoder, HftField, HftTemplate, Pattern};

fn tpl(tid: u16, labels: &[u16], stats: &[u32], width: u8) -> HftTemplate {
    let mut fields = Vec::new();
    for l in labels {
        for s in stats {
            fields.push(HftField {
                label: *l,
                object_type: 1,
                stat_id: *s,
            });
        }
    }
    HftTemplate {
        template_id: tid,
        fields,
        width,
    }
}

fn collect(d: &mut Decoder, buf: &[u8]) -> Vec<CounterBatch> {
    let mut out = Vec::new();
    d.decode(buf, &mut |b: CounterBatch| out.push(b));
    d.flush(&mut |b: CounterBatch| out.push(b));
    out
}

#[test]
fn round_trip_many_snapshots_messages_and_sets() {
    let t = tpl(256, &[1, 2], &[0, 9], 8);
    let mut enc = Encoder::new(7, SeqMode::PerMessage);
    let mut buf = Vec::new();
    enc.template_message(&mut buf, 1, std::slice::from_ref(&t));
    let rows: Vec<Vec<u64>> = (0..10u64)
        .map(|i| vec![i, u64::MAX - i, 1 << 40 | i, 0])
        .collect();
    for chunk in rows.chunks(3) {
        enc.data_message(
            &mut buf,
            1,
            &t,
            chunk.iter().map(|r| (1000 + r[0] * 10, r.as_slice())),
        );
    }
    let mut d = Decoder::new(DecodeConfig::for_test());
    let batches = collect(&mut d, &buf);
    assert_eq!(batches.len(), 1);
    let b = &batches[0];
    assert_eq!(b.rows(), 10);
    for (i, r) in rows.iter().enumerate() {
        assert_eq!(b.row(i), r.as_slice());
        assert_eq!(b.ts[i], 1000 + 10 * i as i64);
    }
    assert_eq!(b.schema.profile, "anonymous-d7-t256");
    assert_eq!(b.schema.group, "PORT");
    assert_eq!(b.schema.columns[1].wide_name(), "unknown_1.IF_OUT_OCTETS");
    let s = d.stats();
    assert_eq!((s.messages, s.records, s.counters), (5, 10, 40));
    assert_eq!(s.malformed_total(), 0);
    assert_eq!(s.seq_lost_messages, 0);
}

#[test]
fn two_sets_in_one_message_and_general_widths() {
    // A template with 1..=8 byte counters exercises the general path.
    let mut fields = Vec::new();
    for w in 1..=8u32 {
        fields.push(HftField {
            label: w as u16,
            object_type: 21,
            stat_id: w,
        });
    }
    let mut t = HftTemplate {
        template_id: 300,
        fields,
        width: 8,
    };
    let mut buf = Vec::new();
    let mut enc = Encoder::new(0, SeqMode::PerMessage);
    enc.template_message(&mut buf, 0, std::slice::from_ref(&t));
    // Hand-build a message: header + data set with two records of mixed widths.
    let mut body = Vec::new();
    let vals: Vec<u64> = (1..=8u32).map(|w| (1u64 << (8 * w - 1)) | 0x5A).collect();
    for ts in [5u64, 6] {
        body.extend_from_slice(&ts.to_be_bytes());
        for (i, v) in vals.iter().enumerate() {
            let w = i + 1;
            body.extend_from_slice(&v.to_be_bytes()[8 - w..]);
        }
    }
    // Patch the template to mixed widths by re-encoding it by hand.
    t.width = 0;
    let mut tmsg = vec![0, 10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0];
    let mut set = vec![0, 2, 0, 0];
    set.extend_from_slice(&300u16.to_be_bytes());
    set.extend_from_slice(&9u16.to_be_bytes());
    set.extend_from_slice(&[0x01, 0x45, 0, 8]); // IE 325, 8 bytes
    for w in 1..=8u16 {
        set.extend_from_slice(&(0x8000 | w).to_be_bytes());
        set.extend_from_slice(&w.to_be_bytes());
        set.extend_from_slice(&(0x0015_0000u32 | w as u32).to_be_bytes());
    }
    let sl = set.len() as u16;
    set[2..4].copy_from_slice(&sl.to_be_bytes());
    tmsg.extend_from_slice(&set);
    let mut dset = vec![1, 44, 0, 0];
    dset.extend_from_slice(&body);
    let dl = dset.len() as u16;
    dset[2..4].copy_from_slice(&dl.to_be_bytes());
    tmsg.extend_from_slice(&dset); // template set and data set in one message
    let ml = tmsg.len() as u16;
    tmsg[2..4].copy_from_slice(&ml.to_be_bytes());
    let mut d = Decoder::new(DecodeConfig::for_test());
    let batches = collect(&mut d, &tmsg);
    assert_eq!(batches.len(), 1);
    let want: Vec<u64> = (1..=8u32).map(|w| (1u64 << (8 * w - 1)) | 0x5A).collect();
    assert_eq!(batches[0].row(0), want.as_slice());
    assert_eq!(batches[0].row(1), want.as_slice());
    assert_eq!(batches[0].schema.group, "QUEUE");
    let _ = buf;
}

#[test]
fn registered_session_names_and_split_group_reassembly() {
    let a = tpl(256, &[1, 2], &[0], 8);
    let b = tpl(257, &[3], &[0, 9], 8);
    let mut cfg = Vec::new();
    Encoder::new(0, SeqMode::PerMessage).template_message(&mut cfg, 0, &[a.clone(), b.clone()]);
    let spec = SessionSpec {
        profile: "prof".into(),
        group: "PORT".into(),
        domain: 0,
        object_names: vec!["Ethernet0".into(), "Ethernet4".into(), "Ethernet8".into()],
        object_ids: vec![1, 2, 3],
    };
    let mut d = Decoder::new(DecodeConfig::for_test());
    let mut out = Vec::new();
    d.register_session(spec, &cfg, &mut |x: CounterBatch| out.push(x))
        .unwrap();
    let mut enc = Encoder::new(0, SeqMode::PerMessage);
    let mut buf = Vec::new();
    for ts in [100u64, 200] {
        enc.data_message(&mut buf, 0, &a, [(ts, &[ts + 1, ts + 2][..])]);
        enc.data_message(&mut buf, 0, &b, [(ts, &[ts + 3, ts + 4][..])]);
    }
    enc.data_message(&mut buf, 0, &b, [(300, &[303, 304][..])]); // part A never comes
    let batches = collect(&mut d, &buf);
    assert_eq!(batches.len(), 1);
    let x = &batches[0];
    assert_eq!(x.schema.profile, "prof");
    let names: Vec<String> = x.schema.columns.iter().map(|c| c.wide_name()).collect();
    assert_eq!(
        names,
        [
            "Ethernet0.IF_IN_OCTETS",
            "Ethernet4.IF_IN_OCTETS",
            "Ethernet8.IF_IN_OCTETS",
            "Ethernet8.IF_OUT_OCTETS"
        ]
    );
    assert_eq!(x.rows(), 3);
    assert_eq!(x.row(0), &[101, 102, 103, 104]);
    assert_eq!(x.row(1), &[201, 202, 203, 204]);
    assert_eq!(&x.row(2)[2..], &[303, 304]);
    assert_eq!(x.missing_samples(), 2);
    assert_eq!(d.stats().missing_samples, 2);
}

#[test]
fn bad_sessions_are_rejected_whole() {
    let mut d = Decoder::new(DecodeConfig::for_test());
    let mut sink = |_: CounterBatch| {};
    let spec = SessionSpec {
        profile: "p".into(),
        group: "PORT".into(),
        domain: 0,
        object_names: vec!["a".into()],
        object_ids: vec![],
    };
    assert!(matches!(
        d.register_session(spec.clone(), &[], &mut sink),
        Err(SessionError::LabelCountMismatch { .. })
    ));
    let spec = SessionSpec {
        object_ids: vec![1],
        ..spec
    };
    assert_eq!(
        d.register_session(spec.clone(), &[], &mut sink),
        Err(SessionError::NoTemplates)
    );
    assert!(matches!(
        d.register_session(spec, &[0, 10, 0, 3], &mut sink),
        Err(SessionError::BadConfig(_))
    ));
}

fn msg(set_id: u16, body: &[u8], declared_set_len: Option<u16>) -> Vec<u8> {
    let mut m = vec![0, 10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    m.extend_from_slice(&set_id.to_be_bytes());
    m.extend_from_slice(
        &declared_set_len
            .unwrap_or(4 + body.len() as u16)
            .to_be_bytes(),
    );
    m.extend_from_slice(body);
    let l = m.len() as u16;
    m[2..4].copy_from_slice(&l.to_be_bytes());
    m
}

#[test]
fn every_malformed_shape_is_counted_never_fatal() {
    let t = tpl(256, &[1], &[0], 8);
    let mut good = Vec::new();
    let mut enc = Encoder::new(0, SeqMode::PerMessage);
    enc.template_message(&mut good, 0, std::slice::from_ref(&t));
    let cases: Vec<(Vec<u8>, Malformed)> = vec![
        (vec![0, 10, 0, 0], Malformed::MessageHeaderTruncated),
        (
            vec![0, 9, 0, 16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            Malformed::BadVersion,
        ),
        (
            vec![0, 10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            Malformed::MessageLengthTooSmall,
        ),
        (
            vec![0, 10, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            Malformed::MessagePastBuffer,
        ),
        (msg(256, &[], Some(2)), Malformed::SetLengthTooSmall),
        (msg(256, &[0; 4], Some(200)), Malformed::SetPastMessage),
        (msg(7, &[0; 4], None), Malformed::ReservedSetId),
        (
            msg(2, &[1, 0, 0, 5, 0x80, 1], None),
            Malformed::TemplateTruncated,
        ),
        (
            msg(2, &[0, 5, 0, 1, 1, 0x45, 0, 8], None),
            Malformed::TemplateBadId,
        ),
        (
            msg(2, &[1, 1, 0, 1, 1, 0x45, 0, 8], None),
            Malformed::TemplateNoCounters,
        ),
        (
            msg(2, &[1, 1, 0, 1, 0x80, 1, 0, 8, 0, 1, 0, 0], None),
            Malformed::TemplateNoTimestamp,
        ),
        (
            msg(
                2,
                &[1, 1, 0, 2, 1, 0x45, 0, 8, 0x80, 1, 0, 9, 0, 1, 0, 0],
                None,
            ),
            Malformed::TemplateFieldLength,
        ),
        (
            msg(
                2,
                &[1, 1, 0, 2, 1, 0x45, 0, 8, 0x80, 1, 0xff, 0xff, 0, 1, 0, 0],
                None,
            ),
            Malformed::TemplateFieldLength,
        ),
        (msg(999, &[0; 16], None), Malformed::UnknownTemplate),
    ];
    for (bytes, want) in cases {
        let mut d = Decoder::new(DecodeConfig::for_test());
        let mut buf = good.clone();
        buf.extend_from_slice(&bytes);
        let _ = collect(&mut d, &buf);
        assert_eq!(d.stats().malformed(want), 1, "{want:?}: {:?}", d.stats());
        assert_eq!(d.stats().malformed_total(), 1, "{want:?}: {:?}", d.stats());
    }
    // Record wider than the set: a data set with 8 bytes for a 16-byte record.
    let mut d = Decoder::new(DecodeConfig::for_test());
    let mut buf = good.clone();
    buf.extend_from_slice(&msg(256, &[0; 8], None));
    let out = collect(&mut d, &buf);
    assert!(out.is_empty());
    assert_eq!(d.stats().malformed(Malformed::RecordWiderThanSet), 1);
}

#[test]
fn template_withdrawal_replacement_and_options() {
    let t1 = tpl(256, &[1], &[0], 8);
    let t2 = tpl(256, &[1, 2], &[0], 8);
    let mut enc = Encoder::new(0, SeqMode::PerMessage);
    let mut buf = Vec::new();
    enc.template_message(&mut buf, 0, std::slice::from_ref(&t1));
    enc.template_message(&mut buf, 0, std::slice::from_ref(&t1)); // refresh, same fields
    enc.data_message(&mut buf, 0, &t1, [(1, &[10][..])]);
    enc.template_message(&mut buf, 0, std::slice::from_ref(&t2)); // replaced
    enc.data_message(&mut buf, 0, &t2, [(2, &[20, 21][..])]);
    // Options template 400 (scope: 1 field) and its data, then a withdrawal of 256.
    let mut opt = vec![1, 144, 0, 2, 0, 1, 0, 149, 0, 4, 0, 41, 0, 8];
    opt.extend_from_slice(&[0, 0]); // padding
    buf.extend_from_slice(&msg(3, &opt, None));
    buf.extend_from_slice(&msg(400, &[0; 24], None));
    buf.extend_from_slice(&msg(2, &[1, 0, 0, 0], None)); // withdraw 256
    enc.data_message(&mut buf, 0, &t2, [(3, &[30, 31][..])]);
    let mut d = Decoder::new(DecodeConfig::for_test());
    let batches = collect(&mut d, &buf);
    assert_eq!(batches.len(), 2, "schemas never mix");
    assert_eq!(batches[0].schema.width(), 1);
    assert_eq!(batches[1].schema.width(), 2);
    assert!(batches[1].schema.generation > batches[0].schema.generation);
    let s = d.stats();
    assert_eq!(s.templates_registered, 1);
    assert_eq!(s.templates_refreshed, 1);
    assert_eq!(s.templates_replaced, 1);
    assert_eq!(s.templates_withdrawn, 1);
    assert_eq!(s.options_templates, 1);
    assert_eq!(s.options_records, 2);
    assert_eq!(
        s.malformed(Malformed::UnknownTemplate),
        1,
        "data after withdrawal"
    );
}

#[test]
fn sequence_gaps_with_wraparound_both_modes() {
    let t = tpl(256, &[1], &[0], 8);
    for mode in [SeqMode::PerMessage, SeqMode::Rfc7011] {
        let mut enc = Encoder::new(0, mode);
        enc.sequence = u32::MAX - 2;
        let mut buf = Vec::new();
        enc.template_message(&mut buf, 0, std::slice::from_ref(&t));
        for i in 0..10u64 {
            let mut m = Vec::new();
            enc.data_message(&mut m, 0, &t, [(i, &[i][..]), (i, &[i][..])]);
            if i != 4 && i != 5 {
                buf.extend_from_slice(&m); // messages 4 and 5 lost, across the wrap
            }
        }
        let cfg = DecodeConfig {
            seq_mode: mode,
            ..DecodeConfig::for_test()
        };
        let mut d = Decoder::new(cfg);
        let _ = collect(&mut d, &buf);
        // The gap is confirmed after 64 more messages, or when the figures are settled.
        d.settle_sequences();
        match mode {
            SeqMode::PerMessage => assert_eq!(d.stats().seq_lost_messages, 2),
            SeqMode::Rfc7011 => assert_eq!(d.stats().seq_lost_records, 4),
        }
        assert_eq!(d.stats().seq_out_of_order, 0);
        // A replayed (older) message counts as out of order, not as 4 billion lost.
        let mut old = Vec::new();
        Encoder {
            sequence: 1,
            ..enc.clone()
        }
        .data_message(&mut old, 0, &t, [(0, &[0][..])]);
        let _ = collect(&mut d, &old);
        assert_eq!(d.stats().seq_out_of_order, 1, "{mode:?}");
    }
}

#[test]
fn timestamp_seconds_plus_fraction() {
    let mut set = vec![
        1, 0, 0, 3, 0x01, 0x42, 0, 4, 0x01, 0x45, 0, 4, 0x80, 1, 0, 8, 0, 1, 0, 0,
    ];
    let _ = &mut set;
    let mut buf = msg(2, &set, None);
    let mut rec = Vec::new();
    rec.extend_from_slice(&1_700_000_000u32.to_be_bytes());
    rec.extend_from_slice(&123u32.to_be_bytes());
    rec.extend_from_slice(&77u64.to_be_bytes());
    buf.extend_from_slice(&msg(256, &rec, None));
    let mut d = Decoder::new(DecodeConfig::for_test());
    let b = collect(&mut d, &buf);
    assert_eq!(b[0].ts[0], 1_700_000_000_000_000_123);
    assert_eq!(b[0].row(0), &[77]);
}

#[test]
fn batches_split_at_capacity_and_buffers_recycle() {
    let t = tpl(256, &[1, 2, 3], &[0], 8);
    let mut enc = Encoder::new(0, SeqMode::PerMessage);
    let mut buf = Vec::new();
    enc.template_message(&mut buf, 0, std::slice::from_ref(&t));
    let rows: Vec<[u64; 3]> = (0..100).map(|i| [i, i, i]).collect();
    enc.data_message(&mut buf, 0, &t, rows.iter().map(|r| (r[0], &r[..])));
    let cfg = DecodeConfig {
        max_batch_rows: 16,
        ..DecodeConfig::for_test()
    };
    let mut d = Decoder::new(cfg);
    let batches = collect(&mut d, &buf);
    assert_eq!(
        batches.iter().map(|b| b.rows()).collect::<Vec<_>>(),
        [16, 16, 16, 16, 16, 16, 4]
    );
    assert_eq!(batches[6].row(3), &[99, 99, 99]);
}

#[test]
fn emulator_counters_are_consistent_and_decode_exactly() {
    for pattern in [Pattern::Steady, Pattern::Ramp, Pattern::Microburst] {
        let mut cfg = EmuConfig::design();
        cfg.ports = 8;
        cfg.pattern = pattern;
        cfg.ramp_ns = 1_000_000;
        let mut emu = Emulator::new(cfg).unwrap();
        let mut d = Decoder::new(DecodeConfig::default());
        let mut sink = |_: CounterBatch| {};
        d.register_session(emu.session_spec(), &emu.session_config(), &mut sink)
            .unwrap();
        let mut buf = Vec::new();
        for _ in 0..200 {
            emu.data_message(&mut buf);
        }
        let batches = collect(&mut d, &buf);
        let rows: usize = batches.iter().map(|b| b.rows()).sum();
        assert_eq!(rows as u64, emu.truth.records);
        assert_eq!(d.stats().counters, emu.truth.samples);
        assert_eq!(d.stats().messages, emu.truth.messages);
        assert_eq!(d.stats().seq_lost_messages, 0);
        let b = &batches[0];
        let col = |name: &str| {
            b.schema
                .columns
                .iter()
                .position(|c| c.wide_name() == name)
                .unwrap()
        };
        let (oct, pkt, occ, disc) = (
            col("Ethernet0.IF_IN_OCTETS"),
            col("Ethernet0.IF_IN_UCAST_PKTS"),
            col("Ethernet0.IN_CURR_OCCUPANCY_BYTES"),
            col("Ethernet0.IF_IN_DISCARDS"),
        );
        let mut peak_occ = 0;
        for r in 1..b.rows() {
            assert!(
                b.row(r)[oct] >= b.row(r - 1)[oct],
                "{pattern:?} octets never decrease"
            );
            assert_eq!(b.row(r)[oct], b.row(r)[pkt] * 800);
            assert!(b.row(r)[disc] >= b.row(r - 1)[disc]);
            peak_occ = peak_occ.max(b.row(r)[occ]);
            assert_eq!(b.ts[r] - b.ts[r - 1], 10_000);
        }
        if pattern == Pattern::Microburst {
            assert!(peak_occ > 0, "bursts build a queue");
        }
    }
}

/// Messages of `enc` carrying one record each, for sequence tests.
fn seq_messages(enc: &mut Encoder, t: &HftTemplate, n: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| {
            let mut m = Vec::new();
            enc.data_message(&mut m, 0, t, [(i as u64, &[i as u64][..])]);
            m
        })
        .collect()
}

/// A decoder that knows template 256 of domain 7 (announced by an exporter of its own, in a
/// separate decoder call, so it is not part of the streams under test).
fn seq_decoder() -> (Decoder, HftTemplate) {
    let t = tpl(256, &[1], &[0], 8);
    let mut d = Decoder::new(DecodeConfig::for_test());
    let mut tm = Vec::new();
    Encoder::new(7, SeqMode::PerMessage).template_message(&mut tm, 0, std::slice::from_ref(&t));
    let _ = collect(&mut d, &tm);
    d.reset_sequences();
    (d, t)
}

/// Two exporters numbering their own messages in one observation domain: two sequence
/// streams, reported as such, and the jumps between them are never lost messages — whether
/// their numbers are far apart (beyond the window) or close (within it), interleaved in bursts.
/// A message really missing from one of them is still counted, exactly.
#[test]
fn two_exporters_in_one_domain_are_two_streams_not_loss() {
    for b_start in [3_000_000_000u32, 400_000, 1_000] {
        let (mut d, t) = seq_decoder();
        let mut a = Encoder::new(7, SeqMode::PerMessage);
        a.sequence = 10;
        let mut b = Encoder::new(7, SeqMode::PerMessage);
        b.sequence = b_start;
        // One of A's messages is lost.
        let mut ma = seq_messages(&mut a, &t, 3000)
            .into_iter()
            .enumerate()
            .filter(|(i, _)| *i != 1500)
            .map(|(_, m)| m);
        let mut mb = seq_messages(&mut b, &t, 3000).into_iter();
        let mut buf = Vec::new();
        let mut x = 12345u32;
        loop {
            // Bursts of 1..=5 messages from each in turn.
            x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
            let (mut n_a, mut n_b) = (1 + (x >> 16) % 5, 1 + (x >> 8) % 5);
            let mut any = false;
            while n_a > 0 {
                if let Some(m) = ma.next() {
                    buf.extend_from_slice(&m);
                    any = true;
                }
                n_a -= 1;
            }
            while n_b > 0 {
                if let Some(m) = mb.next() {
                    buf.extend_from_slice(&m);
                    any = true;
                }
                n_b -= 1;
            }
            if !any {
                break;
            }
        }
        let _ = collect(&mut d, &buf);
        d.settle_sequences();
        let s = d.stats();
        assert_eq!(s.seq_lost_messages, 1, "b starts at {b_start}: {s:?}");
        assert_eq!(s.seq_gap_events, 1, "b starts at {b_start}");
        assert_eq!(s.seq_concurrent_domains, 1, "b starts at {b_start}");
        let dom = s.domains.iter().find(|x| x.domain == 7).unwrap();
        assert_eq!(dom.max_streams, 2);
        assert_eq!(dom.lost_messages, 1);
        assert_eq!(dom.messages, 6000, "with the template's message");
    }
}

/// A jump beyond the window either way (an exporter restart, a corrupt or hostile number) is a
/// reset, not loss; a late message does not rewind the stream and fills its gap.
#[test]
fn absurd_jumps_are_resets_and_late_messages_fill_their_gap() {
    let (mut d, t) = seq_decoder();
    let mut e = Encoder::new(7, SeqMode::PerMessage);
    e.sequence = 5_000_000;
    let ms = seq_messages(&mut e, &t, 10); // 5,000,000..=5,000,009
    let mut buf = Vec::new();
    for i in [0, 1, 2, 4, 3, 5, 6, 7, 8, 9] {
        buf.extend_from_slice(&ms[i]); // the 4th arrives after the 5th
    }
    // An exporter restart: numbering from 0 again; then a garbage number far ahead.
    let mut r = Encoder::new(7, SeqMode::PerMessage);
    for m in seq_messages(&mut r, &t, 5) {
        buf.extend_from_slice(&m);
    }
    let mut g = Encoder::new(7, SeqMode::PerMessage);
    g.sequence = 2_000_000_000;
    for m in seq_messages(&mut g, &t, 1) {
        buf.extend_from_slice(&m);
    }
    let _ = collect(&mut d, &buf);
    d.settle_sequences();
    let s = d.stats();
    assert_eq!((s.seq_lost_messages, s.seq_gap_events), (0, 0), "{s:?}");
    assert_eq!(s.seq_out_of_order, 1);
    assert_eq!(s.seq_resets, 2);
    assert_eq!(s.seq_concurrent_domains, 0);
}

/// In-band templates are bounded per domain and per decoder: the one whose data came longest ago
/// is evicted (counted), a template in use survives, and registered sessions never count.
#[test]
fn in_band_templates_are_bounded_least_recently_used_first() {
    let cfg = DecodeConfig {
        max_templates: 6,
        max_templates_per_domain: 4,
        ..DecodeConfig::for_test()
    };
    let mut d = Decoder::new(cfg);
    let mut buf = Vec::new();
    let mut e = Encoder::new(1, SeqMode::PerMessage);
    let data = |e: &mut Encoder, tid: u16, buf: &mut Vec<u8>| {
        let t = tpl(tid, &[1], &[0], 8);
        e.data_message(buf, 0, &t, [(1u64, &[1u64][..])]);
    };
    for tid in 256..260 {
        e.template_message(&mut buf, 0, &[tpl(tid, &[1], &[0], 8)]);
    }
    data(&mut e, 256, &mut buf); // 256 is in use: 257 is the oldest unused
    e.template_message(&mut buf, 0, &[tpl(260, &[1], &[0], 8)]);
    let _ = collect(&mut d, &buf);
    assert_eq!(d.stats().templates_evicted, 1);
    // 257 is gone (its data is unknown); 256 and 260 decode.
    let mut buf = Vec::new();
    for tid in [256, 257, 260] {
        data(&mut e, tid, &mut buf);
    }
    let rows: usize = collect(&mut d, &buf).iter().map(|b| b.rows()).sum();
    assert_eq!(rows, 2);
    assert_eq!(d.stats().malformed(Malformed::UnknownTemplate), 1);
    // Another domain: 4 more take the decoder to its bound of 6; the oldest go.
    let mut e2 = Encoder::new(2, SeqMode::PerMessage);
    let mut buf = Vec::new();
    for tid in 300..304 {
        e2.template_message(&mut buf, 0, &[tpl(tid, &[1], &[0], 8)]);
    }
    let _ = collect(&mut d, &buf);
    assert_eq!(d.stats().templates_evicted, 1 + 2);
}

/// Batch buffers stay within `max_batch_memory_bytes`: the session whose data came longest ago
/// flushes and frees its buffer, and decoding goes on exactly.
#[test]
fn batch_buffers_stay_within_their_budget() {
    let width = 64;
    let rows = 16;
    let cfg = DecodeConfig {
        max_batch_rows: rows,
        // Room for two sessions' buffers (and their spares), not three.
        max_batch_memory_bytes: 2 * 2 * rows * (8 * width + 12) + 1,
        ..DecodeConfig::for_test()
    };
    let mut d = Decoder::new(cfg);
    let labels: Vec<u16> = (1..=width as u16).collect();
    let mut e = Encoder::new(1, SeqMode::PerMessage);
    let mut buf = Vec::new();
    let values = vec![5u64; width];
    for round in 0..3 {
        for tid in 256..259u16 {
            let t = tpl(tid, &labels, &[0], 8);
            if round == 0 {
                e.template_message(&mut buf, 0, std::slice::from_ref(&t));
            }
            e.data_message(&mut buf, 0, &t, [(round as u64, &values[..])]);
        }
    }
    let got: usize = collect(&mut d, &buf).iter().map(|b| b.rows()).sum();
    assert_eq!(got, 9, "every record decoded");
    assert!(d.stats().batch_buffers_evicted >= 2, "{:?}", d.stats());
}

/// More domains than a decoder tracks: the one idle longest makes room (counted); the figures
/// list stays bounded.
#[test]
fn sequence_domains_are_bounded() {
    let t = tpl(256, &[1], &[0], 8);
    let mut d = Decoder::new(DecodeConfig::for_test());
    let n = crate::decode::MAX_TRACKED_DOMAINS + 76;
    let mut buf = Vec::new();
    for dom in 0..n as u32 {
        let mut e = Encoder::new(dom, SeqMode::PerMessage);
        e.data_message(&mut buf, 0, &t, [(1u64, &[1u64][..])]);
    }
    let _ = collect(&mut d, &buf);
    assert_eq!(d.stats().seq_evicted_domains, 76);
    assert_eq!(d.stats().domains.len(), crate::decode::MAX_TRACKED_DOMAINS);
}
