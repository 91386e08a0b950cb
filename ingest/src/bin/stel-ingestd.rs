//! stel-ingestd: receives HFT IPFIX, decodes it into Arrow counter batches, reports live status.
//!
//! What works today: `--demo` (the emulator in-process at the design rate, no SONiC or root
//! needed) and `--usersock-group N` (a plain recv loop on NETLINK_USERSOCK, fed by `stel-emu`).
//! The io_uring reader, the genl family and the eBPF filter, Parquet and COUNTERS_DB sinks come
//! with their issues; until then batches go to a counting sink that prints live port rates.
use std::{
    path::PathBuf,
    process::ExitCode,
    sync::{atomic::Ordering, mpsc},
    time::{Duration, Instant},
};

use clap::Parser;
use stel_ingest::{
    decode::{CounterBatch, DecodeConfig, DecodeStats, Decoder, SessionSpec},
    emu::{self, EmuConfig, Emulator, Pattern},
    netlink::{self, FrameErrors},
    sys::{netlink::NetlinkSocket, signal},
};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Ingests SONiC high-frequency-telemetry counters (IPFIX over netlink) at line rate.
///
/// Examples:
///   stel-ingestd --demo                           # built-in switch emulator, live port rates
///   stel-ingestd --demo --pattern microburst --duration 10s
///   stel-emu --netlink-group 1 --session s.json & stel-ingestd --usersock-group 1 --session s.json
#[derive(Debug, Parser)]
#[command(version, verbatim_doc_comment)]
struct Args {
    /// Run the switch emulator in-process (64 ports × 30 stats every 10 µs by default).
    #[arg(long, conflicts_with = "usersock_group")]
    demo: bool,
    /// Receive from this NETLINK_USERSOCK multicast group (what `stel-emu --netlink-group` sends).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=32))]
    usersock_group: Option<u32>,
    /// Session file written by `stel-emu --session` (object names for the template's labels).
    #[arg(long)]
    session: Option<PathBuf>,
    /// Stop after this long (e.g. 30s); default: until SIGINT/SIGTERM.
    #[arg(long, value_parser = emu::parse_duration_ns)]
    duration: Option<u64>,
    /// Demo: ports to emulate.
    #[arg(long, default_value_t = 64)]
    ports: usize,
    /// Demo: stats per port.
    #[arg(long, default_value_t = 30)]
    stats: usize,
    /// Demo: poll interval.
    #[arg(long, default_value = "10us", value_parser = emu::parse_duration_ns)]
    interval: u64,
    /// Demo: load pattern.
    #[arg(long, value_enum, default_value_t = Pattern::Microburst)]
    pattern: Pattern,
    /// Receive buffer for the netlink socket, bytes.
    #[arg(long, default_value_t = 256 << 20)]
    rcvbuf: usize,
    /// Print the final counters as JSON on stdout.
    #[arg(long)]
    json: bool,
}

/// Keeps what the live status line needs: totals and the latest snapshot per session.
#[derive(Debug, Default)]
struct StatusSink {
    rows: u64,
    last: Option<(i64, Vec<u64>, Vec<String>)>,
    prev: Option<(i64, Vec<u64>)>,
}

impl StatusSink {
    fn take(&mut self, b: &CounterBatch) {
        self.rows += b.rows() as u64;
        if let Some(i) = b.rows().checked_sub(1) {
            let names = match self.last.take() {
                Some((_, _, n)) if n.len() == b.schema.width() => n,
                _ => b.schema.columns.iter().map(|c| c.wide_name()).collect(),
            };
            self.last = Some((b.ts[i], b.row(i).to_vec(), names));
        }
    }

    /// RX/TX Mbit/s of the first few ports, from the octet counters between two status ticks.
    fn rates_line(&mut self) -> String {
        let Some((ts, row, names)) = &self.last else {
            return String::new();
        };
        let mut s = String::new();
        if let Some((pts, prow)) = &self.prev {
            let dt = (*ts - *pts) as f64 / 1e9;
            if dt > 0.0 && prow.len() == row.len() {
                let mut shown = 0;
                for (i, n) in names.iter().enumerate() {
                    if let Some(port) = n.strip_suffix(".IF_IN_OCTETS") {
                        let rx = (row[i].wrapping_sub(prow[i])) as f64 * 8.0 / dt / 1e9;
                        let tx = names
                            .iter()
                            .position(|m| m == &format!("{port}.IF_OUT_OCTETS"))
                            .map_or(0.0, |j| {
                                row[j].wrapping_sub(prow[j]) as f64 * 8.0 / dt / 1e9
                            });
                        s.push_str(&format!(" {port} rx {rx:.1}/tx {tx:.1} Gb/s;"));
                        shown += 1;
                        if shown == 3 {
                            break;
                        }
                    }
                }
            }
        }
        self.prev = Some((*ts, row.clone()));
        s
    }
}

fn load_session(p: &PathBuf) -> Result<(SessionSpec, Vec<u8>), String> {
    let text = std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", p.display()))?;
    let s = |k: &str| {
        v.get(k)
            .and_then(|x| x.as_str())
            .unwrap_or_default()
            .to_string()
    };
    let ids: Result<Vec<u16>, _> = s("object_ids")
        .split(',')
        .filter(|x| !x.is_empty())
        .map(str::parse)
        .collect();
    let hex = s("session_config_hex");
    let bytes: Result<Vec<u8>, _> = (0..hex.len() / 2)
        .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16))
        .collect();
    Ok((
        SessionSpec {
            profile: s("profile"),
            group: s("group"),
            domain: v.get("domain").and_then(|d| d.as_u64()).unwrap_or(0) as u32,
            object_names: s("object_names")
                .split(',')
                .filter(|x| !x.is_empty())
                .map(String::from)
                .collect(),
            object_ids: ids.map_err(|e| format!("{}: object_ids: {e}", p.display()))?,
        },
        bytes.map_err(|e| format!("{}: session_config_hex: {e}", p.display()))?,
    ))
}

fn print_status(
    stats: &DecodeStats,
    prev: &DecodeStats,
    dt: f64,
    sink: &mut StatusSink,
    extra: &str,
) {
    eprintln!(
        "stel-ingestd: {:>7.1} M counters/s {:>6.0} msgs/s | total {} msgs, {} snapshots, lost(seq) {}, malformed {}{}{}",
        (stats.counters - prev.counters) as f64 / dt / 1e6,
        (stats.messages - prev.messages) as f64 / dt,
        stats.messages,
        stats.records,
        stats.seq_lost_messages + stats.seq_lost_records,
        stats.malformed_total(),
        extra,
        sink.rates_line()
    );
}

fn run(a: Args) -> Result<(), String> {
    let stop = signal::stop_flag();
    let deadline = a.duration.map(|d| Instant::now() + Duration::from_nanos(d));
    let mut decoder = Decoder::new(DecodeConfig::default());
    let mut sink = StatusSink::default();
    let mut recycle = Vec::new();
    if let Some(p) = &a.session {
        let (spec, cfg) = load_session(p)?;
        decoder
            .register_session(spec, &cfg, &mut |b: CounterBatch| sink.take(&b))
            .map_err(|e| format!("{}: {e}", p.display()))?;
    }
    let mut last_tick = Instant::now();
    let mut prev = decoder.stats().clone();
    let done = |stop: &std::sync::atomic::AtomicBool| {
        stop.load(Ordering::Relaxed) || deadline.is_some_and(|d| Instant::now() >= d)
    };
    if a.demo {
        let mut cfg = EmuConfig::design();
        cfg.ports = a.ports;
        cfg.stats = emu::default_stats(cfg.group, a.stats);
        cfg.interval_ns = a.interval;
        cfg.pattern = a.pattern;
        let mut emu = Emulator::new(cfg).map_err(|e| format!("demo: {e}"))?;
        decoder
            .register_session(
                emu.session_spec(),
                &emu.session_config(),
                &mut |b: CounterBatch| sink.take(&b),
            )
            .map_err(|e| format!("demo session: {e}"))?;
        eprintln!(
            "stel-ingestd: demo: emulating {} ports × {} stats every {} ns ({:.0} M counters/s) in-process; Ctrl-C stops",
            a.ports, a.stats, a.interval, emu.cfg.counters_per_s() / 1e6
        );
        let (tx, rx) = mpsc::sync_channel::<Vec<u8>>(64);
        let (back_tx, back_rx) = mpsc::channel::<Vec<u8>>();
        let period = Duration::from_nanos(emu.snapshots_per_message() as u64 * emu.cfg.interval_ns);
        let halt = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let halt_producer = std::sync::Arc::clone(&halt);
        let producer = std::thread::spawn(move || {
            let start = Instant::now();
            let mut k = 0u32;
            let mut buf = Vec::new();
            emu.template_message(&mut buf);
            while !halt_producer.load(Ordering::Relaxed) {
                emu.data_message(&mut buf);
                if tx.send(buf).is_err() {
                    return emu.truth;
                }
                buf = back_rx.try_recv().unwrap_or_default();
                buf.clear();
                k += 1;
                let due = start + period * k;
                if let Some(left) = due.checked_duration_since(Instant::now()) {
                    std::thread::sleep(left);
                }
            }
            emu.truth
        });
        while !done(stop) {
            match rx.recv_timeout(Duration::from_millis(100)) {
                Ok(buf) => {
                    decoder.decode(&buf, &mut |b: CounterBatch| {
                        sink.take(&b);
                        recycle.push(b);
                    });
                    for b in recycle.drain(..) {
                        decoder.recycle(b);
                    }
                    let _ = back_tx.send(buf);
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
            if last_tick.elapsed() >= Duration::from_secs(1) {
                decoder.flush(&mut |b: CounterBatch| sink.take(&b));
                let dt = last_tick.elapsed().as_secs_f64();
                print_status(decoder.stats(), &prev, dt, &mut sink, "");
                prev = decoder.stats().clone();
                last_tick = Instant::now();
            }
        }
        // Stop the producer, then drain what it already sent: nothing in flight is lost.
        halt.store(true, Ordering::Relaxed);
        for buf in rx.iter() {
            decoder.decode(&buf, &mut |b: CounterBatch| sink.take(&b));
        }
        let truth = producer
            .join()
            .map_err(|_| "emulator thread panicked".to_string())?;
        decoder.flush(&mut |b: CounterBatch| sink.take(&b));
        eprintln!(
            "stel-ingestd: demo done: emulator sent {} snapshots, decoder decoded {}",
            truth.records, sink.rows
        );
    } else if let Some(group) = a.usersock_group {
        let sock = NetlinkSocket::usersock()
            .map_err(|e| format!("{e} (NETLINK_USERSOCK multicast needs root)"))?;
        sock.join_group(group).map_err(|e| e.to_string())?;
        if let Err(e) = sock.set_rcvbuf(a.rcvbuf) {
            eprintln!("stel-ingestd: could not set receive buffer: {e}");
        }
        sock.set_recv_timeout(Duration::from_millis(100))
            .map_err(|e| e.to_string())?;
        eprintln!("stel-ingestd: receiving NETLINK_USERSOCK group {group} (plain recv loop); Ctrl-C stops");
        let mut buf = vec![0u8; 1 << 17];
        let mut ferr = FrameErrors::default();
        let mut truncated = 0u64;
        while !done(stop) {
            match sock.recv(&mut buf) {
                Ok((n, real)) => {
                    if real > n {
                        truncated += 1; // never decode a spliced datagram
                    } else {
                        netlink::for_each_payload(&buf[..n], &mut ferr, |p| {
                            decoder.decode(p, &mut |b: CounterBatch| {
                                sink.take(&b);
                                recycle.push(b);
                            });
                        });
                        for b in recycle.drain(..) {
                            decoder.recycle(b);
                        }
                    }
                }
                // Timeout / interrupted: loop to check for shutdown. ENOBUFS only marks a drop
                // episode; the drops themselves are read from SO_MEMINFO.
                Err(e) if e.is_transient() => {}
                Err(e) => return Err(e.to_string()),
            }
            if last_tick.elapsed() >= Duration::from_secs(1) {
                decoder.flush(&mut |b: CounterBatch| sink.take(&b));
                let drops = sock.drops().unwrap_or(0);
                let extra = format!(
                    ", kernel drops {drops}, truncated {truncated}, bad frames {}",
                    ferr.bad_length
                );
                print_status(
                    decoder.stats(),
                    &prev,
                    last_tick.elapsed().as_secs_f64(),
                    &mut sink,
                    &extra,
                );
                prev = decoder.stats().clone();
                last_tick = Instant::now();
            }
        }
        decoder.flush(&mut |b: CounterBatch| sink.take(&b));
    } else {
        return Err("nothing to ingest from: use --demo, or --usersock-group N with stel-emu (the SONiC genl reader comes with the kernel-path work)".into());
    }
    if a.json {
        println!(
            "{}",
            serde_json::to_string(decoder.stats()).unwrap_or_default()
        );
    }
    eprintln!(
        "stel-ingestd: stopped cleanly: {} snapshots decoded",
        sink.rows
    );
    Ok(())
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("stel-ingestd: {e}");
            ExitCode::from(2)
        }
    }
}
