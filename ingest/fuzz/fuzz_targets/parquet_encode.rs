//! The Parquet sink's column-chunk encoder, differential: fuzzer-chosen counters, missing
//! parts (nulls), page / row-group sizes, encodings and codecs are encoded by
//! `stel_store::parquet::encode_in_memory` and read back by parquet's own Arrow reader (a
//! separate code path); every value and null must come back exactly. Must never panic.
#![no_main]
use std::sync::Arc;

use arrow_array::{cast::AsArray, types::UInt64Type, Array};
use libfuzzer_sys::fuzz_target;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use stel_store::{
    parquet::{encode_in_memory, Codec, CounterEncoding, ParquetSinkConfig},
    sai::StatKey,
    CounterBatch, CounterColumn, SessionSchema,
};

fuzz_target!(|data: &[u8]| {
    if data.len() < 6 {
        return;
    }
    let width = 1 + data[0] as usize % 6;
    let two_parts = width > 1 && data[1] & 1 == 1;
    let page_rows = 1 + data[2] as usize % 300;
    let row_group_rows = 1 + data[3] as usize % 700;
    let encoding = match data[4] % 3 {
        0 => CounterEncoding::DeltaBinaryPacked,
        1 => CounterEncoding::ByteStreamSplit,
        _ => CounterEncoding::Plain,
    };
    let codec = match data[5] % 3 {
        0 => Codec::Lz4,
        1 => Codec::Zstd,
        _ => Codec::None,
    };
    let body = &data[6..];
    // Each row: one mask byte, then `width` values of up to 8 bytes (short input repeats).
    let row_bytes = 1 + 8 * width;
    let rows = (body.len() / row_bytes).clamp(1, 2_000);
    let byte = |i: usize| body.get(i % body.len().max(1)).copied().unwrap_or(0);
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
    let split = width / 2;
    let schema = Arc::new(SessionSchema {
        profile: "fuzz".into(),
        group: "PORT".into(),
        domain: 0,
        template_ids: if two_parts { vec![1, 2] } else { vec![1] },
        part_offsets: if two_parts { vec![0, split] } else { vec![0] },
        columns,
        generation: 0,
    });
    let mut values = Vec::with_capacity(rows * width);
    let mut masks = Vec::with_capacity(rows);
    let mut ts = Vec::with_capacity(rows);
    for r in 0..rows {
        let base = r * row_bytes;
        masks.push(if two_parts { u32::from(byte(base) % 4).max(1) } else { 1 });
        ts.push(1_700_000_000_000_000_000i64 + r as i64 * 10_000);
        for c in 0..width {
            let mut v = [0u8; 8];
            for (k, b) in v.iter_mut().enumerate() {
                *b = byte(base + 1 + c * 8 + k);
            }
            values.push(u64::from_le_bytes(v));
        }
    }
    let batch = CounterBatch {
        schema: Arc::clone(&schema),
        ts: ts.clone(),
        values,
        part_masks: if two_parts { masks } else { Vec::new() },
    };
    let cfg = ParquetSinkConfig {
        page_rows,
        row_group_rows,
        encoding,
        compression: codec,
        compression_level: 1,
        ..ParquetSinkConfig::default()
    };
    // Split into several batches so DELTA blocks span batch boundaries (the encoder keeps rows
    // by reference until a block is complete).
    let batch = Arc::new(batch);
    let cut = rows / 3;
    let piece = |a: usize, b: usize| {
        Arc::new(CounterBatch {
            schema: Arc::clone(&schema),
            ts: batch.ts[a..b].to_vec(),
            values: batch.values[a * width..b * width].to_vec(),
            part_masks: if batch.part_masks.is_empty() {
                Vec::new()
            } else {
                batch.part_masks[a..b].to_vec()
            },
        })
    };
    let input: Vec<Arc<CounterBatch>> = [(0, cut), (cut, rows)]
        .into_iter()
        .filter(|(a, b)| a < b)
        .map(|(a, b)| piece(a, b))
        .collect();
    let cfg = ParquetSinkConfig {
        encode_threads: 1 + data[1] as usize % 3,
        ..cfg
    };
    let file = encode_in_memory(&input, &cfg).expect("encode");
    let reader = ParquetRecordBatchReaderBuilder::try_new(bytes::Bytes::from(file))
        .expect("footer")
        .build()
        .expect("reader");
    let mut row = 0usize;
    for rb in reader {
        let rb = rb.expect("record batch");
        let got_ts = rb.column(0).as_primitive::<arrow_array::types::TimestampNanosecondType>();
        for c in 0..width {
            let col = rb.column(c + 1).as_primitive::<UInt64Type>();
            for i in 0..rb.num_rows() {
                let r = row + i;
                assert_eq!(got_ts.value(i), ts[r]);
                if batch.is_valid(r, c) {
                    assert!(col.is_valid(i), "row {r} col {c} should be valid");
                    assert_eq!(col.value(i), batch.values[r * width + c], "row {r} col {c}");
                } else {
                    assert!(col.is_null(i), "row {r} col {c} should be null");
                }
            }
        }
        row += rb.num_rows();
    }
    assert_eq!(row, rows);
});
