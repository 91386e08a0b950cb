//! Counter batches: filled row by row by a decoder, handed to sinks as owned values, turned into
//! Arrow record batches without copying.
//!
//! A [`BatchBuilder`] is owned by exactly one decoder thread. Its buffers are allocated once (or
//! recycled from a finished batch, see [`BatchBuilder::recycle`]) and written in place, so filling
//! a batch allocates nothing. When a snapshot is split over several templates (a group with more
//! counters than one message holds), each template's record fills its part of the row for the same
//! timestamp; rows still missing a part when the batch is finished get nulls for that part.

use std::sync::Arc;

use arrow_array::{
    types::UInt64Type, Array, ArrayRef, FixedSizeListArray, PrimitiveArray, RecordBatch,
    TimestampNanosecondArray, UInt64Array,
};
use arrow_buffer::{BooleanBufferBuilder, NullBuffer, ScalarBuffer};
use arrow_schema::{ArrowError, Field};
use crossbeam_channel::{Receiver, Sender};

use crate::schema::SessionSchema;

/// How many recent rows are searched for a timestamp when assembling a split snapshot.
const OPEN_ROWS: usize = 16;

/// A finished batch of one session: `rows` snapshots, row-major.
#[derive(Debug)]
pub struct CounterBatch {
    pub schema: Arc<SessionSchema>,
    /// Snapshot timestamps, ns since the Unix epoch.
    pub ts: Vec<i64>,
    /// `ts.len() * schema.width()` counters, row-major.
    pub values: Vec<u64>,
    /// For split snapshots: bit `p` set when part `p` of the row arrived. Empty when every row is
    /// complete (always the case for single-template sessions).
    pub part_masks: Vec<u32>,
}

/// Why [`CounterBatch::new`] refused its parts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BatchShapeError {
    #[error("{values} values for {rows} rows of width {width} (expected {expected})", expected = rows * width)]
    Values {
        values: usize,
        rows: usize,
        width: usize,
    },
    #[error("{masks} part masks for {rows} rows (expected 0 or {rows})")]
    Masks { masks: usize, rows: usize },
    #[error("row {row}'s part mask {mask:#x} names a part beyond the schema's {parts}")]
    MaskBits { row: usize, mask: u32, parts: usize },
}

impl CounterBatch {
    /// A batch from its parts, checked: `values` is `ts.len() × width` long, `part_masks` is
    /// empty or one mask per row naming only the schema's parts. Every batch built outside the
    /// decoder (the emulator, tests, benchmarks, generators) goes through here; the sinks index
    /// `values` by row and column and would otherwise panic on a short batch.
    ///
    /// # Errors
    /// See [`BatchShapeError`].
    pub fn new(
        schema: Arc<SessionSchema>,
        ts: Vec<i64>,
        values: Vec<u64>,
        part_masks: Vec<u32>,
    ) -> Result<Self, BatchShapeError> {
        let (rows, width) = (ts.len(), schema.width());
        if values.len() != rows * width {
            return Err(BatchShapeError::Values {
                values: values.len(),
                rows,
                width,
            });
        }
        if !part_masks.is_empty() {
            if part_masks.len() != rows {
                return Err(BatchShapeError::Masks {
                    masks: part_masks.len(),
                    rows,
                });
            }
            let parts = schema.parts();
            let allowed = if parts >= 32 {
                u32::MAX
            } else {
                (1u32 << parts) - 1
            };
            if let Some((row, &mask)) = part_masks
                .iter()
                .enumerate()
                .find(|(_, m)| **m & !allowed != 0)
            {
                return Err(BatchShapeError::MaskBits { row, mask, parts });
            }
        }
        Ok(Self {
            schema,
            ts,
            values,
            part_masks,
        })
    }

    /// Number of snapshots.
    pub fn rows(&self) -> usize {
        self.ts.len()
    }

    /// Number of counter values (rows × width).
    pub fn samples(&self) -> usize {
        self.values.len()
    }

    /// One snapshot's counters.
    pub fn row(&self, i: usize) -> &[u64] {
        let w = self.schema.width();
        &self.values[i * w..(i + 1) * w]
    }

    /// Whether counter `col` of row `row` is present (false only for a split snapshot's missing
    /// part).
    pub fn is_valid(&self, row: usize, col: usize) -> bool {
        if self.part_masks.is_empty() {
            return true;
        }
        let part = self
            .schema
            .part_offsets
            .partition_point(|&off| off <= col)
            .saturating_sub(1);
        self.part_masks[row] & (1 << part) != 0
    }

    /// Of rows `start..end`, the values that are null because their part never arrived.
    pub fn missing_samples_in(&self, start: usize, end: usize) -> usize {
        if self.part_masks.is_empty() {
            return 0;
        }
        self.part_masks[start..end]
            .iter()
            .map(|m| {
                (0..self.schema.parts())
                    .filter(|p| m & (1 << p) == 0)
                    .map(|p| self.schema.part_range(p).len())
                    .sum::<usize>()
            })
            .sum()
    }

    /// Number of values that are null because their part never arrived.
    pub fn missing_samples(&self) -> usize {
        self.missing_samples_in(0, self.rows())
    }

    fn child_nulls(&self) -> Option<NullBuffer> {
        if self.part_masks.is_empty() || self.missing_samples() == 0 {
            return None;
        }
        let mut b = BooleanBufferBuilder::new(self.values.len());
        for mask in &self.part_masks {
            for p in 0..self.schema.parts() {
                b.append_n(self.schema.part_range(p).len(), mask & (1 << p) != 0);
            }
        }
        Some(NullBuffer::new(b.finish()))
    }

    fn ts_array(&self, ts: Vec<i64>) -> TimestampNanosecondArray {
        TimestampNanosecondArray::new(ScalarBuffer::from(ts), None).with_timezone("UTC")
    }

    /// The in-memory layout as Arrow, without copying the counters: the `values` buffer becomes
    /// the FixedSizeList's child buffer.
    ///
    /// # Errors
    /// Only if the batch is internally inconsistent (lengths that do not match the schema).
    pub fn into_record_batch(self) -> Result<RecordBatch, ArrowError> {
        let schema = self.schema.arrow_schema();
        let nulls = self.child_nulls();
        let width = self.schema.width() as i32;
        let child = UInt64Array::new(ScalarBuffer::from(self.values), nulls);
        let item = Arc::new(Field::new("item", arrow_schema::DataType::UInt64, true));
        let list = FixedSizeListArray::try_new(item, width, Arc::new(child), None)?;
        let ts =
            TimestampNanosecondArray::new(ScalarBuffer::from(self.ts), None).with_timezone("UTC");
        RecordBatch::try_new(schema, vec![Arc::new(ts), Arc::new(list)])
    }

    /// The wide layout (one column per counter) as Arrow. Transposes in tiles of
    /// `TILE_ROWS × TILE_COLS` so reads and writes both stay in cache.
    ///
    /// # Errors
    /// Only if the batch is internally inconsistent.
    #[expect(
        clippy::needless_range_loop,
        reason = "a tiled transpose indexes rows and columns of two layouts"
    )]
    pub fn to_wide(&self) -> Result<RecordBatch, ArrowError> {
        const TILE_ROWS: usize = 64;
        const TILE_COLS: usize = 64;
        let rows = self.rows();
        let width = self.schema.width();
        let mut cols: Vec<Vec<u64>> = (0..width).map(|_| vec![0u64; rows]).collect();
        for r0 in (0..rows).step_by(TILE_ROWS) {
            let r1 = (r0 + TILE_ROWS).min(rows);
            for c0 in (0..width).step_by(TILE_COLS) {
                let c1 = (c0 + TILE_COLS).min(width);
                for r in r0..r1 {
                    let src = &self.values[r * width + c0..r * width + c1];
                    for (c, v) in src.iter().enumerate() {
                        cols[c0 + c][r] = *v;
                    }
                }
            }
        }
        let mut arrays: Vec<ArrayRef> = Vec::with_capacity(width + 1);
        arrays.push(Arc::new(self.ts_array(self.ts.clone())));
        for (c, col) in cols.into_iter().enumerate() {
            let nulls = if self.part_masks.is_empty() {
                None
            } else {
                let n = NullBuffer::from_iter((0..rows).map(|r| self.is_valid(r, c)));
                (n.null_count() > 0).then_some(n)
            };
            let a: PrimitiveArray<UInt64Type> = PrimitiveArray::new(ScalarBuffer::from(col), nulls);
            arrays.push(Arc::new(a) as ArrayRef);
        }
        debug_assert!(arrays.iter().all(|a| a.len() == rows));
        RecordBatch::try_new(self.schema.wide_arrow_schema(), arrays)
    }
}

impl CounterBatch {
    /// The inverse of [`CounterBatch::to_wide`]: a wide batch (`ts`, then `schema`'s counters in
    /// order, as a history file holds them) back in the row-major layout, transposed in tiles.
    /// `None` when a counter is null (the row-major layout only knows whole missing parts, and
    /// a file does not say where its parts start).
    ///
    /// # Errors
    /// Columns that do not match `schema` (count or types).
    pub fn from_wide(
        schema: Arc<SessionSchema>,
        b: &RecordBatch,
    ) -> Result<Option<CounterBatch>, ArrowError> {
        use arrow_array::{cast::AsArray, types::TimestampNanosecondType};
        const TILE_ROWS: usize = 64;
        const TILE_COLS: usize = 64;
        let width = schema.width();
        if b.num_columns() != width + 1 {
            return Err(ArrowError::SchemaError(format!(
                "{} columns for a session of {width} counters",
                b.num_columns()
            )));
        }
        let ts = b
            .column(0)
            .as_primitive_opt::<TimestampNanosecondType>()
            .ok_or_else(|| ArrowError::SchemaError("ts is not a nanosecond timestamp".into()))?;
        let mut cols = Vec::with_capacity(width);
        for c in 1..=width {
            let a = b
                .column(c)
                .as_primitive_opt::<UInt64Type>()
                .ok_or_else(|| ArrowError::SchemaError(format!("column {c} is not UInt64")))?;
            if a.null_count() > 0 {
                return Ok(None);
            }
            cols.push(a.values());
        }
        let rows = b.num_rows();
        let mut values = vec![0u64; rows * width];
        for r0 in (0..rows).step_by(TILE_ROWS) {
            let r1 = (r0 + TILE_ROWS).min(rows);
            for c0 in (0..width).step_by(TILE_COLS) {
                let c1 = (c0 + TILE_COLS).min(width);
                for r in r0..r1 {
                    let dst = &mut values[r * width + c0..r * width + c1];
                    for (k, v) in dst.iter_mut().enumerate() {
                        *v = cols[c0 + k][r];
                    }
                }
            }
        }
        CounterBatch::new(schema, ts.values().to_vec(), values, Vec::new())
            .map(Some)
            .map_err(|e| ArrowError::SchemaError(e.to_string()))
    }
}

/// Fills one session's batch in place. Owned by one decoder; never shared.
#[derive(Debug)]
pub struct BatchBuilder {
    schema: Arc<SessionSchema>,
    width: usize,
    parts: usize,
    full_mask: u32,
    cap_rows: usize,
    rows: usize,
    ts: Vec<i64>,
    /// Always `cap_rows * width` long; rows `0..rows` are meaningful.
    values: Vec<u64>,
    part_masks: Vec<u32>,
    spare: Vec<(Vec<i64>, Vec<u64>)>,
}

/// Buffers of batches whose last holder was a sink thread, on their way back to a decoder.
///
/// A decoder can reuse a batch's buffers only if no sink kept the batch; the Parquet writer
/// and the COUNTERS_DB writer usually hold it longer, so without this every batch (8.4 MB at
/// the design session) was a fresh allocation: memset and page faults were 12 % of the decoder
/// thread in `stel-bench e2e`. Bounded (a few batches' worth); a full pool frees the buffers.
fn returned() -> &'static (Sender<Buffers>, Receiver<Buffers>) {
    static POOL: std::sync::OnceLock<(Sender<Buffers>, Receiver<Buffers>)> =
        std::sync::OnceLock::new();
    POOL.get_or_init(|| crossbeam_channel::bounded(RETURNED_MAX))
}
/// A batch's `ts` and `values` buffers.
type Buffers = (Vec<i64>, Vec<u64>);
const RETURNED_MAX: usize = 8;

/// Called by a sink when it is done with a batch: if it was the last holder, the buffers go
/// back to the decoders (through a bounded lock-free pool) instead of to the allocator.
/// `Arc::into_inner`: when several threads release their references at once, exactly one of
/// them gets the buffers (with `try_unwrap` all could fail and the buffers be freed).
pub fn release(batch: Arc<CounterBatch>) {
    if let Some(b) = Arc::into_inner(batch) {
        let _ = returned().0.try_send((b.ts, b.values));
    }
}

/// Most template parts one snapshot may be split into (bits of the part mask).
pub const MAX_PARTS: usize = 32;

impl BatchBuilder {
    /// A builder for up to `cap_rows` snapshots of `schema` (at least 1).
    ///
    /// # Panics
    /// If the schema has more than [`MAX_PARTS`] parts (the decoder rejects such sessions first).
    pub fn new(schema: Arc<SessionSchema>, cap_rows: usize) -> Self {
        let width = schema.width();
        let parts = schema.parts().max(1);
        assert!(parts <= MAX_PARTS, "too many template parts: {parts}");
        let cap_rows = cap_rows.max(1);
        let mut b = Self {
            full_mask: if parts == 32 {
                u32::MAX
            } else {
                (1u32 << parts) - 1
            },
            schema,
            width,
            parts,
            cap_rows,
            rows: 0,
            ts: Vec::new(),
            values: Vec::new(),
            part_masks: Vec::new(),
            spare: Vec::new(),
        };
        b.take_buffers();
        b
    }

    fn take_buffers(&mut self) {
        let need = self.cap_rows * self.width;
        let (mut ts, mut values) = self
            .spare
            .pop()
            .or_else(|| {
                // A buffer too small for this session is freed here (rare: sessions differ).
                returned()
                    .1
                    .try_recv()
                    .ok()
                    .filter(|(_, v)| v.capacity() >= need)
            })
            .unwrap_or_default();
        ts.clear();
        ts.reserve(self.cap_rows);
        // Only grows (zero-filling once); a recycled buffer of the right size is reused as is.
        values.resize(need, 0);
        self.ts = ts;
        self.values = values;
        self.part_masks.clear();
        self.rows = 0;
    }

    pub fn schema(&self) -> &Arc<SessionSchema> {
        &self.schema
    }

    /// Snapshots in the current batch.
    pub fn len(&self) -> usize {
        self.rows
    }

    pub fn is_empty(&self) -> bool {
        self.rows == 0
    }

    /// Whether the next new row would not fit.
    pub fn is_full(&self) -> bool {
        self.rows == self.cap_rows
    }

    /// Capacity in snapshots.
    pub fn capacity(&self) -> usize {
        self.cap_rows
    }

    /// Returns a finished batch's buffers for reuse, so steady-state decoding allocates nothing.
    pub fn recycle(&mut self, batch: CounterBatch) {
        if self.spare.len() < 2 && batch.values.capacity() >= self.cap_rows * self.width {
            self.spare.push((batch.ts, batch.values));
        }
    }

    /// The slice to write part `part` of the snapshot taken at `ts` into, or `None` when the batch
    /// is full (finish it and call again). For single-part sessions every call is a new row.
    #[inline]
    pub fn part_mut(&mut self, ts: i64, part: usize) -> Option<&mut [u64]> {
        if self.parts == 1 {
            if self.rows == self.cap_rows {
                return None;
            }
            let r = self.rows;
            self.rows += 1;
            self.ts.push(ts);
            let w = self.width;
            return Some(&mut self.values[r * w..(r + 1) * w]);
        }
        self.split_part_mut(ts, part)
    }

    fn split_part_mut(&mut self, ts: i64, part: usize) -> Option<&mut [u64]> {
        let bit = 1u32 << part;
        let lo = self.rows.saturating_sub(OPEN_ROWS);
        let found = (lo..self.rows)
            .rev()
            .find(|&r| self.ts[r] == ts && self.part_masks[r] & bit == 0);
        let r = match found {
            Some(r) => r,
            None => {
                if self.rows == self.cap_rows {
                    return None;
                }
                self.rows += 1;
                self.ts.push(ts);
                self.part_masks.push(0);
                self.rows - 1
            }
        };
        self.part_masks[r] |= bit;
        let range = self.schema.part_range(part);
        let base = r * self.width;
        Some(&mut self.values[base + range.start..base + range.end])
    }

    /// Takes the rows written so far as a batch and starts a new one.
    pub fn finish(&mut self) -> CounterBatch {
        let mut values = std::mem::take(&mut self.values);
        values.truncate(self.rows * self.width);
        let part_masks = if self.parts > 1 {
            let masks = std::mem::take(&mut self.part_masks);
            if masks.iter().all(|m| *m == self.full_mask) {
                Vec::new()
            } else {
                masks
            }
        } else {
            Vec::new()
        };
        let batch = CounterBatch {
            schema: Arc::clone(&self.schema),
            ts: std::mem::take(&mut self.ts),
            values,
            part_masks,
        };
        self.take_buffers();
        batch
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checked_constructor_refuses_bad_shapes() {
        let s = schema(&[2, 2]);
        assert_eq!((s.width(), s.parts()), (4, 2));
        assert!(CounterBatch::new(Arc::clone(&s), vec![1, 2], vec![0; 8], vec![]).is_ok());
        assert!(CounterBatch::new(Arc::clone(&s), vec![1, 2], vec![0; 8], vec![3, 1]).is_ok());
        assert_eq!(
            CounterBatch::new(Arc::clone(&s), vec![1, 2], vec![0; 7], vec![]).unwrap_err(),
            BatchShapeError::Values {
                values: 7,
                rows: 2,
                width: 4
            }
        );
        assert_eq!(
            CounterBatch::new(Arc::clone(&s), vec![1, 2], vec![0; 8], vec![3]).unwrap_err(),
            BatchShapeError::Masks { masks: 1, rows: 2 }
        );
        assert_eq!(
            CounterBatch::new(s, vec![1, 2], vec![0; 8], vec![3, 4]).unwrap_err(),
            BatchShapeError::MaskBits {
                row: 1,
                mask: 4,
                parts: 2
            }
        );
    }
    use crate::{sai::StatKey, schema::CounterColumn};
    use arrow_array::cast::AsArray;

    fn schema(parts: &[usize]) -> Arc<SessionSchema> {
        let mut columns = Vec::new();
        let mut offs = Vec::new();
        for (p, n) in parts.iter().enumerate() {
            offs.push(columns.len());
            for i in 0..*n {
                columns.push(CounterColumn {
                    label: (p * 10 + i + 1) as u16,
                    object: format!("Ethernet{}", 4 * (p * 10 + i)),
                    key: StatKey {
                        object_type: 1,
                        stat_id: 0,
                    },
                });
            }
        }
        Arc::new(SessionSchema {
            profile: "p".into(),
            group: "PORT".into(),
            domain: 0,
            template_ids: (0..parts.len() as u16).map(|i| 256 + i).collect(),
            part_offsets: offs,
            columns,
            generation: 1,
        })
    }

    #[test]
    fn from_wide_inverts_to_wide() {
        let s = schema(&[70]);
        let rows = 130;
        let values: Vec<u64> = (0..rows * 70).map(|k| k as u64 * 7 + 3).collect();
        let ts: Vec<i64> = (0..rows as i64).map(|i| 1000 + i).collect();
        let b = CounterBatch::new(Arc::clone(&s), ts.clone(), values.clone(), vec![]).unwrap();
        let back = CounterBatch::from_wide(Arc::clone(&s), &b.to_wide().unwrap())
            .unwrap()
            .unwrap();
        assert_eq!((back.ts, back.values), (ts, values));
        // A null counter cannot be carried row-major.
        let split = schema(&[2, 2]);
        let holes =
            CounterBatch::new(Arc::clone(&split), vec![1, 2], vec![0; 8], vec![3, 1]).unwrap();
        assert!(CounterBatch::from_wide(split, &holes.to_wide().unwrap())
            .unwrap()
            .is_none());
    }

    #[test]
    fn single_part_rows_and_both_layouts() {
        let mut b = BatchBuilder::new(schema(&[3]), 2);
        b.part_mut(10, 0).unwrap().copy_from_slice(&[1, 2, 3]);
        b.part_mut(20, 0).unwrap().copy_from_slice(&[4, 5, 6]);
        assert!(b.part_mut(30, 0).is_none());
        let batch = b.finish();
        assert_eq!(batch.row(1), &[4, 5, 6]);
        let wide = batch.to_wide().unwrap();
        assert_eq!(wide.num_columns(), 4);
        assert_eq!(wide.schema().field(1).name(), "Ethernet0.IF_IN_OCTETS");
        assert_eq!(
            wide.column(2).as_primitive::<UInt64Type>().values(),
            &[2, 5]
        );
        let rb = batch.into_record_batch().unwrap();
        let list = rb.column(1).as_fixed_size_list();
        assert_eq!(list.value_length(), 3);
        assert_eq!(
            list.values().as_primitive::<UInt64Type>().values(),
            &[1, 2, 3, 4, 5, 6]
        );
        // The builder starts over with the same capacity.
        assert!(b.is_empty());
        assert!(b.part_mut(40, 0).is_some());
    }

    #[test]
    fn split_snapshot_reassembled_by_timestamp() {
        let mut b = BatchBuilder::new(schema(&[2, 1]), 8);
        b.part_mut(10, 0).unwrap().copy_from_slice(&[1, 2]);
        b.part_mut(10, 1).unwrap().copy_from_slice(&[3]);
        b.part_mut(20, 1).unwrap().copy_from_slice(&[6]); // part 1 first
        b.part_mut(20, 0).unwrap().copy_from_slice(&[4, 5]);
        b.part_mut(30, 0).unwrap().copy_from_slice(&[7, 8]); // part 1 never comes
        let batch = b.finish();
        assert_eq!(batch.rows(), 3);
        assert_eq!(batch.row(0), &[1, 2, 3]);
        assert_eq!(batch.row(1), &[4, 5, 6]);
        assert_eq!(batch.missing_samples(), 1);
        assert!(!batch.is_valid(2, 2) && batch.is_valid(2, 1));
        let wide = batch.to_wide().unwrap();
        assert_eq!(wide.column(3).null_count(), 1);
        let rb = batch.into_record_batch().unwrap();
        assert_eq!(rb.column(1).as_fixed_size_list().values().null_count(), 1);
    }

    #[test]
    fn recycled_buffers_are_reused() {
        let mut b = BatchBuilder::new(schema(&[4]), 4);
        for t in 0..4 {
            b.part_mut(t, 0).unwrap().fill(t as u64);
        }
        let batch = b.finish();
        let ptr = batch.values.as_ptr();
        b.recycle(batch);
        let _ = b.finish(); // empty batch; takes the spare
        for t in 0..4 {
            b.part_mut(t, 0).unwrap().fill(9);
        }
        let again = b.finish();
        assert_eq!(again.values.as_ptr(), ptr);
        assert!(again.values.iter().all(|v| *v == 9));
    }
}
