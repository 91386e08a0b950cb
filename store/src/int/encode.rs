//! The INT tables' column-chunk encoder: a table's rows straight from the decoder's column
//! buffers ([`Piece`]s of an [`super::IntBatch`], no Arrow arrays) into Parquet pages, on the
//! same page machinery as the counter history ([`crate::parquet::chunk`]).
//!
//! Why not `ArrowWriter`: per value it runs a generic level/statistics/encoder stack, and per
//! file it keeps a column writer with its own page buffers for each of the ~50 columns; it was
//! the INT collector's largest cost (4× receive + decode). Here each column has one small
//! state, chosen by what measures best on INT data (`stel-bench int`, AmLight 5-hop reports;
//! bits per row with LZ4 in brackets, pyarrow's encoders on the same rows):
//!
//! * DELTA_BINARY_PACKED for what rises or repeats in order: `ts`, `seq`, device timestamps,
//!   latency sums, small codes (`hop_index`, versions, flags words). Device timestamps step by a
//!   hop latency inside a report and by the report interval between reports (ingress/egress ts
//!   19.5 bits; a dictionary would be 57).
//! * RLE_DICTIONARY (a dictionary page per row group, indices RLE/bit-packed) for ids, ports,
//!   hashes, addresses, EVC names, queue ids and the per-hop latency and occupancy, which take
//!   few distinct values (flow_key 1.4 vs 2.7 DELTA, node_id 0.5 vs 2.6, ports 1.0 vs 3.4,
//!   latency_ns 12.5 vs 16.6, occupancy 13.3 vs 15.0). The dictionary lives for one row group,
//!   so it is at most `row_group_rows` entries; its memory counts in the sink's budget.
//! * PLAIN bit-packed booleans (mostly constant: the codec takes them to almost nothing).
//!
//! Pages are DATA_PAGE_V2, values compressed with the configured codec where that makes them
//! smaller; finished column chunks are spliced into the file with `append_column`, so the
//! footer, schema and `ARROW:schema` are parquet's and any reader (pyarrow, DuckDB, DataFusion,
//! Spark) reads them. Chunk statistics: min/max of integer columns (`ts` prunes time ranges),
//! null counts everywhere.

use std::{
    io::Write,
    sync::{
        atomic::{AtomicU8, Ordering::Relaxed},
        Arc,
    },
};

use ::parquet::{
    arrow::{add_encoded_arrow_schema_to_metadata, ArrowSchemaConverter},
    basic::{Compression, Encoding, Type as PhysicalType},
    column::{
        page::{CompressedPage, Page},
        writer::ColumnCloseResult,
    },
    data_type::{ByteArray, FixedLenByteArray},
    errors::{ParquetError, Result},
    file::{
        metadata::{ColumnChunkMetaData, KeyValue},
        properties::{WriterProperties, WriterVersion},
        statistics::Statistics,
        writer::SerializedFileWriter,
    },
    schema::types::ColumnDescPtr,
};
use arrow_array::RecordBatch;
use arrow_schema::DataType;
use bytes::Bytes;

use super::{Addr, ColumnRef, EvcName, IntBatch, IntSinkConfig, Piece, Table};
use crate::parquet::{
    chunk::{
        byte_stream_split, compress, pack_mini32, put_def_levels_runs, put_vlq, write_page_v2,
        Chunk, ColumnState, EncodeOptions, PageV2,
    },
    simd::Kernel,
    CounterEncoding,
};

/// Columns written with a dictionary (any table that has them): ids, ports, hashes, addresses,
/// names, and the per-hop values with few distinct values.
const DICTIONARY_COLUMNS: &[&str] = &[
    "flow_key",
    "path_id",
    "vlan",
    "node_id",
    "ingress_port",
    "egress_port",
    "l2_ingress_port",
    "l2_egress_port",
    "queue_id",
    "hop_latency",
    "latency_ns",
    "buffer_id",
    "reporter_addr",
    "src_addr",
    "dst_addr",
    "evc_id",
    "evc_name",
];

/// INT32 columns written BYTE_STREAM_SPLIT: values that vary in their low byte only (queue
/// occupancies in cells), whose three other byte streams the codec folds away — smaller than
/// their dictionary's indices (`benches/int_bytes_floor.py`).
const SPLIT_COLUMNS: &[&str] = &["queue_occupancy"];

/// Rows per page: a page holds 16 Ki values of each column (a few KiB encoded), enough for the
/// codec to find what repeats and few enough page headers not to count.
pub const PAGE_ROWS: usize = 16_384;

impl From<&IntSinkConfig> for EncodeOptions {
    fn from(cfg: &IntSinkConfig) -> Self {
        Self {
            encoding: CounterEncoding::DeltaBinaryPacked,
            codec: cfg.compression,
            level: cfg.compression_level,
            page_rows: PAGE_ROWS,
            row_group_rows: cfg.row_group_rows,
        }
    }
}

/// File properties of an INT table part: the footer's key-value metadata (the page encodings
/// are the encoder's, not these properties').
pub(crate) fn file_properties(kv: Vec<KeyValue>) -> WriterProperties {
    WriterProperties::builder()
        .set_writer_version(WriterVersion::PARQUET_2_0)
        .set_key_value_metadata(Some(kv))
        .build()
}

/// `pieces` (rows of one table, in order) as one Parquet file in memory, exactly as the sink
/// writes a part (same encoder, pages and row groups; no footer key-values besides
/// `ARROW:schema`): for benchmarks and read-back tests.
///
/// # Errors
/// Pieces of different tables.
pub fn encode_in_memory(pieces: &[Piece<'_>], cfg: &IntSinkConfig) -> Result<Vec<u8>> {
    let table = pieces.first().map_or(Table::Reports, |p| p.table);
    let mut f = IntFile::try_new(
        Vec::new(),
        &table.schema(),
        file_properties(Vec::new()),
        EncodeOptions::from(cfg),
        &Codecs::new(table),
    )?;
    for p in pieces {
        if p.table != table {
            return Err(ParquetError::General(format!(
                "{} rows in a {} file",
                p.table.name(),
                table.name()
            )));
        }
        f.write(p)?;
    }
    f.into_inner()
}

/// (table, reporting switch, UTC hour number): one file of [`encode_batches`].
pub type FileKey = (Table, u32, i64);

/// What the INT writer does with `batches`, in memory: one batch after the other, its rows
/// split per (table, reporting switch, UTC hour) ([`IntBatch::split`], a mixed batch's rows
/// regrouped into buffers kept from batch to batch) and each piece encoded into its file
/// while the regrouped rows are still in cache; one file per (table, switch, hour), kept open
/// across batches, footers included, the files of a table sharing their columns' codec
/// decisions; the files in key order. For benchmarks and tests.
///
/// # Errors
/// An encoder error (a bug).
pub fn encode_batches(
    batches: &[IntBatch],
    cfg: &IntSinkConfig,
) -> Result<Vec<(FileKey, Vec<u8>)>> {
    let mut files: std::collections::BTreeMap<FileKey, IntFile<Vec<u8>>> = Default::default();
    let mut scratch = IntBatch::default();
    let codecs = Table::ALL.map(Codecs::new);
    for b in batches {
        for p in b.split(&mut scratch) {
            let f = match files.entry((p.table, p.switch, p.hour)) {
                std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::btree_map::Entry::Vacant(e) => e.insert(IntFile::try_new(
                    Vec::new(),
                    &p.table.schema(),
                    file_properties(Vec::new()),
                    EncodeOptions::from(cfg),
                    &codecs[p.table as usize],
                )?),
            };
            f.write(&p)?;
        }
    }
    files
        .into_iter()
        .map(|(k, f)| Ok((k, f.into_inner()?)))
        .collect()
}

/// The same as [`encode_in_memory`] through parquet's `ArrowWriter` with the properties the
/// INT sink used before this encoder (DELTA integers, dictionaries for the EVC strings, the
/// configured codec): the benchmark's same-run baseline.
///
/// # Errors
/// As [`encode_in_memory`].
pub fn encode_with_arrow_writer(
    table: Table,
    batches: &[RecordBatch],
    cfg: &IntSinkConfig,
) -> Result<Vec<u8>> {
    let mut w = ::parquet::arrow::ArrowWriter::try_new(
        Vec::new(),
        table.schema(),
        Some(cfg.writer_properties()),
    )?;
    for b in batches {
        w.write(b)?;
    }
    w.into_inner()
}

/// One open Parquet file of one INT table.
pub(crate) struct IntFile<W: Write + Send> {
    file: SerializedFileWriter<W>,
    cols: Vec<Column>,
    descrs: Vec<ColumnDescPtr>,
    opts: EncodeOptions,
    compression: Compression,
    rows_in_group: usize,
    rows_in_page: usize,
    scratch: Scratch,
}

/// Rows of a batch going into the open page: which (`sel`), their validity words, the AND and
/// OR of those words, and the EVC names their EVC columns index.
struct Rows<'a> {
    sel: std::ops::Range<usize>,
    valid: &'a [u64],
    and: u64,
    or: u64,
    evcs: &'a [EvcName],
}

/// What a column's rows are: all valid, all null, or mixed (`Scratch::ok`, one flag per row).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Validity {
    All,
    Null,
    Mixed,
}

/// Per-file scratch: a column's values (non-null rows, widened to u64, or to u32 for the
/// columns of at most 32 bits) and its validity.
#[derive(Debug, Default)]
struct Scratch {
    wide: Vec<u64>,
    narrow: Vec<u32>,
    ok: Vec<bool>,
}

impl Scratch {
    /// The validity of column `bit` over `rows` (into `self.ok` when mixed).
    fn validity(&mut self, bit: Option<u32>, rows: &Rows<'_>) -> Validity {
        let Some(bit) = bit else {
            return Validity::All;
        };
        if rows.and >> bit & 1 == 1 {
            return Validity::All;
        }
        if rows.or >> bit & 1 == 0 {
            return Validity::Null;
        }
        self.ok.clear();
        self.ok.extend(
            rows.valid[rows.sel.clone()]
                .iter()
                .map(|&v| v >> bit & 1 == 1),
        );
        Validity::Mixed
    }

    /// The values of `v` at the rows (`valid`: only the valid ones) as u64 into `self.wide`.
    fn gather<T: Copy>(&mut self, v: &[T], rows: &Rows<'_>, valid: Validity, f: impl Fn(T) -> u64) {
        self.wide.clear();
        let v = &v[rows.sel.clone()];
        if valid == Validity::Mixed {
            self.wide.extend(
                v.iter()
                    .zip(&self.ok)
                    .filter(|(_, &ok)| ok)
                    .map(|(&x, _)| f(x)),
            );
        } else {
            self.wide.extend(v.iter().map(|&x| f(x)));
        }
    }

    /// The integer values of `c` at the rows (valid ones) as u64: the column's own slice when
    /// it is one (u64, every row valid), else widened into `self.wide`.
    fn ints<'a>(
        &'a mut self,
        c: ColumnRef<'a>,
        rows: &Rows<'_>,
        valid: Validity,
    ) -> Result<&'a [u64]> {
        if let (ColumnRef::U64(v), Validity::All) = (c, valid) {
            return Ok(&v[rows.sel.clone()]);
        }
        self.gather_int(c, rows, valid)?;
        Ok(&self.wide)
    }

    /// The values of `c` (a column of at most 32 bits) at the rows (valid ones) as u32 into
    /// `self.narrow`.
    fn gather_narrow(&mut self, c: ColumnRef<'_>, rows: &Rows<'_>, valid: Validity) -> Result<()> {
        fn narrow<T: Copy + Into<u32>>(s: &mut Scratch, v: &[T], rows: &Rows<'_>, valid: Validity) {
            s.narrow.clear();
            let v = &v[rows.sel.clone()];
            if valid == Validity::Mixed {
                s.narrow.extend(
                    v.iter()
                        .zip(&s.ok)
                        .filter(|(_, &ok)| ok)
                        .map(|(&x, _)| x.into()),
                );
            } else {
                s.narrow.extend(v.iter().map(|&x| x.into()));
            }
        }
        match c {
            ColumnRef::U8(v) => narrow(self, v, rows, valid),
            ColumnRef::U16(v) => narrow(self, v, rows, valid),
            ColumnRef::U32(v) => narrow(self, v, rows, valid),
            other => {
                return Err(ParquetError::General(format!(
                    "column of at most 32 bits expected, got {other:?}"
                )))
            }
        }
        Ok(())
    }

    /// The integer values of `c` at the rows (valid ones) into `self.wide`.
    fn gather_int(&mut self, c: ColumnRef<'_>, rows: &Rows<'_>, valid: Validity) -> Result<()> {
        match c {
            ColumnRef::Ts(v) => self.gather(v, rows, valid, |x| x as u64),
            ColumnRef::U8(v) => self.gather(v, rows, valid, u64::from),
            ColumnRef::U16(v) => self.gather(v, rows, valid, u64::from),
            ColumnRef::U32(v) => self.gather(v, rows, valid, u64::from),
            ColumnRef::U64(v) => self.gather(v, rows, valid, |x| x),
            other => {
                return Err(ParquetError::General(format!(
                    "integer column expected, got {other:?}"
                )))
            }
        }
        Ok(())
    }
}

impl<W: Write + Send> std::fmt::Debug for IntFile<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IntFile")
            .field("columns", &self.cols.len())
            .field("rows_in_group", &self.rows_in_group)
            .finish_non_exhaustive()
    }
}

impl<W: Write + Send> IntFile<W> {
    /// Opens a file for `schema` (an INT table's) with `props` (their key-value metadata is
    /// kept; `ARROW:schema` is added), its columns' codec decisions shared through `codecs`.
    pub(crate) fn try_new(
        file: W,
        schema: &arrow_schema::Schema,
        props: WriterProperties,
        opts: EncodeOptions,
        codecs: &Codecs,
    ) -> Result<Self> {
        let descr = ArrowSchemaConverter::new().convert(schema)?;
        let mut props = props;
        add_encoded_arrow_schema_to_metadata(schema, &mut props);
        let descrs: Vec<ColumnDescPtr> = descr.columns().to_vec();
        let file = SerializedFileWriter::new(file, descr.root_schema_ptr(), Arc::new(props))?;
        let cols = schema
            .fields()
            .iter()
            .zip(&descrs)
            .enumerate()
            .map(|(i, (f, d))| Column::new(f.name(), f.data_type(), d, codecs.column(i)))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            file,
            cols,
            descrs,
            compression: opts.compression(),
            opts,
            rows_in_group: 0,
            rows_in_page: 0,
            scratch: Scratch::default(),
        })
    }

    /// Appends the rows of `piece` (rows of this file's table), straight from the batch's
    /// column buffers.
    pub(crate) fn write(&mut self, piece: &Piece<'_>) -> Result<()> {
        let (cols, valid) = piece.batch.columns(piece.table);
        if cols.len() != self.cols.len() {
            return Err(ParquetError::General(format!(
                "batch has {} columns, the file {}",
                cols.len(),
                self.cols.len()
            )));
        }
        let evcs = &piece.batch.evcs[..];
        let end = piece.len();
        if piece.rows.end > valid.len() {
            return Err(ParquetError::General(format!(
                "rows {:?} of a table of {}",
                piece.rows,
                valid.len()
            )));
        }
        let mut r = 0;
        while r < end {
            let room_group = self.opts.row_group_rows - self.rows_in_group;
            let room_page = self.opts.page_rows.saturating_sub(self.rows_in_page).max(1);
            let n = (end - r).min(room_group).min(room_page);
            let sel = piece.rows.start + r..piece.rows.start + r + n;
            // Which columns are valid in every row, or in none: one pass for all of them.
            let (and, or) = valid[sel.clone()]
                .iter()
                .fold((u64::MAX, 0u64), |(a, o), &v| (a & v, o | v));
            let rows = Rows {
                sel,
                valid,
                and,
                or,
                evcs,
            };
            for (col, (c, bit)) in self.cols.iter_mut().zip(&cols) {
                col.push(*c, *bit, &rows, &mut self.scratch)?;
            }
            r += n;
            self.rows_in_group += n;
            self.rows_in_page += n;
            if self.rows_in_page >= self.opts.page_rows {
                self.finish_pages()?;
            }
            if self.rows_in_group >= self.opts.row_group_rows {
                self.flush()?;
            }
        }
        Ok(())
    }

    fn finish_pages(&mut self) -> Result<()> {
        if self.rows_in_page == 0 {
            return Ok(());
        }
        let opts = self.opts;
        let full = self.rows_in_page >= opts.page_rows;
        for c in &mut self.cols {
            c.finish_page(&opts, full)?;
        }
        self.rows_in_page = 0;
        Ok(())
    }

    /// Closes the row group in progress (if it has rows) and writes it to the file.
    pub(crate) fn flush(&mut self) -> Result<()> {
        if self.rows_in_group == 0 {
            return Ok(());
        }
        self.finish_pages()?;
        let mut rg = self.file.next_row_group()?;
        for (col, descr) in self.cols.iter_mut().zip(&self.descrs) {
            let (chunk, close) = col.take_chunk(descr, self.compression, &self.opts)?;
            rg.append_column(&chunk, close)?;
        }
        rg.close()?;
        self.rows_in_group = 0;
        Ok(())
    }

    /// Bytes held for the row group in progress: encoded pages, open pages and dictionaries.
    pub(crate) fn memory(&self) -> usize {
        self.cols.iter().map(Column::memory).sum::<usize>()
            + self.scratch.wide.capacity() * 8
            + self.scratch.ok.capacity()
    }

    /// Bytes written to the file so far (row groups flushed).
    pub(crate) fn bytes_written(&self) -> usize {
        self.file.bytes_written()
    }

    /// Bytes of the row group in progress once encoded (its pages so far).
    pub(crate) fn in_progress_size(&self) -> usize {
        self.cols.iter().map(Column::encoded).sum()
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

/// Whether a column's next page is worth compressing: after a full page the codec shrank by
/// less than 1/16, the next [`Squeeze::SKIP`] pages are written as they are (random-looking
/// columns such as device timestamps and latencies, where the codec's pass cost CPU for
/// nothing), then it tries again. The count is shared by the table's files ([`Codecs`]): a new
/// file does not try again what the others just found useless, and the pages it skips count
/// down for all of them. A file whose own last full page the codec did shrink keeps
/// compressing whatever the others found (a column that compresses for one switch and not for
/// another).
#[derive(Debug, Default, Clone)]
struct Squeeze {
    /// Pages left to write uncompressed, shared (one writer thread uses it: `Relaxed` loads
    /// and stores, no read-modify-write).
    skip: Arc<AtomicU8>,
    /// This file's last full page tried shrank by 1/16 or more.
    pays: bool,
}

impl Squeeze {
    const SKIP: u8 = 16;

    /// Whether the next page goes through the codec.
    fn tries(&self) -> bool {
        self.pays || self.skip.load(Relaxed) == 0
    }

    /// The options for the next page (the codec off while skipping).
    fn opts(&self, opts: &EncodeOptions) -> EncodeOptions {
        let mut o = *opts;
        if !self.tries() {
            o.codec = crate::parquet::Codec::None;
        }
        o
    }

    /// Learns from the page [`Self::opts`] was for, which grew the chunk by `written` bytes,
    /// `raw` before compression. Only a `full` page (`page_rows` rows) decides: a file's short
    /// last page (a few rows the codec cannot shrink by 1/16) says little about the column, and
    /// the table's other files would skip the codec on pages it shrinks.
    fn learn(&mut self, written: u64, raw: u64, full: bool) {
        if full && self.tries() {
            self.pays = written * 16 <= raw * 15;
            if !self.pays {
                self.skip.store(Self::SKIP, Relaxed);
                return;
            }
        }
        let skip = self.skip.load(Relaxed);
        if skip > 0 {
            self.skip.store(skip - 1, Relaxed);
        }
    }
}

/// The codec decisions of one table's columns ([`Squeeze`]), shared by the files of the table
/// opened with it (clones share them).
#[derive(Debug, Clone)]
pub(crate) struct Codecs(Arc<[Squeeze]>);

impl Codecs {
    /// Fresh decisions (every column compressed until a page says otherwise) for `table`.
    pub(crate) fn new(table: Table) -> Self {
        Self(
            (0..table.schema().fields().len())
                .map(|_| Squeeze::default())
                .collect(),
        )
    }

    /// Column `i`'s decision (a fresh one past the table's columns).
    fn column(&self, i: usize) -> Squeeze {
        self.0.get(i).cloned().unwrap_or_default()
    }
}

/// One column's encoder.
enum Column {
    /// DELTA_BINARY_PACKED integers (INT64, or INT32 with `ColumnState::int32`: their values
    /// on 32-bit lanes).
    Delta {
        state: Box<ColumnState>,
        int32: bool,
        squeeze: Squeeze,
    },
    Dict(Box<DictColumn>),
    Split(SplitColumn),
    Bool(BoolColumn),
}

impl Column {
    fn new(name: &str, dt: &DataType, descr: &ColumnDescPtr, squeeze: Squeeze) -> Result<Self> {
        let nullable = descr.max_def_level() > 0;
        if *dt == DataType::Boolean {
            return Ok(Self::Bool(BoolColumn::new(Pages::new(nullable, squeeze))));
        }
        if SPLIT_COLUMNS.contains(&name) && descr.physical_type() == PhysicalType::INT32 {
            return Ok(Self::Split(SplitColumn::new(Pages::new(nullable, squeeze))));
        }
        let dict_kind = match dt {
            DataType::FixedSizeBinary(16) => Some(DictKind::Flba16),
            DataType::Utf8 | DataType::Dictionary(..) => Some(DictKind::Str),
            _ if DICTIONARY_COLUMNS.contains(&name) => match descr.physical_type() {
                PhysicalType::INT32 => Some(DictKind::Int32),
                PhysicalType::INT64 => Some(DictKind::Int64),
                _ => None,
            },
            _ => None,
        };
        if let Some(kind) = dict_kind {
            return Ok(Self::Dict(Box::new(DictColumn::new(
                kind,
                Pages::new(nullable, squeeze),
            ))));
        }
        let signed = match dt {
            DataType::Timestamp(..) | DataType::Int64 => true,
            DataType::UInt8 | DataType::UInt16 | DataType::UInt32 | DataType::UInt64 => false,
            _ => {
                return Err(ParquetError::General(format!(
                    "INT column {name}: no encoder for {dt}"
                )))
            }
        };
        let state =
            ColumnState::new(CounterEncoding::DeltaBinaryPacked, !signed, nullable).level_runs();
        let int32 = descr.physical_type() == PhysicalType::INT32;
        let state = if int32 { state.int32() } else { state };
        Ok(Self::Delta {
            state: Box::new(state),
            int32,
            squeeze,
        })
    }

    /// Appends the rows of column `c` (validity bit `bit`) at `rows`.
    fn push(
        &mut self,
        c: ColumnRef<'_>,
        bit: Option<u32>,
        rows: &Rows<'_>,
        s: &mut Scratch,
    ) -> Result<()> {
        let valid = s.validity(bit, rows);
        match self {
            Self::Delta { state, int32, .. } => match valid {
                Validity::Null => state.push_nulls(rows.sel.len()),
                // INT32 columns on 32-bit lanes, a u32 column's rows straight from its buffer.
                _ if *int32 => match (c, valid) {
                    (ColumnRef::U32(v), Validity::All) => state.push32(&v[rows.sel.clone()]),
                    _ => {
                        s.gather_narrow(c, rows, valid)?;
                        if valid == Validity::All {
                            state.push32(&s.narrow);
                        } else {
                            state.push_dense32(&s.narrow, &s.ok);
                        }
                    }
                },
                Validity::All => state.push(s.ints(c, rows, valid)?, None),
                Validity::Mixed => {
                    s.gather_int(c, rows, valid)?;
                    state.push_dense(&s.wide, &s.ok);
                }
            },
            Self::Dict(d) => d.push(c, rows, valid, s)?,
            Self::Split(p) => p.push(c, rows, valid, s)?,
            Self::Bool(b) => b.push(c, rows, valid, s)?,
        }
        Ok(())
    }

    /// Ends the open page (`full`: of `page_rows` rows).
    fn finish_page(&mut self, opts: &EncodeOptions, full: bool) -> Result<()> {
        match self {
            Self::Delta { state, squeeze, .. } => {
                let (c0, u0) = state.chunk_sizes();
                state.finish_page(&squeeze.opts(opts))?;
                let (c1, u1) = state.chunk_sizes();
                squeeze.learn(c1 - c0, u1 - u0, full);
                Ok(())
            }
            Self::Dict(d) => d.finish_page(opts),
            Self::Split(p) => p.finish_page(opts),
            Self::Bool(b) => b.finish_page(opts),
        }
    }

    fn take_chunk(
        &mut self,
        descr: &ColumnDescPtr,
        compression: Compression,
        opts: &EncodeOptions,
    ) -> Result<(Chunk, ColumnCloseResult)> {
        match self {
            Self::Delta { state, .. } => state.take_chunk(descr, compression),
            Self::Dict(d) => d.take_chunk(descr, compression, opts),
            Self::Split(p) => {
                let stats = Stats::Int32(p.min_max.take());
                p.pages.take_chunk(descr, compression, None, stats)
            }
            Self::Bool(b) => b.pages.take_chunk(descr, compression, None, Stats::None),
        }
    }

    fn memory(&self) -> usize {
        match self {
            Self::Delta { state, .. } => state.memory() + std::mem::size_of::<ColumnState>(),
            Self::Dict(d) => d.memory(),
            Self::Split(p) => p.vals.capacity() * 4 + p.pages.memory(),
            Self::Bool(b) => b.bits.capacity() + b.pages.memory(),
        }
    }

    /// Encoded bytes of the row group in progress (finished pages).
    fn encoded(&self) -> usize {
        match self {
            Self::Delta { state, .. } => state.memory(),
            Self::Dict(d) => d.pages.chunk.len() + d.dict_bytes(),
            Self::Split(p) => p.pages.chunk.len(),
            Self::Bool(b) => b.pages.chunk.len(),
        }
    }
}

/// Statistics a chunk carries besides its null count.
enum Stats {
    None,
    Int32(Option<(u32, u32)>),
    Int64(Option<(u64, u64)>),
}

/// A column's finished pages of the row group in progress, and the open page's validity.
struct Pages {
    nullable: bool,
    page_rows: u32,
    page_nulls: u32,
    /// Validity of the open page's rows (LSB first), only once a null was seen.
    validity: Option<Vec<u8>>,
    chunk: Chunk,
    chunk_compressed: u64,
    chunk_uncompressed: u64,
    chunk_rows: u64,
    chunk_nulls: u64,
    encodings: Vec<Encoding>,
    squeeze: Squeeze,
}

impl Pages {
    fn new(nullable: bool, squeeze: Squeeze) -> Self {
        Self {
            nullable,
            page_rows: 0,
            page_nulls: 0,
            validity: None,
            chunk: Chunk::default(),
            chunk_compressed: 0,
            chunk_uncompressed: 0,
            chunk_rows: 0,
            chunk_nulls: 0,
            encodings: Vec::new(),
            squeeze,
        }
    }

    /// Records the validity of `n` more rows (`ok`: one flag per row when `Mixed`).
    fn rows(&mut self, n: usize, valid: Validity, ok: &[bool]) {
        let rows = self.page_rows as usize;
        if valid == Validity::All {
            if let Some(bits) = &mut self.validity {
                set_bits(bits, rows, n);
            }
        } else {
            let bits = self.validity.get_or_insert_with(|| {
                let mut v = Vec::new();
                set_bits(&mut v, 0, rows);
                v
            });
            bits.resize((rows + n).div_ceil(8).max(bits.len()), 0);
            let mut nulls = n;
            if valid == Validity::Mixed {
                for (i, _) in ok.iter().enumerate().filter(|(_, &v)| v) {
                    bits[(rows + i) / 8] |= 1 << ((rows + i) % 8);
                    nulls -= 1;
                }
            }
            self.page_nulls += nulls as u32;
        }
        self.page_rows += n as u32;
    }

    /// Writes the open page with `values` (encoded) as a DATA_PAGE_V2.
    fn finish(&mut self, opts: &EncodeOptions, values: &[u8], encoding: Encoding) -> Result<()> {
        if self.page_rows == 0 {
            return Ok(());
        }
        let mut levels = Vec::new();
        if self.nullable {
            put_def_levels_runs(&mut levels, self.page_rows, self.validity.as_deref());
        }
        let page_opts = self.squeeze.opts(opts);
        let spec = SCRATCH.with(|s| {
            write_page_v2(
                &mut self.chunk,
                &page_opts,
                PageV2 {
                    levels: &levels,
                    values,
                    encoding,
                    rows: self.page_rows,
                    nulls: self.page_nulls,
                },
                &mut s.borrow_mut(),
            )
        })?;
        self.squeeze.learn(
            spec.compressed_size as u64,
            spec.uncompressed_size as u64,
            self.page_rows as usize >= opts.page_rows,
        );
        self.chunk_compressed += spec.compressed_size as u64;
        self.chunk_uncompressed += spec.uncompressed_size as u64;
        self.chunk_rows += u64::from(self.page_rows);
        self.chunk_nulls += u64::from(self.page_nulls);
        if !self.encodings.contains(&encoding) {
            self.encodings.push(encoding);
        }
        self.page_rows = 0;
        self.page_nulls = 0;
        self.validity = None;
        Ok(())
    }

    /// The chunk's bytes (a dictionary page first when given) and its metadata.
    fn take_chunk(
        &mut self,
        descr: &ColumnDescPtr,
        compression: Compression,
        dictionary: Option<(Chunk, u64, u64)>,
        stats: Stats,
    ) -> Result<(Chunk, ColumnCloseResult)> {
        let data = std::mem::take(&mut self.chunk);
        let (mut chunk, dict_len, dict_compressed, dict_uncompressed) = match dictionary {
            Some((d, c, u)) => {
                let n = d.len();
                (d, Some(n), c, u)
            }
            None => (Chunk::default(), None, 0, 0),
        };
        let data_offset = chunk.len() as i64;
        chunk.append(data);
        let mut encodings = Vec::new();
        if dict_len.is_some() {
            encodings.push(Encoding::PLAIN);
        }
        for e in self.encodings.drain(..) {
            if !encodings.contains(&e) {
                encodings.push(e);
            }
        }
        if self.nullable {
            encodings.push(Encoding::RLE);
        }
        let nulls = Some(self.chunk_nulls);
        let statistics = match (stats, descr.physical_type()) {
            (Stats::Int32(mm), _) => Statistics::int32(
                mm.map(|m| m.0 as i32),
                mm.map(|m| m.1 as i32),
                None,
                nulls,
                false,
            ),
            (Stats::Int64(mm), _) => Statistics::int64(
                mm.map(|m| m.0 as i64),
                mm.map(|m| m.1 as i64),
                None,
                nulls,
                false,
            ),
            (Stats::None, PhysicalType::BOOLEAN) => {
                Statistics::boolean(None, None, None, nulls, false)
            }
            (Stats::None, PhysicalType::FIXED_LEN_BYTE_ARRAY) => Statistics::fixed_len_byte_array(
                None::<FixedLenByteArray>,
                None,
                None,
                nulls,
                false,
            ),
            (Stats::None, _) => Statistics::byte_array(None::<ByteArray>, None, None, nulls, false),
        };
        let compressed = self.chunk_compressed + dict_compressed;
        let metadata = ColumnChunkMetaData::builder(Arc::clone(descr))
            .set_encodings(encodings)
            .set_compression(compression)
            .set_num_values(self.chunk_rows as i64)
            .set_total_compressed_size(compressed as i64)
            .set_total_uncompressed_size((self.chunk_uncompressed + dict_uncompressed) as i64)
            .set_data_page_offset(data_offset)
            .set_dictionary_page_offset(dict_len.map(|_| 0))
            .set_statistics(statistics)
            .build()?;
        let close = ColumnCloseResult {
            bytes_written: compressed,
            rows_written: self.chunk_rows,
            metadata,
            bloom_filter: None,
            column_index: None,
            offset_index: None,
        };
        self.chunk_compressed = 0;
        self.chunk_uncompressed = 0;
        self.chunk_rows = 0;
        self.chunk_nulls = 0;
        Ok((chunk, close))
    }

    fn memory(&self) -> usize {
        self.chunk.memory() + self.validity.as_ref().map_or(0, Vec::capacity)
    }
}

thread_local! {
    /// Page scratch (compressed values), one per encoding thread.
    static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    /// Encoded values of a page, one per encoding thread.
    static VALUES: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Marks rows `from..from + n` valid in an LSB-first bitmap, growing it as needed.
fn set_bits(bits: &mut Vec<u8>, from: usize, n: usize) {
    let end = from + n;
    bits.resize(end.div_ceil(8).max(bits.len()), 0);
    for r in from..end {
        bits[r / 8] |= 1 << (r % 8);
    }
}

/// PLAIN booleans: the non-null values bit-packed, LSB first.
struct BoolColumn {
    pages: Pages,
    bits: Vec<u8>,
    n: usize,
}

impl BoolColumn {
    fn new(pages: Pages) -> Self {
        Self {
            pages,
            bits: Vec::new(),
            n: 0,
        }
    }

    fn push(
        &mut self,
        c: ColumnRef<'_>,
        rows: &Rows<'_>,
        valid: Validity,
        s: &Scratch,
    ) -> Result<()> {
        let ColumnRef::Bool(v) = c else {
            return Err(ParquetError::General(format!(
                "boolean column expected, got {c:?}"
            )));
        };
        self.pages.rows(rows.sel.len(), valid, &s.ok);
        let mut put = |v: bool| {
            if self.n.is_multiple_of(8) {
                self.bits.push(0);
            }
            if v {
                *self.bits.last_mut().expect("pushed above") |= 1 << (self.n % 8);
            }
            self.n += 1;
        };
        let v = &v[rows.sel.clone()];
        match valid {
            Validity::Null => {}
            Validity::All => v.iter().for_each(|&b| put(b)),
            Validity::Mixed => v
                .iter()
                .zip(&s.ok)
                .filter(|(_, &ok)| ok)
                .for_each(|(&b, _)| put(b)),
        }
        Ok(())
    }

    fn finish_page(&mut self, opts: &EncodeOptions) -> Result<()> {
        self.pages.finish(opts, &self.bits, Encoding::PLAIN)?;
        self.bits.clear();
        self.n = 0;
        Ok(())
    }
}

/// BYTE_STREAM_SPLIT INT32: a page's values as four byte streams (byte 0 of every value, then
/// byte 1, …), for the codec to fold the streams that do not vary.
struct SplitColumn {
    pages: Pages,
    /// The open page's non-null values.
    vals: Vec<u32>,
    /// The row group's smallest and largest value (chunk statistics).
    min_max: Option<(u32, u32)>,
}

impl SplitColumn {
    fn new(pages: Pages) -> Self {
        Self {
            pages,
            vals: Vec::new(),
            min_max: None,
        }
    }

    fn push(
        &mut self,
        c: ColumnRef<'_>,
        rows: &Rows<'_>,
        valid: Validity,
        s: &mut Scratch,
    ) -> Result<()> {
        self.pages.rows(rows.sel.len(), valid, &s.ok);
        let new: &[u32] = match (c, valid) {
            (_, Validity::Null) => return Ok(()),
            (ColumnRef::U32(v), Validity::All) => &v[rows.sel.clone()],
            _ => {
                s.gather_narrow(c, rows, valid)?;
                &s.narrow
            }
        };
        if let Some(&v0) = new.first() {
            let (lo, hi) = self.min_max.unwrap_or((v0, v0));
            // (Folds: vector min/max reductions.)
            let lo = new.iter().fold(lo, |a, &x| a.min(x));
            let hi = new.iter().fold(hi, |a, &x| a.max(x));
            self.min_max = Some((lo, hi));
            self.vals.extend_from_slice(new);
        }
        Ok(())
    }

    fn finish_page(&mut self, opts: &EncodeOptions) -> Result<()> {
        VALUES.with(|v| {
            let mut out = v.borrow_mut();
            out.clear();
            byte_stream_split(self.vals.iter().map(|v| v.to_le_bytes()), &mut out);
            self.pages.finish(opts, &out, Encoding::BYTE_STREAM_SPLIT)
        })?;
        self.vals.clear();
        Ok(())
    }
}

/// Physical type of a dictionary column's values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DictKind {
    Int32,
    Int64,
    Flba16,
    Str,
}

/// RLE_DICTIONARY: one dictionary per row group (an open-addressing map from value to index),
/// the pages hold indices.
struct DictColumn {
    kind: DictKind,
    pages: Pages,
    /// Dictionary values in index order (integers zero-extended, addresses as their bytes).
    keys: Vec<u128>,
    /// Strings: their bytes end to end and where each ends.
    str_bytes: Vec<u8>,
    str_ends: Vec<u32>,
    /// Index + 1 per slot (0 = empty); a power of two, at most half full.
    slots: Vec<u32>,
    /// Indices of the open page's non-null rows.
    idx: Vec<u32>,
    /// Integer dictionaries: index of the values `near_base..near_base + NEAR` ([`MISSING`] =
    /// not looked up yet; one more entry, always [`MISSING`], for the values outside),
    /// looked up yet), set up at the first value of a row group.
    near: Vec<u32>,
    near_base: u64,
    /// Most values of the column's last rows were outside the direct table (hashes such as
    /// `flow_key`): the next rows go straight to [`Self::index_int`].
    near_useless: bool,
    /// EVC columns: dictionary index + 1 of each EVC of `evc_names` (0 = not looked up yet),
    /// for this row group.
    evc_index: Vec<u32>,
    evc_names: usize,
}

/// Values an integer dictionary looks up directly, centred on the row group's first value (16 KiB
/// of table per column: the per-hop latencies of a network, ~800-2,000 ns, whatever the first).
const NEAR: usize = 4096;
/// A direct-table entry of a value not in the dictionary (yet).
const MISSING: u32 = u32::MAX;

impl DictColumn {
    fn new(kind: DictKind, pages: Pages) -> Self {
        Self {
            kind,
            pages,
            keys: Vec::new(),
            str_bytes: Vec::new(),
            str_ends: Vec::new(),
            slots: vec![0; 64],
            idx: Vec::new(),
            near: Vec::new(),
            near_base: 0,
            near_useless: false,
            evc_index: Vec::new(),
            evc_names: 0,
        }
    }

    fn len(&self) -> usize {
        match self.kind {
            DictKind::Str => self.str_ends.len(),
            _ => self.keys.len(),
        }
    }

    #[inline]
    fn hash(k: u128) -> usize {
        let x = (k as u64) ^ ((k >> 64) as u64).rotate_left(29);
        (x.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as usize
    }

    #[inline]
    fn hash_bytes(b: &[u8]) -> usize {
        let mut h = 0xCBF2_9CE4_8422_2325u64 ^ b.len() as u64;
        for c in b.chunks(8) {
            let mut w = [0u8; 8];
            w[..c.len()].copy_from_slice(c);
            h = (h ^ u64::from_le_bytes(w)).wrapping_mul(0x1000_0000_01B3);
            h ^= h >> 29;
        }
        Self::hash(u128::from(h))
    }

    fn str_at(&self, i: usize) -> &[u8] {
        let start = if i == 0 {
            0
        } else {
            self.str_ends[i - 1] as usize
        };
        &self.str_bytes[start..self.str_ends[i] as usize]
    }

    /// Doubles the slots when half full.
    fn grow(&mut self) {
        if self.len() * 2 < self.slots.len() {
            return;
        }
        let cap = self.slots.len() * 2;
        let mask = cap - 1;
        let mut slots = vec![0u32; cap];
        for i in 0..self.len() {
            let mut h = match self.kind {
                DictKind::Str => Self::hash_bytes(self.str_at(i)),
                DictKind::Int32 | DictKind::Int64 => {
                    let bits = cap.trailing_zeros();
                    ((self.keys[i] as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - bits))
                        as usize
                }
                DictKind::Flba16 => Self::hash(self.keys[i]),
            } & mask;
            while slots[h] != 0 {
                h = (h + 1) & mask;
            }
            slots[h] = i as u32 + 1;
        }
        self.slots = slots;
    }

    /// The index of value `k`, added when new.
    #[inline]
    fn index(&mut self, k: u128) -> u32 {
        let mask = self.slots.len() - 1;
        let mut h = Self::hash(k) & mask;
        loop {
            let s = self.slots[h];
            if s == 0 {
                let i = self.keys.len() as u32;
                self.keys.push(k);
                self.slots[h] = i + 1;
                self.grow();
                return i;
            }
            if self.keys[s as usize - 1] == k {
                return s - 1;
            }
            h = (h + 1) & mask;
        }
    }

    fn index_str(&mut self, b: &[u8]) -> u32 {
        let mask = self.slots.len() - 1;
        let mut h = Self::hash_bytes(b) & mask;
        loop {
            let s = self.slots[h];
            if s == 0 {
                let i = self.str_ends.len() as u32;
                self.str_bytes.extend_from_slice(b);
                self.str_ends.push(self.str_bytes.len() as u32);
                self.slots[h] = i + 1;
                self.grow();
                return i;
            }
            if self.str_at(s as usize - 1) == b {
                return s - 1;
            }
            h = (h + 1) & mask;
        }
    }

    /// The index of integer `k`, added when new (the keys of an integer dictionary are its
    /// values zero-extended; the hash is the multiplicative one of the high bits).
    #[inline]
    fn index_int(&mut self, k: u64) -> u32 {
        // Values near the first one (ports, queue ids, node ids of one network, occupancies and
        // latencies in their usual range) through a direct table; the rest through the map.
        let near = k.wrapping_sub(self.near_base);
        if near < NEAR as u64 {
            let e = self.near[near as usize];
            if e != MISSING {
                return e;
            }
            let i = self.index_int_map(k);
            self.near[near as usize] = i;
            return i;
        }
        self.index_int_map(k)
    }

    #[inline]
    fn index_int_map(&mut self, k: u64) -> u32 {
        let bits = self.slots.len().trailing_zeros();
        let mask = self.slots.len() - 1;
        let mut h = (k.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - bits)) as usize;
        loop {
            let s = self.slots[h];
            if s == 0 {
                let i = self.keys.len() as u32;
                self.keys.push(u128::from(k));
                self.slots[h] = i + 1;
                self.grow();
                return i;
            }
            if self.keys[s as usize - 1] as u64 == k {
                return s - 1;
            }
            h = (h + 1) & mask;
        }
    }

    /// Indices of the integer values `vals` into `self.idx`: first every value through the
    /// direct table without a branch (a value outside it, or not seen yet, reads [`MISSING`]),
    /// then the few missing ones through [`Self::index_int`], one lookup per run of equal
    /// values. (One branch per value on random values, such as latencies, mispredicted half
    /// the time.)
    fn index_ints<T: Copy + PartialEq + Into<u64>>(&mut self, vals: &[T]) {
        let Some(&first) = vals.first() else {
            return;
        };
        if self.near.is_empty() {
            self.near = vec![MISSING; NEAR + 1];
            self.near_base = first.into().saturating_sub(NEAR as u64 / 2);
        }
        let mut idx = std::mem::take(&mut self.idx);
        let start = idx.len();
        if self.near_useless {
            idx.resize(start + vals.len(), MISSING);
        } else {
            let (near, base) = (&self.near[..=NEAR], self.near_base);
            idx.extend(vals.iter().map(|&k| {
                let at = k.into().wrapping_sub(base).min(NEAR as u64) as usize;
                near[at]
            }));
        }
        let mut missing = 0;
        if self.near_useless || idx[start..].contains(&MISSING) {
            let (mut last, base): (Option<(T, u32)>, u64) = (None, self.near_base);
            for (e, &k) in idx[start..].iter_mut().zip(vals) {
                if *e == MISSING {
                    // (Values new to the dictionary but in the table do not count.)
                    missing += usize::from(k.into().wrapping_sub(base) >= NEAR as u64);
                    *e = match last {
                        Some((lk, li)) if lk == k => li,
                        _ => {
                            let i = self.index_int(k.into());
                            last = Some((k, i));
                            i
                        }
                    };
                }
            }
        }
        self.near_useless = missing * 2 > vals.len();
        self.idx = idx;
    }

    /// Indices of `keys` (one per row; `valid` = which rows count) into `self.idx`, one map
    /// lookup per run of equal values.
    fn index_all(&mut self, keys: impl Iterator<Item = u128>) {
        let mut last: Option<(u128, u32)> = None;
        for k in keys {
            let i = match last {
                Some((lk, li)) if lk == k => li,
                _ => {
                    let i = self.index(k);
                    last = Some((k, i));
                    i
                }
            };
            self.idx.push(i);
        }
    }

    fn push(
        &mut self,
        c: ColumnRef<'_>,
        rows: &Rows<'_>,
        valid: Validity,
        s: &mut Scratch,
    ) -> Result<()> {
        self.pages.rows(rows.sel.len(), valid, &s.ok);
        if valid == Validity::Null {
            return Ok(());
        }
        match (self.kind, c) {
            // Every row valid: straight from the column's buffer, whatever its width.
            (DictKind::Int32 | DictKind::Int64, ColumnRef::U8(v)) if valid == Validity::All => {
                self.index_ints(&v[rows.sel.clone()]);
            }
            (DictKind::Int32 | DictKind::Int64, ColumnRef::U16(v)) if valid == Validity::All => {
                self.index_ints(&v[rows.sel.clone()]);
            }
            (DictKind::Int32 | DictKind::Int64, ColumnRef::U32(v)) if valid == Validity::All => {
                self.index_ints(&v[rows.sel.clone()]);
            }
            (DictKind::Int32 | DictKind::Int64, _) => {
                let v = s.ints(c, rows, valid)?;
                self.index_ints(v);
            }
            (DictKind::Flba16, ColumnRef::Addr(v)) => {
                let key = |a: &i128| u128::from_le_bytes(Addr::bytes(*a));
                let v = &v[rows.sel.clone()];
                match valid {
                    Validity::Mixed => self.index_all(
                        v.iter()
                            .zip(&s.ok)
                            .filter(|(_, &ok)| ok)
                            .map(|(a, _)| key(a)),
                    ),
                    _ => self.index_all(v.iter().map(key)),
                }
            }
            (DictKind::Str, ColumnRef::EvcId(v) | ColumnRef::EvcName(v)) => {
                let name = matches!(c, ColumnRef::EvcName(_));
                // Index of each EVC looked up once per row group (and list of names).
                let names = rows.evcs.as_ptr() as usize;
                if names != self.evc_names || self.evc_index.len() != rows.evcs.len() {
                    self.evc_names = names;
                    self.evc_index.clear();
                    self.evc_index.resize(rows.evcs.len(), 0);
                }
                s.gather(v, rows, valid, u64::from);
                self.idx.reserve(s.wide.len());
                for &e in &s.wide {
                    let e = e as usize;
                    let Some(evc) = rows.evcs.get(e) else {
                        return Err(ParquetError::General(format!(
                            "EVC index {e} past the batch's {} names",
                            rows.evcs.len()
                        )));
                    };
                    let k = match self.evc_index[e] {
                        0 => {
                            let b = if name { &evc.name } else { &evc.id };
                            let k = self.index_str(b.as_bytes());
                            self.evc_index[e] = k + 1;
                            k
                        }
                        k => k - 1,
                    };
                    self.idx.push(k);
                }
            }
            (kind, c) => {
                return Err(ParquetError::General(format!(
                    "{kind:?} dictionary: unexpected column {c:?}"
                )))
            }
        }
        Ok(())
    }

    fn finish_page(&mut self, opts: &EncodeOptions) -> Result<()> {
        if self.pages.page_rows == 0 {
            return Ok(());
        }
        let width = bit_width(self.len().saturating_sub(1) as u64).max(1);
        VALUES.with(|v| {
            let mut v = v.borrow_mut();
            v.clear();
            v.push(width as u8);
            rle_hybrid(&self.idx, width, &mut v);
            self.pages.finish(opts, &v, Encoding::RLE_DICTIONARY)
        })?;
        self.idx.clear();
        Ok(())
    }

    /// Bytes of the dictionary page once written (PLAIN values).
    fn dict_bytes(&self) -> usize {
        match self.kind {
            DictKind::Int32 => self.keys.len() * 4,
            DictKind::Int64 => self.keys.len() * 8,
            DictKind::Flba16 => self.keys.len() * 16,
            DictKind::Str => self.str_bytes.len() + 4 * self.str_ends.len(),
        }
    }

    fn take_chunk(
        &mut self,
        descr: &ColumnDescPtr,
        compression: Compression,
        opts: &EncodeOptions,
    ) -> Result<(Chunk, ColumnCloseResult)> {
        // The dictionary page: PLAIN values, compressed with the column's codec (a dictionary
        // page has no flag saying it is not).
        let mut plain = Vec::with_capacity(self.dict_bytes());
        match self.kind {
            DictKind::Int32 => {
                for k in &self.keys {
                    plain.extend_from_slice(&(*k as u32).to_le_bytes());
                }
            }
            DictKind::Int64 => {
                for k in &self.keys {
                    plain.extend_from_slice(&(*k as u64).to_le_bytes());
                }
            }
            DictKind::Flba16 => {
                for k in &self.keys {
                    plain.extend_from_slice(&k.to_le_bytes());
                }
            }
            DictKind::Str => {
                for i in 0..self.str_ends.len() {
                    let s = self.str_at(i);
                    plain.extend_from_slice(&(s.len() as u32).to_le_bytes());
                    plain.extend_from_slice(s);
                }
            }
        }
        let n = self.len() as u32;
        let mut compressed = Vec::new();
        let buf = match compress(opts, &plain, &mut compressed)? {
            Some(c) => c.to_vec(),
            None => plain.clone(),
        };
        let page = Page::DictionaryPage {
            buf: Bytes::from(buf),
            num_values: n,
            encoding: Encoding::PLAIN,
            is_sorted: false,
        };
        let mut w = Chunk::default();
        let spec = w.write_page(CompressedPage::new(page, plain.len()))?;
        let dictionary = (
            w,
            spec.compressed_size as u64,
            spec.uncompressed_size as u64,
        );
        let stats = match self.kind {
            DictKind::Int32 => {
                Stats::Int32(self.keys.iter().map(|&k| k as u32).fold(None, |m, v| {
                    Some(m.map_or((v, v), |(a, b)| (v.min(a), v.max(b))))
                }))
            }
            DictKind::Int64 => {
                Stats::Int64(self.keys.iter().map(|&k| k as u64).fold(None, |m, v| {
                    Some(m.map_or((v, v), |(a, b)| (v.min(a), v.max(b))))
                }))
            }
            _ => Stats::None,
        };
        let out = self
            .pages
            .take_chunk(descr, compression, Some(dictionary), stats);
        // The next row group starts a new dictionary.
        self.keys.clear();
        self.str_bytes.clear();
        self.str_ends.clear();
        self.slots.clear();
        self.slots.resize(64, 0);
        self.slots.shrink_to(64);
        self.near.clear();
        self.near_useless = false;
        self.evc_index.clear();
        out
    }

    fn memory(&self) -> usize {
        self.pages.memory()
            + self.keys.capacity() * 16
            + self.str_bytes.capacity()
            + self.str_ends.capacity() * 4
            + self.slots.capacity() * 4
            + self.idx.capacity() * 4
            + self.near.capacity() * 4
    }
}

/// Bits needed for `v`.
fn bit_width(v: u64) -> u32 {
    64 - v.leading_zeros()
}

/// `idx` as an RLE/bit-packed hybrid of width `width` (no length prefix): runs of 8 or more
/// equal values as RLE runs, the rest bit-packed in groups of 8 (the last group padded).
fn rle_hybrid(idx: &[u32], width: u32, out: &mut Vec<u8>) {
    let n = idx.len();
    // Start of the literals not yet written (always a multiple of 8 rows behind a run).
    let mut lit = 0;
    let mut i = 0;
    while i + 8 <= n {
        // Most values start no run: 16 at a time while none equals the next (one vector
        // compare), then one compare per value.
        if i + 17 <= n
            && !idx[i..i + 16]
                .iter()
                .zip(&idx[i + 1..i + 17])
                .fold(false, |eq, (a, b)| eq | (a == b))
        {
            i += 16;
            continue;
        }
        let v = idx[i];
        if idx[i + 1] != v {
            i += 1;
            continue;
        }
        let mut j = i + 2;
        while j < n && idx[j] == v {
            j += 1;
        }
        // Literals before the run must fill whole groups of 8: the run lends them values.
        let pad = (8 - (i - lit) % 8) % 8;
        if j - i >= pad + 8 {
            let start = i + pad;
            if start > lit {
                bit_pack(&idx[lit..start], width, out);
            }
            put_vlq(out, ((j - start) as u64) << 1);
            let bytes = width.div_ceil(8) as usize;
            out.extend_from_slice(&v.to_le_bytes()[..bytes]);
            lit = j;
        }
        i = j;
    }
    if lit < n {
        bit_pack(&idx[lit..], width, out);
    }
}

/// One bit-packed run of `vals` (padded with zeros to a multiple of 8), header included.
/// Packed 32 values at a time by the DELTA packer on 32-bit lanes (LSB first, contiguous: the
/// same layout as four groups of 8).
fn bit_pack(vals: &[u32], width: u32, out: &mut Vec<u8>) {
    let groups = vals.len().div_ceil(8);
    put_vlq(out, ((groups as u64) << 1) | 1);
    let end = out.len() + groups * width as usize;
    if width > 0 {
        let kernel = Kernel::detect();
        let mut block = [0u32; 32];
        for c in vals.chunks(32) {
            block[..c.len()].copy_from_slice(c);
            block[c.len()..].fill(0);
            pack_mini32(kernel, &block, width, out);
        }
    }
    // The last chunk's padding beyond its last group of 8 is not part of the run.
    out.truncate(end);
}

#[cfg(test)]
mod tests {
    use ::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    use arrow_array::RecordBatch;

    use super::*;
    use crate::{
        int::{EvcName, IntBatch},
        parquet::Codec,
    };

    /// Deterministic noise.
    fn mix(x: u64) -> u64 {
        let x = x.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        (x ^ (x >> 29)).wrapping_mul(0xBF58_476D_1CE4_E5B9) ^ (x >> 32)
    }

    /// `n` reports with 5 hops each: every column type, runs and noise, values at the top of
    /// their range (u32 sequence numbers wrapping, u64 hashes), nulls here and there, and
    /// columns that are null throughout; a drop row every 13 reports.
    fn rows(n: u64) -> IntBatch {
        let mut b = IntBatch::with_capacity(n as usize, 5 * n as usize);
        b.evcs = Arc::new([
            EvcName {
                id: "evc-a".into(),
                name: "first".into(),
            },
            EvcName {
                id: "evc-b".into(),
                name: "second one".into(),
            },
        ]);
        for i in 0..n {
            let ts = 1_700_000_000_000_000_000 + (i as i64 / 3) * 977;
            let flow = mix(i % 300);
            let switch = 0xFB65_D600 + (i % 3) as u32;
            let seq = (u32::MAX - 100).wrapping_add(i as u32);
            let vlan = 100 + (i % 300) as u16;
            b.reports
                .row(ts, switch)
                .report_version(Some(1))
                .hw_id(Some((i % 4) as u8))
                .seq(Some(seq))
                .report_index(Some((i % 3) as u16))
                .seq_gap(Some(u32::from(i % 97 == 0)))
                .dropped(Some(i % 13 == 0))
                .congested((i % 7 != 0).then_some(i % 5 == 0))
                .report_ingress_ts(Some(mix(i) >> 20))
                .reporter_addr((i % 11 != 0).then(|| {
                    let mut a = [0u8; 16];
                    a[10..12].copy_from_slice(&[0xff, 0xff]);
                    a[12..].copy_from_slice(&((i % 5) as u32).to_be_bytes());
                    a
                }))
                .vlan(Some(vlan))
                .src_addr(Some((flow as u128).to_le_bytes()))
                .src_port(Some((flow >> 48) as u16))
                .flow_key(Some(flow))
                .path_id((i % 17 != 0).then(|| mix(i % 40)))
                .latency_sum_ns(Some(5000 + mix(i) % 3000))
                // Long runs of nulls and values, ending mid-byte of the validity bitmap.
                .latency_e2e_ns((3001..7013).contains(&i).then_some(i))
                .tracked((i < 21).then_some(true))
                .evc_id((i % 9 != 0).then_some((i % 2) as u32))
                .evc_name((i % 9 != 0).then_some((i % 2) as u32))
                .done();
            if i % 13 == 0 {
                b.drops
                    .row(ts, switch)
                    .report_version(Some(1))
                    .seq(Some(seq))
                    .ingress_port(Some((mix(i) % 48) as u32))
                    .egress_port((i % 39 != 0).then_some((mix(i + 1) % 48) as u32))
                    .queue_id(Some((i % 8) as u8))
                    .drop_reason((i % 26 != 0).then_some((mix(i) % 90) as u8))
                    .vlan(Some(vlan))
                    .src_addr(Some((flow as u128).to_le_bytes()))
                    .src_port(Some((flow >> 48) as u16))
                    .flow_key(Some(flow))
                    .evc_id((i % 9 != 0).then_some((i % 2) as u32))
                    .done();
            }
            for h in 0..5u64 {
                b.hops
                    .row(ts, switch)
                    .hw_id(Some((i % 4) as u8))
                    .seq(Some(seq))
                    .report_index(Some((i % 3) as u16))
                    .hop_index(Some(h as u8))
                    .node_id(Some(0xFB65_D600 + (mix(i + h) % 12) as u32))
                    .ingress_port(Some((mix(h + i % 300) % 48) as u32))
                    .queue_id((mix(i * 5 + h) % 9 != 8).then_some((mix(i + h) % 8) as u8))
                    // Nulls, congested depths and the top of the range now and then: every
                    // byte stream of a BYTE_STREAM_SPLIT page varies somewhere.
                    .queue_occupancy((mix(i * 5 + h) % 13 != 5).then_some(match i % 50 {
                        7 => 50_000 + (mix(i) % 10_000) as u32,
                        9 => u32::MAX - h as u32,
                        11 => 0xA5C3_0000 | (mix(i + h) % 65_536) as u32,
                        _ => (mix(i * 5 + h) % 200) as u32,
                    }))
                    .ingress_ts(Some(u64::from(u32::MAX - 5000) + i * 10_000 + h * 1500))
                    .egress_ts(Some(u64::from(u32::MAX - 4000) + i * 10_000 + h * 1500))
                    // Congested now and then: values outside the direct table among those in it.
                    .latency_ns(Some(
                        800 + mix(i ^ h) % 1200 + 50_000 * u64::from(i % 50 == 7),
                    ))
                    .done();
            }
        }
        b
    }

    fn read(bytes: Vec<u8>) -> Vec<RecordBatch> {
        ParquetRecordBatchReaderBuilder::try_new(Bytes::from(bytes))
            .unwrap()
            .with_batch_size(1 << 20)
            .build()
            .unwrap()
            .collect::<std::result::Result<Vec<_>, _>>()
            .unwrap()
    }

    fn assert_same(bytes: Vec<u8>, rb: &RecordBatch, table: Table, what: &str) {
        let back = read(bytes);
        let back = arrow_select::concat::concat_batches(&table.schema(), &back).unwrap();
        assert_eq!(back.num_rows(), rb.num_rows(), "{table:?} {what}");
        for (i, f) in table.schema().fields().iter().enumerate() {
            assert_eq!(
                back.column(i).as_ref(),
                rb.column(i).as_ref(),
                "{table:?} column {} ({what})",
                f.name()
            );
        }
    }

    /// Every table round-trips exactly through the encoder (and parquet's own reader), whole
    /// and split per switch as the writer splits a batch, with pages and row groups cut
    /// mid-piece, for every codec: the same rows as the batch's Arrow arrays.
    #[test]
    fn every_table_round_trips_exactly() {
        let n = 9_000;
        let b = rows(n);
        let whole = rows(n).finish().unwrap();
        let split = rows(n).finish_split().unwrap();
        let mut scratch = IntBatch::default();
        let at = &raw const scratch;
        let groups = b.split(&mut scratch);
        assert_eq!(groups.len(), split.len());
        assert!(
            groups.iter().all(|g| std::ptr::eq(g.batch, at)),
            "three switches: rows regrouped"
        );
        for codec in [Codec::Lz4, Codec::Zstd, Codec::None] {
            let cfg = IntSinkConfig {
                compression: codec,
                row_group_rows: 20_000,
                ..IntSinkConfig::for_test("/nonexistent")
            };
            for (table, rb) in &whole {
                let piece = Piece {
                    batch: &b,
                    table: *table,
                    switch: 0,
                    hour: 0,
                    rows: 0..rb.num_rows(),
                };
                let bytes = encode_in_memory(&[piece], &cfg).unwrap();
                assert_same(bytes, rb, *table, &format!("whole, {codec:?}"));
            }
            for (g, (t2, sw2, hour2, rb)) in groups.iter().zip(&split) {
                assert_eq!((g.table, g.switch, g.hour), (*t2, *sw2, *hour2));
                // Two writes: a page and a row group end inside each.
                let k = g.rows.start + g.len() / 3;
                let pieces =
                    [g.rows.start..k, k..g.rows.end].map(|rows| Piece { rows, ..g.clone() });
                let bytes = encode_in_memory(&pieces, &cfg).unwrap();
                let sw = g.switch;
                assert_same(bytes, rb, g.table, &format!("switch {sw}, {codec:?}"));
            }
        }
    }

    /// Batches encoded one after the other into files kept open (what the writer does) give
    /// the files of all their rows per (table, switch, hour) encoded at once.
    #[test]
    fn batches_encoded_one_after_the_other_are_their_rows_encoded_at_once() {
        let (b1, b2) = (rows(5_000), rows(9_000));
        let cfg = IntSinkConfig {
            row_group_rows: 20_000,
            ..IntSinkConfig::for_test("/nonexistent")
        };
        let (mut s1, mut s2) = (IntBatch::default(), IntBatch::default());
        let mut want: std::collections::BTreeMap<_, Vec<Piece<'_>>> = Default::default();
        for p in b1.split(&mut s1).into_iter().chain(b2.split(&mut s2)) {
            want.entry((p.table, p.switch, p.hour)).or_default().push(p);
        }
        assert_eq!(want.len(), 9, "three switches, three tables");
        let got = encode_batches(&[b1.clone(), b2.clone()], &cfg).unwrap();
        assert_eq!(
            got.iter().map(|(k, _)| *k).collect::<Vec<_>>(),
            want.keys().copied().collect::<Vec<_>>()
        );
        // (Not byte for byte: the files of a table share their codec decisions.)
        for (k, bytes) in got {
            assert_eq!(
                read(bytes),
                read(encode_in_memory(&want[&k], &cfg).unwrap()),
                "{k:?}: not the file of its rows"
            );
        }
    }

    /// `n` drop rows of `switch` whose sequence numbers are random (nothing for the codec) or
    /// step by 1 (DELTA of equal steps, which the codec shrinks to almost nothing).
    fn drops_seq(switch: u32, n: usize, random: bool) -> IntBatch {
        let mut b = IntBatch::with_capacity(1, 1);
        for i in 0..n {
            let seq = if random {
                mix(i as u64) as u32
            } else {
                i as u32
            };
            let ts = 1_700_000_000_000_000_000 + i as i64;
            b.drops.row(ts, switch).seq(Some(seq)).done();
        }
        b
    }

    /// `batches` (drop rows, one switch each) through [`encode_batches`] with LZ4 and a row
    /// group per page; each file's values checked, then per switch as pyarrow reads the
    /// files: rows and whether each row group's (page's) `seq` is compressed.
    fn seq_pages_compressed(batches: &[IntBatch]) -> serde_json::Value {
        let dir = tempfile::tempdir().unwrap();
        let cfg = IntSinkConfig {
            compression: Codec::Lz4,
            row_group_rows: PAGE_ROWS,
            ..IntSinkConfig::for_test(dir.path())
        };
        let files = encode_batches(batches, &cfg).unwrap();
        let mut want: std::collections::BTreeMap<u32, Vec<IntBatch>> = Default::default();
        for b in batches {
            want.entry(b.drops.view().switch_id[0])
                .or_default()
                .push(b.clone());
        }
        assert_eq!(files.len(), want.len(), "a file per switch");
        for (k, bytes) in &files {
            let rbs: Vec<RecordBatch> = want[&k.1]
                .iter()
                .map(|b| {
                    let [_, _, (_, rb)] = b.clone().finish().unwrap();
                    rb
                })
                .collect();
            let rb = arrow_select::concat::concat_batches(&Table::Drops.schema(), &rbs).unwrap();
            assert_same(bytes.clone(), &rb, Table::Drops, "shared codec decision");
            std::fs::write(dir.path().join(format!("{}.parquet", k.1)), bytes).unwrap();
        }
        stel_testkit::python3_json(&format!(
            r#"
import glob, json, os, pyarrow.parquet as pq
out = {{}}
for path in glob.glob(f"{dir}/*.parquet"):
    f = pq.ParquetFile(path)
    md = f.metadata
    c = f.schema_arrow.get_field_index("seq")
    rgs = [md.row_group(g).column(c) for g in range(md.num_row_groups)]
    out[os.path.basename(path).split(".")[0]] = {{"rows": md.num_rows,
        "compressed": [x.total_compressed_size < x.total_uncompressed_size for x in rgs]}}
print(json.dumps(out))
"#,
            dir = dir.path().to_str().unwrap()
        ))
    }

    /// The files of a table share whether compressing a column pays: a column the codec could
    /// not shrink in one file's full page is written uncompressed in the next file for the 16
    /// pages the decision holds, although it compresses there, and compressed again from the
    /// page that tries the codec again on; a file's short last page the codec cannot shrink
    /// does not turn it off for the next file.
    #[test]
    fn files_of_a_table_share_the_codec_decision() {
        // Switch 1: one full page, random. Switch 2, after it: 18 full pages, stepping.
        // Switches 0 and 3: a short page each, random and stepping, ended when the files are
        // closed (in switch order, after the full pages).
        // (129 rows: 128 deltas, a whole DELTA block, no zero padding for the codec.)
        let got = seq_pages_compressed(&[
            drops_seq(1, PAGE_ROWS, true),
            drops_seq(2, 18 * PAGE_ROWS, false),
            drops_seq(0, 129, true),
            drops_seq(3, PAGE_ROWS / 2, false),
        ]);
        for (sw, n) in [129, PAGE_ROWS, 18 * PAGE_ROWS, PAGE_ROWS / 2]
            .into_iter()
            .enumerate()
        {
            assert_eq!(got[sw.to_string()]["rows"], n, "{got}");
        }
        assert_eq!(got["1"]["compressed"], serde_json::json!([false]), "{got}");
        let mut second = vec![false; Squeeze::SKIP as usize];
        second.extend([true, true]);
        assert_eq!(got["2"]["compressed"], serde_json::json!(second), "{got}");
        assert_eq!(got["0"]["compressed"], serde_json::json!([false]), "{got}");
        assert_eq!(got["3"]["compressed"], serde_json::json!([true]), "{got}");
    }

    /// A file whose own pages the codec shrinks keeps compressing while another file of the
    /// table, its pages interleaved with them, finds the codec useless for the same column.
    #[test]
    fn a_file_the_codec_pays_for_keeps_it_whatever_the_others_find() {
        let batches: Vec<IntBatch> = (0..4)
            .flat_map(|_| {
                [
                    drops_seq(1, PAGE_ROWS, false),
                    drops_seq(2, PAGE_ROWS, true),
                ]
            })
            .collect();
        let got = seq_pages_compressed(&batches);
        assert_eq!(
            got["1"]["compressed"],
            serde_json::json!([true, true, true, true]),
            "{got}"
        );
        assert_eq!(
            got["2"]["compressed"],
            serde_json::json!([false, false, false, false]),
            "{got}"
        );
    }

    /// pyarrow and DuckDB read every table exactly as they read parquet's `ArrowWriter` output of
    /// the same rows (values, nulls, types), and the encodings are the ones chosen.
    #[test]
    fn pyarrow_and_duckdb_read_what_arrow_writer_would_have_written() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = IntSinkConfig {
            row_group_rows: 20_000,
            ..IntSinkConfig::for_test(dir.path())
        };
        let b = rows(6_000);
        for (table, rb) in rows(6_000).finish().unwrap() {
            let piece = Piece {
                batch: &b,
                table,
                switch: 0,
                hour: 0,
                rows: 0..rb.num_rows(),
            };
            let ours = encode_in_memory(&[piece], &cfg).unwrap();
            let theirs = encode_with_arrow_writer(table, &[rb], &cfg).unwrap();
            std::fs::write(
                dir.path().join(format!("{}.ours.parquet", table.name())),
                ours,
            )
            .unwrap();
            std::fs::write(
                dir.path().join(format!("{}.arrow.parquet", table.name())),
                theirs,
            )
            .unwrap();
        }
        let got = stel_testkit::python3_json(&format!(
            r#"
import json, duckdb, pyarrow.parquet as pq
d = {dir:?}
out = {{}}
for t in ["int_reports", "int_hops", "int_drops"]:
    ours, theirs = f"{{d}}/{{t}}.ours.parquet", f"{{d}}/{{t}}.arrow.parquet"
    a, b = pq.read_table(ours), pq.read_table(theirs)
    md = pq.ParquetFile(ours).metadata
    encs = sorted({{e for rg in range(md.num_row_groups) for c in range(md.num_columns) for e in md.row_group(rg).column(c).encodings}})
    con = duckdb.connect()
    diff = sum(con.sql(f"SELECT count(*) FROM (SELECT * FROM '{{x}}' EXCEPT ALL SELECT * FROM '{{y}}')").fetchall()[0][0]
               for x, y in [(ours, theirs), (theirs, ours)])
    out[t] = {{"rows": a.num_rows, "pyarrow_equal": a.equals(b), "schema_equal": a.schema.equals(b.schema),
              "duckdb_rows": con.sql(f"SELECT count(*) FROM '{{ours}}'").fetchall()[0][0], "duckdb_diff": diff,
              "encodings": encs}}
print(json.dumps(out))
"#,
            dir = dir.path().to_str().unwrap()
        ));
        for t in ["int_reports", "int_hops", "int_drops"] {
            let g = &got[t];
            assert!(g["rows"].as_u64().unwrap() > 0, "{got}");
            assert_eq!(g["pyarrow_equal"], true, "{t}: {got}");
            assert_eq!(g["schema_equal"], true, "{t}: {got}");
            assert_eq!(g["duckdb_rows"], g["rows"], "{t}: {got}");
            assert_eq!(g["duckdb_diff"], 0, "{t}: {got}");
            let encs = g["encodings"].to_string();
            for e in ["DELTA_BINARY_PACKED", "RLE_DICTIONARY"] {
                assert!(encs.contains(e), "{t}: {encs}");
            }
        }
    }

    /// INT32 DELTA columns on 32-bit lanes: values at both ends of their range, steps that wrap
    /// at 32 bits (u32::MAX to 0 and back, the largest step either way), constant runs, nulls
    /// mixed in and whole pages of them, across page and row-group ends: read back exactly, and
    /// the chunk statistics are the u32 minimum and maximum.
    #[test]
    fn int32_delta_lanes_round_trip_at_the_extremes() {
        let n = 45_000u64;
        let mut b = IntBatch::with_capacity(n as usize, 1);
        for i in 0..n {
            let seq = match i % 7 {
                0 => 0,
                1 => u32::MAX,
                2 => 1 << 31,
                3 => (1 << 31) - 1,
                4 => mix(i) as u32,
                _ => u32::MAX - (i % 3) as u32,
            };
            // Long constant stretches, then noise, then nulls only (a page of them).
            let gap = match i {
                0..10_000 => Some(7),
                10_000..20_000 => Some(mix(i) as u32 >> (i % 32)),
                20_000..37_000 => None,
                _ => (i % 5 != 0).then_some(u32::MAX - (i % 2) as u32),
            };
            b.reports
                .row(1_700_000_000_000_000_000 + i as i64, 7)
                .seq(Some(seq))
                .seq_gap(gap)
                .hw_id((i % 3 != 0).then_some(if i % 2 == 0 { 0 } else { u8::MAX }))
                .report_index(Some(if i % 4 < 2 { u16::MAX } else { 0 }))
                .done();
        }
        let rb = b.clone().finish().unwrap()[0].1.clone();
        let cfg = IntSinkConfig {
            row_group_rows: 20_000,
            ..IntSinkConfig::for_test("/nonexistent")
        };
        // In pieces of odd sizes: pushes that end mid-block and mid-miniblock.
        let mut pieces = Vec::new();
        let mut at = 0;
        for k in 0.. {
            let end = (at + 1 + (mix(k) % 3000) as usize).min(n as usize);
            pieces.push(Piece {
                batch: &b,
                table: Table::Reports,
                switch: 7,
                hour: 0,
                rows: at..end,
            });
            at = end;
            if at == n as usize {
                break;
            }
        }
        let bytes = encode_in_memory(&pieces, &cfg).unwrap();
        let meta = Arc::clone(
            ParquetRecordBatchReaderBuilder::try_new(Bytes::from(bytes.clone()))
                .unwrap()
                .metadata(),
        );
        assert_same(bytes, &rb, Table::Reports, "extremes");
        let schema = Table::Reports.schema();
        let col = |name: &str| schema.index_of(name).unwrap();
        for g in 0..meta.num_row_groups() {
            let rg = meta.row_group(g);
            let rows = g * 20_000..((g + 1) * 20_000).min(n as usize);
            for name in ["seq", "seq_gap"] {
                let c = rb.column(col(name));
                let c = c
                    .as_any()
                    .downcast_ref::<arrow_array::UInt32Array>()
                    .unwrap()
                    .slice(rows.start, rows.len());
                let vals: Vec<u32> = c.iter().flatten().collect();
                let stats = rg.column(col(name)).statistics().unwrap();
                let Statistics::Int32(s) = stats else {
                    panic!("{name}: {stats:?}")
                };
                let want = vals.iter().min().map(|&m| m as i32);
                assert_eq!(s.min_opt().copied(), want, "{name} row group {g}");
                let want = vals.iter().max().map(|&m| m as i32);
                assert_eq!(s.max_opt().copied(), want, "{name} row group {g}");
            }
        }
    }

    #[test]
    fn rle_hybrid_round_trips() {
        // Runs shorter and longer than 8, at every alignment, stretches of up to 60 values
        // without a run (the 16-at-a-time scan), and a tail.
        let mut idx = Vec::new();
        for k in 0..400u32 {
            let run = (mix(u64::from(k)) % 20) as usize + 1;
            idx.extend(std::iter::repeat_n(k % 37, run));
            let distinct = (mix(u64::from(k) + 1000) % 61) as u32;
            idx.extend((0..distinct).map(|j| (k + 1 + j) % 37));
        }
        for width in [6u32, 8, 13] {
            let mut out = Vec::new();
            rle_hybrid(&idx, width, &mut out);
            // Decode: ULEB header, RLE or bit-packed runs.
            let mut got = Vec::new();
            let mut p = 0;
            while got.len() < idx.len() {
                let (mut h, mut shift) = (0u64, 0);
                loop {
                    let b = out[p];
                    p += 1;
                    h |= u64::from(b & 0x7f) << shift;
                    shift += 7;
                    if b < 0x80 {
                        break;
                    }
                }
                if h & 1 == 0 {
                    let bytes = width.div_ceil(8) as usize;
                    let mut v = [0u8; 4];
                    v[..bytes].copy_from_slice(&out[p..p + bytes]);
                    p += bytes;
                    got.extend(std::iter::repeat_n(
                        u32::from_le_bytes(v),
                        (h >> 1) as usize,
                    ));
                } else {
                    let n = (h >> 1) as usize * 8;
                    for k in 0..n {
                        let mut v = 0u32;
                        for bit in 0..width as usize {
                            let at = k * width as usize + bit;
                            v |= u32::from(out[p + at / 8] >> (at % 8) & 1) << bit;
                        }
                        got.push(v);
                    }
                    p += n * width as usize / 8;
                }
            }
            got.truncate(idx.len());
            assert_eq!(got, idx, "width {width}");
            assert_eq!(p, out.len());
        }
    }
}
