//! `stel-query inspect <profile>`: the profile's live counters for a duration.
//!
//! The daemon has no live query endpoint (yet), so this tails what it publishes: every
//! `--every` it lists the newest hour partitions of each of the profile's groups, reads the last
//! snapshot of every Parquet file that appeared (files are published by an atomic rename, so a
//! listed file is complete), and prints each counter's value and its rate since the previous
//! snapshot. Freshness is therefore bounded by the Parquet sink's rotation interval.

use std::{
    collections::{HashMap, HashSet},
    process::ExitCode,
    time::{Duration, Instant},
};

use arrow_array::{
    cast::AsArray,
    types::{TimestampNanosecondType, UInt64Type},
    Array, RecordBatch,
};
use datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use futures::TryStreamExt;
use object_store::ObjectMeta;
use object_store::ObjectStoreExt;
use serde_json::json;

use crate::{
    catalog::{Column, Location},
    error::{Error, Result},
    output::{Cell, Format, Printer},
    settings::{fmt_ts, parse_duration_ns},
};

/// The profile's live counters for a duration (tails the Parquet files the daemon publishes).
///
/// Examples:
///   stel-query inspect stel_demo --table --duration 10s
///   stel-query inspect stel_demo --json --duration 1m -o Ethernet0 -s IF_IN_OCTETS
#[derive(Debug, clap::Args)]
#[command(verbatim_doc_comment)]
pub struct Args {
    /// HFT profile name.
    pub profile: String,
    /// JSON Lines output.
    #[arg(long, conflicts_with = "table")]
    pub json: bool,
    /// Table output (the default).
    #[arg(long)]
    pub table: bool,
    /// How long to watch.
    #[arg(long, default_value = "10s")]
    pub duration: String,
    /// How often to look for new files.
    #[arg(long, default_value = "500ms")]
    pub every: String,
    /// Only these objects.
    #[arg(long, short = 'o', value_delimiter = ',')]
    pub object: Vec<String>,
    /// Only these stats (short names).
    #[arg(long, short = 's', value_delimiter = ',')]
    pub stat: Vec<String>,
    #[arg(
        long,
        short = 'd',
        env = "STEL_DATA_DIR",
        default_value = "./stel-data"
    )]
    pub data_dir: String,
}

async fn list_recent(loc: &Location, dir: &str) -> Result<Vec<ObjectMeta>> {
    // Newest date, newest two hours (a rotation may just have crossed the hour).
    let mut out = Vec::new();
    let dates = loc.subdirs_pub(dir, "date").await?;
    let mut hours: Vec<String> = Vec::new();
    for d in dates.iter().rev().take(2) {
        for h in loc.subdirs_pub(&format!("{dir}/date={d}"), "hour").await? {
            hours.push(format!("{dir}/date={d}/hour={h}"));
        }
    }
    hours.sort();
    for h in hours.iter().rev().take(2) {
        let l: Vec<ObjectMeta> = loc.store.list(Some(&loc.path(h))).try_collect().await?;
        out.extend(l.into_iter().filter(|m| {
            m.location
                .filename()
                .is_some_and(|f| f.ends_with(".parquet") && !f.starts_with('.'))
        }));
    }
    out.sort_by(|a, b| a.location.cmp(&b.location));
    Ok(out)
}

async fn last_row(loc: &Location, m: &ObjectMeta) -> Result<Option<RecordBatch>> {
    let bytes = loc.store.get(&m.location).await?.bytes().await?;
    let b = ParquetRecordBatchReaderBuilder::try_new(bytes)?;
    let n = b.metadata().num_row_groups();
    if n == 0 {
        return Ok(None);
    }
    let mut last = None;
    for x in b.with_row_groups(vec![n - 1]).build()? {
        let x = x?;
        if x.num_rows() > 0 {
            last = Some(x.slice(x.num_rows() - 1, 1));
        }
    }
    Ok(last)
}

/// # Errors
/// No such profile, unreadable files; no new snapshot during the duration is exit 1.
pub async fn run(a: Args) -> Result<ExitCode> {
    let format = if a.json { Format::Json } else { Format::Table };
    let dur = Duration::from_nanos(parse_duration_ns(&a.duration)? as u64);
    let every = Duration::from_nanos(parse_duration_ns(&a.every)? as u64);
    let loc = Location::parse(&a.data_dir, false)?;
    let pdir = format!("profile={}", a.profile);
    let groups = loc.subdirs_pub(&pdir, "group").await?;
    if groups.is_empty() {
        let profiles = loc.subdirs_pub("", "profile").await?;
        return Err(Error::NotFound(format!(
            "no data for profile {} under {}; profiles there: {}",
            a.profile,
            loc.url,
            if profiles.is_empty() {
                "none".to_string()
            } else {
                profiles.join(", ")
            }
        )));
    }
    let mut p = Printer::new(format);
    p.begin(
        &["TIME", "GROUP", "OBJECT", "STAT", "VALUE", "RATE/S"],
        json!({"command": "inspect", "profile": a.profile, "groups": groups,
               "duration_ns": dur.as_nanos() as u64, "source": "published Parquet files (no daemon endpoint)"}),
    )?;
    let mut seen: HashSet<String> = HashSet::new();
    let mut prev: HashMap<(String, String), (i64, u64)> = HashMap::new();
    let started = Instant::now();
    let mut first_pass = true;
    let mut fresh = 0u64;
    let mut newest: Option<(String, i64)> = None;
    loop {
        for g in &groups {
            let files = list_recent(&loc, &format!("{pdir}/group={g}")).await?;
            // At start only the newest existing file (a baseline); later every new one in order.
            let new: Vec<&ObjectMeta> = if first_pass {
                files.last().into_iter().collect()
            } else {
                files
                    .iter()
                    .filter(|m| !seen.contains(m.location.as_ref()))
                    .collect()
            };
            for f in &files {
                seen.insert(f.location.to_string());
            }
            for m in new {
                let Some(b) = last_row(&loc, m).await? else {
                    continue;
                };
                let t = b
                    .column(0)
                    .as_primitive::<TimestampNanosecondType>()
                    .value(0);
                if newest.as_ref().is_none_or(|(_, n)| t > *n) {
                    newest = Some((m.location.to_string(), t));
                }
                if !first_pass {
                    fresh += 1;
                }
                let schema = b.schema();
                for (i, f) in schema.fields().iter().enumerate().skip(1) {
                    let Some(c) = Column::parse(f.name()) else {
                        continue;
                    };
                    if (!a.object.is_empty() && !a.object.contains(&c.object))
                        || (!a.stat.is_empty() && !a.stat.contains(&c.stat))
                    {
                        continue;
                    }
                    let arr = b.column(i).as_primitive::<UInt64Type>();
                    if arr.is_null(0) {
                        continue;
                    }
                    let v = arr.value(0);
                    let key = (g.clone(), f.name().clone());
                    let rate = prev
                        .insert(key, (t, v))
                        .filter(|(pt, pv)| t > *pt && v >= *pv)
                        .map(|(pt, pv)| (v - pv) as f64 / ((t - pt) as f64 / 1e9));
                    p.row(vec![
                        Cell::time(t),
                        Cell::str(g.clone()),
                        Cell::str(c.object),
                        Cell::str(c.stat),
                        Cell::u64(v),
                        Cell::opt_f64(rate, |r| format!("{r:.2}")),
                    ])?;
                }
            }
        }
        p.flush()?;
        first_pass = false;
        if started.elapsed() >= dur {
            break;
        }
        tokio::time::sleep(every.min(dur.saturating_sub(started.elapsed()))).await;
    }
    p.summary(json!({"rows": p.rows(), "new_snapshots": fresh,
                     "newest": newest.as_ref().map(|(f, t)| json!({"file": f, "time": fmt_ts(*t)}))}))?;
    if fresh == 0 {
        return Err(Error::NotFound(format!(
            "no new files published for profile {} in {} (newest snapshot {}); is stel-ingestd running with its Parquet sink on {}?",
            a.profile,
            a.duration,
            newest.map_or("none".into(), |(f, t)| format!("{} in {f}", fmt_ts(t))),
            loc.url
        )));
    }
    Ok(ExitCode::SUCCESS)
}
