//! A synthetic counter history written with the store's Parquet sink: what `stel-query-bench`
//! measures and what the long view's tests read. Not a module of the library: the bench binary
//! and the library's tests include this file (`#[path]`), so the shipped crate never carries it.

use std::sync::Arc;

use stel_store::{
    parquet::{ParquetSink, ParquetSinkConfig},
    sai::{ObjectType, StatKey},
    CounterBatch, CounterColumn, SessionSchema,
};

/// First snapshot time of the generated history (2023-11-14T22:13:20Z).
pub(crate) const START_NS: i64 = 1_700_000_000_000_000_000;
/// Snapshots per submitted batch (the decoder's default maximum).
const ROWS_PER_BATCH: usize = 8192;

/// The bench session's schema: `ports` PORT objects × the first `stats` PORT stats, which
/// include the rate inputs.
pub(crate) fn bench_schema(ports: usize, stats: usize) -> SessionSchema {
    let wanted = [
        "IF_IN_OCTETS",
        "IF_IN_UCAST_PKTS",
        "IF_IN_NON_UCAST_PKTS",
        "IF_OUT_OCTETS",
        "IF_OUT_UCAST_PKTS",
    ];
    let mut ids: Vec<u32> = wanted
        .iter()
        .filter_map(|n| ObjectType::Port.stat_by_name(n).map(|s| s.id))
        .collect();
    for s in ObjectType::Port.stats() {
        if ids.len() >= stats {
            break;
        }
        if !ids.contains(&s.id) {
            ids.push(s.id);
        }
    }
    ids.truncate(stats);
    let mut columns = Vec::new();
    for p in 0..ports {
        for id in &ids {
            columns.push(CounterColumn {
                label: p as u16 + 1,
                object: format!("Ethernet{}", 4 * p),
                key: StatKey {
                    object_type: ObjectType::Port as u32,
                    stat_id: *id,
                },
            });
        }
    }
    SessionSchema::one_template("bench".into(), "PORT".into(), columns)
}

/// Writes `rows` snapshots of `schema`, `interval_ns` apart, under `root` with the store's
/// Parquet sink (the daemon's writer: production encoding, codec, row-group and page sizes).
/// Files rotate at the hour and at the size limit only (not on the wall clock), so the layout is
/// the same however fast this runs.
pub(crate) fn generate(
    root: &std::path::Path,
    schema: &Arc<SessionSchema>,
    rows: usize,
    interval_ns: i64,
) -> Result<(), String> {
    let cfg = ParquetSinkConfig {
        dir: root.to_path_buf(),
        block_timeout_ms: 600_000,
        flush_interval_ms: 24 * 3_600_000,
        memory_budget_bytes: 1 << 30,
        switch_name: Some("bench".into()),
        ..ParquetSinkConfig::default()
    };
    let sink = ParquetSink::start(cfg, None).map_err(|e| format!("parquet sink: {e}"))?;
    let w = schema.width();
    let stat_names: Vec<String> = schema.columns.iter().map(|c| c.key.short_name()).collect();
    // Per-snapshot increments scale with the interval, so rates look like a real port's.
    let scale = (interval_ns / 10_000).max(1) as u64;
    let mut state = vec![0u64; w];
    let mut lcg: u64 = 0x9E37_79B9_7F4A_7C15;
    let per_port = schema
        .columns
        .iter()
        .filter(|x| x.label == 1)
        .count()
        .max(1);
    let mut row = 0usize;
    while row < rows {
        let n = ROWS_PER_BATCH.min(rows - row);
        let mut ts = Vec::with_capacity(n);
        let mut values = Vec::with_capacity(n * w);
        for r in 0..n {
            ts.push(START_NS + (row + r) as i64 * interval_ns);
            for (c, name) in stat_names.iter().enumerate() {
                lcg = lcg
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let jitter = lcg >> 60;
                let port = c / per_port;
                let pkts = (10 + (port as u64 % 7) * 4 + jitter / 4) * scale;
                state[c] += match name.as_str() {
                    n if n.ends_with("OCTETS") => pkts * 800,
                    n if n.contains("PKTS") => pkts,
                    _ => u64::from(jitter == 0),
                };
                values.push(state[c]);
            }
        }
        let batch = CounterBatch::new(Arc::clone(schema), ts, values, Vec::new())
            .map_err(|e| e.to_string())?;
        sink.submit(Arc::new(batch))
            .map_err(|e| format!("parquet sink shed a batch: {e:?}"))?;
        row += n;
    }
    let stats = sink.shutdown().map_err(|e| format!("parquet sink: {e}"))?;
    let lost = stel_store::parquet::accounting::lost(&stats);
    if lost > 0 {
        return Err(format!("parquet sink lost {lost} samples"));
    }
    Ok(())
}
