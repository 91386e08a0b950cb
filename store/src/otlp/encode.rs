//! OTLP `ExportMetricsServiceRequest` protobuf, written straight from row-major counter batches.
//!
//! Nothing here builds message structs. Everything that does not change from one snapshot to
//! the next is encoded **once per session schema** ([`Plan`]): each metric's header (name,
//! description, unit) and, per (object, stat) column, the data point's tag, length and
//! attributes. Per point only the timestamps and the value are written — three little-endian
//! 8-byte words behind a `memcpy` of the column's prefix — into a request buffer that is
//! reused. Lengths of the nested messages are known before their content (every point's size is
//! fixed per column), so a metric is written front to back in one pass; the two outer envelopes
//! (`ResourceMetrics`, `ScopeMetrics`) go into headroom reserved at the front of the buffer when
//! the request is finished.
//!
//! ```text
//! ExportMetricsServiceRequest
//!  └ resource_metrics (1)          ┐ written last, into the headroom
//!     ├ resource (1)               │ service.name, service.version, host.name
//!     └ scope_metrics (2)          │
//!        ├ scope (1)               ┘ stel <version>
//!        └ metrics (2) × groups    one per (stat, row chunk): name, description, unit,
//!           └ sum (7) | gauge (5)  cumulative monotonic sum for counters, gauge for levels
//!              └ data_points (1)   rows × objects: attributes (7) object_name, sai_stat,
//!                                  profile; start (2), time (3), as_int (6)
//! ```

use std::sync::Arc;

use crate::{
    batch::CounterBatch,
    metrics::{Kind, Snapshot},
    sai::StatKey,
    schema::SessionSchema,
};

use super::config::MetricNames;

/// Protobuf wire-format primitives.
pub(crate) mod wire {
    pub(crate) const VARINT: u8 = 0;
    pub(crate) const I64: u8 = 1;
    pub(crate) const LEN: u8 = 2;

    /// Bytes of `v` as a varint.
    #[inline]
    pub(crate) const fn varint_len(v: u64) -> usize {
        (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
    }

    #[inline]
    pub(crate) fn put_varint(out: &mut Vec<u8>, mut v: u64) {
        while v >= 0x80 {
            out.push(v as u8 | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }

    /// Writes `v` as a varint at the start of `dst`; returns the bytes written.
    pub(crate) fn write_varint(dst: &mut [u8], mut v: u64) -> usize {
        let mut i = 0;
        while v >= 0x80 {
            dst[i] = v as u8 | 0x80;
            v >>= 7;
            i += 1;
        }
        dst[i] = v as u8;
        i + 1
    }

    pub(crate) const fn tag(field: u32, wire_type: u8) -> u8 {
        // Every field number used here is < 16: the tag is one byte.
        ((field << 3) | wire_type as u32) as u8
    }

    pub(crate) fn put_len(out: &mut Vec<u8>, field: u32, bytes: &[u8]) {
        out.push(tag(field, LEN));
        put_varint(out, bytes.len() as u64);
        out.extend_from_slice(bytes);
    }

    pub(crate) fn put_fixed64(out: &mut Vec<u8>, field: u32, v: u64) {
        out.push(tag(field, I64));
        out.extend_from_slice(&v.to_le_bytes());
    }

    pub(crate) fn put_uint(out: &mut Vec<u8>, field: u32, v: u64) {
        out.push(tag(field, VARINT));
        put_varint(out, v);
    }

    /// A `KeyValue` with a string value, as field `field` of the enclosing message.
    pub(crate) fn put_attr(out: &mut Vec<u8>, field: u32, key: &str, value: &str) {
        let mut any = Vec::with_capacity(value.len() + 2);
        put_len(&mut any, 1, value.as_bytes()); // AnyValue.string_value
        let mut kv = Vec::with_capacity(key.len() + any.len() + 4);
        put_len(&mut kv, 1, key.as_bytes()); // KeyValue.key
        put_len(&mut kv, 2, &any); // KeyValue.value
        put_len(out, field, &kv);
    }

    /// A protobuf reader just big enough for responses and tests.
    #[derive(Debug)]
    pub(crate) struct Reader<'a> {
        pub(crate) b: &'a [u8],
    }

    /// A field's value.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub(crate) enum Value<'a> {
        Varint(u64),
        I64(u64),
        Len(&'a [u8]),
        I32(u32),
    }

    impl<'a> Reader<'a> {
        pub(crate) fn varint(&mut self) -> Option<u64> {
            let mut v = 0u64;
            for i in 0..10 {
                let (&b, rest) = self.b.split_first()?;
                self.b = rest;
                v |= u64::from(b & 0x7f) << (7 * i);
                if b < 0x80 {
                    return Some(v);
                }
            }
            None
        }

        /// The next field, or `None` at the end; `Some(Err(()))` when malformed.
        pub(crate) fn field(&mut self) -> Option<Result<(u32, Value<'a>), ()>> {
            if self.b.is_empty() {
                return None;
            }
            Some(self.field_inner().ok_or(()))
        }

        fn field_inner(&mut self) -> Option<(u32, Value<'a>)> {
            let key = self.varint()?;
            let field = u32::try_from(key >> 3).ok()?;
            let v = match key & 7 {
                0 => Value::Varint(self.varint()?),
                1 => {
                    let (w, rest) = self.b.split_first_chunk::<8>()?;
                    self.b = rest;
                    Value::I64(u64::from_le_bytes(*w))
                }
                2 => {
                    let n = usize::try_from(self.varint()?).ok()?;
                    if n > self.b.len() {
                        return None;
                    }
                    let (v, rest) = self.b.split_at(n);
                    self.b = rest;
                    Value::Len(v)
                }
                5 => {
                    let (w, rest) = self.b.split_first_chunk::<4>()?;
                    self.b = rest;
                    Value::I32(u32::from_le_bytes(*w))
                }
                _ => return None,
            };
            Some((field, v))
        }
    }
}

use wire::{put_attr, put_fixed64, put_len, put_uint, put_varint, tag, varint_len, LEN};

/// `Metric.gauge` / `Metric.sum` tags.
const GAUGE_TAG: u8 = tag(5, LEN);
const SUM_TAG: u8 = tag(7, LEN);
/// `ScopeMetrics.metrics` tag.
const METRIC_TAG: u8 = tag(2, LEN);
/// `Sum.aggregation_temporality = CUMULATIVE (2)`, `Sum.is_monotonic = true`.
const SUM_TRAILER: [u8; 4] = [tag(2, wire::VARINT), 2, tag(3, wire::VARINT), 1];
/// Bytes after a data point's attributes: start (sums only), time, as_int — 9 bytes each.
const SUM_FIXED: usize = 27;
const GAUGE_FIXED: usize = 18;

/// The `resource` and `scope` fields every request carries (encoded once).
#[derive(Debug, Clone)]
pub(crate) struct Envelope {
    /// `ResourceMetrics.resource` field (tag, length, Resource).
    resource: Vec<u8>,
    /// `ScopeMetrics.scope` field (tag, length, InstrumentationScope).
    scope: Vec<u8>,
}

impl Envelope {
    pub(crate) fn new(host_name: &str) -> Self {
        let mut res = Vec::new();
        put_attr(&mut res, 1, "service.name", "stel");
        put_attr(&mut res, 1, "service.version", env!("CARGO_PKG_VERSION"));
        put_attr(&mut res, 1, "host.name", host_name);
        let mut resource = Vec::new();
        put_len(&mut resource, 1, &res);
        let mut sc = Vec::new();
        put_len(&mut sc, 1, b"stel");
        put_len(&mut sc, 2, env!("CARGO_PKG_VERSION").as_bytes());
        let mut scope = Vec::new();
        put_len(&mut scope, 1, &sc);
        Self { resource, scope }
    }

    /// Room the front of a request buffer must leave for the envelope (and a gRPC prefix).
    pub(crate) fn headroom(&self) -> usize {
        // gRPC's prefix, two tags, two varint lengths (≤ 10 bytes each), the two fields.
        5 + 2 + 20 + self.resource.len() + self.scope.len()
    }
}

/// One export request being filled. `buf[..headroom]` is reserved for the envelope.
#[derive(Debug)]
pub(crate) struct RequestBuf {
    buf: Vec<u8>,
    headroom: usize,
    /// Data points from counter batches.
    pub(crate) points: usize,
    /// Data points of the daemon's own metrics.
    pub(crate) own_points: usize,
}

impl RequestBuf {
    /// Starts a request in `buf` (cleared; its capacity is reused).
    pub(crate) fn new(mut buf: Vec<u8>, env: &Envelope) -> Self {
        let headroom = env.headroom();
        buf.clear();
        buf.resize(headroom, 0);
        Self {
            buf,
            headroom,
            points: 0,
            own_points: 0,
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.buf.len() == self.headroom
    }

    /// Writes the envelope in front of the metrics, and with `grpc` gRPC's length prefix in
    /// front of that. Returns the buffer and where the request starts in it (`buf[start..]` is
    /// the `ExportMetricsServiceRequest`, framed for gRPC if asked).
    pub(crate) fn finish_framed(self, env: &Envelope, grpc: bool) -> (Vec<u8>, usize) {
        let (mut buf, start) = self.finish(env);
        if !grpc {
            return (buf, start);
        }
        let len = (buf.len() - start) as u32;
        buf[start - 5] = 0;
        buf[start - 4..start].copy_from_slice(&len.to_be_bytes());
        (buf, start - 5)
    }

    /// Writes the envelope in front of the metrics. Returns the buffer and where the request
    /// starts in it (`buf[start..]` is the `ExportMetricsServiceRequest`).
    pub(crate) fn finish(self, env: &Envelope) -> (Vec<u8>, usize) {
        let Self {
            mut buf, headroom, ..
        } = self;
        let metrics = buf.len() - headroom;
        let sm = env.scope.len() + metrics;
        let rm = env.resource.len() + 1 + varint_len(sm as u64) + sm;
        let pre = 1
            + varint_len(rm as u64)
            + env.resource.len()
            + 1
            + varint_len(sm as u64)
            + env.scope.len();
        let start = headroom - pre;
        let mut at = start;
        buf[at] = tag(1, LEN);
        at += 1;
        at += wire::write_varint(&mut buf[at..], rm as u64);
        buf[at..at + env.resource.len()].copy_from_slice(&env.resource);
        at += env.resource.len();
        buf[at] = tag(2, LEN);
        at += 1;
        at += wire::write_varint(&mut buf[at..], sm as u64);
        buf[at..at + env.scope.len()].copy_from_slice(&env.scope);
        at += env.scope.len();
        debug_assert_eq!(at, headroom);
        (buf, start)
    }
}

/// Metric name, description and unit of a stat.
fn metric_identity(key: StatKey, names: MetricNames) -> (String, String, &'static str) {
    let short = key.short_name();
    let name = match names {
        MetricNames::Sai => format!(
            "sai.{}.{}",
            key.object_type_name().to_ascii_lowercase(),
            short.to_ascii_lowercase()
        ),
        MetricNames::Countersyncd => {
            format!("sai_counter_type_{}_stat_{}", key.object_type, key.stat_id)
        }
    };
    (name, key.full_name(), unit_of(&short))
}

/// The UCUM unit OTLP expects, from the stat's name.
fn unit_of(short: &str) -> &'static str {
    let has = |p: &str| short.contains(p);
    if has("PKTS") || has("PACKETS") || has("FRAMES") {
        "{packet}"
    } else if has("OCTETS") || has("BYTES") {
        "By"
    } else if has("CELLS") {
        "{cell}"
    } else if short.ends_with("_NS") {
        "ns"
    } else if short.ends_with("_US") {
        "us"
    } else {
        "1"
    }
}

/// One metric of a session: every column of one stat.
#[derive(Debug)]
struct Group {
    /// `Metric.name`, `.description`, `.unit` fields.
    header: Vec<u8>,
    sum: bool,
    /// Columns (indices into a row), in schema order.
    cols: Vec<u32>,
    /// Per column: `data_points` tag, the point's length, its attributes. Concatenated.
    prefix: Vec<u8>,
    /// `prefix[ends[k-1]..ends[k]]` is column `cols[k]`'s.
    ends: Vec<u32>,
    /// Bytes of one row's points (prefixes + fixed parts).
    row_bytes: usize,
}

impl Group {
    fn fixed(&self) -> usize {
        if self.sum {
            SUM_FIXED
        } else {
            GAUGE_FIXED
        }
    }

    fn prefix_of(&self, k: usize) -> &[u8] {
        let s = if k == 0 { 0 } else { self.ends[k - 1] as usize };
        &self.prefix[s..self.ends[k] as usize]
    }
}

/// Per column of a cumulative sum: when the series started and its last value (resets).
#[derive(Debug, Clone, Copy, Default)]
struct SeriesState {
    start: u64,
    last_ts: u64,
    last: u64,
}

/// Everything about one session schema that does not change per snapshot, plus the state its
/// series carry from batch to batch.
#[derive(Debug)]
pub(crate) struct Plan {
    pub(crate) schema: Arc<SessionSchema>,
    groups: Vec<Group>,
    state: Vec<SeriesState>,
    /// Next snapshot time (ns) that is exported with `resolution_ms` > 0.
    next_due: i64,
}

impl Plan {
    /// Encodes the schema's constant parts. `prev`, the plan of an earlier generation of the
    /// same session, hands over each series' start time, so a template change is not a reset.
    pub(crate) fn new(schema: Arc<SessionSchema>, names: MetricNames, prev: Option<&Plan>) -> Self {
        let mut order: Vec<(StatKey, Vec<u32>)> = Vec::new();
        for (i, c) in schema.columns.iter().enumerate() {
            match order.iter_mut().find(|(k, _)| *k == c.key) {
                Some((_, cols)) => cols.push(i as u32),
                None => order.push((c.key, vec![i as u32])),
            }
        }
        let groups = order
            .into_iter()
            .map(|(key, cols)| {
                let (name, description, unit) = metric_identity(key, names);
                let mut header = Vec::new();
                put_len(&mut header, 1, name.as_bytes());
                put_len(&mut header, 2, description.as_bytes());
                put_len(&mut header, 3, unit.as_bytes());
                let sum = !key.is_level();
                let fixed = if sum { SUM_FIXED } else { GAUGE_FIXED };
                let mut prefix = Vec::new();
                let mut ends = Vec::with_capacity(cols.len());
                let mut row_bytes = 0;
                for &c in &cols {
                    let mut attrs = Vec::new();
                    put_attr(
                        &mut attrs,
                        7,
                        "object_name",
                        &schema.columns[c as usize].object,
                    );
                    put_attr(&mut attrs, 7, "sai_stat", &description);
                    put_attr(&mut attrs, 7, "profile", &schema.profile);
                    let dp = attrs.len() + fixed;
                    let before = prefix.len();
                    prefix.push(tag(1, LEN)); // Gauge/Sum.data_points
                    put_varint(&mut prefix, dp as u64);
                    prefix.extend_from_slice(&attrs);
                    ends.push(prefix.len() as u32);
                    row_bytes += prefix.len() - before + fixed;
                }
                Group {
                    header,
                    sum,
                    cols,
                    prefix,
                    ends,
                    row_bytes,
                }
            })
            .collect();
        let mut state = vec![SeriesState::default(); schema.width()];
        if let Some(p) = prev {
            for (i, c) in schema.columns.iter().enumerate() {
                if let Some(j) = p
                    .schema
                    .columns
                    .iter()
                    .position(|o| o.object == c.object && o.key == c.key)
                {
                    state[i] = p.state[j];
                }
            }
        }
        Self {
            schema,
            groups,
            state,
            next_due: i64::MIN,
        }
    }

    /// Whether this plan is for the same session as `s` (any generation).
    pub(crate) fn same_session(&self, s: &SessionSchema) -> bool {
        self.schema.profile == s.profile
            && self.schema.group == s.group
            && self.schema.domain == s.domain
    }

    /// The rows of `batch` to export with resolution `res_ns` (0 = all), into `rows`.
    pub(crate) fn select_rows(&mut self, batch: &CounterBatch, res_ns: i64, rows: &mut Vec<u32>) {
        rows.clear();
        if res_ns <= 0 {
            rows.extend(0..batch.rows() as u32);
            return;
        }
        for (i, &ts) in batch.ts.iter().enumerate() {
            if ts >= self.next_due {
                rows.push(i as u32);
                self.next_due = (ts.div_euclid(res_ns) + 1).saturating_mul(res_ns);
            }
        }
    }

    /// Appends every column of `rows` of `batch` to `out` (one metric per stat); returns the
    /// data points written. Values of a split snapshot's missing part are left out.
    pub(crate) fn write_rows(
        &mut self,
        batch: &CounterBatch,
        rows: &[u32],
        out: &mut RequestBuf,
    ) -> usize {
        debug_assert!(Arc::ptr_eq(&batch.schema, &self.schema));
        if rows.is_empty() {
            return 0;
        }
        let complete = batch.part_masks.is_empty();
        let width = self.schema.width();
        let mut points = 0;
        let buf = &mut out.buf;
        for g in &self.groups {
            let fixed = g.fixed();
            let (data_len, n) = if complete {
                (rows.len() * g.row_bytes, rows.len() * g.cols.len())
            } else {
                let mut len = 0;
                let mut n = 0;
                for &r in rows {
                    for (k, &c) in g.cols.iter().enumerate() {
                        if batch.is_valid(r as usize, c as usize) {
                            len += g.prefix_of(k).len() + fixed;
                            n += 1;
                        }
                    }
                }
                (len, n)
            };
            if n == 0 {
                continue;
            }
            let inner = data_len + if g.sum { SUM_TRAILER.len() } else { 0 };
            let metric = g.header.len() + 1 + varint_len(inner as u64) + inner;
            buf.reserve(1 + varint_len(metric as u64) + metric);
            let before = buf.len();
            buf.push(METRIC_TAG);
            put_varint(buf, metric as u64);
            buf.extend_from_slice(&g.header);
            buf.push(if g.sum { SUM_TAG } else { GAUGE_TAG });
            put_varint(buf, inner as u64);
            for &r in rows {
                let r = r as usize;
                let ts = batch.ts[r] as u64;
                let row = &batch.values[r * width..(r + 1) * width];
                for (k, &c) in g.cols.iter().enumerate() {
                    let c = c as usize;
                    if !complete && !batch.is_valid(r, c) {
                        continue;
                    }
                    let v = row[c];
                    buf.extend_from_slice(g.prefix_of(k));
                    if g.sum {
                        let st = &mut self.state[c];
                        if st.start == 0 {
                            st.start = ts;
                        } else if v < st.last {
                            // A reset (cleared counter, or a wrap): a new series starts after
                            // the previous observation.
                            st.start = st.last_ts;
                        }
                        st.last = v;
                        st.last_ts = ts;
                        let mut f = [0u8; SUM_FIXED];
                        f[0] = tag(2, wire::I64);
                        f[1..9].copy_from_slice(&st.start.to_le_bytes());
                        f[9] = tag(3, wire::I64);
                        f[10..18].copy_from_slice(&ts.to_le_bytes());
                        f[18] = tag(6, wire::I64);
                        f[19..27].copy_from_slice(&v.to_le_bytes());
                        buf.extend_from_slice(&f);
                    } else {
                        let mut f = [0u8; GAUGE_FIXED];
                        f[0] = tag(3, wire::I64);
                        f[1..9].copy_from_slice(&ts.to_le_bytes());
                        f[9] = tag(6, wire::I64);
                        f[10..18].copy_from_slice(&v.to_le_bytes());
                        buf.extend_from_slice(&f);
                    }
                }
            }
            if g.sum {
                buf.extend_from_slice(&SUM_TRAILER);
            }
            debug_assert_eq!(buf.len() - before, 1 + varint_len(metric as u64) + metric);
            points += n;
        }
        out.points += points;
        points
    }
}

/// The daemon's own metrics (a registry snapshot) as OTLP: counters as cumulative monotonic
/// sums since `start_ns`, gauges as gauges, labels as attributes, all at `now_ns`. Returns the
/// data points written.
pub(crate) fn write_snapshot(
    snap: &Snapshot,
    start_ns: u64,
    now_ns: u64,
    out: &mut RequestBuf,
) -> usize {
    let mut points = 0;
    let mut i = 0;
    let s = &snap.samples;
    while i < s.len() {
        let m = s[i].metric;
        let j = i + s[i..].iter().take_while(|x| x.metric == m).count();
        let kind = m.kind();
        let sum = kind == Kind::Counter;
        let mut dps = Vec::new();
        for sample in &s[i..j] {
            let mut dp = Vec::new();
            if let (Kind::Histogram, Some(h)) = (kind, sample.histogram.as_deref()) {
                // HistogramDataPoint: attributes 9, start 2, time 3, count 4, sum 5, bucket
                // counts 6 (per bucket, one more than the bounds), explicit bounds 7.
                for (k, v) in sample.label_pairs() {
                    put_attr(&mut dp, 9, k, v);
                }
                put_fixed64(&mut dp, 2, start_ns);
                put_fixed64(&mut dp, 3, now_ns);
                put_fixed64(&mut dp, 4, h.count);
                put_fixed64(&mut dp, 5, h.sum_seconds.to_bits());
                let (mut counts, mut bounds, mut prev) = (Vec::new(), Vec::new(), 0u64);
                for &(le, cum) in &h.buckets {
                    counts.extend_from_slice(&cum.saturating_sub(prev).to_le_bytes());
                    bounds.extend_from_slice(&le.to_le_bytes());
                    prev = prev.max(cum);
                }
                counts.extend_from_slice(&h.count.saturating_sub(prev).to_le_bytes());
                put_len(&mut dp, 6, &counts);
                put_len(&mut dp, 7, &bounds);
                put_len(&mut dps, 1, &dp);
                continue;
            }
            for (k, v) in sample.label_pairs() {
                put_attr(&mut dp, 7, k, v);
            }
            if sum {
                put_fixed64(&mut dp, 2, start_ns);
            }
            put_fixed64(&mut dp, 3, now_ns);
            put_fixed64(&mut dp, 6, sample.value);
            put_len(&mut dps, 1, &dp);
        }
        match kind {
            Kind::Counter => dps.extend_from_slice(&SUM_TRAILER),
            // Histogram.aggregation_temporality = CUMULATIVE.
            Kind::Histogram => dps.extend_from_slice(&SUM_TRAILER[..2]),
            Kind::Gauge => {}
        }
        let mut metric = Vec::new();
        put_len(&mut metric, 1, m.name().as_bytes());
        put_len(&mut metric, 2, m.help().as_bytes());
        put_len(
            &mut metric,
            3,
            if kind == Kind::Histogram {
                b"s" as &[u8]
            } else {
                b"1"
            },
        );
        let data_field = match kind {
            Kind::Counter => 7,
            Kind::Gauge => 5,
            Kind::Histogram => 9,
        };
        put_len(&mut metric, data_field, &dps);
        put_len(&mut out.buf, 2, &metric);
        points += j - i;
        i = j;
    }
    out.own_points += points;
    points
}

/// `ExportMetricsServiceResponse.partial_success`: rejected data points and the message.
/// `None` when the bytes are not a response.
pub fn parse_response(b: &[u8]) -> Option<(u64, String)> {
    let mut r = wire::Reader { b };
    let mut out = (0u64, String::new());
    while let Some(f) = r.field() {
        if let (1, wire::Value::Len(ps)) = f.ok()? {
            let mut p = wire::Reader { b: ps };
            while let Some(f) = p.field() {
                match f.ok()? {
                    (1, wire::Value::Varint(n)) => out.0 = n,
                    (2, wire::Value::Len(m)) => out.1 = String::from_utf8_lossy(m).into_owned(),
                    _ => {}
                }
            }
        }
    }
    Some(out)
}

/// Encodes `batches` into requests of at most `max_points` points as the sink's exporter does,
/// on the calling thread, reusing one buffer; returns (requests, protobuf bytes, points). For
/// the benchmark's encode-only figure: what one core can encode with no transport.
pub fn encode_requests(
    batches: &[Arc<CounterBatch>],
    names: MetricNames,
    max_points: usize,
) -> (u64, u64, u64) {
    let env = Envelope::new("bench");
    let mut plans: Vec<Plan> = Vec::new();
    let (mut requests, mut bytes, mut points) = (0u64, 0u64, 0u64);
    let mut buf = Vec::new();
    let mut req = RequestBuf::new(std::mem::take(&mut buf), &env);
    let finish = |req: RequestBuf, requests: &mut u64, bytes: &mut u64| -> RequestBuf {
        let (b, start) = req.finish(&env);
        *requests += 1;
        *bytes += (b.len() - start) as u64;
        RequestBuf::new(b, &env)
    };
    let mut rows = Vec::new();
    for b in batches {
        let p = match plans.iter().position(|p| Arc::ptr_eq(&p.schema, &b.schema)) {
            Some(p) => p,
            None => {
                plans.push(Plan::new(Arc::clone(&b.schema), names, None));
                plans.len() - 1
            }
        };
        plans[p].select_rows(b, 0, &mut rows);
        let width = b.schema.width().max(1);
        let mut i = 0;
        while i < rows.len() {
            let n = (max_points.saturating_sub(req.points) / width).clamp(1, rows.len() - i);
            points += plans[p].write_rows(b, &rows[i..i + n], &mut req) as u64;
            i += n;
            if req.points >= max_points {
                req = finish(req, &mut requests, &mut bytes);
            }
        }
    }
    if !req.is_empty() {
        finish(req, &mut requests, &mut bytes);
    }
    (requests, bytes, points)
}

/// Encodes a response (for the bench's receiver and tests).
pub fn encode_response(rejected: u64, message: &str) -> Vec<u8> {
    if rejected == 0 && message.is_empty() {
        return Vec::new();
    }
    let mut ps = Vec::new();
    put_uint(&mut ps, 1, rejected);
    if !message.is_empty() {
        put_len(&mut ps, 2, message.as_bytes());
    }
    let mut out = Vec::new();
    put_len(&mut out, 1, &ps);
    out
}

/// What a receiver counts in one request: data points and the wrapping sum of their integer
/// values (a checksum), by walking the protobuf without allocating. `None` when the bytes are
/// not a well-formed metrics request (wrong wire types, lengths past the end).
pub fn count_points(req: &[u8]) -> Option<(u64, u64)> {
    use wire::{Reader, Value::Len};
    fn each<'a>(b: &'a [u8], field: u32, mut f: impl FnMut(&'a [u8]) -> Option<()>) -> Option<()> {
        let mut r = Reader { b };
        while let Some(x) = r.field() {
            match x.ok()? {
                (n, Len(v)) if n == field => f(v)?,
                (n, _) if n == field => return None,
                _ => {}
            }
        }
        Some(())
    }
    let (mut points, mut sum) = (0u64, 0u64);
    each(req, 1, |rm| {
        each(rm, 2, |sm| {
            each(sm, 2, |m| {
                let mut r = Reader { b: m };
                while let Some(x) = r.field() {
                    if let (5 | 7, Len(data)) = x.ok()? {
                        points_in(data, &mut points, &mut sum)?;
                    }
                }
                Some(())
            })
        })
    })?;
    Some((points, sum))
}

/// A varint at `b[i..]`: (value, bytes).
#[inline]
fn varint_at(b: &[u8], i: usize) -> Option<(usize, usize)> {
    let mut v = 0u64;
    for k in 0..10 {
        let x = *b.get(i + k)?;
        v |= u64::from(x & 0x7f) << (7 * k);
        if x < 0x80 {
            return Some((usize::try_from(v).ok()?, k + 1));
        }
    }
    None
}

/// The data points of a `Sum`/`Gauge` body: counts them and adds their `as_int` values. The
/// common shapes (one-byte tags) are walked byte by byte; anything else goes through the
/// generic reader.
fn points_in(data: &[u8], points: &mut u64, sum: &mut u64) -> Option<()> {
    let mut i = 0;
    while i < data.len() {
        if data[i] == tag(1, LEN) {
            let (len, n) = varint_at(data, i + 1)?;
            let s = i + 1 + n;
            let e = s.checked_add(len)?;
            *sum = sum.wrapping_add(point_value(data.get(s..e)?)?);
            *points += 1;
            i = e;
        } else {
            let mut r = wire::Reader { b: &data[i..] };
            match r.field()?.ok()? {
                (1, _) => return None,
                _ => i = data.len() - r.b.len(),
            }
        }
    }
    Some(())
}

/// A data point's `as_int` (0 when absent), checking that its fields are well-formed.
#[inline]
fn point_value(dp: &[u8]) -> Option<u64> {
    let mut v = 0;
    let mut i = 0;
    while i < dp.len() {
        let t = dp[i];
        if t >= 0x80 {
            // A field number ≥ 16: the generic reader.
            let mut r = wire::Reader { b: &dp[i..] };
            r.field()?.ok()?;
            i = dp.len() - r.b.len();
            continue;
        }
        i += 1;
        match t & 7 {
            1 => {
                let w = dp.get(i..i + 8)?;
                if t == tag(6, wire::I64) {
                    v = u64::from_le_bytes(w.try_into().ok()?);
                }
                i += 8;
            }
            2 => {
                let (len, n) = varint_at(dp, i)?;
                i = i.checked_add(n + len)?;
            }
            0 => i += varint_at(dp, i)?.1,
            5 => i += 4,
            _ => return None,
        }
    }
    (i == dp.len()).then_some(v)
}

#[cfg(test)]
mod tests;
