//! The running daemon built from its config in one pass, and stopped in one place.
//!
//! ```text
//!  build:  check the whole config (every problem at once)
//!          → the files' group becomes the process's
//!          → lock every directory the run writes history into, and the data directory when
//!            the status file is there (sys::dirlock): a second daemon on one of them stops
//!            here, before it opens a socket or any sink touches its files
//!          → privileged set-up: INT sockets, the counter socket, filter, reader (Daemon::setup)
//!          → drop every capability
//!          → sinks, in dependency order: live → Parquet history → rollup tiers (the history's
//!            directory and disk budget) → uploader (needs the history's directory) → inspect
//!            socket (needs live) → COUNTERS_DB → OTLP
//!          → decoders start with those sinks → INT source → Prometheus endpoint → STATE_DB watcher
//!          → sessions from files
//!  stop:   (the caller drains the decoders with Daemon::finish) → STATE_DB watcher → INT source
//!          → history (final publish) → rollup tiers (final publish) → uploader (after both, so
//!          the last files go) → inspect
//!          → COUNTERS_DB → OTLP → metrics endpoint
//! ```
//!
//! Ownership: the topology owns every component; the main loop borrows `daemon` (the reader
//! thread's state), `state_db` (session events) and `int` (reload, figures). Nothing here is on
//! the data path.
use std::{os::fd::OwnedFd, sync::Arc};

use stel_store::{
    metrics::{Metric, Registry},
    prometheus::MetricsServer,
};

/// The sinks a running topology exposes (its fields and accessors).
pub use crate::sinks::{CountersDb, Live, ParquetHistory, Rollups};
use crate::{
    config::{DaemonConfig, SessionFile},
    daemon::{Daemon, DaemonStatus},
    int::source::{self as int_source, IntSource},
    pipeline::Sink,
    sinks::{InspectServer, Otlp, StatusSource, Upload},
    sources::state_db::{SessionEvent, StateDbWatcher},
    status::{Health, StatusMetrics},
    sys::dirlock::{self, DirLock},
};

/// Every component of a running daemon.
pub struct Topology {
    pub daemon: Daemon,
    pub live: Arc<Live>,
    pub int: Option<IntSource>,
    pub state_db: Option<(StateDbWatcher, std::sync::mpsc::Receiver<SessionEvent>)>,
    /// The one registry `/metrics` and OTLP read.
    pub registry: Arc<Registry>,
    /// What `/health` answers; the main loop sets it each tick.
    pub health: Arc<Health>,
    /// Publishes the main loop's status into `registry`.
    pub status_metrics: StatusMetrics,
    history: Option<Arc<ParquetHistory>>,
    rollups: Option<Arc<Rollups>>,
    upload: Option<Arc<Upload>>,
    inspect: Option<Arc<InspectServer>>,
    counters: Option<Arc<CountersDb>>,
    otlp: Option<Arc<Otlp>>,
    metrics: Option<MetricsServer>,
    /// The written directories' locks ([`dirlock`]), handed on to [`Finished`].
    locks: Vec<DirLock>,
    /// `[int]` / `--int-listen` asked for INT (not only the capture files' implicit decoder):
    /// its summary line is printed even when no report came.
    int_asked: bool,
}

impl std::fmt::Debug for Topology {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Topology")
            .field("history", &self.history.is_some())
            .field("rollups", &self.rollups.is_some())
            .field("upload", &self.upload.is_some())
            .field("counters_db", &self.counters.is_some())
            .field("otlp", &self.otlp.is_some())
            .field("int", &self.int.is_some())
            .field("metrics", &self.metrics.is_some())
            .finish_non_exhaustive()
    }
}

impl Topology {
    /// Builds and starts everything `cfg` asks for (`local`: the demo's socket-pair end).
    ///
    /// # Errors
    /// Every problem of the config at once (before anything privileged happens), or the first
    /// component that cannot start, with what to do about it.
    pub fn build(cfg: DaemonConfig, local: Option<OwnedFd>) -> Result<Self, String> {
        let problems = cfg.problems();
        if !problems.is_empty() {
            return Err(format!("invalid configuration: {}", problems.join("; ")));
        }
        let status_file = cfg.status_file();
        let sessions: Vec<SessionFile> = cfg.sessions.clone();
        let mut parquet_cfg = cfg.parquet.clone().filter(|_| cfg.history.enabled);
        let rollup_cfg = cfg.rollup.clone();
        // The data dir's budget: raw keeps what the tiers leave.
        let budget = (cfg.retention.disk_budget_bytes > 0)
            .then(|| stel_store::DiskBudget::new(cfg.retention.disk_budget_bytes));
        if let Some(p) = parquet_cfg.as_mut() {
            p.disk_budget = stel_store::BudgetHandle(budget.clone());
        }
        let counters_cfg = cfg.counters_db.clone();
        let state_db_cfg = cfg.state_db.clone();
        let upload_cfg = cfg.upload.clone();
        let otlp_cfg = cfg.otlp.clone();
        let inspect_cfg = cfg.inspect.clone();
        let files = cfg.source.kind == crate::config::SourceKind::File;
        // Capture files: INT reports in them (UDP to the [int] listen ports, default 5900) are
        // decoded into the tables (no INT socket is opened); with the history off, only when
        // [int] asks for it.
        let int_asked = cfg.int.is_some();
        let int_cfg = match &cfg.int {
            None if files && cfg.history.enabled => Some(int_source::IntConfig::default()),
            c => c.clone(),
        };
        let metrics_listen = cfg.metrics.listen;
        let group = cfg.files.group.clone();
        let registry = Registry::new();
        registry
            .gauge(Metric::DaemonStartTimeSeconds, stel_store::labels!())
            .set(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs()),
            );
        let health = Health::new(5);
        let status_metrics = StatusMetrics::new(Arc::clone(&registry), cfg.source.kind);
        // The history's root, also where the INT tables go by default (with the history off too).
        let history_dir = cfg.data_dir();

        // The files' group becomes the process's (still privileged, no other thread yet): what
        // the run creates from here on is that group's.
        if !group.is_empty() {
            let gid = crate::sys::caps::resolve_group(&group)
                .map_err(|e| format!("[files] group / --group {group:?}: {e}"))?;
            crate::sys::caps::set_group(gid).map_err(|e| {
                format!(
                    "[files] group / --group {group:?}: {e} (run it as root, or start it with \
                     that group: systemd Group=, or `sg {group} -c …`)"
                )
            })?;
        }

        // One writer per directory: locked before anything else the run sets up (a second
        // daemon's INT sockets would share the port of the first one's and take part of its
        // reports until refused), before any sink clears a crashed run's files there and before
        // the status file is written; held until the process exits. The lock file and any
        // directory made for it belong to the files' group, set just before.
        let mut write_dirs = Vec::new();
        if let Some(p) = &parquet_cfg {
            write_dirs.push((p.dir.clone(), "--data-dir", Need::Required));
        }
        if let Some(c) = &int_cfg {
            let explicit = !c.parquet.dir.as_os_str().is_empty();
            let setting = if explicit {
                "[int.parquet] dir"
            } else {
                "--data-dir"
            };
            write_dirs.push((c.tables_dir(&history_dir), setting, Need::Required));
        }
        // The status file in the data directory (its default place) makes it this run's too: a
        // run that writes no history there (--no-history without INT tables) locks it all the
        // same rather than rewrite a running daemon's status.json. (The status writer creates the
        // directory anyway; the lock only does so before the first tick.) A status file given
        // elsewhere (--status-file) locks nothing.
        if status_file
            .parent()
            .is_some_and(|p| p == history_dir || same_dir(p, &history_dir))
        {
            write_dirs.push((history_dir.clone(), "--data-dir", Need::StatusOnly));
        }
        let mut locks: Vec<DirLock> = Vec::new();
        for (dir, setting, need) in write_dirs {
            if locks.iter().any(|l| same_dir(l.dir(), &dir)) {
                continue;
            }
            match (dirlock::lock_dir(&dir, setting), need) {
                (Ok(l), _) => locks.extend(l),
                // Only the status file would go there, and it is best effort (a failed write
                // is a warning): a directory it cannot create or write does not stop the run,
                // as it did not before it was locked (a data dir that is a regular file
                // included: the warning names it). Another daemon's lock does.
                (
                    Err(
                        e @ (dirlock::DirLockError::Io { .. }
                        | dirlock::DirLockError::NotADirectory { .. }),
                    ),
                    Need::StatusOnly,
                ) => {
                    tracing::warn!(error = %e, "Cannot lock the data directory for the status file; running unlocked.");
                }
                (Err(e), _) => return Err(e.to_string()),
            }
        }

        // Privileged set-up: INT sockets (SO_RCVBUFFORCE) with the report filter loaded
        // (CAP_BPF) and attached before they are bound, then the counter path.
        let (int_sockets, int_filter) = match &int_cfg {
            Some(_) if files => (Some(Vec::new()), None),
            Some(c) => {
                let (s, f) = int_source::bind(c).map_err(|e| e.to_string())?;
                (Some(s), f)
            }
            None => (None, None),
        };
        let mut daemon = Daemon::setup(cfg, local)?;
        // Then drop every capability before any thread exists.
        daemon
            .drop_privileges()
            .map_err(|e| format!("dropping capabilities: {e}"))?;

        // Without the counter history, say now, naming it, if the INT tables' directory cannot
        // be written (the counter history checks its own when it starts).
        if let Some(c) = int_cfg.as_ref().filter(|_| parquet_cfg.is_none()) {
            let dir = c.tables_dir(&history_dir);
            stel_store::durable::check_writable(&dir)
                .map_err(|e| format!("cannot write the INT tables under {}: {e}", dir.display()))?;
        }
        let live = Live::new(&registry);
        let mut sinks: Vec<Arc<dyn Sink>> = vec![Arc::clone(&live) as Arc<dyn Sink>];
        let mut status_sources: Vec<Arc<dyn StatusSource>> = Vec::new();
        let mut upload = None;
        let mut rollups = None;
        let history = match parquet_cfg {
            Some(mut c) => {
                // Port speeds for utilisation, recorded in every file (SONiC's PORT tables).
                let speeds_from = state_db_cfg
                    .as_ref()
                    .map(|s| s.url.clone())
                    .or_else(|| counters_cfg.as_ref().map(|s| s.url.clone()));
                if let Some(url) = speeds_from {
                    match crate::sources::port_speed::read(&url, std::time::Duration::from_secs(2))
                    {
                        Ok(m) => {
                            tracing::info!(
                                ports = m.len(),
                                "Port speeds read from SONiC's PORT tables."
                            );
                            c.port_speeds_mbps = m;
                        }
                        Err(e) => tracing::warn!(
                            error = %e,
                            "Cannot read port speeds from SONiC; history files carry none (stel-query assumes 100G unless --speed)."
                        ),
                    }
                }
                let (dir, c_switch) = (c.dir.clone(), c.switch_name.clone());
                let h = ParquetHistory::start(c, &registry)?;
                eprintln!(
                    "stel-ingestd: writing Parquet history under {}",
                    dir.display()
                );
                sinks.push(Arc::clone(&h) as Arc<dyn Sink>);
                if rollup_cfg.enabled {
                    let r = Rollups::start(
                        &rollup_cfg,
                        &dir,
                        c_switch.clone(),
                        stel_store::BudgetHandle(budget.clone()),
                        &registry,
                    )?;
                    eprintln!(
                        "stel-ingestd: writing rollup tiers {} under {}",
                        r.tiers().join(", "),
                        dir.display()
                    );
                    sinks.push(Arc::clone(&r) as Arc<dyn Sink>);
                    rollups = Some(r);
                }
                if let Some(u) = upload_cfg {
                    let to = u.to.clone();
                    let redis = state_db_cfg.as_ref().map(|c| c.url.as_str());
                    let up = Upload::start(u, &dir, c_switch.as_deref(), redis, &registry)?;
                    eprintln!(
                        "stel-ingestd: uploading every published file to {} (progress in {})",
                        stel_store::redact::redact(&to),
                        dir.join(stel_store::upload::STATE_FILE).display()
                    );
                    status_sources.push(Arc::clone(&up) as Arc<dyn StatusSource>);
                    upload = Some(up);
                }
                Some(h)
            }
            None => None,
        };
        let inspect = if inspect_cfg.enabled {
            let path = inspect_cfg.socket_path(&status_file);
            match InspectServer::start(&path, &live, inspect_cfg.max_clients, &registry) {
                Ok(s) => {
                    eprintln!(
                        "stel-ingestd: live inspect on {} (stel-query inspect <profile>)",
                        path.display()
                    );
                    status_sources.push(Arc::clone(&s) as Arc<dyn StatusSource>);
                    Some(s)
                }
                // A socket the operator chose must work; the default one is a convenience, and
                // ingesting matters more (e.g. a --no-history run with its status file outside
                // its data directory, which locks nothing, beside a daemon that serves the
                // socket there).
                Err(e) if inspect_cfg.socket.as_os_str().is_empty() => {
                    tracing::warn!(error = %e, "Live inspect is off (set [inspect] socket or --inspect-socket).");
                    None
                }
                Err(e) => {
                    return Err(format!(
                        "{e} (choose another path with --inspect-socket, or --no-inspect)"
                    ))
                }
            }
        } else {
            None
        };
        for s in status_sources {
            daemon.add_status_source(s);
        }
        let counters = match counters_cfg {
            Some(c) => {
                let url = c.url.clone();
                let s = CountersDb::start(c, &registry)?;
                eprintln!(
                    "stel-ingestd: writing COUNTERS_DB and RATES to {}",
                    stel_store::redact::redact(&url)
                );
                sinks.push(Arc::clone(&s) as Arc<dyn Sink>);
                Some(s)
            }
            None => None,
        };
        let otlp = match otlp_cfg {
            Some(c) => {
                let ep = c.endpoint.clone();
                let s = Otlp::start(c, Some(Arc::clone(&registry)))?;
                eprintln!(
                    "stel-ingestd: exporting counters over OTLP to {}",
                    stel_store::redact::redact(&ep)
                );
                sinks.push(Arc::clone(&s) as Arc<dyn Sink>);
                Some(s)
            }
            None => None,
        };
        daemon.start(sinks);
        let int = match (int_cfg, int_sockets) {
            (Some(c), Some(socks)) if socks.is_empty() => {
                // Captures: [int.filter] applies too, in user space.
                let filter = c
                    .filter
                    .enabled
                    .then(|| crate::filter::int::IntFilter::user_space(&c.filter, "capture files"));
                let mut src = IntSource::start_filtered(&c, socks, filter, &history_dir)
                    .map_err(|e| e.to_string())?;
                daemon.set_int_feed(src.feed());
                eprintln!(
                    "stel-ingestd: INT reports in the input files (UDP to port {}) into {}",
                    c.listen
                        .iter()
                        .map(|a| a.port().to_string())
                        .collect::<Vec<_>>()
                        .join(", "),
                    src.dir.display()
                );
                Some(src)
            }
            (Some(c), Some(socks)) => {
                let src = IntSource::start_filtered(&c, socks, int_filter, &history_dir)
                    .map_err(|e| e.to_string())?;
                eprintln!(
                    "stel-ingestd: INT reports on {} (reader {}) into {} (stel-query int …); SIGHUP re-reads EVC names",
                    src.local_addrs
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(", "),
                    src.stats().reader,
                    src.dir.display()
                );
                Some(src)
            }
            _ => None,
        };
        let metrics = match metrics_listen {
            Some(addr) => {
                let h = Arc::clone(&health);
                let s =
                    MetricsServer::start(addr, Arc::clone(&registry), Arc::new(move || h.check()))
                        .map_err(|e| e.to_string())?;
                eprintln!(
                    "stel-ingestd: Prometheus metrics on http://{}/metrics, health on /health",
                    s.addr
                );
                Some(s)
            }
            None => None,
        };
        let state_db = match state_db_cfg {
            Some(c) => {
                let url = c.url.clone();
                let (w, rx) = StateDbWatcher::start(c).map_err(|e| {
                    stel_store::redact::redact(&format!("STATE_DB ({url}): {e}")).into_owned()
                })?;
                eprintln!(
                    "stel-ingestd: watching STATE_DB sessions at {}",
                    stel_store::redact::redact(&url)
                );
                Some((w, rx))
            }
            None => None,
        };
        for s in &sessions {
            let (spec, config) = s.load()?;
            daemon
                .register(spec, config)
                .map_err(|e| format!("{}: {e}", s.path.display()))?;
        }
        Ok(Self {
            daemon,
            live,
            int,
            state_db,
            registry,
            health,
            status_metrics,
            history,
            rollups,
            upload,
            inspect,
            counters,
            otlp,
            metrics,
            locks,
            int_asked,
        })
    }

    /// Drains the decoders (`drained`/`timeout` as [`Daemon::finish`]), then stops every other
    /// component in reverse dependency order; returns the final status with the sinks' last
    /// figures, one summary line each on stderr.
    pub fn finish(
        self,
        drained: Option<&dyn Fn(&crate::sys::uring::RecvStats) -> bool>,
        timeout: std::time::Duration,
    ) -> Finished {
        let kind = self.daemon.source_kind();
        let mut st = self.daemon.finish(drained, timeout);
        let mut parquet = None;
        let mut int_final = None;
        if let Some((w, _)) = self.state_db {
            self.status_metrics.publish_state_db(&w.stats());
            w.shutdown();
        }
        if let Some(i) = self.int {
            let s = i.shutdown();
            int_final = Some(s.clone());
            // Not for capture files that held no INT when INT was not asked for: an
            // "int: 0 datagrams" line would suggest it was.
            let said = self.int_asked || s.recv.datagrams + s.decode.reports > 0;
            if said {
                eprintln!(
                "stel-ingestd: int: {} datagrams, {} reports ({} decoded, {} malformed), {} hops, {} drop reports; {} lost by sequence; {} kernel drops, {} truncated; tables: {} rows written, {} shed, {} lost",
                s.recv.datagrams,
                s.decode.reports,
                s.decode.reports_decoded,
                s.decode.reports_malformed,
                s.decode.hops,
                s.decode.drops,
                s.decode.seq_lost,
                s.kernel_drops,
                s.recv.truncated,
                s.sink.rows_written,
                s.sink.shed_rows(),
                s.sink.lost_rows()
            );
            }
            if s.recv.datagrams > 0 && s.decode.reports_decoded == 0 {
                tracing::warn!(
                    "INT: {} datagrams received and NOTHING DECODED (malformed: {}); check the report format and [int.decode]",
                    s.recv.datagrams,
                    serde_json::to_string(&s.decode.malformed).unwrap_or_default()
                );
            }
            st.components.insert("int".into(), s.info());
        }
        // The counter sinks' summaries: not for INT alone (an empty counter history).
        let counters = crate::report::counters_apply(
            kind == crate::config::SourceKind::None,
            kind == crate::config::SourceKind::File,
            st.pipeline.decode.messages + st.filter.dropped,
            int_final.as_ref().map_or(0, |s| s.decode.reports_decoded),
        );
        if let Some(h) = self.history {
            match h.shutdown() {
                Ok(s) => {
                    let written = stel_store::parquet::accounting::written(&s);
                    if counters || written > 0 {
                        eprintln!(
                            "stel-ingestd: history: {} files published, {written} samples written",
                            s.get(Metric::SinkPublishedFiles),
                        );
                    }
                    parquet = Some(s);
                }
                Err(e) => eprintln!("stel-ingestd: history: final flush failed: {e}"),
            }
        }
        let mut rollup_final = None;
        if let Some(r) = self.rollups {
            match r.shutdown() {
                Ok((s, t)) => {
                    if counters || t.files > 0 {
                        eprintln!(
                            "stel-ingestd: rollups: {} files published ({} bytes), {} samples rolled up, {} shed",
                            t.files,
                            t.bytes.iter().sum::<u64>(),
                            stel_store::rollup::accounting::rolled_up(&s),
                            stel_store::rollup::accounting::shed(&s)
                        );
                    }
                    rollup_final = Some(s);
                }
                Err(e) => eprintln!("stel-ingestd: rollups: {e}"),
            }
        }
        let mut upload_pending = None;
        if let Some(u) = self.upload {
            // After the history's and the tiers' last publish, so their final files go too.
            let info = u.info(); // switch and last_error, next to the final counters
            let destination = u.destination();
            if let Some((s, failing)) = u.shutdown() {
                let files = s.get(Metric::UploadPendingFiles);
                if files > 0 {
                    upload_pending = Some(UploadPending {
                        files,
                        destination,
                        why: failing,
                    });
                }
                eprintln!(
                    "stel-ingestd: upload: {} files ({} bytes) uploaded, {} pending, {} failed attempts, {} vanished before upload",
                    s.get(Metric::UploadFiles),
                    s.get(Metric::UploadBytes),
                    s.get(Metric::UploadPendingFiles),
                    s.get(Metric::UploadFailures),
                    s.get(Metric::UploadVanishedFiles)
                );
                st.components.insert("upload".into(), info.into());
            }
        }
        if let Some(s) = self.inspect {
            s.shutdown();
        }
        let redis_down = self.counters.and_then(CountersDb::shutdown);
        if let Some(o) = self.otlp.and_then(Otlp::shutdown) {
            eprintln!(
                "stel-ingestd: otlp: {} points delivered, {} dropped",
                o.samples_delivered,
                o.dropped_samples.total()
            );
        }
        if let Some(m) = self.metrics {
            m.shutdown();
        }
        // The final figures into the registry (the sinks' are final now too).
        self.status_metrics
            .publish(&st, int_final.as_ref(), st.nothing_decoded().is_none());
        Finished {
            status: st,
            parquet,
            rollup: rollup_final,
            metrics: self.registry.snapshot(),
            redis_down,
            upload_pending,
            _locks: self.locks,
        }
    }

    /// The Parquet history, when configured (its counters while running).
    pub fn history(&self) -> Option<&Arc<ParquetHistory>> {
        self.history.as_ref()
    }

    /// The rollup tiers, when written (their counters while running).
    pub fn rollups(&self) -> Option<&Arc<Rollups>> {
        self.rollups.as_ref()
    }

    /// While the uploader's attempts fail: `<destination>: <last error>` (credentials masked).
    pub fn upload_failing(&self) -> Option<String> {
        self.upload.as_ref().and_then(|u| u.failing())
    }

    /// The COUNTERS_DB writer, when configured (its counters while running).
    pub fn counters_db(&self) -> Option<&Arc<CountersDb>> {
        self.counters.as_ref()
    }
}

/// What a stopped topology leaves: the final status, the Parquet history's final counters,
/// typed, and the registry's final snapshot (the sinks' last figures included).
#[derive(Debug)]
pub struct Finished {
    pub status: DaemonStatus,
    pub parquet: Option<stel_store::metrics::Snapshot>,
    /// The rollup sink's final counters (`stel_store::rollup::accounting`).
    pub rollup: Option<stel_store::metrics::Snapshot>,
    /// Every series of the daemon's registry, final.
    pub metrics: stel_store::metrics::Snapshot,
    /// The COUNTERS_DB writer's Redis was not connected at the end (its last round could not
    /// write): `<url>: <error>`, credentials masked.
    pub redis_down: Option<String>,
    /// Files the uploader could not upload before it stopped (they stay in the data dir and are
    /// uploaded at the next start).
    pub upload_pending: Option<UploadPending>,
    /// The data directories stay locked while this lives: the final status file is written
    /// after the topology stops.
    _locks: Vec<DirLock>,
}

/// Published files still not uploaded when the uploader stopped.
#[derive(Debug, Clone)]
pub struct UploadPending {
    /// How many.
    pub files: u64,
    /// `[upload] to`, credentials masked.
    pub destination: String,
    /// The last attempt's error; `None` when uploads were going through but the stop's time
    /// (`[upload] shutdown_timeout_ms`) ran out.
    pub why: Option<String>,
}

/// Why a directory is locked: the run writes history there, or only its status file.
#[derive(Debug, Clone, Copy)]
enum Need {
    Required,
    StatusOnly,
}

/// Whether `a` and `b` name the same existing directory (symlinks and `..` resolved).
fn same_dir(a: &std::path::Path, b: &std::path::Path) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(x), Ok(y)) => x == y,
        _ => false,
    }
}
