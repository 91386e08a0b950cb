//! The status outputs the main loop writes each tick: the status file (JSON), the per-second
//! status line on stderr and what `stel-ingestd status` prints, all read from one registry
//! snapshot (plus the typed [`StatusInfo`] the registry cannot hold).
use std::{
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use serde::Serialize;
use stel_store::{
    metrics::{Label, Metric, Snapshot},
    rate::RateUnit,
};

use crate::{
    daemon::DaemonStatus,
    decode::DomainSeqStats,
    sinks::Live,
    topology::{Finished, Topology},
};

/// RX/TX rates of the first ports between two status ticks (from the live sink's newest
/// snapshot of the first session), in the configured unit (bytes per second, portstat style,
/// by default).
#[derive(Debug, Default)]
pub struct Rates {
    prev: Option<(i64, Vec<u64>)>,
    /// Column names of the schema last seen, and their indices in natural order.
    names: Option<(Arc<stel_store::SessionSchema>, Vec<String>, Vec<usize>)>,
    unit: RateUnit,
}

impl Rates {
    /// Rates shown in `unit`.
    pub fn new(unit: RateUnit) -> Self {
        Self {
            unit,
            ..Self::default()
        }
    }

    /// The rates since the previous call (empty on the first).
    pub fn line(&mut self, live: &Live) -> String {
        let Some((ts, row, schema)) = live.state().first() else {
            return String::new();
        };
        if !self
            .names
            .as_ref()
            .is_some_and(|(s, _, _)| Arc::ptr_eq(s, &schema))
        {
            let n: Vec<String> = schema.columns.iter().map(|c| c.wide_name()).collect();
            // The ports shown, in natural order (Ethernet0, Ethernet4, …, not Ethernet100).
            let mut order: Vec<usize> = (0..n.len()).collect();
            order.sort_by(|&a, &b| stel_store::sai::natural_cmp(&n[a], &n[b]));
            self.names = Some((Arc::clone(&schema), n, order));
        }
        let (_, names, order) = self.names.as_ref().expect("just set");
        let mut s = String::new();
        if let Some((pts, prow)) = &self.prev {
            let dt = (ts - *pts) as f64 / 1e9;
            if dt > 0.0 && prow.len() == row.len() {
                let bytes_per_s = |i: usize| row[i].wrapping_sub(prow[i]) as f64 / dt;
                for &i in order {
                    if let Some(port) = names[i].strip_suffix(".IF_IN_OCTETS") {
                        let tx = names
                            .iter()
                            .position(|m| m == &format!("{port}.IF_OUT_OCTETS"))
                            .map_or(0.0, bytes_per_s);
                        s.push_str(&format!(
                            " {port} rx {} tx {};",
                            self.unit.format(bytes_per_s(i)),
                            self.unit.format(tx)
                        ));
                        if s.matches(';').count() == 3 {
                            break;
                        }
                    }
                }
            }
        }
        self.prev = Some((ts, row));
        s
    }
}

/// The status file's JSON: `metrics`, every series of the registry (the same snapshot the
/// status line, `/metrics` and OTLP read: every counter is there and only there), and `info`,
/// what is not a counter ([`StatusInfo`]).
pub fn status_json(
    st: &DaemonStatus,
    snap: &Snapshot,
    interval: Duration,
    stopped: bool,
) -> serde_json::Value {
    serde_json::json!({
        "info": StatusInfo::of(st, interval, stopped),
        "metrics": snap.to_json(),
    })
}

/// The status file's `info` section: what the daemon runs and state that is not a counter.
#[derive(Debug, Serialize)]
pub struct StatusInfo<'a> {
    /// The daemon's version.
    pub version: &'static str,
    /// The daemon's process ID (`stel-ingestd status` checks that it still runs).
    pub pid: u32,
    /// When this file was written, ms since the Unix epoch.
    pub written_unix_ms: u64,
    /// How often the daemon rewrites it, ms (older than 3 intervals, and at least 5 s: stale).
    pub interval_ms: u64,
    /// True in the file written when the daemon stopped.
    pub stopped: bool,
    /// The counter source (socket, group, files, or the genl family's state).
    pub source: &'a str,
    /// The receive loop: `io_uring` or `recvmsg` (or `file`).
    pub reader: &'static str,
    /// The template filter: where it runs and its policy.
    pub filter: FilterInfo,
    /// Sequence figures per observation domain (one exporter each). Not registry series:
    /// domain IDs are not bounded label values. At most `MAX_TRACKED_DOMAINS` per decoder.
    pub decode_domains: &'a [DomainSeqStats],
    /// Per component, what is not a counter (the uploader's switch and last error; the INT
    /// source's listen addresses, receive loop and where its report filter runs).
    pub components: &'a serde_json::Map<String, serde_json::Value>,
}

/// The template filter's settings and last verdict.
#[derive(Debug, Serialize)]
pub struct FilterInfo {
    /// `kernel` (eBPF) or `user_space`.
    pub kind: &'static str,
    /// `registered` or `learn`.
    pub policy: &'static str,
    /// The template ID of the last message the filter dropped (0: none).
    pub last_dropped_template: u16,
}

impl<'a> StatusInfo<'a> {
    /// The info part of a status, written now by a daemon that rewrites it every `interval`
    /// (`stopped`: the last one).
    pub fn of(st: &'a DaemonStatus, interval: Duration, stopped: bool) -> Self {
        Self {
            version: env!("CARGO_PKG_VERSION"),
            pid: std::process::id(),
            written_unix_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            interval_ms: interval.as_millis() as u64,
            stopped,
            source: &st.source,
            reader: st.reader,
            filter: FilterInfo {
                kind: st.filter.kind,
                policy: st.filter.policy,
                last_dropped_template: st.filter.last_dropped_template,
            },
            decode_domains: &st.pipeline.decode.domains,
            components: &st.components,
        }
    }
}

/// Writes the status file `json` ([`status_json`]) atomically (a temp file renamed over it;
/// mode 0600, see `stel_store::durable`); an empty path writes nothing. A failure is logged
/// once.
pub fn write_status(path: &Path, json: &serde_json::Value) {
    if path.as_os_str().is_empty() {
        return;
    }
    let body = serde_json::to_string_pretty(json).unwrap_or_default();
    // Credentials of any URL a component reports (an uploader's error) stay out of the file.
    let body = stel_store::redact::redact(&body);
    if let Err(e) = stel_store::durable::write_state_file(path, body.as_bytes()) {
        static WARNED: AtomicBool = AtomicBool::new(false);
        if !WARNED.swap(true, Ordering::Relaxed) {
            tracing::warn!(path = %path.display(), error = %e, "Could not write the status file.");
        }
    }
}

/// One line of figures, read from two registry snapshots. `filtered` is the template filter's
/// count alone (kernel or user space: each message counted once); `seq` is loss the sequence
/// numbers show, in gap events too; when the kernel filter dropped data of a domain whose other
/// templates are decoded, its gaps include those messages (said in the line).
pub fn status_line(
    now: &Snapshot,
    prev: &Snapshot,
    dt: f64,
    unit: RateUnit,
    rates: &str,
) -> String {
    use Metric as M;
    let seq = now.sum(M::DecodeSeqLostMessages) + now.sum(M::DecodeSeqLostRecords);
    let dropped = now.sum(M::FilterDroppedMessages);
    let overlap = if seq > 0 && now.sum(M::FilterKernelState) == 1 && dropped > 0 {
        " (seq gaps include messages the kernel filter dropped)"
    } else {
        ""
    };
    // The counter socket's reader (INT's has source="int" and its own part of the line).
    let reader = |s: &Snapshot, m: Metric| {
        s.series(m)
            .filter(|x| x.label(Label::Source) != "int")
            .map(|x| x.value)
            .sum::<u64>()
    };
    let sinks = sink_drops(now).map_or_else(String::new, |d| format!(" | SINKS DROPPED {d}"));
    format!(
        "stel-ingestd: {:>6.1} M counters/s {:>13} | {} msgs, {} snapshots | lost: kernel {} seq {} in {} gaps{} shed {} trunc {}{sinks} | filtered {} malformed {}{}",
        now.sum(M::DecodeValues).saturating_sub(prev.sum(M::DecodeValues)) as f64 / dt / 1e6,
        unit.format(
            reader(now, M::ReaderBytes).saturating_sub(reader(prev, M::ReaderBytes)) as f64 / dt
        ),
        now.sum(M::DecodeMessages),
        now.sum(M::DecodeRecords),
        reader(now, M::ReaderKernelDroppedDatagrams),
        seq,
        now.sum(M::DecodeSeqGaps),
        overlap,
        now.sum(M::DispatchShedMessages),
        reader(now, M::ReaderTruncatedDatagrams),
        dropped,
        now.sum(M::DecodeMalformed),
        rates
    )
}

/// Whether the counter path's figures (the first part of the status line) mean anything: not
/// for an INT-only collector (no counter source), nor for capture files in which INT reports
/// were decoded and the counter path has seen nothing (no IPFIX message decoded or dropped by
/// the filter) — a file with nothing recognisable keeps them, to show that.
pub fn counter_path_applies(now: &Snapshot) -> bool {
    use Metric as M;
    let sources: Vec<&str> = now
        .series(M::ReaderBytes)
        .map(|x| x.label(Label::Source))
        .filter(|l| *l != "int")
        .collect();
    counters_apply(
        !sources.is_empty() && sources.iter().all(|l| *l == "none"),
        sources == ["file"],
        now.sum(M::DecodeMessages) + now.sum(M::FilterDroppedMessages),
        now.sum(M::IntDecodedReports),
    )
}

/// [`counter_path_applies`] from the figures: `int_only` (no counter source), `files`
/// (`--input`), `counter_seen` (IPFIX messages decoded or dropped by the template filter),
/// `int_reports` (INT reports decoded).
pub fn counters_apply(int_only: bool, files: bool, counter_seen: u64, int_reports: u64) -> bool {
    !(int_only || files && int_reports > 0 && counter_seen == 0)
}

/// The status line's part for a COUNTERS_DB Redis that is not connected, from
/// [`crate::sinks::CountersDb::down`] (`<url>: <error>`, credentials already masked):
/// ` | REDIS DOWN (redis://127.0.0.1:16398: Connection refused (os error 111), retrying)`;
/// `retrying` while running, not on the final line.
pub fn redis_down_part(down: &str, retrying: bool) -> String {
    if retrying {
        format!(" | REDIS DOWN ({down}, retrying)")
    } else {
        format!(" | REDIS DOWN ({down})")
    }
}

/// The status line's part while uploads fail, from [`crate::topology::Topology::upload_failing`]:
/// ` | UPLOAD FAILING (s3://lake/stel: bucket lake does not exist (NoSuchBucket: …))`.
pub fn upload_failing_part(failing: &str) -> String {
    format!(" | UPLOAD FAILING ({failing})")
}

/// The last line's words for files the uploader left pending: `3 files were not uploaded to
/// s3://lake/stel (<why>; they stay in the data dir and go at the next start) | UPLOAD PENDING 3`.
pub fn upload_pending_part(p: &crate::topology::UploadPending) -> String {
    let why = p
        .why
        .as_deref()
        .unwrap_or("the stop's upload time ran out, [upload] shutdown_timeout_ms");
    format!(
        "{} files were not uploaded to {} ({why}; they stay in the data dir and are uploaded at \
         the next start) | UPLOAD PENDING {}",
        p.files, p.destination, p.files
    )
}

/// What the sinks dropped (disk full, queue full, memory budget, …), per sink with its reasons:
/// `parquet 1234 (disk_full 1000, queue_full 234)`; `None` when nothing was dropped.
pub fn sink_drops(now: &Snapshot) -> Option<String> {
    let mut per: Vec<(String, u64, Vec<String>)> = Vec::new();
    for x in now
        .series(Metric::SinkDroppedSamples)
        .filter(|x| x.value > 0)
    {
        let sink = x.label(Label::Sink).to_string();
        let reason = format!("{} {}", x.label(Label::Reason), x.value);
        match per.iter_mut().find(|p| p.0 == sink) {
            Some(p) => {
                p.1 += x.value;
                p.2.push(reason);
            }
            None => per.push((sink, x.value, vec![reason])),
        }
    }
    if per.is_empty() {
        return None;
    }
    Some(
        per.iter()
            .map(|(s, n, r)| format!("{s} {n} samples ({})", r.join(", ")))
            .collect::<Vec<_>>()
            .join(", "),
    )
}

/// The INT source's part of the status line, from the same two snapshots (`None` without
/// `[int]`): `int 12.3 k reports/s, 0 malformed, 0 seq lost, 0 kernel drops, 0 shed`, and with
/// `[int.filter]` what it dropped and where it runs (`filter_kind`, from the status info).
pub fn int_status_line(
    now: &Snapshot,
    prev: &Snapshot,
    dt: f64,
    filter_kind: Option<&str>,
) -> Option<String> {
    use Metric as M;
    if !now.has(M::IntReports) {
        return None;
    }
    let rate = now
        .sum(M::IntReports)
        .saturating_sub(prev.sum(M::IntReports)) as f64
        / dt.max(1e-3);
    let shed: u64 = [
        "queue_full",
        "queue_timeout",
        "memory_budget",
        "closed",
        "switch_limit",
        "switch_rate",
    ]
    .iter()
    .map(|r| {
        now.series(M::SinkDroppedSamples)
            .filter(|s| s.label(Label::Sink) == "int" && s.label(Label::Reason) == *r)
            .map(|s| s.value)
            .sum::<u64>()
    })
    .sum();
    let mut line = format!(
        "int {:.1} k reports/s, {} malformed, {} seq lost, {} kernel drops, {} shed",
        rate / 1e3,
        now.sum(M::IntMalformedReports),
        now.sum(M::IntSeqLostReports),
        now.sum_where(M::ReaderKernelDroppedDatagrams, Label::Source, "int"),
        shed
    );
    if let Some(kind) = filter_kind {
        line.push_str(&format!(
            ", {} filtered ({kind})",
            now.sum(M::IntFilterDroppedDatagrams)
        ));
    }
    Some(line)
}

/// The main loop's status tick: publishes the reader thread's figures into the registry, sets
/// `/health`, prints the status line (when `show_line`) and rewrites the status file.
#[derive(Debug)]
pub struct StatusTicker {
    file: PathBuf,
    interval: Duration,
    show_line: bool,
    unit: RateUnit,
    rates: Rates,
    prev: Snapshot,
    last_tick: Instant,
    last_warn: Option<Instant>,
    last_drop_warn: Option<Instant>,
}

impl StatusTicker {
    /// A ticker for `topo`, every `interval`, writing `file` (empty: none), rates in `unit`.
    pub fn new(
        topo: &Topology,
        file: PathBuf,
        interval: Duration,
        show_line: bool,
        unit: RateUnit,
    ) -> Self {
        Self {
            file,
            interval,
            show_line,
            unit,
            rates: Rates::new(unit),
            prev: topo.registry.snapshot(),
            last_tick: Instant::now(),
            last_warn: None,
            last_drop_warn: None,
        }
    }

    /// Ticks when the interval has passed since the last tick.
    pub fn maybe_tick(&mut self, topo: &Topology) {
        if self.last_tick.elapsed() >= self.interval {
            self.tick(topo);
        }
    }

    fn tick(&mut self, topo: &Topology) {
        let mut st = topo.daemon.status();
        let dt = self.last_tick.elapsed().as_secs_f64();
        let int_now = topo.int.as_ref().map(|i| i.stats());
        if let Some(s) = &int_now {
            st.components.insert("int".into(), s.info());
        }
        let verdict = match st.nothing_decoded() {
            Some(w) => Err(format!("nothing decoded: {w}")),
            None => Ok(()),
        };
        topo.status_metrics
            .publish(&st, int_now.as_ref(), verdict.is_ok());
        if let Some((w, _)) = &topo.state_db {
            topo.status_metrics.publish_state_db(&w.stats());
        }
        topo.health.set(verdict);
        // Everything below reads this one snapshot of the registry.
        let snap = topo.registry.snapshot();
        let filter_kind = int_now
            .as_ref()
            .and_then(|s| s.filter.as_ref())
            .map(|f| f.kind);
        let int = int_status_line(&snap, &self.prev, dt, filter_kind);
        let mut line = match int {
            // INT alone: its part, and what the sinks dropped.
            Some(l) if !counter_path_applies(&snap) => format!(
                "stel-ingestd: {l}{}",
                sink_drops(&snap).map_or_else(String::new, |d| format!(" | SINKS DROPPED {d}"))
            ),
            int => {
                let mut line = status_line(
                    &snap,
                    &self.prev,
                    dt,
                    self.unit,
                    &self.rates.line(&topo.live),
                );
                if let Some(l) = int {
                    line.push_str(&format!(" | {l}"));
                }
                line
            }
        };
        if let Some(g) = topo
            .daemon
            .genl_status()
            .filter(|g| g.starts_with("waiting"))
        {
            line.push_str(&format!(" | {g}"));
        }
        if let Some(d) = topo.counters_db().and_then(|c| c.down()) {
            line.push_str(&redis_down_part(&d, true));
        }
        if let Some(f) = topo.upload_failing() {
            line.push_str(&upload_failing_part(&f));
        }
        let nothing = st.nothing_decoded();
        if let Some(w) = &nothing {
            line.push_str(&format!(" | NOTHING DECODED: {w}"));
        }
        if self.show_line {
            eprintln!("{line}");
        }
        if let Some(w) = nothing {
            // The operator must act; logged once a minute at most (the line says it each tick).
            if self
                .last_warn
                .is_none_or(|t: Instant| t.elapsed() >= Duration::from_secs(60))
            {
                tracing::warn!("Nothing decoded: {w}.");
                self.last_warn = Some(Instant::now());
            }
        }
        let dropped = |s: &Snapshot| s.sum(Metric::SinkDroppedSamples);
        if dropped(&snap) > dropped(&self.prev)
            && self
                .last_drop_warn
                .is_none_or(|t: Instant| t.elapsed() >= Duration::from_secs(60))
        {
            // Also under systemd, where there is no status line: at most once a minute.
            tracing::warn!(
                "Sinks dropped samples: {}.",
                sink_drops(&snap).unwrap_or_default()
            );
            self.last_drop_warn = Some(Instant::now());
        }
        write_status(&self.file, &status_json(&st, &snap, self.interval, false));
        self.prev = snap;
        self.last_tick = Instant::now();
    }

    /// The final status file, and the final figures in the status line's words on stderr (a
    /// short run may never have printed one). Returns the status file's JSON.
    /// What the sinks dropped is logged at WARN with the count.
    pub fn finish(&self, fin: &Finished) -> serde_json::Value {
        let json = status_json(&fin.status, &fin.metrics, self.interval, true);
        write_status(&self.file, &json);
        // (INT's final figures are its own summary line.)
        if counter_path_applies(&fin.metrics) {
            eprintln!(
                "{}{}",
                status_line(
                    &fin.metrics,
                    &self.prev,
                    self.last_tick.elapsed().as_secs_f64().max(1e-3),
                    self.unit,
                    ""
                ),
                fin.redis_down
                    .as_deref()
                    .map_or_else(String::new, |d| redis_down_part(d, false))
            );
        }
        if let Some(d) = sink_drops(&fin.metrics) {
            tracing::warn!("Sinks dropped samples during the run: {d}.");
        }
        json
    }
}

/// What `stel-ingestd status` found.
#[derive(Debug)]
pub struct Shown {
    /// What to print on stdout (the table, or the JSON).
    pub out: String,
    /// `Some(why)` when the file does not describe a running daemon (it stopped, died or
    /// stalled): printed on stderr, and the exit status is 1.
    pub stale: Option<String>,
}

/// Whether the status file `v` (read now) describes a running daemon: its process is alive and
/// it was written within 3 intervals (at least 5 s). `None`: live; else why not.
pub fn staleness(v: &serde_json::Value, now_unix_ms: u64) -> Option<String> {
    let info = &v["info"];
    let pid = info["pid"].as_u64();
    let written = info["written_unix_ms"].as_u64();
    let interval = info["interval_ms"].as_u64().unwrap_or(1000);
    let (Some(pid), Some(written)) = (pid, written) else {
        return Some(
            "the file does not say which process wrote it or when (an older daemon)".into(),
        );
    };
    let age_s = now_unix_ms.saturating_sub(written) as f64 / 1e3;
    if info["stopped"].as_bool() == Some(true) {
        return Some(format!(
            "the daemon (pid {pid}) stopped {age_s:.0} s ago; these are its final counters"
        ));
    }
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    if comm.trim() != "stel-ingestd" {
        return Some(format!(
            "the daemon (pid {pid}) is not running: it died {age_s:.0} s ago without a final status (these are its last counters)"
        ));
    }
    let limit_ms = (3 * interval).max(5000);
    if now_unix_ms.saturating_sub(written) > limit_ms {
        return Some(format!(
            "the daemon (pid {pid}) has not rewritten its status for {age_s:.0} s (every {} ms expected): it is stalled",
            interval
        ));
    }
    None
}

/// Where `stel-ingestd status` looks when neither `--file` nor `--data-dir` names the file:
/// where daemons write it by default (a root daemon without `--config` or `--data-dir`; a
/// `--demo`, `--input` or `--int-only` run started in this directory; a daemon with the default
/// data directory).
pub const STATUS_FILE_DEFAULTS: [&str; 3] = [
    "/run/stel/status.json",
    "stel-data/status.json",
    "/var/lib/stel/status.json",
];

/// The status file to show among `candidates`: a running daemon's ([`staleness`] finds nothing)
/// before a stopped or dead one's, a status file before anything else, and among equals the one
/// written last (`info.written_unix_ms`). A file that is there but cannot be read (another
/// user's: the daemon's is 0600) comes after a running daemon's and before a stopped one's, so
/// that [`show`] says why it cannot be read rather than showing a stale file in its place.
///
/// # Errors
/// None of them exists (the message lists them and says how to name the file).
pub fn pick_status_file(candidates: &[PathBuf]) -> Result<PathBuf, String> {
    let now = now_unix_ms();
    candidates
        .iter()
        .filter_map(|p| {
            Some((
                status_rank(std::fs::read_to_string(p), || p.exists(), now)?,
                p,
            ))
        })
        // The first of equals: max_by_key keeps the last, so compare reversed positions.
        .enumerate()
        .max_by_key(|(i, (rank, _))| (*rank, std::cmp::Reverse(*i)))
        .map(|(_, (_, p))| p.clone())
        .ok_or_else(|| {
            format!(
                "no status file in {} (is the daemon running? name its file with --file, or its \
                 data directory with --data-dir)",
                candidates
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })
}

/// How [`pick_status_file`] ranks a candidate from what reading it gave (`exists`: whether
/// the file is there, asked only when it could not be read), the larger first: (a running
/// daemon's, a status file, written at); `None`: not there.
fn status_rank(
    read: std::io::Result<String>,
    exists: impl FnOnce() -> bool,
    now: u64,
) -> Option<(bool, bool, u64)> {
    let text = match read {
        Ok(t) => t,
        // There but not ours to read: perhaps a running daemon's, ranked as one whose state is
        // unknown (below a running daemon's file, above a stopped one's).
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied && exists() => {
            return Some((true, false, 0))
        }
        Err(_) => return None,
    };
    Some(match serde_json::from_str::<serde_json::Value>(&text) {
        Ok(v) => (
            staleness(&v, now).is_none(),
            true,
            v["info"]["written_unix_ms"].as_u64().unwrap_or(0),
        ),
        Err(_) => (false, false, 0),
    })
}

fn now_unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// `stel-ingestd status`: the status file `file` as the registry's table (`help_text`: each
/// metric's help under it) or, with `json`, whole; and whether it is stale ([`staleness`]).
///
/// # Errors
/// The file cannot be read or is not a status file (the message says which and what to check).
pub fn show(file: &Path, json: bool, help_text: bool) -> Result<Shown, String> {
    let s = std::fs::read_to_string(file).map_err(|e| {
        let hint = if e.kind() == std::io::ErrorKind::PermissionDenied {
            "the daemon writes it 0600: run this as the daemon's user or root"
        } else {
            "is the daemon running? its [status] file setting decides the path"
        };
        format!("{}: {e} ({hint})", file.display())
    })?;
    let v = serde_json::from_str::<serde_json::Value>(&s)
        .map_err(|e| format!("{}: {e} (not a status file)", file.display()))?;
    let stale = staleness(&v, now_unix_ms()).map(|w| format!("{}: STALE: {w}", file.display()));
    let out = if json {
        format!("{s}\n")
    } else {
        // Every metric of the registry, one line per series (`-`: not run by this daemon).
        Snapshot::from_json(&v["metrics"]).to_table(help_text)
    };
    Ok(Shown { out, stale })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A status file that is there but not the caller's to read ranks between a running
    /// daemon's and a stopped one's. The fault is made up here: the tests run as root, which
    /// reads every file (`ingest/tests/daemon.rs` ranks real files).
    #[test]
    fn an_unreadable_status_file_ranks_between_running_and_stopped() {
        let denied = || Err(std::io::Error::from(std::io::ErrorKind::PermissionDenied));
        let unreadable = status_rank(denied(), || true, 0).unwrap();
        assert_eq!(status_rank(denied(), || false, 0), None);
        let missing = std::io::Error::from(std::io::ErrorKind::NotFound);
        assert_eq!(status_rank(Err(missing), || true, 0), None);
        let stopped = status_rank(
            Ok(r#"{"info":{"pid":1,"stopped":true,"written_unix_ms":5}}"#.into()),
            || true,
            10,
        )
        .unwrap();
        assert!(!stopped.0 && stopped.1, "{stopped:?}");
        let running = (true, true, 5);
        assert!(stopped < unreadable && unreadable < running);
    }
}
