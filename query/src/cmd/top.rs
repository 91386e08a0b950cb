//! `stel-query top`: the N busiest objects of a window by rate, drops, buffer occupancy or
//! microburst time — of one switch, or of a fleet (a lake of `switch=` roots, in this process or
//! on a Spark Connect engine), per object or per switch.

use std::{collections::BTreeMap, process::ExitCode, time::Instant};

use serde_json::json;
use stel_store::rate::RateUnit;

use super::{merge, objects_of};
use crate::{
    burst::{Direction, Rule},
    catalog::{Catalog, Column, Session},
    engine::{Aggs, Buckets, Grid, Progress},
    error::{Error, Result},
    output::{human_ns, natural_cmp, thousands, Cell, Printer},
    rates::{self, fmt_util, Rates, Speeds},
    settings::{
        fmt_ts, BurstRuleArgs, CommonArgs, ProfileArg, SpeedArg, TimeArgs, TimeRange, UnitArg,
    },
    spark::{compile::Scope, Lake},
    tiers::{self, Need, Planned, Source},
};

/// The N busiest objects of a window by rate, drops, buffer occupancy or microburst time.
///
/// --by rate: RX + TX bytes/s; drops: discarded/dropped packets (none dropped is said, not
/// ranked); occupancy: peak buffer bytes; bursts: time spent above --threshold for at least
/// --min-duration, RX and TX added up. Over a fleet lake (switch=NAME/ roots, or --engine
/// spark) the ranking is across every switch; --per switch ranks switches by their totals.
///
/// Examples:
///   stel-query top                       # busiest ports, the last minute of data
///   stel-query top --by drops -n 5 --since 10m
///   stel-query top -n 3 --unit bits      # in Gb/s
///   stel-query top --by occupancy --group QUEUE --last 1s
///   stel-query top --by bursts --threshold 90 --last 1h -d s3://lake/fleet \
///       --engine spark --remote sc://127.0.0.1:15002
///   stel-query top --by drops --per switch -n 100 -d s3://lake/fleet --last 1h
#[derive(Debug, clap::Args)]
#[command(verbatim_doc_comment)]
pub struct Args {
    #[command(flatten)]
    pub common: CommonArgs,
    #[command(flatten)]
    pub time: TimeArgs,
    #[command(flatten)]
    pub profile: ProfileArg,
    /// Session group: PORT, QUEUE, INGRESS_PRIORITY_GROUP, BUFFER_POOL, ROUTER_INTERFACE.
    #[arg(long, short = 'g', default_value = "PORT")]
    pub group: String,
    /// What to rank by.
    #[arg(long, value_enum, default_value = "rate")]
    pub by: By,
    /// Rank objects, or switches by the sum (max for occupancy) over their objects.
    #[arg(long, value_enum, default_value = "object")]
    pub per: Per,
    /// How many.
    #[arg(long, short = 'n', default_value_t = 10)]
    pub top: usize,
    #[command(flatten)]
    pub speed: SpeedArg,
    /// With --by bursts.
    #[command(flatten)]
    pub rule: BurstRuleArgs,
    #[command(flatten)]
    pub unit: UnitArg,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum By {
    /// RX + TX bytes/s over the window (PORT, ROUTER_INTERFACE).
    Rate,
    /// Packets counted by the *DISCARDS / *DROPPED* counters over the window.
    Drops,
    /// Peak *CURR_OCCUPANCY_BYTES (QUEUE, INGRESS_PRIORITY_GROUP, BUFFER_POOL).
    Occupancy,
    /// Time spent in microbursts (--threshold, --min-duration), RX and TX added up.
    Bursts,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Per {
    /// Rank objects (ports, queues, …).
    Object,
    /// Rank switches by the sum (max for occupancy) over their objects.
    Switch,
}

/// Per object: (value, per-stat parts).
type Scores = BTreeMap<String, (f64, Vec<(String, f64)>)>;

/// One scored object (or switch) before ranking.
#[derive(Debug, Clone)]
struct Entry {
    switch: Option<String>,
    object: String,
    value: f64,
    /// Per-stat parts of the value, in the order they were met.
    detail: Vec<(String, f64)>,
    /// --by rate: the rates and the port's speed (Mb/s) for UTIL.
    rates: Option<(Rates, f64)>,
}

fn add_detail(d: &mut Vec<(String, f64)>, k: &str, v: f64, by: By) {
    match d.iter_mut().find(|(n, _)| n == k) {
        Some((_, x)) if by == By::Occupancy => *x = x.max(v),
        Some((_, x)) => *x += v,
        None => d.push((k.to_string(), v)),
    }
}

/// The columns `by` ranks on (for the bucket-scored kinds).
fn pick_columns(s: &Session, by: By) -> Vec<&Column> {
    let pick: &dyn Fn(&str) -> bool = match by {
        By::Drops => &|st: &str| st.contains("DISCARDS") || st.contains("DROPPED"),
        By::Occupancy => &|st: &str| st.contains("CURR_OCCUPANCY_BYTES"),
        _ => &|st: &str| st == "BYTES",
    };
    s.columns.iter().filter(|c| pick(&c.stat)).collect()
}

fn missing(s: &Session, by: By) -> Error {
    Error::NotFound(format!(
        "{}/{} carries no {} counter (try another --group or --by)",
        s.profile,
        s.group,
        match by {
            By::Drops => "*DISCARDS / *DROPPED*",
            By::Occupancy => "*CURR_OCCUPANCY_BYTES",
            _ => "BYTES",
        }
    ))
}

/// Scores one whole-window bucket: drops and rate from the first and last rows, occupancy from
/// the peak. Per object: (value, per-stat parts).
fn score(by: By, cols: &[&Column], b: &Buckets, out: &mut Scores) {
    let Some((t0, first, fok)) = &b.first else {
        return;
    };
    let dt = (b.last_ts[0] - t0) as f64 / 1e9;
    for (c, col) in cols.iter().enumerate() {
        match by {
            By::Occupancy => {
                if b.count[c] > 0 {
                    let e = out.entry(col.object.clone()).or_default();
                    e.0 = e.0.max(b.max[c] as f64);
                    e.1.push((col.stat.clone(), b.max[c] as f64));
                }
            }
            _ => {
                if let (Some(l), true) = (b.last(0, c), fok[c]) {
                    let d = l.saturating_sub(first[c]) as f64;
                    let v = if by == By::Rate && dt > 0.0 {
                        d / dt
                    } else {
                        d
                    };
                    let e = out.entry(col.object.clone()).or_default();
                    e.0 += v;
                    e.1.push((col.stat.clone(), v));
                }
            }
        }
    }
}

fn entries(switch: Option<&str>, m: Scores) -> Vec<Entry> {
    m.into_iter()
        .map(|(object, (value, detail))| Entry {
            switch: switch.map(str::to_string),
            object,
            value,
            detail,
            rates: None,
        })
        .collect()
}

fn is_rate_group(group: &str) -> bool {
    group == "PORT" || group == "ROUTER_INTERFACE"
}

fn rate_stats(group: &str) -> rates::RateStats {
    if group == "PORT" {
        rates::PORT
    } else {
        rates::RIF
    }
}

fn rate_entry(switch: Option<&str>, row: crate::cmd::rates::RateRow<'_>, speeds: &Speeds) -> Entry {
    let x = row.rates;
    Entry {
        switch: switch.map(str::to_string),
        object: row.object.to_string(),
        value: x.rx_bps.unwrap_or(0.0) + x.tx_bps.unwrap_or(0.0),
        detail: vec![
            ("RX_BPS".into(), x.rx_bps.unwrap_or(0.0)),
            ("TX_BPS".into(), x.tx_bps.unwrap_or(0.0)),
        ],
        rates: Some((x, speeds.of(row.object))),
    }
}

/// Per object: the bursts' total time (RX + TX), with the parts and the count.
fn burst_entry(
    switch: Option<&str>,
    object: &str,
    dir: &str,
    ns: i64,
    n: u64,
    into: &mut BTreeMap<(Option<String>, String), Entry>,
) {
    let e = into
        .entry((switch.map(str::to_string), object.to_string()))
        .or_insert_with(|| Entry {
            switch: switch.map(str::to_string),
            object: object.to_string(),
            value: 0.0,
            detail: Vec::new(),
            rates: None,
        });
    e.value += ns as f64;
    add_detail(&mut e.detail, dir, ns as f64, By::Bursts);
    add_detail(&mut e.detail, "bursts", n as f64, By::Bursts);
}

/// One session's entries, by the local engine.
#[expect(
    clippy::too_many_arguments,
    reason = "the resolved question, spelled out"
)]
async fn local_entries(
    cat: &Catalog,
    s: &Session,
    r: &TimeRange,
    a: &Args,
    rule: &Rule,
    switch: Option<&str>,
    fleet: bool,
    progress: &Progress,
) -> Result<(Vec<Entry>, u64, Option<Planned>)> {
    let group = s.group.to_ascii_uppercase();
    let speed = a.speed.mbps()?;
    let raw = cat.raw_extent(s).await?;
    match a.by {
        By::Rate if is_rate_group(&group) => {
            let objects = s.objects();
            let mut out = Vec::new();
            let speeds = a.speed.resolve(cat, s).await?;
            let c = crate::cmd::rates::compute(
                cat,
                s,
                &objects,
                &rate_stats(&group),
                r,
                None,
                None,
                progress,
                |row| {
                    out.push(rate_entry(switch, *row, &speeds));
                    Ok(())
                },
            )
            .await?;
            Ok((out, c.scanned, Some(c.plan)))
        }
        By::Bursts => {
            let objects = objects_of(s, &[], fleet)?;
            let series = rule.series(s, &objects, &rate_stats(&group));
            if series.is_empty() {
                return if fleet {
                    Ok((Vec::new(), 0, None))
                } else {
                    Err(Error::NotFound(format!(
                        "{}/{} carries no octet counters to measure utilisation with",
                        s.profile, s.group
                    )))
                };
            }
            // The tiers hold burst figures at their rule (one speed for every port); they
            // answer when the rule is theirs — every port measured at that speed — and no
            // burst can be shorter than --min-duration (every run is at least one snapshot
            // interval long). Ports of different speeds: raw answers.
            let speeds = a.speed.resolve(cat, s).await?;
            let mut each = series.iter().map(|c| speeds.of(&c.object));
            let first = each.next().unwrap_or(speed);
            let one_speed = each.all(|v| v == first).then_some(first);
            let need = Need {
                bursts: one_speed.map(|v| (v, rule.threshold, rule.min_ns)),
                ..Need::default()
            };
            let plan = match one_speed {
                Some(_) => tiers::plan(s, raw, r, &need)?,
                None => tiers::Planned {
                    segments: vec![tiers::Segment {
                        source: Source::Raw,
                        range: *r,
                    }],
                    range: *r,
                    raw,
                },
            };
            let raw_seg = plan
                .segments
                .iter()
                .find(|g| g.source == Source::Raw)
                .map(|g| g.range);
            let stream = match raw_seg {
                Some(rr) => match crate::engine::stream_interval(cat, s, &rr).await {
                    Ok(w) => Some(w),
                    Err(Error::NotFound(_)) if fleet => return Ok((Vec::new(), 0, None)),
                    Err(e) => return Err(e),
                },
                None => None,
            };
            let tiered = plan.segments.iter().any(|g| g.source != Source::Raw);
            if tiered {
                let shortest = tiers::min_dt(cat, s, &plan)
                    .await?
                    .unwrap_or(i64::MAX)
                    .min(stream.unwrap_or(i64::MAX));
                if rule.min_ns <= shortest {
                    let st = rate_stats(&group);
                    let keys: Vec<(String, usize, String)> = series
                        .iter()
                        .map(|c| {
                            if c.dir == "TX" {
                                (c.object.clone(), 1, st.tx_octets.to_string())
                            } else {
                                (c.object.clone(), 0, st.rx_octets.to_string())
                            }
                        })
                        .collect();
                    let (segs, scanned) = tiers::burst_totals(
                        cat,
                        s,
                        &plan,
                        &keys,
                        one_speed.unwrap_or(speed),
                        rule.threshold,
                        stream,
                        progress,
                    )
                    .await?;
                    let mut m = BTreeMap::new();
                    for (c, g) in series.iter().zip(segs) {
                        if g.runs > 0 {
                            let dir = if c.dir == "TX" { "TX" } else { "RX" };
                            burst_entry(switch, &c.object, dir, g.above as i64, g.runs, &mut m);
                        }
                    }
                    return Ok((m.into_values().collect(), scanned, Some(plan)));
                }
                // Raw answers alone when it holds every snapshot the tiers hold here.
                let tier_from = s
                    .tiers
                    .iter()
                    .filter_map(|t| t.samples)
                    .filter(|(a, b)| *b > r.from_ns && *a < r.to_ns)
                    .map(|(a, _)| a.max(r.from_ns))
                    .min();
                if raw.is_none_or(|(a, _)| tier_from.is_some_and(|tf| a > tf)) {
                    return Err(Error::NotFound(format!(
                        "{}/{}: --min-duration {} is longer than the tiers' shortest snapshot interval ({}), so only raw history answers, and raw does not cover {r}",
                        s.profile,
                        s.group,
                        human_ns(rule.min_ns),
                        human_ns(shortest)
                    )));
                }
            }
            let width = match crate::engine::stream_interval(cat, s, r).await {
                Ok(w) => w,
                Err(Error::NotFound(_)) if fleet => return Ok((Vec::new(), 0, None)),
                Err(e) => return Err(e),
            };
            let (bursts, scanned, _) =
                crate::burst::detect(cat, s, &series, r, width, rule, &speeds, progress).await?;
            let mut m = BTreeMap::new();
            for b in bursts {
                burst_entry(switch, &b.object, b.dir, b.end_ns - b.start_ns, 1, &mut m);
            }
            let raw_only = tiers::Planned {
                segments: vec![tiers::Segment {
                    source: Source::Raw,
                    range: *r,
                }],
                range: *r,
                raw,
            };
            Ok((m.into_values().collect(), scanned, Some(raw_only)))
        }
        by => {
            let cols = pick_columns(s, by);
            if cols.is_empty() {
                return if fleet {
                    Ok((Vec::new(), 0, None))
                } else {
                    Err(missing(s, by))
                };
            }
            let names: Vec<String> = cols.iter().map(|c| c.name.clone()).collect();
            let aggs = Aggs {
                stats: by == By::Occupancy,
            };
            let need = Need {
                stats: aggs.stats,
                ..Need::default()
            };
            let plan = tiers::plan(s, raw, r, &need)?;
            let mut parts = Vec::new();
            let scanned = tiers::scan(cat, s, &names, &plan, None, aggs, progress, |b| {
                parts.push(b.clone());
                Ok(())
            })
            .await?;
            let mut m = BTreeMap::new();
            if let Some(b) = tiers::merge_whole(parts, aggs) {
                score(by, &cols, &b, &mut m);
            }
            Ok((entries(switch, m), scanned, Some(plan)))
        }
    }
}

/// The same entries for every switch of the lake, by a Spark Connect engine.
async fn spark_entries(
    lake: &Lake,
    a: &Args,
    rule: &Rule,
    scope: &Scope,
) -> Result<(Vec<Entry>, u64, serde_json::Value)> {
    let group = scope.group.clone();
    let s = crate::fleet::lake_session(&lake.columns, &group, a.profile.get());
    let mut out = Vec::new();
    let mut scanned = 0;
    let files;
    let mut tier_source: Option<String> = None;
    match a.by {
        By::Rate if is_rate_group(&group) => {
            let objects = s.objects();
            let (cols, feed) =
                crate::cmd::rates::RateFeed::new(&s, &objects, &rate_stats(&group), None)?;
            let mut feed = feed.whole_window();
            let grid = feed.grid(&scope.range, None);
            let (per, f) = lake.buckets(scope, &cols, grid, Aggs::default()).await?;
            files = f;
            // The engine reads no footers: --speed or 100G for every port.
            let speeds = Speeds::new(a.speed.flag_mbps()?, Default::default());
            for sw in per {
                scanned += sw.value.rows;
                let mut feed = feed.fresh();
                let mut keep = |row: &crate::cmd::rates::RateRow<'_>| {
                    let x = &row.rates;
                    if x.rx_bps.is_some() || x.tx_bps.is_some() {
                        out.push(rate_entry(Some(&sw.switch), *row, &speeds));
                    }
                    Ok(())
                };
                feed.feed(&sw.value, &mut keep)?;
                feed.finish(&mut keep)?;
            }
        }
        By::Bursts => {
            let series = rule.series(&s, &s.objects(), &rate_stats(&group));
            if series.is_empty() {
                return Err(missing(&s, By::Rate));
            }
            // A rollup tier of the lake answers when it holds the rule, the window is on its
            // intervals and no burst can be shorter than --min-duration; else the raw view.
            let speed = a.speed.mbps()?;
            let label = stel_store::rollup::config::threshold_label(rule.threshold);
            let r = scope.range;
            let holds_rule = |t: &&crate::spark::lake::LakeTier| {
                t.speed_mbps == Some(speed)
                    && t.thresholds
                        .iter()
                        .any(|x| stel_store::rollup::config::threshold_label(*x) == label)
            };
            let on_intervals = |t: &&crate::spark::lake::LakeTier| {
                r.from_ns % t.interval_ns == 0 && r.to_ns % t.interval_ns == 0
            };
            let tier = lake.tiers.iter().filter(holds_rule).find(on_intervals);
            // Unlike the local engine, which joins a tier with the raw edges of the window
            // ("1s+raw"), a Spark question reads a tier only for a window on its intervals: a
            // long window off them (`--last 1h` ends at the newest sample) scans the raw stream,
            // the heaviest question there is, so say so before it runs.
            const LONG_NS: i64 = 10 * 60 * 1_000_000_000;
            if let (None, Some(t)) = (tier, lake.tiers.iter().find(holds_rule)) {
                if r.to_ns - r.from_ns > LONG_NS {
                    crate::diag::note(&raw_note(&t.name, t.interval_ns, lake.raw_files(scope)));
                }
            }
            let mut answered = None;
            if let Some(t) = tier {
                let (per, min_dt, f) = lake.tier_burst_totals(scope, t, &label).await?;
                if rule.min_ns <= min_dt {
                    answered = Some((per, f, t.name.clone()));
                }
            }
            let (per, f, source) = match answered {
                Some(x) => x,
                None => {
                    let (per, f) = lake.burst_totals(scope, &series, &rule.params()).await?;
                    (per, f, "raw".to_string())
                }
            };
            files = f;
            tier_source = Some(source);
            let mut m = BTreeMap::new();
            for t in per {
                let v = t.value;
                burst_entry(
                    Some(&t.switch),
                    &v.object,
                    &v.dir,
                    v.burst_ns,
                    v.bursts,
                    &mut m,
                );
            }
            out = m.into_values().collect();
        }
        by => {
            let cols = pick_columns(&s, by);
            if cols.is_empty() {
                return Err(missing(&s, by));
            }
            let names: Vec<String> = cols.iter().map(|c| c.name.clone()).collect();
            let (per, f) = lake
                .buckets(
                    scope,
                    &names,
                    Grid::new(&scope.range, None),
                    Aggs {
                        stats: by == By::Occupancy,
                    },
                )
                .await?;
            files = f;
            for sw in per {
                scanned += sw.value.rows;
                let mut m = BTreeMap::new();
                score(by, &cols, &sw.value, &mut m);
                out.extend(entries(Some(&sw.switch), m));
            }
        }
    }
    let mut about = lake.about(files);
    merge(
        &mut about,
        json!({"tier": tier_source.unwrap_or_else(|| "raw".into())}),
    );
    Ok((out, scanned, about))
}

/// The note for a long Spark window that reads the raw stream though tier `tier` (of
/// `interval_ns`) holds the rule: the window is not on its intervals.
fn raw_note(tier: &str, interval_ns: i64, files: usize) -> String {
    let whole = match interval_ns {
        60_000_000_000 => "whole minutes".to_string(),
        1_000_000_000 => "whole seconds".to_string(),
        _ => format!("whole {tier} intervals"),
    };
    format!(
        "spark: the window is not {whole}, so this reads the raw stream ({files} files); --from/--to on {whole} reads the {tier} tier"
    )
}

/// Sums (max for occupancy) a switch's entries into one.
fn per_switch(entries: Vec<Entry>, by: By) -> Vec<Entry> {
    let mut m: BTreeMap<Option<String>, Entry> = BTreeMap::new();
    for e in entries {
        let t = m.entry(e.switch.clone()).or_insert_with(|| Entry {
            switch: e.switch.clone(),
            object: String::new(),
            value: 0.0,
            detail: Vec::new(),
            rates: None,
        });
        if by == By::Occupancy {
            t.value = t.value.max(e.value);
        } else {
            t.value += e.value;
        }
        for (k, v) in e.detail {
            add_detail(&mut t.detail, &k, v, by);
        }
        add_detail(&mut t.detail, "objects", 1.0, By::Drops);
    }
    m.into_values().collect()
}

fn fmt_detail(by: By, unit: RateUnit, d: &[(String, f64)]) -> String {
    d.iter()
        .map(|(k, v)| match (by, k.as_str()) {
            (By::Bursts, "RX" | "TX") => format!("{k}={}", human_ns(*v as i64)),
            (By::Rate, _) => format!("{k}={}", unit.format(*v)),
            _ => format!("{k}={}", thousands(*v as u64)),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// # Errors
/// See [`Error`].
pub async fn run(a: Args) -> Result<ExitCode> {
    let started = Instant::now();
    let set = a.common.resolve();
    let speed = a.speed.mbps()?;
    let unit: RateUnit = a.unit.get();
    let bps =
        |v: Option<f64>| v.map_or_else(Cell::na, |v| Cell::f64(unit.value(v), unit.format(v)));
    let rule = Rule::new(
        speed,
        a.rule.threshold,
        &a.rule.min_duration,
        Direction::Both,
    )?;
    let group = a.group.to_ascii_uppercase();
    let progress = Progress::new("top");
    let mut all = Vec::new();
    let mut scanned = 0u64;
    let mut engine = json!({"engine": "local"});
    let (fleet, r, profile);
    if let Some(remote) = set.spark_remote()? {
        let lake = Lake::open(remote, &set.data, &set.switches).await?;
        let extent = lake.newest(&group).await?.map(|t| (t, t));
        r = a.time.resolve(extent)?;
        let scope = Scope {
            group: group.clone(),
            profile: a.profile.profile.clone(),
            switches: set.switches.clone(),
            range: r,
            ts: lake.ts.clone(),
        };
        let (e, n, about) = spark_entries(&lake, &a, &rule, &scope).await?;
        (all, scanned, engine) = (e, n, about);
        fleet = true;
        profile = a.profile.profile.clone().unwrap_or_else(|| "*".into());
    } else {
        let targets = crate::fleet::open(&set.data, &set.switches, set.strict).await?;
        fleet = targets.iter().any(|t| t.switch.is_some());
        let (found, range) =
            crate::fleet::sessions(&targets, a.profile.get(), &group, &a.time).await?;
        r = range;
        profile = found[0].1.profile.clone();
        for (t, s) in &found {
            let (e, n, plan) = local_entries(
                &t.cat,
                s,
                &r,
                &a,
                &rule,
                t.switch.as_deref(),
                fleet,
                &progress,
            )
            .await?;
            all.extend(e);
            scanned += n;
            if let Some(p) = plan {
                let about = p.describe(s);
                if set.verbose {
                    eprintln!(
                        "stel-query: top{}: {}",
                        t.switch
                            .as_deref()
                            .map(|w| format!(" ({w})"))
                            .unwrap_or_default(),
                        p.verbose_line(s)
                    );
                }
                merge(&mut engine, json!({"tier": about["tier"]}));
            }
        }
        if scanned == 0 && !fleet {
            let (t, s) = found[0];
            return Err(t.cat.empty_window(s, &r).await);
        }
    }
    progress.finish();
    if scanned == 0 && a.by != By::Bursts {
        return Err(Error::NotFound(format!("no {group} samples in {r}")));
    }
    if a.per == Per::Switch {
        all = per_switch(all, a.by);
    }
    // Nothing dropped is the answer, not a ranking of zeros.
    let checked = all.len();
    if a.by == By::Drops {
        all.retain(|e| e.value > 0.0);
    }
    // Highest first; ties in switch, then object order, natural (the same on every engine).
    let nat = |a: &Option<String>, b: &Option<String>| {
        natural_cmp(a.as_deref().unwrap_or(""), b.as_deref().unwrap_or(""))
    };
    all.sort_by(|x, y| {
        y.value
            .total_cmp(&x.value)
            .then_with(|| nat(&x.switch, &y.switch))
            .then_with(|| natural_cmp(&x.object, &y.object))
    });
    let mut p = Printer::new(set.format);
    let about = json!({"command": "top", "by": format!("{:?}", a.by).to_lowercase(),
        "per": format!("{:?}", a.per).to_lowercase(), "profile": profile, "group": group,
        "from": fmt_ts(r.from_ns), "to": fmt_ts(r.to_ns), "engine": engine["engine"]});
    let mut header = vec!["RANK"];
    if fleet || a.per == Per::Switch {
        header.push("SWITCH");
    }
    let rate_table = a.by == By::Rate && is_rate_group(&group) && a.per == Per::Object;
    if rate_table {
        header.extend(["IFACE", "RX_BPS", "TX_BPS", "RX_UTIL", "TX_UTIL"]);
    } else {
        if a.per == Per::Object {
            header.push("OBJECT");
        }
        header.extend([
            match a.by {
                By::Rate => "BPS",
                By::Drops => "DROPS",
                By::Occupancy => "PEAK_BYTES",
                By::Bursts => "BURST_TIME",
            },
            "DETAIL",
        ]);
    }
    if a.by == By::Bursts && all.is_empty() {
        p.note(&format!(
            "No bursts in {r}: no interface direction stayed above {}% of its line rate for {} or longer.",
            a.rule.threshold,
            a.rule.min_duration
        ))?;
    }
    if a.by == By::Drops && all.is_empty() {
        p.note(&format!(
            "No drops in {r}: the drop counters (*DISCARDS, *DROPPED*) of {checked} {} did not move.",
            if a.per == Per::Switch { "switches" } else { "objects" }
        ))?;
    }
    p.set_units(&[
        ("RX_BPS", unit.name()),
        ("TX_BPS", unit.name()),
        ("BPS", unit.name()),
        ("RX_UTIL", "%"),
        ("TX_UTIL", "%"),
        ("DROPS", "packets"),
        ("PEAK_BYTES", "bytes"),
        ("BURST_TIME", "ns"),
    ]);
    p.begin(&header, about)?;
    for (i, e) in all.iter().take(a.top).enumerate() {
        let mut cells = vec![Cell::u64(i as u64 + 1)];
        if fleet || a.per == Per::Switch {
            cells.push(Cell::str(e.switch.clone().unwrap_or_default()));
        }
        if rate_table {
            let (x, sp) = e.rates.unwrap_or((Rates::default(), speed));
            cells.extend([
                Cell::str(e.object.clone()),
                bps(x.rx_bps),
                bps(x.tx_bps),
                Cell::opt_f64(Rates::util(x.rx_bps, Some(sp)), fmt_util),
                Cell::opt_f64(Rates::util(x.tx_bps, Some(sp)), fmt_util),
            ]);
        } else {
            if a.per == Per::Object {
                cells.push(Cell::str(e.object.clone()));
            }
            cells.push(match a.by {
                By::Rate => Cell::f64(unit.value(e.value), unit.format(e.value)),
                By::Bursts => Cell {
                    json: json!(e.value as i64),
                    text: human_ns(e.value as i64),
                },
                _ => Cell {
                    json: json!(e.value as u64),
                    text: thousands(e.value as u64),
                },
            });
            cells.push(Cell::str(fmt_detail(a.by, unit, &e.detail)));
        }
        p.row(cells)?;
    }
    let mut summary = json!({"rows": p.rows(), "ranked": all.len(), "checked": checked,
                     "snapshots_scanned": scanned, "elapsed_s": started.elapsed().as_secs_f64()});
    merge(&mut summary, engine);
    p.summary(summary)?;
    Ok(super::exit_for(p.rows()))
}
