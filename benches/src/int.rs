//! `stel-bench int`: INT report decode on one core, and the INT source end to end.
//!
//! Workload: AmLight/NoviFlow 5-hop reports (Telemetry Report v1.0 + VLAN + IPv4 + UDP + INT
//! v1.0, Hop ML 6: 202-byte UDP payloads) from `stel-emu int`'s generator, 1024 flows on 12
//! switches, with path changes and congestion, EVC map loaded (every report attributed).
//!
//! Decode figures are per CPU-second of the measuring thread (`/proc/thread-self/schedstat`):
//! "on one core" even when a shared box preempts the thread (`reports_per_wall_s`: the same
//! runs by the wall clock).
//!
//! * `reports_per_s`: `IntDecoder` on the decode core — every report validated, decoded into
//!   the three tables' column buffers, loss per (switch, hw_id), per-flow path/latency state,
//!   EVC attribution; fed as the daemon's receive loop feeds it, `IntDecoder::decode_batch` of
//!   64 datagrams at a time (a GRO buffer's worth). `reports_per_s_1hop`: the same for 1-hop
//!   reports.
//!   `transpose_reports_per_s`: those batches as Arrow record batches split per (switch,
//!   hour) (`IntBatch::finish_split`: what `ArrowWriter` needs as input; the daemon's writer
//!   no longer builds them).
//! * `encode_reports_per_cpu_s`: the INT sink's writer work on the 5-hop batches, as the writer
//!   does it (`store::int::encode::encode_batches`): batch after batch, split per (table,
//!   switch, hour) (`IntBatch::split`, a mixed batch's rows regrouped column by column), each
//!   piece encoded straight from the column buffers by the column-chunk encoder into its file
//!   (kept open across batches), one file per (table, switch, hour), footers included; `encode_arrow_writer_reports_per_cpu_s` parquet's `ArrowWriter` on the
//!   transposed record batches (transpose not counted) with the properties the sink used
//!   before (same run, `encode_ratio_vs_arrow_writer`), and the bytes per report of both
//!   (`encode_bytes_per_report`, …). `STEL_INT_ENCODE_ONLY=1`: stop after these (profiling
//!   the encoder).
//! * baseline: a plain per-report parse in the shape of the existing collectors (INTCollector /
//!   AmLight's int_collector): bounds-checked slices into one owned struct per report with a
//!   `Vec` of hops, pushed onto a `Vec` — no columns, no loss, no flow state, no EVC.
//! * `ratio_vs_baseline` (`_1hop`) = the two medians of the same run.
//! * `STEL_INT_DECODE_ONLY=1`: stop here (profiling the decoder). `STEL_INT_BATCH`: reports per
//!   batch the decoder hands over (default `[int.decode] batch_reports`), decode and end to end.
//!   `STEL_INT_SLOTS`: the INT socket's receive slots (default `[int] slots`), end to end.
//!   `STEL_INT_KEEP=<dir>`: keep each end-to-end run's Parquet files in `<dir>/plain` and
//!   `<dir>/coalesced` (on the same file system as the temp dir; for looking at the bytes).
//!
//! * end to end, twice: a stream of 1 M (`--quick`; else 4 M) reports of the same network,
//!   split by reporting switch among `STEL_INT_SENDERS` sender threads (default 2), each with
//!   its own socket: every switch's reports arrive once and in order, from one sender, as from
//!   a switch. They are sent to a loopback UDP socket of the daemon's INT source
//!   (`ingest::int::source`: io_uring reader with UDP GRO, decoder, INT Parquet sink into a temp
//!   dir), keeping at most 100 k reports in flight (so the figure is the collector's, not the
//!   kernel dropping what outruns it), until every report is decoded or counted:
//!   - plain: one datagram per report, `sendmmsg` of 64 (what a switch behind a NIC without
//!     GRO delivers): `e2e_reports_per_cpu_s`, `e2e_reports_per_s`;
//!   - coalesced: UDP GSO (`UDP_SEGMENT`) buffers of up to 64 same-size reports of one switch,
//!     sent from that switch's own socket (GRO merges only one flow's datagrams, and a switch
//!     sends from its own address), the switches in turn; handed to the GRO socket whole and
//!     cut on the decode thread: `e2e_reports_per_cpu_s_coalesced`, ….
//!
//!   `e2e_reports_per_cpu_s*` = reports decoded per CPU-second of the collector's threads: the
//!   process less the sender threads (on loopback the kernel delivers in the senders' context,
//!   so their CPU holds the kernel's receive path too) and less the bench's own thread (it polls
//!   the decoder's progress every ms for the senders' window): receive + decode + the Parquet
//!   sink incl. its final flush; `e2e_cpu_s_by_thread*` splits it by thread (`stel-int-0`:
//!   receive + decode; `stel-int-parquet`: the writer, the rest, all of its work counted however
//!   far behind the decoder it was), `e2e_int_thread_ns_per_report*` and
//!   `e2e_writer_ns_per_report*` are the two per report (the decode share of the first is
//!   `1 / reports_per_s`), `e2e_batches*` the batches the decoder handed over. `lost` = sent −
//!   decoded (kernel drops, loopback backlog drops, truncation, malformed: all counted);
//!   `unaccounted` = sent − decoded − every counted loss (must be 0); `e2e_sink_shed_rows`: rows
//!   the sink shed (its writer behind). Baseline: a plain `recv` loop + the per-report parse on
//!   one plain sender (`e2e_ratio_vs_baseline`).

use std::{
    net::UdpSocket,
    sync::Arc,
    time::{Duration, Instant},
};

use serde_json::{json, Value};
use stel_emu::int::{Format, GenConfig, Generator};
use stel_ingest::int::{
    evc::EvcMap,
    source::{bind, IntConfig, IntSource},
    IntBatch, IntDecodeConfig, IntDecoder, IntSink,
};
use stel_store::int::Table;

/// Counts rows and keeps the first batches, [`KEEP_REPORTS`] reports' worth whatever the batch
/// size (the transpose and the encoders are measured on them afterwards; in the daemon they
/// run on the sink's thread); the others go back to the batch pool as the daemon's writer
/// hands them back.
struct KeepSink(u64, Vec<IntBatch>);
/// Reports the encode figures are measured on (files of ~8 k reports per switch and table).
const KEEP_REPORTS: usize = 100_000;
impl IntSink for KeepSink {
    fn on_batch(&mut self, b: IntBatch) {
        self.0 += b.reports.rows() as u64;
        if self.1.iter().map(|b| b.reports.rows()).sum::<usize>() < KEEP_REPORTS {
            self.1.push(b);
        } else {
            // What the daemon's writer does once a batch is written.
            b.recycle();
        }
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// The workload: payloads laid end to end, and their offsets.
pub fn amlight_reports(n: usize, hops: usize) -> (Vec<u8>, Offsets, Generator) {
    let (data, mut streams, g) = amlight_streams(n, hops, 1);
    (data, streams.pop().unwrap_or_default().offs, g)
}

/// Where each report of a workload is in its payload buffer: (offset, length).
type Offsets = Vec<(usize, usize)>;

/// What one sender sends: its switches' reports in the order the network produced them, and
/// each one's reporting switch.
#[derive(Debug, Default, Clone)]
struct Stream {
    offs: Offsets,
    switch: Vec<u32>,
}

/// `n` reports of one network, payloads laid end to end, split into `k` [`Stream`]s by
/// reporting switch (switch id mod `k`): each holds whole per-switch streams in order, so `k`
/// senders sending one each deliver every switch's reports in their order, each report once —
/// as switches do.
fn amlight_streams(n: usize, hops: usize, k: usize) -> (Vec<u8>, Vec<Stream>, Generator) {
    let k = k.max(1);
    let mut g = Generator::new(GenConfig {
        format: Format::Amlight,
        flows: 1024,
        min_hops: hops,
        max_hops: hops,
        switches: 12,
        path_change_every: 100,
        congestion_rate: 0.05,
        ..GenConfig::default()
    });
    let mut data = Vec::with_capacity(n * 210);
    let mut streams = vec![Stream::default(); k];
    let mut buf = Vec::new();
    for _ in 0..n {
        let p = g.next_packet(&mut buf);
        let st = &mut streams[p.switch_id as usize % k];
        st.offs.push((data.len(), p.payload.len()));
        st.switch.push(p.switch_id);
        data.extend_from_slice(p.payload);
    }
    (data, streams, g)
}

#[derive(Debug, Default)]
#[expect(
    dead_code,
    reason = "the baseline parses every field like a collector would; nothing reads them"
)]
struct BaseHop {
    switch_id: u32,
    in_port: u16,
    out_port: u16,
    hop_latency: u32,
    queue_id: u8,
    queue_occupancy: u32,
    ingress_ts: u32,
    egress_ts: u32,
}

#[derive(Debug, Default)]
#[expect(
    dead_code,
    reason = "the baseline parses every field like a collector would; nothing reads them"
)]
struct BaseReport {
    switch_id: u32,
    seq: u32,
    ingress_ts: u32,
    vlan: u16,
    src: u32,
    dst: u32,
    sport: u16,
    dport: u16,
    hops: Vec<BaseHop>,
}

fn be16(b: &[u8], o: usize) -> Option<u16> {
    Some(u16::from_be_bytes(b.get(o..o + 2)?.try_into().ok()?))
}
fn be32(b: &[u8], o: usize) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(o..o + 4)?.try_into().ok()?))
}

/// The baseline: one AmLight report → one owned struct (bounds-checked, AmLight layout only).
fn baseline_parse(p: &[u8]) -> Option<BaseReport> {
    if p.first()? >> 4 != 1 {
        return None;
    }
    let mut r = BaseReport {
        switch_id: be32(p, 4)?,
        seq: be32(p, 8)?,
        ingress_ts: be32(p, 12)?,
        ..BaseReport::default()
    };
    let mut o = 16 + 12;
    if be16(p, o)? == 0x8100 {
        r.vlan = be16(p, o + 2)? & 0x0fff;
        o += 4;
    }
    o += 2;
    let ihl = usize::from(p.get(o)? & 0x0f) * 4;
    r.src = be32(p, o + 12)?;
    r.dst = be32(p, o + 16)?;
    o += ihl;
    r.sport = be16(p, o)?;
    r.dport = be16(p, o + 2)?;
    o += 8;
    let len = usize::from(*p.get(o + 2)?) * 4;
    let ml = usize::from(p.get(o + 6)? & 0x1f) * 4;
    if ml == 0 {
        return None;
    }
    let n = len.checked_sub(12)? / ml;
    o += 12;
    r.hops = Vec::with_capacity(n);
    for i in 0..n {
        let h = o + i * ml;
        let ports = be32(p, h + 4)?;
        let q = be32(p, h + 12)?;
        r.hops.push(BaseHop {
            switch_id: be32(p, h)?,
            in_port: (ports >> 16) as u16,
            out_port: ports as u16,
            hop_latency: be32(p, h + 8)?,
            queue_id: (q >> 24) as u8,
            queue_occupancy: q & 0xff_ffff,
            ingress_ts: be32(p, h + 16)?,
            egress_ts: be32(p, h + 20)?,
        });
    }
    Some(r)
}

/// AmLight's decoder settings; `STEL_INT_BATCH` sets the reports per batch handed to the sink
/// (decode and end to end).
fn decode_config() -> IntDecodeConfig {
    let mut c = IntDecodeConfig::amlight();
    if let Some(n) = std::env::var("STEL_INT_BATCH")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        c.batch_reports = n;
    }
    c
}

/// Decode figures of one workload (`hops` per report), medians of `runs`.
struct DecodeRates {
    /// Reports per CPU-second of the decoding thread.
    ours: f64,
    ours_wall: f64,
    /// The baseline parse, same reports, same run.
    base: f64,
    /// Rows → Arrow on the sink's side, reports per CPU-second.
    finish: f64,
    /// Those record batches, per (table, switch, hour), and the reports in them.
    pieces: Vec<(Table, u32, i64, arrow_array::RecordBatch)>,
    /// The decoder's batches those record batches came from.
    kept: Vec<IntBatch>,
    kept_reports: usize,
    bytes_per_report: f64,
    reports: usize,
    g: Generator,
}

fn decode_rates(hops: usize, n: usize, runs: usize, passes: usize) -> Result<DecodeRates, String> {
    let (data, offs, g) = amlight_reports(n, hops);
    let mut map = EvcMap::default();
    map.add_kytos_json(&g.kytos_evcs_json())
        .map_err(|e| format!("evc map: {e}"))?;
    let map = Arc::new(map);
    eprintln!(
        "int: {n} AmLight {hops}-hop reports ({:.0} B each), {runs} runs × {passes} passes",
        data.len() as f64 / n as f64
    );
    let src = "10.0.0.1".parse().map_err(|e| format!("{e}"))?;

    let mut d = IntDecoder::new(decode_config());
    d.set_evc_map(Arc::clone(&map));
    let mut sink = KeepSink(0, Vec::new());
    let mut ts = 1_700_000_000_000_000_000i64;
    let mut pass = |d: &mut IntDecoder, sink: &mut KeepSink| {
        // In receive batches of 64 datagrams (a GRO buffer's worth at most), as the daemon's
        // receive loop hands them over.
        for chunk in offs.chunks(64) {
            let batch = chunk.iter().map(|&(o, l)| {
                ts += 100;
                (src, ts, &data[o..o + l])
            });
            d.decode_batch(batch, sink);
        }
        d.flush(ts, sink);
    };
    pass(&mut d, &mut sink); // warm-up: flow table, buffers
    let mut ours = Vec::new();
    let mut ours_wall = Vec::new();
    for _ in 0..runs {
        let (t, c) = (Instant::now(), crate::parquet::thread_cpu_s());
        for _ in 0..passes {
            pass(&mut d, &mut sink);
        }
        let cpu = (crate::parquet::thread_cpu_s() - c).max(1e-6);
        ours.push((n * passes) as f64 / cpu);
        ours_wall.push((n * passes) as f64 / t.elapsed().as_secs_f64());
    }
    let s = d.stats();
    let total = (n * passes * runs + n) as u64;
    if s.reports_decoded != total || s.reports_malformed != 0 || s.evc_matched != total {
        return Err(format!("decoder miscounted: {s:?}"));
    }
    if sink.0 != total {
        return Err(format!("{} rows for {total} reports", sink.0));
    }

    // The transpose (rows → Arrow columns) on the kept batches: ArrowWriter's input.
    let kept = std::mem::take(&mut sink.1);
    let mut transposed = kept.clone();
    let kept_rows: usize = kept.iter().map(|b| b.reports.rows()).sum();
    let c = crate::parquet::thread_cpu_s();
    let mut pieces = Vec::new();
    for b in &mut transposed {
        pieces.extend(b.finish_split().map_err(|e| format!("finish: {e}"))?);
    }
    let finish = kept_rows as f64 / (crate::parquet::thread_cpu_s() - c).max(1e-6);

    let mut base = Vec::new();
    let mut out: Vec<BaseReport> = Vec::with_capacity(8192);
    let mut parsed = 0u64;
    for _ in 0..runs {
        let c = crate::parquet::thread_cpu_s();
        for _ in 0..passes {
            for &(o, l) in &offs {
                if let Some(r) = baseline_parse(&data[o..o + l]) {
                    out.push(r);
                    parsed += 1;
                }
                if out.len() == 8192 {
                    std::hint::black_box(&out);
                    out.clear();
                }
            }
        }
        base.push((n * passes) as f64 / (crate::parquet::thread_cpu_s() - c).max(1e-6));
    }
    if parsed != (n * passes * runs) as u64 {
        return Err(format!("baseline parsed {parsed}"));
    }
    let r = DecodeRates {
        ours: median(ours),
        ours_wall: median(ours_wall),
        base: median(base),
        finish,
        pieces,
        kept,
        kept_reports: kept_rows,
        bytes_per_report: data.len() as f64 / n as f64,
        reports: n * passes,
        g,
    };
    eprintln!(
        "int: {hops}-hop: stel {:.2} M reports/s, baseline per-report parse {:.2} M reports/s (ratio {:.2}); to Arrow (sink thread) {:.2} M reports/s",
        r.ours / 1e6,
        r.base / 1e6,
        r.ours / r.base,
        r.finish / 1e6
    );
    Ok(r)
}

/// Runs the bench. `STEL_INT_DECODE_ONLY=1`: the decode figures only (for profiling).
///
/// # Errors
/// A decoder that miscounts (the figures would mean nothing).
pub fn bench(quick: bool) -> Result<Value, String> {
    let (runs, n, passes) = if quick {
        (5, 100_000, 10)
    } else {
        (9, 200_000, 20)
    };
    let hops = 5;
    let one = decode_rates(1, n, runs, passes)?;
    let five = decode_rates(hops, n, runs, passes)?;
    let (data, offs, g) = amlight_reports(n, hops);
    debug_assert_eq!(g.kytos_evcs_json(), five.g.kytos_evcs_json());
    let decode_only = json!({
        "bench": "int",
        "reports_per_s": five.ours.round(),
        "reports_per_wall_s": five.ours_wall.round(),
        "hops_per_report": hops,
        "bytes_per_report": five.bytes_per_report.round(),
        "baseline_reports_per_s": five.base.round(),
        "transpose_reports_per_s": five.finish.round(),
        "ratio_vs_baseline": (five.ours / five.base * 100.0).round() / 100.0,
        "reports_per_s_1hop": one.ours.round(),
        "baseline_reports_per_s_1hop": one.base.round(),
        "ratio_vs_baseline_1hop": (one.ours / one.base * 100.0).round() / 100.0,
        "runs": runs,
        "reports_per_run": five.reports,
    });
    if std::env::var_os("STEL_INT_DECODE_ONLY").is_some() {
        return Ok(decode_only);
    }
    let enc = encode_bench(&five.kept, &five.pieces, five.kept_reports, runs)?;
    let mut decode_only = decode_only;
    for (k, v) in [
        ("encode_reports_per_cpu_s", enc.ours.round()),
        ("encode_arrow_writer_reports_per_cpu_s", enc.arrow.round()),
        (
            "encode_ratio_vs_arrow_writer",
            (enc.ours / enc.arrow * 100.0).round() / 100.0,
        ),
        (
            "encode_bytes_per_report",
            (enc.ours_bytes * 10.0).round() / 10.0,
        ),
        (
            "encode_arrow_writer_bytes_per_report",
            (enc.arrow_bytes * 10.0).round() / 10.0,
        ),
    ] {
        decode_only[k] = json!(v);
    }
    if std::env::var_os("STEL_INT_ENCODE_ONLY").is_some() {
        return Ok(decode_only);
    }
    let e2e_n = if quick { 1_000_000 } else { 4_000_000 };
    let evcs = g.kytos_evcs_json();
    let (stream_data, streams, sg) = amlight_streams(e2e_n, hops, senders());
    debug_assert_eq!(sg.kytos_evcs_json(), evcs);
    let e2e = e2e_run(&stream_data, &streams, &evcs, Wire::Plain)?;
    let gro = e2e_run(&stream_data, &streams, &evcs, Wire::Coalesced)?;
    drop(stream_data);
    let (e2e_base, e2e_base_cpu) = e2e_baseline(&data, &offs, e2e_n)?;
    for (what, e) in [("plain", &e2e), ("coalesced (UDP GSO -> GRO)", &gro)] {
        eprintln!(
            "int: end to end {what} (UDP -> INT source -> Parquet, {} senders): {:.2} M reports/s ({:.2} M per daemon CPU-second; INT thread {:.0} ns/report, writer {:.0} ns/report), senders {:.2} M/s, {} sent, {} lost ({} kernel drops, {} backlog drops), {} unaccounted, {} rows written ({} shed by the sink), GRO {} datagrams in {} receives, {} batches to the sink; daemon CPU-s by thread {:?}",
            senders(),
            e.rate / 1e6,
            e.per_cpu_s / 1e6,
            e.int_thread_ns_per_report,
            e.writer_ns_per_report,
            e.send_rate / 1e6,
            e.sent,
            e.lost,
            e.kernel_drops,
            e.backlog_drops,
            e.unaccounted,
            e.rows_written,
            e.sink_shed_rows,
            e.gro_datagrams,
            e.gro_receives,
            e.batches,
            e.threads,
        );
    }
    eprintln!(
        "int: baseline recv + parse {:.2} M reports/s ({:.2} M per CPU-second)",
        e2e_base / 1e6,
        e2e_base_cpu / 1e6
    );
    let threads = |e: &E2e| -> Value {
        Value::Object(
            e.threads
                .iter()
                .map(|(k, v)| (k.clone(), json!((v * 1000.0).round() / 1000.0)))
                .collect(),
        )
    };
    let mut out = decode_only;
    let e = json!({
        "e2e_reports_per_s": e2e.rate.round(),
        "e2e_baseline_reports_per_s": e2e_base.round(),
        "e2e_ratio_vs_baseline": (e2e.rate / e2e_base * 100.0).round() / 100.0,
        "e2e_reports_per_cpu_s": e2e.per_cpu_s.round(),
        "e2e_reports_per_cpu_s_coalesced": gro.per_cpu_s.round(),
        "e2e_reports_per_s_coalesced": gro.rate.round(),
        "e2e_int_thread_ns_per_report": e2e.int_thread_ns_per_report.round(),
        "e2e_int_thread_ns_per_report_coalesced": gro.int_thread_ns_per_report.round(),
        "e2e_writer_ns_per_report": e2e.writer_ns_per_report.round(),
        "e2e_writer_ns_per_report_coalesced": gro.writer_ns_per_report.round(),
        "e2e_cpu_s_by_thread": threads(&e2e),
        "e2e_cpu_s_by_thread_coalesced": threads(&gro),
        "e2e_batches": e2e.batches,
        "e2e_batches_coalesced": gro.batches,
        "e2e_gro_datagrams": gro.gro_datagrams,
        "e2e_gro_receives": gro.gro_receives,
        "e2e_baseline_reports_per_cpu_s": e2e_base_cpu.round(),
        "e2e_reports_sent": e2e.sent + gro.sent,
        "e2e_rows_written": e2e.rows_written,
        "e2e_parquet_bytes_per_report": (e2e.bytes_published as f64 / e2e.sent.max(1) as f64 * 10.0).round() / 10.0,
        "e2e_kernel_drops": e2e.kernel_drops + gro.kernel_drops,
        "e2e_backlog_drops": e2e.backlog_drops + gro.backlog_drops,
        "e2e_sink_shed_rows": e2e.sink_shed_rows + gro.sink_shed_rows,
        "e2e_sender_reports_per_s": e2e.send_rate.round(),
        "e2e_sender_reports_per_s_coalesced": gro.send_rate.round(),
        "e2e_senders": senders(),
        "e2e_reader": e2e.reader,
        "lost": e2e.lost + gro.lost,
        "unaccounted": e2e.unaccounted + gro.unaccounted,
    });
    if let (Some(o), Value::Object(e)) = (out.as_object_mut(), e) {
        o.extend(e);
    }
    Ok(out)
}

/// What one end-to-end run measured.
struct E2e {
    rate: f64,
    /// Reports decoded per CPU-second of everything but the sender threads (receive, decode,
    /// Parquet sink): what the collector would sustain on one core.
    per_cpu_s: f64,
    send_rate: f64,
    sent: u64,
    lost: u64,
    unaccounted: u64,
    kernel_drops: u64,
    /// Dropped before the socket (loopback backlog, [`softnet_drops`]): the box's, counted.
    backlog_drops: u64,
    /// Rows the INT sink shed (queue full / memory budget: the writer behind).
    sink_shed_rows: u64,
    rows_written: u64,
    bytes_published: u64,
    reader: &'static str,
    /// Datagrams that arrived coalesced by UDP GRO, and the receives that held them.
    gro_datagrams: u64,
    gro_receives: u64,
    /// CPU-seconds of the daemon's threads by name (senders left out).
    threads: Vec<(String, f64)>,
    /// CPU-seconds of the INT receive/decode thread(s), per report (ns).
    int_thread_ns_per_report: f64,
    /// CPU-seconds of the writer thread, per report (ns).
    writer_ns_per_report: f64,
    /// Batches the decoder handed to the sink (the writer's work comes in these).
    batches: u64,
}

/// Datagrams per `sendmmsg`; reports per UDP GSO buffer (the kernel's UDP_MAX_SEGMENTS is 64
/// on older kernels).
const SEND_BATCH: usize = 64;

/// How the senders put reports on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wire {
    /// One datagram per report (`sendmmsg` of [`SEND_BATCH`]): what a switch behind a NIC
    /// without GRO delivers.
    Plain,
    /// UDP GSO: buffers of [`SEND_BATCH`] same-size reports, cut into datagrams by the kernel
    /// (`UDP_SEGMENT`) and handed to the daemon's GRO socket whole.
    Coalesced,
}

/// Sender threads (`STEL_INT_SENDERS`, default 2): the sender must not be the bound.
fn senders() -> usize {
    std::env::var("STEL_INT_SENDERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2)
        .clamp(1, 16)
}

/// Reports the senders keep in flight (sent, not yet decoded) at most: the daemon's socket
/// buffer holds them, so the run measures the collector, not the kernel dropping what a
/// faster-than-the-daemon sender pushes (with GRO a dropped buffer is one kernel drop for up
/// to 64 reports).
const WINDOW: u64 = 100_000;

/// Flow control between the senders and the decoder: reports sent by all senders, and decoded.
#[derive(Debug, Default)]
struct Window {
    sent: std::sync::atomic::AtomicU64,
    decoded: std::sync::atomic::AtomicU64,
}

impl Window {
    /// Waits while `WINDOW` reports are in flight.
    fn wait(&self) {
        use std::sync::atomic::Ordering::Relaxed;
        while self.sent.load(Relaxed) > self.decoded.load(Relaxed) + WINDOW {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

/// Sends `n` reports (cycling through the workload from `start`) on `sock`; returns how many
/// the kernel took.
fn send_all(
    data: &[u8],
    offs: &[(usize, usize)],
    start: usize,
    n: usize,
    sock: &UdpSocket,
    wire: Wire,
    window: Option<&Window>,
) -> u64 {
    use std::os::fd::AsFd;
    let mut sent = 0u64;
    let mut batch: Vec<&[u8]> = Vec::with_capacity(SEND_BATCH);
    let mut gso: Vec<u8> = Vec::with_capacity(SEND_BATCH * 256);
    let mut it = offs.iter().cycle().skip(start).take(n).peekable();
    while it.peek().is_some() {
        let before = sent;
        if let Some(w) = window {
            w.wait();
        }
        match wire {
            Wire::Plain => {
                batch.clear();
                batch.extend(it.by_ref().take(SEND_BATCH).map(|&(o, l)| &data[o..o + l]));
                let mut done = 0;
                while done < batch.len() {
                    match stel_ingest::sys::send_many(sock.as_fd(), &batch[done..]) {
                        Ok(k) if k > 0 => {
                            sent += k as u64;
                            done += k;
                        }
                        // A full socket buffer on loopback is a kernel drop at the receiver,
                        // not a send error; an error here (ENOBUFS) is counted as one datagram
                        // not sent.
                        _ => done += 1,
                    }
                }
            }
            Wire::Coalesced => {
                // Same-size reports in one buffer (GSO cuts at `seg`; the last may be shorter).
                batch.clear();
                let seg = it.peek().map_or(0, |&&(_, l)| l);
                while batch.len() < SEND_BATCH {
                    match it.peek() {
                        Some(&&(o, l)) if l == seg => {
                            batch.push(&data[o..o + l]);
                            it.next();
                        }
                        _ => break,
                    }
                }
                sent += send_gso(sock, &batch, &mut gso);
            }
        }
        if let Some(w) = window {
            w.sent
                .fetch_add(sent - before, std::sync::atomic::Ordering::Relaxed);
        }
    }
    sent
}

/// Sends same-size `reports` as one UDP GSO buffer (cut by the kernel at their size; the last
/// may be shorter) through `gso`; returns how many the kernel took.
fn send_gso(sock: &UdpSocket, reports: &[&[u8]], gso: &mut Vec<u8>) -> u64 {
    use std::os::fd::AsFd;
    let Some(seg) = reports.first().map(|r| r.len()) else {
        return 0;
    };
    gso.clear();
    for r in reports {
        gso.extend_from_slice(r);
    }
    let seg = u16::try_from(seg).unwrap_or(u16::MAX);
    match stel_ingest::sys::send_many_gso(sock.as_fd(), &[gso.as_slice()], seg) {
        Ok(1) => reports.len() as u64,
        _ => 0,
    }
}

/// A sender's socket, connected to the daemon, and the reports it sends.
struct Lane {
    sock: UdpSocket,
    offs: Offsets,
}

/// The lanes of one sender: its whole stream from one socket, or (`per_switch`) each switch's
/// reports from a socket of its own, in order.
fn lanes(st: &Stream, per_switch: bool, to: std::net::SocketAddr) -> Result<Vec<Lane>, String> {
    let mut by: std::collections::BTreeMap<u32, Offsets> = Default::default();
    for (&o, &sw) in st.offs.iter().zip(&st.switch) {
        by.entry(if per_switch { sw } else { 0 })
            .or_default()
            .push(o);
    }
    by.into_values()
        .map(|offs| {
            let sock = UdpSocket::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
            sock.connect(to).map_err(|e| e.to_string())?;
            Ok(Lane { sock, offs })
        })
        .collect()
}

/// Sends every lane's reports in GSO buffers of up to [`SEND_BATCH`] same-size reports, the
/// lanes in turn. Returns how many reports the kernel took.
fn send_lanes(data: &[u8], lanes: &[Lane], window: &Window) -> u64 {
    let mut at = vec![0usize; lanes.len()];
    let (mut sent, mut batch, mut gso) = (0u64, Vec::with_capacity(SEND_BATCH), Vec::new());
    while lanes.iter().zip(&at).any(|(l, &a)| a < l.offs.len()) {
        for (lane, at) in lanes.iter().zip(&mut at) {
            // Same-size reports: the GSO segment size is the first one's.
            let rest = &lane.offs[(*at).min(lane.offs.len())..];
            let seg = rest.first().map_or(0, |&(_, l)| l);
            batch.clear();
            batch.extend(
                rest.iter()
                    .take(SEND_BATCH)
                    .take_while(|&&(_, l)| l == seg)
                    .map(|&(o, l)| &data[o..o + l]),
            );
            if batch.is_empty() {
                continue;
            }
            window.wait();
            let k = send_gso(&lane.sock, &batch, &mut gso);
            window
                .sent
                .fetch_add(k, std::sync::atomic::Ordering::Relaxed);
            sent += k;
            *at += batch.len();
        }
    }
    sent
}

/// Datagrams the kernel dropped before any socket (`/proc/net/softnet_stat`, column 2 summed
/// over CPUs): on loopback the senders' packets wait in a per-CPU backlog
/// (`net.core.netdev_max_backlog`) for the receive softirq, and several fast senders can
/// overflow it. Not the daemon's loss, but the bench must count it to account for every report.
fn softnet_drops() -> u64 {
    std::fs::read_to_string("/proc/net/softnet_stat")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| u64::from_str_radix(l.split_whitespace().nth(1)?, 16).ok())
        .sum()
}

/// (thread name, CPU-seconds) of every thread of this process (`/proc/self/task/*/schedstat`).
fn threads_cpu() -> Vec<(u64, String, f64)> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir("/proc/self/task") else {
        return out;
    };
    for e in rd.flatten() {
        let p = e.path();
        let tid = e.file_name().to_string_lossy().parse().unwrap_or(0);
        let name = std::fs::read_to_string(p.join("comm")).unwrap_or_default();
        let ns = std::fs::read_to_string(p.join("schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap_or(0);
        out.push((tid, name.trim().to_string(), ns as f64 / 1e9));
    }
    out
}

/// One end-to-end run: sender `i` sends `streams[i]` (offsets into `data`) once: plain from one
/// socket in the stream's order; coalesced from one socket per switch (GRO merges only
/// datagrams of one flow, and a switch sends from its own address), a GSO buffer of each switch
/// in turn.
fn e2e_run(data: &[u8], streams: &[Stream], evcs: &str, wire: Wire) -> Result<E2e, String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let evc_file = dir.path().join("evcs.json");
    std::fs::write(&evc_file, evcs).map_err(|e| e.to_string())?;
    let mut cfg = IntConfig {
        listen: vec!["127.0.0.1:0".parse().map_err(|e| format!("{e}"))?],
        publish_ms: 10,
        decode: decode_config(),
        ..IntConfig::default()
    };
    cfg.parquet.dir = dir.path().join("data");
    if let Some(n) = std::env::var("STEL_INT_SLOTS")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        cfg.slots = n;
    }
    if let Some(c) = codec_from_env() {
        cfg.parquet.compression = c;
    }
    cfg.evc.kytos_evcs = Some(evc_file);
    let (socks, _) = bind(&cfg).map_err(|e| e.to_string())?;
    let before: Vec<(u64, String, f64)> = threads_cpu();
    let src = IntSource::start(&cfg, socks, dir.path()).map_err(|e| e.to_string())?;
    let to = src.local_addrs[0];
    let senders: Vec<Vec<Lane>> = streams
        .iter()
        .map(|st| lanes(st, wire == Wire::Coalesced, to))
        .collect::<Result<_, String>>()?;
    let t = Instant::now();
    let cpu0 = crate::parquet::process_cpu_s();
    // This thread polls the decoder's progress every ms for the senders' window: the bench's
    // flow control, not the collector's work (the daemon reads its figures once a second).
    let main0 = crate::parquet::thread_cpu_s();
    let backlog0 = softnet_drops();
    let window = Window::default();
    let (sent, send_s, send_cpu) = std::thread::scope(|sc| {
        let hs: Vec<_> = senders
            .iter()
            .map(|lanes| {
                let window = &window;
                sc.spawn(move || {
                    let t = Instant::now();
                    let c = crate::parquet::thread_cpu_s();
                    let s = match (wire, &lanes[..]) {
                        (Wire::Plain, [l]) => {
                            send_all(data, &l.offs, 0, l.offs.len(), &l.sock, wire, Some(window))
                        }
                        // One lane per plain sender; none when its stream is empty.
                        (Wire::Plain, _) => 0,
                        (Wire::Coalesced, _) => send_lanes(data, lanes, window),
                    };
                    (
                        s,
                        t.elapsed().as_secs_f64(),
                        crate::parquet::thread_cpu_s() - c,
                    )
                })
            })
            .collect();
        // The decoder's progress for the senders' window (the INT thread publishes every
        // `publish_ms`).
        while !hs.iter().all(|h| h.is_finished()) {
            window.decoded.store(
                src.stats().decode.reports,
                std::sync::atomic::Ordering::Relaxed,
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        hs.into_iter()
            .map(|h| h.join().unwrap_or((0, 1.0, 0.0)))
            .fold((0, 0.0f64, 0.0), |(a, b, c), (x, y, z)| {
                (a + x, b.max(y), c + z)
            })
    });
    // Everything sent is in the socket buffer or counted as dropped: wait for the decoder.
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut last_decode = t.elapsed();
    loop {
        let s = src.stats();
        // Kernel drops count skbs: with GRO one may hold many reports (the check below
        // then fails loudly rather than hiding them).
        let done = s.decode.reports
            + s.kernel_drops
            + s.recv.truncated
            + softnet_drops().saturating_sub(backlog0);
        if done >= sent {
            last_decode = last_decode.max(t.elapsed());
            break;
        }
        if Instant::now() > deadline {
            return Err(format!(
                "INT source stuck: {done} of {sent} reports ({wire:?}; backlog drops {}; {s:?})",
                softnet_drops().saturating_sub(backlog0)
            ));
        }
        std::thread::sleep(Duration::from_millis(1));
        last_decode = t.elapsed();
    }
    let reader = src.stats().reader;
    // The receive/decode threads' CPU before they exit (they are done: everything sent is
    // decoded or counted).
    let after = threads_cpu();
    let fin = src.shutdown();
    if let Some(keep) = std::env::var_os("STEL_INT_KEEP") {
        let to = std::path::Path::new(&keep).join(format!("{wire:?}").to_lowercase());
        std::fs::create_dir_all(&keep).map_err(|e| format!("STEL_INT_KEEP {keep:?}: {e}"))?;
        std::fs::rename(dir.path().join("data"), &to)
            .map_err(|e| format!("STEL_INT_KEEP: moving the files to {}: {e}", to.display()))?;
        eprintln!("int: end to end {wire:?}: files kept in {}", to.display());
    }
    eprintln!(
        "int: end to end {wire:?}: {} datagrams in {} receive waits, {} of which ran out of slots",
        fin.recv.datagrams, fin.recv.polls, fin.recv.rearms_no_buffers
    );
    let main_cpu = crate::parquet::thread_cpu_s() - main0;
    let receiver_cpu = (crate::parquet::process_cpu_s() - cpu0 - send_cpu - main_cpu).max(1e-3);
    let decoded = fin.decode.reports_decoded;
    let backlog_drops = softnet_drops().saturating_sub(backlog0);
    let counted =
        fin.kernel_drops + fin.recv.truncated + fin.decode.reports_malformed + backlog_drops;
    let mut by_name: std::collections::BTreeMap<String, f64> = Default::default();
    for (tid, name, cpu) in &after {
        if name.starts_with("stel-int") {
            let b = before
                .iter()
                .find(|(t, _, _)| t == tid)
                .map_or(0.0, |x| x.2);
            *by_name.entry(name.clone()).or_default() += cpu - b;
        }
    }
    let int_thread: f64 = by_name
        .iter()
        .filter(|(k, _)| k.starts_with("stel-int-") && k[9..].parse::<u32>().is_ok())
        .map(|(_, v)| v)
        .sum();
    // The writer thread: the rest of the collector's CPU. Read before shutdown it missed what
    // the writer still had queued when the decoder was done (a writer behind a fast decoder:
    // most of its work) and the final publish.
    by_name.retain(|k, _| !k.starts_with("stel-int-parque"));
    by_name.insert(
        "stel-int-parquet".into(),
        (receiver_cpu - int_thread).max(0.0),
    );
    Ok(E2e {
        rate: decoded as f64 / last_decode.as_secs_f64(),
        per_cpu_s: decoded as f64 / receiver_cpu,
        send_rate: sent as f64 / send_s,
        sent,
        lost: sent.saturating_sub(decoded),
        unaccounted: sent.saturating_sub(decoded + counted),
        kernel_drops: fin.kernel_drops,
        backlog_drops,
        sink_shed_rows: fin.sink.shed_rows(),
        rows_written: fin.sink.rows_written,
        bytes_published: fin.sink.bytes_published,
        reader,
        gro_datagrams: fin.decode.gro_datagrams,
        gro_receives: fin.decode.gro_receives,
        threads: by_name.into_iter().collect(),
        int_thread_ns_per_report: int_thread * 1e9 / decoded.max(1) as f64,
        writer_ns_per_report: (receiver_cpu - int_thread).max(0.0) * 1e9 / decoded.max(1) as f64,
        batches: fin.decode.batches,
    })
}

/// The baseline receiver: plain `recv` per datagram + the per-report parse, same sender.
/// Returns (reports/s, reports per receiver CPU-second).
fn e2e_baseline(data: &[u8], offs: &[(usize, usize)], n: usize) -> Result<(f64, f64), String> {
    let rx = UdpSocket::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    {
        use std::os::fd::AsFd;
        stel_ingest::sys::set_rcvbuf(rx.as_fd(), 64 << 20).map_err(|e| e.to_string())?;
    }
    rx.set_read_timeout(Some(Duration::from_millis(200)))
        .map_err(|e| e.to_string())?;
    let to = rx.local_addr().map_err(|e| e.to_string())?;
    let tx = UdpSocket::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    tx.connect(to).map_err(|e| e.to_string())?;
    let t = Instant::now();
    let (parsed, end, cpu) = std::thread::scope(|sc| {
        let h = sc.spawn(|| send_all(data, offs, 0, n, &tx, Wire::Plain, None));
        let c0 = crate::parquet::thread_cpu_s();
        let mut buf = vec![0u8; 65536];
        let mut out: Vec<BaseReport> = Vec::with_capacity(8192);
        let mut parsed = 0u64;
        let mut end = t.elapsed();
        loop {
            match rx.recv(&mut buf) {
                Ok(l) => {
                    if let Some(r) = baseline_parse(&buf[..l]) {
                        out.push(r);
                        parsed += 1;
                        end = t.elapsed();
                    }
                    if out.len() == 8192 {
                        std::hint::black_box(&out);
                        out.clear();
                    }
                }
                // The sender is done and the socket stayed empty for the timeout.
                Err(_) if h.is_finished() => break,
                Err(_) => {}
            }
        }
        let cpu = crate::parquet::thread_cpu_s() - c0;
        let _ = h.join();
        (parsed, end, cpu)
    });
    // The receive timeout at the end is idle time, not CPU.
    Ok((
        parsed as f64 / end.as_secs_f64(),
        parsed as f64 / cpu.max(1e-3),
    ))
}

/// `STEL_INT_CODEC=lz4|zstd|none`: the INT sink's codec for the encode and end-to-end figures
/// (default: the sink's default).
fn codec_from_env() -> Option<stel_store::parquet::Codec> {
    use stel_store::parquet::Codec;
    match std::env::var("STEL_INT_CODEC").as_deref() {
        Ok("lz4") => Some(Codec::Lz4),
        Ok("zstd") => Some(Codec::Zstd),
        Ok("none") => Some(Codec::None),
        _ => None,
    }
}

/// The INT sink's encoder against parquet's `ArrowWriter` on the same record batches (the
/// decoder's, split per table and switch as the writer splits them), one core each.
struct Encode {
    /// Reports per CPU-second of the encoding thread (all three tables, footers included).
    ours: f64,
    arrow: f64,
    /// Bytes of the encoded files per report.
    ours_bytes: f64,
    arrow_bytes: f64,
}

fn encode_bench(
    kept: &[IntBatch],
    pieces: &[(Table, u32, i64, arrow_array::RecordBatch)],
    reports: usize,
    runs: usize,
) -> Result<Encode, String> {
    use std::collections::BTreeMap;
    use stel_store::int::{encode, IntSinkConfig};
    let mut files: BTreeMap<(Table, u32), Vec<arrow_array::RecordBatch>> = BTreeMap::new();
    for (t, sw, _, rb) in pieces {
        files.entry((*t, *sw)).or_default().push(rb.clone());
    }
    let mut cfg = IntSinkConfig::default();
    if let Some(c) = codec_from_env() {
        cfg.compression = c;
    }
    // Ours: what the writer thread does with a batch (split per table, switch and hour, each
    // piece encoded from the batch's buffers into its file), one file per (table, switch,
    // hour).
    let mut rates = Vec::new();
    let mut ours_bytes = 0;
    for _ in 0..runs {
        let c = crate::parquet::thread_cpu_s();
        ours_bytes = encode::encode_batches(kept, &cfg)
            .map_err(|e| format!("encode: {e}"))?
            .iter()
            .map(|(_, f)| f.len())
            .sum();
        rates.push(reports as f64 / (crate::parquet::thread_cpu_s() - c).max(1e-6));
    }
    let (ours, ours_bytes) = (median(rates), ours_bytes as f64 / reports as f64);
    let mut rates = Vec::new();
    let mut bytes = 0;
    for _ in 0..runs {
        let c = crate::parquet::thread_cpu_s();
        bytes = 0;
        for ((t, _), batches) in &files {
            bytes += encode::encode_with_arrow_writer(*t, batches, &cfg)
                .map_err(|e| format!("encode: {e}"))?
                .len();
        }
        rates.push(reports as f64 / (crate::parquet::thread_cpu_s() - c).max(1e-6));
    }
    let (arrow, arrow_bytes) = (median(rates), bytes as f64 / reports as f64);
    eprintln!(
        "int: encode (sink thread) {:.2} M reports per CPU-second, {ours_bytes:.1} B/report; ArrowWriter {:.2} M, {arrow_bytes:.1} B/report; ratio {:.1}",
        ours / 1e6,
        arrow / 1e6,
        ours / arrow
    );
    Ok(Encode {
        ours,
        arrow,
        ours_bytes,
        arrow_bytes,
    })
}
