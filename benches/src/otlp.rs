//! `stel-bench otlp`: the OTLP sink exporting the design session's counters (64 ports × 30
//! stats) to a real local OTLP/gRPC receiver, on this machine's 2 cores.
//!
//! - The receiver is an HTTP/2 gRPC server (h2) in this process, on its own thread
//!   (`otlp-recv`, a current-thread runtime): it answers `MetricsService/Export` with an
//!   `ExportMetricsServiceResponse`, walks every request's protobuf to the data points
//!   (`stel_store::otlp::count_points`: resource → scope → metric → sum/gauge → point, checking
//!   wire types and lengths) and counts them and their values.
//! - The sink is the daemon's: queue → exporter thread → tonic on its I/O thread. The feeder
//!   replays decoded design-rate batches as fast as the queue takes them (it waits for room, so
//!   nothing is shed and the figure is the exporter's capacity).
//! - `points_per_s`: points the receiver acknowledged / time from the first submit to the
//!   sink's shutdown (everything acknowledged). `receiver_points` must equal the sink's
//!   delivered count, and received = delivered + `dropped` (every point accounted for), with
//!   the receiver's value checksum equal to the sum of the values sent.
//! - CPU: the receiver thread's share of the box (2 cores), and the sender's (exporter + I/O
//!   thread) CPU per million points.
//! - `encode_points_per_s`: the encoder alone on one core (no transport), for where it stops.
use std::{
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering::Relaxed},
        Arc,
    },
    time::{Duration, Instant},
};

use bytes::{Bytes, BytesMut};
use serde_json::json;
use stel_ingest::decode::CounterBatch as DecodedBatch;
use stel_store::{
    otlp::{count_points, encode_requests, MetricNames, OtlpConfig, OtlpSink, WhenFull},
    CounterBatch,
};

use crate::parquet::process_cpu_s;

/// What the receiver counted.
#[derive(Debug, Default)]
pub struct RecvCounts {
    pub requests: AtomicU64,
    pub points: AtomicU64,
    pub value_sum: AtomicU64,
    pub bytes: AtomicU64,
    pub malformed: AtomicU64,
    /// Linux thread id of the receiver thread (for its CPU time).
    pub tid: AtomicU64,
}

/// The in-process OTLP/gRPC receiver.
#[derive(Debug)]
pub struct GrpcReceiver {
    pub port: u16,
    pub counts: Arc<RecvCounts>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

async fn handle(
    req: http::Request<h2::RecvStream>,
    mut respond: h2::server::SendResponse<Bytes>,
    counts: Arc<RecvCounts>,
) -> Result<(), h2::Error> {
    let mut body = req.into_body();
    // The body in one piece: one chunk as is, several copied once into a buffer sized by the
    // first message's length prefix.
    let mut chunks: Vec<Bytes> = Vec::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk?;
        let _ = body.flow_control().release_capacity(chunk.len());
        chunks.push(chunk);
    }
    let buf = if chunks.len() == 1 {
        chunks.pop().unwrap_or_default()
    } else {
        let total: usize = chunks.iter().map(Bytes::len).sum();
        let mut b = BytesMut::with_capacity(total);
        for c in &chunks {
            b.extend_from_slice(c);
        }
        b.freeze()
    };
    // gRPC length-prefixed messages: flag (uncompressed = 0), u32 BE length, message.
    let mut ok = true;
    let mut at = 0;
    while ok && at + 5 <= buf.len() {
        let len = u32::from_be_bytes([buf[at + 1], buf[at + 2], buf[at + 3], buf[at + 4]]) as usize;
        let msg = buf.get(at + 5..at + 5 + len);
        match (buf[at], msg.and_then(count_points)) {
            (0, Some((n, sum))) => {
                counts.points.fetch_add(n, Relaxed);
                counts.value_sum.fetch_add(sum, Relaxed);
                counts.bytes.fetch_add(len as u64, Relaxed);
            }
            _ => ok = false,
        }
        at += 5 + len;
    }
    ok &= at == buf.len();
    counts.requests.fetch_add(1, Relaxed);
    if !ok {
        counts.malformed.fetch_add(1, Relaxed);
    }
    let resp = http::Response::builder()
        .status(200)
        .header("content-type", "application/grpc")
        .body(())
        .expect("static response");
    let mut send = respond.send_response(resp, false)?;
    if ok {
        // An empty ExportMetricsServiceResponse: everything accepted.
        send.send_data(Bytes::from_static(&[0, 0, 0, 0, 0]), false)?;
    }
    let mut trailers = http::HeaderMap::new();
    trailers.insert(
        "grpc-status",
        http::HeaderValue::from_static(if ok { "0" } else { "3" }),
    );
    send.send_trailers(trailers)
}

async fn connection(sock: tokio::net::TcpStream, counts: Arc<RecvCounts>) {
    let _ = sock.set_nodelay(true);
    // Large windows and frames: the sender never waits for WINDOW_UPDATEs of a 1 MB request,
    // and a request arrives as one DATA frame, one chunk (no copy to reassemble it).
    let conn = h2::server::Builder::new()
        .initial_window_size(16 << 20)
        .initial_connection_window_size(64 << 20)
        .max_frame_size((16 << 20) - 1)
        .max_concurrent_streams(256)
        .handshake::<_, Bytes>(sock)
        .await;
    let Ok(mut conn) = conn else { return };
    while let Some(Ok((req, respond))) = conn.accept().await {
        let c = Arc::clone(&counts);
        tokio::spawn(async move {
            let _ = handle(req, respond, c).await;
        });
    }
}

fn gettid() -> u64 {
    std::fs::read_link("/proc/thread-self")
        .ok()
        .and_then(|p| p.file_name()?.to_str()?.parse().ok())
        .unwrap_or(0)
}

/// CPU seconds of one of this process's threads (0 once it has exited).
pub fn thread_cpu_s(tid: u64) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).unwrap_or_default();
    let rest = stat.rsplit_once(')').map(|x| x.1).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let v = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (v(11) + v(12)) / 100.0
}

impl GrpcReceiver {
    /// Listens on a free loopback port.
    ///
    /// # Errors
    /// No socket or thread.
    pub fn start() -> Result<Self, String> {
        let std_l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
        std_l.set_nonblocking(true).map_err(|e| e.to_string())?;
        let port = std_l.local_addr().map_err(|e| e.to_string())?.port();
        let counts = Arc::new(RecvCounts::default());
        let c = Arc::clone(&counts);
        let (stop, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("otlp-recv".into())
            .spawn(move || {
                c.tid.store(gettid(), Relaxed);
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("receiver runtime");
                rt.block_on(async move {
                    let l = tokio::net::TcpListener::from_std(std_l).expect("listener");
                    let accept = async {
                        while let Ok((s, _)) = l.accept().await {
                            tokio::spawn(connection(s, Arc::clone(&c)));
                        }
                    };
                    tokio::select! {
                        () = accept => {}
                        _ = stop_rx => {}
                    }
                });
            })
            .map_err(|e| e.to_string())?;
        while counts.tid.load(Relaxed) == 0 {
            std::thread::yield_now();
        }
        Ok(Self {
            port,
            counts,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    pub fn cpu_s(&self) -> f64 {
        thread_cpu_s(self.counts.tid.load(Relaxed))
    }
}

impl Drop for GrpcReceiver {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Decoded design-session batches (`messages` × 4 snapshots of 64 × 30 counters).
pub fn design_batches(messages: usize) -> Vec<Arc<CounterBatch>> {
    let (_t, data, emu) = crate::design_messages(messages);
    let mut d = crate::design_decoder(&emu, None);
    let mut out: Vec<Arc<CounterBatch>> = Vec::new();
    let mut push = |b: DecodedBatch| out.push(Arc::new(b));
    d.decode(&data, &mut push);
    d.flush(&mut push);
    out
}

/// One run's figures.
#[derive(Debug, Clone, Copy)]
pub struct Run {
    pub points_per_s: f64,
    pub received: u64,
    pub delivered: u64,
    pub dropped: u64,
    pub receiver_points: u64,
    pub requests: u64,
    pub request_bytes: u64,
    pub receiver_cpu_share: f64,
    pub sender_cpu_s_per_m: f64,
    pub receiver_cpu_s_per_m: f64,
    pub box_cpu_share: f64,
}

/// Feeds `batches` round-robin for `secs` into a sink exporting to a fresh receiver; returns
/// the run's figures, checked.
///
/// # Errors
/// A point not accounted for, a checksum mismatch, or a malformed request.
pub fn run(
    batches: &[Arc<CounterBatch>],
    secs: f64,
    max_points: usize,
    in_flight: usize,
) -> Result<Run, String> {
    let recv = GrpcReceiver::start()?;
    let mut cfg = OtlpConfig::for_test(&format!("http://127.0.0.1:{}", recv.port));
    cfg.max_points_per_request = max_points;
    cfg.max_in_flight = in_flight;
    cfg.queue_batches = 4;
    cfg.when_full = WhenFull::DropNewest;
    cfg.shutdown_timeout_ms = 60_000;
    let sink = OtlpSink::start(cfg, None).map_err(|e| e.to_string())?;
    let main_tid = gettid();
    let (cpu0, main0, recv0) = (process_cpu_s(), thread_cpu_s(main_tid), recv.cpu_s());
    let t = Instant::now();
    let until = t + Duration::from_secs_f64(secs);
    let mut sent_sum = 0u64;
    let mut i = 0;
    let stop = AtomicBool::new(false);
    while Instant::now() < until && !stop.load(Relaxed) {
        // Wait for room: the figure is the exporter's capacity, not its shedding.
        loop {
            let st = sink.stats();
            if st.batches_queued - st.batches_dequeued < 3 {
                break;
            }
            std::thread::sleep(Duration::from_micros(50));
        }
        let b = &batches[i % batches.len()];
        if sink.submit(Arc::clone(b)).is_ok() {
            sent_sum = b.values.iter().fold(sent_sum, |a, v| a.wrapping_add(*v));
        }
        i += 1;
    }
    let st = sink.shutdown();
    let el = t.elapsed().as_secs_f64();
    let (cpu, main, rcpu) = (
        process_cpu_s() - cpu0,
        thread_cpu_s(main_tid) - main0,
        recv.cpu_s() - recv0,
    );
    let c = &recv.counts;
    let receiver_points = c.points.load(Relaxed);
    if c.malformed.load(Relaxed) != 0 {
        return Err(format!("{} malformed requests", c.malformed.load(Relaxed)));
    }
    let dropped = st.dropped_samples.total();
    if receiver_points != st.samples_delivered
        || st.samples_received != st.samples_delivered + dropped + st.samples_downsampled
    {
        return Err(format!(
            "points not accounted for: receiver {receiver_points}, sink {st:?}"
        ));
    }
    if dropped == 0 && c.value_sum.load(Relaxed) != sent_sum {
        return Err("the receiver's value checksum differs from what was sent".into());
    }
    let sender = (cpu - main - rcpu).max(0.0);
    let m = st.samples_delivered as f64 / 1e6;
    Ok(Run {
        points_per_s: st.samples_delivered as f64 / el,
        received: st.samples_received,
        delivered: st.samples_delivered,
        dropped,
        receiver_points,
        requests: st.requests,
        request_bytes: st.request_bytes,
        receiver_cpu_share: rcpu / (el * 2.0),
        sender_cpu_s_per_m: sender / m.max(1e-9),
        receiver_cpu_s_per_m: rcpu / m.max(1e-9),
        box_cpu_share: cpu / (el * 2.0),
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Runs the benchmark; returns the contract's JSON object.
///
/// # Errors
/// A run that fails its checks.
pub fn bench(
    quick: bool,
    max_points: usize,
    in_flight: usize,
) -> Result<serde_json::Value, String> {
    let (runs, secs, messages) = if quick { (3, 2.0, 300) } else { (5, 5.0, 1000) };
    let batches = design_batches(messages);
    let points: usize = batches.iter().map(|b| b.samples()).sum();
    eprintln!(
        "otlp: {} batches, {:.2} M points per pass (64 ports × 30 stats); {runs} runs × {secs} s, {max_points} points/request, {in_flight} in flight",
        batches.len(),
        points as f64 / 1e6
    );
    // The encoder alone, one core.
    let mut enc = Vec::new();
    for _ in 0..runs {
        let t = Instant::now();
        let (_, _, n) = encode_requests(&batches, MetricNames::Sai, max_points);
        enc.push(n as f64 / t.elapsed().as_secs_f64());
    }
    let (requests, bytes, n) = encode_requests(&batches, MetricNames::Sai, max_points);
    let encode = median(enc);
    eprintln!(
        "otlp: encode only: {:.1} M points/s on one core, {:.1} B/point, {requests} requests",
        encode / 1e6,
        bytes as f64 / n as f64
    );
    let mut out = Vec::new();
    for k in 0..runs {
        let r = run(&batches, secs, max_points, in_flight)?;
        eprintln!(
            "otlp: run {k}: {:.2} M points/s delivered, {} received, {} dropped; receiver {:.0} % of the box ({:.3} CPU-s per M points), sender {:.3} CPU-s per M points, box {:.0} % busy",
            r.points_per_s / 1e6,
            r.received,
            r.dropped,
            r.receiver_cpu_share * 100.0,
            r.receiver_cpu_s_per_m,
            r.sender_cpu_s_per_m,
            r.box_cpu_share * 100.0
        );
        out.push(r);
    }
    out.sort_by(|a, b| a.points_per_s.total_cmp(&b.points_per_s));
    let m = out[out.len() / 2];
    Ok(json!({
        "bench": "otlp",
        "points_per_s": m.points_per_s.round(),
        "dropped": m.dropped,
        "receiver_points": m.receiver_points,
        "received": m.received,
        "delivered": m.delivered,
        "requests": m.requests,
        "bytes_per_point": (m.request_bytes as f64 / m.delivered.max(1) as f64 * 10.0).round() / 10.0,
        "receiver_cpu_share": (m.receiver_cpu_share * 1000.0).round() / 1000.0,
        "sender_cpu_s_per_m_points": (m.sender_cpu_s_per_m * 1000.0).round() / 1000.0,
        "receiver_cpu_s_per_m_points": (m.receiver_cpu_s_per_m * 1000.0).round() / 1000.0,
        "box_cpu_share": (m.box_cpu_share * 1000.0).round() / 1000.0,
        // What two cores would carry with nothing else on them: sender and receiver CPU per
        // point (the wall-clock figure above depends on what else the box runs).
        "cpu_bound_points_per_s": (2e6 / (m.sender_cpu_s_per_m + m.receiver_cpu_s_per_m).max(1e-9)).round(),
        "encode_points_per_s": encode.round(),
        "ratio_vs_countersyncd_raw_grpc": (m.points_per_s / 15.6e6 * 100.0).round() / 100.0,
        "max_points_per_request": max_points,
        "max_in_flight": in_flight,
        "runs": runs,
    }))
}
