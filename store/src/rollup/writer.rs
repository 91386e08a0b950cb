//! Tier files: [`Layout`] (a session's tier columns, `store/ROLLUPS.md` §3) and [`TierFile`]
//! (one open file of one tier of one session: a DELTA page per object and column, fed one value
//! per interval, published as one row group in object order).

use std::{
    fs::{self, File},
    io::BufWriter,
    path::{Path, PathBuf},
    sync::Arc,
};

use ::parquet::{
    arrow::{add_encoded_arrow_schema_to_metadata, ArrowSchemaConverter},
    basic::Compression,
    data_type::{ByteArray, ByteArrayType},
    file::{
        metadata::KeyValue,
        properties::{EnabledStatistics, WriterProperties, WriterVersion},
        writer::SerializedFileWriter,
    },
    schema::types::{ColumnDescPtr, SchemaDescriptor},
};
use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};

use super::{
    accum::IntervalRow,
    config::{threshold_label, BurstRule, Tier},
    plan::{Plan, DIRS},
};
use crate::{
    durable::fsync_dir,
    parquet::{Codec, CounterEncoding, EncodeOptions, PagedChunk, SeriesPage},
    paths::{PartName, PartPaths, TierDir},
};

/// The rollup layout version (`stel.rollup.version`): changes when a column changes meaning.
pub const ROLLUP_VERSION: &str = "1";

/// Footer keys of tier files (besides the raw files' `stel.*` keys).
pub mod keys {
    pub const VERSION: &str = "stel.rollup.version";
    pub const TIER: &str = "stel.rollup.tier";
    pub const INTERVAL_NS: &str = "stel.rollup.interval_ns";
    pub const SPEED_MBPS: &str = "stel.rollup.speed_mbps";
    /// Comma-separated percent, in column order.
    pub const THRESHOLDS: &str = "stel.rollup.thresholds";
}

/// Burst figure per (direction, threshold), in column order after the two per-direction ones.
const BURST_FIGURES: [(&str, &str); 6] = [
    ("above", "_ns"),
    ("bursts", ""),
    ("head", "_ns"),
    ("tail", "_ns"),
    ("longest", "_ns"),
    ("entry", "_ns"),
];

/// Where a tier column's value comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Src {
    Start,
    Object,
    FirstTs,
    LastTs,
    Samples,
    Missing,
    Lost,
    MinDt,
    MaxDt,
    Resets,
    /// Counter stat `s`: first, last, peak, peak time, min, min time.
    First(usize),
    Last(usize),
    Peak(usize),
    PeakTs(usize),
    Trough(usize),
    TroughTs(usize),
    /// Level stat `s`.
    LMin(usize),
    LMax(usize),
    LSum(usize),
    LCount(usize),
    /// Per direction.
    Deltas(usize),
    EntryNs(usize),
    /// Per direction, threshold, figure (`BURST_FIGURES`).
    Burst(usize, usize, usize),
}

/// The columns of one session's tier files.
#[derive(Debug)]
pub struct Layout {
    pub names: Vec<String>,
    srcs: Vec<Src>,
    pub arrow: SchemaRef,
    descr: SchemaDescriptor,
    /// Per object: its counter columns.
    object_cols: Vec<Vec<usize>>,
}

fn ts_type() -> DataType {
    DataType::Timestamp(TimeUnit::Nanosecond, Some("UTC".into()))
}

impl Layout {
    /// The columns for `plan`'s session with burst figures by `rule`.
    ///
    /// # Panics
    /// Never for a valid plan (the Arrow schema always converts).
    pub fn new(plan: &Plan, rule: &BurstRule) -> Self {
        let mut cols: Vec<(String, DataType, bool, Src)> = vec![
            ("ts".into(), ts_type(), false, Src::Start),
            ("object".into(), DataType::Utf8, false, Src::Object),
            ("first_ts".into(), ts_type(), false, Src::FirstTs),
            ("last_ts".into(), ts_type(), false, Src::LastTs),
            ("samples".into(), DataType::UInt64, false, Src::Samples),
            ("missing".into(), DataType::UInt64, false, Src::Missing),
            ("lost".into(), DataType::UInt64, false, Src::Lost),
            ("min_dt_ns".into(), DataType::UInt64, true, Src::MinDt),
            ("max_dt_ns".into(), DataType::UInt64, true, Src::MaxDt),
            ("resets".into(), DataType::UInt64, false, Src::Resets),
        ];
        let u = DataType::UInt64;
        for (s, (stat, level)) in plan.stats.iter().enumerate() {
            let mut add = |agg: &str, t: DataType, src: Src| {
                cols.push((format!("{stat}.{agg}"), t, true, src));
            };
            if *level {
                add("last", u.clone(), Src::Last(s));
                add("min", u.clone(), Src::LMin(s));
                add("max", u.clone(), Src::LMax(s));
                add("sum", u.clone(), Src::LSum(s));
                add("count", u.clone(), Src::LCount(s));
            } else {
                add("first", u.clone(), Src::First(s));
                add("last", u.clone(), Src::Last(s));
                add("peak", u.clone(), Src::Peak(s));
                add("peak_ts", ts_type(), Src::PeakTs(s));
                add("min", u.clone(), Src::Trough(s));
                add("min_ts", ts_type(), Src::TroughTs(s));
            }
        }
        if plan.has_bursts() {
            for (d, dir) in DIRS.iter().enumerate() {
                cols.push((format!("{dir}_deltas"), u.clone(), true, Src::Deltas(d)));
                cols.push((format!("{dir}_entry_ns"), u.clone(), true, Src::EntryNs(d)));
                for (i, t) in rule.thresholds.iter().enumerate() {
                    let t = threshold_label(*t);
                    for (f, (fig, unit)) in BURST_FIGURES.iter().enumerate() {
                        cols.push((
                            format!("{dir}_{fig}{t}{unit}"),
                            u.clone(),
                            true,
                            Src::Burst(d, i, f),
                        ));
                    }
                }
            }
        }
        let fields: Vec<Field> = cols
            .iter()
            .map(|(n, t, null, _)| Field::new(n, t.clone(), *null))
            .collect();
        let arrow = Arc::new(Schema::new(fields));
        let descr = ArrowSchemaConverter::new()
            .convert(&arrow)
            .expect("tier schemas use only Timestamp, Utf8 and UInt64");
        let mut object_cols = vec![Vec::new(); plan.objects.len()];
        for (c, o) in plan.object_of.iter().enumerate() {
            object_cols[*o].push(c);
        }
        Self {
            names: cols.iter().map(|c| c.0.clone()).collect(),
            srcs: cols.iter().map(|c| c.3).collect(),
            arrow,
            descr,
            object_cols,
        }
    }

    fn column(&self, i: usize) -> ColumnDescPtr {
        self.descr.column(i)
    }

    /// Column `i`'s value for object `o` in `row` (`None`: null).
    fn value(&self, i: usize, plan: &Plan, row: &IntervalRow, o: usize) -> Option<u64> {
        let cell = |s: usize| plan.cell[o][s];
        let ser = |d: usize| plan.series_of[o][d].map(|s| &row.series[s]);
        match self.srcs[i] {
            Src::Start => Some(row.start_ns as u64),
            Src::Object => None,
            Src::FirstTs => Some(row.first_ts as u64),
            Src::LastTs => Some(row.last_ts as u64),
            Src::Samples => Some(row.samples),
            Src::Missing => Some(self.object_cols[o].iter().map(|&c| row.nulls[c]).sum()),
            Src::Lost => Some(row.lost),
            Src::MinDt => (row.min_dt != u64::MAX).then_some(row.min_dt),
            Src::MaxDt => (row.min_dt != u64::MAX).then_some(row.max_dt),
            Src::Resets => Some(self.object_cols[o].iter().map(|&c| row.resets[c]).sum()),
            Src::First(s) => cell(s).filter(|&c| row.first_ok[c]).map(|c| row.first[c]),
            Src::Last(s) => cell(s).filter(|&c| row.last_ok[c]).map(|c| row.last[c]),
            Src::Peak(s) | Src::LMax(s) => cell(s).and_then(|c| row.peak(c)).map(|p| p.0),
            Src::PeakTs(s) => cell(s).and_then(|c| row.peak(c)).map(|p| p.1 as u64),
            Src::Trough(s) | Src::LMin(s) => cell(s).and_then(|c| row.trough(c)).map(|p| p.0),
            Src::TroughTs(s) => cell(s).and_then(|c| row.trough(c)).map(|p| p.1 as u64),
            Src::LSum(s) => cell(s).map(|c| row.sum[c]),
            Src::LCount(s) => cell(s).map(|c| row.count(c)),
            Src::Deltas(d) => ser(d).map(|s| s.deltas()),
            Src::EntryNs(d) => ser(d).map(|s| s.entry_ns),
            Src::Burst(d, i, f) => ser(d).map(|s| {
                let t = &s.thr[i];
                match f {
                    0 => t.inner.above,
                    1 => t.inner.runs,
                    2 => t.inner.head,
                    3 => t.inner.tail,
                    4 => t.inner.longest,
                    _ => t.entry_above_ns,
                }
            }),
        }
    }

    fn unsigned(&self, i: usize) -> bool {
        self.arrow.field(i).data_type() == &DataType::UInt64
    }

    fn nullable(&self, i: usize) -> bool {
        self.arrow.field(i).is_nullable()
    }
}

/// What one tier's files say about themselves.
#[derive(Debug, Clone)]
pub struct FileIdentity {
    pub root: PathBuf,
    pub tier: Tier,
    pub switch: String,
    pub rule: BurstRule,
    pub codec: Codec,
    pub compression_level: i32,
}

/// One open tier file of one session.
pub struct TierFile {
    plan: Arc<Plan>,
    layout: Arc<Layout>,
    id: Arc<FileIdentity>,
    /// `[column][object]` (the `object` column's entry is empty).
    pages: Vec<Vec<SeriesPage>>,
    pub first_ns: i64,
    /// The file takes intervals starting before this.
    pub end_ns: i64,
    /// Start of the last interval taken.
    pub last_start: i64,
    /// Last snapshot time in the file.
    pub last_ts: i64,
    pub intervals: u64,
}

impl std::fmt::Debug for TierFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TierFile")
            .field("tier", &self.id.tier.name)
            .field("first_ns", &self.first_ns)
            .field("intervals", &self.intervals)
            .finish_non_exhaustive()
    }
}

/// A published tier file.
#[derive(Debug, Clone)]
pub struct Published {
    pub path: PathBuf,
    pub name: PartName,
    pub bytes: u64,
    pub rows: u64,
    /// End of the file's last interval (data time).
    pub data_end_ns: i64,
}

impl TierFile {
    /// A file whose first interval starts at `first_ns`.
    pub fn new(plan: Arc<Plan>, layout: Arc<Layout>, id: Arc<FileIdentity>, first_ns: i64) -> Self {
        let span = id.tier.file_span_ns;
        let end_ns = (first_ns.div_euclid(span) + 1).saturating_mul(span);
        let pages = (0..layout.names.len())
            .map(|i| {
                if layout.srcs[i] == Src::Object {
                    Vec::new()
                } else {
                    (0..plan.objects.len())
                        .map(|_| SeriesPage::new(layout.unsigned(i), layout.nullable(i)))
                        .collect()
                }
            })
            .collect();
        Self {
            plan,
            layout,
            id,
            pages,
            first_ns,
            end_ns,
            last_start: i64::MIN,
            last_ts: i64::MIN,
            intervals: 0,
        }
    }

    /// Whether `row` belongs in this file (inside its span, after its last interval).
    pub fn takes(&self, row: &IntervalRow) -> bool {
        row.start_ns >= self.first_ns
            && row.start_ns < self.end_ns
            && row.start_ns > self.last_start
    }

    /// Appends one interval.
    pub fn push(&mut self, row: &IntervalRow) {
        let plan = &self.plan;
        for (i, col) in self.pages.iter_mut().enumerate() {
            for (o, page) in col.iter_mut().enumerate() {
                page.push(self.layout.value(i, plan, row, o));
            }
        }
        self.last_start = row.start_ns;
        self.last_ts = self.last_ts.max(row.last_ts);
        self.intervals += 1;
    }

    /// Bytes held.
    pub fn memory(&self) -> usize {
        self.pages.iter().flatten().map(SeriesPage::memory).sum()
    }

    /// Writes, fsyncs and publishes the file (`seq` picks a free name); `None` when empty.
    ///
    /// # Errors
    /// Any I/O or encoding error (the temporary file is removed).
    pub fn publish(
        self,
        seq: &mut u32,
    ) -> Result<Option<Published>, Box<dyn std::error::Error + Send + Sync>> {
        if self.intervals == 0 {
            return Ok(None);
        }
        let schema = &self.plan.schema;
        let dir = TierDir::new(
            &self.id.root,
            &self.id.tier.name,
            &schema.profile,
            &schema.group,
        )
        .partition(self.first_ns);
        crate::durable::create_dirs(dir.as_path())?;
        let (paths, file) = loop {
            let p = dir.part(PartName::new(self.first_ns, *seq));
            *seq = (*seq + 1) % (crate::paths::MAX_SEQ + 1);
            if p.published.exists() {
                continue;
            }
            match crate::durable::create_history_file(&p.temp) {
                Ok(f) => break (p, f),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e.into()),
            }
        };
        let rows = self.intervals * self.plan.objects.len() as u64;
        let data_end_ns = self.last_start.saturating_add(self.id.tier.interval_ns);
        match self.write(&paths, file, rows) {
            Ok(bytes) => Ok(Some(Published {
                path: paths.published,
                name: paths.name,
                bytes,
                rows,
                data_end_ns,
            })),
            Err(e) => {
                let _ = fs::remove_file(&paths.temp);
                Err(e)
            }
        }
    }

    fn write(
        self,
        paths: &PartPaths,
        file: File,
        rows: u64,
    ) -> Result<u64, Box<dyn std::error::Error + Send + Sync>> {
        let id = &self.id;
        let compression = match id.codec {
            Codec::Lz4 => Compression::LZ4_RAW,
            Codec::Zstd => Compression::ZSTD(
                ::parquet::basic::ZstdLevel::try_new(id.compression_level).unwrap_or_default(),
            ),
            Codec::None => Compression::UNCOMPRESSED,
        };
        let opts = EncodeOptions {
            encoding: CounterEncoding::DeltaBinaryPacked,
            codec: id.codec,
            level: id.compression_level,
            page_rows: usize::MAX,
            row_group_rows: usize::MAX,
        };
        let kv = |k: &str, v: String| KeyValue::new(k.to_string(), v);
        let mut meta = crate::parquet::writer::static_kv(&self.plan.schema, &id.switch);
        meta.extend([
            kv(keys::VERSION, ROLLUP_VERSION.into()),
            kv(keys::TIER, id.tier.name.clone()),
            kv(keys::INTERVAL_NS, id.tier.interval_ns.to_string()),
            kv(keys::SPEED_MBPS, id.rule.speed_mbps.to_string()),
            kv(
                keys::THRESHOLDS,
                id.rule
                    .thresholds
                    .iter()
                    .map(f64::to_string)
                    .collect::<Vec<_>>()
                    .join(","),
            ),
            kv(crate::parquet::keys::FIRST_NS, self.first_ns.to_string()),
            kv(crate::parquet::keys::LAST_NS, self.last_ts.to_string()),
            kv(crate::parquet::keys::ROWS, rows.to_string()),
        ]);
        let mut props = WriterProperties::builder()
            .set_writer_version(WriterVersion::PARQUET_2_0)
            .set_dictionary_enabled(false)
            .set_column_dictionary_enabled("object".into(), true)
            .set_compression(compression)
            .set_statistics_enabled(EnabledStatistics::Chunk)
            .set_offset_index_disabled(true)
            .set_key_value_metadata(Some(meta))
            .set_created_by(concat!("stel ", env!("CARGO_PKG_VERSION")).to_string())
            .build();
        add_encoded_arrow_schema_to_metadata(&self.layout.arrow, &mut props);
        let mut w = SerializedFileWriter::new(
            BufWriter::with_capacity(1 << 20, file),
            self.layout.descr.root_schema_ptr(),
            Arc::new(props),
        )?;
        let mut rg = w.next_row_group()?;
        let n = self.intervals as usize;
        let mut pages = self.pages;
        for (i, col) in pages.iter_mut().enumerate() {
            if self.layout.srcs[i] == Src::Object {
                let names: Vec<ByteArray> = self
                    .plan
                    .objects
                    .iter()
                    .flat_map(|o| std::iter::repeat_n(ByteArray::from(o.as_str()), n))
                    .collect();
                let mut cw = rg
                    .next_column()?
                    .ok_or("the tier schema has fewer columns than its layout")?;
                cw.typed::<ByteArrayType>()
                    .write_batch(&names, None, None)?;
                cw.close()?;
                continue;
            }
            let mut chunk = PagedChunk::new(self.layout.unsigned(i), self.layout.nullable(i), opts);
            for page in col.drain(..) {
                chunk.append(page)?;
            }
            let (bytes, close) = chunk.finish(&self.layout.column(i), compression)?;
            rg.append_column(&bytes, close)?;
        }
        rg.close()?;
        let buf = w.into_inner()?;
        let file = buf.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        let bytes = file.metadata()?.len();
        drop(file);
        fs::rename(&paths.temp, &paths.published)?;
        if let Some(d) = paths.published.parent() {
            fsync_dir(d)?;
        }
        Ok(bytes)
    }
}

/// The tier files under `root` of one tier, for recovery: (path, first_ns) of published ones;
/// stale temporary files are removed (returned as their byte count).
pub fn scan(root: &Path, tier: &str) -> (Vec<(PathBuf, u64, u64)>, u64, u64) {
    use crate::paths::{classify_tier, TierEntry};
    let mut found = Vec::new();
    let (mut stale, mut stale_bytes) = (0, 0);
    let mut stack = vec![root.join(format!("tier={}", crate::paths::escape_value(tier)))];
    while let Some(d) = stack.pop() {
        let Ok(rd) = fs::read_dir(&d) else { continue };
        for e in rd.flatten() {
            let p = e.path();
            let Ok(ft) = e.file_type() else { continue };
            if ft.is_dir() {
                stack.push(p);
                continue;
            }
            let len = e.metadata().map_or(0, |m| m.len());
            match classify_tier(root, &p) {
                TierEntry::Part { name, .. } => found.push((p, name.first_ns, len)),
                TierEntry::Temp { .. } => {
                    if fs::remove_file(&p).is_ok() {
                        stale += 1;
                        stale_bytes += len;
                    }
                }
                TierEntry::Other => {}
            }
        }
    }
    (found, stale, stale_bytes)
}
