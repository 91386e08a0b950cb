//! `stel-bench netlink`: the emulator → kernel (NETLINK_USERSOCK multicast, the same bytes and
//! framing as the switch's genl family) → the daemon's receive path (eBPF filter, reader,
//! dispatch, decoders), with io_uring and with the plain recv loop in the same run.
//!
//! Two measurements per reader:
//! - **paced**: the emulator sends at `rate × design` (default 2×: one 61 KB message every
//!   20 µs, 3.07 GB/s) from its own thread for a few seconds while the daemon decodes
//!   everything; reports the received rate and the exact loss. `lost` is what the emulator sent
//!   minus what the decoders got; `unaccounted` is `lost` minus what the daemon counted as lost
//!   (kernel drops, truncation, shedding) and must be 0.
//! - **drain**: the receiver is paused while the socket buffer fills, then the reader empties it
//!   with decoding switched off (no session registered: the user-space filter discards each
//!   payload after the reader and the framing); reports bytes/s of the receive path alone.
use std::{
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};
use stel_emu::{EmuConfig, Emulator};

use serde_json::json;
use stel_ingest::{
    config::{DaemonConfig, SourceKind},
    daemon::{Daemon, DaemonStatus},
    decode::CounterBatch,
    netlink,
    pipeline::Sink,
    reader::ReaderKind,
    sys::netlink::NetlinkSocket,
};

/// Pre-framed design-rate messages the sender cycles through, patching the IPFIX sequence and
/// moving each record's timestamp forward by one cycle's span per cycle, so the receiver sees a
/// continuous, realistic stream (counter values repeat per cycle: one reset per cycle).
#[derive(Debug)]
pub(crate) struct Workload {
    pub(crate) template: Vec<u8>,
    data: Vec<Vec<u8>>,
    first_seq: u32,
    pub(crate) snapshots_per_message: u64,
    pub(crate) counters_per_message: u64,
    record_len: usize,
    pub(crate) emu: Emulator,
}

const IPFIX_SEQ_OFFSET: usize = netlink::HEADERS_LEN + 8;

impl Workload {
    /// `messages` distinct design-rate messages of `pattern`.
    pub(crate) fn new(messages: usize, pattern: stel_emu::Pattern) -> Self {
        let cfg = EmuConfig {
            pattern,
            ..EmuConfig::design()
        };
        let mut emu = Emulator::new(cfg).expect("design config");
        let mut ipfix = Vec::new();
        emu.template_message(&mut ipfix);
        let mut template = Vec::new();
        netlink::frame(&mut template, netlink::USERSOCK_MSG_TYPE, 0, &ipfix);
        let first_seq = u32::from_be_bytes(
            template[IPFIX_SEQ_OFFSET..IPFIX_SEQ_OFFSET + 4]
                .try_into()
                .expect("4 bytes"),
        );
        let data: Vec<Vec<u8>> = (0..messages as u32)
            .map(|i| {
                ipfix.clear();
                emu.data_message(&mut ipfix);
                let mut f = Vec::new();
                netlink::frame(&mut f, netlink::USERSOCK_MSG_TYPE, i + 1, &ipfix);
                f
            })
            .collect();
        let snapshots_per_message = emu.snapshots_per_message() as u64;
        let counters_per_message = snapshots_per_message * emu.width() as u64;
        // The emulator's template: the 8-byte timestamp first, then one 8-byte counter each.
        let record_len = 8 + 8 * emu.width();
        assert_eq!(
            data[0].len(),
            netlink::HEADERS_LEN + 16 + 4 + snapshots_per_message as usize * record_len
        );
        Self {
            template,
            data,
            first_seq,
            snapshots_per_message,
            counters_per_message,
            record_len,
            emu,
        }
    }

    /// Patches frame `f` (message `sent` of the run) in place: sequence number and, from the
    /// second cycle on, timestamps one cycle later than last time.
    fn patch(&self, f: &mut [u8], sent: u64) {
        let seq = self.first_seq.wrapping_add(1).wrapping_add(sent as u32);
        f[IPFIX_SEQ_OFFSET..IPFIX_SEQ_OFFSET + 4].copy_from_slice(&seq.to_be_bytes());
        let n = self.data.len() as u64;
        if sent >= n {
            let span = n * self.snapshots_per_message * self.emu.cfg.interval_ns;
            let first = netlink::HEADERS_LEN + 16 + 4;
            for r in 0..self.snapshots_per_message as usize {
                let o = first + r * self.record_len;
                let ts = u64::from_be_bytes(f[o..o + 8].try_into().expect("8 bytes"));
                f[o..o + 8].copy_from_slice(&(ts + span).to_be_bytes());
            }
        }
    }

    pub(crate) fn message_period(&self) -> Duration {
        Duration::from_nanos(self.snapshots_per_message * self.emu.cfg.interval_ns)
    }
}

/// Counts what the decoders hand over.
#[derive(Debug, Default)]
struct CountingSink {
    counters: AtomicU64,
}

impl Sink for CountingSink {
    fn name(&self) -> &'static str {
        "count"
    }
    fn submit(&self, b: &Arc<CounterBatch>) {
        self.counters
            .fetch_add(b.samples() as u64, Ordering::Relaxed);
    }
}

/// Sends `count` messages (or until `stop`), at one message per `period` (None: flat out).
/// Returns messages sent.
pub(crate) fn send(
    w: &Workload,
    group: u32,
    count: u64,
    period: Option<Duration>,
    stop: &AtomicBool,
) -> Result<u64, String> {
    let tx = NetlinkSocket::usersock().map_err(|e| format!("sender: {e} (needs root)"))?;
    let _ = tx.set_sndbuf(8 << 20);
    tx.send_multicast(group, &w.template)
        .map_err(|e| e.to_string())?;
    let mut frames: Vec<Vec<u8>> = w.data.clone();
    let start = Instant::now();
    let mut sent = 0u64;
    while sent < count && !stop.load(Ordering::Relaxed) {
        if let Some(p) = period {
            // Catch up with the schedule, then sleep a little: bursts of ~1 ms worth.
            let due = (start.elapsed().as_nanos() / p.as_nanos().max(1)) as u64 + 1;
            if sent >= due {
                std::thread::sleep(Duration::from_micros(200));
                continue;
            }
        }
        let f = &mut frames[(sent % w.data.len() as u64) as usize];
        w.patch(f, sent);
        match tx.send_multicast(group, f) {
            Ok(()) => sent += 1,
            Err(e) if e.is_transient() => std::thread::yield_now(),
            Err(e) => return Err(e.to_string()),
        }
    }
    Ok(sent)
}

fn daemon(
    group: u32,
    kind: ReaderKind,
    ebpf: bool,
    rcvbuf: usize,
) -> Result<(Daemon, Arc<CountingSink>), String> {
    let mut cfg = DaemonConfig::default();
    cfg.source.kind = SourceKind::Usersock;
    cfg.source.usersock_group = group;
    cfg.source.rcvbuf_bytes = rcvbuf;
    cfg.reader.kind = kind;
    if let Some(n) = std::env::var("STEL_BENCH_SLOTS")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        cfg.reader.slots = n;
    }
    // A/B of the slot size (0 = the default: the kernel's largest datagram).
    if let Some(n) = std::env::var("STEL_BENCH_SLOT_BYTES")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        cfg.reader.slot_bytes = n;
    }
    cfg.filter.ebpf = ebpf;
    // Only the registered session passes (the drain run registers none, so the user-space
    // filter discards every payload right after framing, as it always did here).
    cfg.filter.policy = stel_ingest::filter::FilterPolicy::Registered;
    // One observation domain: one decoder does the work; the other core runs the emulator.
    cfg.pipeline.decoders = 1;
    cfg.status.file = Some(Default::default()); // none
    let mut d = Daemon::setup(cfg, None)?;
    let sink = Arc::new(CountingSink::default());
    d.start(vec![Arc::clone(&sink) as Arc<dyn Sink>]);
    Ok((d, sink))
}

#[derive(Debug, Clone, Copy)]
struct Paced {
    bytes_per_s: f64,
    msgs_per_s: f64,
    sent_msgs: u64,
    lost_counters: u64,
    unaccounted: i64,
    kernel_drops: u64,
    /// Session changes made while data flowed (`STEL_BENCH_CHURN` per second).
    churn_ops: u64,
    /// Longest time the reader did not receive, µs (dispatch, session changes, …).
    max_receive_gap_us: u64,
}

/// `STEL_BENCH_CHURN=N`: N session registrations/unregistrations per second of other sessions
/// during each paced run (the session registry must never stall the reader).
fn churn_rate() -> u64 {
    std::env::var("STEL_BENCH_CHURN")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Sessions of other exporters to register and unregister (domains 100.., templates 1000..).
fn churn_sessions() -> Vec<Emulator> {
    (0..64u32)
        .map(|i| {
            let mut c = EmuConfig::design();
            c.ports = 1;
            c.stats = stel_emu::default_stats(stel_store::sai::ObjectType::Port, 2);
            c.domain = 100 + i;
            c.template_id = 1000 + i as u16;
            c.profile = format!("churn{i}");
            Emulator::new(c).expect("churn config")
        })
        .collect()
}

fn paced_run(
    w: &Workload,
    group: u32,
    kind: ReaderKind,
    rate: f64,
    secs: f64,
) -> Result<Paced, String> {
    let (mut d, sink) = daemon(group, kind, true, 256 << 20)?;
    d.register(w.emu.session_spec(), w.emu.session_config())?;
    let period = w.message_period().div_f64(rate);
    let count = (secs / period.as_secs_f64()) as u64;
    let stop = AtomicBool::new(false);
    let t0 = Instant::now();
    let churn = churn_sessions();
    let per_s = churn_rate();
    let mut on = vec![false; churn.len()];
    let mut ops = 0u64;
    let (sent, elapsed, st) = std::thread::scope(|s| {
        let h = s.spawn(|| send(w, group, count, Some(period), &stop));
        while !h.is_finished() {
            if let Err(e) = d.step() {
                stop.store(true, Ordering::Relaxed);
                return (Err(e), t0.elapsed(), None);
            }
            while per_s > 0 && ops < (t0.elapsed().as_secs_f64() * per_s as f64) as u64 {
                let i = (ops as usize / 2) % churn.len();
                let e = &churn[i];
                if on[i] {
                    d.unregister(&e.cfg.profile, "PORT");
                } else if let Err(e) = d.register(e.session_spec(), e.session_config()) {
                    stop.store(true, Ordering::Relaxed);
                    return (Err(e), t0.elapsed(), None);
                }
                on[i] = !on[i];
                ops += 1;
            }
        }
        let sent = h.join().unwrap_or_else(|_| Err("sender panicked".into()));
        let sent_n = *sent.as_ref().unwrap_or(&0);
        let drained = move |r: &stel_ingest::sys::uring::RecvStats| r.datagrams > sent_n;
        let st = d.finish(Some(&drained), Duration::from_secs(3));
        (sent, t0.elapsed(), Some(st))
    });
    let sent = sent?;
    let st: DaemonStatus = st.ok_or("daemon failed")?;
    let sent_counters = sent * w.counters_per_message;
    let got = sink.counters.load(Ordering::Relaxed);
    let lost = sent_counters.saturating_sub(got);
    let counted_msgs = st.kernel_drops
        + st.recv.truncated
        + st.pipeline.dispatch.shed_decoder_full_messages
        + st.filter.dropped;
    let unaccounted = lost as i64 - (counted_msgs * w.counters_per_message) as i64;
    let bytes = st.recv.bytes as f64;
    Ok(Paced {
        bytes_per_s: bytes / elapsed.as_secs_f64(),
        msgs_per_s: st.recv.datagrams as f64 / elapsed.as_secs_f64(),
        sent_msgs: sent,
        lost_counters: lost,
        unaccounted,
        kernel_drops: st.kernel_drops,
        churn_ops: ops,
        max_receive_gap_us: st.receive_gap_max_us,
    })
}

/// Fills the paused receiver's socket buffer, then times the reader emptying it.
fn drain_run(w: &Workload, group: u32, kind: ReaderKind) -> Result<f64, String> {
    // No session: the user-space filter discards every data payload right after framing, so
    // this times receive + dispatch alone.
    let (mut d, _) = daemon(group, kind, false, 1 << 30)?;
    let stop = AtomicBool::new(false);
    // ~6,000 messages of 61 KB fit in a 1 GiB buffer (each is charged ~2× its size).
    let sent = send(w, group, 6000, None, &stop)?;
    let t = Instant::now();
    let before = d.status().recv;
    let mut idle = 0;
    while idle < 3 {
        match d.step()? {
            0 => idle += 1,
            _ => idle = 0,
        }
    }
    let st = d.status();
    eprintln!(
        "netlink: {kind:?} drain: {} datagrams in {} polls, {} re-arms ({} for lack of buffers)",
        st.recv.datagrams - before.datagrams,
        st.recv.polls - before.polls,
        st.recv.rearms + st.recv.rearms_no_buffers,
        st.recv.rearms_no_buffers
    );
    // The last empty polls waited for the timeout each: take them off.
    let el = t.elapsed().as_secs_f64() - 3.0 * 0.020;
    let bytes = (st.recv.bytes - before.bytes) as f64;
    if st.recv.datagrams < sent.saturating_sub(st.kernel_drops) {
        return Err(format!(
            "drain: received {} of {sent} datagrams",
            st.recv.datagrams
        ));
    }
    drop(d);
    Ok(bytes / el.max(1e-6))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Runs the benchmark; returns the contract's JSON object.
///
/// # Errors
/// Not root (netlink multicast), or a run failing.
pub fn bench(quick: bool, rate: f64) -> Result<serde_json::Value, String> {
    let w = Workload::new(64, stel_emu::Pattern::Steady);
    let (runs, secs) = if quick { (3, 3.0) } else { (5, 8.0) };
    let target = rate * w.emu.cfg.counters_per_s() * 8.0;
    eprintln!(
        "netlink: {runs} runs × {secs} s per reader at {rate}× the design rate ({:.2} GB/s of counters, one {} B message every {:.1} µs)",
        target / 1e9,
        w.data[0].len(),
        w.message_period().div_f64(rate).as_secs_f64() * 1e6
    );
    let mut group = 20;
    let mut results = Vec::new();
    for kind in [ReaderKind::IoUring, ReaderKind::Recvmsg] {
        let mut paced = Vec::new();
        for _ in 0..runs {
            group += 1;
            let p = paced_run(&w, group, kind, rate, secs)?;
            eprintln!(
                "netlink: {kind:?} paced: {:.2} GB/s, {:.0} msgs/s, sent {} msgs, lost {} counters (kernel drops {}), unaccounted {}; {} session changes, longest receive gap {} us",
                p.bytes_per_s / 1e9,
                p.msgs_per_s,
                p.sent_msgs,
                p.lost_counters,
                p.kernel_drops,
                p.unaccounted,
                p.churn_ops,
                p.max_receive_gap_us
            );
            paced.push(p);
        }
        let mut drains = Vec::new();
        for _ in 0..runs {
            group += 1;
            let r = drain_run(&w, group, kind)?;
            eprintln!("netlink: {kind:?} drain: {:.2} GB/s", r / 1e9);
            drains.push(r);
        }
        results.push((paced, median(drains)));
    }
    let (uring, uring_drain) = &results[0];
    let (recv, recv_drain) = &results[1];
    let med = |v: &[Paced], f: fn(&Paced) -> f64| median(v.iter().map(f).collect());
    let bytes = med(uring, |p| p.bytes_per_s);
    let base = med(recv, |p| p.bytes_per_s);
    let lost: u64 = uring.iter().map(|p| p.lost_counters).sum();
    let unaccounted: i64 = uring.iter().chain(recv.iter()).map(|p| p.unaccounted).sum();
    Ok(json!({
        "bench": "netlink",
        "bytes_per_s": bytes.round(),
        "msgs_per_s": med(uring, |p| p.msgs_per_s).round(),
        "lost": lost,
        "unaccounted": unaccounted,
        "baseline_recv_bytes_per_s": base.round(),
        "ratio_vs_recv": (bytes / base * 100.0).round() / 100.0,
        "design_rate_ratio": (bytes / (w.emu.cfg.counters_per_s() * 8.0) * 100.0).round() / 100.0,
        "baseline_lost": recv.iter().map(|p| p.lost_counters).sum::<u64>(),
        "drain_bytes_per_s": uring_drain.round(),
        "baseline_drain_bytes_per_s": recv_drain.round(),
        "drain_ratio_vs_recv": (uring_drain / recv_drain * 100.0).round() / 100.0,
        "target_rate": rate,
        "runs": runs,
        "churn_per_s": churn_rate(),
        "max_receive_gap_us": uring.iter().chain(recv.iter()).map(|p| p.max_receive_gap_us).max(),
    }))
}
