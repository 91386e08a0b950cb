//! Rollup tiers (`store/ROLLUPS.md`) as sources of exact answers.
//!
//! A session's tiers are registered next to its raw table (`<table>_<tier>`, e.g.
//! `stel_demo_port_1m`, Hive column `date`). A question is planned as time [`Segment`]s, each
//! answered by one source: the coarsest tier that is exact for it (its interval divides the
//! asked resolution, it holds the figures asked, its burst rule is the asked one) where it
//! covers the window, raw where only raw does. Segment boundaries sit on bucket boundaries, so
//! every bucket comes from one source, and the bucket engine's consumers (rates, history, top,
//! bursts at a resolution) see the same [`Buckets`] whichever source filled them. Burst totals
//! compose through the segment monoid of `stel_store::rollup::burst::Seg`.

use std::collections::BTreeMap;

use arrow_array::{
    cast::AsArray,
    types::{TimestampNanosecondType, UInt64Type},
    Array, RecordBatch,
};
use arrow_schema::{DataType, SchemaRef};
use datafusion::{
    common::{Column as DfColumn, ScalarValue},
    logical_expr::{col, lit, Expr},
};
use futures::StreamExt;
use stel_store::{
    paths::UtcHour,
    rollup::burst::{above, Seg},
};

use crate::{
    catalog::{Catalog, Session},
    engine::{scan_buckets, Aggs, Buckets, Grid, Progress, MAX_CELLS},
    error::{Error, Result},
    window::{fmt_ts, TimeRange},
};

/// One tier of a session, registered as its own table.
#[derive(Debug, Clone)]
pub struct Tier {
    /// `1s`, `1m`.
    pub name: String,
    pub interval_ns: i64,
    /// SQL table name (`<session table>_<tier>`).
    pub table: String,
    /// Root-relative directory `tier=<t>/profile=<p>/group=<g>`.
    pub dir: String,
    pub schema: SchemaRef,
    /// The burst rule its files were written with.
    pub speed_mbps: Option<f64>,
    pub thresholds: Vec<f64>,
    /// First interval start and last interval end with data.
    pub extent: Option<(i64, i64)>,
    /// First snapshot and last snapshot + 1 ns the tier summarises (`first_ts`, `last_ts`):
    /// where its data really starts and ends inside its first and last intervals.
    pub samples: Option<(i64, i64)>,
}

impl Tier {
    /// Whether the tier has column `name`.
    pub fn has(&self, name: &str) -> bool {
        self.schema.field_with_name(name).is_ok()
    }

    /// `T` as its burst columns spell it (`90`, `92_5`).
    fn thr_label(t: f64) -> String {
        stel_store::rollup::config::threshold_label(t)
    }
}

/// The burst rule (speed Mb/s, thresholds %) in the footer of the newest file under `dir` (a
/// tier's directory, any depth) of `loc`.
pub async fn tier_rule_at(loc: &crate::catalog::Location, dir: &str) -> (Option<f64>, Vec<f64>) {
    use datafusion::parquet::file::metadata::ParquetMetaDataReader;
    use object_store::ObjectStoreExt;
    let store = std::sync::Arc::clone(&loc.store);
    let prefix = loc.path(dir);
    let Ok(list) = futures::TryStreamExt::try_collect::<Vec<_>>(store.list(Some(&prefix))).await
    else {
        return (None, Vec::new());
    };
    let Some(meta) = list
        .into_iter()
        .filter(|m| {
            m.location
                .filename()
                .is_some_and(|f| f.starts_with("part-"))
        })
        .max_by(|a, b| a.location.cmp(&b.location))
    else {
        return (None, Vec::new());
    };
    // The footer: its length in the last 8 bytes, then the metadata before them.
    let size = meta.size;
    let Ok(tail) = store
        .get_range(&meta.location, size.saturating_sub(8)..size)
        .await
    else {
        return (None, Vec::new());
    };
    let len = tail
        .get(..4)
        .and_then(|b| <[u8; 4]>::try_from(b).ok())
        .map_or(0, |b| u64::from(u32::from_le_bytes(b)));
    let Some(start) = size.checked_sub(8 + len) else {
        return (None, Vec::new());
    };
    let Ok(bytes) = store.get_range(&meta.location, start..size - 8).await else {
        return (None, Vec::new());
    };
    let Ok(md) = ParquetMetaDataReader::decode_metadata(&bytes) else {
        return (None, Vec::new());
    };
    let kv = md.file_metadata().key_value_metadata();
    let get = |k: &str| {
        kv.and_then(|kvs| kvs.iter().find(|x| x.key == k))
            .and_then(|x| x.value.clone())
    };
    let speed = get(stel_store::rollup::writer::keys::SPEED_MBPS).and_then(|s| s.parse().ok());
    let thr = get(stel_store::rollup::writer::keys::THRESHOLDS)
        .map(|s| {
            s.split(',')
                .filter_map(|x| x.trim().parse::<f64>().ok())
                .collect()
        })
        .unwrap_or_default();
    (speed, thr)
}

/// Registers the tiers of session `pdir`/`gdir` (escaped directory values) of a data dir
/// (`tier=<t>/profile=…/group=…` under the catalog's root), tables named after `table`.
///
/// # Errors
/// Listing and engine failures; with --strict, a bad file.
pub async fn discover(cat: &Catalog, pdir: &str, gdir: &str, table: &str) -> Result<Vec<Tier>> {
    let loc = &cat.location;
    let names = loc.subdirs_pub("", "tier").await?;
    discover_in(cat, loc, "", &names, "", pdir, gdir, table).await
}

/// Registers the tiers of session `pdir`/`gdir` of switch `sw` (escaped) of the lake at `lake`
/// (`_tiers/tier=<t>/switch=<sw>/profile=…/group=…`, `store/LAKE.md`), into `cat` (that switch's
/// catalog, whose store is the lake's).
///
/// # Errors
/// As [`discover`].
pub async fn discover_lake(
    cat: &Catalog,
    lake: &crate::catalog::Location,
    sw: &str,
    pdir: &str,
    gdir: &str,
    table: &str,
) -> Result<Vec<Tier>> {
    let dir = stel_store::paths::TIERS_DIR;
    let names = lake.subdirs_pub(dir, "tier").await?;
    discover_in(
        cat,
        lake,
        &format!("{dir}/"),
        &names,
        &format!("switch={sw}/"),
        pdir,
        gdir,
        table,
    )
    .await
}

#[expect(clippy::too_many_arguments, reason = "both layouts, spelled out")]
async fn discover_in(
    cat: &Catalog,
    loc: &crate::catalog::Location,
    above: &str,
    names: &[String],
    below: &str,
    pdir: &str,
    gdir: &str,
    table: &str,
) -> Result<Vec<Tier>> {
    let mut out = Vec::new();
    for t in names {
        let name = stel_store::paths::unescape_value(t).unwrap_or_else(|| t.clone());
        let Ok(interval_ns) = crate::window::parse_duration_ns(&name) else {
            continue;
        };
        let groups = loc
            .subdirs_pub(&format!("{above}tier={t}/{below}profile={pdir}"), "group")
            .await?;
        if !groups.iter().any(|g| g == gdir) {
            continue;
        }
        let dir = format!("{above}tier={t}/{below}profile={pdir}/group={gdir}");
        let tname = format!("{table}_{}", name.to_ascii_lowercase());
        let url = format!("{}{}/", loc.url, dir.replace('%', "%25"));
        let Some(schema) = cat
            .register_listing_url(
                &tname,
                &url,
                &["date"],
                crate::quarantine::Shape::Timestamped,
            )
            .await?
        else {
            continue;
        };
        let (speed_mbps, thresholds) = tier_rule_at(loc, &dir).await;
        let mut tier = Tier {
            name,
            interval_ns,
            table: tname,
            dir,
            schema,
            speed_mbps,
            thresholds,
            extent: None,
            samples: None,
        };
        (tier.extent, tier.samples) = tier_extent(cat, &tier).await?;
        out.push(tier);
    }
    // Coarsest first: the order sources are tried in.
    out.sort_by_key(|t| std::cmp::Reverse(t.interval_ns));
    Ok(out)
}

/// First interval start and last interval end of a tier, and the first and last snapshot + 1 ns
/// it summarises (statistics; cheap).
async fn tier_extent(cat: &Catalog, t: &Tier) -> Result<(Option<(i64, i64)>, Option<(i64, i64)>)> {
    let df = cat
        .ctx
        .sql(&format!(
            "SELECT CAST(min(ts) AS BIGINT), CAST(max(ts) AS BIGINT), \
             CAST(min(first_ts) AS BIGINT), CAST(max(last_ts) AS BIGINT) FROM \"{}\"",
            t.table
        ))
        .await?;
    let batches = df.collect().await?;
    let Some(b) = batches.first().filter(|b| b.num_rows() > 0) else {
        return Ok((None, None));
    };
    let get = |i: usize| {
        b.column(i)
            .as_any()
            .downcast_ref::<arrow_array::Int64Array>()
            .and_then(|a| (!a.is_null(0)).then(|| a.value(0)))
    };
    let extent = get(0).zip(get(1)).map(|(a, z)| (a, z + t.interval_ns));
    let samples = get(2).zip(get(3)).map(|(a, z)| (a, z + 1));
    Ok((extent, samples.or(extent)))
}

/// Where a segment's answer comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Raw,
    /// Index into the session's tiers.
    Tier(usize),
}

/// A part of the window answered by one source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    pub source: Source,
    pub range: TimeRange,
}

/// What a question needs from a source.
#[derive(Debug, Clone, Default)]
pub struct Need {
    /// Bucket width; `None`: the whole window as one bucket.
    pub width: Option<i64>,
    /// Min/max/sum/count per bucket (levels only: a tier has them for levels).
    pub stats: bool,
    /// Stats of cumulative counters (min/max/avg of a counter): only raw has them.
    pub counter_stats: bool,
    /// Burst figures at (speed Mb/s, threshold %, min duration ns).
    pub bursts: Option<(f64, f64, i64)>,
    /// The answer needs every snapshot (stream resolution): raw only.
    pub stream: bool,
}

/// A planned question: its segments, the window actually answered (the asked one, its start
/// moved to the first whole interval when only a tier holds it) and what a summary says.
#[derive(Debug, Clone, Default)]
pub struct Planned {
    pub segments: Vec<Segment>,
    pub range: TimeRange,
    /// The raw files' first and last snapshot the plan was made with (`None`: no raw data).
    pub raw: Option<(i64, i64)>,
}

impl Planned {
    /// `raw`, `1m`, or `1m+1s+raw` — the sources in time order.
    pub fn sources(&self, s: &Session) -> String {
        let mut v: Vec<String> = Vec::new();
        for g in &self.segments {
            let n = match g.source {
                Source::Raw => "raw".to_string(),
                Source::Tier(i) => s.tiers[i].name.clone(),
            };
            if v.last() != Some(&n) {
                v.push(n);
            }
        }
        if v.is_empty() {
            "raw".into()
        } else {
            v.join("+")
        }
    }

    /// `--verbose`: `1m 2024-05-01T00:00:00Z..…, raw …` (each part's source and range).
    pub fn verbose_line(&self, s: &Session) -> String {
        self.segments
            .iter()
            .map(|g| {
                let n = match g.source {
                    Source::Raw => "raw",
                    Source::Tier(i) => s.tiers[i].name.as_str(),
                };
                format!("{n} {}..{}", fmt_ts(g.range.from_ns), fmt_ts(g.range.to_ns))
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The summary's `tier` field and segments: per segment, source and range.
    pub fn describe(&self, s: &Session) -> serde_json::Value {
        serde_json::json!({
            "tier": self.sources(s),
            "segments": self.segments.iter().map(|g| serde_json::json!({
                "source": match g.source { Source::Raw => "raw".to_string(), Source::Tier(i) => s.tiers[i].name.clone() },
                "from": fmt_ts(g.range.from_ns), "to": fmt_ts(g.range.to_ns),
            })).collect::<Vec<_>>(),
        })
    }
}

fn floor_to(t: i64, w: i64) -> i64 {
    t.div_euclid(w) * w
}

fn ceil_to(t: i64, w: i64) -> i64 {
    -((-t).div_euclid(w) * w)
}

/// The raw extent `raw` (first, last snapshot) as a range when it lies wholly inside `r` (then
/// it is the raw data in `r`, no query needed).
fn within(raw: Option<(i64, i64)>, r: &TimeRange) -> Option<TimeRange> {
    raw.filter(|(a, b)| *a >= r.from_ns && *b < r.to_ns)
        .map(|(a, b)| TimeRange {
            from_ns: a,
            to_ns: b + 1,
        })
}

/// `r` narrowed to the session's data in it, raw files and tiers together (the tiers' part from
/// their first to their last summarised snapshot); `None` when neither has data there. `raw`
/// is the raw files' extent ([`Catalog::raw_extent`]): no raw data, or all of it inside `r`,
/// needs no query.
///
/// # Errors
/// Engine failures.
pub async fn clamp_to_data(
    cat: &Catalog,
    s: &Session,
    r: &TimeRange,
    raw: Option<(i64, i64)>,
) -> Result<Option<TimeRange>> {
    let mut e = match raw {
        None => None,
        Some(x) => match within(Some(x), r) {
            Some(_) => Some(x),
            None => cat.extent_in(s, r).await?,
        },
    };
    for t in &s.tiers {
        if let Some((a, b)) = t.samples {
            let (a, b) = (a.max(r.from_ns), b.min(r.to_ns));
            if a < b {
                e = Some(e.map_or((a, b - 1), |(x, y)| (x.min(a), y.max(b - 1))));
            }
        }
    }
    let Some((first, last)) = e else {
        return Ok(None);
    };
    let c = TimeRange {
        from_ns: r.from_ns.max(first),
        to_ns: r.to_ns.min(last.saturating_add(1)),
    };
    Ok((c.to_ns > c.from_ns).then_some(c))
}

/// Whether tier `t` can answer `need` (its figures, its rule), ignoring coverage.
fn eligible(t: &Tier, need: &Need) -> bool {
    if need.stream || need.counter_stats {
        return false;
    }
    if let Some(w) = need.width {
        if w % t.interval_ns != 0 {
            return false;
        }
    }
    if let Some((speed, thr, _)) = need.bursts {
        let label = Tier::thr_label(thr);
        if t.speed_mbps != Some(speed) || !t.has(&format!("rx_above{label}_ns")) {
            return false;
        }
    }
    true
}

/// Plans `r` for `s` (`raw`: the raw table's extent, `None` when it has no data).
///
/// # Errors
/// Part of the window is held only by sources that cannot answer it exactly: the message says
/// what exists ("raw kept from …; the finest tier there is 1m").
pub fn plan(s: &Session, raw: Option<(i64, i64)>, r: &TimeRange, need: &Need) -> Result<Planned> {
    let raw_cov = raw.map(|(a, b)| (a, b + 1));
    let covers = |src: Source, t: i64| -> Option<i64> {
        match src {
            Source::Raw => raw_cov.filter(|(a, b)| *a <= t && t < *b).map(|c| c.1),
            // A tier answers whole intervals inside the window only.
            Source::Tier(i) => {
                let iv = s.tiers[i].interval_ns;
                s.tiers[i].extent.and_then(|(a, b)| {
                    let e = b.min(floor_to(r.to_ns, iv));
                    (a <= t && t < e && t % iv == 0).then_some(e)
                })
            }
        }
    };
    let mut sources: Vec<Source> = (0..s.tiers.len())
        .filter(|&i| eligible(&s.tiers[i], need))
        .map(Source::Tier)
        .collect();
    if s.raw {
        sources.push(Source::Raw);
    }
    // Segment ends sit on bucket boundaries (whole window: on the coarsest tier's intervals).
    let step = need.width.unwrap_or(1);
    let mut segs: Vec<Segment> = Vec::new();
    let mut range = *r;
    let mut t = r.from_ns;
    while t < r.to_ns {
        let pick = sources
            .iter()
            .find_map(|&src| covers(src, t).map(|end| (src, end)));
        match pick {
            Some((src, end)) => {
                let mut e = end.min(r.to_ns);
                if e < r.to_ns && src != Source::Raw {
                    let a = floor_to(e, step);
                    if a > t {
                        e = a;
                    }
                }
                if let Some(last) = segs
                    .last_mut()
                    .filter(|l| l.source == src && l.range.to_ns == t)
                {
                    last.range.to_ns = e;
                } else {
                    segs.push(Segment {
                        source: src,
                        range: TimeRange {
                            from_ns: t,
                            to_ns: e,
                        },
                    });
                }
                t = e;
            }
            None => {
                // The window's start inside a tier's interval: start at the next whole one.
                let starts: Vec<i64> = sources
                    .iter()
                    .filter_map(|&src| match src {
                        Source::Tier(i) => {
                            let iv = s.tiers[i].interval_ns.max(step);
                            s.tiers[i].extent.and_then(|(a, b)| {
                                let c = ceil_to(t.max(a), iv);
                                (c < b).then_some(c)
                            })
                        }
                        Source::Raw => raw_cov.and_then(|(a, b)| (t < b).then_some(a.max(t))),
                    })
                    .filter(|c| *c > t)
                    .collect();
                // A tier holds snapshots at t but cannot answer it: say what exists.
                let held = s
                    .tiers
                    .iter()
                    .filter(|x| x.samples.is_some_and(|(a, b)| a <= t && t < b))
                    .min_by_key(|x| x.interval_ns);
                if let Some(h) = held.filter(|h| {
                    !sources.contains(&Source::Tier(
                        s.tiers.iter().position(|x| x.name == h.name).unwrap_or(0),
                    )) || need.stream
                }) {
                    return Err(not_held(s, raw, t, h, need));
                }
                match starts.into_iter().min() {
                    Some(next) if next < r.to_ns => {
                        if segs.is_empty() {
                            range.from_ns = next;
                        }
                        t = next;
                    }
                    _ => break,
                }
            }
        }
    }
    if let Some(l) = segs.last() {
        range.to_ns = range.to_ns.min(l.range.to_ns.max(range.from_ns));
    }
    Ok(Planned {
        segments: segs,
        range,
        raw,
    })
}

/// The error for a time only `held` (a tier that cannot answer) holds.
fn not_held(s: &Session, raw: Option<(i64, i64)>, t: i64, held: &Tier, need: &Need) -> Error {
    let raw_part = match raw {
        Some((a, b)) => format!("raw kept {}..{}", fmt_ts(a), fmt_ts(b)),
        None => "no raw history".into(),
    };
    let what = if need.stream {
        "every snapshot (stream resolution)".to_string()
    } else if need.counter_stats {
        "min/max/avg of cumulative counters".to_string()
    } else if let Some((speed, thr, _)) = need.bursts {
        format!("bursts at {thr}% of {speed} Mb/s")
    } else {
        format!(
            "resolution {}",
            need.width
                .map_or("whole window".into(), crate::output::human_ns)
        )
    };
    Error::NotFound(format!(
        "{}/{} at {}: {what} needs raw history or a finer tier; {raw_part}; the finest tier there is {} (tiers: {}{})",
        s.profile,
        s.group,
        fmt_ts(t),
        held.name,
        s.tiers
            .iter()
            .map(|x| match x.extent {
                Some((a, b)) => format!("{} {}..{}", x.name, fmt_ts(a), fmt_ts(b)),
                None => x.name.clone(),
            })
            .collect::<Vec<_>>()
            .join(", "),
        match (need.bursts, held.speed_mbps) {
            (Some((speed, thr, _)), Some(ts)) => format!(
                "; its bursts are at {} % of {ts} Mb/s, asked {thr} % of {speed}",
                held.thresholds
                    .iter()
                    .map(f64::to_string)
                    .collect::<Vec<_>>()
                    .join("/")
            ),
            _ => String::new(),
        }
    ))
}

/// `date` and `ts` predicates of a tier table for `[from, to)`.
fn tier_filter(r: &TimeRange) -> Expr {
    let ts = |ns: i64| {
        lit(ScalarValue::TimestampNanosecond(
            Some(ns),
            Some("UTC".into()),
        ))
    };
    col("date")
        .gt_eq(lit(UtcHour::of_ns(r.from_ns).date_value()))
        .and(col("date").lt_eq(lit(UtcHour::of_ns(r.to_ns - 1).date_value())))
        .and(col("ts").gt_eq(ts(r.from_ns)))
        .and(col("ts").lt(ts(r.to_ns)))
}

/// A string column as plain Utf8 (the engine may hand it back as a view or a dictionary).
fn utf8(a: &arrow_array::ArrayRef) -> Result<arrow_array::ArrayRef> {
    Ok(datafusion::arrow::compute::cast(a, &DataType::Utf8)?)
}

fn qcol(n: &str) -> Expr {
    Expr::Column(DfColumn::new_unqualified(n))
}

/// One requested wide column (`<object>.<STAT>`) as the tier holds it.
#[derive(Debug, Clone)]
struct Want {
    object: String,
    stat: String,
}

/// Where a wanted column's figures are in a tier scan's projection.
#[derive(Debug, Clone, Copy)]
struct Positions {
    last: Option<usize>,
    first: Option<usize>,
    min: Option<usize>,
    max: Option<usize>,
    sum: Option<usize>,
    count: Option<usize>,
}

/// Fills `each` with bucket chunks of tier `t` over `r` (aligned to the tier and to `grid`),
/// the same [`Buckets`] the raw scan gives for these columns: `last` from `<STAT>.last` at
/// `last_ts`, the window's first row from `first_ts`/`<STAT>.first`, min/max/sum/count from the
/// level columns. Returns the snapshots the rows stand for.
#[expect(clippy::too_many_arguments, reason = "the resolved scan, spelled out")]
async fn tier_buckets(
    cat: &Catalog,
    s: &Session,
    t: &Tier,
    columns: &[String],
    r: &TimeRange,
    width: Option<i64>,
    aggs: Aggs,
    progress: &Progress,
    each: &mut dyn FnMut(&Buckets) -> Result<()>,
) -> Result<u64> {
    let wants: Vec<Want> = columns
        .iter()
        .map(|n| {
            let c = s
                .columns
                .iter()
                .find(|c| c.name == *n)
                .ok_or_else(|| Error::NotFound(format!("no column {n}")))?;
            Ok(Want {
                object: c.object.clone(),
                stat: c.stat.clone(),
            })
        })
        .collect::<Result<_>>()?;
    let mut stats: Vec<String> = wants.iter().map(|w| w.stat.clone()).collect();
    stats.sort();
    stats.dedup();
    let mut proj = vec![
        qcol("ts"),
        qcol("object"),
        qcol("first_ts"),
        qcol("last_ts"),
        qcol("samples"),
    ];
    let mut names = Vec::new();
    for st in &stats {
        let mut aggs_of = vec!["first", "last"];
        if aggs.stats {
            aggs_of.extend(["min", "max", "sum", "count"]);
        }
        for a in aggs_of {
            let n = format!("{st}.{a}");
            if t.has(&n) {
                proj.push(qcol(&n));
                names.push(n);
            }
        }
    }
    // Column index in the projection by (stat, agg), per wanted column, looked up once.
    let pos = |st: &str, a: &str| {
        let n = format!("{st}.{a}");
        names.iter().position(|x| *x == n).map(|p| p + 5)
    };
    let at: Vec<Positions> = wants
        .iter()
        .map(|w| {
            let st = w.stat.as_str();
            Positions {
                last: pos(st, "last"),
                first: pos(st, "first"),
                min: pos(st, "min"),
                max: pos(st, "max"),
                sum: pos(st, "sum"),
                count: pos(st, "count"),
            }
        })
        .collect();
    let objects: Vec<Expr> = {
        let mut o: Vec<String> = wants.iter().map(|w| w.object.clone()).collect();
        o.sort();
        o.dedup();
        o.into_iter().map(lit).collect()
    };
    // Columns per object.
    let mut by_obj: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (c, w) in wants.iter().enumerate() {
        by_obj.entry(w.object.clone()).or_default().push(c);
    }
    let grid = Grid::new(r, width);
    let ncols = columns.len();
    let per_chunk = (MAX_CELLS / ncols.max(1)).max(1);
    let mut scanned = 0u64;
    let mut i0 = 0;
    while i0 < grid.n {
        let n = per_chunk.min(grid.n - i0);
        let origin = grid.origin_ns + i0 as i64 * grid.width_ns;
        let cr = TimeRange {
            from_ns: origin.max(r.from_ns),
            to_ns: (origin + n as i64 * grid.width_ns).min(r.to_ns),
        };
        let mut b = Buckets::new(origin, grid.width_ns, n, ncols, aggs);
        let df = cat
            .ctx
            .table(t.table.as_str())
            .await?
            .filter(tier_filter(&cr).and(col("object").in_list(objects.clone(), false)))?
            .select(proj.clone())?;
        let mut stream = df.execute_stream().await?;
        // Rows of an interval count once (every object's row says the same samples).
        let mut counted: std::collections::HashSet<i64> = std::collections::HashSet::new();
        let mut chunk_rows = 0u64;
        let mut first: Option<(i64, Vec<u64>, Vec<bool>)> = None;
        while let Some(batch) = stream.next().await {
            let batch: RecordBatch = batch?;
            let ts = batch.column(0).as_primitive::<TimestampNanosecondType>();
            let obj = utf8(batch.column(1))?;
            let obj = obj.as_string::<i32>();
            let fts = batch.column(2).as_primitive::<TimestampNanosecondType>();
            let lts = batch.column(3).as_primitive::<TimestampNanosecondType>();
            let samples = batch.column(4).as_primitive::<UInt64Type>();
            let u = |name_pos: Option<usize>| {
                name_pos.map(|p| batch.column(p).as_primitive::<UInt64Type>())
            };
            for row in 0..batch.num_rows() {
                let start = ts.value(row);
                let i = ((start - origin) / grid.width_ns) as usize;
                if i >= n {
                    continue;
                }
                if counted.insert(start) {
                    chunk_rows += samples.value(row);
                }
                let Some(cols) = by_obj.get(obj.value(row)) else {
                    continue;
                };
                let last_ts = lts.value(row);
                let first_ts = fts.value(row);
                if first.as_ref().is_none_or(|(f, _, _)| first_ts < *f) {
                    first = Some((first_ts, vec![0; ncols], vec![false; ncols]));
                }
                for &c in cols {
                    let at = &at[c];
                    let k = i * ncols + c;
                    if last_ts >= b.last_ts[i] {
                        match u(at.last) {
                            Some(a) if a.is_valid(row) => {
                                b.last[k] = a.value(row);
                                b.valid[k] = true;
                            }
                            _ => b.valid[k] = false,
                        }
                    }
                    // The window's first row (a level has no `first`: it is read as
                    // min/max/avg/last, never from the first row).
                    if let Some((f, v, ok)) = first.as_mut().filter(|x| x.0 == first_ts) {
                        let _ = f;
                        if let Some(a) = u(at.first) {
                            ok[c] = a.is_valid(row);
                            v[c] = a.value(row);
                        }
                    }
                    if aggs.stats && at.count.is_none() {
                        // A counter: the tier has its last value only (the plan let it answer
                        // because nothing else of it is asked); count it as present.
                        b.count[k] += u64::from(b.valid[k]);
                    }
                    if aggs.stats {
                        if let (Some(mn), Some(mx), Some(sm), Some(ct)) =
                            (u(at.min), u(at.max), u(at.sum), u(at.count))
                        {
                            if ct.is_valid(row) && ct.value(row) > 0 {
                                b.min[k] = b.min[k].min(mn.value(row));
                                b.max[k] = b.max[k].max(mx.value(row));
                                b.sum[k] += sm.value(row) as f64;
                                b.count[k] += ct.value(row);
                            }
                        }
                    }
                }
                // Every object of an interval shares its last snapshot time.
                b.last_ts[i] = b.last_ts[i].max(last_ts);
            }
        }
        b.first = first;
        b.rows = chunk_rows;
        scanned += chunk_rows;
        progress.inc(chunk_rows);
        each(&b)?;
        i0 += n;
    }
    Ok(scanned)
}

/// Scans `columns` of `s` as `plan` says, calling `each` with bucket chunks in time order
/// (width `width`; `None`: one bucket per segment). Returns snapshots scanned.
///
/// # Errors
/// Engine failures, or what `each` returns.
#[expect(clippy::too_many_arguments, reason = "the resolved scan, spelled out")]
pub async fn scan(
    cat: &Catalog,
    s: &Session,
    columns: &[String],
    plan: &Planned,
    width: Option<i64>,
    aggs: Aggs,
    progress: &Progress,
    mut each: impl FnMut(&Buckets) -> Result<()>,
) -> Result<u64> {
    let mut rows = 0;
    for g in &plan.segments {
        rows += match g.source {
            Source::Raw => {
                raw_buckets(
                    cat, s, columns, &g.range, plan.raw, width, aggs, progress, &mut each,
                )
                .await?
            }
            Source::Tier(i) => {
                tier_buckets(
                    cat,
                    s,
                    &s.tiers[i],
                    columns,
                    &g.range,
                    width,
                    aggs,
                    progress,
                    &mut each,
                )
                .await?
            }
        };
    }
    Ok(rows)
}

/// A raw segment's buckets at `width` (`None`: one bucket over the segment). A grid of fixed
/// width covers only the raw data inside the segment (first to last snapshot there): a
/// stream-width grid over a long segment of sparse data (a fleet's one-hour window over a
/// switch that sent a few ms) would otherwise plan and walk every empty chunk of it. Buckets
/// keep their alignment (multiples of the width since the epoch) and only empty ones are left
/// out. `raw` is the raw files' extent: a segment holding all of it needs no query to find its
/// data.
#[expect(clippy::too_many_arguments, reason = "scan_buckets' arguments")]
async fn raw_buckets(
    cat: &Catalog,
    s: &Session,
    columns: &[String],
    range: &TimeRange,
    raw: Option<(i64, i64)>,
    width: Option<i64>,
    aggs: Aggs,
    progress: &Progress,
    each: impl FnMut(&Buckets) -> Result<()>,
) -> Result<u64> {
    let narrowed;
    let range = match width {
        Some(_) => match within(raw, range) {
            Some(c) => {
                narrowed = c;
                &narrowed
            }
            None => match crate::engine::clamp_to_data(cat, s, range).await? {
                Some(c) => {
                    narrowed = c;
                    &narrowed
                }
                None => return Ok(0),
            },
        },
        None => range,
    };
    let grid = Grid::new(range, width);
    scan_buckets(cat, s, columns, range, grid, aggs, progress, each).await
}

/// Merges whole-segment buckets (one bucket each, in time order) into one bucket over the
/// window: the first row of the first, the last of the last, stats combined.
pub fn merge_whole(parts: Vec<Buckets>, aggs: Aggs) -> Option<Buckets> {
    let mut it = parts.into_iter();
    let mut acc = it.next()?;
    for b in it {
        acc.rows += b.rows;
        if acc.first.is_none() {
            acc.first = b.first.clone();
        }
        if b.last_ts[0] > acc.last_ts[0] {
            acc.last_ts[0] = b.last_ts[0];
            acc.last.copy_from_slice(&b.last);
            acc.valid.copy_from_slice(&b.valid);
        }
        if aggs.stats {
            for k in 0..acc.min.len() {
                acc.min[k] = acc.min[k].min(b.min[k]);
                acc.max[k] = acc.max[k].max(b.max[k]);
                acc.sum[k] += b.sum[k];
                acc.count[k] += b.count[k];
            }
        }
    }
    Some(acc)
}

/// Burst totals per series over `plan` (tiers: their stored figures composed; raw: every
/// delta), exactly what `stel-query bursts` finds on the raw files of the window when
/// `--min-duration` is no longer than one snapshot interval. Returns one [`Seg`] per series
/// and the snapshots scanned.
///
/// # Errors
/// Engine failures; a raw segment after a tier segment whose joining snapshot is missing.
#[expect(
    clippy::too_many_arguments,
    reason = "the resolved question, spelled out"
)]
pub async fn burst_totals(
    cat: &Catalog,
    s: &Session,
    plan: &Planned,
    series: &[(String, usize, String)],
    speed_mbps: f64,
    threshold: f64,
    stream_ns: Option<i64>,
    progress: &Progress,
) -> Result<(Vec<Seg>, u64)> {
    let bytes_per_s = speed_mbps * 1e6 / 8.0;
    let label = Tier::thr_label(threshold);
    let mut segs = vec![Seg::default(); series.len()];
    // Per series: whether its window has begun (the first row's entry is not in the window),
    // and the last snapshot (time, octets) seen, for a raw segment that follows.
    let mut begun = vec![false; series.len()];
    let mut prev: Vec<Option<(i64, u64)>> = vec![None; series.len()];
    let mut scanned = 0u64;
    for g in &plan.segments {
        match g.source {
            Source::Tier(i) => {
                let t = &s.tiers[i];
                let dirs = ["rx", "tx"];
                let mut proj = vec![qcol("ts"), qcol("object"), qcol("last_ts"), qcol("samples")];
                for d in dirs {
                    for n in [
                        format!("{d}_deltas"),
                        format!("{d}_entry_ns"),
                        format!("{d}_above{label}_ns"),
                        format!("{d}_bursts{label}"),
                        format!("{d}_head{label}_ns"),
                        format!("{d}_tail{label}_ns"),
                        format!("{d}_longest{label}_ns"),
                        format!("{d}_entry{label}_ns"),
                    ] {
                        proj.push(qcol(&n));
                    }
                }
                for (_, _, stat) in series {
                    let n = format!("{stat}.last");
                    if !proj.iter().any(|e| e == &qcol(&n)) && t.has(&n) {
                        proj.push(qcol(&n));
                    }
                }
                let df = cat
                    .ctx
                    .table(t.table.as_str())
                    .await?
                    .filter(tier_filter(&g.range))?
                    .select(proj)?
                    .sort(vec![col("ts").sort(true, false)])?;
                let batches = df.collect().await?;
                let mut counted = std::collections::HashSet::new();
                // The series of each object (a row is one object's interval).
                let mut of_object: std::collections::HashMap<&str, Vec<usize>> =
                    std::collections::HashMap::new();
                for (k, (object, _, _)) in series.iter().enumerate() {
                    of_object.entry(object.as_str()).or_default().push(k);
                }
                // Per direction, the figures' column names; per series, its counter's `.last`.
                let figures: Vec<[String; 8]> = dirs
                    .iter()
                    .map(|d| {
                        [
                            format!("{d}_deltas"),
                            format!("{d}_above{label}_ns"),
                            format!("{d}_bursts{label}"),
                            format!("{d}_head{label}_ns"),
                            format!("{d}_tail{label}_ns"),
                            format!("{d}_longest{label}_ns"),
                            format!("{d}_entry_ns"),
                            format!("{d}_entry{label}_ns"),
                        ]
                    })
                    .collect();
                let lasts: Vec<String> = series
                    .iter()
                    .map(|(_, _, stat)| format!("{stat}.last"))
                    .collect();
                for b in &batches {
                    let ts = b.column(0).as_primitive::<TimestampNanosecondType>();
                    let obj = utf8(b.column(1))?;
                    let obj = obj.as_string::<i32>();
                    let lts = b.column(2).as_primitive::<TimestampNanosecondType>();
                    let samples = b.column(3).as_primitive::<UInt64Type>();
                    let u = |n: &str| b.column_by_name(n).map(|c| c.as_primitive::<UInt64Type>());
                    let cols: Vec<[Option<&arrow_array::UInt64Array>; 8]> = figures
                        .iter()
                        .map(|f| std::array::from_fn(|j| u(&f[j])))
                        .collect();
                    let last_cols: Vec<Option<&arrow_array::UInt64Array>> =
                        lasts.iter().map(|n| u(n)).collect();
                    for row in 0..b.num_rows() {
                        if counted.insert(ts.value(row)) {
                            scanned += samples.value(row);
                        }
                        let Some(ks) = of_object.get(obj.value(row)) else {
                            continue;
                        };
                        let get = |a: Option<&arrow_array::UInt64Array>| {
                            a.filter(|a| a.is_valid(row)).map(|a| a.value(row))
                        };
                        for &k in ks {
                            let c = &cols[series[k].1];
                            let Some(n) = get(c[0]) else {
                                continue;
                            };
                            let inner = Seg::from_parts(
                                n,
                                get(c[1]).unwrap_or(0),
                                get(c[2]).unwrap_or(0),
                                get(c[3]).unwrap_or(0),
                                get(c[4]).unwrap_or(0),
                                get(c[5]).unwrap_or(0),
                            );
                            if begun[k] {
                                let e = get(c[6]).unwrap_or(0);
                                if e > 0 {
                                    let a = get(c[7]).unwrap_or(0) > 0;
                                    segs[k] = segs[k].then(Seg::one(e, a));
                                }
                            }
                            segs[k] = segs[k].then(inner);
                            begun[k] = true;
                            prev[k] = get(last_cols[k]).map(|v| (lts.value(row), v));
                        }
                    }
                }
            }
            Source::Raw => {
                let Some(w) = stream_ns else {
                    return Err(Error::Usage(
                        "burst totals from raw history need the stream interval".into(),
                    ));
                };
                let cols: Vec<String> = series
                    .iter()
                    .map(|(o, _, stat)| format!("{o}.{stat}"))
                    .collect();
                scanned += raw_buckets(
                    cat,
                    s,
                    &cols,
                    &g.range,
                    plan.raw,
                    Some(w),
                    Aggs::default(),
                    progress,
                    |b| {
                        for i in 0..b.n {
                            let t = b.last_ts[i];
                            if t == i64::MIN {
                                continue;
                            }
                            for k in 0..series.len() {
                                let Some(v) = b.last(i, k) else { continue };
                                let Some((pt, pv)) = prev[k].replace((t, v)) else {
                                    continue;
                                };
                                if t <= pt {
                                    continue;
                                }
                                let a = v >= pv && above(v - pv, t - pt, bytes_per_s, threshold);
                                segs[k] = segs[k].then(Seg::one((t - pt) as u64, a));
                            }
                        }
                        Ok(())
                    },
                )
                .await?;
            }
        }
    }
    Ok((segs, scanned))
}

/// The smallest gap between snapshots over the tier rows of `plan` (every burst lasts at least
/// that long), `None` when no tier segment has one.
///
/// # Errors
/// Engine failures.
pub async fn min_dt(cat: &Catalog, s: &Session, plan: &Planned) -> Result<Option<i64>> {
    let mut out: Option<i64> = None;
    for g in &plan.segments {
        let Source::Tier(i) = g.source else { continue };
        let t = &s.tiers[i];
        use datafusion::functions_aggregate::expr_fn::min;
        let df = cat
            .ctx
            .table(t.table.as_str())
            .await?
            .filter(tier_filter(&g.range))?
            .aggregate(
                vec![],
                vec![min(datafusion::logical_expr::cast(
                    qcol("min_dt_ns"),
                    DataType::Int64,
                ))
                .alias("m")],
            )?;
        for b in df.collect().await? {
            if let Some(a) = b
                .column(0)
                .as_any()
                .downcast_ref::<arrow_array::Int64Array>()
            {
                if !a.is_empty() && a.is_valid(0) {
                    let v = a.value(0);
                    out = Some(out.map_or(v, |o| o.min(v)));
                }
            }
        }
    }
    Ok(out)
}
