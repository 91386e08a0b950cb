//! The vectorised aggregation every time-series command runs: per time bucket and column, the
//! last value (and optionally min/max/sum/count), plus the first row of the window.
//!
//! DataFusion does the I/O (partition pruning, row-group and page pruning on `ts`, projection,
//! decode, the exact `ts` filter) and hands back one record-batch stream per partition; this
//! module consumes the streams in parallel. Because counters are snapshots, "the value at the end
//! of a bucket" is one row — so for each batch it finds the runs of rows that share a bucket
//! (one pass over `ts`) and copies the run's last row (one gather per run), instead of touching
//! every value the way a SQL `arg_max` aggregate must. Min/max/sum are per-value loops and only
//! run when asked for.
//!
//! Bucket state is dense (`buckets × columns`). Windows whose dense state would exceed
//! [`MAX_CELLS`] are processed in consecutive chunks, in time order, so output can stream and
//! memory stays bounded at any resolution.

use std::time::Instant;

use arrow_array::{
    cast::AsArray,
    types::{TimestampNanosecondType, UInt64Type},
    Array, RecordBatch,
};
use datafusion::execution::SendableRecordBatchStream;
use futures::StreamExt;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::{
    catalog::{Catalog, Session},
    error::{Error, Result},
    window::TimeRange,
};

/// What SQL a user hands in (`stel-query sql`, the Flight SQL server) may do.
///
/// Read-only is the default everywhere: a query over the history must never write files
/// (`COPY … TO`), create or drop tables, or change the session (`SET`). Writes are an explicit
/// choice of whoever starts the process (`--allow-writes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SqlAccess {
    /// `SELECT`, `WITH`, `VALUES`, `SHOW`, `DESCRIBE`, `EXPLAIN` (not `EXPLAIN ANALYZE` of a
    /// write): no DDL, no DML (`INSERT`, `COPY`), no statements (`SET`, transactions).
    #[default]
    ReadOnly,
    /// Anything the engine supports.
    ReadWrite,
}

impl SqlAccess {
    /// `--allow-writes` → [`SqlAccess::ReadWrite`].
    pub fn from_allow_writes(allow: bool) -> Self {
        if allow {
            Self::ReadWrite
        } else {
            Self::ReadOnly
        }
    }

    /// DataFusion's switches for this access.
    pub fn options(self) -> datafusion::execution::context::SQLOptions {
        let rw = self == Self::ReadWrite;
        datafusion::execution::context::SQLOptions::new()
            .with_allow_ddl(rw)
            .with_allow_dml(rw)
            .with_allow_statements(rw)
    }
}

/// Plans user SQL on `ctx` under `access` — the one gate every SQL entry point goes through
/// (`stel-query sql`, the Flight SQL server). The plan (and every subquery and `EXPLAIN` inside
/// it) is checked before anything runs, so a refused statement has no effect at all.
///
/// # Errors
/// A statement `access` does not allow (a usage error naming it and `--allow-writes`), or the
/// engine's own planning error.
pub async fn plan_sql(
    ctx: &datafusion::prelude::SessionContext,
    sql: &str,
    access: SqlAccess,
) -> Result<datafusion::dataframe::DataFrame> {
    let plan = ctx.state().create_logical_plan(sql).await?;
    access.options().verify_plan(&plan).map_err(refused)?;
    Ok(ctx.execute_logical_plan(plan).await?)
}

/// The same gate for SQL sent to a remote engine (`--engine spark`), which stel-query does not
/// plan: the text is parsed and only reading statements pass. Text the parser cannot read is
/// refused too (whether it writes cannot be told).
///
/// # Errors
/// A statement `access` does not allow, or unparsable text under read-only access.
pub fn check_remote_sql(sql: &str, access: SqlAccess) -> Result<()> {
    use datafusion::sql::sqlparser::{ast::Statement, dialect::GenericDialect, parser::Parser};
    if access == SqlAccess::ReadWrite {
        return Ok(());
    }
    let stmts = Parser::parse_sql(&GenericDialect {}, sql).map_err(|e| {
        Error::Usage(format!(
            "read-only SQL: cannot tell whether this statement only reads ({e}); rerun with --allow-writes to send it as is"
        ))
    })?;
    fn reads(s: &Statement) -> bool {
        match s {
            Statement::Query(_)
            | Statement::ShowTables { .. }
            | Statement::ShowColumns { .. }
            | Statement::ShowFunctions { .. }
            | Statement::ShowDatabases { .. }
            | Statement::ShowSchemas { .. }
            | Statement::ShowViews { .. }
            | Statement::ExplainTable { .. } => true,
            Statement::Explain {
                statement, analyze, ..
            } => !*analyze && reads(statement),
            _ => false,
        }
    }
    match stmts.iter().find(|s| !reads(s)) {
        None => Ok(()),
        Some(s) => {
            let text = s.to_string();
            let head: String = text
                .split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" ");
            Err(Error::Usage(format!(
                "read-only SQL: `{head} …` would write or change the engine's state and is refused; rerun with --allow-writes to run it"
            )))
        }
    }
}

/// The refusal of [`SqlAccess::options`] as the user sees it.
fn refused(e: datafusion::error::DataFusionError) -> Error {
    let why = match &e {
        datafusion::error::DataFusionError::Plan(m) => m.clone(),
        other => other.to_string(),
    };
    Error::Usage(format!(
        "read-only SQL: {why} (COPY, INSERT, CREATE, DROP and SET are refused); rerun with --allow-writes to run it"
    ))
}

/// Most `bucket × column` cells one chunk keeps (per partition).
pub const MAX_CELLS: usize = 4 << 20;

/// Which aggregates to keep besides `last`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Aggs {
    /// min, max, sum and count per bucket and column.
    pub stats: bool,
}

/// Buckets of one chunk: `[origin + i·width, origin + (i+1)·width)` for `i < n`.
#[derive(Debug, Clone)]
pub struct Buckets {
    pub origin_ns: i64,
    pub width_ns: i64,
    pub n: usize,
    pub cols: usize,
    /// Per bucket: time of its last row (`i64::MIN`: no row).
    pub last_ts: Vec<i64>,
    /// `n × cols`: the last row's values; `valid` says which are non-null.
    pub last: Vec<u64>,
    pub valid: Vec<bool>,
    pub min: Vec<u64>,
    pub max: Vec<u64>,
    pub sum: Vec<f64>,
    pub count: Vec<u64>,
    /// The chunk's first row (time, values, validity), if any.
    pub first: Option<(i64, Vec<u64>, Vec<bool>)>,
    /// Rows scanned.
    pub rows: u64,
    /// Scratch of [`Buckets::add_batch`]: (bucket, row) pairs whose values become the bucket's
    /// last ones, in batch order.
    picks: Vec<(usize, usize)>,
}

impl Buckets {
    /// `n` empty buckets of `cols` columns from `origin_ns`.
    pub fn new(origin_ns: i64, width_ns: i64, n: usize, cols: usize, aggs: Aggs) -> Self {
        let cells = n * cols;
        let s = if aggs.stats { cells } else { 0 };
        Self {
            origin_ns,
            width_ns,
            n,
            cols,
            last_ts: vec![i64::MIN; n],
            last: vec![0; cells],
            valid: vec![false; cells],
            min: vec![u64::MAX; s],
            max: vec![0; s],
            sum: vec![0.0; s],
            count: vec![0; s],
            first: None,
            rows: 0,
            picks: Vec::new(),
        }
    }

    /// Makes a recycled state hold `n` empty buckets from `origin_ns` again (keeps its
    /// allocations: a fresh multi-MB state per chunk cost a page fault per 4 KiB, ~20 % of a
    /// stream-resolution scan in perf).
    fn reset(&mut self, origin_ns: i64, width_ns: i64, n: usize, aggs: Aggs) {
        let cells = n * self.cols;
        let s = if aggs.stats { cells } else { 0 };
        self.origin_ns = origin_ns;
        self.width_ns = width_ns;
        self.n = n;
        self.last_ts.clear();
        self.last_ts.resize(n, i64::MIN);
        self.last.resize(cells, 0);
        self.valid.clear();
        self.valid.resize(cells, false);
        self.min.clear();
        self.min.resize(s, u64::MAX);
        self.max.clear();
        self.max.resize(s, 0);
        self.sum.clear();
        self.sum.resize(s, 0.0);
        self.count.clear();
        self.count.resize(s, 0);
        self.first = None;
        self.rows = 0;
    }

    /// Start of bucket `i`.
    pub fn start(&self, i: usize) -> i64 {
        self.origin_ns + i as i64 * self.width_ns
    }

    /// Last value of column `c` in bucket `i`.
    pub fn last(&self, i: usize, c: usize) -> Option<u64> {
        let k = i * self.cols + c;
        self.valid[k].then(|| self.last[k])
    }

    /// Adds the rows of `b` whose `ts` lies in `[lo, hi)` (the scan prunes with statistics but
    /// does not filter rows, so the window's edges are exact here).
    fn add_batch(&mut self, b: &RecordBatch, aggs: Aggs, lo: i64, hi: i64) {
        let ts = b.column(0).as_primitive::<TimestampNanosecondType>();
        let ts = ts.values();
        if ts.is_empty() {
            return;
        }
        let cols: Vec<&arrow_array::PrimitiveArray<UInt64Type>> = (1..b.num_columns())
            .map(|i| b.column(i).as_primitive::<UInt64Type>())
            .collect();
        let inside = |t: i64| t >= lo && t < hi;
        // First row of the chunk.
        let mut first: Option<(usize, i64)> = None;
        for (i, t) in ts.iter().enumerate() {
            if inside(*t) && first.is_none_or(|(_, f)| *t < f) {
                first = Some((i, *t));
            }
        }
        let Some((fi, fts)) = first else { return };
        if self.first.as_ref().is_none_or(|(t, _, _)| fts < *t) {
            let v = cols.iter().map(|c| c.values()[fi]).collect();
            let ok = cols.iter().map(|c| c.is_valid(fi)).collect();
            self.first = Some((fts, v, ok));
        }
        let w = self.width_ns;
        let origin = self.origin_ns;
        let bucket = |t: i64| ((t - origin) / w) as usize;
        let mut picks = std::mem::take(&mut self.picks);
        picks.clear();
        let mut start = 0;
        while start < ts.len() {
            if !inside(ts[start]) {
                start += 1;
                continue;
            }
            let b0 = bucket(ts[start]);
            let mut end = start + 1;
            let (mut li, mut lts) = (start, ts[start]);
            while end < ts.len() && inside(ts[end]) && bucket(ts[end]) == b0 {
                if ts[end] >= lts {
                    (li, lts) = (end, ts[end]);
                }
                end += 1;
            }
            self.rows += (end - start) as u64;
            if b0 < self.n {
                if lts >= self.last_ts[b0] {
                    self.last_ts[b0] = lts;
                    picks.push((b0, li));
                }
                if aggs.stats {
                    let base = b0 * self.cols;
                    for (c, a) in cols.iter().enumerate() {
                        let vals = &a.values()[start..end];
                        let k = base + c;
                        if a.null_count() == 0 {
                            let (mut mn, mut mx, mut sm) = (self.min[k], self.max[k], 0.0);
                            for v in vals {
                                mn = mn.min(*v);
                                mx = mx.max(*v);
                                sm += *v as f64;
                            }
                            self.min[k] = mn;
                            self.max[k] = mx;
                            self.sum[k] += sm;
                            self.count[k] += vals.len() as u64;
                        } else {
                            for (j, v) in vals.iter().enumerate() {
                                if a.is_valid(start + j) {
                                    self.min[k] = self.min[k].min(*v);
                                    self.max[k] = self.max[k].max(*v);
                                    self.sum[k] += *v as f64;
                                    self.count[k] += 1;
                                }
                            }
                        }
                    }
                }
            }
            start = end;
        }
        // The picked rows' values, a tile of rows at a time and one column at a time within it:
        // each column is read in runs, and the tile's buckets stay in cache across the columns
        // (row by row, every row read one value from each of hundreds of columns).
        const TILE: usize = 64;
        let stride = self.cols;
        for tile in picks.chunks(TILE) {
            for (c, a) in cols.iter().enumerate() {
                let v = a.values();
                match a.nulls() {
                    None => {
                        for &(b0, li) in tile {
                            self.last[b0 * stride + c] = v[li];
                            self.valid[b0 * stride + c] = true;
                        }
                    }
                    Some(nb) => {
                        for &(b0, li) in tile {
                            self.last[b0 * stride + c] = v[li];
                            self.valid[b0 * stride + c] = nb.is_valid(li);
                        }
                    }
                }
            }
        }
        self.picks = picks;
    }

    fn merge(&mut self, o: &Buckets, aggs: Aggs) {
        self.rows += o.rows;
        if let Some(f) = &o.first {
            if self.first.as_ref().is_none_or(|(t, _, _)| f.0 < *t) {
                self.first = Some(f.clone());
            }
        }
        for i in 0..self.n {
            if o.last_ts[i] > self.last_ts[i] {
                self.last_ts[i] = o.last_ts[i];
                let r = i * self.cols..(i + 1) * self.cols;
                self.last[r.clone()].copy_from_slice(&o.last[r.clone()]);
                self.valid[r.clone()].copy_from_slice(&o.valid[r]);
            }
        }
        if aggs.stats {
            for k in 0..self.min.len() {
                self.min[k] = self.min[k].min(o.min[k]);
                self.max[k] = self.max[k].max(o.max[k]);
                self.sum[k] += o.sum[k];
                self.count[k] += o.count[k];
            }
        }
    }
}

/// A progress bar that appears only when a scan runs longer than a second (and stderr is a
/// terminal).
#[derive(Debug)]
pub struct Progress {
    bar: ProgressBar,
    started: Instant,
    shown: std::sync::atomic::AtomicBool,
}

impl Progress {
    pub fn new(what: &str) -> Self {
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::hidden());
        bar.set_style(
            ProgressStyle::with_template(
                "{spinner} {msg} [{elapsed_precise}] {human_pos} rows scanned ({per_sec})",
            )
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        );
        bar.set_message(what.to_string());
        Self {
            bar,
            started: Instant::now(),
            shown: false.into(),
        }
    }

    pub fn inc(&self, rows: u64) {
        use std::sync::atomic::Ordering;
        if !self.shown.load(Ordering::Relaxed) && self.started.elapsed().as_secs_f64() > 1.0 {
            self.shown.store(true, Ordering::Relaxed);
            self.bar.set_draw_target(ProgressDrawTarget::stderr());
        }
        self.bar.inc(rows);
    }

    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

/// Time buckets of a window: `width` aligned to multiples of `width` since the epoch (or the
/// whole window as one bucket when `width` is `None`).
#[derive(Debug, Clone, Copy)]
pub struct Grid {
    pub origin_ns: i64,
    pub width_ns: i64,
    pub n: usize,
}

impl Grid {
    pub fn new(r: &TimeRange, width_ns: Option<i64>) -> Self {
        match width_ns {
            None => Self {
                origin_ns: r.from_ns,
                width_ns: r.len_ns(),
                n: 1,
            },
            Some(w) => {
                let origin = r.from_ns.div_euclid(w) * w;
                let n = ((r.to_ns - origin + w - 1) / w) as usize;
                Self {
                    origin_ns: origin,
                    width_ns: w,
                    n,
                }
            }
        }
    }
}

/// `r` narrowed to the session's data in it (`[first, last]` sample): a fine grid over a long window
/// of sparse data (a fleet's one-hour window over a switch that sent a few ms) would otherwise
/// walk every empty bucket. `None` when the session has no data in `r`. Bucket alignment is
/// unchanged (grids align to multiples of their width since the epoch).
///
/// # Errors
/// Engine failures.
pub async fn clamp_to_data(cat: &Catalog, s: &Session, r: &TimeRange) -> Result<Option<TimeRange>> {
    let Some((first, last)) = cat.extent_in(s, r).await? else {
        return Ok(None);
    };
    let c = TimeRange {
        from_ns: r.from_ns.max(first),
        to_ns: r.to_ns.min(last.saturating_add(1)),
    };
    Ok((c.to_ns > c.from_ns).then_some(c))
}

/// A resolution flag: `None` = the whole window, `stream` = the data's own interval.
///
/// # Errors
/// An unparsable duration, or no data to measure the stream interval from.
pub async fn resolve_resolution(
    cat: &Catalog,
    s: &Session,
    r: &TimeRange,
    res: Option<&str>,
) -> Result<Option<i64>> {
    match res {
        None => Ok(None),
        Some("stream") | Some("native") => Ok(Some(stream_interval(cat, s, r).await?)),
        Some(d) => Ok(Some(crate::window::parse_duration_ns(d)?)),
    }
}

/// The session's snapshot interval, measured from the first rows of the window.
///
/// # Errors
/// Fewer than two rows in the window.
pub async fn stream_interval(cat: &Catalog, s: &Session, r: &TimeRange) -> Result<i64> {
    use arrow_array::cast::AsArray;
    use arrow_array::types::TimestampNanosecondType;
    let df = cat
        .ctx
        .table(s.table.as_str())
        .await?
        .filter(crate::catalog::time_filter(r))?
        .select(vec![datafusion::logical_expr::col("ts")])?
        .limit(0, Some(4096))?;
    let mut ts: Vec<i64> = Vec::new();
    for b in df.collect().await? {
        ts.extend(
            b.column(0)
                .as_primitive::<TimestampNanosecondType>()
                .values()
                .iter(),
        );
    }
    ts.sort_unstable();
    if let Some(d) = ts.windows(2).map(|w| w[1] - w[0]).filter(|d| *d > 0).min() {
        return Ok(d);
    }
    // Name the range that exists, as an empty window without `-r stream` does.
    if ts.is_empty() {
        return Err(cat.empty_window(s, r).await);
    }
    let exists = match cat.extent(s).await? {
        Some((a, b)) => format!(
            "; data exists for {}..{}",
            crate::window::fmt_ts(a),
            crate::window::fmt_ts(b)
        ),
        None => String::new(),
    };
    Err(Error::NotFound(format!(
        "one snapshot of {}/{} in {r} (at {}): cannot tell the stream's interval{exists} (widen --last, or use --from/--to)",
        s.profile,
        s.group,
        crate::window::fmt_ts(ts[0])
    )))
}

/// Scans one chunk: `streams` (partitions of one scan) each on its own task, merged into `acc`.
async fn scan_chunk(
    streams: Vec<SendableRecordBatchStream>,
    mut acc: Buckets,
    spare: Vec<Buckets>,
    aggs: Aggs,
    lo: i64,
    hi: i64,
) -> Result<(Buckets, Vec<Buckets>)> {
    if streams.len() == 1 {
        // One partition: fill `acc` directly, on a worker thread.
        let mut st = streams
            .into_iter()
            .next()
            .ok_or_else(|| Error::Usage("no stream".into()))?;
        let acc = tokio::spawn(async move {
            while let Some(batch) = st.next().await {
                acc.add_batch(&batch?, aggs, lo, hi);
            }
            Ok::<_, Error>(acc)
        })
        .await
        .map_err(|e| Error::Usage(format!("scan task failed: {e}")))??;
        return Ok((acc, spare));
    }
    let mut spare = spare;
    let mut handles = Vec::new();
    for mut st in streams {
        let mut b = spare
            .pop()
            .unwrap_or_else(|| Buckets::new(0, 1, 0, acc.cols, aggs));
        b.reset(acc.origin_ns, acc.width_ns, acc.n, aggs);
        handles.push(tokio::spawn(async move {
            while let Some(batch) = st.next().await {
                b.add_batch(&batch?, aggs, lo, hi);
            }
            Ok::<_, Error>(b)
        }));
    }
    for h in handles {
        let b = h
            .await
            .map_err(|e| Error::Usage(format!("scan task failed: {e}")))??;
        acc.merge(&b, aggs);
        spare.push(b);
    }
    Ok((acc, spare))
}

/// Scans `columns` of `s` over `r` on `grid`, calling `each` with consecutive chunks of buckets
/// in time order. Returns rows scanned.
///
/// A window that fits one chunk is scanned with all partitions (file byte ranges) in parallel.
/// A longer one is cut into chunks of at most [`MAX_CELLS`] cells; each chunk is one
/// single-partition scan, and as many chunks as the context has target partitions run at once
/// (each on its own task) while `each` receives them strictly in time order — so every core
/// works on a time-local slice of the files, which splitting each chunk by bytes could not do
/// (a chunk of one row group gave one core all of the work).
///
/// # Errors
/// Engine failures, or whatever `each` returns.
#[expect(clippy::too_many_arguments, reason = "the resolved scan, spelled out")]
pub async fn scan_buckets(
    cat: &Catalog,
    s: &Session,
    columns: &[String],
    r: &TimeRange,
    grid: Grid,
    aggs: Aggs,
    progress: &Progress,
    mut each: impl FnMut(&Buckets) -> Result<()>,
) -> Result<u64> {
    let ncols = columns.len();
    let per_chunk = (MAX_CELLS / ncols.max(1)).max(1);
    let parallel = cat.ctx.state().config().target_partitions().max(1);
    let mut chunks = Vec::new();
    let mut i0 = 0;
    while i0 < grid.n {
        let n = per_chunk.min(grid.n - i0);
        let origin = grid.origin_ns + i0 as i64 * grid.width_ns;
        let range = TimeRange {
            from_ns: origin.max(r.from_ns),
            to_ns: (origin + n as i64 * grid.width_ns).min(r.to_ns),
        };
        chunks.push((origin, n, range));
        i0 += n;
    }
    let partitions = if chunks.len() == 1 { parallel } else { 1 };
    // Recycled bucket states (see [`Buckets::reset`]).
    let pool: std::sync::Mutex<Vec<Buckets>> = std::sync::Mutex::new(Vec::new());
    let take = || {
        pool.lock()
            .ok()
            .and_then(|mut p| p.pop())
            .unwrap_or_else(|| Buckets::new(0, 1, 0, ncols, aggs))
    };
    let give = |b: Buckets| {
        if let Ok(mut p) = pool.lock() {
            p.push(b);
        }
    };
    let mut results = futures::stream::iter(chunks)
        .map(|(origin, n, range)| {
            let mut acc = take();
            acc.reset(origin, grid.width_ns, n, aggs);
            let spare: Vec<Buckets> = (1..partitions).map(|_| take()).collect();
            async move {
                let streams = cat.scan_partitions(s, columns, &range, partitions).await?;
                scan_chunk(streams, acc, spare, aggs, range.from_ns, range.to_ns).await
            }
        })
        .buffered(parallel);
    let mut rows = 0;
    while let Some(res) = results.next().await {
        let (acc, spare) = res?;
        progress.inc(acc.rows);
        rows += acc.rows;
        each(&acc)?;
        give(acc);
        spare.into_iter().for_each(give);
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{TimestampNanosecondArray, UInt64Array};
    use arrow_schema::{DataType, Field, Schema, TimeUnit};

    use super::*;

    fn batch(ts: &[i64], v: &[Option<u64>]) -> RecordBatch {
        let schema = Schema::new(vec![
            Field::new(
                "ts",
                DataType::Timestamp(TimeUnit::Nanosecond, Some("UTC".into())),
                false,
            ),
            Field::new("a", DataType::UInt64, true),
        ]);
        RecordBatch::try_new(
            Arc::new(schema),
            vec![
                Arc::new(TimestampNanosecondArray::from(ts.to_vec()).with_timezone("UTC")),
                Arc::new(UInt64Array::from(v.to_vec())),
            ],
        )
        .unwrap()
    }

    #[test]
    fn last_values_across_tiles_with_nulls_and_unsorted_rows() {
        // 300 rows of one bucket each (more than one tile of picked rows), some null, then
        // rows that land in earlier buckets again: a later row of a bucket replaces its last
        // value only when it is not older.
        let aggs = Aggs::default();
        let n = 300;
        let mut ts: Vec<i64> = (0..n as i64).map(|i| i * 10 + 5).collect();
        let mut v: Vec<Option<u64>> = (0..n as u64)
            .map(|i| (i % 7 != 3).then_some(i * 3))
            .collect();
        ts.extend([15, 12, 2_000]);
        v.extend([Some(1_000), Some(2_000), None]);
        let mut b = Buckets::new(0, 10, n, 1, aggs);
        b.add_batch(&batch(&ts, &v), aggs, 0, n as i64 * 10);
        for (i, &vi) in v.iter().enumerate().take(n) {
            let want = match i {
                // A row as new as the bucket's last replaces it (15 again); older ones do not
                // (12 in bucket 1, 2,000 in bucket 200).
                1 => Some(1_000),
                _ => vi,
            };
            assert_eq!(b.last(i, 0), want, "bucket {i}");
        }
        assert_eq!(b.last_ts[1], 15);
        assert_eq!(b.rows, n as u64 + 3);
    }

    #[test]
    fn last_min_max_per_bucket_across_partitions() {
        let aggs = Aggs { stats: true };
        let mut a = Buckets::new(0, 10, 3, 1, aggs);
        a.add_batch(
            &batch(&[0, 5, 9, 10], &[Some(1), Some(7), Some(3), Some(4)]),
            aggs,
            0,
            30,
        );
        let mut b = Buckets::new(0, 10, 3, 1, aggs);
        // 30 lies outside the window: ignored.
        b.add_batch(
            &batch(&[15, 19, 30, 25], &[Some(9), None, Some(99), Some(11)]),
            aggs,
            0,
            30,
        );
        a.merge(&b, aggs);
        assert_eq!(a.last(0, 0), Some(3));
        assert_eq!(a.last(1, 0), None, "bucket 1's last row is null");
        assert_eq!(a.last_ts[1], 19);
        assert_eq!(a.last(2, 0), Some(11));
        assert_eq!((a.min[0], a.max[0], a.count[0]), (1, 7, 3));
        assert_eq!((a.min[1], a.max[1], a.count[1]), (4, 9, 2));
        assert_eq!(a.first.as_ref().unwrap().0, 0);
        assert_eq!(a.rows, 7);
        // A recycled state is empty again.
        a.reset(100, 10, 2, aggs);
        assert_eq!(
            (a.n, a.last_ts.len(), a.valid.len(), a.min.len()),
            (2, 2, 2, 2)
        );
        assert_eq!((a.last(0, 0), a.rows, a.first.is_none()), (None, 0, true));
    }

    #[test]
    fn rows_outside_the_window_do_not_count() {
        let aggs = Aggs::default();
        let mut a = Buckets::new(0, 10, 2, 1, aggs);
        a.add_batch(
            &batch(
                &[2, 4, 6, 12, 25],
                &[Some(1), Some(2), Some(3), Some(4), Some(5)],
            ),
            aggs,
            4,
            20,
        );
        assert_eq!(a.rows, 3);
        assert_eq!(a.first.as_ref().unwrap().0, 4);
        assert_eq!((a.last(0, 0), a.last(1, 0)), (Some(3), Some(4)));
    }

    #[test]
    fn remote_sql_must_only_read() {
        let ro = SqlAccess::ReadOnly;
        for q in [
            "SELECT switch, COUNT(*) AS n, COUNT(`Ethernet0.IF_OUT_DISCARDS`) AS c FROM lake \
             WHERE `group` = 'PORT' GROUP BY switch ORDER BY switch",
            "WITH x AS (SELECT 1 AS a) SELECT a FROM x",
            "EXPLAIN SELECT 1",
            "SHOW TABLES",
        ] {
            assert!(check_remote_sql(q, ro).is_ok(), "{q}");
        }
        for q in [
            "INSERT INTO lake SELECT * FROM lake",
            "CREATE TABLE t AS SELECT 1",
            "SELECT 1; DROP TABLE lake",
            "SET spark.sql.shuffle.partitions = 1",
            "EXPLAIN ANALYZE INSERT INTO lake SELECT * FROM lake",
        ] {
            let e = check_remote_sql(q, ro).unwrap_err().to_string();
            assert!(e.contains("--allow-writes"), "{q}: {e}");
            assert!(check_remote_sql(q, SqlAccess::ReadWrite).is_ok(), "{q}");
        }
    }

    #[test]
    fn grid_aligns_to_the_epoch() {
        let g = Grid::new(
            &TimeRange {
                from_ns: 15,
                to_ns: 41,
            },
            Some(10),
        );
        assert_eq!((g.origin_ns, g.n), (10, 4));
        let g = Grid::new(
            &TimeRange {
                from_ns: 15,
                to_ns: 41,
            },
            None,
        );
        assert_eq!((g.origin_ns, g.width_ns, g.n), (15, 26, 1));
    }
}
