//! stel-emu: a switch stand-in that streams SONiC high-frequency-telemetry IPFIX.
use std::{
    fs::File,
    io::{BufWriter, Write},
    path::PathBuf,
    process::ExitCode,
    sync::atomic::Ordering,
    time::{Duration, Instant},
};
use stel_emu::{self as emu, EmuConfig, Emulator, Pattern};

use clap::Parser;
use stel_ingest::{
    input::{FileInput, InputFormat, NetlinkRecorder, Unit},
    ipfix::SeqMode,
    netlink::{self, UnitFraming},
    sys::{netlink::NetlinkSocket, signal},
};
use stel_store::sai::ObjectType;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Streams HFT IPFIX counters like a SONiC switch: the template first, then data messages of
/// several snapshots each (≤ 64 KiB − 320 B), paced to ports × stats × interval.
///
/// Examples:
///   stel-emu --netlink-group 1 --duration 10s                # design rate: 64 × 30 × 10us
///   stel-emu --ports 8 --interval 10us --pattern microburst --netlink-group 1
///   stel-emu --file capture.ipfix --duration 1s --truth truth.json --session session.json
///   stel-emu --replay capture.ipfix --netlink-group 1       # also .pcap/.pcapng, recordings
///   stel-emu --netlink-group 1 --duration 1s --record sent.nl  # what was sent, datagram by datagram
///   stel-emu int --to 127.0.0.1:5900 --rate 100000    # INT reports (stel-emu int --help)
#[derive(Debug, Parser)]
#[command(name = "stel-emu", version, verbatim_doc_comment)]
struct Args {
    /// Object type of the group: PORT, QUEUE, INGRESS_PRIORITY_GROUP, BUFFER_POOL.
    #[arg(long, default_value = "PORT", value_parser = parse_group)]
    group: ObjectType,
    /// Number of ports (pools for BUFFER_POOL). Objects are named Ethernet0, Ethernet4, …
    #[arg(long, default_value_t = 64)]
    ports: usize,
    /// Queues / priority groups per port (QUEUE, INGRESS_PRIORITY_GROUP): Ethernet0|0, Ethernet0|1, …
    #[arg(long, default_value_t = 8)]
    per_port: usize,
    /// Number of stats per object (the HFT YANG list first, then the SAI enum).
    #[arg(long, default_value_t = 30, conflicts_with = "stat_names")]
    stats: usize,
    /// Explicit stat short names, comma-separated (e.g. IF_IN_OCTETS,IF_OUT_OCTETS).
    #[arg(long, value_delimiter = ',')]
    stat_names: Vec<String>,
    /// Poll interval of the switch (e.g. 10us, 1ms).
    #[arg(long, default_value = "10us", value_parser = stel_store::units::parse_duration_ns)]
    interval: u64,
    /// Snapshots per message; 0 = as many as fit in 64 KiB − 320 B.
    #[arg(long, default_value_t = 0)]
    snapshots_per_message: usize,
    /// Load pattern driving the counters. The load is read once per snapshot, so microbursts
    /// (50 µs every 1 ms) need an --interval well below 50 µs: at 1ms each port is either always
    /// or never in a burst.
    #[arg(long, value_enum, default_value_t = Pattern::Steady)]
    pattern: Pattern,
    /// Port speed of the load model (and of --redis's PORT tables): 100G, 25G, 400000 (Mb/s).
    #[arg(long, default_value = "100G", value_parser = stel_store::units::parse_speed_mbps, value_name = "SPEED")]
    speed: f64,
    /// How long to stream, with a unit (e.g. 10s, 2m; a bare number is refused). Default: until
    /// Ctrl-C (netlink) or 1s (file).
    #[arg(long, value_parser = stel_store::units::parse_duration_ns)]
    duration: Option<u64>,
    /// Send over NETLINK_USERSOCK to this multicast group (1-32). Needs root.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=32))]
    netlink_group: Option<u32>,
    /// Write the IPFIX messages, concatenated (an RFC 5655-style IPFIX file), to this path.
    #[arg(long, conflicts_with = "netlink_group")]
    file: Option<PathBuf>,
    /// Send what this file holds over netlink instead of generating, bad messages included:
    /// an IPFIX file (one netlink message per IPFIX message; bytes that do not parse go as one
    /// last message), a netlink recording (each datagram as recorded), or a pcap / pcapng
    /// (UDP IPFIX payloads, nlmon datagrams). Says what it sent.
    #[arg(long, requires = "netlink_group")]
    replay: Option<PathBuf>,
    /// Format of the --replay file: auto, ipfix, netlink, pcap.
    #[arg(long, value_enum, default_value_t = InputFormat::Auto, requires = "replay")]
    replay_format: InputFormat,
    /// Also write every netlink datagram sent to this file (a recording `stel-ingestd --input`
    /// and `stel-emu --replay` read back).
    #[arg(long, requires = "netlink_group")]
    record: Option<PathBuf>,
    /// Pace to the configured rate: `auto` paces netlink output and writes files flat out.
    #[arg(long, value_enum, default_value_t = Pace::Auto)]
    pace: Pace,
    /// Write ground truth (what was sent) as JSON here at the end.
    #[arg(long)]
    truth: Option<PathBuf>,
    /// Write the session as STATE_DB holds it (names, ids, session_config hex) as JSON here.
    #[arg(long)]
    session: Option<PathBuf>,
    /// Zero all counters once after this much switch time (a counter reset).
    #[arg(long, value_parser = stel_store::units::parse_duration_ns)]
    reset_after: Option<u64>,
    /// IPFIX observation domain.
    #[arg(long, default_value_t = 0)]
    domain: u32,
    /// Template ID (≥ 256).
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u16).range(256..))]
    template_id: u16,
    /// Sequence numbering: per message (HFT HLD) or RFC 7011 record count.
    #[arg(long, value_enum, default_value_t = SeqArg::PerMessage)]
    seq_mode: SeqArg,
    /// Resend the template this often (switch time).
    #[arg(long, default_value = "1s", value_parser = stel_store::units::parse_duration_ns)]
    template_every: u64,
    /// HFT profile name for the session file.
    #[arg(long, default_value = "stel_demo")]
    profile: String,
    /// Publish a SONiC-shaped Redis for this session at this URL (e.g. unix:///var/run/redis/redis.sock
    /// or redis://127.0.0.1:6379): the STATE_DB session, CONFIG_DB profile/group, PORT_TABLE speeds
    /// and the COUNTERS_DB name maps with OIDs (see stel_ingest::sources::fixture).
    #[arg(long)]
    redis: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Pace {
    /// Pace netlink output, write files flat out.
    Auto,
    /// Always pace to ports × stats per interval.
    On,
    /// Never pace: as fast as possible.
    Off,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum SeqArg {
    /// +1 per IPFIX message (the HFT HLD's); spelled as stel-ingestd and its config file do.
    #[value(name = "per_message", alias = "per-message")]
    PerMessage,
    /// +records per message (RFC 7011's).
    Rfc7011,
}

fn parse_group(s: &str) -> Result<ObjectType, String> {
    ObjectType::from_name(s).ok_or_else(|| {
        format!("unknown group `{s}` (use PORT, QUEUE, INGRESS_PRIORITY_GROUP, BUFFER_POOL, ROUTER_INTERFACE)")
    })
}

fn config(a: &Args) -> Result<EmuConfig, String> {
    let mut c = EmuConfig::design();
    c.group = a.group;
    c.ports = a.ports;
    c.per_port = a.per_port;
    c.stats = if a.stat_names.is_empty() {
        emu::default_stats(a.group, a.stats)
    } else {
        a.stat_names
            .iter()
            .map(|n| {
                a.group
                    .stat_by_name(n)
                    .ok_or_else(|| format!("`{n}` is not a {} stat", a.group))
            })
            .collect::<Result<_, _>>()?
    };
    if c.stats.len() < a.stats && a.stat_names.is_empty() {
        eprintln!(
            "stel-emu: {} has only {} stats; using them all",
            a.group,
            c.stats.len()
        );
    }
    c.interval_ns = a.interval;
    c.snapshots_per_message = a.snapshots_per_message;
    c.pattern = a.pattern;
    c.speed_gbps = a.speed / 1000.0;
    c.domain = a.domain;
    c.template_id = a.template_id;
    c.seq_mode = match a.seq_mode {
        SeqArg::PerMessage => SeqMode::PerMessage,
        SeqArg::Rfc7011 => SeqMode::Rfc7011,
    };
    c.reset_at_snapshot = a.reset_after.map(|ns| ns / a.interval.max(1));
    c.profile = a.profile.clone();
    Ok(c)
}

enum Out {
    Netlink(
        NetlinkSocket,
        u32,
        Vec<u8>,
        Option<NetlinkRecorder<BufWriter<File>>>,
    ),
    File(BufWriter<File>),
}

impl Out {
    fn send(&mut self, ipfix: &[u8], seq: u32) -> Result<(), String> {
        match self {
            Out::Netlink(_, _, frame, _) => {
                let mut f = std::mem::take(frame);
                f.clear();
                netlink::frame(&mut f, netlink::USERSOCK_MSG_TYPE, seq, ipfix);
                let r = self.send_datagram(&f);
                if let Out::Netlink(_, _, frame, _) = self {
                    *frame = f;
                }
                r
            }
            Out::File(w) => w.write_all(ipfix).map_err(|e| e.to_string()),
        }
    }

    /// Sends one datagram as it is (and records it).
    fn send_datagram(&mut self, datagram: &[u8]) -> Result<(), String> {
        match self {
            Out::Netlink(sock, group, _, rec) => {
                if let Some(r) = rec {
                    r.record(datagram).map_err(|e| format!("--record: {e}"))?;
                }
                sock.send_multicast(*group, datagram)
                    .map_err(|e| e.to_string())
            }
            Out::File(w) => w.write_all(datagram).map_err(|e| e.to_string()),
        }
    }

    fn finish(self) -> Result<(), String> {
        match self {
            Out::Netlink(_, _, _, Some(r)) => r.finish().map(drop).map_err(|e| e.to_string()),
            Out::Netlink(..) => Ok(()),
            Out::File(mut w) => w.flush().map_err(|e| e.to_string()),
        }
    }
}

/// `--replay`: sends every unit of the file, whatever it holds; returns what it sent.
fn replay(out: &mut Out, path: &std::path::Path, format: InputFormat) -> Result<(), String> {
    let mut input = FileInput::new(vec![path.to_path_buf()], format);
    let mut buf = vec![0u8; 4 << 20];
    let (mut datagrams, mut bytes, mut not_ipfix, mut errors) = (0u64, 0u64, 0u64, 0u64);
    let mut seq = 0u32;
    while let Some(u) = input.next_unit(&mut buf) {
        let Unit::Data { len, framing } = u else {
            continue;
        };
        let unit = &buf[..len];
        let r = match framing {
            UnitFraming::Ipfix => {
                let ok = unit.len() >= 16
                    && u16::from_be_bytes([unit[0], unit[1]]) == 10
                    && u16::from_be_bytes([unit[2], unit[3]]) as usize == unit.len();
                not_ipfix += u64::from(!ok);
                out.send(unit, seq)
            }
            UnitFraming::Netlink => out.send_datagram(unit),
            // Not produced: this input is given no INT ports (INT captures: `stel-ingestd
            // --input`).
            UnitFraming::Int => continue,
        };
        seq = seq.wrapping_add(1);
        match r {
            Ok(()) => {
                datagrams += 1;
                bytes += len as u64;
            }
            Err(e) => {
                errors += 1;
                if errors <= 10 {
                    eprintln!("stel-emu: send failed: {e}");
                }
            }
        }
    }
    let st = input.stats();
    if st.files == 0 {
        return Err(format!(
            "{}: not readable as an IPFIX file, netlink recording, pcap or pcapng",
            path.display()
        ));
    }
    eprintln!(
        "stel-emu: replayed {}: sent {datagrams} datagrams ({bytes} bytes), {not_ipfix} of them not a well-formed IPFIX message; {errors} send errors; {} records unreadable, {} bytes discarded",
        path.display(),
        st.unreadable_records,
        st.discarded_bytes
    );
    if errors > 0 {
        return Err(format!("{errors} datagrams could not be sent"));
    }
    Ok(())
}

fn run(a: Args) -> Result<(), String> {
    let stop = signal::stop_flag();
    let mut out = match (&a.netlink_group, &a.file) {
        (Some(g), _) => {
            let s = NetlinkSocket::usersock()
                .map_err(|e| format!("{e} (NETLINK_USERSOCK multicast needs root)"))?;
            // Room for the largest datagram a replay may hold (bulk datagrams of several
            // messages, up to the kernel's 4 MiB).
            let _ = s.set_sndbuf(16 << 20);
            let rec = match &a.record {
                Some(p) => Some(
                    NetlinkRecorder::new(BufWriter::with_capacity(
                        1 << 20,
                        File::create(p).map_err(|e| format!("{}: {e}", p.display()))?,
                    ))
                    .map_err(|e| format!("{}: {e}", p.display()))?,
                ),
                None => None,
            };
            Out::Netlink(s, *g, Vec::with_capacity(netlink::MAX_NETLINK_MESSAGE), rec)
        }
        (None, Some(p)) => Out::File(BufWriter::with_capacity(
            1 << 20,
            File::create(p).map_err(|e| format!("{}: {e}", p.display()))?,
        )),
        (None, None) => {
            return Err("say where to send: --netlink-group N (root) or --file PATH".into())
        }
    };
    if let Some(path) = &a.replay {
        let r = replay(&mut out, path, a.replay_format);
        out.finish()?;
        return r;
    }
    let cfg = config(&a)?;
    let pace = match a.pace {
        Pace::Auto => a.netlink_group.is_some(),
        Pace::On => true,
        Pace::Off => false,
    };
    let duration_ns = a.duration.or(if a.file.is_some() {
        Some(1_000_000_000)
    } else {
        None
    });
    let mut emu = Emulator::new(cfg).map_err(|e| format!("bad configuration: {e}"))?;
    if let Some(p) = &a.session {
        let j =
            stel_ingest::config::SessionFile::to_json(&emu.session_spec(), &emu.session_config());
        std::fs::write(p, serde_json::to_vec_pretty(&j).unwrap_or_default())
            .map_err(|e| format!("{}: {e}", p.display()))?;
    }
    if let Some(url) = &a.redis {
        let opts = stel_ingest::sources::fixture::FixtureOptions {
            speed_mbps: a.speed.round() as u32,
            ..Default::default()
        };
        let r = stel_ingest::sources::fixture::publish(url, &emu, &opts)
            .map_err(|e| format!("--redis {url}: {e}"))?;
        eprintln!(
            "stel-emu: published {} and {} name-map entries to {url}",
            r.session_key,
            r.oids.len()
        );
    }
    let per_msg = emu.snapshots_per_message() as u64;
    let period_ns = per_msg * emu.cfg.interval_ns;
    let total_msgs = duration_ns.map(|d| d.div_ceil(period_ns));
    let per_msg_counters = per_msg * emu.width() as u64;
    eprintln!(
        "stel-emu: {} {} objects × {} stats every {} ns = {:.1} M counters/s; {} snapshots ({} B) per message{}",
        emu.cfg.objects(),
        emu.cfg.group,
        emu.cfg.stats.len(),
        emu.cfg.interval_ns,
        emu.cfg.counters_per_s() / 1e6,
        per_msg,
        emu.template().record_len() * per_msg as usize + 20,
        if pace { "" } else { " (unpaced)" }
    );
    let mut buf = Vec::with_capacity(netlink::MAX_NETLINK_MESSAGE);
    let template_every = (a.template_every / period_ns).max(1);
    let start = Instant::now();
    let mut sec_start = start;
    let mut sec_msgs = 0u64;
    let mut k = 0u64;
    let target_per_s = 1e9 / period_ns as f64;
    loop {
        if stop.load(Ordering::Relaxed) || total_msgs.is_some_and(|t| k >= t) {
            break;
        }
        if k.is_multiple_of(template_every) {
            buf.clear();
            emu.template_message(&mut buf);
            if let Err(e) = out.send(&buf, k as u32) {
                emu.truth.send_errors += 1;
                eprintln!("stel-emu: send failed: {e}");
            }
        }
        buf.clear();
        emu.data_message(&mut buf);
        if pace {
            let due = start + Duration::from_nanos(k * period_ns);
            loop {
                let now = Instant::now();
                if now >= due {
                    break;
                }
                let left = due - now;
                if left > Duration::from_micros(200) {
                    std::thread::sleep(left - Duration::from_micros(100));
                } else {
                    std::hint::spin_loop();
                }
            }
        }
        if let Err(e) = out.send(&buf, k as u32) {
            emu.truth.send_errors += 1;
            if emu.truth.send_errors < 10 {
                eprintln!("stel-emu: send failed: {e}");
            }
        }
        k += 1;
        sec_msgs += 1;
        let now = Instant::now();
        if now - sec_start >= Duration::from_secs(1) {
            let secs = (now - sec_start).as_secs_f64();
            let ratio = sec_msgs as f64 / secs / target_per_s;
            if pace {
                emu.truth.worst_second_ratio = emu.truth.worst_second_ratio.min(ratio);
                if ratio < 0.99 {
                    emu.truth.kept_up = false;
                }
            }
            eprintln!(
                "stel-emu: {:>6.1} M counters/s ({:.1} % of target), {} messages sent",
                sec_msgs as f64 * per_msg_counters as f64 / secs / 1e6,
                ratio * 100.0,
                emu.truth.messages
            );
            sec_start = now;
            sec_msgs = 0;
        }
    }
    out.finish()?;
    let el = start.elapsed().as_secs_f64();
    emu.truth.elapsed_s = el;
    emu.truth.achieved_counters_per_s = emu.truth.samples as f64 / el.max(1e-9);
    if pace
        && emu.truth.achieved_counters_per_s < 0.99 * emu.truth.target_counters_per_s
        && el >= 1.0
    {
        emu.truth.kept_up = false;
    }
    if pace && !emu.truth.kept_up {
        eprintln!(
            "stel-emu: could not keep up: achieved {:.1} M of {:.1} M counters/s (worst second {:.1} %)",
            emu.truth.achieved_counters_per_s / 1e6,
            emu.truth.target_counters_per_s / 1e6,
            emu.truth.worst_second_ratio * 100.0
        );
    }
    eprintln!(
        "stel-emu: sent {} data messages, {} snapshots, {} counters, {} bytes in {:.2} s",
        emu.truth.messages, emu.truth.records, emu.truth.samples, emu.truth.bytes, el
    );
    if let Some(p) = &a.truth {
        std::fs::write(p, serde_json::to_vec_pretty(&emu.truth).unwrap_or_default())
            .map_err(|e| format!("{}: {e}", p.display()))?;
    }
    Ok(())
}

fn main() -> ExitCode {
    // `stel-emu int …`: INT telemetry reports (stel_ingest::int::gen).
    let mut args = std::env::args_os().skip(1);
    match args.next().as_ref().and_then(|a| a.to_str()) {
        Some("int") => {
            return stel_emu::int::cli_main(std::env::args_os().skip(1), signal::stop_flag())
        }
        // `stel-emu help [int]`.
        Some("help") => {
            use clap::CommandFactory;
            let mut c = match args.next().as_ref().and_then(|a| a.to_str()) {
                Some("int") => stel_emu::int::IntArgs::command(),
                None => Args::command(),
                Some(other) => {
                    eprintln!("stel-emu: no help for `{other}` (stel-emu help, stel-emu help int)");
                    return ExitCode::from(2);
                }
            };
            return match c.print_long_help() {
                Ok(()) => ExitCode::SUCCESS,
                Err(_) => ExitCode::from(2),
            };
        }
        _ => {}
    }
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("stel-emu: {e}");
            ExitCode::from(2)
        }
    }
}
