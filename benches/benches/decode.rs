//! Criterion microbenchmark of the decode hot loop: design-rate messages (64 ports × 30 stats,
//! 4 snapshots per message) through `Decoder::decode`, with the selected and the portable
//! big-endian copy.
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use stel_ingest::decode::{portable_bswap, select_bswap};

fn decode(c: &mut Criterion) {
    let (_, data, emu) = stel_benches::design_messages(100);
    let mut g = c.benchmark_group("decode");
    g.throughput(Throughput::Elements(emu.truth.samples));
    let (best, name) = select_bswap();
    for (label, f) in [(name, best), ("portable", portable_bswap as _)] {
        let mut d = stel_benches::design_decoder(&emu, Some(f));
        let mut spare = Vec::new();
        g.bench_function(format!("design_64x30_{label}"), |b| {
            b.iter(|| stel_benches::decode_pass(&mut d, &data, &mut spare))
        });
    }
    g.finish();
}

criterion_group!(benches, decode);
criterion_main!(benches);
