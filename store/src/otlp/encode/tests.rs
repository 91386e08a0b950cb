//! The encoder against its own reader. The integration tests (`store/tests/otlp.rs`) check the
//! same bytes with the OpenTelemetry protobuf definitions through a real receiver.
use super::*;
use crate::{sai::ObjectType, schema::CounterColumn};

fn key(t: ObjectType, s: &str) -> StatKey {
    StatKey {
        object_type: t as u32,
        stat_id: t.stat_by_name(s).unwrap().id,
    }
}

fn schema(stats: &[&str], objects: &[&str]) -> Arc<SessionSchema> {
    let mut columns = Vec::new();
    for (i, o) in objects.iter().enumerate() {
        for s in stats {
            columns.push(CounterColumn {
                label: i as u16 + 1,
                object: o.to_string(),
                key: key(ObjectType::Port, s),
            });
        }
    }
    Arc::new(SessionSchema::one_template(
        "prof".into(),
        "PORT".into(),
        columns,
    ))
}

fn batch(schema: &Arc<SessionSchema>, ts: &[i64], f: impl Fn(usize, usize) -> u64) -> CounterBatch {
    let w = schema.width();
    let mut values = Vec::new();
    for r in 0..ts.len() {
        for c in 0..w {
            values.push(f(r, c));
        }
    }
    CounterBatch {
        schema: Arc::clone(schema),
        ts: ts.to_vec(),
        values,
        part_masks: Vec::new(),
    }
}

/// A decoded data point: metric name, sum?, attributes, start, time, value.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Dp {
    metric: String,
    sum: bool,
    monotonic_cumulative: bool,
    attrs: Vec<(String, String)>,
    start: u64,
    time: u64,
    value: u64,
}

fn fields(b: &[u8]) -> Vec<(u32, wire::Value<'_>)> {
    let mut r = wire::Reader { b };
    let mut out = Vec::new();
    while let Some(f) = r.field() {
        out.push(f.expect("well-formed"));
    }
    out
}

fn len<'a>(v: &wire::Value<'a>) -> &'a [u8] {
    match v {
        wire::Value::Len(b) => b,
        other => panic!("expected a length-delimited field, got {other:?}"),
    }
}

fn string(v: &wire::Value<'_>) -> String {
    String::from_utf8(len(v).to_vec()).unwrap()
}

/// Decodes a request into points (checking the envelope on the way).
fn decode(req: &[u8]) -> (Vec<Dp>, Vec<(String, String)>) {
    let mut points = Vec::new();
    let mut resource = Vec::new();
    for (f, rm) in fields(req) {
        assert_eq!(f, 1);
        for (f, v) in fields(len(&rm)) {
            match f {
                1 => {
                    for (_, kv) in fields(len(&v)) {
                        let kv = fields(len(&kv));
                        let any = fields(len(&kv[1].1));
                        resource.push((string(&kv[0].1), string(&any[0].1)));
                    }
                }
                2 => {
                    for (f, v) in fields(len(&v)) {
                        if f == 1 {
                            let scope = fields(len(&v));
                            assert_eq!(string(&scope[0].1), "stel");
                            continue;
                        }
                        let mut name = String::new();
                        for (f, v) in fields(len(&v)) {
                            match f {
                                1 => name = string(&v),
                                5 | 7 => {
                                    let data = fields(len(&v));
                                    let mc = f == 7
                                        && data.contains(&(2, wire::Value::Varint(2)))
                                        && data.contains(&(3, wire::Value::Varint(1)));
                                    for (f, dp) in &data {
                                        if *f != 1 {
                                            continue;
                                        }
                                        let mut d = Dp {
                                            metric: name.clone(),
                                            sum: mc,
                                            monotonic_cumulative: mc,
                                            attrs: Vec::new(),
                                            start: 0,
                                            time: 0,
                                            value: 0,
                                        };
                                        for (f, v) in fields(len(dp)) {
                                            match (f, v) {
                                                (7, v) => {
                                                    let kv = fields(len(&v));
                                                    let any = fields(len(&kv[1].1));
                                                    d.attrs.push((
                                                        string(&kv[0].1),
                                                        string(&any[0].1),
                                                    ));
                                                }
                                                (2, wire::Value::I64(x)) => d.start = x,
                                                (3, wire::Value::I64(x)) => d.time = x,
                                                (6, wire::Value::I64(x)) => d.value = x,
                                                other => {
                                                    panic!("unexpected data point field {other:?}")
                                                }
                                            }
                                        }
                                        points.push(d);
                                    }
                                }
                                2 | 3 => {}
                                other => panic!("unexpected metric field {other}"),
                            }
                        }
                    }
                }
                other => panic!("unexpected ResourceMetrics field {other}"),
            }
        }
    }
    (points, resource)
}

fn encode_all(plan: &mut Plan, b: &CounterBatch, rows: &[u32]) -> Vec<u8> {
    let env = Envelope::new("sw1");
    let mut req = RequestBuf::new(Vec::new(), &env);
    let n = plan.write_rows(b, rows, &mut req);
    assert_eq!(n, req.points);
    let (buf, start) = req.finish(&env);
    buf[start..].to_vec()
}

#[test]
fn varints_round_trip_at_every_length() {
    for v in [
        0u64,
        1,
        127,
        128,
        300,
        16_383,
        16_384,
        u32::MAX as u64,
        u64::MAX,
    ] {
        let mut out = Vec::new();
        wire::put_varint(&mut out, v);
        assert_eq!(out.len(), varint_len(v), "{v}");
        let mut at = [0u8; 10];
        assert_eq!(wire::write_varint(&mut at, v), out.len());
        assert_eq!(&at[..out.len()], &out[..]);
        assert_eq!(wire::Reader { b: &out }.varint(), Some(v));
    }
}

#[test]
fn every_column_of_every_row_becomes_one_point_with_its_attributes() {
    let s = schema(
        &[
            "IF_IN_OCTETS",
            "IN_CURR_OCCUPANCY_BYTES",
            "IF_OUT_UCAST_PKTS",
        ],
        &["Ethernet0", "Ethernet4"],
    );
    let b = batch(&s, &[1_000, 2_000], |r, c| (r * 100 + c) as u64 + 7);
    let mut plan = Plan::new(Arc::clone(&s), MetricNames::Sai, None);
    let req = encode_all(&mut plan, &b, &[0, 1]);
    assert_eq!(count_points(&req), Some((12, b.values.iter().sum())));
    let (points, resource) = decode(&req);
    assert_eq!(points.len(), 12);
    assert!(resource.contains(&("host.name".into(), "sw1".into())));
    assert!(resource.contains(&("service.name".into(), "stel".into())));
    for (r, ts) in [(0usize, 1_000u64), (1, 2_000)] {
        for (o, obj) in ["Ethernet0", "Ethernet4"].iter().enumerate() {
            for (k, (stat, full, metric)) in [
                (
                    "IF_IN_OCTETS",
                    "SAI_PORT_STAT_IF_IN_OCTETS",
                    "sai.port.if_in_octets",
                ),
                (
                    "IN_CURR_OCCUPANCY_BYTES",
                    "SAI_PORT_STAT_IN_CURR_OCCUPANCY_BYTES",
                    "sai.port.in_curr_occupancy_bytes",
                ),
                (
                    "IF_OUT_UCAST_PKTS",
                    "SAI_PORT_STAT_IF_OUT_UCAST_PKTS",
                    "sai.port.if_out_ucast_pkts",
                ),
            ]
            .into_iter()
            .enumerate()
            {
                let c = o * 3 + k;
                let level = stat.contains("OCCUPANCY");
                let want = Dp {
                    metric: metric.into(),
                    sum: !level,
                    monotonic_cumulative: !level,
                    attrs: vec![
                        ("object_name".into(), obj.to_string()),
                        ("sai_stat".into(), full.into()),
                        ("profile".into(), "prof".into()),
                    ],
                    // A sum starts at the first snapshot of its series; gauges have no start.
                    start: if level { 0 } else { 1_000 },
                    time: ts,
                    value: (r * 100 + c) as u64 + 7,
                };
                assert!(points.contains(&want), "missing {want:?}");
            }
        }
    }
}

#[test]
fn countersyncd_names_and_units() {
    let s = schema(&["IF_IN_OCTETS", "IF_IN_UCAST_PKTS"], &["Ethernet0"]);
    let b = batch(&s, &[5], |_, c| c as u64);
    let mut plan = Plan::new(Arc::clone(&s), MetricNames::Countersyncd, None);
    let (points, _) = decode(&encode_all(&mut plan, &b, &[0]));
    let names: Vec<_> = points.iter().map(|p| p.metric.as_str()).collect();
    assert_eq!(
        names,
        ["sai_counter_type_1_stat_0", "sai_counter_type_1_stat_1"]
    );
    assert_eq!(unit_of("IF_IN_OCTETS"), "By");
    assert_eq!(unit_of("ETHER_IN_PKTS_1519_TO_2500_OCTETS"), "{packet}");
    assert_eq!(unit_of("WATERMARK_CELLS"), "{cell}");
    assert_eq!(unit_of("DELAY_WATERMARK_NS"), "ns");
    assert_eq!(unit_of("IF_IN_ERRORS"), "1");
}

#[test]
fn a_lower_value_is_a_reset_and_starts_the_series_again() {
    let s = schema(&["IF_IN_OCTETS"], &["Ethernet0"]);
    let mut plan = Plan::new(Arc::clone(&s), MetricNames::Sai, None);
    let vals = [10u64, 20, 5, 6];
    let b = batch(&s, &[100, 200, 300, 400], |r, _| vals[r]);
    let (points, _) = decode(&encode_all(&mut plan, &b, &[0, 1]));
    assert_eq!(
        points.iter().map(|p| p.start).collect::<Vec<_>>(),
        [100, 100]
    );
    let (points, _) = decode(&encode_all(&mut plan, &b, &[2, 3]));
    // 20 → 5: reset after the snapshot at 200.
    assert_eq!(
        points.iter().map(|p| p.start).collect::<Vec<_>>(),
        [200, 200]
    );
    // A new generation of the same session keeps the series (a template change is no reset).
    let s2 = Arc::new(SessionSchema {
        generation: 2,
        ..(*s).clone()
    });
    let mut plan2 = Plan::new(Arc::clone(&s2), MetricNames::Sai, Some(&plan));
    let b2 = batch(&s2, &[500], |_, _| 7);
    let (points, _) = decode(&encode_all(&mut plan2, &b2, &[0]));
    assert_eq!(points[0].start, 200);
}

#[test]
fn missing_parts_of_split_snapshots_are_left_out() {
    let mut s = (*schema(
        &["IF_IN_OCTETS", "IF_OUT_OCTETS"],
        &["Ethernet0", "Ethernet4"],
    ))
    .clone();
    s.template_ids = vec![256, 257];
    s.part_offsets = vec![0, 2];
    let s = Arc::new(s);
    let mut b = batch(&s, &[10, 20], |r, c| (r * 10 + c) as u64);
    // Row 0 lacks part 1 (Ethernet4's columns); row 1 is whole.
    b.part_masks = vec![0b01, 0b11];
    let mut plan = Plan::new(Arc::clone(&s), MetricNames::Sai, None);
    let req = encode_all(&mut plan, &b, &[0, 1]);
    let (points, _) = decode(&req);
    assert_eq!(points.len(), 6);
    assert!(!points
        .iter()
        .any(|p| p.time == 10 && p.attrs[0].1 == "Ethernet4"));
    assert_eq!(count_points(&req).unwrap().0, 6);
}

#[test]
fn resolution_keeps_the_first_snapshot_of_each_step() {
    let s = schema(&["IF_IN_OCTETS"], &["Ethernet0"]);
    let mut plan = Plan::new(Arc::clone(&s), MetricNames::Sai, None);
    let b = batch(&s, &[995, 1_000, 1_500, 1_999, 2_001, 4_100], |_, _| 1);
    let mut rows = Vec::new();
    plan.select_rows(&b, 1_000, &mut rows);
    assert_eq!(rows, [0, 1, 4, 5]);
    // The state carries over to the next batch of the session.
    let b = batch(&s, &[4_900, 5_000], |_, _| 1);
    plan.select_rows(&b, 1_000, &mut rows);
    assert_eq!(rows, [1]);
    plan.select_rows(&b, 0, &mut rows);
    assert_eq!(rows, [0, 1]);
}

#[test]
fn own_metrics_snapshot_is_sums_and_gauges_with_labels() {
    use crate::{
        labels,
        metrics::{Metric, Registry},
    };
    let r = Registry::new();
    r.counter(Metric::SinkReceivedBatches, labels!(Sink = "otlp"))
        .add(3);
    r.gauge(Metric::SinkProfileEndpoints, labels!(Sink = "otlp"))
        .set(2);
    let env = Envelope::new("sw1");
    let mut req = RequestBuf::new(Vec::new(), &env);
    assert_eq!(write_snapshot(&r.snapshot(), 11, 22, &mut req), 2);
    let (buf, start) = req.finish(&env);
    let (points, _) = decode(&buf[start..]);
    let attrs = vec![("sink".to_string(), "otlp".to_string())];
    assert!(points.contains(&Dp {
        metric: "stel_sink_received_batches_total".into(),
        sum: true,
        monotonic_cumulative: true,
        attrs: attrs.clone(),
        start: 11,
        time: 22,
        value: 3
    }));
    assert!(points.contains(&Dp {
        metric: "stel_sink_profile_endpoints".into(),
        sum: false,
        monotonic_cumulative: false,
        attrs,
        start: 0,
        time: 22,
        value: 2
    }));
}

#[test]
fn responses_round_trip_and_garbage_is_not_a_response() {
    assert_eq!(parse_response(&[]), Some((0, String::new())));
    assert_eq!(
        parse_response(&encode_response(5, "too old")),
        Some((5, "too old".into()))
    );
    assert_eq!(parse_response(&[0x0a, 0x05, 0x01]), None);
    assert_eq!(count_points(&[0x0a, 0x7f]), None);
}
