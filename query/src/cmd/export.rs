//! `stel-query export <dest>`: copies a time range of the history to a data-lake location (a
//! local directory or `s3://bucket/prefix`), keeping the Hive layout, so any engine that reads
//! Hive-partitioned Parquet (DuckDB, Spark, Athena, stel-query itself) can query it there.
//!
//! Files entirely inside the window are copied byte for byte; files that straddle an edge are
//! rewritten with only the rows inside, through the history's own column-chunk encoder (the
//! same encoding, codec, row groups and pages, so a copy costs per row what the original did),
//! with the original's footer keys and the kept rows' counts (`stel.rows`, `stel.first_ns`,
//! `stel.last_ns`, samples); the rest are skipped without being read (partition directories
//! outside the window are not even listed into). Rollup tier files (`tier=<t>/…`) that overlap
//! the window are copied whole: a tier row summarises a whole interval and a file a day or an
//! hour of them, a few MB at most.

use std::{process::ExitCode, sync::Arc, time::Instant};

use std::collections::BTreeMap;

use arrow_array::{
    cast::AsArray, types::TimestampNanosecondType, RecordBatch, Scalar, TimestampNanosecondArray,
};
use datafusion::{
    arrow::compute::{and, filter_record_batch, kernels::cmp},
    parquet::{
        arrow::{arrow_reader::ParquetRecordBatchReaderBuilder, ArrowWriter},
        basic::{Compression, Encoding},
        file::{
            metadata::{KeyValue, ParquetMetaData},
            statistics::Statistics,
        },
    },
};
use futures::TryStreamExt;
use object_store::{ObjectMeta, ObjectStoreExt, PutPayload};
use serde_json::json;
use stel_store::{
    parquet::{keys, Codec, CounterEncoding, FileEncoder, ParquetSinkConfig},
    CounterBatch, SessionSchema,
};

use crate::{
    catalog::{Catalog, Location},
    error::{Error, Result},
    output::{thousands, Cell, Printer},
    settings::{fmt_ts, CommonArgs, ProfileArg, TimeArgs, TimeRange},
};

/// Copy a time range to a local directory or s3://bucket/prefix, keeping the Hive layout.
///
/// Without time flags the whole history is exported. Rollup tier files that overlap the window
/// are copied whole (a tier's rows are whole intervals).
///
/// Examples:
///   stel-query export /mnt/lake/stel --last 10m
///   AWS_ENDPOINT_URL=http://minio:9000 AWS_ALLOW_HTTP=true \
///       stel-query export s3://lake/stel \
///       --from 2024-05-01T00:00:00Z --to 2024-05-01T01:00:00Z
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
    tier_interval_ns: Option<i64>,
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
    // A tier row's `ts` is its interval's start: the file reaches one interval past its last.
    let reach = hi.saturating_add(tier_interval_ns.map_or(0, |iv| iv - 1));
    if reach < r.from_ns || lo >= r.to_ns {
        return Ok(None);
    }
    // The source's own (already encoded) path parts under its prefix: rebuilding the key from the
    // `rel` string would percent-encode a `%` of a Hive-escaped profile name a second time.
    let dest = match meta.location.prefix_match(&src.prefix) {
        Some(parts) => parts.fold(dst.prefix.clone(), |p, part| p.join(part)),
        None => dst.path(rel),
    };
    if tier_interval_ns.is_some() || (lo >= r.from_ns && hi < r.to_ns) {
        let n = bytes.len() as u64;
        dst.store.put(&dest, PutPayload::from(bytes)).await?;
        return Ok(Some((Action::Copied, rows, n)));
    }
    // Straddles an edge: the rows inside, re-encoded the way the history writes them.
    let (bytes, kept) = trim(builder, &md, r)
        .map_err(|e| Error::BadFile(format!("{rel}: cannot rewrite the rows inside {r}: {e}")))?;
    let n = bytes.len() as u64;
    dst.store.put(&dest, PutPayload::from(bytes)).await?;
    Ok(Some((Action::Trimmed, kept, n)))
}

/// The footer keys a trimmed copy recomputes (the rest are the original's).
const COUNT_KEYS: [&str; 5] = [
    keys::FIRST_NS,
    keys::LAST_NS,
    keys::ROWS,
    keys::SAMPLES,
    keys::MISSING_SAMPLES,
];

/// The rows of a history file inside `r`, as a new file: through the history's own column-chunk
/// encoder ([`FileEncoder`]: the same encoding, codec, row groups and pages as the daemon's
/// files) with the original's footer keys and the counts (rows, first/last timestamp, samples)
/// of what was kept. A file whose counters have nulls (a split snapshot with a missing part,
/// which the row-major encoder cannot carry) goes through Arrow's writer with the history's
/// writer properties (encoding, codec, row groups) and the same corrected keys. Returns the file and its rows.
fn trim(
    builder: ParquetRecordBatchReaderBuilder<bytes::Bytes>,
    md: &ParquetMetaData,
    r: &TimeRange,
) -> std::result::Result<(Vec<u8>, u64), String> {
    let kv: BTreeMap<String, String> = md
        .file_metadata()
        .key_value_metadata()
        .map(|v| {
            v.iter()
                .filter_map(|k| Some((k.key.clone(), k.value.clone()?)))
                .collect()
        })
        .unwrap_or_default();
    let keep: Vec<KeyValue> = kv
        .iter()
        .filter(|(k, _)| *k != "ARROW:schema" && !COUNT_KEYS.contains(&k.as_str()))
        .map(|(k, v)| KeyValue::new(k.clone(), v.clone()))
        .collect();
    let arrow = Arc::clone(builder.schema());
    let chunk = md.row_groups().first().and_then(|rg| rg.columns().get(1));
    let mut cfg = ParquetSinkConfig::default();
    match chunk.map(|c| c.compression()) {
        Some(Compression::ZSTD(l)) => {
            cfg.compression = Codec::Zstd;
            cfg.compression_level = l.compression_level();
        }
        Some(Compression::UNCOMPRESSED) => cfg.compression = Codec::None,
        _ => cfg.compression = Codec::Lz4,
    }
    let encodings: Vec<Encoding> = chunk.map(|c| c.encodings().collect()).unwrap_or_default();
    cfg.encoding = if encodings.contains(&Encoding::BYTE_STREAM_SPLIT) {
        CounterEncoding::ByteStreamSplit
    } else if encodings.contains(&Encoding::DELTA_BINARY_PACKED) {
        CounterEncoding::DeltaBinaryPacked
    } else {
        CounterEncoding::Plain
    };
    if let Some(n) = md.row_groups().iter().map(|rg| rg.num_rows()).max() {
        cfg.row_group_rows = usize::try_from(n).unwrap_or(cfg.row_group_rows).max(1);
    }
    let schema = SessionSchema::from_stel_file(arrow.fields(), &kv).map(Arc::new);
    let lo = Scalar::new(TimestampNanosecondArray::from(vec![r.from_ns]).with_timezone("UTC"));
    let hi = Scalar::new(TimestampNanosecondArray::from(vec![r.to_ns]).with_timezone("UTC"));
    let inside = |b: &RecordBatch| -> std::result::Result<RecordBatch, String> {
        let ts = b.column(0);
        let mask = and(
            &cmp::gt_eq(ts, &lo).map_err(|e| e.to_string())?,
            &cmp::lt(ts, &hi).map_err(|e| e.to_string())?,
        )
        .map_err(|e| e.to_string())?;
        filter_record_batch(b, &mask).map_err(|e| e.to_string())
    };
    let batches: Vec<RecordBatch> = builder
        .with_batch_size(4096)
        .build()
        .map_err(|e| e.to_string())?
        .map(|b| b.map_err(|e| e.to_string()).and_then(|b| inside(&b)))
        .filter(|b| b.as_ref().map_or(true, |b| b.num_rows() > 0))
        .collect::<std::result::Result<_, _>>()?;
    // What was kept, for the footer.
    let (mut rows, mut first, mut last, mut missing) = (0u64, i64::MAX, i64::MIN, 0u64);
    for b in &batches {
        rows += b.num_rows() as u64;
        let ts = b
            .column(0)
            .as_primitive::<TimestampNanosecondType>()
            .values();
        first = first.min(ts.iter().copied().min().unwrap_or(i64::MAX));
        last = last.max(ts.iter().copied().max().unwrap_or(i64::MIN));
        missing += b.columns()[1..]
            .iter()
            .map(|c| c.null_count() as u64)
            .sum::<u64>();
    }
    let width = arrow.fields().len().saturating_sub(1) as u64;
    let counts: Vec<KeyValue> = [
        (keys::FIRST_NS, first.to_string()),
        (keys::LAST_NS, last.to_string()),
        (keys::ROWS, rows.to_string()),
        (keys::SAMPLES, (rows * width).to_string()),
        (keys::MISSING_SAMPLES, missing.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| KeyValue::new(k.to_string(), v))
    .collect();
    if let (Ok(schema), 0) = (&schema, missing) {
        let mut enc =
            FileEncoder::new(Vec::new(), schema, &cfg, keep).map_err(|e| e.to_string())?;
        for b in &batches {
            let cb = CounterBatch::from_wide(Arc::clone(schema), b)
                .map_err(|e| e.to_string())?
                .ok_or("a null counter in a batch without nulls")?;
            enc.write(&Arc::new(cb)).map_err(|e| e.to_string())?;
        }
        return Ok((enc.finish(counts).map_err(|e| e.to_string())?, rows));
    }
    let mut all = keep;
    all.extend(counts);
    let props = cfg
        .writer_properties()
        .into_builder()
        .set_key_value_metadata(Some(all))
        .build();
    let mut w = ArrowWriter::try_new(Vec::new(), arrow, Some(props)).map_err(|e| e.to_string())?;
    for b in &batches {
        w.write(b).map_err(|e| e.to_string())?;
    }
    Ok((w.into_inner().map_err(|e| e.to_string())?, rows))
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
        // The raw files (trimmed at the window's edges), then the tiers' (whole).
        let dirs = std::iter::once((s.dir.as_str(), None)).chain(
            s.tiers
                .iter()
                .map(|t| (t.dir.as_str(), Some(t.interval_ns))),
        );
        let mut list: Vec<(ObjectMeta, Option<i64>)> = Vec::new();
        for (dir, whole) in dirs {
            let mut l: Vec<ObjectMeta> = src.store.list(Some(&src.path(dir))).try_collect().await?;
            l.sort_by(|x, y| x.location.cmp(&y.location));
            list.extend(l.into_iter().map(|m| (m, whole)));
        }
        for (meta, whole) in list {
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
            if let Some((action, rows, n)) = export_file(src, &dst, &meta, &rel, &r, whole).await? {
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
