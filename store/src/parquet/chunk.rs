//! The column-chunk encoder: row-major counter batches straight into Parquet pages.
//!
//! Why not `ArrowWriter`: at 64 ports × 30 stats a session is 1,921 columns, and the generic
//! path costs per column per call (a fresh column writer per row group with a 1 MiB encoder
//! buffer, level bookkeeping, a statistics pass, a value-at-a-time bit packer), on top of a
//! transpose into 1,921 Arrow arrays. Profiled it wrote 30–45 M samples per CPU-second. This
//! encoder reads the decoder's row-major rows in tiles of [`TILE_ROWS`] (the rows of one tile
//! stay in L1/L2 while all columns are taken from them), keeps one small state per column
//! (previous value, a 128-delta block, min/max, validity) and packs DELTA_BINARY_PACKED blocks
//! directly. Pages are `DATA_PAGE_V2` (levels stay uncompressed, values are compressed with the
//! configured codec), written with parquet's own page writer; finished column chunks are spliced
//! into the file with `SerializedRowGroupWriter::append_column`, so the footer, schema and
//! `ARROW:schema` are parquet's and any reader (pyarrow, DuckDB, DataFusion) reads them.
//!
//! Layout decisions stay those of the wide layout (`PERSISTENCE.md`): one file per session,
//! `ts` plus one nullable UInt64 column per counter, chunk-level min/max statistics (page
//! statistics and page indexes cost per column × page and are not written).

use std::{io::Write, sync::Arc};

use ::parquet::{
    arrow::{add_encoded_arrow_schema_to_metadata, ArrowSchemaConverter},
    basic::{Compression, Encoding, PageType, ZstdLevel},
    column::{
        page::{CompressedPage, Page, PageWriteSpec, PageWriter},
        writer::ColumnCloseResult,
    },
    errors::{ParquetError, Result},
    file::{
        metadata::{ColumnChunkMetaData, KeyValue},
        properties::WriterProperties,
        reader::{ChunkReader, Length},
        statistics::Statistics,
        writer::{SerializedFileWriter, SerializedPageWriter, TrackedWrite},
    },
    schema::types::ColumnDescPtr,
};
use bytes::Bytes;
use crossbeam_channel::{Receiver, Sender};

use super::{
    simd::{Kernel, StripOut, STRIP},
    Codec, CounterEncoding,
};
use crate::{batch::CounterBatch, schema::SessionSchema};

mod series;
pub(crate) use series::{PagedChunk, SeriesPage};

/// Rows taken from the row-major batch at a time: 128 rows × 15 KiB (a 1,920-counter row) stay
/// cache-resident while every column gathers its values from them.
const TILE_ROWS: usize = 128;
/// DELTA_BINARY_PACKED block: 128 deltas in 4 miniblocks of 32 (what parquet-rs writes for
/// INT32; readers accept any block that is a multiple of 128 with miniblocks of multiples of 32).
const BLOCK: usize = 128;
const MINIBLOCKS: usize = 4;
const MINI: usize = BLOCK / MINIBLOCKS;

/// How pages are encoded and cut.
#[derive(Debug, Clone, Copy)]
pub(crate) struct EncodeOptions {
    pub(crate) encoding: CounterEncoding,
    pub(crate) codec: Codec,
    pub(crate) level: i32,
    pub(crate) page_rows: usize,
    pub(crate) row_group_rows: usize,
}

impl EncodeOptions {
    pub(crate) fn compression(&self) -> Compression {
        match self.codec {
            Codec::Lz4 => Compression::LZ4_RAW,
            Codec::Zstd => Compression::ZSTD(ZstdLevel::try_new(self.level).unwrap_or_default()),
            Codec::None => Compression::UNCOMPRESSED,
        }
    }
}

/// One open Parquet file of one session.
///
/// Counter columns live in `shards` (contiguous column ranges, multiples of eight columns) so
/// the [`EncodePool`] can encode them on several threads; file order is the shard order.
pub(crate) struct PartFile<W: Write + Send> {
    file: SerializedFileWriter<W>,
    ts: ColumnState,
    shards: Vec<Vec<ColumnState>>,
    /// First counter column of each shard.
    shard_start: Vec<usize>,
    /// All columns, `ts` first.
    descrs: Vec<ColumnDescPtr>,
    /// Counter column → template part.
    part_of: Vec<u8>,
    width: usize,
    opts: EncodeOptions,
    compression: Compression,
    kernel: Kernel,
    pool: Arc<EncodePool>,
    rows_in_group: usize,
    rows_in_page: usize,
    rows_total: u64,
    /// Every counter column of the open page has had every row so far (no null yet), so all
    /// have the same DELTA block layout and the vectorised path can run.
    aligned: bool,
    /// Off only in tests: every row through the general (column at a time) path, the reference
    /// the vectorised path must match byte for byte.
    vectorised: bool,
    fast: FastRows,
    gathered: Vec<u64>,
    valid: Vec<bool>,
}

impl<W: Write + Send> std::fmt::Debug for PartFile<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PartFile")
            .field("columns", &(self.width + 1))
            .field("rows_in_group", &self.rows_in_group)
            .field("kernel", &self.kernel.name())
            .finish_non_exhaustive()
    }
}

/// Rows of the open page waiting for a full DELTA block (< 128 of them), by reference to their
/// batches (no copy), and a copy of the row before them.
#[derive(Debug, Default)]
struct FastRows {
    /// The last row already encoded (the deltas of the next block start from it).
    prev: Arc<Vec<u64>>,
    started: bool,
    pending: Vec<(Arc<CounterBatch>, usize, usize)>,
    rows: usize,
}

/// A run of whole DELTA blocks handed to the shards: `prev` then the rows of `ranges`.
#[derive(Debug, Clone)]
struct BlockRows {
    prev: Arc<Vec<u64>>,
    ranges: Arc<Vec<(Arc<CounterBatch>, usize, usize)>>,
    width: usize,
}

impl BlockRows {
    /// `prev` followed by every row, as slices.
    fn slices(&self) -> Vec<&[u64]> {
        let mut v = Vec::with_capacity(1 + self.ranges.iter().map(|r| r.2 - r.1).sum::<usize>());
        v.push(self.prev.as_slice());
        for (b, s, e) in self.ranges.iter() {
            v.extend((*s..*e).map(|r| &b.values[r * self.width..(r + 1) * self.width]));
        }
        v
    }
}

/// Encodes DELTA blocks of `rows` (`rows[0]` = the row before) into `cols` (counter columns
/// `first..first + cols.len()`): whole strips of eight columns with the SIMD kernel, the rest
/// one column at a time.
fn encode_blocks(kernel: Kernel, rows: &[&[u64]], first: usize, cols: &mut [ColumnState]) {
    let total = rows.len() - 1;
    let mut out = StripOut::default();
    let mut gathered = Vec::with_capacity(BLOCK);
    let strips = cols.len() / STRIP;
    let tile_cols = tile_cols();
    let tile_strips = (tile_cols / STRIP).max(1);
    // The tile buffer stays with the thread (reused by every call: no allocation, no page
    // faults on a fresh 264 KB per decoder batch).
    let mut tile = TILE.take();
    let mut b0 = 0;
    while b0 < total {
        let n = (total - b0).min(BLOCK);
        let block = &rows[b0..=b0 + n];
        // Two passes per tile of columns: copy the block's rows of the tile (sequential runs of
        // `TILE_COLS` values per row, which hardware prefetchers follow) into a buffer that
        // stays in L2, then run the strips over it. Straight from the batch, a strip's 129 rows
        // are 129 lines in 129 pages and every load waits for memory.
        if tile_cols == 0 {
            for s in 0..strips {
                let c0 = first + s * STRIP;
                kernel.strip(block, c0, n, &mut out);
                update_strip(&mut cols[s * STRIP..(s + 1) * STRIP], &out, block[n], c0, n);
            }
        }
        for t0 in (0..strips).step_by(tile_strips).filter(|_| tile_cols > 0) {
            let ts = tile_strips.min(strips - t0);
            let (tc0, tw) = (first + t0 * STRIP, ts * STRIP);
            tile.clear();
            for r in block {
                tile.extend_from_slice(&r[tc0..tc0 + tw]);
            }
            let trows: Vec<&[u64]> = tile.chunks_exact(tw).collect();
            for s in t0..t0 + ts {
                let c0 = first + s * STRIP;
                kernel.strip(&trows, c0 - tc0, n, &mut out);
                update_strip(&mut cols[s * STRIP..(s + 1) * STRIP], &out, block[n], c0, n);
            }
        }
        for (k, col) in cols.iter_mut().enumerate().skip(strips * STRIP) {
            let c = first + k;
            gathered.clear();
            gathered.extend(block[1..].iter().map(|r| r[c]));
            col.push(&gathered, None);
            // A partial block (the page's last) stays open in the column; flushed with the page.
        }
        b0 += n;
    }
    TILE.set(tile);
}

thread_local! {
    /// [`encode_blocks`]' tile buffer, one per encoding thread.
    static TILE: std::cell::Cell<Vec<u64>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Columns per tile of [`encode_blocks`]: (128 + 1) rows × 256 × 8 B = 264 KB, in L2.
const TILE_COLS: usize = 256;

/// [`TILE_COLS`], or `STEL_ENCODE_TILE_COLS` (a bench knob: 0 = strips straight from the batch,
/// the encoder before tiles; a multiple of 8 otherwise), read once.
fn tile_cols() -> usize {
    static COLS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *COLS.get_or_init(|| {
        std::env::var("STEL_ENCODE_TILE_COLS")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .map_or(TILE_COLS, |c| c / STRIP * STRIP)
    })
}

/// Takes one strip's encoded block into its eight columns.
fn update_strip(cols: &mut [ColumnState], out: &StripOut, last: &[u64], c0: usize, n: usize) {
    for (j, col) in cols.iter_mut().enumerate() {
        col.packed.extend_from_slice(out.bytes(j));
        col.prev = last[c0 + j];
        col.n += n as u32;
        col.page_rows += n as u32;
        if col.any {
            col.min = col.min.min(out.lo[j]);
            col.max = col.max.max(out.hi[j]);
        } else {
            (col.min, col.max, col.any) = (out.lo[j], out.hi[j], true);
        }
    }
}

/// The threads that encode a row group's column chunks: the caller plus `threads - 1` workers.
/// Column ranges (shards) move to a worker with each task and come back with the answer, so
/// no column state is ever shared.
pub(crate) struct EncodePool {
    workers: Vec<PoolWorker>,
}

type Task = Box<dyn FnOnce(&mut [ColumnState]) -> Result<()> + Send>;

struct PoolWorker {
    tx: Option<Sender<(Vec<ColumnState>, Task)>>,
    rx: Receiver<(Vec<ColumnState>, Result<()>)>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for EncodePool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EncodePool")
            .field("threads", &self.threads())
            .finish()
    }
}

impl EncodePool {
    /// A pool of `threads` encoding threads (at least 1: the caller).
    ///
    /// # Errors
    /// A worker thread could not be started.
    pub(crate) fn new(threads: usize) -> std::io::Result<Self> {
        let mut workers = Vec::new();
        for i in 1..threads.max(1) {
            let (tx, task_rx) = crossbeam_channel::bounded::<(Vec<ColumnState>, Task)>(1);
            let (done_tx, rx) = crossbeam_channel::bounded(1);
            let thread = std::thread::Builder::new()
                .name(format!("stel-parquet-enc-{i}"))
                .spawn(move || {
                    while let Ok((mut shard, task)) = task_rx.recv() {
                        let r = task(&mut shard);
                        if done_tx.send((shard, r)).is_err() {
                            break;
                        }
                    }
                })?;
            workers.push(PoolWorker {
                tx: Some(tx),
                rx,
                thread: Some(thread),
            });
        }
        Ok(Self { workers })
    }

    /// Encoding threads, the caller included.
    pub(crate) fn threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Runs `f(shard index, shard)` on every shard, shard 0 on the calling thread, and waits.
    fn run<F>(&self, shards: &mut [Vec<ColumnState>], f: F) -> Result<()>
    where
        F: Fn(usize, &mut [ColumnState]) -> Result<()> + Clone + Send + 'static,
    {
        let mut sent = 0;
        let mut result = Ok(());
        for (i, shard) in shards.iter_mut().enumerate().skip(1) {
            let Some(w) = self.workers.get(i - 1) else {
                result = result.and(f(i, shard));
                continue;
            };
            let g = f.clone();
            let task: Task = Box::new(move |cols| g(i, cols));
            match w
                .tx
                .as_ref()
                .map(|tx| tx.send((std::mem::take(shard), task)))
            {
                Some(Ok(())) => sent += 1,
                Some(Err(e)) => {
                    // The worker is gone: take the shard back and do it here.
                    let (cols, task) = e.into_inner();
                    *shard = cols;
                    result = result.and(task(shard));
                }
                None => result = result.and(f(i, shard)),
            }
        }
        if let Some(s0) = shards.first_mut() {
            result = result.and(f(0, s0));
        }
        for (i, shard) in shards.iter_mut().enumerate().skip(1).take(sent) {
            match self.workers[i - 1].rx.recv() {
                Ok((cols, r)) => {
                    *shard = cols;
                    result = result.and(r);
                }
                Err(_) => {
                    result = Err(ParquetError::General(
                        "a parquet encoder thread died".into(),
                    ))
                }
            }
        }
        result
    }
}

impl Drop for EncodePool {
    fn drop(&mut self) {
        for w in &mut self.workers {
            drop(w.tx.take());
            if let Some(t) = w.thread.take() {
                let _ = t.join();
            }
        }
    }
}

impl<W: Write + Send> PartFile<W> {
    /// Opens a file for `schema` with `props` (their key-value metadata is kept; `ARROW:schema`
    /// is added so Arrow readers get the wide schema's types and field metadata back). Column
    /// chunks are encoded on `pool`.
    pub(crate) fn try_new(
        file: W,
        schema: &SessionSchema,
        props: WriterProperties,
        opts: EncodeOptions,
        pool: Arc<EncodePool>,
    ) -> Result<Self> {
        let arrow = schema.wide_arrow_schema();
        let descr = ArrowSchemaConverter::new().convert(&arrow)?;
        let mut props = props;
        add_encoded_arrow_schema_to_metadata(&arrow, &mut props);
        let descrs: Vec<ColumnDescPtr> = descr.columns().to_vec();
        let file = SerializedFileWriter::new(file, descr.root_schema_ptr(), Arc::new(props))?;
        let width = descrs.len() - 1;
        let part_of = (0..width)
            .map(|col| {
                schema
                    .part_offsets
                    .partition_point(|&off| off <= col)
                    .saturating_sub(1) as u8
            })
            .collect();
        // ts is always DELTA: timestamps rise by the stream interval.
        let ts = ColumnState::new(
            CounterEncoding::DeltaBinaryPacked,
            false,
            descrs[0].max_def_level() > 0,
        );
        // Shards of whole strips, one per thread (fewer for narrow sessions).
        let strips = width.div_ceil(STRIP).max(1);
        let per = strips.div_ceil(pool.threads()) * STRIP;
        let mut shards = Vec::new();
        let mut shard_start = Vec::new();
        let mut c = 0;
        while c < width {
            let end = (c + per).min(width);
            shard_start.push(c);
            shards.push(
                (c..end)
                    .map(|k| {
                        ColumnState::new(opts.encoding, true, descrs[k + 1].max_def_level() > 0)
                    })
                    .collect(),
            );
            c = end;
        }
        Ok(Self {
            file,
            ts,
            shards,
            shard_start,
            descrs,
            part_of,
            width,
            compression: opts.compression(),
            opts,
            kernel: Kernel::detect(),
            pool,
            rows_in_group: 0,
            rows_in_page: 0,
            rows_total: 0,
            aligned: true,
            vectorised: true,
            fast: FastRows::default(),
            gathered: Vec::new(),
            valid: Vec::new(),
        })
    }

    /// Appends rows `start..end` of `batch` (whose schema is this file's). The file may keep a
    /// reference to the batch until a DELTA block is complete.
    pub(crate) fn write(
        &mut self,
        batch: &Arc<CounterBatch>,
        start: usize,
        end: usize,
    ) -> Result<()> {
        let width = batch.schema.width();
        if width != self.width {
            return Err(ParquetError::General(format!(
                "batch has {width} counters, the file {}",
                self.width
            )));
        }
        let mut r = start;
        while r < end {
            let room_group = self.opts.row_group_rows - self.rows_in_group;
            let room_page = self.opts.page_rows.saturating_sub(self.rows_in_page).max(1);
            let n = (end - r).min(room_group).min(room_page);
            self.push_rows(batch, r, r + n)?;
            r += n;
            self.rows_in_group += n;
            self.rows_in_page += n;
            self.rows_total += n as u64;
            if self.rows_in_page >= self.opts.page_rows {
                self.finish_pages()?;
            }
            if self.rows_in_group >= self.opts.row_group_rows {
                self.flush()?;
            }
        }
        Ok(())
    }

    /// Rows `r0..r1` into the open page of every column.
    fn push_rows(&mut self, batch: &Arc<CounterBatch>, r0: usize, r1: usize) -> Result<()> {
        self.gathered.clear();
        self.gathered
            .extend(batch.ts[r0..r1].iter().map(|&t| t as u64));
        self.ts.push(&self.gathered, None);
        let masked = !batch.part_masks.is_empty() && {
            let all = batch.part_masks[r0..r1]
                .iter()
                .fold(u32::MAX, |a, &x| a & x);
            let parts = batch.schema.parts().max(1);
            let want = if parts >= 32 {
                u32::MAX
            } else {
                (1u32 << parts) - 1
            };
            all & want != want
        };
        let delta = self.opts.encoding == CounterEncoding::DeltaBinaryPacked;
        if delta && self.aligned && !masked && self.vectorised {
            return self.push_fast(batch, r0, r1);
        }
        if self.aligned {
            self.spill_pending();
            self.aligned = false;
        }
        // The general path: one column at a time, in tiles that stay in cache.
        let width = self.width;
        let mut t0 = r0;
        while t0 < r1 {
            let t1 = (t0 + TILE_ROWS).min(r1);
            let rows = &batch.values[t0 * width..t1 * width];
            let masks = masked.then(|| &batch.part_masks[t0..t1]);
            for (shard, &first) in self.shards.iter_mut().zip(&self.shard_start) {
                for (k, col) in shard.iter_mut().enumerate() {
                    let c = first + k;
                    self.gathered.clear();
                    self.gathered
                        .extend(rows.chunks_exact(width).map(|row| row[c]));
                    let v = match masks {
                        None => None,
                        Some(m) => {
                            let bit = 1u32 << self.part_of[c];
                            self.valid.clear();
                            self.valid.extend(m.iter().map(|&x| x & bit != 0));
                            Some(self.valid.as_slice())
                        }
                    };
                    col.push(&self.gathered, v);
                }
            }
            t0 = t1;
        }
        Ok(())
    }

    /// The vectorised path: rows wait (by reference) until a DELTA block is complete, then
    /// every shard encodes the complete blocks.
    fn push_fast(&mut self, batch: &Arc<CounterBatch>, mut r0: usize, r1: usize) -> Result<()> {
        let width = self.width;
        if !self.fast.started {
            // The page's first row is its DELTA header's first value.
            let row = &batch.values[r0 * width..(r0 + 1) * width];
            for (shard, &first) in self.shards.iter_mut().zip(&self.shard_start) {
                for (k, col) in shard.iter_mut().enumerate() {
                    col.push(std::slice::from_ref(&row[first + k]), None);
                }
            }
            self.fast.prev = Arc::new(row.to_vec());
            self.fast.started = true;
            r0 += 1;
        }
        if r0 < r1 {
            self.fast.pending.push((Arc::clone(batch), r0, r1));
            self.fast.rows += r1 - r0;
        }
        if self.fast.rows >= BLOCK {
            self.encode_pending(false)?;
        }
        Ok(())
    }

    /// Encodes the pending rows' whole blocks (and, when `last`, the partial block that ends
    /// the page) on the pool.
    fn encode_pending(&mut self, last: bool) -> Result<()> {
        let take = if last {
            self.fast.rows
        } else {
            self.fast.rows / BLOCK * BLOCK
        };
        if take == 0 {
            return Ok(());
        }
        // Split the pending ranges at `take` rows.
        let mut now = Vec::new();
        let mut left = take;
        let mut rest = Vec::new();
        for (b, s, e) in std::mem::take(&mut self.fast.pending) {
            if left == 0 {
                rest.push((b, s, e));
            } else if e - s <= left {
                left -= e - s;
                now.push((b, s, e));
            } else {
                now.push((Arc::clone(&b), s, s + left));
                rest.push((b, s + left, e));
                left = 0;
            }
        }
        let rows = BlockRows {
            prev: Arc::clone(&self.fast.prev),
            ranges: Arc::new(now),
            width: self.width,
        };
        let kernel = self.kernel;
        let starts: Arc<[usize]> = self.shard_start.clone().into();
        let job_rows = rows.clone();
        self.pool.run(&mut self.shards, move |i, cols| {
            encode_blocks(kernel, &job_rows.slices(), starts[i], cols);
            Ok(())
        })?;
        // The next block's deltas start from the last row taken.
        if let Some((b, _, e)) = rows.ranges.last() {
            self.fast.prev = Arc::new(b.values[(e - 1) * self.width..e * self.width].to_vec());
        }
        self.fast.pending = rest;
        self.fast.rows -= take;
        // Done with these rows: their buffers may go back to the decoders.
        if let Ok(ranges) = Arc::try_unwrap(rows.ranges) {
            ranges
                .into_iter()
                .for_each(|(b, _, _)| crate::batch::release(b));
        }
        Ok(())
    }

    /// Leaving the vectorised path mid-page (a row with a missing part): the pending rows go to
    /// the columns one at a time, which then continue on their own.
    fn spill_pending(&mut self) {
        let width = self.width;
        let pending = std::mem::take(&mut self.fast.pending);
        self.fast.rows = 0;
        for (shard, &first) in self.shards.iter_mut().zip(&self.shard_start) {
            for (k, col) in shard.iter_mut().enumerate() {
                let c = first + k;
                self.gathered.clear();
                for (b, s, e) in &pending {
                    self.gathered
                        .extend((*s..*e).map(|r| b.values[r * width + c]));
                }
                if !self.gathered.is_empty() {
                    col.push(&self.gathered, None);
                }
            }
        }
        pending
            .into_iter()
            .for_each(|(b, _, _)| crate::batch::release(b));
    }

    /// Closes the open page of every column (encoded in parallel).
    fn finish_pages(&mut self) -> Result<()> {
        if self.rows_in_page == 0 {
            return Ok(());
        }
        if self.aligned {
            self.encode_pending(true)?;
        }
        let opts = self.opts;
        self.ts.finish_page(&opts)?;
        self.pool.run(&mut self.shards, move |_, cols| {
            cols.iter_mut().try_for_each(|c| c.finish_page(&opts))
        })?;
        self.rows_in_page = 0;
        self.aligned = true;
        self.fast.started = false;
        Ok(())
    }

    /// Closes the row group in progress (if it has rows) and writes it to the file.
    pub(crate) fn flush(&mut self) -> Result<()> {
        if self.rows_in_group == 0 {
            return Ok(());
        }
        self.finish_pages()?;
        let compression = self.compression;
        let mut rg = self.file.next_row_group()?;
        let cols = std::iter::once(&mut self.ts).chain(self.shards.iter_mut().flatten());
        for (col, descr) in cols.zip(&self.descrs) {
            let (chunk, close) = col.take_chunk(descr, compression)?;
            rg.append_column(&chunk, close)?;
        }
        rg.close()?;
        self.rows_in_group = 0;
        Ok(())
    }

    /// Bytes held for the row group in progress: encoded pages, open pages' state and the rows
    /// waiting for a full DELTA block.
    pub(crate) fn in_progress_size(&self) -> usize {
        self.ts.memory()
            + self
                .shards
                .iter()
                .flatten()
                .map(ColumnState::memory)
                .sum::<usize>()
            + self.fast.rows * self.width * 8
    }

    /// Bytes written to the file so far (row groups flushed).
    pub(crate) fn bytes_written(&self) -> usize {
        self.file.bytes_written()
    }

    pub(crate) fn append_key_value_metadata(&mut self, kv: KeyValue) {
        self.file.append_key_value_metadata(kv);
    }

    /// Flushes, writes the footer and returns the file.
    pub(crate) fn into_inner(mut self) -> Result<W> {
        self.flush()?;
        self.file.into_inner()
    }
}

/// Encodes `batches` (one session) into an in-memory Parquet file exactly as the sink would
/// (same encoder, writer properties, layout and `encode_threads`, no footer key-values beyond
/// the schema's): for benchmarks, the encoding table and the differential fuzz target.
///
/// # Errors
/// Batches of different schemas, or an encoder error.
pub fn encode_in_memory(
    batches: &[Arc<CounterBatch>],
    cfg: &super::ParquetSinkConfig,
) -> Result<Vec<u8>> {
    let pool =
        EncodePool::new(cfg.encode_threads()).map_err(|e| ParquetError::External(e.into()))?;
    encode_with(batches, cfg, Arc::new(pool), None)
}

/// Writes one session's batches into a Parquet file exactly as the history does (the same
/// column-chunk encoder, writer properties, layout and `ARROW:schema`), for copies made from
/// the history: `stel-query export` re-encodes the files it trims through it. `kv` is the
/// footer's key-value metadata (a copy keeps its original's static keys); keys only known at
/// the end (first/last timestamp, rows) go to [`FileEncoder::finish`].
pub struct FileEncoder<W: Write + Send> {
    part: PartFile<W>,
}

impl<W: Write + Send> std::fmt::Debug for FileEncoder<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileEncoder")
            .field("part", &self.part)
            .finish()
    }
}

impl<W: Write + Send> FileEncoder<W> {
    /// A file of `schema`'s session into `out`, encoded per `cfg` (encoding, codec, row-group
    /// and page sizes, encode threads).
    ///
    /// # Errors
    /// The encode threads could not be started, or the schema cannot be written.
    pub fn new(
        out: W,
        schema: &SessionSchema,
        cfg: &super::ParquetSinkConfig,
        kv: Vec<KeyValue>,
    ) -> Result<Self> {
        let pool =
            EncodePool::new(cfg.encode_threads()).map_err(|e| ParquetError::External(e.into()))?;
        let props = cfg
            .writer_properties()
            .into_builder()
            .set_key_value_metadata(Some(kv))
            .build();
        Ok(Self {
            part: PartFile::try_new(out, schema, props, EncodeOptions::from(cfg), Arc::new(pool))?,
        })
    }

    /// Appends the rows of `b` (the file's session).
    ///
    /// # Errors
    /// A batch of another width, or an encoder error.
    pub fn write(&mut self, b: &Arc<CounterBatch>) -> Result<()> {
        self.part.write(b, 0, b.rows())
    }

    /// Adds `kv` to the footer, writes it and returns the output.
    ///
    /// # Errors
    /// An encoder or I/O error.
    pub fn finish(mut self, kv: Vec<KeyValue>) -> Result<W> {
        for k in kv {
            self.part.append_key_value_metadata(k);
        }
        self.part.into_inner()
    }
}

/// How [`encode_with`] encodes DELTA blocks: the detected kernel, a given one, or (the
/// reference) the general path only.
#[derive(Debug, Clone, Copy)]
#[cfg_attr(not(test), expect(dead_code, reason = "only tests choose the path"))]
pub(crate) enum Path {
    Kernel(Kernel),
    General,
}

/// [`encode_in_memory`] on a given pool and, in tests, kernel.
pub(crate) fn encode_with(
    batches: &[Arc<CounterBatch>],
    cfg: &super::ParquetSinkConfig,
    pool: Arc<EncodePool>,
    path: Option<Path>,
) -> Result<Vec<u8>> {
    let Some(first) = batches.first() else {
        return Ok(Vec::new());
    };
    let mut f = PartFile::try_new(
        Vec::new(),
        &first.schema,
        cfg.writer_properties(),
        EncodeOptions::from(cfg),
        pool,
    )?;
    match path {
        None => {}
        Some(Path::Kernel(k)) => f.kernel = k,
        Some(Path::General) => f.vectorised = false,
    }
    for b in batches {
        if *b.schema != *first.schema {
            return Err(ParquetError::General(
                "batches of different sessions".into(),
            ));
        }
        f.write(b, 0, b.rows())?;
    }
    f.into_inner()
}

/// The SIMD kernel this machine uses for DELTA blocks (`avx512`, `avx2` or `scalar`).
pub fn kernel_name() -> &'static str {
    Kernel::detect().name()
}

impl From<&super::ParquetSinkConfig> for EncodeOptions {
    fn from(cfg: &super::ParquetSinkConfig) -> Self {
        Self {
            encoding: cfg.encoding,
            codec: cfg.compression,
            level: cfg.compression_level,
            page_rows: cfg.page_rows,
            row_group_rows: cfg.row_group_rows,
        }
    }
}

/// One column's encoder state: the open page and the chunk's finished pages. Values are u64
/// (INT64 columns; INT32 columns with [`ColumnState::int32`]: zero-extended u32, deltas in
/// 32-bit wrapping arithmetic as readers of INT32 DELTA pages decode them).
pub(crate) struct ColumnState {
    encoding: CounterEncoding,
    unsigned: bool,
    nullable: bool,
    int32: bool,
    /// Definition levels as runs ([`put_def_levels_runs`]) rather than the plain bitmap.
    level_runs: bool,
    // The open page.
    page_rows: u32,
    page_nulls: u32,
    /// Validity of the page's rows, LSB first, only once a null was seen (else all valid).
    validity: Option<Vec<u8>>,
    /// Non-null values in the page.
    n: u32,
    first: u64,
    prev: u64,
    block: [i64; BLOCK],
    /// INT32 columns: the open block's deltas on 32-bit lanes (`BLOCK` of them; empty for
    /// INT64 columns, whose deltas are in `block`).
    block32: Vec<i32>,
    in_block: usize,
    /// DELTA blocks packed so far.
    packed: Vec<u8>,
    /// The page's values (PLAIN / BYTE_STREAM_SPLIT).
    raw: Vec<u64>,
    // The chunk (row group) so far.
    chunk: Chunk,
    chunk_pages: u32,
    first_page_offset: u64,
    chunk_compressed: u64,
    chunk_uncompressed: u64,
    chunk_rows: u64,
    chunk_nulls: u64,
    min: u64,
    max: u64,
    any: bool,
    /// Packs the miniblocks of at most 32 bits ([`pack_mini32`]).
    kernel: Kernel,
}

impl ColumnState {
    pub(crate) fn new(encoding: CounterEncoding, unsigned: bool, nullable: bool) -> Self {
        Self {
            encoding,
            unsigned,
            nullable,
            int32: false,
            level_runs: false,
            page_rows: 0,
            page_nulls: 0,
            validity: None,
            n: 0,
            first: 0,
            prev: 0,
            block: [0; BLOCK],
            block32: Vec::new(),
            in_block: 0,
            packed: Vec::new(),
            raw: Vec::new(),
            chunk: Chunk::default(),
            chunk_pages: 0,
            first_page_offset: 0,
            chunk_compressed: 0,
            chunk_uncompressed: 0,
            chunk_rows: 0,
            chunk_nulls: 0,
            min: 0,
            max: 0,
            any: false,
            kernel: Kernel::detect(),
        }
    }

    /// The same column with INT32 physical values (u8/u16/u32 columns): each value is a
    /// zero-extended u32, deltas wrap at 32 bits (so a miniblock is at most 32 bits wide) and
    /// the statistics are INT32.
    pub(crate) fn int32(mut self) -> Self {
        self.int32 = true;
        self.block32 = vec![0; BLOCK];
        self
    }

    /// Bytes of the chunk's finished pages so far: (as written, before compression).
    pub(crate) fn chunk_sizes(&self) -> (u64, u64) {
        (self.chunk_compressed, self.chunk_uncompressed)
    }

    /// The same column with its definition levels written as runs ([`put_def_levels_runs`]):
    /// for columns that are null for long stretches.
    pub(crate) fn level_runs(mut self) -> Self {
        self.level_runs = true;
        self
    }

    /// Appends `n` null rows.
    pub(crate) fn push_nulls(&mut self, n: usize) {
        let rows = self.page_rows as usize;
        let bits = self.validity.get_or_insert_with(|| {
            let mut b = Vec::new();
            set_valid(&mut b, 0, rows);
            b
        });
        bits.resize((rows + n).div_ceil(8).max(bits.len()), 0);
        self.page_nulls += n as u32;
        self.page_rows += n as u32;
    }

    /// Encodes the open page and appends it to the chunk. Compressed only where that makes it
    /// smaller (a DATA_PAGE_V2 says per page whether its values are compressed).
    pub(crate) fn finish_page(&mut self, opts: &EncodeOptions) -> Result<()> {
        if self.page_rows == 0 {
            return Ok(());
        }
        thread_local! {
            static SCRATCH: std::cell::RefCell<(Vec<u8>, Vec<u8>, Vec<u8>)> = const {
                std::cell::RefCell::new((Vec::new(), Vec::new(), Vec::new()))
            };
        }
        SCRATCH.with(|s| {
            let (values, compressed, levels) = &mut *s.borrow_mut();
            self.finish_page_with(opts, values, compressed, levels)
        })
    }

    fn finish_page_with(
        &mut self,
        opts: &EncodeOptions,
        values: &mut Vec<u8>,
        compressed: &mut Vec<u8>,
        levels: &mut Vec<u8>,
    ) -> Result<()> {
        values.clear();
        let encoding = self.finish_values(values);
        levels.clear();
        self.write_def_levels(levels);
        let spec = write_page_v2(
            &mut self.chunk,
            opts,
            PageV2 {
                levels,
                values,
                encoding,
                rows: self.page_rows,
                nulls: self.page_nulls,
            },
            compressed,
        )?;
        if self.chunk_pages == 0 {
            self.first_page_offset = spec.offset;
        }
        self.chunk_pages += 1;
        self.chunk_compressed += spec.compressed_size as u64;
        self.chunk_uncompressed += spec.uncompressed_size as u64;
        self.chunk_rows += u64::from(self.page_rows);
        self.chunk_nulls += u64::from(self.page_nulls);
        self.reset_page();
        Ok(())
    }

    pub(crate) fn memory(&self) -> usize {
        self.packed.capacity()
            + self.raw.capacity() * 8
            + self.chunk.memory()
            + self.validity.as_ref().map_or(0, Vec::capacity)
    }

    fn reset_page(&mut self) {
        self.page_rows = 0;
        self.page_nulls = 0;
        self.validity = None;
        self.n = 0;
        self.in_block = 0;
        self.packed.clear();
        self.raw.clear();
    }

    /// Appends rows (`valid[i] == false`: row `i` is null and `vals[i]` is ignored).
    pub(crate) fn push(&mut self, vals: &[u64], valid: Option<&[bool]>) {
        let rows = self.page_rows as usize;
        match valid {
            None => {
                if let Some(bits) = &mut self.validity {
                    set_valid(bits, rows, vals.len());
                }
                self.push_values(vals);
            }
            Some(valid) => {
                let nulls = self.mark_valid(valid);
                if nulls == 0 {
                    self.push_values(vals);
                } else {
                    for (v, _) in vals.iter().zip(valid).filter(|(_, ok)| **ok) {
                        self.push_values(std::slice::from_ref(v));
                    }
                }
            }
        }
        self.page_rows = (rows + vals.len()) as u32;
    }

    /// Appends `valid.len()` rows whose non-null values are `vals`, in order (`vals.len()` =
    /// the rows `valid` marks valid): no per-row pass over the values for the nulls.
    pub(crate) fn push_dense(&mut self, vals: &[u64], valid: &[bool]) {
        let rows = self.page_rows as usize;
        let nulls = self.mark_valid(valid);
        debug_assert_eq!(vals.len() + nulls, valid.len());
        self.push_values(vals);
        self.page_rows = (rows + valid.len()) as u32;
    }

    /// [`Self::push`] of an INT32 column's values (u8/u16/u32 zero-extended to u32), every row
    /// valid: deltas, statistics and miniblock widths on 32-bit lanes.
    pub(crate) fn push32(&mut self, vals: &[u32]) {
        let rows = self.page_rows as usize;
        if let Some(bits) = &mut self.validity {
            set_valid(bits, rows, vals.len());
        }
        self.push_values32(vals);
        self.page_rows = (rows + vals.len()) as u32;
    }

    /// [`Self::push_dense`] of an INT32 column's values.
    pub(crate) fn push_dense32(&mut self, vals: &[u32], valid: &[bool]) {
        let rows = self.page_rows as usize;
        let nulls = self.mark_valid(valid);
        debug_assert_eq!(vals.len() + nulls, valid.len());
        self.push_values32(vals);
        self.page_rows = (rows + valid.len()) as u32;
    }

    /// Records the validity of `valid.len()` more rows (the page's row count is the caller's);
    /// returns their nulls, counted in the page.
    fn mark_valid(&mut self, valid: &[bool]) -> usize {
        let rows = self.page_rows as usize;
        let nulls = valid.iter().filter(|&&v| !v).count();
        if nulls > 0 || self.validity.is_some() {
            let bits = self.validity.get_or_insert_with(|| {
                let mut b = Vec::new();
                set_valid(&mut b, 0, rows);
                b
            });
            bits.resize((rows + valid.len()).div_ceil(8).max(bits.len()), 0);
            for (i, &ok) in valid.iter().enumerate() {
                if ok {
                    bits[(rows + i) / 8] |= 1 << ((rows + i) % 8);
                }
            }
        }
        self.page_nulls += nulls as u32;
        nulls
    }

    /// Non-null values, in order; each is one row.
    fn push_values(&mut self, vals: &[u64]) {
        if vals.is_empty() {
            return;
        }
        if self.int32 && self.encoding == CounterEncoding::DeltaBinaryPacked {
            // INT32 values given as u64: their low 32 bits on the 32-bit lanes.
            let mut v32 = [0u32; BLOCK];
            for c in vals.chunks(BLOCK) {
                for (d, &v) in v32.iter_mut().zip(c) {
                    *d = v as u32;
                }
                self.push_values32(&v32[..c.len()]);
            }
            return;
        }
        // A run of the page's last value (constant columns): zero deltas, min/max unchanged.
        if self.encoding == CounterEncoding::DeltaBinaryPacked
            && self.n > 0
            && vals.iter().all(|&v| v == self.prev)
        {
            self.push_zero_deltas(vals.len());
            return;
        }
        let (mut lo, mut hi) = if self.any {
            (self.min, self.max)
        } else {
            (vals[0], vals[0])
        };
        if self.unsigned {
            let (a, b) = min_max(vals, |v| v, (lo, hi));
            (lo, hi) = (a, b);
        } else {
            let (a, b) = min_max(vals, |v| v as i64, (lo as i64, hi as i64));
            (lo, hi) = (a as u64, b as u64);
        }
        self.min = lo;
        self.max = hi;
        self.any = true;
        if self.encoding != CounterEncoding::DeltaBinaryPacked {
            self.raw.extend_from_slice(vals);
            self.n += vals.len() as u32;
            return;
        }
        let mut rest = vals;
        if self.n == 0 {
            self.first = rest[0];
            self.prev = rest[0];
            rest = &rest[1..];
        }
        self.n += vals.len() as u32;
        // Deltas a block-sized run at a time: the subtraction loop has no carried state, so it
        // vectorises.
        while !rest.is_empty() {
            let take = (BLOCK - self.in_block).min(rest.len());
            let (run, tail) = rest.split_at(take);
            let dst = &mut self.block[self.in_block..self.in_block + take];
            dst[0] = (run[0] as i64).wrapping_sub(self.prev as i64);
            for (d, w) in dst[1..].iter_mut().zip(run.windows(2)) {
                *d = (w[1] as i64).wrapping_sub(w[0] as i64);
            }
            self.prev = run[take - 1];
            self.in_block += take;
            if self.in_block == BLOCK {
                self.flush_block();
            }
            rest = tail;
        }
    }

    /// `n` more zero deltas (a run of the last value): min/max unchanged.
    fn push_zero_deltas(&mut self, n: usize) {
        self.n += n as u32;
        let mut rest = n;
        while rest > 0 {
            let take = (BLOCK - self.in_block).min(rest);
            if self.int32 {
                self.block32[self.in_block..self.in_block + take].fill(0);
            } else {
                self.block[self.in_block..self.in_block + take].fill(0);
            }
            self.in_block += take;
            if self.in_block == BLOCK {
                self.flush_block();
            }
            rest -= take;
        }
    }

    /// [`Self::push_values`] of an INT32 DELTA column on 32-bit lanes: deltas wrap at 32 bits
    /// (as readers of INT32 DELTA pages decode them); the statistics are those of the u32
    /// values (unsigned order, as the u64 path has them for zero-extended values).
    fn push_values32(&mut self, vals: &[u32]) {
        let Some(&v0) = vals.first() else {
            return;
        };
        if self.n > 0 && vals.iter().all(|&v| v == self.prev as u32) {
            self.push_zero_deltas(vals.len());
            return;
        }
        let (lo, hi) = if self.any {
            (self.min as u32, self.max as u32)
        } else {
            (v0, v0)
        };
        let (mut lo, mut hi) = (lo.min(v0), hi.max(v0));
        let mut rest = vals;
        if self.n == 0 {
            self.first = u64::from(v0);
            self.prev = u64::from(v0);
            rest = &rest[1..];
        }
        self.n += vals.len() as u32;
        let mut prev = self.prev as u32;
        while !rest.is_empty() {
            let take = (BLOCK - self.in_block).min(rest.len());
            let (run, tail) = rest.split_at(take);
            let dst = &mut self.block32[self.in_block..self.in_block + take];
            dst[0] = run[0].wrapping_sub(prev) as i32;
            for (d, w) in dst[1..].iter_mut().zip(run.windows(2)) {
                *d = w[1].wrapping_sub(w[0]) as i32;
            }
            // (Folds: vector min/max reductions.)
            lo = run.iter().fold(lo, |a, &x| a.min(x));
            hi = run.iter().fold(hi, |a, &x| a.max(x));
            prev = run[take - 1];
            self.in_block += take;
            if self.in_block == BLOCK {
                self.flush_block();
            }
            rest = tail;
        }
        self.prev = u64::from(prev);
        self.min = u64::from(lo);
        self.max = u64::from(hi);
        self.any = true;
    }

    /// Packs the deltas of the current block (`in_block` of them; the rest is padding).
    fn flush_block(&mut self) {
        let n = self.in_block;
        if n == 0 {
            return;
        }
        if self.int32 {
            return self.flush_block32();
        }
        // Each miniblock's smallest and largest delta in one pass; the block's minimum is the
        // smallest of them and a miniblock's width that of its largest delta less it.
        let deltas = &mut self.block[..];
        let mut lo = [i64::MAX; MINIBLOCKS];
        let mut hi = [i64::MIN; MINIBLOCKS];
        for (m, d) in deltas[..n].chunks(MINI).enumerate() {
            (lo[m], hi[m]) = min_max(d, |d| d, (i64::MAX, i64::MIN));
        }
        let min = lo.into_iter().min().unwrap_or(0);
        let max = hi.into_iter().max().unwrap_or(0);
        put_zigzag_vlq(&mut self.packed, min);
        let widths_at = self.packed.len();
        self.packed.extend_from_slice(&[0u8; MINIBLOCKS]);
        self.in_block = 0;
        if min == max {
            // Every delta the same (a constant or evenly stepping column): all widths 0.
            return;
        }
        let mut mini = [0u64; MINI];
        let mut mini32 = [0u32; MINI];
        for m in 0..n.div_ceil(MINI) {
            // (Miniblocks without values are not written: their width byte is 0.)
            let w = 64 - (hi[m].wrapping_sub(min) as u64).leading_zeros();
            self.packed[widths_at + m] = w as u8;
            let d = &deltas[m * MINI..(m + 1) * MINI];
            let fill = (n - m * MINI).min(MINI);
            // (The last miniblock's padding: deltas equal to the minimum, packed as 0.)
            if w == 0 {
                continue;
            } else if w <= 32 {
                for (o, &d) in mini32.iter_mut().zip(&d[..fill]) {
                    *o = d.wrapping_sub(min) as u32;
                }
                mini32[fill..].fill(0);
                pack_mini32(self.kernel, &mini32, w, &mut self.packed);
            } else {
                for (o, &d) in mini.iter_mut().zip(&d[..fill]) {
                    *o = d.wrapping_sub(min) as u64;
                }
                mini[fill..].fill(0);
                pack32(&mini, w, &mut self.packed);
            }
        }
    }

    /// [`Self::flush_block`] of an INT32 column: the same block on 32-bit lanes (deltas wrap at
    /// 32 bits, so the widths are at most 32).
    fn flush_block32(&mut self) {
        let n = self.in_block;
        let deltas = &self.block32[..];
        let mut lo = [i32::MAX; MINIBLOCKS];
        let mut hi = [i32::MIN; MINIBLOCKS];
        for (m, d) in deltas[..n].chunks(MINI).enumerate() {
            // (Folds over the 32 deltas: vector min/max reductions.)
            lo[m] = d.iter().fold(i32::MAX, |a, &x| a.min(x));
            hi[m] = d.iter().fold(i32::MIN, |a, &x| a.max(x));
        }
        let min = lo.iter().fold(i32::MAX, |a, &x| a.min(x));
        let max = hi.iter().fold(i32::MIN, |a, &x| a.max(x));
        put_zigzag_vlq(&mut self.packed, i64::from(min));
        let widths_at = self.packed.len();
        self.packed.extend_from_slice(&[0u8; MINIBLOCKS]);
        self.in_block = 0;
        if min == max {
            return;
        }
        let mut mini = [0u32; MINI];
        for m in 0..n.div_ceil(MINI) {
            let w = 32 - (hi[m] as u32).wrapping_sub(min as u32).leading_zeros();
            self.packed[widths_at + m] = w as u8;
            if w == 0 {
                continue;
            }
            let d = &deltas[m * MINI..(m + 1) * MINI];
            let fill = (n - m * MINI).min(MINI);
            for (o, &d) in mini.iter_mut().zip(&d[..fill]) {
                *o = (d as u32).wrapping_sub(min as u32);
            }
            mini[fill..].fill(0);
            pack_mini32(self.kernel, &mini, w, &mut self.packed);
        }
    }

    /// The page's value section (into `out`) and its encoding.
    fn finish_values(&mut self, out: &mut Vec<u8>) -> Encoding {
        match self.encoding {
            CounterEncoding::DeltaBinaryPacked => {
                self.flush_block();
                put_vlq(out, BLOCK as u64);
                put_vlq(out, MINIBLOCKS as u64);
                put_vlq(out, u64::from(self.n));
                let first = if self.int32 {
                    i64::from(self.first as u32 as i32)
                } else {
                    self.first as i64
                };
                put_zigzag_vlq(out, first);
                out.extend_from_slice(&self.packed);
                Encoding::DELTA_BINARY_PACKED
            }
            CounterEncoding::Plain => {
                out.reserve(self.raw.len() * 8);
                for v in &self.raw {
                    out.extend_from_slice(&v.to_le_bytes());
                }
                Encoding::PLAIN
            }
            CounterEncoding::ByteStreamSplit => {
                byte_stream_split(self.raw.iter().map(|v| v.to_le_bytes()), out);
                Encoding::BYTE_STREAM_SPLIT
            }
        }
    }

    /// The page's definition levels (RLE/bit-packed hybrid, no length prefix: DATA_PAGE_V2);
    /// returns their length. Nothing for a required column.
    fn write_def_levels(&self, buf: &mut Vec<u8>) -> usize {
        if !self.nullable {
            return 0;
        }
        let start = buf.len();
        if self.level_runs {
            put_def_levels_runs(buf, self.page_rows, self.validity.as_deref());
        } else {
            put_def_levels(buf, self.page_rows, self.validity.as_deref());
        }
        buf.len() - start
    }

    /// The finished chunk's bytes and what `append_column` needs to know about them.
    pub(crate) fn take_chunk(
        &mut self,
        descr: &ColumnDescPtr,
        compression: Compression,
    ) -> Result<(Chunk, ColumnCloseResult)> {
        let chunk = std::mem::take(&mut self.chunk);
        let mut encodings = vec![self.encoding.parquet()];
        if self.nullable {
            encodings.push(Encoding::RLE);
        }
        let stats = match (self.any, self.int32) {
            (true, false) => Statistics::int64(
                Some(self.min as i64),
                Some(self.max as i64),
                None,
                Some(self.chunk_nulls),
                false,
            ),
            (true, true) => Statistics::int32(
                Some(self.min as u32 as i32),
                Some(self.max as u32 as i32),
                None,
                Some(self.chunk_nulls),
                false,
            ),
            (false, false) => Statistics::int64(None, None, None, Some(self.chunk_nulls), false),
            (false, true) => Statistics::int32(None, None, None, Some(self.chunk_nulls), false),
        };
        let metadata = ColumnChunkMetaData::builder(Arc::clone(descr))
            .set_encodings(encodings)
            .set_compression(compression)
            .set_num_values(self.chunk_rows as i64)
            .set_total_compressed_size(self.chunk_compressed as i64)
            .set_total_uncompressed_size(self.chunk_uncompressed as i64)
            .set_data_page_offset(self.first_page_offset as i64)
            .set_statistics(stats)
            .build()?;
        let close = ColumnCloseResult {
            bytes_written: self.chunk_compressed,
            rows_written: self.chunk_rows,
            metadata,
            bloom_filter: None,
            column_index: None,
            offset_index: None,
        };
        self.chunk_pages = 0;
        self.chunk_compressed = 0;
        self.chunk_uncompressed = 0;
        self.chunk_rows = 0;
        self.chunk_nulls = 0;
        self.any = false;
        Ok((chunk, close))
    }
}

/// BYTE_STREAM_SPLIT values appended to `out`: byte 0 of every value, then byte 1 of every
/// value, and so on (`vals`: each value's little-endian bytes).
pub(crate) fn byte_stream_split<const N: usize>(
    vals: impl ExactSizeIterator<Item = [u8; N]>,
    out: &mut Vec<u8>,
) {
    let n = vals.len();
    let start = out.len();
    out.resize(start + n * N, 0);
    let dst = &mut out[start..];
    for (i, bytes) in vals.enumerate() {
        for (k, byte) in bytes.into_iter().enumerate() {
            dst[k * n + i] = byte;
        }
    }
}

/// One DATA_PAGE_V2 to write: definition levels (already encoded), values and counts.
pub(crate) struct PageV2<'a> {
    /// The definition levels, encoded.
    pub(crate) levels: &'a [u8],
    pub(crate) values: &'a [u8],
    pub(crate) encoding: Encoding,
    pub(crate) rows: u32,
    pub(crate) nulls: u32,
}

/// Writes `page` into `chunk`, its values compressed with the configured codec where that
/// makes them smaller (a DATA_PAGE_V2 says per page whether its values are compressed). The
/// page (header, levels, values) is put together in one buffer of its size, which the chunk
/// keeps: the values are copied once.
pub(crate) fn write_page_v2(
    chunk: &mut Chunk,
    opts: &EncodeOptions,
    page: PageV2<'_>,
    compressed: &mut Vec<u8>,
) -> Result<PageWriteSpec> {
    let PageV2 {
        levels,
        values,
        encoding,
        rows,
        nulls,
    } = page;
    let uncompressed = levels.len() + values.len();
    let (body, is_compressed) = match compress(opts, values, compressed)? {
        Some(c) if c.len() < values.len() => (c, true),
        _ => (values, false),
    };
    let header = PageV2Header::new(PageV2Sizes {
        uncompressed,
        compressed: levels.len() + body.len(),
        def_len: levels.len(),
        rows,
        nulls,
        encoding,
        is_compressed,
    });
    let Some(header) = header else {
        // Sizes past i32 or an encoding the header writer does not know: parquet's writer.
        let mut buf = levels.to_vec();
        buf.extend_from_slice(body);
        let page = Page::DataPageV2 {
            buf: Bytes::from(buf),
            num_values: rows,
            encoding,
            num_nulls: nulls,
            num_rows: rows,
            def_levels_byte_len: levels.len() as u32,
            rep_levels_byte_len: 0,
            is_compressed,
            statistics: None,
        };
        return chunk.write_page(CompressedPage::new(page, uncompressed));
    };
    let h = header.bytes();
    let mut buf = Vec::with_capacity(h.len() + levels.len() + body.len());
    buf.extend_from_slice(h);
    buf.extend_from_slice(levels);
    buf.extend_from_slice(body);
    let mut spec = PageWriteSpec::new();
    spec.page_type = PageType::DATA_PAGE_V2;
    spec.uncompressed_size = uncompressed + h.len();
    spec.compressed_size = buf.len();
    spec.num_values = rows;
    spec.offset = chunk.len() as u64;
    spec.bytes_written = buf.len() as u64;
    chunk.push(Bytes::from(buf));
    Ok(spec)
}

/// What a DATA_PAGE_V2 header says.
struct PageV2Sizes {
    uncompressed: usize,
    compressed: usize,
    def_len: usize,
    rows: u32,
    nulls: u32,
    encoding: Encoding,
    is_compressed: bool,
}

/// A DATA_PAGE_V2 page header in Thrift's compact protocol, byte for byte what parquet's
/// page writer serializes for the same page (no CRC, no statistics; `page_header_is_parquets`
/// compares them).
struct PageV2Header {
    buf: [u8; 64],
    len: usize,
}

impl PageV2Header {
    /// `None` when a size does not fit Thrift's i32 or the encoding is not one the encoders
    /// write.
    fn new(p: PageV2Sizes) -> Option<Self> {
        // The Thrift values of the encodings the encoders write.
        let encoding = match p.encoding {
            Encoding::PLAIN => 0,
            Encoding::RLE => 3,
            Encoding::DELTA_BINARY_PACKED => 5,
            Encoding::RLE_DICTIONARY => 8,
            Encoding::BYTE_STREAM_SPLIT => 9,
            _ => return None,
        };
        let int = |v: usize| i32::try_from(v).ok();
        let fields = [
            int(p.uncompressed)?,
            int(p.compressed)?,
            i32::try_from(p.rows).ok()?,
            i32::try_from(p.nulls).ok()?,
            i32::try_from(p.rows).ok()?,
            encoding,
            int(p.def_len)?,
        ];
        let mut h = Self {
            buf: [0; 64],
            len: 0,
        };
        // Field headers: (id delta << 4) | type (5 = i32, 12 = struct, 1/2 = bool true/false).
        h.byte(0x15);
        h.i32(3); // type: DATA_PAGE_V2
        for &v in &fields[..2] {
            h.byte(0x15);
            h.i32(v); // uncompressed_page_size, compressed_page_size
        }
        h.byte(0x5c); // field 8: data_page_header_v2
        for &v in &fields[2..] {
            h.byte(0x15);
            h.i32(v); // num_values, num_nulls, num_rows, encoding, definition_levels_byte_length
        }
        h.byte(0x15);
        h.i32(0); // repetition_levels_byte_length
        h.byte(if p.is_compressed { 0x11 } else { 0x12 });
        h.byte(0); // end of data_page_header_v2
        h.byte(0); // end of the page header
        Some(h)
    }

    fn byte(&mut self, b: u8) {
        self.buf[self.len] = b;
        self.len += 1;
    }

    /// A zigzag varint (at most 5 bytes).
    fn i32(&mut self, v: i32) {
        let mut z = ((v << 1) ^ (v >> 31)) as u32;
        while z >= 0x80 {
            self.byte(z as u8 | 0x80);
            z >>= 7;
        }
        self.byte(z as u8);
    }

    fn bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

/// A column chunk's pages as written, each page (header and body) in a buffer of its own
/// size: no buffer grows (and is copied again) as the pages of a row group arrive, nothing is
/// concatenated when the chunk is done, and the memory held is the encoded bytes. The file
/// writer reads the pages in order (`append_column`, [`ChunkReader`]).
#[derive(Debug, Default, Clone)]
pub(crate) struct Chunk {
    pages: Vec<Bytes>,
    len: usize,
}

thread_local! {
    /// Where a page is serialized (header + body) before it is copied into its own buffer.
    static PAGE: std::cell::RefCell<TrackedWrite<Vec<u8>>> =
        std::cell::RefCell::new(TrackedWrite::new(Vec::new()));
}

impl Chunk {
    /// Appends `page` (header and body) as the chunk's next page; the spec's offset is the
    /// page's within the chunk.
    pub(crate) fn write_page(&mut self, page: CompressedPage) -> Result<PageWriteSpec> {
        PAGE.with(|w| {
            let mut w = w.borrow_mut();
            let mut spec = SerializedPageWriter::new(&mut *w).write_page(page)?;
            w.flush()?;
            let buf = w.inner_mut();
            let bytes = Bytes::copy_from_slice(buf);
            buf.clear();
            spec.offset = self.len as u64;
            self.push(bytes);
            Ok(spec)
        })
    }

    /// Appends bytes already serialized as pages.
    pub(crate) fn push(&mut self, bytes: Bytes) {
        self.len += bytes.len();
        self.pages.push(bytes);
    }

    /// Appends the pages of `other` (moved, not copied).
    pub(crate) fn append(&mut self, other: Chunk) {
        self.len += other.len;
        self.pages.extend(other.pages);
    }

    /// Bytes of the pages.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Bytes held: the pages and the list of them.
    pub(crate) fn memory(&self) -> usize {
        self.len + self.pages.capacity() * std::mem::size_of::<Bytes>()
    }
}

impl Length for Chunk {
    fn len(&self) -> u64 {
        self.len as u64
    }
}

impl ChunkReader for Chunk {
    type T = ChunkRead;

    fn get_read(&self, start: u64) -> Result<ChunkRead> {
        let mut r = ChunkRead {
            pages: self.pages.clone(),
            page: 0,
            at: 0,
        };
        let mut skip = start as usize;
        while skip > 0 && r.page < r.pages.len() {
            let n = (r.pages[r.page].len() - r.at).min(skip);
            r.at += n;
            skip -= n;
            if r.at == r.pages[r.page].len() {
                r.page += 1;
                r.at = 0;
            }
        }
        Ok(r)
    }

    fn get_bytes(&self, start: u64, length: usize) -> Result<Bytes> {
        let mut out = Vec::with_capacity(length);
        std::io::Read::read_to_end(
            &mut std::io::Read::take(self.get_read(start)?, length as u64),
            &mut out,
        )?;
        if out.len() < length {
            return Err(ParquetError::EOF(format!(
                "{length} bytes at {start} of a {}-byte chunk",
                self.len
            )));
        }
        Ok(Bytes::from(out))
    }
}

/// Reads a [`Chunk`]'s pages in order.
#[derive(Debug)]
pub(crate) struct ChunkRead {
    pages: Vec<Bytes>,
    page: usize,
    at: usize,
}

impl std::io::Read for ChunkRead {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        // (An empty page must not read as the end.)
        while self
            .pages
            .get(self.page)
            .is_some_and(|p| p.len() == self.at)
        {
            self.page += 1;
            self.at = 0;
        }
        let Some(p) = self.pages.get(self.page) else {
            return Ok(0);
        };
        let n = (p.len() - self.at).min(buf.len());
        buf[..n].copy_from_slice(&p[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

/// `data` compressed with the configured codec into `out` (`None`: no codec).
pub(crate) fn compress<'o>(
    opts: &EncodeOptions,
    data: &[u8],
    out: &'o mut Vec<u8>,
) -> Result<Option<&'o [u8]>> {
    Ok(match opts.codec {
        Codec::None => None,
        Codec::Lz4 => {
            out.resize(lz4_flex::block::get_maximum_output_size(data.len()), 0);
            let k = lz4_flex::block::compress_into(data, out)
                .map_err(|e| ParquetError::External(Box::new(e)))?;
            Some(&out[..k])
        }
        Codec::Zstd => {
            out.clear();
            let z = zstd::bulk::compress(data, opts.level)
                .map_err(|e| ParquetError::External(Box::new(e)))?;
            out.extend_from_slice(&z);
            Some(&out[..])
        }
    })
}

/// Definition levels of a page of `rows` rows (RLE/bit-packed hybrid, no length prefix:
/// DATA_PAGE_V2) into `buf`: one RLE run of 1s when every row is valid (`validity` `None`),
/// else the validity bitmap as one bit-packed run of width 1.
pub(crate) fn put_def_levels(buf: &mut Vec<u8>, rows: u32, validity: Option<&[u8]>) {
    match validity {
        None => {
            put_vlq(buf, u64::from(rows) << 1);
            buf.push(1);
        }
        // Groups of 8 levels, LSB first: the bitmap itself.
        Some(bits) => {
            let groups = (rows as usize).div_ceil(8);
            put_vlq(buf, ((groups as u64) << 1) | 1);
            let have = groups.min(bits.len());
            buf.extend_from_slice(&bits[..have]);
            buf.resize(buf.len() + (groups - have), 0);
        }
    }
}

/// Definition levels as [`put_def_levels`] writes them, with runs of whole bytes of the bitmap
/// that are all valid or all null (16 rows or more) as RLE runs: an all-null page is 3 bytes,
/// not a bit per row.
pub(crate) fn put_def_levels_runs(buf: &mut Vec<u8>, rows: u32, validity: Option<&[u8]>) {
    let Some(bits) = validity else {
        put_def_levels(buf, rows, None);
        return;
    };
    let rows = rows as usize;
    let byte = |i: usize| bits.get(i).copied().unwrap_or(0);
    let (full, tail) = (rows / 8, rows % 8);
    // A run waits (value, rows) until it is known whether the last partial byte extends it.
    let mut run: Option<(u8, usize)> = None;
    let put_run = |buf: &mut Vec<u8>, (v, n): (u8, usize)| {
        put_vlq(buf, (n as u64) << 1);
        buf.push(v);
    };
    let put_lit = |buf: &mut Vec<u8>, bytes: &[u8]| {
        put_vlq(buf, ((bytes.len() as u64) << 1) | 1);
        buf.extend_from_slice(bytes);
    };
    let (mut lit, mut i) = (0, 0);
    while i < full {
        let b = byte(i);
        let mut j = i + 1;
        if b == 0 || b == 0xff {
            while j < full && byte(j) == b {
                j += 1;
            }
            if j - i >= 2 {
                if let Some(r) = run.take() {
                    put_run(buf, r);
                }
                if lit < i {
                    put_lit(buf, &bits[lit..i]);
                }
                run = Some((b & 1, (j - i) * 8));
                lit = j;
            }
        }
        i = j;
    }
    let last = byte(full) & ((1u8 << tail) - 1);
    match run {
        // The partial byte continues the run: one run to the end.
        Some((v, n))
            if lit == full && (tail == 0 || last == if v == 1 { (1u8 << tail) - 1 } else { 0 }) =>
        {
            put_run(buf, (v, n + tail));
            return;
        }
        Some(r) => put_run(buf, r),
        None => {}
    }
    let mut rest: Vec<u8> = bits.get(lit..full.min(bits.len())).unwrap_or(&[]).to_vec();
    rest.resize(full - lit, 0);
    if tail > 0 {
        rest.push(last);
    }
    if !rest.is_empty() {
        put_lit(buf, &rest);
    }
}

/// Marks rows `from..from + n` valid in an LSB-first bitmap, growing it as needed.
fn set_valid(bits: &mut Vec<u8>, from: usize, n: usize) {
    let end = from + n;
    bits.resize(end.div_ceil(8).max(bits.len()), 0);
    for r in from..end {
        bits[r / 8] |= 1 << (r % 8);
    }
}

pub(crate) fn put_vlq(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// The smallest and largest of `v` and `init`: four independent lanes, so the compares do not
/// wait on each other (64-bit min/max has no vector instruction below AVX-512; one chain of
/// them was ~7 % of the INT encoder in `perf`).
#[inline(always)]
fn min_max<T: Copy, K: Copy + Ord>(v: &[T], key: impl Fn(T) -> K, init: (K, K)) -> (K, K) {
    let mut lo = [init.0; 4];
    let mut hi = [init.1; 4];
    let mut quads = v.chunks_exact(4);
    for q in &mut quads {
        for j in 0..4 {
            let x = key(q[j]);
            lo[j] = lo[j].min(x);
            hi[j] = hi[j].max(x);
        }
    }
    for &x in quads.remainder() {
        let x = key(x);
        lo[0] = lo[0].min(x);
        hi[0] = hi[0].max(x);
    }
    (
        lo[0].min(lo[1]).min(lo[2].min(lo[3])),
        hi[0].max(hi[1]).max(hi[2].max(hi[3])),
    )
}

fn put_zigzag_vlq(out: &mut Vec<u8>, v: i64) {
    put_vlq(out, ((v << 1) ^ (v >> 63)) as u64);
}

/// [`pack32`] of values below 2^`w` (1 ≤ `w` ≤ 32) on 32-bit lanes: the kernel's vector
/// packer where it has one, else the scalar one.
pub(crate) fn pack_mini32(kernel: Kernel, vals: &[u32; MINI], w: u32, out: &mut Vec<u8>) {
    if !kernel.pack32_lanes(vals, w, out) {
        pack32(&vals.map(u64::from), w, out);
    }
}

/// Packs 32 values of `w` bits each, LSB first, into exactly `4 * w` bytes.
pub(crate) fn pack32(vals: &[u64; MINI], w: u32, out: &mut Vec<u8>) {
    // One monomorphised packer per width: constant shifts, fully unrolled (the generic loop
    // with a runtime width took twice as long in `perf`).
    macro_rules! widths {
        ($($w:literal)*) => {
            match w {
                0 => {}
                $($w => pack32_w::<$w>(vals, out),)*
                _ => {
                    for v in vals {
                        out.extend_from_slice(&v.to_le_bytes());
                    }
                }
            }
        };
    }
    widths!(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31
        32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61
        62 63);
}

#[inline(always)]
fn pack32_w<const W: u32>(vals: &[u64; MINI], out: &mut Vec<u8>) {
    // The words go to a stack buffer, then out in one copy of a constant 4W bytes (growing
    // `out` by zeroes first and copying a variable tail cost a memset and a memcpy call).
    let mut buf = [0u8; 4 * 64 + 8];
    let mut word = 0;
    let mut acc = 0u64;
    let mut bits = 0u32;
    for &v in vals {
        acc |= v << bits;
        bits += W;
        if bits >= 64 {
            buf[word * 8..word * 8 + 8].copy_from_slice(&acc.to_le_bytes());
            word += 1;
            bits -= 64;
            acc = if bits > 0 { v >> (W - bits) } else { 0 };
        }
    }
    // 32 × W bits = 4W bytes: whole 64-bit words plus at most one half.
    if bits > 0 {
        buf[word * 8..word * 8 + 8].copy_from_slice(&acc.to_le_bytes());
    }
    out.extend_from_slice(&buf[..4 * W as usize]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        parquet::{simd::Kernel, ParquetSinkConfig},
        sai::StatKey,
        schema::CounterColumn,
    };

    /// Deterministic noise.
    fn mix(x: u64) -> u64 {
        let x = x.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        (x ^ (x >> 29)).wrapping_mul(0xBF58_476D_1CE4_E5B9) ^ (x >> 32)
    }

    /// `width` columns of every shape the kernels branch on: constant, steps of every width
    /// class (≤ 8, ≤ 16, ≤ 32, > 32 bits), wrapping around u64::MAX, resets, full noise.
    fn batches(width: usize, sizes: &[usize], parts: usize) -> Vec<Arc<CounterBatch>> {
        let columns: Vec<CounterColumn> = (0..width)
            .map(|c| CounterColumn {
                label: c as u16 + 1,
                object: format!("Ethernet{c}"),
                key: StatKey {
                    object_type: 1,
                    stat_id: 0,
                },
            })
            .collect();
        let schema = Arc::new(SessionSchema {
            profile: "p".into(),
            group: "PORT".into(),
            domain: 0,
            template_ids: (0..parts as u16).map(|i| 256 + i).collect(),
            part_offsets: (0..parts).map(|p| p * width / parts).collect(),
            columns,
            generation: 1,
        });
        let mut out = Vec::new();
        let mut row = 0u64;
        for (k, &n) in sizes.iter().enumerate() {
            let mut values = Vec::with_capacity(n * width);
            let mut ts = Vec::new();
            let mut masks = Vec::new();
            for _ in 0..n {
                ts.push(1_700_000_000_000_000_000 + row as i64 * 10_000);
                for c in 0..width as u64 {
                    let r = row;
                    let v = match c % 9 {
                        0 => 42,
                        1 => r * 3 + mix(r ^ c) % 4,
                        2 => r * 1000 + mix(r + c) % 5000,
                        3 => (r << 20) | (mix(c + r) % (1 << 20)),
                        4 => (u64::MAX - 1000).wrapping_add(r * 7 + mix(r) % 3),
                        5 => mix(r * 31 + c),
                        6 => (r % 300) * 17,
                        7 => r.wrapping_mul(1 << 40).wrapping_add(mix(r) % (1 << 36)),
                        _ => (r / 64).wrapping_mul(mix(c)),
                    };
                    values.push(v);
                }
                masks.push(if parts > 1 && mix(row + 7).is_multiple_of(50) {
                    1
                } else {
                    3
                });
                row += 1;
            }
            let part_masks = if parts > 1 && k % 2 == 1 {
                masks
            } else {
                Vec::new()
            };
            out.push(Arc::new(CounterBatch {
                schema: Arc::clone(&schema),
                ts,
                values,
                part_masks,
            }));
        }
        out
    }

    /// Every kernel (and the pool with 1 and 3 threads) writes the same bytes as the general
    /// path, on every page/row-group cut, with and without nulls.
    #[test]
    fn kernels_match_the_general_path_byte_for_byte() {
        for (width, parts) in [(21, 1), (64, 1), (19, 2), (3, 1)] {
            let input = batches(width, &[1, 127, 300, 1, 572, 129, 40, 900], parts);
            for (page_rows, rg) in [(8192, 16384), (300, 700), (129, 128), (1, 5)] {
                let cfg = ParquetSinkConfig {
                    page_rows,
                    row_group_rows: rg,
                    ..ParquetSinkConfig::default()
                };
                let pool = |n| Arc::new(EncodePool::new(n).unwrap());
                let want = encode_with(&input, &cfg, pool(1), Some(Path::General)).unwrap();
                for k in Kernel::available() {
                    for threads in [1, 3] {
                        let got = encode_with(&input, &cfg, pool(threads), Some(Path::Kernel(k)))
                            .unwrap();
                        assert!(
                            got == want,
                            "kernel {} threads {threads} width {width} parts {parts} pages {page_rows}",
                            k.name()
                        );
                    }
                }
            }
        }
    }

    /// A chunk reads back as its pages end to end, from any offset (what `append_column`
    /// and `get_bytes` see).
    #[test]
    fn chunk_reads_its_pages_in_order_from_any_offset() {
        let mut c = Chunk::default();
        let all: Vec<u8> = (0..=255u8).collect();
        for part in [&all[..3], &all[3..3], &all[3..200], &all[200..]] {
            c.push(Bytes::copy_from_slice(part));
        }
        assert_eq!(Length::len(&c), 256);
        for start in [0usize, 1, 3, 150, 200, 255, 256] {
            let mut got = Vec::new();
            std::io::Read::read_to_end(&mut c.get_read(start as u64).unwrap(), &mut got).unwrap();
            assert_eq!(got, &all[start..], "from {start}");
            let n = (256 - start).min(60);
            assert_eq!(
                &c.get_bytes(start as u64, n).unwrap()[..],
                &all[start..start + n]
            );
        }
        assert!(c.get_bytes(250, 7).is_err());
        let mut d = Chunk::default();
        d.push(Bytes::from_static(b"xy"));
        d.append(c);
        assert_eq!(d.len(), 258);
        assert_eq!(&d.get_bytes(1, 3).unwrap()[..], &[b'y', 0, 1]);
    }

    /// The DATA_PAGE_V2 pages written with our own header are byte for byte what parquet's page
    /// writer makes of the same page (header, levels, values; the write specs' sizes too), for
    /// every encoding the encoders use, empty and large pages, with and without nulls, levels
    /// and compression.
    #[test]
    fn page_header_is_parquets() {
        let mut n = 0;
        for encoding in [
            Encoding::PLAIN,
            Encoding::RLE_DICTIONARY,
            Encoding::DELTA_BINARY_PACKED,
            Encoding::BYTE_STREAM_SPLIT,
        ] {
            for (rows, nulls) in [
                (1, 0),
                (63, 9),
                (16_384, 0),
                (16_384, 16_384),
                (3 << 20, 70_001),
            ] {
                for levels_len in [0usize, 3, 300] {
                    for (values_len, codec) in [
                        (0usize, Codec::None),
                        (10, Codec::Lz4),
                        (70_000, Codec::Lz4),
                        (70_000, Codec::None),
                    ] {
                        // Half noise, half zeroes: LZ4 shrinks the long pages, not the short.
                        let values: Vec<u8> = (0..values_len)
                            .map(|i| {
                                if i < values_len / 2 {
                                    mix(i as u64) as u8
                                } else {
                                    0
                                }
                            })
                            .collect();
                        let levels: Vec<u8> = (0..levels_len).map(|i| i as u8).collect();
                        let opts = EncodeOptions {
                            encoding: CounterEncoding::DeltaBinaryPacked,
                            codec,
                            level: 1,
                            page_rows: 16_384,
                            row_group_rows: 1 << 20,
                        };
                        let page = || PageV2 {
                            levels: &levels,
                            values: &values,
                            encoding,
                            rows,
                            nulls,
                        };
                        let mut ours = Chunk::default();
                        ours.push(Bytes::from_static(b"before"));
                        let spec =
                            write_page_v2(&mut ours, &opts, page(), &mut Vec::new()).unwrap();
                        // Parquet's writer on the same page.
                        let mut c = Vec::new();
                        let (body, is_compressed) = match compress(&opts, &values, &mut c).unwrap()
                        {
                            Some(c) if c.len() < values.len() => (c.to_vec(), true),
                            _ => (values.clone(), false),
                        };
                        let mut buf = levels.clone();
                        buf.extend_from_slice(&body);
                        let p = Page::DataPageV2 {
                            buf: Bytes::from(buf),
                            num_values: rows,
                            encoding,
                            num_nulls: nulls,
                            num_rows: rows,
                            def_levels_byte_len: levels_len as u32,
                            rep_levels_byte_len: 0,
                            is_compressed,
                            statistics: None,
                        };
                        let mut theirs = Chunk::default();
                        theirs.push(Bytes::from_static(b"before"));
                        let want = theirs
                            .write_page(CompressedPage::new(p, levels_len + values_len))
                            .unwrap();
                        let what = format!(
                            "{encoding:?} {rows} {nulls} {levels_len} {values_len} {codec:?}"
                        );
                        assert_eq!(
                            ours.get_bytes(0, ours.len()).unwrap(),
                            theirs.get_bytes(0, theirs.len()).unwrap(),
                            "{what}"
                        );
                        assert_eq!(spec.offset, want.offset, "{what}");
                        assert_eq!(spec.compressed_size, want.compressed_size, "{what}");
                        assert_eq!(spec.uncompressed_size, want.uncompressed_size, "{what}");
                        assert_eq!(spec.bytes_written, want.bytes_written, "{what}");
                        assert_eq!(spec.num_values, want.num_values, "{what}");
                        assert_eq!(spec.page_type, want.page_type, "{what}");
                        n += usize::from(is_compressed);
                    }
                }
            }
        }
        assert!(n > 0, "some pages compressed");
    }

    #[test]
    fn vector_packers_write_the_scalar_packers_bytes_at_every_width() {
        // Every kernel of this CPU against the scalar packer (the bit-by-bit reader above
        // checks that one), for every width: values at the width's extremes, mixed ones, and
        // bits above the width (ignored by both).
        let kernels = Kernel::available();
        for w in 1..=32u32 {
            let mask = if w == 32 { u32::MAX } else { (1u32 << w) - 1 };
            let patterns: [fn(usize) -> u32; 5] = [
                |_| u32::MAX,
                |i| (i as u32).wrapping_mul(0x9E37_79B9),
                |i| if i % 2 == 0 { u32::MAX } else { 0 },
                |i| 1u32.rotate_left(i as u32),
                |i| (mix(i as u64 + 7) >> 13) as u32,
            ];
            for (p, f) in patterns.iter().enumerate() {
                let vals: [u32; MINI] = std::array::from_fn(f);
                let mut want = Vec::new();
                pack32(&vals.map(|v| u64::from(v & mask)), w, &mut want);
                for &k in &kernels {
                    let mut got = vec![0xA5];
                    if k.pack32_lanes(&vals, w, &mut got) {
                        assert_eq!(
                            got[1..],
                            want[..],
                            "kernel {} width {w} pattern {p}",
                            k.name()
                        );
                    } else {
                        assert_eq!(got, [0xA5], "kernel {} wrote without packing", k.name());
                    }
                }
                let mut got = Vec::new();
                pack_mini32(Kernel::detect(), &vals.map(|v| v & mask), w, &mut got);
                assert_eq!(got, want, "detected kernel width {w} pattern {p}");
            }
        }
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("avx512vbmi") {
            assert!(
                Kernel::detect().pack32_lanes(&[1; MINI], 1, &mut Vec::new()),
                "the AVX-512 kernel has a vector packer"
            );
        }
    }

    #[test]
    fn pack32_round_trips_every_width() {
        for w in 0..=64u32 {
            let mask = if w == 64 { u64::MAX } else { (1u64 << w) - 1 };
            let mut vals = [0u64; MINI];
            for (i, v) in vals.iter_mut().enumerate() {
                *v = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) & mask;
            }
            let mut out = Vec::new();
            pack32(&vals, w, &mut out);
            assert_eq!(out.len(), 4 * w as usize, "width {w}");
            for (i, &v) in vals.iter().enumerate() {
                let mut got = 0u64;
                for b in 0..w as usize {
                    let bit = i * w as usize + b;
                    got |= u64::from((out[bit / 8] >> (bit % 8)) & 1) << b;
                }
                assert_eq!(got, v, "width {w} value {i}");
            }
        }
    }
}
