//! `stel-query export <dest>`: copies a time range of the history to a data-lake location (a
//! local directory or `s3://bucket/prefix`), keeping the Hive layout, so any engine that reads
//! Hive-partitioned Parquet (DuckDB, Spark, Athena, stel-query itself) can query it there.
//!
//! Files entirely inside the window are copied byte for byte; files that straddle an edge are
//! rewritten with only the rows inside (same schema, metadata and codec); the rest are skipped
//! without being read (partition directories outside the window are not even listed into).

use std::{process::ExitCode, sync::Arc, time::Instant};

use arrow_array::{Scalar, TimestampNanosecondArray};
use datafusion::{
    arrow::compute::{and, filter_record_batch, kernels::cmp},
    parquet::{
        arrow::{arrow_reader::ParquetRecordBatchReaderBuilder, ArrowWriter},
        file::{metadata::KeyValue, properties::WriterProperties, statistics::Statistics},
    },
};
use futures::TryStreamExt;
use object_store::{ObjectMeta, ObjectStoreExt, PutPayload};
use serde_json::json;

use crate::{
    catalog::{Catalog, Location},
    error::{Error, Result},
    output::{thousands, Cell, Printer},
    settings::{fmt_ts, CommonArgs, ProfileArg, TimeArgs, TimeRange},
};

/// Copy a time range to a local directory or s3://bucket/prefix, keeping the Hive layout.
///
/// Without time flags the whole history is exported.
///
/// Examples:
///   stel-query export /mnt/lake/stel --last 10m
///   AWS_ENDPOINT_URL=http://minio:9000 AWS_ALLOW_HTTP=true stel-query export s3://lake/stel --from 2024-05-01T00:00:00Z --to 2024-05-01T01:00:00Z
#[derive(Debug, clap::Args)]
#[command(verbatim_doc_comment)]
pub struct Args {
    #[command(flatten)]
    pub common: CommonArgs,
    #[command(flatten)]
    pub time: TimeArgs,
    /// Destination: a directory or s3://bucket/prefix.
    pub dest: String,
    #[command(flatten)]
    pub profile: ProfileArg,
    /// Only this group.
    #[arg(long, short = 'g')]
    pub group: Option<String>,
}

/// What happened to one file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Copied,
    Trimmed,
}

fn hour_range(rel: &str) -> Option<(i64, i64)> {
    let start = stel_store::paths::UtcHour::parse_path(rel)?.start_ns();
    Some((start, start + stel_store::paths::NS_PER_HOUR))
}

fn ts_bounds(md: &datafusion::parquet::file::metadata::ParquetMetaData) -> Option<(i64, i64)> {
    let mut lo = i64::MAX;
    let mut hi = i64::MIN;
    for rg in md.row_groups() {
        let c = rg
            .columns()
            .iter()
            .find(|c| c.column_path().string() == "ts")?;
        match c.statistics()? {
            Statistics::Int64(s) => {
                lo = lo.min(*s.min_opt()?);
                hi = hi.max(*s.max_opt()?);
            }
            _ => return None,
        }
    }
    (lo <= hi).then_some((lo, hi))
}

async fn export_file(
    src: &Location,
    dst: &Location,
    meta: &ObjectMeta,
    rel: &str,
    r: &TimeRange,
) -> Result<Option<(Action, u64, u64)>> {
    // Files are bounded by the sink's rotation size; one GET serves both the footer and a copy.
    let bytes = src.store.get(&meta.location).await?.bytes().await?;
    let builder = ParquetRecordBatchReaderBuilder::try_new(bytes.clone())?;
    let md = Arc::clone(builder.metadata());
    let rows = md.file_metadata().num_rows() as u64;
    let Some((lo, hi)) = ts_bounds(&md) else {
        return Err(Error::Usage(format!(
            "{rel} has no ts statistics; cannot tell its time range"
        )));
    };
    if hi < r.from_ns || lo >= r.to_ns {
        return Ok(None);
    }
    // The source's own (already encoded) path parts under its prefix: rebuilding the key from the
    // `rel` string would percent-encode a `%` of a Hive-escaped profile name a second time.
    let dest = match meta.location.prefix_match(&src.prefix) {
        Some(parts) => parts.fold(dst.prefix.clone(), |p, part| p.join(part)),
        None => dst.path(rel),
    };
    if lo >= r.from_ns && hi < r.to_ns {
        let n = bytes.len() as u64;
        dst.store.put(&dest, PutPayload::from(bytes)).await?;
        return Ok(Some((Action::Copied, rows, n)));
    }
    // Straddles an edge: keep the rows inside, same schema, metadata and codec.
    let schema = Arc::clone(builder.schema());
    let codec = md
        .row_groups()
        .first()
        .and_then(|rg| rg.columns().get(1).or(rg.columns().first()))
        .map(|c| c.compression());
    let kv: Vec<KeyValue> = md
        .file_metadata()
        .key_value_metadata()
        .map(|v| {
            v.iter()
                .filter(|k| k.key != "ARROW:schema")
                .cloned()
                .collect()
        })
        .unwrap_or_default();
    let mut props = WriterProperties::builder().set_key_value_metadata(Some(kv));
    if let Some(c) = codec {
        props = props.set_compression(c);
    }
    let mut w = ArrowWriter::try_new(Vec::new(), Arc::clone(&schema), Some(props.build()))?;
    let lo_s = Scalar::new(TimestampNanosecondArray::from(vec![r.from_ns]).with_timezone("UTC"));
    let hi_s = Scalar::new(TimestampNanosecondArray::from(vec![r.to_ns]).with_timezone("UTC"));
    let reader = builder.build()?;
    let mut kept = 0u64;
    for b in reader {
        let b = b?;
        let ts = b.column(0);
        let mask = and(&cmp::gt_eq(ts, &lo_s)?, &cmp::lt(ts, &hi_s)?)?;
        let f = filter_record_batch(&b, &mask)?;
        kept += f.num_rows() as u64;
        if f.num_rows() > 0 {
            w.write(&f)?;
        }
    }
    let bytes = w.into_inner()?;
    let n = bytes.len() as u64;
    dst.store.put(&dest, PutPayload::from(bytes)).await?;
    Ok(Some((Action::Trimmed, kept, n)))
}

/// # Errors
/// See [`Error`].
pub async fn run(a: Args) -> Result<ExitCode> {
    let started = Instant::now();
    let set = a.common.resolve();
    let cat = Catalog::open(&set.data, set.strict).await?;
    let dst = Location::parse(&a.dest, true)?;
    let sessions: Vec<_> = cat
        .sessions
        .iter()
        .filter(|s| a.profile.get().is_none_or(|p| s.profile == p))
        .filter(|s| {
            a.group
                .as_deref()
                .is_none_or(|g| s.group.eq_ignore_ascii_case(g))
        })
        .collect();
    if sessions.is_empty() {
        return Err(Error::NotFound(format!(
            "no session matches --profile/--group; sessions: {}",
            cat.list()
        )));
    }
    let t = &a.time;
    let whole = t.since.is_none() && t.from.is_none() && t.to.is_none() && t.last.is_none();
    let mut extent: Option<(i64, i64)> = None;
    for s in &sessions {
        if let Some((x, y)) = cat.extent(s).await? {
            extent = Some(extent.map_or((x, y), |(a, b)| (a.min(x), b.max(y))));
        }
    }
    let r = if whole {
        let (x, y) = extent.ok_or_else(|| Error::NotFound("no samples to export".into()))?;
        TimeRange {
            from_ns: x,
            to_ns: y + 1,
        }
    } else {
        t.resolve(extent)?
    };
    let mut p = Printer::new(set.format);
    p.begin(
        &["FILE", "ACTION", "ROWS", "BYTES"],
        json!({"command": "export", "dest": dst.url.as_str(), "from": fmt_ts(r.from_ns), "to": fmt_ts(r.to_ns)}),
    )?;
    let src = &cat.location;
    let (mut files, mut bytes) = (0u64, 0u64);
    for s in sessions {
        let mut list: Vec<ObjectMeta> = src
            .store
            .list(Some(&src.path(&s.dir)))
            .try_collect()
            .await?;
        list.sort_by(|x, y| x.location.cmp(&y.location));
        for meta in list {
            let full = meta.location.as_ref();
            let rel = full
                .strip_prefix(src.prefix.as_ref())
                .unwrap_or(full)
                .trim_start_matches('/')
                .to_string();
            let name = meta.location.filename().unwrap_or_default();
            if !name.ends_with(".parquet") || name.starts_with('.') {
                continue;
            }
            if let Some((h0, h1)) = hour_range(&rel) {
                if h1 <= r.from_ns || h0 >= r.to_ns {
                    continue;
                }
            }
            if let Some((action, rows, n)) = export_file(src, &dst, &meta, &rel, &r).await? {
                files += 1;
                bytes += n;
                p.row(vec![
                    Cell::str(rel),
                    Cell::str(match action {
                        Action::Copied => "copied",
                        Action::Trimmed => "trimmed",
                    }),
                    Cell::u64(rows),
                    Cell {
                        json: json!(n),
                        text: thousands(n),
                    },
                ])?;
            }
        }
    }
    if files == 0 {
        return Err(Error::NotFound(format!(
            "no files overlap {r}; data exists for {}",
            extent.map_or("nothing".into(), |(x, y)| format!(
                "{}..{}",
                fmt_ts(x),
                fmt_ts(y)
            ))
        )));
    }
    p.summary(
        json!({"files": files, "bytes": bytes, "dest": dst.url.as_str(),
                     "elapsed_s": started.elapsed().as_secs_f64()}),
    )?;
    Ok(super::exit_for(p.rows()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hour_partitions_parse() {
        let (a, b) =
            hour_range("profile=p/group=PORT/date=2023-11-14/hour=22/part-1-000000.parquet")
                .unwrap();
        assert_eq!(a, 1_699_999_200_000_000_000);
        assert_eq!(b - a, 3_600_000_000_000);
        assert!(hour_range("profile=p/x.parquet").is_none());
    }
}
