//! The accumulator against a reference written straight from ROLLUPS.md §4 (per column, per
//! series, over the whole stream), on every kernel and the general path; coarse rows built by
//! `absorb` against rows accumulated at the coarse interval directly.

use std::sync::Arc;

use super::*;
use crate::{
    rollup::{burst::above, config::BurstRule, kernel::Kernel, plan::tests::port_schema},
    schema::SessionSchema,
};

const STATS: [&str; 5] = [
    "IF_IN_OCTETS",
    "IN_CURR_OCCUPANCY_BYTES",
    "IF_OUT_OCTETS",
    "IF_IN_DISCARDS",
    "IF_OUT_UCAST_PKTS",
];

fn rule() -> BurstRule {
    // A slow "port" so modest deltas cross the thresholds.
    let speed_mbps = 0.8;
    BurstRule {
        bytes_per_s: speed_mbps * 1e6 / 8.0,
        speed_mbps,
        thresholds: vec![50.0, 90.0],
    }
}

/// Deterministic noise.
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 33
    }
}

/// A stream: (time, values, validity per column or None).
type Stream = Vec<(i64, Vec<u64>, Option<Vec<bool>>)>;

/// `n` rows of `schema` at ~`step` ns, with bursts, resets, gaps, (with `nulls`) missing parts
/// and (with `back`) time going back once.
fn stream(
    schema: &SessionSchema,
    n: usize,
    step: i64,
    seed: u64,
    nulls: bool,
    back: bool,
) -> Stream {
    let w = schema.width();
    let mut rng = Lcg(seed);
    let mut vals = vec![0u64; w];
    let mut t = 1_700_000_000_000_000_000i64 - 3 * step;
    let mut out = Vec::new();
    for i in 0..n {
        t += if rng.next().is_multiple_of(50) {
            step * 3
        } else {
            step
        };
        if back && i == n / 2 {
            t -= 5 * step;
        }
        for (c, v) in vals.iter_mut().enumerate() {
            let k = schema.columns[c].key;
            if k.is_level() {
                *v = rng.next() % 1000;
            } else if rng.next().is_multiple_of(400) {
                *v = rng.next() % 7; // reset
            } else {
                // Bursty: mostly small, sometimes large increments (crosses 50 and 90 %).
                let inc = match rng.next() % 10 {
                    0..=5 => rng.next() % 20,
                    6 | 7 => 60 + rng.next() % 20,
                    _ => 95 + rng.next() % 10,
                };
                *v += inc;
            }
        }
        let valid = (nulls && rng.next().is_multiple_of(9)).then(|| {
            let bad = rng.next() % 2;
            (0..w).map(|c| c % 2 != bad as usize).collect::<Vec<bool>>()
        });
        out.push((t, vals.clone(), valid));
    }
    out
}

/// The stream as batches of `per` rows; validity becomes part masks of a two-part schema
/// (even / odd columns alternate parts is not a contiguous range, so the two-part schemas used
/// here put columns in parts by halves and the reference uses the same validity).
fn batches(schema: &Arc<SessionSchema>, s: &Stream, per: usize) -> Vec<CounterBatch> {
    let w = schema.width();
    s.chunks(per)
        .map(|ch| {
            let ts = ch.iter().map(|r| r.0).collect();
            let values = ch.iter().flat_map(|r| r.1.iter().copied()).collect();
            let masks = if ch.iter().any(|r| r.2.is_some()) {
                ch.iter()
                    .map(|r| match &r.2 {
                        None => 3,
                        Some(v) => {
                            // Part 0 = first half, part 1 = second half.
                            u32::from(v[0]) | (u32::from(v[w - 1]) << 1)
                        }
                    })
                    .collect()
            } else {
                Vec::new()
            };
            CounterBatch::new(Arc::clone(schema), ts, values, masks).unwrap()
        })
        .collect()
}

/// Two parts: columns `0..w/2` and `w/2..w`.
fn two_part(schema: &Arc<SessionSchema>) -> Arc<SessionSchema> {
    let mut s = (**schema).clone();
    s.template_ids = vec![256, 257];
    s.part_offsets = vec![0, s.width() / 2];
    Arc::new(s)
}

/// Validity as the two-part schema sees it.
fn part_validity(w: usize, v: &Option<Vec<bool>>) -> Option<Vec<bool>> {
    v.as_ref().map(|v| {
        let (a, b) = (v[0], v[w - 1]);
        (0..w).map(|c| if c < w / 2 { a } else { b }).collect()
    })
}

fn run(acc: &mut Accumulator, bs: &[CounterBatch]) -> Vec<IntervalRow> {
    let mut out = Vec::new();
    for b in bs {
        acc.push(b, &mut |r| out.push(r));
    }
    acc.close(&mut |r| out.push(r));
    out
}

/// The reference: ROLLUPS.md §4 computed per column over the whole stream.
fn reference(plan: &Plan, s: &Stream, interval: i64, rule: &BurstRule) -> Vec<IntervalRow> {
    let w = plan.width();
    let nthr = rule.thresholds.len();
    let mut rows: Vec<IntervalRow> = Vec::new();
    // Intervals in arrival order (a new one whenever k changes).
    let mut idx = Vec::new();
    for (t, v, ok) in s {
        let k = t.div_euclid(interval);
        if rows.last().is_none_or(|r| r.start_ns != k * interval) {
            let mut r = IntervalRow::empty(w, plan.series.len(), nthr, k * interval);
            r.first_ts = *t;
            r.first.copy_from_slice(v);
            r.first_ok = ok.clone().unwrap_or(vec![true; w]);
            rows.push(r);
        }
        let r = rows.last_mut().unwrap();
        r.samples += 1;
        r.last_ts = *t;
        r.last.copy_from_slice(v);
        r.last_ok = ok.clone().unwrap_or(vec![true; w]);
        idx.push(rows.len() - 1);
    }
    // Gaps.
    let mut nominal = u64::MAX;
    for i in 1..s.len() {
        if s[i].0 > s[i - 1].0 {
            let dt = (s[i].0 - s[i - 1].0) as u64;
            nominal = nominal.min(dt);
            let r = &mut rows[idx[i]];
            r.min_dt = r.min_dt.min(dt);
            r.max_dt = r.max_dt.max(dt);
            if 2 * dt > 3 * nominal {
                r.lost += (dt + nominal / 2) / nominal - 1;
            }
        }
    }
    for c in 0..w {
        let mut prev: Option<(i64, u64)> = None;
        type Best = (Option<(u64, i64)>, Option<(u64, i64)>);
        let mut best: Vec<Best> = vec![(None, None); rows.len()];
        for (i, (t, v, ok)) in s.iter().enumerate() {
            let r = &mut rows[idx[i]];
            if !ok.as_ref().is_none_or(|o| o[c]) {
                r.nulls[c] += 1;
                continue;
            }
            let v = v[c];
            let x = if plan.level[c] {
                r.sum[c] += v;
                Some(v)
            } else {
                match prev {
                    Some((pt, pv)) if *t > pt => {
                        if v < pv {
                            r.resets[c] += 1;
                            None
                        } else {
                            Some(v - pv)
                        }
                    }
                    _ => None,
                }
            };
            if let Some(x) = x {
                let b = &mut best[idx[i]];
                if b.0.is_none_or(|(m, _)| x > m) {
                    b.0 = Some((x, *t));
                }
                if b.1.is_none_or(|(m, _)| x < m) {
                    b.1 = Some((x, *t));
                }
            }
            prev = Some((*t, v));
        }
        for (r, (hi, lo)) in rows.iter_mut().zip(best) {
            (r.hi[c], r.hi_t[c]) = hi.unwrap_or((0, NO_TIME));
            (r.lo[c], r.lo_t[c]) = lo.unwrap_or((u64::MAX, NO_TIME));
        }
    }
    for (si, ser) in plan.series.iter().enumerate() {
        let c = ser.column;
        let mut prev: Option<(i64, u64)> = None;
        for (i, (t, v, ok)) in s.iter().enumerate() {
            if !ok.as_ref().is_none_or(|o| o[c]) {
                continue;
            }
            let v = v[c];
            if let Some((pt, pv)) = prev.filter(|(pt, _)| *t > *pt) {
                let r = &mut rows[idx[i]];
                let dt = t - pt;
                let sr = &mut r.series[si];
                for (j, thr) in rule.thresholds.iter().enumerate() {
                    let a = v >= pv && above(v - pv, dt, rule.bytes_per_s, *thr);
                    if pt < r.start_ns {
                        sr.entry_ns = dt as u64;
                        sr.thr[j].entry_above_ns = if a { dt as u64 } else { 0 };
                    } else {
                        sr.thr[j].inner = sr.thr[j].inner.then(Seg::one(dt as u64, a));
                    }
                }
            }
            prev = Some((*t, v));
        }
    }
    rows
}

/// Rows compared through their accessors (the representation of "none" may differ).
fn assert_rows_eq(got: &[IntervalRow], want: &[IntervalRow], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: rows");
    for (g, x) in got.iter().zip(want) {
        let at = format!("{what}: interval {}", x.start_ns);
        assert_eq!(
            (g.start_ns, g.first_ts, g.last_ts, g.samples, g.lost, g.min_dt, g.max_dt),
            (x.start_ns, x.first_ts, x.last_ts, x.samples, x.lost, x.min_dt, x.max_dt),
            "{at}"
        );
        for c in 0..x.width() {
            assert_eq!(
                (g.first_ok[c], g.first_ok[c].then_some(g.first[c])),
                (x.first_ok[c], x.first_ok[c].then_some(x.first[c])),
                "{at} first {c}"
            );
            assert_eq!(
                (g.last_ok[c], g.last_ok[c].then_some(g.last[c])),
                (x.last_ok[c], x.last_ok[c].then_some(x.last[c])),
                "{at} last {c}"
            );
            assert_eq!(g.peak(c), x.peak(c), "{at} peak {c}");
            assert_eq!(g.trough(c), x.trough(c), "{at} trough {c}");
            assert_eq!(
                (g.sum[c], g.nulls[c], g.resets[c]),
                (x.sum[c], x.nulls[c], x.resets[c]),
                "{at} sum/nulls/resets {c}"
            );
        }
        assert_eq!(g.series, x.series, "{at} bursts");
    }
}

fn check(schema: &Arc<SessionSchema>, s: &Stream, interval: i64, per: usize, what: &str) {
    let plan = Arc::new(Plan::new(schema));
    let want = reference(&plan, s, interval, &rule());
    assert!(want.len() > 3, "{what}: the stream spans several intervals");
    let bs = batches(schema, s, per);
    for k in Kernel::available() {
        let mut acc = Accumulator::with_kernel(Arc::clone(&plan), interval, &rule(), k);
        assert_rows_eq(&run(&mut acc, &bs), &want, &format!("{what} {}", k.name()));
    }
    let mut acc = Accumulator::new(Arc::clone(&plan), interval, &rule());
    acc.general_only = true;
    assert_rows_eq(&run(&mut acc, &bs), &want, &format!("{what} general"));
}

#[test]
fn complete_rows_match_the_reference_on_every_kernel() {
    // 13 objects × 5 stats = 65 columns: eight-column strips and a tail.
    let schema = port_schema(13, &STATS);
    let s = stream(&schema, 3000, 1_000_000, 7, false, false);
    for per in [1, 37, 500] {
        check(&schema, &s, 100_000_000, per, &format!("per {per}"));
    }
}

#[test]
fn nulls_gaps_and_time_going_back_match_the_reference() {
    let schema = two_part(&port_schema(6, &STATS));
    let s: Stream = stream(&schema, 2500, 1_000_000, 11, true, true)
        .into_iter()
        .map(|(t, v, ok)| {
            let ok = part_validity(schema.width(), &ok);
            (t, v, ok)
        })
        .collect();
    check(&schema, &s, 100_000_000, 64, "nulls");
}

#[test]
fn coarse_rows_from_fine_rows_equal_rows_accumulated_coarse() {
    let schema = two_part(&port_schema(5, &STATS));
    let s: Stream = stream(&schema, 4000, 1_000_000, 3, true, false)
        .into_iter()
        .map(|(t, v, ok)| (t, v.clone(), part_validity(schema.width(), &ok)))
        .collect();
    let plan = Arc::new(Plan::new(&schema));
    let bs = batches(&schema, &s, 100);
    let fine = run(
        &mut Accumulator::new(Arc::clone(&plan), 100_000_000, &rule()),
        &bs,
    );
    let coarse = run(
        &mut Accumulator::new(Arc::clone(&plan), 1_000_000_000, &rule()),
        &bs,
    );
    let mut built: Vec<IntervalRow> = Vec::new();
    for r in &fine {
        let start = r.start_ns.div_euclid(1_000_000_000) * 1_000_000_000;
        match built.last_mut() {
            Some(b) if b.start_ns == start => b.absorb(r),
            _ => {
                let mut b = r.clone();
                b.start_ns = start;
                built.push(b);
            }
        }
    }
    assert!(built.len() >= 3);
    assert_rows_eq(&built, &coarse, "absorbed");
}
