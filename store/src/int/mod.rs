//! INT telemetry-report tables: what the INT decoder fills and the INT sink writes.
//!
//! Three tables. The decoder (`stel_ingest::int`) appends one fixed-size row struct per report,
//! hop and drop ([`ReportRow`], [`HopRow`], [`DropRow`]: plain `Copy` values, `None` = null) to
//! a `Vec` — one sequential write per row, no allocation per report. [`IntBatch::finish`] turns
//! the rows into Arrow columns; the sink calls it on its own thread, so the decode core never
//! pays for the transpose (the counter path makes the same split: row-major on the decode
//! thread, columns in the Parquet sink).
//!
//! | table | one row per | key columns |
//! |---|---|---|
//! | [`Table::Reports`] `int_reports` | individual telemetry report | `switch_id`, `hw_id`, `seq`, `flow_key`, `evc_id` |
//! | [`Table::Hops`] `int_hops` | hop of a report's INT stack (path order, `hop_index` 0 = first switch) | `switch_id`, `seq`, `flow_key`, `node_id` |
//! | [`Table::Drops`] `int_drops` | report with drop information (v0.5 drop header, D flag, drop-reason metadata) | `switch_id`, `drop_reason` |
//!
//! Unavailable values (all-ones on the wire, or metadata a report does not carry) are nulls.
//! `switch_id` is the reporting switch (Telemetry Report v1.0 Switch id, v2.0 Node ID, v0.5 drop or
//! switch-local header; see the decoder's docs for the fallback). On disk every table is
//! partitioned per reporting switch: `<root>/table=<t>/switch=<switch_id>/date=…/hour=…/part-….parquet`
//! ([`crate::paths::TableDir`]), written by [`sink::IntSink`].

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

/// Column kinds: the row's value type and how a column of them becomes Arrow.
pub trait Kind {
    type T: Copy + Default + std::fmt::Debug + PartialEq;
    fn data_type() -> DataType;
    /// The column of `n` rows: `value(i)` is row `i`'s value (the type's default where the row
    /// is null), `nulls` the validity (`None`: every row valid).
    fn column(
        n: usize,
        value: impl Fn(usize) -> Self::T,
        nulls: Option<NullBuffer>,
        evcs: &[EvcName],
    ) -> Result<ArrayRef, ArrowError>;
}

macro_rules! prim_kind {
    ($k:ident, $t:ty, $at:ty, $dt:expr) => {
        #[derive(Debug)]
        pub struct $k;
        impl Kind for $k {
            type T = $t;
            fn data_type() -> DataType {
                $dt
            }
            fn column(
                n: usize,
                value: impl Fn(usize) -> $t,
                nulls: Option<NullBuffer>,
                _: &[EvcName],
            ) -> Result<ArrayRef, ArrowError> {
                let values: Vec<$t> = (0..n).map(value).collect();
                Ok(Arc::new(PrimitiveArray::<$at>::try_new(
                    ScalarBuffer::from(values),
                    nulls,
                )?))
            }
        }
    };
}

prim_kind!(U8, u8, UInt8Type, DataType::UInt8);
prim_kind!(U16, u16, UInt16Type, DataType::UInt16);
prim_kind!(U32, u32, UInt32Type, DataType::UInt32);
prim_kind!(U64, u64, UInt64Type, DataType::UInt64);

/// Boolean column.
#[derive(Debug)]
pub struct Bool;
impl Kind for Bool {
    type T = bool;
    fn data_type() -> DataType {
        DataType::Boolean
    }
    fn column(
        n: usize,
        value: impl Fn(usize) -> bool,
        nulls: Option<NullBuffer>,
        _: &[EvcName],
    ) -> Result<ArrayRef, ArrowError> {
        Ok(Arc::new(BooleanArray::new(
            BooleanBuffer::collect_bool(n, value),
            nulls,
        )))
    }
}

/// 16-byte address column (`FixedSizeBinary(16)`).
#[derive(Debug)]
pub struct Addr;
impl Kind for Addr {
    type T = [u8; ADDR_LEN];
    fn data_type() -> DataType {
        DataType::FixedSizeBinary(ADDR_LEN as i32)
    }
    fn column(
        n: usize,
        value: impl Fn(usize) -> [u8; ADDR_LEN],
        nulls: Option<NullBuffer>,
        _: &[EvcName],
    ) -> Result<ArrayRef, ArrowError> {
        let mut flat = Vec::with_capacity(n * ADDR_LEN);
        for i in 0..n {
            flat.extend_from_slice(&value(i));
        }
        Ok(Arc::new(FixedSizeBinaryArray::try_new(
            ADDR_LEN as i32,
            Buffer::from_vec(flat),
            nulls,
        )?))
    }
}

/// Column kinds for the EVC id and name: the row holds an index into the batch's EVC names.
macro_rules! evc_kind {
    ($(#[doc = $doc:literal])* $k:ident, $field:ident) => {
        $(#[doc = $doc])*
        #[derive(Debug)]
        pub struct $k;
        impl Kind for $k {
            type T = u32;
            fn data_type() -> DataType {
                DataType::Utf8
            }
            fn column(
                n: usize,
                value: impl Fn(usize) -> u32,
                nulls: Option<NullBuffer>,
                evcs: &[EvcName],
            ) -> Result<ArrayRef, ArrowError> {
                let mut b = StringBuilder::with_capacity(n, n * 8);
                for i in 0..n {
                    let e = if nulls.as_ref().is_none_or(|v| v.is_valid(i)) {
                        evcs.get(value(i) as usize)
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
        }
    };
}

evc_kind!(
    /// EVC id column (UTF-8) from an index into the batch's EVC names.
    EvcId,
    id
);
evc_kind!(
    /// EVC name column (UTF-8) from an index into the batch's EVC names.
    EvcNameCol,
    name
);

/// Validity of bit `bit` over `rows` (`None`: every row valid).
#[inline]
fn nulls_of<R>(rows: &[R], valid: impl Fn(&R) -> u64, bit: u32) -> Option<NullBuffer> {
    let n = rows.len();
    let set = rows.iter().filter(|r| valid(r) >> bit & 1 == 1).count();
    (set != n).then(|| {
        NullBuffer::new(BooleanBuffer::collect_bool(n, |i| {
            valid(&rows[i]) >> bit & 1 == 1
        }))
    })
}

/// Nanoseconds per hour: files are split at UTC hour boundaries.
pub const NS_PER_HOUR: i64 = 3_600_000_000_000;

/// Splits `rows` by `key` (more than one key), keeping each group's order.
fn group_by<R: Copy, K: Copy + Eq + std::hash::Hash>(
    rows: &[R],
    key: impl Fn(&R) -> K,
) -> Vec<(K, Vec<R>)> {
    let mut groups: Vec<(K, Vec<R>)> = Vec::new();
    let mut index: std::collections::HashMap<K, usize> = std::collections::HashMap::new();
    let mut last: Option<(K, usize)> = None;
    for r in rows {
        let k = key(r);
        let g = match last {
            Some((lk, g)) if lk == k => g,
            _ => {
                let g = *index.entry(k).or_insert_with(|| {
                    groups.push((k, Vec::new()));
                    groups.len() - 1
                });
                last = Some((k, g));
                g
            }
        };
        groups[g].1.push(*r);
    }
    groups
}

/// Emptied batches kept for reuse: a decoder's batch is several MB, and a fresh allocation of
/// that size is fresh pages (a page fault per 4 KiB, measured at ~15 % of decode time), so
/// the writer hands finished batches back ([`IntBatch::recycle`]) and
/// [`IntBatch::with_capacity`] takes them. One short lock per batch, never per row; at most
/// [`POOL_MAX`] batches are kept (outside the sink's memory budget).
static POOL: Mutex<Vec<IntBatch>> = Mutex::new(Vec::new());
/// Most emptied batches [`POOL`] keeps.
pub const POOL_MAX: usize = 4;

/// Name of the time column of every INT table: when the collector received the report (ns since
/// the epoch, UTC). Device timestamps (32-bit wrapping ns in v0.5/v1.0) are kept in their own
/// columns.
pub const TS_COLUMN: &str = "ts";
/// Footer key: which INT table a file holds.
pub const TABLE_KEY: &str = "stel.table";
/// Name of the reporting-switch column (the partition key).
pub const SWITCH_COLUMN: &str = "switch_id";

macro_rules! table {
    ($(#[doc = $tdoc:literal])* $name:ident, $row:ident, $bits:ident { $($(#[doc = $doc:literal])* $col:ident : $kind:ident,)* }) => {
        /// Bit of each nullable column in a row's validity mask.
        #[allow(non_camel_case_types, dead_code)]
        #[derive(Debug, Clone, Copy)]
        #[repr(u32)]
        enum $bits { $($col,)* }

        #[doc = concat!("One row of [`", stringify!($name), "`]: plain values and a validity ")]
        /// mask (set a column with its method, e.g. `row.seq(Some(7))`; unset = null). Compact
        /// on purpose: the decoder writes one per report or hop.
        #[derive(Debug, Clone, Copy, Default, PartialEq)]
        pub struct $row {
            /// Receive time, ns since the epoch (non-null).
            pub ts: i64,
            /// Reporting switch (non-null; the partition key).
            pub switch_id: u32,
            valid: u64,
            $($(#[doc = $doc])* pub $col: <$kind as Kind>::T,)*
        }

        impl $row {
            /// A row with every nullable column null.
            #[inline(always)]
            pub fn new(ts: i64, switch_id: u32) -> Self {
                Self { ts, switch_id, ..Self::default() }
            }

            $(
                #[doc = concat!("Sets `", stringify!($col), "` (`None` leaves it null).")]
                #[inline(always)]
                pub fn $col(&mut self, v: Option<<$kind as Kind>::T>) -> &mut Self {
                    if let Some(v) = v {
                        self.$col = v;
                        self.valid |= 1 << ($bits::$col as u32);
                    }
                    self
                }
            )*
        }

        $(#[doc = $tdoc])*
        #[derive(Debug, Default)]
        pub struct $name {
            pub rows: Vec<$row>,
        }

        impl $name {
            pub fn with_capacity(n: usize) -> Self {
                Self { rows: Vec::with_capacity(n) }
            }

            #[inline(always)]
            pub fn push(&mut self, row: $row) {
                self.rows.push(row);
            }

            /// Appends a row with every nullable column null and returns it to fill in place
            /// (no copy of the finished row).
            #[inline(always)]
            pub fn push_new(&mut self, ts: i64, switch_id: u32) -> &mut $row {
                let i = self.rows.len();
                self.rows.push($row::new(ts, switch_id));
                &mut self.rows[i]
            }

            pub fn rows(&self) -> usize {
                self.rows.len()
            }

            /// Bytes held.
            pub fn bytes(&self) -> usize {
                self.rows.len() * std::mem::size_of::<$row>()
            }

            /// The Arrow schema (field order = column order).
            pub fn schema() -> SchemaRef {
                Arc::new(Schema::new(vec![
                    Field::new(TS_COLUMN, DataType::Timestamp(TimeUnit::Nanosecond, Some("UTC".into())), false),
                    Field::new(SWITCH_COLUMN, DataType::UInt32, false),
                    $(Field::new(stringify!($col), <$kind>::data_type(), true),)*
                ]))
            }

            /// The rows as a record batch (the transpose), leaving this table empty.
            ///
            /// # Errors
            /// Arrow rejecting a column (a bug).
            pub fn finish(&mut self, evcs: &[EvcName]) -> Result<RecordBatch, ArrowError> {
                let rows = std::mem::take(&mut self.rows);
                Self::to_batch(&rows, evcs)
            }

            /// The rows grouped by (reporting switch, UTC hour number), each group a record
            /// batch in arrival order, leaving this table empty (its capacity kept).
            ///
            /// # Errors
            /// Arrow rejecting a column (a bug).
            pub fn finish_split(
                &mut self,
                evcs: &[EvcName],
            ) -> Result<Vec<((u32, i64), RecordBatch)>, ArrowError> {
                let key = |r: &$row| (r.switch_id, r.ts.div_euclid(NS_PER_HOUR));
                let out = match self.rows.first().map(key) {
                    None => Ok(Vec::new()),
                    Some(k0) if self.rows.iter().all(|r| key(r) == k0) => {
                        Self::to_batch(&self.rows, evcs).map(|b| vec![(k0, b)])
                    }
                    Some(_) => group_by(&self.rows, key)
                        .into_iter()
                        .map(|(k, rows)| Ok((k, Self::to_batch(&rows, evcs)?)))
                        .collect(),
                };
                // The rows' memory stays for reuse ([`IntBatch::recycle`]).
                self.rows.clear();
                out
            }

            /// `rows` as a record batch: one pass per column over the rows, validity from
            /// the rows' masks (no null buffer when a column has no nulls).
            ///
            /// # Errors
            /// Arrow rejecting a column (a bug).
            pub fn to_batch(rows: &[$row], evcs: &[EvcName]) -> Result<RecordBatch, ArrowError> {
                const _: () = assert!([$($bits::$col as u32,)*].len() <= 64);
                let n = rows.len();
                let ts: Vec<i64> = rows.iter().map(|r| r.ts).collect();
                let sw: Vec<u32> = rows.iter().map(|r| r.switch_id).collect();
                let cols: Vec<ArrayRef> = vec![
                    Arc::new(TimestampNanosecondArray::new(ScalarBuffer::from(ts), None).with_timezone("UTC")),
                    Arc::new(PrimitiveArray::<UInt32Type>::new(ScalarBuffer::from(sw), None)),
                    $(<$kind>::column(
                        n,
                        |i| rows[i].$col,
                        nulls_of(rows, |r| r.valid, $bits::$col as u32),
                        evcs,
                    )?,)*
                ];
                RecordBatch::try_new(Self::schema(), cols)
            }
        }
    };
}

table! {
    /// `int_reports`: one row per individual telemetry report.
    Reports, ReportRow, ReportBit {
        /// Telemetry Report version: 0 (v0.5), 1 (v1.0), 2 (v2.0).
        report_version: U8,
        /// Sub-system of the reporting switch (6 bits; 4 with the Tofino v2.0 variant).
        hw_id: U8,
        /// Report sequence number (32 bits in v0.5/v1.0, 22 or 24 in v2.0).
        seq: U32,
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
        /// Hash of (VLAN, inner VLAN, addresses, protocol, ports): the flow, joinable with `int_hops`.
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
    Hops, HopRow, HopBit {
        /// Report sequence number (joins with `int_reports` on switch_id, seq, ts).
        seq: U32,
        flow_key: U64,
        vlan: U16,
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
    Drops, DropRow, DropBit {
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

/// One decoder batch of the three tables.
#[derive(Debug, Default)]
pub struct IntBatch {
    pub reports: Reports,
    pub hops: Hops,
    pub drops: Drops,
    /// The EVC names the rows' `evc_id`/`evc_name` indices refer to (shared, not copied).
    pub evcs: Arc<[EvcName]>,
}

impl IntBatch {
    /// Room for `reports` reports and `hops` hops without reallocating: an emptied batch from
    /// the pool when one is big enough, else a new one.
    pub fn with_capacity(reports: usize, hops: usize) -> Self {
        if let Ok(mut pool) = POOL.lock() {
            if let Some(i) = pool.iter().position(|b| {
                b.reports.rows.capacity() >= reports && b.hops.rows.capacity() >= hops
            }) {
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

    /// Gives the batch's memory back for reuse by [`IntBatch::with_capacity`] (rows dropped;
    /// freed instead when the pool is full).
    pub fn recycle(mut self) {
        self.reports.rows.clear();
        self.hops.rows.clear();
        self.drops.rows.clear();
        self.evcs = Arc::new([]);
        if let Ok(mut pool) = POOL.lock() {
            if pool.len() < POOL_MAX {
                pool.push(self);
            }
        }
    }

    /// Rows of all three tables.
    pub fn rows(&self) -> usize {
        self.reports.rows() + self.hops.rows() + self.drops.rows()
    }

    pub fn is_empty(&self) -> bool {
        self.rows() == 0
    }

    /// Bytes held (the sink's memory budget).
    pub fn bytes(&self) -> usize {
        self.reports.bytes() + self.hops.bytes() + self.drops.bytes()
    }

    /// The rows as record batches per (table, reporting switch, UTC hour number), leaving
    /// `self` empty: what the writer needs, without filtering columns after the transpose.
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

    /// The three tables as record batches (empty ones included), leaving `self` empty.
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
    use arrow_array::{Array, StringArray};

    use super::*;

    #[test]
    fn rows_become_arrow_with_nulls() {
        let mut b = IntBatch::with_capacity(4, 4);
        b.evcs = Arc::new([EvcName {
            id: "evc-1".into(),
            name: "one".into(),
        }]);
        let mut r = ReportRow::new(5, 7);
        r.report_version(Some(1))
            .seq(Some(9))
            .src_addr(Some([1; 16]))
            .evc_id(Some(0))
            .evc_name(Some(0))
            .vlan(None);
        b.reports.push(r);
        let mut r = ReportRow::new(6, 7);
        r.vlan(Some(42));
        b.reports.push(r);
        let [(t, rb), (_, hops), _] = b.finish().unwrap();
        assert_eq!(t, Table::Reports);
        assert_eq!(rb.num_rows(), 2);
        assert_eq!(hops.num_rows(), 0);
        assert_eq!(rb.schema(), Reports::schema());
        assert_eq!(rb.column_by_name("vlan").unwrap().null_count(), 1);
        assert_eq!(rb.column_by_name("seq").unwrap().null_count(), 1);
        assert_eq!(rb.column_by_name("hop_ml").unwrap().null_count(), 2);
        assert_eq!(rb.column_by_name("src_addr").unwrap().null_count(), 1);
        let evc = rb.column_by_name("evc_name").unwrap();
        let evc = evc.as_any().downcast_ref::<StringArray>().unwrap();
        assert_eq!(evc.value(0), "one");
        assert!(evc.is_null(1));
        assert_eq!(b.reports.rows(), 0);
    }
}
