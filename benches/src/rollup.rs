//! `stel-bench rollup`: what the rollup tiers cost and what they buy.
//!
//! - `accumulate_counters_per_cpu_s`: the rollup writer's per-sample work (accumulator + tier
//!   files) on one core, on design-rate emulator batches (IPFIX decoded by the daemon's decoder).
//! - `bytes_per_switch_day`: per tier, the published tier files of `--secs` of design-rate data
//!   per load (steady, ramp, microburst), scaled to a day (below).
use std::{path::Path, time::Instant};

use serde_json::json;
use stel_ingest::{
    decode::{CounterBatch, DecodeConfig, Decoder},
    emu::{EmuConfig, Emulator, Pattern},
};
use stel_store::{
    rollup::{RollupConfig, RollupWriter},
    BudgetHandle,
};

use crate::parquet::thread_cpu_s;

/// Feeds `secs` of switch time of the design session under `pattern` into `sink`, batch by
/// batch as the decoder emits them. Returns counters fed.
pub fn design_stream(pattern: Pattern, secs: f64, mut sink: impl FnMut(&CounterBatch)) -> u64 {
    let mut emu = Emulator::new(EmuConfig {
        pattern,
        ..EmuConfig::design()
    })
    .expect("design config");
    let mut dec = Decoder::new(DecodeConfig::default());
    let mut spare: Vec<CounterBatch> = Vec::new();
    dec.register_session(
        emu.session_spec(),
        &emu.session_config(),
        &mut |_: CounterBatch| {},
    )
    .expect("design session");
    let snapshots = (secs * 1e9 / emu.cfg.interval_ns as f64) as u64;
    let mut buf = Vec::new();
    let mut n = 0u64;
    while emu.snapshots() < snapshots {
        buf.clear();
        for _ in 0..64 {
            emu.data_message(&mut buf);
        }
        dec.decode(&buf, &mut |b: CounterBatch| spare.push(b));
        for b in spare.drain(..) {
            n += b.samples() as u64;
            sink(&b);
            dec.recycle(b);
        }
    }
    dec.flush(&mut |b: CounterBatch| spare.push(b));
    for b in spare.drain(..) {
        n += b.samples() as u64;
        sink(&b);
    }
    n
}

/// Bytes of the published files under `dir/tier=<t>`.
fn tier_bytes(dir: &Path, tier: &str) -> u64 {
    stel_store::paths::published_parts(dir)
        .iter()
        .filter(|(rel, _, _)| rel.starts_with(&format!("tier={tier}/")))
        .map(|(_, p, _)| std::fs::metadata(p).map_or(0, |m| m.len()))
        .sum()
}

/// Runs the benchmark; returns the contract's JSON object.
///
/// # Errors
/// A run failing.
pub fn bench(quick: bool, secs: Option<f64>) -> Result<serde_json::Value, String> {
    let secs = secs.unwrap_or(if quick { 3.0 } else { 30.0 });
    let mut per_load = serde_json::Map::new();
    let mut acc_rates = Vec::new();
    for pattern in [Pattern::Steady, Pattern::Ramp, Pattern::Microburst] {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let mut w = RollupWriter::new(
            &RollupConfig::default(),
            dir.path().to_path_buf(),
            "bench".into(),
            BudgetHandle::default(),
        )
        .map_err(|e| e.to_string())?;
        let mut cpu = 0.0;
        let t = Instant::now();
        let n = design_stream(pattern, secs, |b| {
            let c0 = thread_cpu_s();
            w.push(b);
            cpu += thread_cpu_s() - c0;
        });
        let wall = t.elapsed().as_secs_f64();
        w.finish();
        let rate = n as f64 / cpu;
        acc_rates.push(rate);
        let b1 = tier_bytes(dir.path(), "1s");
        let b60 = tier_bytes(dir.path(), "1m");
        eprintln!(
            "rollup: {pattern:?}: {secs} s of switch time ({:.0} M counters) in {wall:.1} s; rollup {:.0} M counters per CPU-s; 1s tier {b1} B, 1m tier {b60} B",
            n as f64 / 1e6,
            rate / 1e6
        );
        per_load.insert(
            format!("{pattern:?}").to_lowercase(),
            json!({"1s_bytes": b1, "1m_bytes": b60, "secs": secs}),
        );
    }
    Ok(json!({
        "bench": "rollup",
        "accumulate_counters_per_cpu_s": acc_rates,
        "loads": per_load,
    }))
}
