//! The daemon's receive loop, wired: socket (or capture files) → (eBPF filter) → [`Reader`] →
//! [`Pipeline`] → sinks. Sessions are the `SessionRegistry`'s: this file only hands it the
//! filter and the pipeline, and polls it every round so acknowledgements never block receive.
//!
//! Start-up is split in two so privileges can be dropped between them ([`crate::sys::caps`]):
//! [`Daemon::setup`] does everything that needs CAP_NET_ADMIN / CAP_BPF (socket, multicast
//! membership, SO_RCVBUFFORCE, filter load and attach) on the main thread; the caller drops
//! capabilities; [`Daemon::start`] then spawns the decoder threads, which inherit nothing.
//!
//! The loop is driven by the caller ([`Daemon::step`]), so the binary, the benchmarks and the
//! tests run exactly this code.
use std::{
    os::fd::{AsFd, BorrowedFd, OwnedFd},
    sync::Arc,
    time::{Duration, Instant},
};

use crate::{
    config::{DaemonConfig, SourceKind},
    decode::{Malformed, SessionSpec},
    filter::{FilterPolicy, TemplateFilter},
    genl::{GenlConfig, GenlSource, GenlSourceConfig},
    input::{FileInput, InputStats},
    int::source::IntFeed,
    netlink::UnitFraming,
    pipeline::{Pipeline, PipelineStats, Sink},
    reader::Reader,
    sessions::{Ack, SessionRegistry},
    sources::state_db::{SessionAcker, SessionEvent},
    sys::{self, netlink::NetlinkSocket, slots::Lease, uring::RecvStats, SysError},
};

pub use crate::{sessions::SessionStats, sinks::StatusSource};

/// What the daemon reads.
#[derive(Debug)]
enum Socket {
    Netlink(NetlinkSocket),
    /// The demo's end of a local datagram socket pair.
    Local(OwnedFd),
    /// Capture files: no socket at all.
    Files,
}

impl Socket {
    fn fd(&self) -> Option<BorrowedFd<'_>> {
        match self {
            Socket::Netlink(s) => Some(s.as_fd()),
            Socket::Local(f) => Some(f.as_fd()),
            Socket::Files => None,
        }
    }
}

/// Filter counters as the status shows them.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct FilterStatus {
    /// `kernel` (eBPF) or `user_space`.
    pub kind: &'static str,
    /// `registered` or `learn`.
    pub policy: &'static str,
    /// Template IDs registered by sessions (plus, in user space, learned ones).
    pub templates: usize,
    /// Most template IDs the filter holds.
    pub max_templates: u32,
    /// Messages examined (kernel: datagrams; user space: netlink payloads / IPFIX messages).
    pub seen: u64,
    pub kept: u64,
    /// Messages dropped: data of templates that are not registered (or not yet learned).
    pub dropped: u64,
    pub too_short: u64,
    /// Template IDs the filter registered itself from template sets (policy `learn`).
    pub learned: u64,
    /// Learned IDs the map had no room for.
    pub learn_failed: u64,
    /// Set ID of the last dropped message's first data set (0: none dropped).
    pub last_dropped_template: u16,
}

/// Everything the daemon counts. Serialised into the status file each interval.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct DaemonStatus {
    pub source: String,
    pub reader: &'static str,
    pub recv: RecvStats,
    /// Longest time, µs, the reader spent between two receive waits (dispatching, session
    /// changes, status output): how long the socket went unread.
    pub receive_gap_max_us: u64,
    /// Such gaps longer than 10 ms.
    pub receive_gaps_over_10ms: u64,
    /// File input counters (`--input`); absent for sockets.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub input: Option<InputStats>,
    /// File input: the files that could not be read, each with why.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub input_problems: Vec<String>,
    /// Datagrams the kernel dropped on our socket because its buffer was full (SO_MEMINFO
    /// SK_MEMINFO_DROPS): true loss, counted as lost.
    pub kernel_drops: u64,
    /// INT datagrams of capture files discarded because no INT decoder was set up (only when
    /// the daemon is built without `Topology`).
    pub int_datagrams_unrouted: u64,
    pub filter: FilterStatus,
    pub pipeline: PipelineStats,
    /// Sessions registered now.
    pub sessions: usize,
    /// The session registry's counters.
    pub session_registry: SessionStats,
    /// Per component, what is not a counter (the uploader's last error, the INT source's
    /// listen addresses and figures): the status file's `info.components`. Counters are in
    /// the registry, never here.
    pub components: serde_json::Map<String, serde_json::Value>,
    pub capabilities_dropped: bool,
}

impl DaemonStatus {
    /// Why nothing was decoded although input arrived, with the fix — `None` when something was
    /// decoded or nothing arrived. The status line and the stop message print it at WARN.
    pub fn nothing_decoded(&self) -> Option<String> {
        let d = &self.pipeline.decode;
        if d.records > 0 || self.recv.datagrams + self.filter.dropped == 0 {
            return None;
        }
        let f = &self.filter;
        if f.dropped > 0 {
            let t = f.last_dropped_template;
            return Some(match f.policy {
                "registered" => format!(
                    "{} messages filtered: template {t} not registered (filter policy \
                     registered); pass --session FILE, register it in STATE_DB, or --filter learn",
                    f.dropped
                ),
                _ => format!(
                    "{} messages filtered: template {t} was never announced (data arrived \
                     without its template set); the exporter must send its templates, or pass \
                     --session FILE",
                    f.dropped
                ),
            });
        }
        let unknown = d.malformed(Malformed::UnknownTemplate);
        if unknown > 0 {
            return Some(format!(
                "{unknown} data sets of unknown templates discarded: no template arrived for \
                 them; pass --session FILE or make the exporter send its templates"
            ));
        }
        if self.recv.truncated > 0 {
            return Some(format!(
                "{} datagrams truncated: larger than a receive slot; raise [reader] slot_bytes \
                 (0 = the kernel's largest)",
                self.recv.truncated
            ));
        }
        let bad = d.malformed_total();
        if bad > 0 {
            return Some(format!(
                "{bad} malformed inputs discarded (see `malformed` in the status): the input is \
                 not HFT IPFIX as stel reads it; check --input-format / the exporter"
            ));
        }
        None
    }
}

/// A wired, running (after [`Daemon::start`]) ingest loop.
pub struct Daemon {
    cfg: DaemonConfig,
    socket: Socket,
    genl: Option<GenlSource>,
    filter: TemplateFilter,
    reader: Reader,
    pipeline: Option<Pipeline>,
    sinks: Vec<Arc<dyn Sink>>,
    status_sources: Vec<Arc<dyn StatusSource>>,
    leases: Vec<Lease>,
    next_genl_poll: Instant,
    source_desc: String,
    sessions: SessionRegistry,
    caps_dropped: bool,
    /// When the last receive wait returned (for the receive-gap figures).
    last_poll_end: Option<Instant>,
    gap_max: Duration,
    gaps_over_10ms: u64,
    /// Decodes the INT datagrams of capture files ([`UnitFraming::Int`]).
    int_feed: Option<IntFeed>,
    /// INT datagrams of capture files that arrived with no INT decoder set (discarded).
    int_unrouted: u64,
}

impl std::fmt::Debug for Daemon {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Daemon")
            .field("source", &self.source_desc)
            .field("reader", &self.reader.kind())
            .field("filter_kernel", &self.filter.is_kernel())
            .finish_non_exhaustive()
    }
}

/// UDP destination ports of INT reports in capture files: the `[int] listen` ports, else the
/// default (5900).
fn file_int_ports(cfg: &DaemonConfig) -> Vec<u16> {
    match &cfg.int {
        Some(i) => i.listen.iter().map(|a| a.port()).collect(),
        None => vec![crate::int::source::DEFAULT_PORT],
    }
}

fn privilege_hint(e: SysError) -> String {
    if matches!(e.source.raw_os_error(), Some(libc::EPERM | libc::EACCES)) {
        format!("{e} (stel-ingestd needs root, or CAP_NET_ADMIN and CAP_BPF, at start)")
    } else {
        e.to_string()
    }
}

impl Daemon {
    /// The privileged half of start-up: opens the socket (`local` is the demo's socket-pair
    /// end, used when `cfg.source.kind` is `demo`), joins the group, loads and attaches the
    /// filter, sets up the reader.
    ///
    /// # Errors
    /// A socket call failing (with a hint when it is a missing privilege), or constants.yml
    /// unreadable.
    pub fn setup(cfg: DaemonConfig, local: Option<OwnedFd>) -> Result<Self, String> {
        let mut genl = None;
        let (socket, source_desc) = match cfg.source.kind {
            SourceKind::Demo => {
                let fd = local.ok_or("demo source without its socket pair")?;
                (Socket::Local(fd), "demo (in-process emulator)".to_string())
            }
            SourceKind::Usersock => {
                // The group is joined once the filter is attached (below): a datagram queued
                // before would reach the reader unfiltered and uncounted by the filter.
                let s = NetlinkSocket::usersock().map_err(privilege_hint)?;
                let d = format!("NETLINK_USERSOCK group {}", cfg.source.usersock_group);
                (Socket::Netlink(s), d)
            }
            SourceKind::None => {
                // An idle local socket pair keeps the reader and the status uniform; nothing is
                // ever sent on it. The sending end must stay open (a closed peer would make
                // every receive return at once), so it lives as long as the process.
                let (rx, tx) = crate::sys::local_datagram_pair().map_err(|e| e.to_string())?;
                std::mem::forget(tx);
                (Socket::Local(rx), "none (INT only)".to_string())
            }
            SourceKind::File => (
                Socket::Files,
                format!("{} input file(s)", cfg.source.files.len()),
            ),
            SourceKind::Genl => {
                let names = GenlConfig::from_constants_file(&cfg.source.constants)
                    .map_err(|e| e.to_string())?;
                let s = NetlinkSocket::generic().map_err(privilege_hint)?;
                let d = format!("genl family {} group {}", names.family, names.group);
                genl = Some(
                    GenlSource::new(GenlSourceConfig {
                        genl: names,
                        resync_interval: Duration::from_secs(cfg.source.genl_resync_s.max(1)),
                    })
                    .map_err(privilege_hint)?,
                );
                (Socket::Netlink(s), d)
            }
        };
        if let Socket::Netlink(s) = &socket {
            if let Err(e) = s.set_rcvbuf(cfg.source.rcvbuf_bytes) {
                tracing::warn!(error = %e, "Could not set the receive buffer; using the default.");
            }
        }
        let max = cfg.filter.max_templates;
        let mut filter = match socket.fd() {
            None => TemplateFilter::user_space_quiet(max),
            Some(_) if cfg.filter.ebpf => TemplateFilter::with_capacity(max),
            Some(_) => {
                tracing::warn!(
                    "template filter: user space by request (eBPF socket filter not loaded)"
                );
                TemplateFilter::user_space_quiet(max)
            }
        };
        // Policy first, then attach, then join: from the first datagram on, the filter runs
        // with its policy and counts everything the reader receives.
        let policy = cfg
            .filter
            .policy
            .resolve(cfg.source.kind == SourceKind::Genl && cfg.state_db.is_some());
        filter.set_policy(policy).map_err(|e| e.to_string())?;
        if let Some(fd) = socket.fd() {
            if let Err(e) = filter.attach(fd) {
                tracing::error!(error = %e, "Could not attach the eBPF filter; filtering in user space.");
                filter = TemplateFilter::user_space_quiet(max);
                filter.set_policy(policy).map_err(|e| e.to_string())?;
            }
        }
        if let (SourceKind::Usersock, Socket::Netlink(s)) = (cfg.source.kind, &socket) {
            s.join_group(cfg.source.usersock_group)
                .map_err(privilege_hint)?;
        }
        let reader = match socket.fd() {
            Some(fd) => Reader::new(fd, &cfg.reader).map_err(|e| e.to_string())?,
            None => Reader::files(
                FileInput::new(cfg.source.files.clone(), cfg.source.input_format)
                    .with_int_ports(file_int_ports(&cfg)),
                &cfg.reader,
            ),
        };
        tracing::info!(
            source = %source_desc,
            reader = reader.kind(),
            filter = if filter.is_kernel() { "ebpf" } else { "user_space" },
            policy = policy.name(),
            "Receive path set up."
        );
        let mut me = Self {
            cfg,
            socket,
            genl,
            filter,
            reader,
            pipeline: None,
            sinks: Vec::new(),
            status_sources: Vec::new(),
            leases: Vec::with_capacity(256),
            next_genl_poll: Instant::now(),
            source_desc,
            sessions: SessionRegistry::new(),
            caps_dropped: false,
            last_poll_end: None,
            gap_max: Duration::ZERO,
            gaps_over_10ms: 0,
            int_feed: None,
            int_unrouted: 0,
        };
        // The first genl poll resolves the family and joins the group while we still may.
        me.poll_genl(Duration::ZERO);
        Ok(me)
    }

    /// Drops every capability (call between [`Self::setup`] and [`Self::start`], on the thread
    /// that called `setup`, before any other thread exists).
    ///
    /// # Errors
    /// prctl/capset failing.
    pub fn drop_privileges(&mut self) -> Result<(), SysError> {
        sys::caps::drop_all()?;
        self.caps_dropped = true;
        tracing::info!("All capabilities dropped.");
        Ok(())
    }

    /// Where the counters come from.
    pub fn source_kind(&self) -> SourceKind {
        self.cfg.source.kind
    }

    /// Spawns the decoder threads; batches go to `sinks`.
    pub fn start(&mut self, sinks: Vec<Arc<dyn Sink>>) {
        self.sinks = sinks.clone();
        self.pipeline = Some(Pipeline::start(
            &self.cfg.pipeline,
            &self.reader.view(),
            sinks,
        ));
    }

    /// Adds something that takes no batches (the uploader, the inspect server) to the status:
    /// its [`StatusSource::info`] under `info.components.<name>` (its counters are registry
    /// series).
    pub fn add_status_source(&mut self, s: Arc<dyn StatusSource>) {
        self.status_sources.push(s);
    }

    fn component_info(&self) -> serde_json::Map<String, serde_json::Value> {
        let mut out = serde_json::Map::new();
        for s in &self.status_sources {
            let info = s.info();
            if !info.is_empty() {
                out.insert(s.name().to_string(), info.into());
            }
        }
        out
    }

    /// Registers a session (see `SessionRegistry::register`): validated, filter updated all or
    /// nothing, queued for its decoder in order with the data; returns without waiting for the
    /// decoder. Re-registering the same profile/group replaces it.
    ///
    /// # Errors
    /// Invalid templates or labels, a template another session holds, the filter refusing an
    /// ID; nothing changed.
    pub fn register(&mut self, spec: SessionSpec, session_config: Vec<u8>) -> Result<(), String> {
        self.register_acked(spec, session_config, None)
    }

    /// [`Self::register`] with an acknowledgement that runs once the decoder applied it.
    ///
    /// # Errors
    /// As [`Self::register`]; `ack` is dropped uncalled.
    pub fn register_acked(
        &mut self,
        spec: SessionSpec,
        session_config: Vec<u8>,
        ack: Option<Ack>,
    ) -> Result<(), String> {
        let pipeline = self.pipeline.as_mut().expect("Daemon::start not called");
        self.sessions
            .register(spec, session_config, &mut self.filter, pipeline, ack)
            .map_err(|e| e.to_string())
    }

    /// Unregisters a session (its decoder flushes it; its template IDs leave the filter unless
    /// another session uses them). Returns whether it existed.
    pub fn unregister(&mut self, profile: &str, group: &str) -> bool {
        let pipeline = self.pipeline.as_mut().expect("Daemon::start not called");
        self.sessions
            .unregister(profile, group, &mut self.filter, pipeline)
    }

    /// Applies a STATE_DB change; a registration is acknowledged (`config_version` + 1) once its
    /// decoder applied it, or rejected with the reason.
    pub fn apply_state_db(&mut self, ev: SessionEvent, acker: &SessionAcker) {
        match ev {
            SessionEvent::Register {
                key,
                spec,
                session_config,
                config_version,
                ..
            } => {
                let a = acker.clone();
                let k = key.clone();
                let ack: Ack = Box::new(move |r: Result<(), String>| match r {
                    Ok(()) => a.applied(&k, config_version),
                    Err(e) => a.rejected(&k, &e),
                });
                if let Err(e) = self.register_acked(spec, session_config, Some(ack)) {
                    acker.rejected(&key, &e);
                }
            }
            SessionEvent::Unregister { profile, group, .. } => {
                self.unregister(&profile, &group);
            }
        }
    }

    fn poll_genl(&mut self, timeout: Duration) {
        let (Some(g), Socket::Netlink(s)) = (self.genl.as_mut(), &self.socket) else {
            return;
        };
        // GenlSource logs its transitions and (rate-limited) its own errors.
        match g.poll(s, timeout) {
            Ok(Some(crate::genl::Change::Rejoined { .. })) => {
                // The exporter restarted: its sequence numbers start over.
                if let Some(p) = self.pipeline.as_mut() {
                    p.broadcast_reset_sequences();
                }
            }
            Ok(_) => {}
            Err(e) => tracing::debug!(error = %e, "Generic netlink poll failed; retrying."),
        }
    }

    /// One round: wait (up to the reader's poll timeout) for datagrams, dispatch them, take
    /// back finished slots, follow the genl family. Returns the datagrams received.
    ///
    /// # Errors
    /// The receive failing for good (anything but timeouts/interrupts).
    pub fn step(&mut self) -> Result<usize, String> {
        if let Some(t) = self.last_poll_end {
            let gap = t.elapsed();
            self.gap_max = self.gap_max.max(gap);
            self.gaps_over_10ms += u64::from(gap > Duration::from_millis(10));
        }
        let mut leases = std::mem::take(&mut self.leases);
        let polled = self.reader.poll(&mut leases).map_err(|e| e.to_string());
        self.last_poll_end = Some(Instant::now());
        polled?;
        let n = leases.len();
        let framing = self.reader.framing();
        if framing == UnitFraming::Int {
            // INT reports of capture files: decoded here, like on an INT socket's thread.
            for l in leases.drain(..) {
                match &mut self.int_feed {
                    Some(f) => f.decode(
                        self.reader.source(&l),
                        self.reader.capture_ns(&l),
                        self.reader.bytes(&l),
                    ),
                    None => self.int_unrouted += 1,
                }
                self.reader.retire(l);
            }
        }
        if let Some(f) = &mut self.int_feed {
            f.tick();
        }
        let pipeline = self.pipeline.as_mut().expect("Daemon::start not called");
        let filter = &mut self.filter;
        let user_filter = !filter.is_kernel();
        let mut keep = |p: &[u8]| !user_filter || filter.keep(p);
        for l in leases.drain(..) {
            pipeline.dispatch(&mut self.reader, l, framing, &mut keep);
        }
        pipeline.collect_returns(&mut self.reader);
        pipeline.flush_control();
        self.sessions.poll(&mut self.filter, pipeline);
        self.leases = leases;
        if self.genl.is_some() && Instant::now() >= self.next_genl_poll {
            self.poll_genl(Duration::ZERO);
            self.next_genl_poll = Instant::now() + Duration::from_millis(100);
        }
        Ok(n)
    }

    /// Where the genl source stands (for the status line); `None` for other sources.
    pub fn genl_status(&self) -> Option<String> {
        self.genl.as_ref().map(|g| g.status().to_string())
    }

    /// Capture files: hands the INT datagrams ([`UnitFraming::Int`]) to `feed` (the INT
    /// source's, so they land in its tables and counters).
    pub fn set_int_feed(&mut self, feed: IntFeed) {
        self.int_feed = Some(feed);
    }

    /// File input: true once every file was read and dispatched (the caller then finishes).
    pub fn input_done(&self) -> bool {
        self.reader.finished()
    }

    /// Snapshot of every counter.
    pub fn status(&self) -> DaemonStatus {
        let kernel_drops = self
            .socket
            .fd()
            .and_then(|fd| sys::meminfo_drops(fd).ok())
            .unwrap_or(0);
        let mut filter = FilterStatus {
            kind: if self.filter.is_kernel() {
                "kernel"
            } else {
                "user_space"
            },
            policy: match self.filter.policy() {
                FilterPolicy::Registered => "registered",
                _ => "learn",
            },
            templates: self.filter.templates().len(),
            max_templates: self.filter.max_templates(),
            ..Default::default()
        };
        if let Ok(s) = self.filter.stats() {
            filter.seen = s.seen;
            filter.kept = s.kept;
            filter.dropped = s.dropped;
            filter.too_short = s.too_short;
            filter.learned = s.learned;
            filter.learn_failed = s.learn_failed;
            filter.last_dropped_template = s.last_dropped_set_id as u16;
        }
        let components = self.component_info();
        let input = self.reader.input_stats();
        let mut pipeline = self
            .pipeline
            .as_ref()
            .map(|p| p.stats())
            .unwrap_or_default();
        if let Some(i) = &input {
            // Unreadable capture records are malformed input like any other.
            pipeline.decode.malformed[Malformed::InputRecordUnreadable as usize] +=
                i.unreadable_records;
            pipeline.decode.discarded_bytes += i.discarded_bytes;
        }
        DaemonStatus {
            source: match self.genl_status() {
                Some(g) => format!("{} ({g})", self.source_desc),
                None => self.source_desc.clone(),
            },
            reader: self.reader.kind(),
            recv: self.reader.stats(),
            receive_gap_max_us: self.gap_max.as_micros() as u64,
            receive_gaps_over_10ms: self.gaps_over_10ms,
            input,
            input_problems: self.reader.input_problems(),
            kernel_drops,
            int_datagrams_unrouted: self.int_unrouted,
            filter,
            pipeline,
            sessions: self.sessions.len(),
            session_registry: self.sessions.stats(),
            components,
            capabilities_dropped: self.caps_dropped,
        }
    }

    /// Stops: keeps receiving until `drained` says everything expected is in (the demo: all it
    /// sent). Without `drained`, it takes what had been received when the stop came — the
    /// socket's receive buffer as it stood (SO_MEMINFO's queued bytes) and the receive ring —
    /// and no more: it stops at the first empty poll or once that many bytes are read, never
    /// waiting for the source to go quiet (a switch's never does: every stop took `timeout`).
    /// Bounded by `timeout` either way. Then lets the decoders finish and flush. Returns the
    /// final counters.
    pub fn finish(
        mut self,
        drained: Option<&dyn Fn(&RecvStats) -> bool>,
        timeout: Duration,
    ) -> DaemonStatus {
        let until = Instant::now() + timeout;
        // What was received at the stop: the ring's completions, reaped by the first poll, and
        // the socket's queued bytes (allocations, each at least its datagram's bytes), read
        // after it.
        let queued = self
            .socket
            .fd()
            .and_then(|fd| sys::meminfo_rmem_alloc(fd).ok())
            .unwrap_or(0);
        let from = self.reader.stats().bytes;
        while Instant::now() < until {
            match self.step() {
                Ok(n) => {
                    let done = match drained {
                        Some(f) => f(&self.reader.stats()),
                        None => n == 0 || self.reader.stats().bytes - from >= queued,
                    };
                    if done {
                        break;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "Receive failed while draining.");
                    break;
                }
            }
        }
        if let Some(f) = self.int_feed.take() {
            f.finish();
        }
        if let Some(p) = self.pipeline.take() {
            // Everything queued is decoded, then the last acknowledgements are collected.
            let mut p = p;
            let stats = p.finish(&mut self.reader);
            self.sessions.poll(&mut self.filter, &mut p);
            let mut status = self.status();
            status.pipeline = stats;
            if let Some(i) = &status.input {
                status.pipeline.decode.malformed[Malformed::InputRecordUnreadable as usize] +=
                    i.unreadable_records;
                status.pipeline.decode.discarded_bytes += i.discarded_bytes;
            }
            return status;
        }
        self.status()
    }
}
