//! The daemon's receive loop, wired: socket → (eBPF filter) → [`Reader`] → [`Pipeline`] → sinks,
//! plus the control plane that registers sessions (decoders and filter map together).
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
    decode::{session_template_ids, SessionSpec},
    filter::TemplateFilter,
    genl::{GenlConfig, GenlSource, GenlSourceConfig},
    pipeline::{Pipeline, PipelineStats, Sink},
    reader::Reader,
    sinks::StatusSource,
    sys::{self, netlink::NetlinkSocket, slots::Lease, uring::RecvStats, SysError},
};

/// The socket the daemon reads.
#[derive(Debug)]
enum Socket {
    Netlink(NetlinkSocket),
    /// The demo's end of a local datagram socket pair.
    Local(OwnedFd),
}

impl Socket {
    fn fd(&self) -> BorrowedFd<'_> {
        match self {
            Socket::Netlink(s) => s.as_fd(),
            Socket::Local(f) => f.as_fd(),
        }
    }
}

/// Filter counters as the status shows them.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct FilterStatus {
    /// `kernel` (eBPF) or `user_space`.
    pub kind: &'static str,
    pub templates: usize,
    pub seen: u64,
    pub kept: u64,
    pub dropped: u64,
    pub too_short: u64,
}

/// Everything the daemon counts. Serialised into the status file each interval.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct DaemonStatus {
    pub source: String,
    pub reader: &'static str,
    pub recv: RecvStats,
    /// Datagrams the kernel dropped on our socket because its buffer was full (SO_MEMINFO
    /// SK_MEMINFO_DROPS): true loss, counted as lost.
    pub kernel_drops: u64,
    pub filter: FilterStatus,
    pub pipeline: PipelineStats,
    pub sessions: usize,
    /// Per sink, whatever the sink reports.
    pub sinks: serde_json::Map<String, serde_json::Value>,
    pub capabilities_dropped: bool,
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
    sessions: Vec<(String, String, u32, Vec<u16>)>,
    caps_dropped: bool,
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
                let s = NetlinkSocket::usersock().map_err(privilege_hint)?;
                s.join_group(cfg.source.usersock_group)
                    .map_err(privilege_hint)?;
                let d = format!("NETLINK_USERSOCK group {}", cfg.source.usersock_group);
                (Socket::Netlink(s), d)
            }
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
        let mut filter = if cfg.filter.ebpf {
            TemplateFilter::new()
        } else {
            TemplateFilter::user_space()
        };
        if let Err(e) = filter.attach(socket.fd()) {
            tracing::error!(error = %e, "Could not attach the eBPF filter; filtering in user space.");
            filter = TemplateFilter::user_space();
        }
        let reader = Reader::new(socket.fd(), &cfg.reader).map_err(|e| e.to_string())?;
        tracing::info!(
            source = %source_desc,
            reader = reader.kind(),
            filter = if filter.is_kernel() { "ebpf" } else { "user_space" },
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
            sessions: Vec::new(),
            caps_dropped: false,
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

    /// Spawns the decoder threads; batches go to `sinks`.
    pub fn start(&mut self, sinks: Vec<Arc<dyn Sink>>) {
        self.sinks = sinks.clone();
        self.pipeline = Some(Pipeline::start(
            &self.cfg.pipeline,
            &self.reader.view(),
            sinks,
        ));
    }

    /// Adds counters to the status (under `sinks.<name>`) of something that takes no batches
    /// (the uploader, the inspect server).
    pub fn add_status_source(&mut self, s: Arc<dyn StatusSource>) {
        self.status_sources.push(s);
    }

    fn sink_stats(&self) -> serde_json::Map<String, serde_json::Value> {
        let mut sinks = serde_json::Map::new();
        for s in &self.sinks {
            sinks.insert(s.name().to_string(), s.stats_json());
        }
        for s in &self.status_sources {
            sinks.insert(s.name().to_string(), s.stats_json());
        }
        sinks
    }

    fn pipeline(&self) -> &Pipeline {
        self.pipeline.as_ref().expect("Daemon::start not called")
    }

    /// Registers a session: decoders learn its templates and names, the filter its template
    /// IDs. Re-registering the same profile/group replaces it.
    ///
    /// # Errors
    /// Invalid templates or labels; the filter map refusing the IDs.
    pub fn register(&mut self, spec: SessionSpec, session_config: Vec<u8>) -> Result<(), String> {
        let tids = session_template_ids(&session_config).map_err(|e| e.to_string())?;
        let (profile, group, domain) = (spec.profile.clone(), spec.group.clone(), spec.domain);
        self.unregister(&profile, &group);
        self.pipeline().register(spec, session_config)?;
        for &t in &tids {
            self.filter.register(t).map_err(|e| e.to_string())?;
        }
        self.sessions.push((profile, group, domain, tids));
        Ok(())
    }

    /// Unregisters a session (decoders flush it; its template IDs leave the filter map unless
    /// another session uses them).
    pub fn unregister(&mut self, profile: &str, group: &str) {
        let Some(i) = self
            .sessions
            .iter()
            .position(|(p, g, ..)| p == profile && g == group)
        else {
            return;
        };
        let (profile, group, domain, tids) = self.sessions.swap_remove(i);
        for t in tids {
            if !self.sessions.iter().any(|s| s.3.contains(&t)) {
                if let Err(e) = self.filter.unregister(t) {
                    tracing::warn!(template = t, error = %e, "Filter map update failed.");
                }
            }
        }
        self.pipeline()
            .control(crate::pipeline::Control::Unregister {
                profile,
                group,
                domain,
            });
    }

    fn poll_genl(&mut self, timeout: Duration) {
        let (Some(g), Socket::Netlink(s)) = (self.genl.as_mut(), &self.socket) else {
            return;
        };
        // GenlSource logs its transitions and (rate-limited) its own errors.
        match g.poll(s, timeout) {
            Ok(Some(crate::genl::Change::Rejoined { .. })) => {
                // The exporter restarted: its sequence numbers start over.
                if let Some(p) = self.pipeline.as_ref() {
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
        let mut leases = std::mem::take(&mut self.leases);
        self.reader.poll(&mut leases).map_err(|e| e.to_string())?;
        let n = leases.len();
        let pipeline = self.pipeline.as_mut().expect("Daemon::start not called");
        let filter = &self.filter;
        let user_filter = !filter.is_kernel();
        let mut keep = |p: &[u8]| !user_filter || filter.keep(p);
        for l in leases.drain(..) {
            pipeline.dispatch(&mut self.reader, l, &mut keep);
        }
        pipeline.collect_returns(&mut self.reader);
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

    /// Snapshot of every counter.
    pub fn status(&self) -> DaemonStatus {
        let kernel_drops = sys::meminfo_drops(self.socket.fd()).unwrap_or(0);
        let mut filter = FilterStatus {
            kind: if self.filter.is_kernel() {
                "kernel"
            } else {
                "user_space"
            },
            templates: self.filter.templates().len(),
            ..Default::default()
        };
        if let Ok(s) = self.filter.stats() {
            filter.seen = s.seen;
            filter.kept = s.kept;
            filter.dropped = s.dropped;
            filter.too_short = s.too_short;
        }
        let sinks = self.sink_stats();
        DaemonStatus {
            source: match self.genl_status() {
                Some(g) => format!("{} ({g})", self.source_desc),
                None => self.source_desc.clone(),
            },
            reader: self.reader.kind(),
            recv: self.reader.stats(),
            kernel_drops,
            filter,
            pipeline: self
                .pipeline
                .as_ref()
                .map(|p| p.stats())
                .unwrap_or_default(),
            sessions: self.sessions.len(),
            sinks,
            capabilities_dropped: self.caps_dropped,
        }
    }

    /// Stops: keeps receiving until `drained` says everything expected is in (or nothing came
    /// for one poll interval when `drained` is `None`), bounded by `timeout`; then lets the
    /// decoders finish and flush. Returns the final counters.
    pub fn finish(
        mut self,
        drained: Option<&dyn Fn(&RecvStats) -> bool>,
        timeout: Duration,
    ) -> DaemonStatus {
        let until = Instant::now() + timeout;
        while Instant::now() < until {
            match self.step() {
                Ok(n) => {
                    let done = match drained {
                        Some(f) => f(&self.reader.stats()),
                        None => n == 0,
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
        let mut status = self.status();
        if let Some(p) = self.pipeline.take() {
            status.pipeline = p.finish(&mut self.reader);
        }
        status.sinks = self.sink_stats();
        status
    }
}
