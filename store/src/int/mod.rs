//! INT telemetry-report tables: what the INT decoder fills and the INT sink writes.
//!
//! Three tables, each a set of column buffers ([`Reports`], [`Hops`], [`Drops`]). The decoder
//! (`stel_ingest::int`) writes every value straight into its column: one store at the row's
//! index, plus one validity word per row (a bit per nullable column) — no row structs, no
//! transpose. Buffers are sized for a whole batch up front, so a value is written, never
//! pushed (no capacity check per value, and hop rows can be written in any order).
//! The INT writer encodes straight from these buffers: [`IntBatch::split`] groups each table's
//! rows per (switch, hour) as [`Piece`]s of consecutive rows, and the encoder reads each column
//! as a typed slice ([`ColumnRef`]) with the validity words. [`IntBatch::finish`] hands the
//! buffers to Arrow without copying them (the validity words become null buffers; only columns
//! that mix nulls and values need that pass) for readers that want Arrow; others read the typed
//! slices directly ([`Reports::view`]).
//!
//! | table | one row per | key columns |
//! |---|---|---|
//! | [`Table::Reports`] `int_reports` | individual telemetry report | (`ts`, `switch_id`, `hw_id`, `seq`, `report_index`) names the report; `flow_key`, `evc_id` |
//! | [`Table::Hops`] `int_hops` | hop of a report's INT stack (path order, `hop_index` 0 = first switch) | the report's (`ts`, `switch_id`, `hw_id`, `seq`, `report_index`), `node_id` |
//! | [`Table::Drops`] `int_drops` | report with drop information (v0.5 drop header, D flag, drop-reason metadata) | `switch_id`, `drop_reason` |
//!
//! Unavailable values (all-ones on the wire, or metadata a report does not carry) are nulls.
//! `switch_id` is the reporting switch (Telemetry Report v1.0 Switch id, v2.0 Node ID, v0.5 drop or
//! switch-local header; see the decoder's docs for the fallback). On disk every table is
//! partitioned per reporting switch: `<root>/table=<t>/switch=<switch_id>/date=…/hour=…/part-….parquet`
//! ([`crate::paths::TableDir`]), written by [`sink::IntSink`].
//!
//! Layout of a table (all buffers `capacity()` rows long; rows `0..rows()` are committed):
//!
//! ```text
//!  ts: Vec<i64>  switch_id: Vec<u32>  valid: Vec<u64>  seq: Vec<u32>  flow_key: Vec<u64>  …
//!  row i: ts[i], switch_id[i] always set; column c is null in row i unless valid[i] bit c
//!  (the column's `…Bit` constant) is set; a null row's value slot holds anything.
//! ```
use std::sync::{Arc, Mutex};

use arrow_array::{
    builder::StringBuilder,
    types::{UInt16Type, UInt32Type, UInt64Type, UInt8Type},
    ArrayRef, BooleanArray, FixedSizeBinaryArray, PrimitiveArray, RecordBatch,
    TimestampNanosecondArray,
};
use arrow_buffer::{BooleanBuffer, Buffer, NullBuffer, ScalarBuffer};
use arrow_schema::{ArrowError, DataType, Field, Schema, SchemaRef, TimeUnit};

pub mod config;
pub mod encode;
pub mod sink;
mod stats;
pub mod tree;
mod writer;

pub use config::IntSinkConfig;
pub use sink::{IntSink, IntSinkStats};

/// The INT tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Table {
    Reports,
    Hops,
    Drops,
}

impl Table {
    pub const ALL: [Table; 3] = [Table::Reports, Table::Hops, Table::Drops];

    /// Directory and SQL name: `int_reports`, `int_hops`, `int_drops`.
    pub fn name(self) -> &'static str {
        match self {
            Table::Reports => "int_reports",
            Table::Hops => "int_hops",
            Table::Drops => "int_drops",
        }
    }

    /// Parses [`Table::name`].
    pub fn from_name(s: &str) -> Option<Table> {
        Table::ALL.into_iter().find(|t| t.name() == s)
    }

    /// The table's Arrow schema.
    pub fn schema(self) -> SchemaRef {
        match self {
            Table::Reports => Reports::schema(),
            Table::Hops => Hops::schema(),
            Table::Drops => Drops::schema(),
        }
    }
}

/// Width of the address columns: IPv6, or IPv4 mapped into IPv6 (`::ffff:a.b.c.d`).
pub const ADDR_LEN: usize = 16;

/// An EVC's id and name; rows refer to them by index into the batch's [`IntBatch::evcs`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EvcName {
    pub id: String,
    pub name: String,
}

/// Column kinds: what the decoder writes (`T`), what the column buffer holds per row (`S`), and
/// how a buffer becomes an Arrow array.
pub trait Kind {
    /// The value a writer takes.
    type T: Copy + Default + std::fmt::Debug + PartialEq;
    /// One row's slot in the column buffer.
    type S: Copy + Default + std::fmt::Debug + PartialEq;
    fn data_type() -> DataType;
    /// The slot for a value.
    fn store(v: Self::T) -> Self::S;
    /// The Arrow array of `values` (one slot per row; the buffer is moved, not copied, where
    /// the Arrow layout is the buffer's), `nulls` the validity (`None`: every row valid).
    fn array(
        values: Vec<Self::S>,
        nulls: Option<NullBuffer>,
        evcs: &[EvcName],
    ) -> Result<ArrayRef, ArrowError>;
    /// The buffer as the encoder reads it.
    fn column(values: &[Self::S]) -> ColumnRef<'_>;
}

/// A column's committed rows as the INT encoder ([`encode`]) reads them: straight from the
/// decoder's buffers, no Arrow array in between.
#[derive(Debug, Clone, Copy)]
pub enum ColumnRef<'a> {
    /// `ts` (ns since the epoch).
    Ts(&'a [i64]),
    U8(&'a [u8]),
    U16(&'a [u16]),
    U32(&'a [u32]),
    U64(&'a [u64]),
    Bool(&'a [bool]),
    /// Addresses as [`Addr`] slots.
    Addr(&'a [i128]),
    /// Indices into the batch's [`IntBatch::evcs`]: the EVC id, or its name.
    EvcId(&'a [u32]),
    EvcName(&'a [u32]),
}

macro_rules! prim_kind {
    ($k:ident, $t:ty, $at:ty, $dt:expr) => {
        prim_kind!($k, $t, $at, $dt, $k);
    };
    ($k:ident, $t:ty, $at:ty, $dt:expr, $col:ident) => {
        #[derive(Debug)]
        pub struct $k;
        impl Kind for $k {
            type T = $t;
            type S = $t;
            fn data_type() -> DataType {
                $dt
            }
            #[inline(always)]
            fn store(v: $t) -> $t {
                v
            }
            fn array(
                values: Vec<$t>,
                nulls: Option<NullBuffer>,
                _: &[EvcName],
            ) -> Result<ArrayRef, ArrowError> {
                Ok(Arc::new(PrimitiveArray::<$at>::try_new(
                    ScalarBuffer::from(values),
                    nulls,
                )?))
            }
            fn column(values: &[$t]) -> ColumnRef<'_> {
                ColumnRef::$col(values)
            }
        }
    };
}

prim_kind!(U8, u8, UInt8Type, DataType::UInt8);
prim_kind!(U16, u16, UInt16Type, DataType::UInt16);
prim_kind!(U32, u32, UInt32Type, DataType::UInt32);
prim_kind!(U64, u64, UInt64Type, DataType::UInt64);

/// Boolean column (one `bool` per row in the buffer; bit-packed for Arrow at finish).
#[derive(Debug)]
pub struct Bool;
impl Kind for Bool {
    type T = bool;
    type S = bool;
    fn data_type() -> DataType {
        DataType::Boolean
    }
    #[inline(always)]
    fn store(v: bool) -> bool {
        v
    }
    fn array(
        values: Vec<bool>,
        nulls: Option<NullBuffer>,
        _: &[EvcName],
    ) -> Result<ArrayRef, ArrowError> {
        Ok(Arc::new(BooleanArray::new(
            BooleanBuffer::collect_bool(values.len(), |i| values[i]),
            nulls,
        )))
    }
    fn column(values: &[bool]) -> ColumnRef<'_> {
        ColumnRef::Bool(values)
    }
}

/// 16-byte address column (`FixedSizeBinary(16)`). The buffer holds each address as an `i128`
/// of its bytes in memory order (`i128::from_ne_bytes`), which is exactly Arrow's layout, so the
/// buffer is moved, not copied; [`Addr::bytes`] gives the address back.
#[derive(Debug)]
pub struct Addr;
impl Addr {
    /// The address bytes of a slot.
    #[inline]
    pub fn bytes(slot: i128) -> [u8; ADDR_LEN] {
        slot.to_ne_bytes()
    }
}
impl Kind for Addr {
    type T = [u8; ADDR_LEN];
    type S = i128;
    fn data_type() -> DataType {
        DataType::FixedSizeBinary(ADDR_LEN as i32)
    }
    #[inline(always)]
    fn store(v: [u8; ADDR_LEN]) -> i128 {
        i128::from_ne_bytes(v)
    }
    fn array(
        values: Vec<i128>,
        nulls: Option<NullBuffer>,
        _: &[EvcName],
    ) -> Result<ArrayRef, ArrowError> {
        Ok(Arc::new(FixedSizeBinaryArray::try_new(
            ADDR_LEN as i32,
            Buffer::from_vec(values),
            nulls,
        )?))
    }
    fn column(values: &[i128]) -> ColumnRef<'_> {
        ColumnRef::Addr(values)
    }
}

/// Column kinds for the EVC id and name: the buffer holds an index into the batch's EVC names;
/// the Arrow column is the strings.
macro_rules! evc_kind {
    ($(#[doc = $doc:literal])* $k:ident, $field:ident, $col:ident) => {
        $(#[doc = $doc])*
        #[derive(Debug)]
        pub struct $k;
        impl Kind for $k {
            type T = u32;
            type S = u32;
            fn data_type() -> DataType {
                DataType::Utf8
            }
            #[inline(always)]
            fn store(v: u32) -> u32 {
                v
            }
            fn array(
                values: Vec<u32>,
                nulls: Option<NullBuffer>,
                evcs: &[EvcName],
            ) -> Result<ArrayRef, ArrowError> {
                let n = values.len();
                let mut b = StringBuilder::with_capacity(n, n * 8);
                for (i, &v) in values.iter().enumerate() {
                    let e = if nulls.as_ref().is_none_or(|v| v.is_valid(i)) {
                        evcs.get(v as usize)
                    } else {
                        None
                    };
                    match e {
                        Some(e) => b.append_value(&e.$field),
                        None => b.append_null(),
                    }
                }
                Ok(Arc::new(b.finish()))
            }
            fn column(values: &[u32]) -> ColumnRef<'_> {
                ColumnRef::$col(values)
            }
        }
    };
}

evc_kind!(
    /// EVC id column (UTF-8) from an index into the batch's EVC names.
    EvcId,
    id,
    EvcId
);
evc_kind!(
    /// EVC name column (UTF-8) from an index into the batch's EVC names.
    EvcNameCol,
    name,
    EvcName
);

/// Validity of column bit `bit` over the rows' validity words, given their AND and OR (`None`:
/// every row valid; all-null without a pass over the rows).
fn nulls_of(valid: &[u64], and: u64, or: u64, bit: u32) -> Option<NullBuffer> {
    if and >> bit & 1 == 1 {
        None
    } else if or >> bit & 1 == 0 {
        Some(NullBuffer::new_null(valid.len()))
    } else {
        Some(NullBuffer::new(BooleanBuffer::collect_bool(
            valid.len(),
            |i| valid[i] >> bit & 1 == 1,
        )))
    }
}

/// Nanoseconds per hour: files are split at UTC hour boundaries.
pub const NS_PER_HOUR: i64 = 3_600_000_000_000;

/// The groups of `keys` (distinct (switch, hour) keys in order of first appearance) and each
/// row's group (index into them) appended to `gid`. A row's group is first looked for in a
/// direct-mapped cache of the last group seen per slot of the switch id's hash (a batch mixes
/// its switches row by row: one compare per row that the branch predictor gets right), then by
/// a scan of the groups while there are few (a batch's switches), a hash map beyond.
fn group_ids(keys: impl Iterator<Item = (u32, i64)>, gid: &mut Vec<u32>) -> Vec<(u32, i64)> {
    const SCAN: usize = 32;
    const CACHE_BITS: u32 = 6;
    // (Hour number i64::MIN is never a row's: ts / NS_PER_HOUR is far from it.)
    let mut cache = [((0u32, i64::MIN), 0u32); 1 << CACHE_BITS];
    let mut groups: Vec<(u32, i64)> = Vec::new();
    let mut index: std::collections::HashMap<(u32, i64), usize> = std::collections::HashMap::new();
    gid.extend(keys.map(|k| {
        let slot = &mut cache[(k.0.wrapping_mul(0x9E37_79B9) >> (32 - CACHE_BITS)) as usize];
        if slot.0 == k {
            return slot.1;
        }
        let found = if groups.len() <= SCAN {
            groups.iter().position(|gk| *gk == k)
        } else {
            if index.is_empty() {
                index.extend(groups.iter().enumerate().map(|(g, gk)| (*gk, g)));
            }
            index.get(&k).copied()
        };
        let g = found.unwrap_or_else(|| {
            groups.push(k);
            if groups.len() > SCAN + 1 {
                index.insert(k, groups.len() - 1);
            }
            groups.len() - 1
        }) as u32;
        *slot = (k, g);
        g
    }));
    groups
}

/// Each row's place in the grouped order (groups in order, rows in order within each), from
/// the groups' keys and each row's group (`gid`, turned into the places), and each group's key
/// and places.
fn places<K>(keys: Vec<K>, mut gid: Vec<u32>) -> (Vec<u32>, Vec<(K, std::ops::Range<usize>)>) {
    let mut next = vec![0u32; keys.len()];
    for &g in &gid {
        next[g as usize] += 1;
    }
    let mut at = 0u32;
    let spans = keys
        .into_iter()
        .zip(&mut next)
        .map(|(k, c)| {
            let span = at as usize..(at + *c) as usize;
            (at, *c) = (at + *c, at);
            (k, span)
        })
        .collect();
    for g in &mut gid {
        let p = &mut next[*g as usize];
        *g = *p;
        *p += 1;
    }
    (gid, spans)
}

/// One UTC hour as a range of `ts` and its number (`ts / NS_PER_HOUR`): the hour of a row is a
/// compare against the previous row's hour, not a 64-bit division per row.
#[derive(Debug, Clone, Copy)]
struct Hour {
    start: i64,
    end: i64,
    number: i64,
}

impl Hour {
    fn of(t: i64) -> Self {
        let number = t.div_euclid(NS_PER_HOUR);
        // (An hour whose bounds do not fit an i64 is an empty range: every row divides.)
        let (start, end) = match number.checked_mul(NS_PER_HOUR) {
            Some(s) => (s, s.checked_add(NS_PER_HOUR).unwrap_or(s)),
            None => (0, 0),
        };
        Self { start, end, number }
    }

    /// The hour number of `t`, moving to its hour when it is not this one.
    #[inline]
    fn number_of(&mut self, t: i64) -> i64 {
        if !(self.start..self.end).contains(&t) {
            *self = Self::of(t);
        }
        self.number
    }
}

/// How a table's committed rows fall into (reporting switch, UTC hour) groups.
enum Grouping {
    Empty,
    One((u32, i64)),
    /// The groups in order of first appearance, and each row's group.
    Many(Vec<(u32, i64)>, Vec<u32>),
}

/// The slots of `v` at `idx`.
fn gather<S: Copy>(v: &[S], idx: &[u32]) -> Vec<S> {
    idx.iter().map(|&i| v[i as usize]).collect()
}

/// Emptied batches kept for reuse: a fresh allocation of a decoder's batch is fresh pages (a
/// page fault per 4 KiB, measured at ~15 % of decode time), so whoever is done with a batch
/// whose buffers it still holds hands it back ([`IntBatch::recycle`]) and
/// [`IntBatch::with_capacity`] takes it. One short lock per batch, never per row; at most
/// [`POOL_MAX_BYTES`] of buffers are kept (outside the sink's memory budget).
static POOL: Mutex<Vec<IntBatch>> = Mutex::new(Vec::new());
/// Most buffer bytes [`POOL`] keeps (its batches' [`IntBatch::bytes`]): ~38 batches at
/// `batch_reports = 1024`, enough for the batches queued while the writer is behind.
pub const POOL_MAX_BYTES: usize = 32 << 20;

/// Name of the time column of every INT table: when the collector received the report (ns since
/// the epoch, UTC). Device timestamps (32-bit wrapping ns in v0.5/v1.0) are kept in their own
/// columns.
pub const TS_COLUMN: &str = "ts";
/// Footer key: which INT table a file holds.
pub const TABLE_KEY: &str = "stel.table";
/// Name of the reporting-switch column (the partition key).
pub const SWITCH_COLUMN: &str = "switch_id";

macro_rules! table {
    ($(#[doc = $tdoc:literal])* $name:ident, $writer:ident, $view:ident, $rows:ident, $bits:ident { $($(#[doc = $doc:literal])* $col:ident : $kind:ident,)* }) => {
        #[doc = concat!("Bit of each nullable column of [`", stringify!($name), "`] in a row's validity word.")]
        #[allow(non_upper_case_globals)]
        #[derive(Debug)]
        pub struct $bits;
        #[allow(non_upper_case_globals)]
        impl $bits {
            table!(@bits 0u32; $($col)*);
        }

        $(#[doc = $tdoc])*
        ///
        /// Column buffers, each [`Self::capacity`] rows long: write a row with [`Self::row`]
        /// (or [`Self::row_at`] + [`Self::commit`]), read them with [`Self::view`], hand them to
        /// Arrow with [`Self::finish`].
        #[derive(Debug, Default, Clone)]
        pub struct $name {
            rows: usize,
            cap: usize,
            ts: Vec<i64>,
            switch_id: Vec<u32>,
            valid: Vec<u64>,
            $($col: Vec<<$kind as Kind>::S>,)*
        }

        #[doc = concat!("Writes one row of [`", stringify!($name), "`]: each setter stores a value at the row's index (`None` leaves the column null) and passes the writer on; [`", stringify!($writer), "::done`] stores the row's validity word (and commits a row from [`", stringify!($name), "::row`]).")]
        #[derive(Debug)]
        #[must_use = "a row is written by .done()"]
        pub struct $writer<'a> {
            t: &'a mut $name,
            i: usize,
            valid: u64,
            commit: bool,
        }

        // Setters take and return the writer by value, and it has no `Drop`: the validity word
        // stays in a register through a chain of them. (A `&mut self` chain kept it in memory,
        // a store and a reload per value: ~18 % of decode time; a by-value writer with `Drop`
        // was copied between stack slots at every step: 4× slower.)
        impl $writer<'_> {
            /// Stores the validity word; a row from [`Self::row`]-style writing is committed.
            #[inline(always)]
            pub fn done(self) {
                self.t.valid[self.i] = self.valid;
                if self.commit {
                    self.t.rows += 1;
                }
            }

            $(
                $(#[doc = $doc])*
                #[inline(always)]
                pub fn $col(mut self, v: Option<<$kind as Kind>::T>) -> Self {
                    if let Some(v) = v {
                        self.t.$col[self.i] = <$kind>::store(v);
                        self.valid |= 1 << $bits::$col;
                    }
                    self
                }
            )*
        }

        #[doc = concat!("The committed rows of [`", stringify!($name), "`] as typed slices (all `rows()` long): a column's row `i` is null unless `valid[i]` has the column's [`", stringify!($bits), "`] bit.")]
        #[derive(Debug, Clone, Copy)]
        pub struct $view<'a> {
            /// Receive time, ns since the epoch (non-null).
            pub ts: &'a [i64],
            /// Reporting switch (non-null; the partition key).
            pub switch_id: &'a [u32],
            /// Validity word of each row.
            pub valid: &'a [u64],
            $($(#[doc = $doc])* pub $col: &'a [<$kind as Kind>::S],)*
        }

        #[doc = concat!("Rows of [`", stringify!($name), "`] being written column by column ([`", stringify!($name), "::rows_mut`]): every buffer's slots for those rows (all the same length), indexed from 0.")]
        #[derive(Debug)]
        pub struct $rows<'a> {
            pub ts: &'a mut [i64],
            pub switch_id: &'a mut [u32],
            /// Validity word of each row: set every row's.
            pub valid: &'a mut [u64],
            $($(#[doc = $doc])* pub $col: &'a mut [<$kind as Kind>::S],)*
        }

        impl $name {
            /// Nullable columns (bits of the validity word).
            pub const COLUMNS: usize = [$(stringify!($col),)*].len();
            const _FIT: () = assert!(Self::COLUMNS <= 64);
            /// Buffer bytes per row (every column, the validity word, ts and switch_id).
            pub const ROW_BYTES: usize = 8 + 4 + 8 $(+ std::mem::size_of::<<$kind as Kind>::S>())*;

            /// Buffers for `n` rows, zeroed by the allocator (`vec![0; n]` asks for zeroed
            /// memory): fresh pages are mapped on first write, so rows never written (a batch's
            /// spare hop rows, most drop rows) cost neither a page fault nor a pass of zeroes.
            pub fn with_capacity(n: usize) -> Self {
                let () = Self::_FIT;
                Self {
                    rows: 0,
                    cap: n,
                    ts: vec![0; n],
                    switch_id: vec![0; n],
                    valid: vec![0; n],
                    $($col: vec![Default::default(); n],)*
                }
            }

            /// Resizes every buffer to `n` rows (`n` ≥ `rows()`).
            fn grow_to(&mut self, n: usize) {
                self.ts.resize(n, 0);
                self.switch_id.resize(n, 0);
                self.valid.resize(n, 0);
                $(self.$col.resize(n, Default::default());)*
                self.cap = n;
            }

            /// Makes room for `extra` more rows (doubling; a batch is sized so this is rare).
            #[inline]
            pub fn reserve(&mut self, extra: usize) {
                if self.rows + extra > self.cap {
                    self.grow_to((self.rows + extra).max(self.cap * 2).max(16));
                }
            }

            /// Writes row `rows()` (growing the buffers when full); the row is committed by the
            /// writer's `done()`.
            #[inline(always)]
            pub fn row(&mut self, ts: i64, switch_id: u32) -> $writer<'_> {
                self.reserve(1);
                let i = self.rows;
                let mut w = self.row_at(i, ts, switch_id);
                w.commit = true;
                w
            }

            /// Writes row `i` (`rows()` ≤ `i` < `capacity()`, see [`Self::reserve`]) without
            /// committing it: rows may be written in any order, then [`Self::commit`]ted
            /// together. A row written and never committed is overwritten later.
            ///
            /// # Panics
            /// `i` ≥ `capacity()`.
            #[inline(always)]
            pub fn row_at(&mut self, i: usize, ts: i64, switch_id: u32) -> $writer<'_> {
                self.ts[i] = ts;
                self.switch_id[i] = switch_id;
                $writer { t: self, i, valid: 0, commit: false }
            }

            /// Rows `at..at + n` (`rows()` ≤ `at`, see [`Self::reserve`]) of every buffer, to
            /// write several rows at once with one bounds check per column rather than per value;
            /// committed by [`Self::commit`] as [`Self::row_at`]'s. A column's slot is read only
            /// where the row's validity word has the column's bit.
            ///
            /// # Panics
            /// Past `capacity()`.
            #[inline(always)]
            pub fn rows_mut(&mut self, at: usize, n: usize) -> $rows<'_> {
                let r = at..at + n;
                $rows {
                    ts: &mut self.ts[r.clone()],
                    switch_id: &mut self.switch_id[r.clone()],
                    valid: &mut self.valid[r.clone()],
                    $($col: &mut self.$col[r.clone()],)*
                }
            }

            /// Commits rows `rows()..rows() + n` written with [`Self::row_at`].
            ///
            /// # Panics
            /// Past `capacity()`.
            #[inline]
            pub fn commit(&mut self, n: usize) {
                assert!(self.rows + n <= self.cap, "commit past the buffers");
                self.rows += n;
            }

            /// Committed rows.
            pub fn rows(&self) -> usize {
                self.rows
            }

            /// Rows the buffers hold.
            pub fn capacity(&self) -> usize {
                self.cap
            }

            /// Bytes the buffers hold (capacity, not rows: what the memory budget must count).
            pub fn bytes(&self) -> usize {
                self.cap * Self::ROW_BYTES
            }

            /// Forgets the rows, keeping the buffers.
            pub fn clear(&mut self) {
                self.rows = 0;
            }

            /// The committed rows' columns.
            pub fn view(&self) -> $view<'_> {
                let n = self.rows;
                $view {
                    ts: &self.ts[..n],
                    switch_id: &self.switch_id[..n],
                    valid: &self.valid[..n],
                    $($col: &self.$col[..n],)*
                }
            }

            /// Every column of the committed rows in schema order (`ts`, `switch_id`, then the
            /// nullable ones), each with its bit in the validity words (`None`: never null).
            pub fn columns(&self) -> Vec<(ColumnRef<'_>, Option<u32>)> {
                let n = self.rows;
                vec![
                    (ColumnRef::Ts(&self.ts[..n]), None),
                    (ColumnRef::U32(&self.switch_id[..n]), None),
                    $((<$kind as Kind>::column(&self.$col[..n]), Some($bits::$col)),)*
                ]
            }

            /// The committed rows grouped by (reporting switch, UTC hour number), groups in
            /// order of first appearance: `None` when every row is in the one group (the usual
            /// case), else each group's row indices in order.
            pub fn groups(&self) -> Vec<((u32, i64), Option<Vec<u32>>)> {
                match self.grouping() {
                    Grouping::Empty => Vec::new(),
                    Grouping::One(k) => vec![(k, None)],
                    Grouping::Many(keys, gid) => {
                        let mut out: Vec<_> = keys.into_iter().map(|k| (k, Some(Vec::new()))).collect();
                        for (i, &g) in gid.iter().enumerate() {
                            if let Some(idx) = &mut out[g as usize].1 {
                                idx.push(i as u32);
                            }
                        }
                        out
                    }
                }
            }

            /// The committed rows' (reporting switch, UTC hour number) groups in order of first
            /// appearance, and each row's group when there are several.
            fn grouping(&self) -> Grouping {
                let n = self.rows;
                let (sw, ts) = (&self.switch_id[..n], &self.ts[..n]);
                let (Some(&sw0), Some(&t0)) = (sw.first(), ts.first()) else {
                    return Grouping::Empty;
                };
                // Hours as ranges of ts: a division only where a row leaves the hour before.
                let mut hour = Hour::of(t0);
                let h0 = hour.number;
                if sw.iter().zip(ts).all(|(&s, &t)| s == sw0 && hour.number_of(t) == h0) {
                    return Grouping::One((sw0, h0));
                }
                let mut gid = Vec::with_capacity(n);
                let keys = group_ids(sw.iter().zip(ts).map(|(&s, &t)| (s, hour.number_of(t))), &mut gid);
                Grouping::Many(keys, gid)
            }

            /// Copies the committed rows into `dst` as its rows, row `i` at place `places[i]` (a
            /// permutation of the rows), one column at a time: each column is
            /// read in order (the batch was just written by the decoder, on another core) and
            /// written to as many places in `dst` as there are groups; a column null in every
            /// row is not copied (its slots are never read).
            pub fn scatter_into(&self, places: &[u32], dst: &mut Self) {
                let n = places.len().min(self.rows);
                dst.clear();
                dst.reserve(n);
                fn col<S: Copy>(src: &[S], places: &[u32], dst: &mut [S]) {
                    for (&v, &p) in src.iter().zip(places) {
                        dst[p as usize] = v;
                    }
                }
                let places = &places[..n];
                col(&self.ts[..n], places, &mut dst.ts);
                col(&self.switch_id[..n], places, &mut dst.switch_id);
                col(&self.valid[..n], places, &mut dst.valid);
                let any = self.valid[..n].iter().fold(0u64, |o, &v| o | v);
                $(if any >> $bits::$col & 1 == 1 {
                    col(&self.$col[..n], places, &mut dst.$col);
                })*
                dst.rows = n;
            }

            /// Appends the committed rows of `o` (growing the buffers as needed).
            pub fn extend_from(&mut self, o: &$name) {
                let n = o.rows;
                self.reserve(n);
                let at = self.rows;
                self.ts[at..at + n].copy_from_slice(&o.ts[..n]);
                self.switch_id[at..at + n].copy_from_slice(&o.switch_id[..n]);
                self.valid[at..at + n].copy_from_slice(&o.valid[..n]);
                $(self.$col[at..at + n].copy_from_slice(&o.$col[..n]);)*
                self.rows += n;
            }

            /// The Arrow schema (field order = column order).
            pub fn schema() -> SchemaRef {
                Arc::new(Schema::new(vec![
                    Field::new(TS_COLUMN, DataType::Timestamp(TimeUnit::Nanosecond, Some("UTC".into())), false),
                    Field::new(SWITCH_COLUMN, DataType::UInt32, false),
                    $(Field::new(stringify!($col), <$kind>::data_type(), true),)*
                ]))
            }

            /// The committed rows as a record batch, moving the buffers into Arrow (no copy; the
            /// validity words become null buffers, one pass only for a column that mixes nulls
            /// and values). Leaves this table empty, without buffers.
            ///
            /// # Errors
            /// Arrow rejecting a column (a bug).
            pub fn finish(&mut self, evcs: &[EvcName]) -> Result<RecordBatch, ArrowError> {
                let mut t = std::mem::take(self);
                let n = t.rows;
                t.ts.truncate(n);
                t.switch_id.truncate(n);
                t.valid.truncate(n);
                $(t.$col.truncate(n);)*
                Self::to_batch(t.ts, t.switch_id, &t.valid, ($(t.$col,)*), evcs)
            }

            /// The committed rows grouped by (reporting switch, UTC hour number), each group a
            /// record batch in arrival order, leaving this table empty. One group (the usual
            /// case): the buffers are moved into Arrow as by [`Self::finish`]; several: each
            /// group's rows are gathered into new buffers and this table keeps its own.
            ///
            /// # Errors
            /// Arrow rejecting a column (a bug).
            pub fn finish_split(
                &mut self,
                evcs: &[EvcName],
            ) -> Result<Vec<((u32, i64), RecordBatch)>, ArrowError> {
                let groups = self.groups();
                if let [(k, None)] = groups[..] {
                    return Ok(vec![(k, self.finish(evcs)?)]);
                }
                let out = groups
                    .into_iter()
                    .map(|(k, idx)| {
                        let idx = idx.unwrap_or_default();
                        let valid = gather(&self.valid, &idx);
                        Ok((
                            k,
                            Self::to_batch(
                                gather(&self.ts, &idx),
                                gather(&self.switch_id, &idx),
                                &valid,
                                ($(gather(&self.$col, &idx),)*),
                                evcs,
                            )?,
                        ))
                    })
                    .collect();
                self.clear();
                out
            }

            /// Buffers exactly `rows` long → record batch.
            #[allow(clippy::type_complexity)]
            fn to_batch(
                ts: Vec<i64>,
                switch_id: Vec<u32>,
                valid: &[u64],
                ($($col,)*): ($(Vec<<$kind as Kind>::S>,)*),
                evcs: &[EvcName],
            ) -> Result<RecordBatch, ArrowError> {
                let (and, or) = valid
                    .iter()
                    .fold((u64::MAX, 0u64), |(a, o), &v| (a & v, o | v));
                let cols: Vec<ArrayRef> = vec![
                    Arc::new(TimestampNanosecondArray::new(ScalarBuffer::from(ts), None).with_timezone("UTC")),
                    Arc::new(PrimitiveArray::<UInt32Type>::new(ScalarBuffer::from(switch_id), None)),
                    $(<$kind>::array($col, nulls_of(valid, and, or, $bits::$col), evcs)?,)*
                ];
                RecordBatch::try_new(Self::schema(), cols)
            }
        }
    };
    (@bits $n:expr; $col:ident $($rest:ident)*) => {
        #[doc = concat!("`", stringify!($col), "`")]
        pub const $col: u32 = $n;
        table!(@bits $n + 1u32; $($rest)*);
    };
    (@bits $n:expr;) => {};
}

table! {
    /// `int_reports`: one row per individual telemetry report.
    Reports, ReportWriter, ReportsView, ReportRows, ReportBit {
        /// Telemetry Report version: 0 (v0.5), 1 (v1.0), 2 (v2.0).
        report_version: U8,
        /// Sub-system of the reporting switch (6 bits; 4 with the Tofino v2.0 variant).
        hw_id: U8,
        /// Report sequence number (32 bits in v0.5/v1.0, 22 or 24 in v2.0).
        seq: U32,
        /// Place of the report in its datagram: 0, 1, … for the individual reports of a v2.0
        /// group (they share the group's sequence number), 0 for v0.5/v1.0 (one per datagram).
        report_index: U16,
        /// Reports of this (switch, hw_id) missing right before this one (0 = in order); a late
        /// report that fills an earlier gap has 0 and its gap shrinks in the loss counters.
        seq_gap: U32,
        /// D: a watched packet was dropped.
        dropped: Bool,
        /// Q: congested-queue association.
        congested: Bool,
        /// F: tracked flow.
        tracked: Bool,
        /// I: intermediate report (v2.0 only).
        intermediate: Bool,
        /// v2.0 RepType (0 inner only, 1 INT, 2 IOAM).
        rep_type: U8,
        /// v2.0 InType (0 none, 1 TLV, 2 DS extension, 3 Ethernet, 4 IPv4, 5 IPv6).
        in_type: U8,
        /// Report ingress timestamp (device ns: 32-bit in v0.5/v1.0, 64-bit in v2.0).
        report_ingress_ts: U64,
        /// Reporting switch's own metadata (v1.0/v2.0 RepMdBits, v0.5 switch-local header).
        rep_ingress_port: U32,
        rep_egress_port: U32,
        rep_hop_latency: U32,
        rep_queue_id: U8,
        rep_queue_occupancy: U32,
        rep_egress_ts: U64,
        rep_drop_reason: U8,
        rep_tx_util: U32,
        rep_buffer_id: U8,
        rep_buffer_occupancy: U32,
        /// Sender of the report datagram (the reporting switch's IP, IPv4 mapped into IPv6);
        /// null when unknown.
        reporter_addr: Addr,
        /// Outer 802.1Q/802.1ad VLAN id of the inner packet (AmLight's EVC key).
        vlan: U16,
        /// Second (customer) VLAN id with QinQ.
        inner_vlan: U16,
        /// 4 or 6.
        ip_version: U8,
        /// Inner packet addresses (IPv4 mapped into IPv6).
        src_addr: Addr,
        dst_addr: Addr,
        ip_proto: U8,
        src_port: U16,
        dst_port: U16,
        dscp: U8,
        /// Hash of (VLAN, inner VLAN, addresses, protocol, ports): the flow (its hops: `int_hops`
        /// rows with this report's key).
        flow_key: U64,
        /// INT header version: 0 (v0.5), 1 (v1.0), 2 (v2.x INT-MD).
        int_version: U8,
        /// Hops in the INT stack.
        hop_count: U8,
        /// Words of metadata per hop.
        hop_ml: U8,
        /// INT instruction bitmap.
        instructions: U16,
        /// INT Remaining Hop Count (v1.0/v2.x).
        remaining_hop_count: U8,
        /// Hash of the switch ids in path order.
        path_id: U64,
        /// The flow's path differs from its previous report's.
        path_changed: Bool,
        /// Sum of per-hop latencies (hop latency, or egress − ingress timestamp), ns; null when a
        /// hop has neither.
        latency_sum_ns: U64,
        /// Last egress − first ingress timestamp, ns (only with `clocks_synchronized`).
        latency_e2e_ns: U64,
        /// The flow's latency is above `latency_threshold_ns`.
        latency_over: Bool,
        /// EVC the report belongs to (Kytos mef_eline id) and its name.
        evc_id: EvcId,
        evc_name: EvcNameCol,
    }
}

table! {
    /// `int_hops`: one row per hop of a report's INT stack, in path order.
    Hops, HopWriter, HopsView, HopRows, HopBit {
        /// The report this hop belongs to: its `int_reports` row has the same `ts`,
        /// `switch_id`, `hw_id`, `seq` and `report_index` (report-level columns such as
        /// `flow_key`, `vlan` and the EVC are there, not repeated per hop).
        hw_id: U8,
        seq: U32,
        report_index: U16,
        /// 0 = the first switch of the path (the bottom of the stack).
        hop_index: U8,
        /// Switch id / Node ID of this hop.
        node_id: U32,
        /// L1 ingress/egress port (16 bits).
        ingress_port: U32,
        egress_port: U32,
        /// L2 ingress/egress interface (32 bits, v1.0/v2.x bit 6).
        l2_ingress_port: U32,
        l2_egress_port: U32,
        /// Hop latency as reported (raw units).
        hop_latency: U32,
        queue_id: U8,
        queue_occupancy: U32,
        /// v0.5: queue congestion status (24 bits).
        queue_congestion: U32,
        /// Device timestamps (32-bit in v0.5/v1.0, 64-bit in v2.x).
        ingress_ts: U64,
        egress_ts: U64,
        tx_util: U32,
        buffer_id: U8,
        buffer_occupancy: U32,
        /// Hop latency in ns: hop latency, else egress − ingress timestamp (wrap-aware).
        latency_ns: U64,
    }
}

table! {
    /// `int_drops`: one row per report that says a packet was dropped.
    Drops, DropWriter, DropsView, DropRows, DropBit {
        report_version: U8,
        hw_id: U8,
        seq: U32,
        ingress_port: U32,
        egress_port: U32,
        queue_id: U8,
        /// Drop reason code (e.g. p4lang/switch drop_reason_codes.h); null when only D was set.
        drop_reason: U8,
        vlan: U16,
        src_addr: Addr,
        dst_addr: Addr,
        ip_proto: U8,
        src_port: U16,
        dst_port: U16,
        flow_key: U64,
        evc_id: EvcId,
    }
}

/// Consecutive rows of one table of a batch that go to one file: one (reporting switch, UTC
/// hour) group of [`IntBatch::split`].
#[derive(Debug, Clone)]
pub struct Piece<'a> {
    pub batch: &'a IntBatch,
    pub table: Table,
    pub switch: u32,
    /// UTC hour number (`ts / NS_PER_HOUR`).
    pub hour: i64,
    pub rows: std::ops::Range<usize>,
}

impl Piece<'_> {
    /// Rows in the piece.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The earliest and latest `ts` of the piece's rows.
    pub fn ts_range(&self) -> Option<(i64, i64)> {
        let ts = match self.table {
            Table::Reports => self.batch.reports.view().ts,
            Table::Hops => self.batch.hops.view().ts,
            Table::Drops => self.batch.drops.view().ts,
        };
        ts.get(self.rows.clone())?
            .iter()
            .fold(None, |m: Option<(i64, i64)>, &t| {
                Some(m.map_or((t, t), |(a, b)| (a.min(t), b.max(t))))
            })
    }
}

/// One decoder batch of the three tables.
#[derive(Debug, Default, Clone)]
pub struct IntBatch {
    pub reports: Reports,
    pub hops: Hops,
    pub drops: Drops,
    /// The EVC names the rows' `evc_id`/`evc_name` indices refer to (shared, not copied).
    pub evcs: Arc<[EvcName]>,
}

impl IntBatch {
    /// Buffers for `reports` reports and `hops` hops: an emptied batch from the pool when one is
    /// big enough, else new ones.
    pub fn with_capacity(reports: usize, hops: usize) -> Self {
        if let Ok(mut pool) = POOL.lock() {
            if let Some(i) = pool
                .iter()
                .position(|b| b.reports.capacity() >= reports && b.hops.capacity() >= hops)
            {
                return pool.swap_remove(i);
            }
        }
        Self {
            reports: Reports::with_capacity(reports),
            hops: Hops::with_capacity(hops),
            drops: Drops::with_capacity(reports / 16 + 1),
            evcs: Arc::new([]),
        }
    }

    /// Gives the batch's buffers back for reuse by [`IntBatch::with_capacity`] (rows dropped;
    /// freed instead when the pool holds [`POOL_MAX_BYTES`] or the buffers went to Arrow with
    /// `finish`).
    pub fn recycle(mut self) {
        if self.reports.capacity() == 0 || self.hops.capacity() == 0 {
            return;
        }
        self.clear();
        self.evcs = Arc::new([]);
        if let Ok(mut pool) = POOL.lock() {
            self.into_pool(&mut pool);
        }
    }

    /// Keeps the batch in `pool` if the pool stays within [`POOL_MAX_BYTES`]; drops it else.
    fn into_pool(self, pool: &mut Vec<IntBatch>) {
        let held: usize = pool.iter().map(IntBatch::bytes).sum();
        if held + self.bytes() <= POOL_MAX_BYTES {
            pool.push(self);
        }
    }

    /// Forgets the rows of all three tables, keeping the buffers.
    pub fn clear(&mut self) {
        self.reports.clear();
        self.hops.clear();
        self.drops.clear();
    }

    /// A batch holding a copy of these rows in buffers just their size, leaving `self` empty
    /// with its buffers: what a decoder hands over when it flushes a small batch, so its big
    /// buffers stay warm and the sink holds no more memory than the rows need.
    pub fn take_compact(&mut self) -> IntBatch {
        let mut b = IntBatch {
            reports: Reports::with_capacity(self.reports.rows()),
            hops: Hops::with_capacity(self.hops.rows()),
            drops: Drops::with_capacity(self.drops.rows()),
            evcs: Arc::clone(&self.evcs),
        };
        b.reports.extend_from(&self.reports);
        b.hops.extend_from(&self.hops);
        b.drops.extend_from(&self.drops);
        self.clear();
        b
    }

    /// Rows of all three tables.
    pub fn rows(&self) -> usize {
        self.reports.rows() + self.hops.rows() + self.drops.rows()
    }

    pub fn is_empty(&self) -> bool {
        self.rows() == 0
    }

    /// Bytes the buffers hold (the sink's memory budget).
    pub fn bytes(&self) -> usize {
        self.reports.bytes() + self.hops.bytes() + self.drops.bytes()
    }

    /// The rows as record batches per (table, reporting switch, UTC hour number), leaving
    /// `self` empty: what the writer needs, without filtering columns afterwards.
    ///
    /// # Errors
    /// Arrow rejecting a column (a bug).
    pub fn finish_split(&mut self) -> Result<Vec<(Table, u32, i64, RecordBatch)>, ArrowError> {
        let evcs = Arc::clone(&self.evcs);
        let mut out = Vec::new();
        for (t, parts) in [
            (Table::Reports, self.reports.finish_split(&evcs)?),
            (Table::Hops, self.hops.finish_split(&evcs)?),
            (Table::Drops, self.drops.finish_split(&evcs)?),
        ] {
            out.extend(parts.into_iter().map(|((sw, h), rb)| (t, sw, h, rb)));
        }
        Ok(out)
    }

    /// The rows per (table, reporting switch, UTC hour number), groups in order of first
    /// appearance, as [`Piece`]s of consecutive rows: of `self` where a table's rows are one
    /// group (the usual case), else of `scratch`, which receives that table's rows grouped
    /// (copied column by column into buffers `scratch` keeps; no Arrow arrays, one place per
    /// row computed per batch).
    pub fn split<'a>(&'a self, scratch: &'a mut IntBatch) -> Vec<Piece<'a>> {
        scratch.clear();
        scratch.evcs = Arc::clone(&self.evcs);
        let mut spans = Vec::new();
        for (t, grouping) in [
            (Table::Reports, self.reports.grouping()),
            (Table::Hops, self.hops.grouping()),
            (Table::Drops, self.drops.grouping()),
        ] {
            let (places, groups) = match grouping {
                Grouping::Empty => continue,
                Grouping::One((sw, h)) => {
                    spans.push((false, t, sw, h, 0..self.table_rows(t)));
                    continue;
                }
                Grouping::Many(keys, gid) => places(keys, gid),
            };
            for ((sw, h), rows) in groups {
                spans.push((true, t, sw, h, rows));
            }
            match t {
                Table::Reports => self.reports.scatter_into(&places, &mut scratch.reports),
                Table::Hops => self.hops.scatter_into(&places, &mut scratch.hops),
                Table::Drops => self.drops.scatter_into(&places, &mut scratch.drops),
            }
        }
        let scratch = &*scratch;
        spans
            .into_iter()
            .map(|(copied, table, switch, hour, rows)| Piece {
                batch: if copied { scratch } else { self },
                table,
                switch,
                hour,
                rows,
            })
            .collect()
    }

    /// Committed rows of `table`.
    pub fn table_rows(&self, table: Table) -> usize {
        match table {
            Table::Reports => self.reports.rows(),
            Table::Hops => self.hops.rows(),
            Table::Drops => self.drops.rows(),
        }
    }

    /// Every column of `table`'s committed rows (as [`Reports::columns`]) and their validity
    /// words.
    pub fn columns(&self, table: Table) -> (Vec<(ColumnRef<'_>, Option<u32>)>, &[u64]) {
        match table {
            Table::Reports => (
                self.reports.columns(),
                &self.reports.valid[..self.reports.rows],
            ),
            Table::Hops => (self.hops.columns(), &self.hops.valid[..self.hops.rows]),
            Table::Drops => (self.drops.columns(), &self.drops.valid[..self.drops.rows]),
        }
    }

    /// The three tables as record batches (empty ones included), moving the buffers into Arrow
    /// without copying them; leaves `self` empty, without buffers.
    ///
    /// # Errors
    /// Arrow rejecting a column (a bug).
    pub fn finish(&mut self) -> Result<[(Table, RecordBatch); 3], ArrowError> {
        let evcs = Arc::clone(&self.evcs);
        Ok([
            (Table::Reports, self.reports.finish(&evcs)?),
            (Table::Hops, self.hops.finish(&evcs)?),
            (Table::Drops, self.drops.finish(&evcs)?),
        ])
    }
}

#[cfg(test)]
mod tests {
    use arrow_array::{cast::AsArray, Array, StringArray};

    use super::*;

    #[test]
    fn columns_become_arrow_with_nulls_without_copying() {
        let mut b = IntBatch::with_capacity(4, 4);
        b.evcs = Arc::new([EvcName {
            id: "evc-1".into(),
            name: "one".into(),
        }]);
        b.reports
            .row(5, 7)
            .report_version(Some(1))
            .seq(Some(9))
            .src_addr(Some([1; 16]))
            .evc_id(Some(0))
            .evc_name(Some(0))
            .vlan(None)
            .done();
        b.reports
            .row(6, 7)
            .vlan(Some(42))
            .report_version(Some(1))
            .done();
        let seq_ptr = b.reports.view().seq.as_ptr();
        assert_eq!(b.reports.view().valid[0] >> ReportBit::seq & 1, 1);
        let [(t, rb), (_, hops), _] = b.finish().unwrap();
        assert_eq!(t, Table::Reports);
        assert_eq!(rb.num_rows(), 2);
        assert_eq!(hops.num_rows(), 0);
        assert_eq!(rb.schema(), Reports::schema());
        assert_eq!(rb.column_by_name("vlan").unwrap().null_count(), 1);
        assert_eq!(rb.column_by_name("seq").unwrap().null_count(), 1);
        assert_eq!(rb.column_by_name("hop_ml").unwrap().null_count(), 2);
        assert_eq!(rb.column_by_name("report_version").unwrap().null_count(), 0);
        assert_eq!(rb.column_by_name("src_addr").unwrap().null_count(), 1);
        let src = rb
            .column_by_name("src_addr")
            .unwrap()
            .as_fixed_size_binary();
        assert_eq!(src.value(0), [1; 16]);
        let seq = rb.column_by_name("seq").unwrap();
        let seq = seq.as_primitive::<UInt32Type>();
        assert_eq!(seq.value(0), 9);
        // The decoder's buffer became the Arrow buffer.
        assert_eq!(seq.values().as_ptr(), seq_ptr);
        let evc = rb.column_by_name("evc_name").unwrap();
        let evc = evc.as_any().downcast_ref::<StringArray>().unwrap();
        assert_eq!(evc.value(0), "one");
        assert!(evc.is_null(1));
        assert_eq!(b.reports.rows(), 0);
    }

    /// Resident bytes of this process (`/proc/self/statm`).
    fn rss_bytes() -> usize {
        let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
        let pages: usize = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
        pages * 4096
    }

    #[test]
    fn new_buffers_are_not_touched_until_rows_are_written() {
        // 256 MiB of hop buffers: zeroed by the allocator, so none of it is resident yet (a
        // pass of zeroes would fault in every page).
        let before = rss_bytes();
        let mut hops = Hops::with_capacity((256 << 20) / Hops::ROW_BYTES);
        let grown = rss_bytes().saturating_sub(before);
        assert!(
            grown < hops.bytes() / 8,
            "{grown} of {} resident",
            hops.bytes()
        );
        hops.row(1, 2).node_id(Some(3)).done();
        assert_eq!(hops.view().node_id, [3]);
        assert_eq!(hops.view().ts, [1]);
    }

    #[test]
    fn pool_keeps_emptied_batches_up_to_its_bytes() {
        // Small batches (the decoder's default) are kept many at a time: the writer may hand
        // back more than a handful while the decoder is between batches.
        let mut pool = Vec::new();
        let small = IntBatch::with_capacity(1024, 6 * 1024);
        let fit = POOL_MAX_BYTES / small.bytes();
        assert!(fit >= 16, "{fit}");
        for _ in 0..fit + 3 {
            small.clone().into_pool(&mut pool);
        }
        assert_eq!(pool.len(), fit);
        assert!(pool.iter().map(IntBatch::bytes).sum::<usize>() <= POOL_MAX_BYTES);
        // A batch past the bound is dropped, however few are pooled.
        let mut pool = Vec::new();
        let big = IntBatch::with_capacity(POOL_MAX_BYTES / Reports::ROW_BYTES + 1, 1);
        big.into_pool(&mut pool);
        assert!(pool.is_empty());
    }

    #[test]
    fn rows_written_out_of_order_and_split_by_switch_and_hour() {
        let mut b = IntBatch::with_capacity(2, 2);
        // Hops written newest first (as on the wire), committed together.
        b.hops.reserve(3);
        for (k, node) in [(2usize, 30u32), (1, 20), (0, 10)] {
            b.hops
                .row_at(k, 100, 1)
                .node_id(Some(node))
                .hop_index(Some(k as u8))
                .done();
        }
        b.hops.commit(3);
        b.hops.row(NS_PER_HOUR + 1, 1).node_id(Some(40)).done();
        b.hops.row(101, 2).node_id(None).done();
        assert_eq!(b.hops.view().node_id[..3], [10, 20, 30]);
        let parts = b.finish_split().unwrap();
        let keys: Vec<_> = parts
            .iter()
            .map(|(t, s, h, rb)| (*t, *s, *h, rb.num_rows()))
            .collect();
        assert_eq!(
            keys,
            [
                (Table::Hops, 1, 0, 3),
                (Table::Hops, 1, 1, 1),
                (Table::Hops, 2, 0, 1)
            ]
        );
        let last = &parts[2].3;
        assert_eq!(last.column_by_name("node_id").unwrap().null_count(), 1);
        // Several groups: the batch keeps its buffers for reuse.
        assert!(b.hops.capacity() >= 5);
        assert_eq!(b.rows(), 0);
    }

    /// Rows at the edges of hours (the last and first ns of an hour, before the epoch, the ends
    /// of i64) fall in the hour `ts / NS_PER_HOUR` (rounded down) says, in one group or many.
    #[test]
    fn split_puts_rows_at_hour_edges_in_their_hours() {
        let h = NS_PER_HOUR;
        let edges = [
            0,
            h - 1,
            h,
            -1,
            -h,
            -h - 1,
            5 * h - 1,
            5 * h,
            i64::MIN,
            i64::MIN + 1,
            i64::MAX,
            i64::MAX - 1,
            h - 1,
        ];
        let mut b = IntBatch::with_capacity(edges.len(), 1);
        for &t in &edges {
            b.reports.row(t, 9).done();
        }
        let mut want: Vec<(i64, Vec<i64>)> = Vec::new();
        for &t in &edges {
            let hour = t.div_euclid(h);
            match want.iter_mut().find(|(k, _)| *k == hour) {
                Some((_, ts)) => ts.push(t),
                None => want.push((hour, vec![t])),
            }
        }
        let mut scratch = IntBatch::default();
        let got: Vec<(i64, Vec<i64>)> = b
            .split(&mut scratch)
            .iter()
            .map(|p| (p.hour, p.batch.reports.view().ts[p.rows.clone()].to_vec()))
            .collect();
        assert_eq!(got, want);
        // Within one hour, up to its last ns: one group, the batch's own rows.
        let mut one = IntBatch::with_capacity(3, 1);
        for t in [-h, -1, -h + 7] {
            one.reports.row(t, 9).done();
        }
        let pieces = one.split(&mut scratch);
        assert_eq!(pieces.len(), 1);
        assert_eq!((pieces[0].hour, pieces[0].len()), (-1, 3));
        assert!(std::ptr::eq(pieces[0].batch, &raw const one));
    }

    /// Rows of 80 switches (more groups than the scan takes, more switches than cache slots)
    /// interleaved at random over three hours: each group holds exactly its rows, in order,
    /// groups in order of first appearance.
    #[test]
    fn groups_of_many_interleaved_switches_hold_their_rows() {
        let h = NS_PER_HOUR;
        let n = 5000;
        let mut b = IntBatch::with_capacity(n, 1);
        let mut keys = Vec::new();
        for i in 0..n as u64 {
            let x = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
            let sw = if x % 2 == 0 {
                (x % 40) as u32
            } else {
                ((x / 2 % 40) as u32) << 26
            };
            let t = (x % 3) as i64 * h + i as i64;
            b.reports.row(t, sw).done();
            keys.push((sw, t.div_euclid(h)));
        }
        let mut want: Vec<((u32, i64), Vec<u32>)> = Vec::new();
        for (i, k) in keys.iter().enumerate() {
            match want.iter_mut().find(|(g, _)| g == k) {
                Some((_, rows)) => rows.push(i as u32),
                None => want.push((*k, vec![i as u32])),
            }
        }
        assert!(want.len() > 100, "{} groups", want.len());
        let got = b.reports.groups();
        assert_eq!(got.len(), want.len());
        for ((gk, gi), (wk, wi)) in got.iter().zip(&want) {
            assert_eq!(gk, wk);
            assert_eq!(gi.as_deref(), Some(&wi[..]), "group {gk:?}");
        }
    }

    #[test]
    fn compact_copy_keeps_rows_and_frees_the_big_buffers_for_reuse() {
        let mut b = IntBatch::with_capacity(1000, 1000);
        b.reports.row(1, 2).seq(Some(3)).done();
        b.drops.row(1, 2).drop_reason(Some(7)).done();
        let mut small = b.take_compact();
        assert_eq!((b.rows(), b.reports.capacity()), (0, 1000));
        assert_eq!(small.reports.capacity(), 1);
        assert!(small.bytes() < b.bytes() / 100);
        let [(_, r), _, (_, d)] = small.finish().unwrap();
        assert_eq!(
            r.column_by_name("seq")
                .unwrap()
                .as_primitive::<UInt32Type>()
                .value(0),
            3
        );
        assert_eq!(
            d.column_by_name("drop_reason")
                .unwrap()
                .as_primitive::<UInt8Type>()
                .value(0),
            7
        );
    }
}
