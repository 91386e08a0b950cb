//! INT telemetry-report tables: what the INT decoder fills and the INT sink writes.
//!
//! Three tables, each a set of typed, nullable columns that the decoder (`stel_ingest::int`)
//! appends to without allocating per report (each column is a `Vec` plus a lazily materialised
//! validity bitmap; [`IntBatch::finish`] moves the vectors into Arrow buffers without copying):
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

use std::sync::Arc;

use arrow_array::{
    types::{UInt16Type, UInt32Type, UInt64Type, UInt8Type},
    ArrayRef, BooleanArray, FixedSizeBinaryArray, PrimitiveArray, RecordBatch, StringArray,
    TimestampNanosecondArray,
};
use arrow_buffer::{BooleanBuffer, Buffer, NullBufferBuilder, ScalarBuffer};
use arrow_schema::{ArrowError, DataType, Field, Schema, SchemaRef, TimeUnit};

pub mod config;
pub mod sink;
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

/// A nullable column being built: values plus a validity bitmap that stays unmaterialised until
/// the first null.
#[derive(Debug)]
pub struct Col<T> {
    pub values: Vec<T>,
    nulls: NullBufferBuilder,
}

impl<T: Copy + Default> Col<T> {
    pub fn with_capacity(n: usize) -> Self {
        Self {
            values: Vec::with_capacity(n),
            nulls: NullBufferBuilder::new(n),
        }
    }

    #[inline]
    pub fn push(&mut self, v: T) {
        self.values.push(v);
        self.nulls.append_non_null();
    }

    #[inline]
    pub fn push_null(&mut self) {
        self.values.push(T::default());
        self.nulls.append_null();
    }

    #[inline]
    pub fn push_opt(&mut self, v: Option<T>) {
        match v {
            Some(v) => self.push(v),
            None => self.push_null(),
        }
    }

    pub fn len(&self) -> usize {
        self.values.len()
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    fn take(&mut self) -> (Vec<T>, Option<arrow_buffer::NullBuffer>) {
        (std::mem::take(&mut self.values), self.nulls.finish())
    }
}

/// A nullable UTF-8 column (EVC ids and names).
#[derive(Debug)]
pub struct StrCol {
    offsets: Vec<i32>,
    data: Vec<u8>,
    nulls: NullBufferBuilder,
}

impl StrCol {
    pub fn with_capacity(n: usize) -> Self {
        let mut offsets = Vec::with_capacity(n + 1);
        offsets.push(0);
        Self {
            offsets,
            data: Vec::new(),
            nulls: NullBufferBuilder::new(n),
        }
    }

    #[inline]
    pub fn push(&mut self, s: &str) {
        self.data.extend_from_slice(s.as_bytes());
        self.offsets.push(self.data.len() as i32);
        self.nulls.append_non_null();
    }

    #[inline]
    pub fn push_null(&mut self) {
        self.offsets.push(self.data.len() as i32);
        self.nulls.append_null();
    }

    #[inline]
    pub fn push_opt(&mut self, v: Option<&str>) {
        match v {
            Some(s) => self.push(s),
            None => self.push_null(),
        }
    }

    pub fn len(&self) -> usize {
        self.offsets.len() - 1
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn bytes(&self) -> usize {
        self.data.len() + self.offsets.len() * 4
    }

    fn finish(&mut self) -> Result<ArrayRef, ArrowError> {
        let offsets = std::mem::replace(&mut self.offsets, vec![0]);
        let data = std::mem::take(&mut self.data);
        let nulls = self.nulls.finish();
        let offsets = arrow_buffer::OffsetBuffer::new(ScalarBuffer::from(offsets));
        Ok(Arc::new(StringArray::try_new(
            offsets,
            Buffer::from_vec(data),
            nulls,
        )?))
    }
}

/// Column kinds: their Rust value type and Arrow type.
pub trait Kind {
    type Builder;
    fn data_type() -> DataType;
    fn builder(n: usize) -> Self::Builder;
    fn len(b: &Self::Builder) -> usize;
    fn bytes(b: &Self::Builder) -> usize;
    fn finish(b: &mut Self::Builder) -> Result<ArrayRef, ArrowError>;
}

macro_rules! prim_kind {
    ($k:ident, $t:ty, $at:ty, $dt:expr) => {
        #[derive(Debug)]
        pub struct $k;
        impl Kind for $k {
            type Builder = Col<$t>;
            fn data_type() -> DataType {
                $dt
            }
            fn builder(n: usize) -> Col<$t> {
                Col::with_capacity(n)
            }
            fn len(b: &Col<$t>) -> usize {
                b.len()
            }
            fn bytes(b: &Col<$t>) -> usize {
                b.values.len() * std::mem::size_of::<$t>()
            }
            fn finish(b: &mut Col<$t>) -> Result<ArrayRef, ArrowError> {
                let (v, n) = b.take();
                Ok(Arc::new(PrimitiveArray::<$at>::try_new(
                    ScalarBuffer::from(v),
                    n,
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
    type Builder = Col<bool>;
    fn data_type() -> DataType {
        DataType::Boolean
    }
    fn builder(n: usize) -> Col<bool> {
        Col::with_capacity(n)
    }
    fn len(b: &Col<bool>) -> usize {
        b.len()
    }
    fn bytes(b: &Col<bool>) -> usize {
        b.values.len()
    }
    fn finish(b: &mut Col<bool>) -> Result<ArrayRef, ArrowError> {
        let (v, n) = b.take();
        Ok(Arc::new(BooleanArray::new(
            BooleanBuffer::from_iter(v.iter().copied()),
            n,
        )))
    }
}

/// 16-byte address column (`FixedSizeBinary(16)`).
#[derive(Debug)]
pub struct Addr;
impl Kind for Addr {
    type Builder = Col<[u8; ADDR_LEN]>;
    fn data_type() -> DataType {
        DataType::FixedSizeBinary(ADDR_LEN as i32)
    }
    fn builder(n: usize) -> Col<[u8; ADDR_LEN]> {
        Col::with_capacity(n)
    }
    fn len(b: &Col<[u8; ADDR_LEN]>) -> usize {
        b.len()
    }
    fn bytes(b: &Col<[u8; ADDR_LEN]>) -> usize {
        b.values.len() * ADDR_LEN
    }
    fn finish(b: &mut Col<[u8; ADDR_LEN]>) -> Result<ArrayRef, ArrowError> {
        let (v, n) = b.take();
        let flat: Vec<u8> = v.into_iter().flatten().collect();
        Ok(Arc::new(FixedSizeBinaryArray::try_new(
            ADDR_LEN as i32,
            Buffer::from_vec(flat),
            n,
        )?))
    }
}

/// UTF-8 column.
#[derive(Debug)]
pub struct Str;
impl Kind for Str {
    type Builder = StrCol;
    fn data_type() -> DataType {
        DataType::Utf8
    }
    fn builder(n: usize) -> StrCol {
        StrCol::with_capacity(n)
    }
    fn len(b: &StrCol) -> usize {
        b.len()
    }
    fn bytes(b: &StrCol) -> usize {
        b.bytes()
    }
    fn finish(b: &mut StrCol) -> Result<ArrayRef, ArrowError> {
        b.finish()
    }
}

/// Name of the time column of every INT table: when the collector received the report (ns since
/// the epoch, UTC). Device timestamps (32-bit wrapping ns in v0.5/v1.0) are kept in their own
/// columns.
pub const TS_COLUMN: &str = "ts";
/// Footer key: which INT table a file holds.
pub const TABLE_KEY: &str = "stel.table";
/// Name of the reporting-switch column (the partition key).
pub const SWITCH_COLUMN: &str = "switch_id";

macro_rules! table {
    ($(#[doc = $tdoc:literal])* $name:ident { $($(#[doc = $doc:literal])* $col:ident : $kind:ident,)* }) => {
        $(#[doc = $tdoc])*
        #[derive(Debug)]
        pub struct $name {
            /// Receive time, ns since the epoch (non-null).
            pub ts: Vec<i64>,
            /// Reporting switch (non-null; the partition key).
            pub switch_id: Vec<u32>,
            $($(#[doc = $doc])* pub $col: <$kind as Kind>::Builder,)*
        }

        impl $name {
            pub fn with_capacity(n: usize) -> Self {
                Self {
                    ts: Vec::with_capacity(n),
                    switch_id: Vec::with_capacity(n),
                    $($col: <$kind>::builder(n),)*
                }
            }

            /// Rows appended (the length of `ts`).
            pub fn rows(&self) -> usize {
                self.ts.len()
            }

            /// Approximate bytes held.
            pub fn bytes(&self) -> usize {
                self.ts.len() * 12 $(+ <$kind>::bytes(&self.$col))*
            }

            /// The Arrow schema (field order = column order).
            pub fn schema() -> SchemaRef {
                Arc::new(Schema::new(vec![
                    Field::new(TS_COLUMN, DataType::Timestamp(TimeUnit::Nanosecond, Some("UTC".into())), false),
                    Field::new(SWITCH_COLUMN, DataType::UInt32, false),
                    $(Field::new(stringify!($col), <$kind>::data_type(), true),)*
                ]))
            }

            /// Whether every column has as many values as `ts` (the decoder's invariant).
            pub fn is_consistent(&self) -> bool {
                let n = self.ts.len();
                self.switch_id.len() == n $(&& <$kind>::len(&self.$col) == n)*
            }

            /// Moves the columns into a record batch (no copy) and leaves this builder empty.
            ///
            /// # Errors
            /// When a column's length differs from `ts` (a decoder bug; the batch is dropped).
            pub fn finish(&mut self) -> Result<RecordBatch, ArrowError> {
                if !self.is_consistent() {
                    let r = self.ts.len();
                    *self = Self::with_capacity(0);
                    return Err(ArrowError::InvalidArgumentError(format!(
                        "{}: columns of unequal length ({} rows)", stringify!($name), r
                    )));
                }
                let ts = std::mem::take(&mut self.ts);
                let sw = std::mem::take(&mut self.switch_id);
                let cols: Vec<ArrayRef> = vec![
                    Arc::new(TimestampNanosecondArray::new(ScalarBuffer::from(ts), None).with_timezone("UTC")),
                    Arc::new(PrimitiveArray::<UInt32Type>::new(ScalarBuffer::from(sw), None)),
                    $(<$kind>::finish(&mut self.$col)?,)*
                ];
                RecordBatch::try_new(Self::schema(), cols)
            }
        }
    };
}

table! {
    /// `int_reports`: one row per individual telemetry report.
    Reports {
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
        evc_id: Str,
        evc_name: Str,
    }
}

table! {
    /// `int_hops`: one row per hop of a report's INT stack, in path order.
    Hops {
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
    Drops {
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
        evc_id: Str,
    }
}

/// One decoder batch of the three tables.
#[derive(Debug)]
pub struct IntBatch {
    pub reports: Reports,
    pub hops: Hops,
    pub drops: Drops,
}

impl IntBatch {
    /// Room for `reports` reports and `hops` hops without reallocating.
    pub fn with_capacity(reports: usize, hops: usize) -> Self {
        Self {
            reports: Reports::with_capacity(reports),
            hops: Hops::with_capacity(hops),
            drops: Drops::with_capacity(reports / 16 + 1),
        }
    }

    /// Rows of all three tables.
    pub fn rows(&self) -> usize {
        self.reports.rows() + self.hops.rows() + self.drops.rows()
    }

    pub fn is_empty(&self) -> bool {
        self.rows() == 0
    }

    /// Approximate bytes held (the sink's memory budget).
    pub fn bytes(&self) -> usize {
        self.reports.bytes() + self.hops.bytes() + self.drops.bytes()
    }

    /// The three tables as record batches (empty ones included), leaving `self` empty.
    ///
    /// # Errors
    /// When a table's columns disagree in length (a decoder bug).
    pub fn finish(&mut self) -> Result<[(Table, RecordBatch); 3], ArrowError> {
        Ok([
            (Table::Reports, self.reports.finish()?),
            (Table::Hops, self.hops.finish()?),
            (Table::Drops, self.drops.finish()?),
        ])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_become_arrow_with_nulls() {
        let mut b = IntBatch::with_capacity(4, 4);
        let r = &mut b.reports;
        macro_rules! all_null {
            ($($c:ident),*) => { $( r.$c.push_null(); )* };
        }
        r.ts.push(5);
        r.switch_id.push(7);
        r.report_version.push(1);
        r.hw_id.push(3);
        r.seq.push(9);
        r.seq_gap.push(0);
        r.src_addr.push([1; 16]);
        r.evc_id.push("evc-1");
        all_null!(
            dropped, congested, tracked, intermediate, rep_type, in_type, report_ingress_ts,
            rep_ingress_port, rep_egress_port, rep_hop_latency, rep_queue_id, rep_queue_occupancy,
            rep_egress_ts, rep_drop_reason, rep_tx_util, rep_buffer_id, rep_buffer_occupancy, vlan,
            inner_vlan, ip_version, dst_addr, ip_proto, src_port, dst_port, dscp, flow_key,
            int_version, hop_count, hop_ml, instructions, remaining_hop_count, path_id,
            path_changed, latency_sum_ns, latency_e2e_ns, latency_over, evc_name
        );
        assert!(b.reports.is_consistent());
        let [(t, rb), (_, hops), _] = b.finish().unwrap();
        assert_eq!(t, Table::Reports);
        assert_eq!(rb.num_rows(), 1);
        assert_eq!(hops.num_rows(), 0);
        assert_eq!(rb.schema(), Reports::schema());
        assert_eq!(rb.column_by_name("vlan").unwrap().null_count(), 1);
        assert_eq!(rb.column_by_name("seq").unwrap().null_count(), 0);
        // Builders are reusable after finish.
        assert_eq!(b.reports.rows(), 0);
        assert!(b.reports.is_consistent());
    }

    #[test]
    fn unequal_columns_are_an_error_not_a_panic() {
        let mut h = Hops::with_capacity(1);
        h.ts.push(1);
        h.switch_id.push(1);
        assert!(h.finish().is_err());
        assert_eq!(h.rows(), 0);
    }
}
