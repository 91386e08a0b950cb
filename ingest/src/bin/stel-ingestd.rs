//! stel-ingestd: receives SONiC high-frequency-telemetry IPFIX over netlink, filters it in the
//! kernel (eBPF), decodes it on every core into Arrow counter batches and hands them to sinks.
//! See `stel_ingest::daemon` for the wiring and `deploy/stel-ingestd.toml` for every setting.
use std::{
    path::{Path, PathBuf},
    process::ExitCode,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};
use stel_emu::Pattern;

use clap::{Parser, Subcommand};
use stel_ingest::{
    config::{DaemonConfig, SessionFile, SourceKind},
    demo::{self, DemoSettings},
    filter::FilterPolicy,
    input::InputFormat,
    ipfix::SeqMode,
    reader::ReaderKind,
    report::{self, StatusTicker},
    sys::{self, signal},
    topology::Topology,
};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const EXIT_CODES: &str = "Exit status:
  0  stopped cleanly (a signal, --duration, or every --input file read and decoded)
  1  `stel-ingestd status`: the status file is stale (the daemon stopped, died or stalled)
  2  an error: a bad flag or configuration, something that cannot start (a data directory that
     cannot be written or that another stel-ingestd is writing, a socket, a privilege), --input
     files that could not be read or held nothing decodable, or a history that could write
     nothing it was given";

/// Ingests SONiC high-frequency-telemetry counters (IPFIX over generic netlink) at line rate.
///
/// By default it follows the switch's generic netlink family (names from
/// /etc/sonic/constants.yml, default sonic_stel / ipfix), waiting for it if it is not there yet.
/// It needs root (CAP_NET_ADMIN, CAP_BPF) at start and drops every capability once the socket
/// and the eBPF filter are set up.
///
/// Examples:
///   stel-ingestd --demo                         # built-in emulator (64 ports × 30 stats / 10 µs)
///   stel-ingestd --demo --pattern microburst --duration 10s
///   stel-ingestd --config /etc/stel/stel-ingestd.toml
///   stel-emu --netlink-group 1 --session s.json &
///   stel-ingestd --usersock-group 1 --session s.json
///   stel-ingestd --input capture.pcapng --data-dir ./from-capture   # offline, no root
///   stel-ingestd --demo --upload-to /mnt/lake/stel   # also copy every published file there
///   AWS_ENDPOINT_URL=http://127.0.0.1:9000 AWS_ALLOW_HTTP=true AWS_ACCESS_KEY_ID=… \
///     AWS_SECRET_ACCESS_KEY=… stel-ingestd --demo --upload-to s3://lake/stel
///   stel-ingestd --demo --otlp-endpoint http://127.0.0.1:4317   # also to an OTLP collector
///     (python3 deploy/otlp_receiver.py --grpc 4317 --every 1 shows what arrives)
///   stel-ingestd status                         # every counter of the running daemon
///   stel-ingestd status --data-dir ./stel-data  # … of the one writing that directory
///   stel-query inspect stel_demo --table        # live counters from the running daemon's
///                                               # inspect socket (next to the status file)
#[derive(Debug, Parser)]
#[command(
    name = "stel-ingestd",
    version,
    verbatim_doc_comment,
    args_conflicts_with_subcommands = true,
    after_help = EXIT_CODES
)]
struct Args {
    #[command(subcommand)]
    command: Option<Command>,
    /// Configuration file (TOML; see deploy/stel-ingestd.toml). Flags override it.
    #[arg(long, short = 'c', env = "STEL_CONFIG")]
    config: Option<PathBuf>,
    /// Check a configuration file and exit: every problem on its own line (unknown keys, wrong
    /// types, values out of range, settings that need each other, paths two components would
    /// share) and exit status 2, or "ok" and 0. Nothing is opened or started.
    #[arg(long, value_name = "FILE", exclusive = true)]
    check_config: Option<PathBuf>,
    /// Run the switch emulator in-process (no root, no SONiC needed).
    #[arg(long, conflicts_with_all = ["usersock_group", "input"])]
    demo: bool,
    /// Ingest capture files instead of a socket, then stop (no root needed): IPFIX files
    /// (concatenated messages), netlink recordings (`stel-emu --record`, or u32-LE
    /// length-prefixed datagrams), pcap / pcapng with UDP-carried IPFIX on any port or
    /// LINKTYPE_NETLINK (nlmon) captures. Same framing, filter rule, decoders, sinks and
    /// counters as the socket.
    #[arg(long, num_args = 1.., value_name = "FILE", conflicts_with = "usersock_group")]
    input: Vec<PathBuf>,
    /// Format of the --input files: auto (from each file's first bytes), ipfix, netlink, pcap.
    #[arg(long, value_enum, requires = "input")]
    input_format: Option<InputFormat>,
    /// Template filter policy: auto (registered on the switch's genl family with --redis,
    /// else learn), registered (only session / STATE_DB templates pass), learn (templates seen
    /// in the stream are registered before their data).
    #[arg(long = "filter", value_enum, value_name = "POLICY")]
    filter_policy: Option<FilterPolicy>,
    /// Receive from this NETLINK_USERSOCK multicast group (what `stel-emu --netlink-group` sends).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=32))]
    usersock_group: Option<u32>,
    /// SONiC constants.yml with the genl family/group names.
    #[arg(long)]
    constants: Option<PathBuf>,
    /// Session file(s) written by `stel-emu --session` (registered at start).
    #[arg(long)]
    session: Vec<PathBuf>,
    /// Receive loop: auto (io_uring, else recvmsg), io_uring, recvmsg.
    #[arg(long, value_enum)]
    reader: Option<ReaderKind>,
    /// Decoder threads (0 = one per CPU).
    #[arg(long)]
    decoders: Option<usize>,
    /// Do not load the eBPF filter; filter in user space.
    #[arg(long)]
    no_ebpf: bool,
    /// Sequence numbering of the exporter: per_message (+1 per IPFIX message, the HFT HLD's) or
    /// rfc7011 (+records, RFC 7011's).
    #[arg(long, value_parser = parse_seq_mode, value_name = "per_message|rfc7011")]
    seq_mode: Option<SeqMode>,
    /// Socket receive buffer, bytes.
    #[arg(long)]
    rcvbuf: Option<usize>,
    /// Status file (JSON of every counter, rewritten each second; mode 0600). Default:
    /// status.json in the data directory (/run/stel/status.json for a root daemon started
    /// without --config or --data-dir).
    #[arg(long)]
    status_file: Option<PathBuf>,
    /// Where the run writes: the Parquet history, and (unless --status-file / --inspect-socket
    /// say otherwise) the status file and the inspect socket. Default: ./stel-data with --demo,
    /// --input or --int-only, else [parquet] dir or /var/lib/stel. One daemon at a time: a run
    /// that writes history or its status file there locks it (<data dir>/.stel-ingestd.lock)
    /// and a second one is refused.
    #[arg(long, env = "STEL_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// Group of every file, directory and socket the daemon creates (history 0640, sockets
    /// 0660, state files 0600, directories 0750, whatever the umask); the daemon takes it as
    /// its group at start. Default: its own group ([files] group).
    #[arg(long, value_name = "GROUP")]
    group: Option<String>,
    /// Rates on the status line: bytes (MB/s, SONiC portstat style, the default) or bits
    /// (Gb/s) ([status] rate_unit).
    #[arg(long, value_name = "bytes|bits")]
    rate_unit: Option<stel_store::rate::RateUnit>,
    /// Do not write the counters' Parquet history (INT tables, with --int-listen, are still
    /// written under --data-dir). The data directory is still locked while the status file is
    /// there (its default): a run with neither history nor INT tables locks nothing only with
    /// a --status-file elsewhere.
    #[arg(long, conflicts_with = "upload_to")]
    no_history: bool,
    /// Copy every Parquet file the history publishes to this data lake, keeping the Hive
    /// layout: a directory, file:///dir or s3://bucket/prefix. S3 settings come from
    /// AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION and
    /// AWS_ALLOW_HTTP=true (http endpoints). Progress survives restarts
    /// (<data dir>/.stel-upload-state); other settings: [upload] in the config file.
    #[arg(long, value_name = "URL")]
    upload_to: Option<String>,
    /// Live inspect socket that `stel-query inspect` reads (mode 0660; default: inspect.sock
    /// next to the status file, e.g. /run/stel/inspect.sock or <data dir>/inspect.sock).
    #[arg(long, value_name = "PATH", conflicts_with = "no_inspect")]
    inspect_socket: Option<PathBuf>,
    /// Do not serve the live inspect socket.
    #[arg(long)]
    no_inspect: bool,
    /// SONiC Redis (e.g. unix:///var/run/redis/redis.sock): watch STATE_DB for sessions and
    /// write COUNTERS_DB + RATES.
    #[arg(long)]
    redis: Option<String>,
    /// Serve Prometheus /metrics and /health on this address, e.g. 127.0.0.1:9464 (off by
    /// default; [metrics] listen in the config file).
    #[arg(long, value_name = "ADDR")]
    metrics: Option<std::net::SocketAddr>,
    /// Also send every counter to this OpenTelemetry collector (OTLP/gRPC, e.g.
    /// http://127.0.0.1:4317; other settings: [otlp] in the config file).
    #[arg(long, value_name = "URL")]
    otlp_endpoint: Option<String>,
    /// Receive INT telemetry reports (UDP) on this address, e.g. 0.0.0.0:5900 (repeatable;
    /// other settings: [int] in the config file). Tables int_reports, int_hops, int_drops go
    /// under the data dir (table=…/switch=…/); `stel-query int` reads them.
    #[arg(long, value_name = "ADDR")]
    int_listen: Vec<std::net::SocketAddr>,
    /// EVC names for INT reports: a Kytos mef_eline listing (JSON, as GET
    /// /api/kytos/mef_eline/v2/evc/ returns it); re-read on SIGHUP.
    #[arg(long, value_name = "FILE")]
    int_kytos_evcs: Option<PathBuf>,
    /// No counter source: collect INT reports only (a collector host that is not a switch), on
    /// --int-listen or the config's [int] listen.
    #[arg(long, conflicts_with_all = ["demo", "usersock_group", "input"])]
    int_only: bool,
    /// Stop after this long, with a unit (e.g. 30s, 2m; a bare number is refused); default:
    /// until SIGINT/SIGTERM.
    #[arg(long, value_parser = stel_store::units::parse_duration_ns)]
    duration: Option<u64>,
    /// Print the final counters as JSON on stdout.
    #[arg(long)]
    json: bool,
    /// Log format on stderr: text (plain when stderr is not a terminal: no colour codes in
    /// files or journald) or json (one object per line, for log shippers).
    #[arg(long, value_enum, default_value_t = LogFormat::Text, env = "STEL_LOG_FORMAT")]
    log_format: LogFormat,
    /// The per-second status line on stderr: auto (on, except under systemd, where the status
    /// file and metrics carry the figures and journald would store a line a second), on, off.
    #[arg(long, value_enum, default_value_t = StatusLine::Auto)]
    status_line: StatusLine,
    /// Demo: ports to emulate.
    #[arg(long, default_value_t = 64)]
    ports: usize,
    /// Demo: stats per port.
    #[arg(long, default_value_t = 30)]
    stats: usize,
    /// Demo: poll interval.
    #[arg(long, default_value = "10us", value_parser = stel_store::units::parse_duration_ns)]
    interval: u64,
    /// Demo: load pattern.
    #[arg(long, value_enum, default_value_t = Pattern::Microburst)]
    pattern: Pattern,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum StatusLine {
    Auto,
    On,
    Off,
}

impl StatusLine {
    /// `auto`: off when systemd started us (it sets INVOCATION_ID; JOURNAL_STREAM when stderr
    /// goes to the journal).
    fn enabled(self) -> bool {
        match self {
            StatusLine::On => true,
            StatusLine::Off => false,
            StatusLine::Auto => {
                std::env::var_os("INVOCATION_ID").is_none()
                    && std::env::var_os("JOURNAL_STREAM").is_none()
            }
        }
    }
}

/// Log lines to stderr with the credentials of any URL in them masked
/// ([`stel_store::redact`]): whatever a library puts in an error message, no password leaves.
struct RedactedStderr;

impl std::io::Write for RedactedStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        // The formatter hands over one whole event per call.
        let text = String::from_utf8_lossy(buf);
        std::io::stderr().write_all(stel_store::redact::redact(&text).as_bytes())?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

/// Logs to stderr: plain text without colour codes unless stderr is a terminal, or JSON lines;
/// credentials in URLs masked.
fn init_logs(format: LogFormat) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let b = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(|| RedactedStderr);
    match format {
        LogFormat::Json => b.json().init(),
        LogFormat::Text => b.with_ansi(std::io::stderr().is_terminal()).init(),
    }
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Build the rollup tiers (store/ROLLUPS.md) from raw Parquet history already on disk —
    /// history written without them, or a capture ingested with --input — exactly as the
    /// daemon writes them live.
    ///
    /// Example: stel-ingestd rollup --data-dir /var/lib/stel
    Rollup {
        /// Raw history to read (profile=…/group=…/date=…/hour=…/part-….parquet); a directory
        /// that does not exist or holds none is an error (exit 2).
        #[arg(long)]
        data_dir: PathBuf,
        /// Where the tiers go (default: the data dir itself). Refused if tiers are there already,
        /// or while a daemon writes that directory (its lock, as a daemon's).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Configuration file whose [rollup] section says which tiers (default: the built-in
        /// 1 s and 1 min tiers) and whose [parquet] switch_name names the switch.
        #[arg(long, short = 'c')]
        config: Option<PathBuf>,
    },
    /// Print the running daemon's counters (its status file).
    ///
    /// Which file: --file; else status.json in --data-dir (or STEL_DATA_DIR), the daemon's data
    /// directory; else, of /run/stel/status.json, ./stel-data/status.json and
    /// /var/lib/stel/status.json (where daemons write it by default), a running daemon's before
    /// a stopped one's, the most recently written among several (one it may not read, before a
    /// stopped one's: it says why). The file read is named on stderr.
    #[command(verbatim_doc_comment)]
    Status {
        /// Status file to read (wins over --data-dir).
        #[arg(long)]
        file: Option<PathBuf>,
        /// The daemon's data directory, as given to it: reads <DATA_DIR>/status.json.
        #[arg(long, env = "STEL_DATA_DIR")]
        data_dir: Option<PathBuf>,
        /// Print the whole status file (JSON) instead of the registry's table.
        #[arg(long)]
        json: bool,
        /// With the table: each metric's help text under it.
        #[arg(long)]
        help_text: bool,
    },
}

/// `per_message` (documented; `per-message` accepted too) or `rfc7011`.
fn parse_seq_mode(s: &str) -> Result<SeqMode, String> {
    match s {
        "per_message" | "per-message" => Ok(SeqMode::PerMessage),
        "rfc7011" => Ok(SeqMode::Rfc7011),
        _ => Err(format!("{s}: expected per_message or rfc7011")),
    }
}

fn config_from(a: &Args) -> Result<DaemonConfig, String> {
    let mut cfg = match &a.config {
        Some(p) => DaemonConfig::load(p).map_err(|e| e.to_string())?,
        None => DaemonConfig::default(),
    };
    if a.demo {
        cfg.source.kind = SourceKind::Demo;
    }
    if let Some(g) = a.usersock_group {
        cfg.source.kind = SourceKind::Usersock;
        cfg.source.usersock_group = g;
    }
    if let Some(c) = &a.constants {
        cfg.source.constants = c.clone();
    }
    if let Some(r) = a.reader {
        cfg.reader.kind = r;
    }
    if let Some(d) = a.decoders {
        cfg.pipeline.decoders = d;
    }
    if a.no_ebpf {
        cfg.filter.ebpf = false;
    }
    if let Some(p) = a.filter_policy {
        cfg.filter.policy = p;
    }
    if !a.input.is_empty() {
        cfg.source.kind = SourceKind::File;
        cfg.source.files = a.input.clone();
    }
    if let Some(f) = a.input_format {
        cfg.source.input_format = f;
    }
    if let Some(m) = a.seq_mode {
        cfg.pipeline.decode.seq_mode = m;
    }
    if let Some(b) = a.rcvbuf {
        cfg.source.rcvbuf_bytes = b;
    }
    if let Some(f) = &a.status_file {
        cfg.status.file = Some(f.clone());
    } else if let Some(d) = &a.data_dir {
        // Everything a run writes follows --data-dir.
        cfg.status.file = Some(d.join("status.json"));
    } else if a.config.is_none() && !a.demo && a.input.is_empty() && euid_is_root() {
        cfg.status.file = Some(PathBuf::from("/run/stel/status.json"));
    }
    if let Some(g) = &a.group {
        cfg.files.group = g.clone();
    }
    if let Some(u) = a.rate_unit {
        cfg.status.rate_unit = u;
    }
    if a.no_history {
        cfg.history.enabled = false;
    }
    if let Some(u) = &a.upload_to {
        cfg.upload.get_or_insert_with(Default::default).to = u.clone();
    }
    if cfg.upload.is_some() && !cfg.history.enabled {
        return Err(
            "uploading needs the Parquet history: drop --no-history / [history] enabled = false"
                .into(),
        );
    }
    if let Some(p) = &a.inspect_socket {
        cfg.inspect.socket = p.clone();
    }
    if a.no_inspect {
        cfg.inspect.enabled = false;
    }
    if let Some(d) = &a.data_dir {
        // The history's root, and the INT tables' with the history off too ([parquet] is
        // ignored then, its dir is not).
        cfg.parquet.get_or_insert_with(Default::default).dir = d.clone();
    } else if cfg.history.enabled {
        let p = cfg.parquet.get_or_insert_with(Default::default);
        if (a.demo || !a.input.is_empty()) && a.config.is_none() {
            p.dir = PathBuf::from("stel-data");
        }
    }
    if !a.int_listen.is_empty() {
        cfg.int.get_or_insert_with(Default::default).listen = a.int_listen.clone();
    }
    if let Some(p) = &a.int_kytos_evcs {
        cfg.int.get_or_insert_with(Default::default).evc.kytos_evcs = Some(p.clone());
    }
    if a.int_only {
        if cfg.int.as_ref().is_none_or(|i| i.listen.is_empty()) {
            return Err(
                "--int-only collects INT reports only: give it somewhere to listen (--int-listen 0.0.0.0:5900, or [int] listen in --config)"
                    .into(),
            );
        }
        cfg.source.kind = SourceKind::None;
        if cfg.history.enabled && a.data_dir.is_none() && a.config.is_none() {
            cfg.parquet.get_or_insert_with(Default::default).dir = PathBuf::from("stel-data");
        }
    }
    if let Some(i) = &cfg.int {
        let problems = i.problems();
        if !problems.is_empty() {
            return Err(problems.join("; "));
        }
    }
    if let Some(m) = a.metrics {
        cfg.metrics.listen = Some(m);
    }
    if let Some(e) = &a.otlp_endpoint {
        cfg.otlp.get_or_insert_with(Default::default).endpoint = e.clone();
    }
    if let Some(url) = &a.redis {
        cfg.counters_db.get_or_insert_with(Default::default).url = url.clone();
        cfg.state_db.get_or_insert_with(Default::default).url = url.clone();
        if let Some(o) = cfg.otlp.as_mut() {
            o.config_db.get_or_insert_with(Default::default).url = url.clone();
        }
    }
    cfg.sessions
        .extend(a.session.iter().map(|p| SessionFile { path: p.clone() }));
    Ok(cfg)
}

fn euid_is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|v| v == "0"))
        })
        .unwrap_or(false)
}

fn run(a: Args) -> Result<ExitCode, String> {
    let stop = signal::stop_flag();
    let cfg = config_from(&a)?;
    let demo_cfg = (cfg.source.kind == SourceKind::Demo).then_some(DemoSettings {
        ports: a.ports,
        stats: a.stats,
        interval_ns: a.interval,
        pattern: a.pattern,
    });
    let (local_rx, local_tx) = if demo_cfg.is_some() {
        let (r, t) = sys::local_datagram_pair().map_err(|e| e.to_string())?;
        (Some(r), Some(t))
    } else {
        (None, None)
    };
    let status_file = cfg.status_file();
    let data_dir = cfg.data_dir();
    let interval = Duration::from_millis(cfg.status.interval_ms.max(100));
    let rate_unit = cfg.status.rate_unit;
    let input_files = (cfg.source.kind == SourceKind::File).then(|| cfg.source.files.clone());
    let int_only = cfg.source.kind == SourceKind::None;
    // The whole daemon in one pass: config checked, privileged set-up, privileges dropped,
    // sinks, decoders, INT, metrics, STATE_DB, sessions.
    let mut topo = Topology::build(cfg, local_rx)?;
    if let Some(files) = &input_files {
        check_inputs(files)?;
    }
    let hup = signal::hup_flag();
    let halt = Arc::new(AtomicBool::new(false));
    let mut producer = None;
    if let (Some(d), Some(tx)) = (demo_cfg, local_tx) {
        let emu = demo::emulator(&d)?;
        // Registered before the first message leaves: the filter keeps only registered data.
        topo.daemon
            .register(emu.session_spec(), emu.session_config())?;
        let asked = emu.cfg.counters_per_s();
        eprintln!(
            "stel-ingestd: demo: asking the emulator for {} ports × {} stats every {} ns ({} counters/s) through the daemon's reader; the rate it achieves is printed at the end; Ctrl-C stops",
            d.ports, d.stats, d.interval_ns, demo::rate(asked)
        );
        producer = Some((demo::spawn(emu, tx, Arc::clone(&halt))?, asked));
    }
    if let Some(g) = topo.daemon.genl_status() {
        eprintln!("stel-ingestd: {g}");
    }

    let deadline = a.duration.map(|d| Instant::now() + Duration::from_nanos(d));
    let files = topo.daemon.status().input.is_some();
    let mut ticker = StatusTicker::new(
        &topo,
        status_file,
        interval,
        a.status_line.enabled(),
        rate_unit,
    );
    while !stop.load(Ordering::Relaxed) && deadline.is_none_or(|d| Instant::now() < d) {
        topo.daemon.step()?;
        if files && topo.daemon.input_done() {
            break;
        }
        if let Some((w, rx)) = &topo.state_db {
            let acker = w.acker();
            while let Ok(ev) = rx.try_recv() {
                topo.daemon.apply_state_db(ev, &acker);
            }
        }
        if hup.swap(false, Ordering::Relaxed) {
            match topo.int.as_mut() {
                Some(i) => i.reload_evcs(),
                // Said, so an operator who sent it expecting a config reload is not left guessing.
                None => tracing::info!(
                    "SIGHUP: nothing to reload (it re-reads the INT EVC names; the configuration \
                     is read at start: restart to change it)."
                ),
            }
        }
        ticker.maybe_tick(&topo);
    }

    // Stop reading new data, drain what is in flight, flush, exit 0.
    if let Some(sig) = signal::stop_signal() {
        tracing::info!("Stopping on {sig}: draining and flushing.");
    }
    halt.store(true, Ordering::Relaxed);
    // The emulator may be blocked sending into a full socket: keep reading until it has stopped.
    if let Some((h, _)) = &producer {
        while !h.is_finished() {
            topo.daemon.step()?;
        }
    }
    let (demo_done, sent) = match producer.take() {
        Some((h, asked)) => {
            let (t, s, p) = h.join().map_err(|_| "emulator thread panicked")?;
            (Some((t, p, asked)), s)
        }
        None => (None, 0),
    };
    // The demo waits for all it sent; a socket or files: what was received at the stop (the
    // socket buffer and the ring as they stood), not until the source goes quiet; 5 s at most.
    let drained = move |r: &sys::uring::RecvStats| r.datagrams + r.truncated >= sent;
    let fin = topo.finish(
        demo_done
            .as_ref()
            .map(|_| &drained as &dyn Fn(&sys::uring::RecvStats) -> bool),
        Duration::from_secs(5),
    );
    let st = &fin.status;
    if let Some((t, pace, asked)) = &demo_done {
        eprintln!(
            "stel-ingestd: demo done: emulator sent {} snapshots ({} counters), decoder decoded {} ({} counters)",
            t.records, t.samples, st.pipeline.decode.records, st.pipeline.decode.counters
        );
        eprintln!("stel-ingestd: {}", demo::pace_line(*asked, t.samples, pace));
    }
    let json = ticker.finish(&fin);
    if a.json {
        println!("{json}");
    }
    if let Some(i) = &st.input {
        eprintln!(
            "stel-ingestd: input: {} files ({} unreadable), {} bytes, {} units; {} unreadable records, {} packets skipped, {} INT datagrams, {} other UDP datagrams, {} IP datagrams reassembled",
            i.files, i.files_failed, i.bytes_read, i.units, i.unreadable_records, i.skipped_packets, i.int_datagrams, i.non_ipfix_datagrams, i.ip_reassembled
        );
    }
    let how = format!(
        "reader {}, filter {} {}",
        st.reader, st.filter.kind, st.filter.policy
    );
    let m = &fin.metrics;
    // Input files from which nothing was decoded, neither counters nor INT reports: say why and
    // fail (exit 2, as the exit-code help says), whatever the reason: nothing recognisable (no
    // IPFIX message with a valid header, no INT report, nothing a filter recognised and dropped
    // by configuration), or IPFIX that was all filtered, of unknown templates or malformed (a
    // capture cut mid-stream, after its templates). A live socket that decoded nothing exits 0
    // below: the exporter may only be late.
    if let Some(i) = &st.input {
        use stel_store::metrics::Metric as M;
        let recognised = st.pipeline.decode.messages
            + st.filter.dropped
            + m.sum(M::IntDecodedReports)
            + m.sum(M::IntFilterDroppedDatagrams);
        let undecodable = st.nothing_decoded().is_some() && m.sum(M::IntDecodedReports) == 0;
        if recognised == 0 || undecodable {
            let mut why = st.nothing_decoded().unwrap_or_else(|| {
                format!(
                    "{} bytes read from {} file(s) ({} unreadable records, {} bytes discarded): \
                     not HFT IPFIX (netlink, IPFIX file or pcap) nor INT reports",
                    i.bytes_read, i.files, i.unreadable_records, i.discarded_bytes
                )
            });
            for p in &st.input_problems {
                why.push_str(&format!("; {p}"));
            }
            tracing::warn!("Nothing decoded from the input: {why}.");
            eprintln!(
                "stel-ingestd: NOTHING WAS DECODED from the input ({}): {why} ({how}; --input-format \
                 names the format when detection guesses wrong)",
                input_files
                    .iter()
                    .flatten()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            return Ok(ExitCode::from(2));
        }
    }
    let parquet = |metric| {
        m.series(metric)
            .filter(|x| x.label(stel_store::metrics::Label::Sink) == "parquet")
            .map(|x| x.value)
            .sum::<u64>()
    };
    let (written, lost) = (
        parquet(stel_store::metrics::Metric::SinkDeliveredSamples),
        parquet(stel_store::metrics::Metric::SinkDroppedSamples),
    );
    let drops = report::sink_drops(m);
    if written == 0 && lost > 0 {
        eprintln!(
            "stel-ingestd: stopped, but THE HISTORY WROTE NOTHING under {}: {} ({how})",
            data_dir.display(),
            drops.unwrap_or_default()
        );
        return Ok(ExitCode::from(2));
    }
    // COUNTERS_DB's Redis not connected at the end: the live view was not (all) written.
    let redis = fin
        .redis_down
        .as_deref()
        .map_or_else(String::new, |d| report::redis_down_part(d, false));
    // Files the uploader could not upload (a bucket that does not exist, no credentials, …).
    let upload = fin.upload_pending.as_ref().map(report::upload_pending_part);
    let and_upload = upload
        .as_deref()
        .map_or_else(String::new, |u| format!("; and {u}"));
    match (st.nothing_decoded(), drops) {
        (Some(w), _) => {
            tracing::warn!("Nothing decoded: {w}.");
            eprintln!(
                "stel-ingestd: stopped cleanly but NOTHING WAS DECODED: {w} ({how}){redis}{and_upload}"
            );
        }
        (None, Some(d)) => eprintln!(
            "stel-ingestd: stopped: {} snapshots decoded, but SINKS DROPPED {d} ({how}){redis}{and_upload}",
            st.pipeline.decode.records
        ),
        (None, None) if !redis.is_empty() => eprintln!(
            "stel-ingestd: stopped: {} snapshots decoded, {how}, but COUNTERS_DB was not written{redis}{and_upload}",
            st.pipeline.decode.records
        ),
        (None, None) if upload.is_some() => eprintln!(
            "stel-ingestd: stopped: {} snapshots decoded, {how}, but {}",
            st.pipeline.decode.records,
            upload.unwrap_or_default()
        ),
        (None, None) if int_only => eprintln!("stel-ingestd: stopped cleanly (INT only)"),
        (None, None) if !report::counter_path_applies(m) => eprintln!(
            "stel-ingestd: stopped cleanly: {} INT reports decoded, no counters in the input",
            m.sum(stel_store::metrics::Metric::IntDecodedReports)
        ),
        (None, None) => eprintln!(
            "stel-ingestd: stopped cleanly: {} snapshots decoded, {how}",
            st.pipeline.decode.records
        ),
    }
    Ok(ExitCode::SUCCESS)
}

/// Before anything starts: every `--input` file must exist, be readable and hold bytes; when
/// none does, that is the error (naming each file and why). Some unreadable: warned, skipped.
///
/// # Errors
/// No input file can be read.
fn check_inputs(files: &[PathBuf]) -> Result<(), String> {
    let mut bad = Vec::new();
    for f in files {
        let why = match std::fs::File::open(f).and_then(|h| h.metadata()) {
            Err(e) => Some(e.to_string()),
            Ok(m) if m.is_dir() => Some("a directory, not a file".to_string()),
            Ok(m) if m.len() == 0 => Some("empty".to_string()),
            Ok(_) => None,
        };
        if let Some(w) = why {
            bad.push(format!("{}: {w}", f.display()));
        }
    }
    if bad.len() == files.len() {
        return Err(format!("no input file can be read: {}", bad.join("; ")));
    }
    for b in &bad {
        tracing::warn!("Input file skipped: {b}.");
    }
    Ok(())
}

/// `--check-config FILE`: prints every problem and returns 2, or "ok" and 0.
fn check_config(f: &Path) -> ExitCode {
    let problems = match std::fs::read_to_string(f) {
        Ok(text) => DaemonConfig::check(&text),
        Err(e) => vec![format!("cannot read it: {e}")],
    };
    if problems.is_empty() {
        println!("ok");
        return ExitCode::SUCCESS;
    }
    for p in &problems {
        println!("{}: {p}", f.display());
    }
    eprintln!(
        "stel-ingestd: {} problem(s) in {} (every key is documented in deploy/stel-ingestd.toml)",
        problems.len(),
        f.display()
    );
    ExitCode::from(2)
}

/// `stel-ingestd rollup`: tiers from raw files.
fn rollup(data_dir: &Path, out: Option<&Path>, config: Option<&Path>) -> Result<(), String> {
    let cfg = match config {
        Some(p) => DaemonConfig::load(p).map_err(|e| e.to_string())?,
        None => DaemonConfig::default(),
    };
    // Checked before the lock, which would create the directory.
    if !data_dir.is_dir() {
        return Err(format!(
            "{} does not exist or is not a directory (is --data-dir right?)",
            data_dir.display()
        ));
    }
    let out = out.unwrap_or(data_dir);
    // The tiers are history: one writer per directory, as for the daemon (held until return).
    // A directory that exists is locked first (a daemon writing it may not have published its
    // first raw file yet: that it is in use is the answer); one that does not is created, by
    // the lock, only when there is something to build.
    let lock = || sys::dirlock::lock_dir(out, "--out").map_err(|e| e.to_string());
    let held = if out.is_dir() { Some(lock()?) } else { None };
    if !stel_store::rollup::has_raw_history(data_dir) {
        return Err(stel_store::rollup::RebuildError::NoRaw(data_dir.to_path_buf()).to_string());
    }
    let _held = match held {
        Some(h) => h,
        None => lock()?,
    };
    let switch = cfg.parquet.as_ref().and_then(|p| p.switch_name.clone());
    let t = Instant::now();
    let r = stel_store::rollup::rebuild(data_dir, out, &cfg.rollup, switch, |p, rows| {
        eprintln!("stel-ingestd: rollup: {} ({rows} rows)", p.display());
    })
    .map_err(|e| e.to_string())?;
    let tiers = cfg.rollup.resolve().map(|x| x.0).unwrap_or_default();
    let per: Vec<String> = tiers
        .iter()
        .zip(r.written.rows.iter().zip(&r.written.bytes))
        .map(|(t, (rows, bytes))| format!("{}: {rows} rows, {bytes} bytes", t.name))
        .collect();
    eprintln!(
        "stel-ingestd: rollup: {} raw files ({} snapshots, {} counters) → {} tier files under {} in {:.1} s ({})",
        r.files_read,
        r.rows_read,
        r.samples_read,
        r.written.files,
        out.display(),
        t.elapsed().as_secs_f64(),
        per.join("; ")
    );
    if r.written.write_errors > 0 {
        return Err(format!(
            "{} tier files could not be written",
            r.written.write_errors
        ));
    }
    Ok(())
}

fn main() -> ExitCode {
    let a = Args::parse();
    if let Some(f) = &a.check_config {
        return check_config(f);
    }
    init_logs(a.log_format);
    // Before any thread or big allocation: the Parquet writer otherwise faults in a 2 MiB huge
    // page per column per row group (see the function).
    sys::disable_transparent_huge_pages();
    if let Some(Command::Status {
        file,
        data_dir,
        json,
        help_text,
    }) = a.command
    {
        let file = match (file, data_dir) {
            (Some(f), _) => Ok(f),
            (None, Some(d)) => Ok(d.join("status.json")),
            (None, None) => {
                report::pick_status_file(&report::STATUS_FILE_DEFAULTS.map(PathBuf::from))
            }
        };
        let shown = file.and_then(|f| {
            eprintln!("stel-ingestd: status from {}", f.display());
            report::show(&f, json, help_text)
        });
        return match shown {
            Ok(shown) => {
                print!("{}", shown.out);
                match shown.stale {
                    Some(why) => {
                        eprintln!("stel-ingestd: {why}");
                        ExitCode::from(1)
                    }
                    None => ExitCode::SUCCESS,
                }
            }
            Err(e) => {
                eprintln!("stel-ingestd: {e}");
                ExitCode::from(2)
            }
        };
    }
    if let Some(Command::Rollup {
        data_dir,
        out,
        config,
    }) = &a.command
    {
        return match rollup(data_dir, out.as_deref(), config.as_deref()) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("stel-ingestd: rollup: {e}");
                ExitCode::from(2)
            }
        };
    }
    match run(a) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("stel-ingestd: {}", stel_store::redact::redact(&e));
            ExitCode::from(2)
        }
    }
}
