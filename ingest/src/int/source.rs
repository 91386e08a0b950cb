//! The INT receive stage in the daemon: UDP sockets on the configured ports, read by the same
//! [`Reader`] as netlink (io_uring multishot `RecvMsg` into the provided-buffer ring, or the
//! recvmsg loop), each datagram decoded in place by an [`IntDecoder`] on the reading thread and
//! handed in batches to the INT Parquet sink ([`stel_store::int::IntSink`]).
//!
//! ```text
//!  switch ──UDP──▶ port 5900 ─┬─ SO_REUSEPORT socket 0 ──▶ thread stel-int-0: Reader → IntDecoder ─┐
//!                             └─ SO_REUSEPORT socket 1 ──▶ thread stel-int-1: Reader → IntDecoder ─┴▶ IntSink (writer thread)
//! ```
//!
//! UDP GRO (`[int] gro`, on by default): a receive may hold several same-size datagrams of one
//! sender ([`Reader::udp_gro`], the segment size from the control message); the thread cuts
//! them apart and decodes each as a datagram of its own.
//!
//! Sharding: every listen address gets `threads` sockets bound with SO_REUSEPORT; the kernel
//! hashes each datagram's (source, destination) addresses and ports onto one of them, so one
//! reporting switch (one source address and port) always lands on the same thread, and with it
//! its sequence streams and flows, while many switches spread over the threads. No dispatcher,
//! no queue between receive and decode: a lease is decoded where it was received and retired
//! at once.
//!
//! State: each thread owns its decoder (loss streams, flow table) and reader; the EVC map is an
//! immutable `Arc` swapped on reload ([`IntSource::reload_evcs`], SIGHUP in the daemon); the
//! counters are published to the thread's own cache-aligned block of atomics every
//! `publish_ms` (relaxed stores, no lock; never per report), which [`IntSource::stats`] reads.
//!
//! Source address: both receive loops ask the kernel for each datagram's sender (io_uring: the
//! name area of the multishot `RecvMsg` buffer; recvmsg loop: `recvfrom`). It is stored as
//! `int_reports.reporter_addr` (IPv4 mapped into IPv6, like the other address columns) and is
//! the switch id of a Telemetry Report v0.5 without a drop or switch-local header (its IPv4
//! address as a u32); v1.0 and v2.0 reports carry their switch id.
//!
//! Capture files (`stel-ingestd --input`): UDP datagrams to the INT ports go through an
//! [`IntFeed`] on the daemon's reader thread: the same decoder settings, EVC map, sink and
//! counters as a socket thread, with the capture's source address and timestamp.
//!
//! Filter (`[int.filter]`, off by default; [`crate::filter::int`]): reports of other versions
//! or from other senders are dropped by an eBPF socket filter before they reach the sockets
//! (or, without it, by the same rule on each thread before decoding), counted by reason. The
//! filter is attached before the sockets are bound ([`bind`]): no datagram reaches one
//! unfiltered, even from senders that were sending before the daemon started.
use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    os::fd::{AsFd, OwnedFd},
    path::PathBuf,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex,
    },
    thread::JoinHandle,
    time::{Duration, Instant, SystemTime},
};

use serde::{Deserialize, Serialize};
use stel_store::{
    int::{IntSink as ParquetIntSink, IntSinkConfig, IntSinkStats},
    log_limit::LogLimiter,
};

use super::{evc::EvcSources, IntBatch, IntDecodeConfig, IntDecoder, IntSink, IntStats, Malformed};
use crate::{
    filter::int::{IntFilter, IntFilterConfig, IntFilterRule, IntFilterStats, IntFilterStatus},
    reader::{Reader, ReaderConfig, ReaderKind},
    sys::{self, uring::RecvStats},
};

/// AmLight's INT collector port (Kytos `telemetry_int`'s default).
pub const DEFAULT_PORT: u16 = 5900;

/// How long a receive wait may collect datagrams before it returns (io_uring `min_wait_usec`,
/// kernel 6.12+, as the netlink reader's `batch_wait_us`): while reports stream in, the thread
/// wakes once per this many µs for all that arrived, not once per datagram or two; a wait that
/// began longer ago returns at the first datagram, so a quiet feed waits no longer.
pub const BATCH_WAIT_US: u32 = 200;

/// `[int]`: INT telemetry reports over UDP.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct IntConfig {
    /// Addresses to receive reports on (several allowed; port 5900 is AmLight's).
    pub listen: Vec<SocketAddr>,
    /// Decode threads per listen address (SO_REUSEPORT sockets; the kernel keeps each sender on
    /// one of them). 1 is right for a 2-core box that also ingests counters.
    pub threads: usize,
    /// Socket receive buffer per socket, bytes (SO_RCVBUFFORCE with CAP_NET_ADMIN, else capped
    /// at net.core.rmem_max): what absorbs a burst while the decoder is busy.
    pub rcvbuf_bytes: usize,
    /// `auto` (io_uring where the kernel allows it), `io_uring` or `recvmsg`.
    pub reader: ReaderKind,
    /// Receive slots per socket (one datagram, or one UDP GRO batch, each; 64 KiB + header,
    /// touched only as far as the kernel writes). 256: a 200 µs batching wait of plain
    /// datagrams at a few hundred thousand per second fits, so the multishot receive does not
    /// run out of buffers and need re-arming every wait.
    pub slots: u16,
    /// UDP GRO on the sockets (kernel 5.0+): same-size datagrams of one sender that arrive
    /// together may be handed over as one buffer (the NIC or the sender coalesced them), then
    /// cut into reports on the decode thread: one receive for many reports. Off: one receive
    /// per datagram.
    pub gro: bool,
    /// Decoder settings (`[int.decode]`).
    pub decode: IntDecodeConfig,
    /// Parquet tables (`[int.parquet]`); `dir` empty = the counters' history root.
    pub parquet: IntSinkConfig,
    /// EVC names (`[int.evc]`: `mapping` TOML and/or `kytos_evcs` JSON), reloaded on SIGHUP.
    pub evc: EvcSources,
    /// How often each thread publishes its counters, ms.
    pub publish_ms: u64,
    /// Report filter on the sockets (`[int.filter]`, off by default): accepted versions and
    /// senders, dropped in the kernel (eBPF socket filter) when it loads.
    pub filter: IntFilterConfig,
}

impl Default for IntConfig {
    fn default() -> Self {
        Self {
            listen: vec![SocketAddr::new(
                IpAddr::V4(Ipv4Addr::UNSPECIFIED),
                DEFAULT_PORT,
            )],
            threads: 1,
            rcvbuf_bytes: 64 << 20,
            reader: ReaderKind::Auto,
            slots: 256,
            gro: true,
            decode: IntDecodeConfig::default(),
            parquet: IntSinkConfig {
                dir: PathBuf::new(),
                ..IntSinkConfig::default()
            },
            evc: EvcSources::default(),
            publish_ms: 200,
            filter: IntFilterConfig::default(),
        }
    }
}

impl IntConfig {
    /// Where the tables go: `[int.parquet] dir`, else `history_dir` (the counters' root).
    pub fn tables_dir(&self, history_dir: &std::path::Path) -> std::path::PathBuf {
        if self.parquet.dir.as_os_str().is_empty() {
            history_dir.to_path_buf()
        } else {
            self.parquet.dir.clone()
        }
    }

    /// Every problem with these settings, each naming `int.<key>` and the value.
    pub fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        if self.listen.is_empty() {
            p.push("int.listen is empty: give at least one address, e.g. \"0.0.0.0:5900\"".into());
        }
        let mut seen = std::collections::HashSet::new();
        for a in &self.listen {
            if !seen.insert(a) {
                p.push(format!("int.listen: {a} is listed twice"));
            }
        }
        if !(1..=64).contains(&self.threads) {
            p.push(format!("int.threads = {} must be 1..=64", self.threads));
        }
        if self.slots < 2 {
            p.push(format!("int.slots = {} must be at least 2", self.slots));
        }
        if self.decode.max_hops == 0 || self.decode.max_hops > 64 {
            p.push(format!(
                "int.decode.max_hops = {} must be 1..=64",
                self.decode.max_hops
            ));
        }
        if !(1..=1024).contains(&self.decode.reorder_window) {
            p.push(format!(
                "int.decode.reorder_window = {} must be 1..=1024",
                self.decode.reorder_window
            ));
        }
        if self.decode.max_seq_gap < self.decode.reorder_window {
            p.push(format!(
                "int.decode.max_seq_gap = {} must be at least int.decode.reorder_window ({})",
                self.decode.max_seq_gap, self.decode.reorder_window
            ));
        }
        for (key, v) in [
            ("max_flows", self.decode.max_flows),
            ("max_streams", self.decode.max_streams),
        ] {
            if !(1..=1 << 24).contains(&v) {
                p.push(format!("int.decode.{key} = {v} must be 1..=16777216"));
            }
        }
        if let Err(e) = self.parquet.validate() {
            p.push(format!("int.parquet: {e}"));
        }
        p.extend(self.filter.problems());
        p
    }
}

/// Why the INT source could not start.
#[derive(Debug, thiserror::Error)]
pub enum IntSourceError {
    #[error("invalid [int] settings: {}", .0.join("; "))]
    Config(Vec<String>),
    #[error("int: cannot receive on {addr}: {source} (is another collector on this port? choose another with --int-listen)")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("int: {0}")]
    Sys(#[from] sys::SysError),
    #[error("int: EVC names: {0} (fix the file, or drop [int.evc])")]
    Evc(#[from] super::evc::EvcError),
    #[error("int: Parquet tables under {dir}: {message}")]
    Sink { dir: PathBuf, message: String },
}

/// Counters of the INT source: receive (all sockets), decode (all decoders), the sink.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct IntSourceStats {
    /// The bound addresses (the real port when 0 was asked).
    pub listen: Vec<SocketAddr>,
    /// Sockets (listen addresses × threads).
    pub sockets: usize,
    /// `io_uring` or `recvmsg` (the first socket's).
    pub reader: &'static str,
    pub recv: RecvStats,
    /// Datagrams the kernel dropped for want of socket buffer (SO_MEMINFO, less what the INT
    /// filter dropped in the kernel, which UDP counts there too), all sockets.
    pub kernel_drops: u64,
    /// The report filter's counters (`[int.filter]` on).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub filter: Option<IntFilterStatus>,
    pub decode: IntStats,
    pub sink: IntSinkStats,
    /// EVC map reloads that worked / failed (the old map stays on failure).
    pub evc_reloads: u64,
    pub evc_reload_failures: u64,
    /// EVCs in the current map.
    pub evcs: usize,
}

impl IntSourceStats {
    /// The status file's `info.components.int`: what has no registry series (the bound
    /// addresses, the receive loop, where the report filter runs and why). Every counter is a
    /// registry series (`stel_int_*`, and the reader's and sinks' with `source`/`sink="int"`).
    pub fn info(&self) -> serde_json::Value {
        let mut v = serde_json::json!({ "listen": self.listen, "reader": self.reader });
        if let Some(f) = &self.filter {
            v["filter"] =
                serde_json::json!({ "kind": f.kind, "fallback_reason": f.fallback_reason });
        }
        v
    }
}

/// Per-thread share of [`IntSourceStats`], as read back from its [`FigureBlock`].
#[derive(Debug, Default, Clone)]
struct ThreadFigures {
    recv: RecvStats,
    kernel_drops: u64,
    decode: IntStats,
    /// The user-space filter's counters (kernel filter: counted in its map).
    filter: IntFilterStats,
}

/// Receive counters of [`RecvStats`], in [`FigureBlock::recv`]'s order.
const RECV_COUNTERS: usize = 8;
/// The counters of [`IntFilterStats`], in [`FigureBlock::filter`]'s order.
const FILTER_COUNTERS: usize = 5;

/// One INT thread's (or capture feed's) published counters: written by that thread alone, once
/// per `publish_ms` (a relaxed store each, no lock), read by the status tick with relaxed loads.
/// Each block is its own allocation aligned to 128 bytes (a cache line and its adjacent-line
/// prefetch partner), so two threads' publishes never write the same line.
#[derive(Debug)]
#[repr(align(128))]
struct FigureBlock {
    recv: [AtomicU64; RECV_COUNTERS],
    kernel_drops: AtomicU64,
    decode: [AtomicU64; IntStats::PLAIN_COUNTERS],
    malformed: [AtomicU64; Malformed::ALL.len()],
    filter: [AtomicU64; FILTER_COUNTERS],
}

impl Default for FigureBlock {
    fn default() -> Self {
        Self {
            recv: std::array::from_fn(|_| AtomicU64::new(0)),
            kernel_drops: AtomicU64::new(0),
            decode: std::array::from_fn(|_| AtomicU64::new(0)),
            malformed: std::array::from_fn(|_| AtomicU64::new(0)),
            filter: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

fn store_all<const N: usize>(cells: &[AtomicU64; N], v: [u64; N]) {
    for (a, v) in cells.iter().zip(v) {
        a.store(v, Ordering::Relaxed);
    }
}

fn load_all<const N: usize>(cells: &[AtomicU64; N]) -> [u64; N] {
    std::array::from_fn(|i| cells[i].load(Ordering::Relaxed))
}

impl FigureBlock {
    /// The owning thread: publishes its totals.
    fn store(
        &self,
        recv: &RecvStats,
        kernel_drops: u64,
        decode: &IntStats,
        filter: &IntFilterStats,
    ) {
        let r = recv;
        store_all(
            &self.recv,
            [
                r.datagrams,
                r.bytes,
                r.truncated,
                r.rearms_no_buffers,
                r.rearms,
                r.errors,
                r.no_free_slot,
                r.polls,
            ],
        );
        self.kernel_drops.store(kernel_drops, Ordering::Relaxed);
        store_all(&self.decode, decode.plain_counters());
        store_all(&self.malformed, decode.malformed.0);
        let f = filter;
        store_all(
            &self.filter,
            [f.seen, f.kept, f.dropped_version, f.dropped_source, f.empty],
        );
    }

    /// The status tick: the totals last published.
    fn load(&self) -> ThreadFigures {
        let [datagrams, bytes, truncated, rearms_no_buffers, rearms, errors, no_free_slot, polls] =
            load_all(&self.recv);
        let mut decode = IntStats::default();
        decode.set_plain_counters(&load_all(&self.decode));
        decode.malformed.0 = load_all(&self.malformed);
        let [seen, kept, dropped_version, dropped_source, empty] = load_all(&self.filter);
        ThreadFigures {
            recv: RecvStats {
                datagrams,
                bytes,
                truncated,
                rearms_no_buffers,
                rearms,
                errors,
                no_free_slot,
                polls,
            },
            kernel_drops: self.kernel_drops.load(Ordering::Relaxed),
            decode,
            filter: IntFilterStats {
                seen,
                kept,
                dropped_version,
                dropped_source,
                empty,
            },
        }
    }
}

/// The running INT receive stage.
pub struct IntSource {
    threads: Vec<JoinHandle<()>>,
    figures: Vec<Arc<FigureBlock>>,
    halt: Arc<AtomicBool>,
    /// Bumped by a reload; threads pick up `evc_map` when it changes.
    evc_generation: Arc<AtomicU64>,
    evc_map: Arc<Mutex<Arc<super::evc::EvcMap>>>,
    evc_sources: EvcSources,
    evc_reloads: u64,
    evc_reload_failures: u64,
    sink: Arc<ParquetIntSink>,
    reader: &'static str,
    filter: Option<IntFilter>,
    /// Where the tables go.
    pub dir: PathBuf,
    /// The bound addresses (with the real port when 0 was asked).
    pub local_addrs: Vec<SocketAddr>,
    /// Decoder settings, for [`IntSource::feed`].
    decode_cfg: super::IntDecodeConfig,
    publish: Duration,
}

impl std::fmt::Debug for IntSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IntSource")
            .field("local_addrs", &self.local_addrs)
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

/// The INT sockets, each with the address it is bound to, and the report filter attached to
/// them (`None` when `[int.filter]` is off).
pub type IntSockets = (Vec<(SocketAddr, OwnedFd)>, Option<IntFilter>);

/// Opens the sockets with the report filter on them before they can receive (privileged:
/// SO_RCVBUFFORCE, CAP_BPF; call before dropping capabilities). Every socket is created, then
/// the filter (`[int.filter]` on) is loaded and attached to all of them, and only then are they
/// bound: a UDP socket receives nothing before it is bound, so no datagram reaches one
/// unfiltered, however early senders start.
///
/// # Errors
/// A listen address that cannot be bound.
pub fn bind(cfg: &IntConfig) -> Result<IntSockets, IntSourceError> {
    let problems = cfg.problems();
    if !problems.is_empty() {
        return Err(IntSourceError::Config(problems));
    }
    let mut open = Vec::new();
    for &addr in &cfg.listen {
        for _ in 0..cfg.threads {
            let s = udp_socket(addr, cfg.threads > 1)
                .map_err(|source| IntSourceError::Bind { addr, source })?;
            let fd: OwnedFd = s.into();
            sys::set_rcvbuf(fd.as_fd(), cfg.rcvbuf_bytes)?;
            open.push(fd);
        }
    }
    let filter = (cfg.filter.enabled && !open.is_empty())
        .then(|| IntFilter::new(&cfg.filter, open.iter().map(|fd| fd.as_fd())));
    let mut out = Vec::with_capacity(open.len());
    let mut fds = open.into_iter();
    for &addr in &cfg.listen {
        let mut to = addr;
        for fd in fds.by_ref().take(cfg.threads) {
            let s = socket2::SockRef::from(&fd);
            s.bind(&to.into())
                .map_err(|source| IntSourceError::Bind { addr, source })?;
            // Port 0: the other threads of this address share the port the first one got.
            to = s
                .local_addr()
                .ok()
                .and_then(|a| a.as_socket())
                .unwrap_or(to);
            out.push((to, fd));
        }
    }
    Ok((out, filter))
}

fn udp_socket(addr: SocketAddr, reuse_port: bool) -> std::io::Result<socket2::Socket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let s = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    if reuse_port {
        s.set_reuse_port(true)?;
    }
    Ok(s)
}

fn wall_ns() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

/// Says (rate-limited, per thread) when a decoder's per-sender tables pushed state out to stay
/// within their bounds, or sequence numbers jumped without confirmation: both are what a flood
/// of forged or random reports looks like. Each line gives the counts since the last one.
#[derive(Debug)]
struct BoundWarnings {
    /// flows_evicted, seq_streams_evicted, seq_suspect as of the last line.
    last: [u64; 3],
    tables: LogLimiter,
    suspect: LogLimiter,
}

impl BoundWarnings {
    fn new() -> Self {
        Self {
            last: [0; 3],
            tables: LogLimiter::new(Duration::from_secs(10)),
            suspect: LogLimiter::new(Duration::from_secs(10)),
        }
    }

    fn check(&mut self, dec: &IntDecoder) {
        let d = dec.stats();
        let (max_flows, max_streams) = dec.table_bounds();
        let [flows, streams, suspect] = self.last;
        if d.flows_evicted > flows || d.seq_streams_evicted > streams {
            if let Some(held_back) = self.tables.allow() {
                tracing::warn!(
                    flows_evicted = d.flows_evicted - flows,
                    streams_evicted = d.seq_streams_evicted - streams,
                    max_flows,
                    max_streams,
                    held_back,
                    "INT: flow or sequence-stream table full; the least recently seen entries were dropped (many new flows or switch ids: raise int.decode.max_flows / max_streams, or look for a sender of random reports)."
                );
                self.last[0] = d.flows_evicted;
                self.last[1] = d.seq_streams_evicted;
            }
        }
        if d.seq_suspect > suspect {
            if let Some(held_back) = self.suspect.allow() {
                tracing::warn!(
                    reports = d.seq_suspect - suspect,
                    held_back,
                    "INT: sequence numbers jumped ahead without the next number following; not counted as loss (corrupt or forged reports?)."
                );
                self.last[2] = d.seq_suspect;
            }
        }
    }
}

/// Hands the decoder's batches to the Parquet sink; a shed batch is counted by the sink.
struct ToSink<'a>(&'a ParquetIntSink);
impl IntSink for ToSink<'_> {
    fn on_batch(&mut self, batch: IntBatch) {
        // Shed batches are counted by reason inside the sink (stats().shed_rows()).
        let _ = self.0.submit(batch);
    }
}

impl IntSource {
    /// Starts the Parquet sink and one thread per socket from [`bind`]. `history_dir` is the
    /// counters' root, used when `[int.parquet] dir` is empty.
    ///
    /// # Errors
    /// Bad settings, an unreadable EVC file, a sink that cannot create its directory, io_uring
    /// requested but unavailable.
    pub fn start(
        cfg: &IntConfig,
        sockets: Vec<(SocketAddr, OwnedFd)>,
        history_dir: &std::path::Path,
    ) -> Result<IntSource, IntSourceError> {
        Self::start_filtered(cfg, sockets, None, history_dir)
    }

    /// As [`Self::start`], with the report filter [`bind`] attached (its user-space rule is
    /// applied by every thread when the kernel program is not attached).
    ///
    /// # Errors
    /// As [`Self::start`].
    pub fn start_filtered(
        cfg: &IntConfig,
        sockets: Vec<(SocketAddr, OwnedFd)>,
        filter: Option<IntFilter>,
        history_dir: &std::path::Path,
    ) -> Result<IntSource, IntSourceError> {
        let rule = filter.as_ref().and_then(|f| f.user_rule().cloned());
        let evc_map = cfg.evc.load()?;
        let mut sink_cfg = cfg.parquet.clone();
        sink_cfg.dir = cfg.tables_dir(history_dir);
        let dir = sink_cfg.dir.clone();
        let sink = Arc::new(
            ParquetIntSink::start(sink_cfg).map_err(|e| IntSourceError::Sink {
                dir: dir.clone(),
                message: e.to_string(),
            })?,
        );
        let reader_cfg = ReaderConfig {
            kind: cfg.reader,
            slots: cfg.slots,
            // The largest UDP payload plus io_uring's recvmsg header: no report is truncated.
            slot_bytes: 65_536 + 64,
            poll_timeout_ms: 20,
            batch_wait_us: BATCH_WAIT_US,
        };
        let halt = Arc::new(AtomicBool::new(false));
        let evc_generation = Arc::new(AtomicU64::new(0));
        let shared_map = Arc::new(Mutex::new(evc_map));
        let mut threads = Vec::new();
        let mut figures = Vec::new();
        let mut local_addrs = Vec::new();
        let mut reader_kind = if sockets.is_empty() { "file" } else { "" };
        for (i, (addr, fd)) in sockets.into_iter().enumerate() {
            if !local_addrs.contains(&addr) {
                local_addrs.push(addr);
            }
            let fig = Arc::new(FigureBlock::default());
            figures.push(Arc::clone(&fig));
            let mut dec = IntDecoder::new(cfg.decode.clone());
            dec.set_evc_map(Arc::clone(&shared_map.lock().expect("evc map lock")));
            let ctx = ThreadCtx {
                fd,
                reader_cfg: reader_cfg.clone(),
                dec,
                sink: Arc::clone(&sink),
                fig,
                halt: Arc::clone(&halt),
                generation: Arc::clone(&evc_generation),
                map: Arc::clone(&shared_map),
                publish: Duration::from_millis(cfg.publish_ms.max(10)),
                rule: rule.clone(),
                filtered: IntFilterStats::default(),
                warnings: BoundWarnings::new(),
                gro: cfg.gro,
            };
            // The ring is set up on the thread that uses it: io_uring's single-issuer mode
            // refuses submissions from another task (EEXIST).
            let (tx, rx) = std::sync::mpsc::channel();
            let h = std::thread::Builder::new()
                .name(format!("stel-int-{i}"))
                .spawn(move || ctx.run(tx))
                .map_err(|source| sys::SysError {
                    call: "spawn(stel-int)",
                    source,
                })?;
            threads.push(h);
            match rx.recv() {
                Ok(Ok(kind)) => {
                    if i == 0 {
                        reader_kind = kind;
                    }
                }
                Ok(Err(e)) => {
                    halt.store(true, Ordering::Relaxed);
                    return Err(e.into());
                }
                Err(_) => {
                    halt.store(true, Ordering::Relaxed);
                    return Err(IntSourceError::Sink {
                        dir,
                        message: "an INT thread died while starting".into(),
                    });
                }
            }
        }
        Ok(IntSource {
            threads,
            figures,
            halt,
            evc_generation,
            evc_map: shared_map,
            evc_sources: cfg.evc.clone(),
            evc_reloads: 0,
            evc_reload_failures: 0,
            sink,
            reader: reader_kind,
            filter,
            dir,
            local_addrs,
            decode_cfg: cfg.decode.clone(),
            publish: Duration::from_millis(cfg.publish_ms.max(10)),
        })
    }

    /// A decoder for INT datagrams of capture files, fed by the daemon's reader thread: same
    /// settings, EVC map (as of now; reloads reach it too), sink and counters as the socket
    /// threads. Finish it with [`IntFeed::finish`] before [`Self::shutdown`].
    pub fn feed(&mut self) -> IntFeed {
        let fig = Arc::new(FigureBlock::default());
        self.figures.push(Arc::clone(&fig));
        let mut dec = IntDecoder::new(self.decode_cfg.clone());
        dec.set_evc_map(Arc::clone(&self.evc_map.lock().expect("evc map lock")));
        IntFeed {
            dec,
            sink: Arc::clone(&self.sink),
            fig,
            recv: RecvStats::default(),
            generation: Arc::clone(&self.evc_generation),
            seen_generation: self.evc_generation.load(Ordering::Acquire),
            map: Arc::clone(&self.evc_map),
            publish: self.publish,
            last_publish: Instant::now(),
            last_ns: 0,
            rule: self.filter.as_ref().and_then(|f| f.user_rule().cloned()),
            filtered: IntFilterStats::default(),
            warnings: BoundWarnings::new(),
        }
    }

    /// Re-reads the EVC files; on success every decoder switches to the new map before its next
    /// poll, on failure the old map stays (logged, counted).
    pub fn reload_evcs(&mut self) {
        match self.evc_sources.load() {
            Ok(m) => {
                let n = m.len();
                *self.evc_map.lock().expect("evc map lock") = m;
                self.evc_generation.fetch_add(1, Ordering::Release);
                self.evc_reloads += 1;
                tracing::info!(evcs = n, "INT: EVC names reloaded.");
            }
            Err(e) => {
                self.evc_reload_failures += 1;
                tracing::warn!(error = %e, "INT: EVC reload failed; keeping the previous names.");
            }
        }
    }

    /// The counters now (receive and decode as of each thread's last publish).
    pub fn stats(&self) -> IntSourceStats {
        let mut s = IntSourceStats {
            listen: self.local_addrs.clone(),
            sockets: self.figures.len(),
            reader: self.reader,
            sink: self.sink.stats(),
            evc_reloads: self.evc_reloads,
            evc_reload_failures: self.evc_reload_failures,
            evcs: self.evc_map.lock().expect("evc map lock").len(),
            ..IntSourceStats::default()
        };
        let mut filtered = IntFilterStats::default();
        for f in &self.figures {
            let f = f.load();
            add_recv(&mut s.recv, &f.recv);
            s.kernel_drops += f.kernel_drops;
            s.decode.add(&f.decode);
            filtered.add(&f.filter);
        }
        if let Some(flt) = &self.filter {
            let (kind, counts) = match flt.kernel_stats() {
                Some(k) => {
                    // UDP counts its socket filter's drops in SK_MEMINFO_DROPS: not buffer loss.
                    s.kernel_drops = s.kernel_drops.saturating_sub(k.dropped());
                    ("kernel", k)
                }
                None if flt.is_kernel() => ("kernel", IntFilterStats::default()),
                None => ("user_space", filtered),
            };
            s.filter = Some(IntFilterStatus::new(
                kind,
                flt.fallback_reason.clone(),
                &counts,
            ));
        }
        s
    }

    /// Stops receiving, decodes what was received, makes pending sequence gaps final, flushes
    /// the tables and returns the final counters.
    pub fn shutdown(mut self) -> IntSourceStats {
        self.halt.store(true, Ordering::Relaxed);
        for h in self.threads.drain(..) {
            if h.join().is_err() {
                tracing::error!("INT: a decode thread panicked; its last counters are lost.");
            }
        }
        let mut s = self.stats();
        let sink = Arc::clone(&self.sink);
        drop(self);
        match Arc::try_unwrap(sink) {
            Ok(sink) => match sink.shutdown() {
                Ok(fin) => s.sink = fin,
                Err(e) => tracing::error!(error = %e, "INT: final flush of the tables failed."),
            },
            Err(_) => tracing::error!("INT: the sink is still shared at shutdown."),
        }
        s
    }
}

fn add_recv(a: &mut RecvStats, b: &RecvStats) {
    a.datagrams += b.datagrams;
    a.bytes += b.bytes;
    a.truncated += b.truncated;
    a.rearms_no_buffers += b.rearms_no_buffers;
    a.rearms += b.rearms;
    a.errors += b.errors;
    a.no_free_slot += b.no_free_slot;
    a.polls += b.polls;
}

/// Decodes INT datagrams handed over one by one (capture files: see [`IntSource::feed`]).
pub struct IntFeed {
    dec: IntDecoder,
    sink: Arc<ParquetIntSink>,
    fig: Arc<FigureBlock>,
    /// Datagrams and bytes handed over (the file reader's share of `recv`).
    recv: RecvStats,
    generation: Arc<AtomicU64>,
    seen_generation: u64,
    map: Arc<Mutex<Arc<super::evc::EvcMap>>>,
    publish: Duration,
    last_publish: Instant,
    /// Receive time of the last datagram (for the final flush's flow expiry).
    last_ns: i64,
    /// `[int.filter]`'s rule (captures: always in user space), and its counters.
    rule: Option<IntFilterRule>,
    filtered: IntFilterStats,
    warnings: BoundWarnings,
}

impl std::fmt::Debug for IntFeed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IntFeed")
            .field("recv", &self.recv)
            .finish_non_exhaustive()
    }
}

impl IntFeed {
    /// Decodes one UDP payload from `src` received at `recv_ns` (the capture time; now when
    /// `None`).
    pub fn decode(&mut self, src: Option<SocketAddr>, recv_ns: Option<i64>, payload: &[u8]) {
        self.recv.datagrams += 1;
        self.recv.bytes += payload.len() as u64;
        let ts = recv_ns.unwrap_or_else(wall_ns);
        self.last_ns = ts;
        if let Some(r) = &self.rule {
            let v = r.verdict(src.map(|a| a.ip()), payload);
            self.filtered.count(v);
            if !v.keep() {
                return;
            }
        }
        self.dec
            .decode(source_ip(src), ts, payload, &mut ToSink(&self.sink));
    }

    /// Once per reader poll: picks up a reloaded EVC map, publishes the counters every
    /// `publish_ms`.
    pub fn tick(&mut self) {
        let g = self.generation.load(Ordering::Acquire);
        if g != self.seen_generation {
            self.seen_generation = g;
            let m = Arc::clone(&self.map.lock().expect("evc map lock"));
            self.dec.set_evc_map(m);
        }
        if self.last_publish.elapsed() >= self.publish {
            self.publish_figures();
            self.last_publish = Instant::now();
        }
    }

    fn publish_figures(&mut self) {
        self.fig
            .store(&self.recv, 0, &self.dec.stats(), &self.filtered);
        self.warnings.check(&self.dec);
    }

    /// Hands over what is batched, makes pending sequence gaps final, publishes the counters.
    pub fn finish(mut self) {
        self.dec.flush(self.last_ns, &mut ToSink(&self.sink));
        self.dec.finish_sequences();
        self.publish_figures();
    }
}

/// The sender's IP as the decoder takes it (IPv4-mapped IPv6 from a dual-stack socket as
/// IPv4; unknown = unspecified, which the decoder stores as null).
fn source_ip(src: Option<SocketAddr>) -> IpAddr {
    src.map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |a| a.ip().to_canonical())
}

struct ThreadCtx {
    fd: OwnedFd,
    reader_cfg: ReaderConfig,
    dec: IntDecoder,
    sink: Arc<ParquetIntSink>,
    fig: Arc<FigureBlock>,
    halt: Arc<AtomicBool>,
    generation: Arc<AtomicU64>,
    map: Arc<Mutex<Arc<super::evc::EvcMap>>>,
    publish: Duration,
    /// The report filter's rule when it runs in user space.
    rule: Option<IntFilterRule>,
    filtered: IntFilterStats,
    warnings: BoundWarnings,
    /// Turn UDP GRO on (`[int] gro`).
    gro: bool,
}

impl ThreadCtx {
    fn run(mut self, started: std::sync::mpsc::Sender<Result<&'static str, sys::SysError>>) {
        let r = if self.gro {
            Reader::udp_gro(self.fd.as_fd(), &self.reader_cfg)
        } else {
            Reader::udp(self.fd.as_fd(), &self.reader_cfg)
                .map(|r| (r, Some("int.gro = false".into())))
        };
        let mut reader = match r {
            Ok((r, gro_off)) => {
                match gro_off {
                    None => tracing::debug!(reader = r.kind(), "INT: UDP GRO on."),
                    Some(why) => {
                        tracing::info!(reason = %why, "INT: UDP GRO off; one receive per datagram.")
                    }
                }
                let _ = started.send(Ok(r.kind()));
                r
            }
            Err(e) => {
                let _ = started.send(Err(e));
                return;
            }
        };
        // A poll delivers at most one lease per slot: the list never grows while receiving.
        let mut leases = Vec::with_capacity(usize::from(self.reader_cfg.slots.max(2)));
        let mut seen_generation = 0;
        let mut last_publish = Instant::now();
        let mut last_data = Instant::now();
        let mut idle_flushed = true;
        let mut errors_logged = 0u32;
        loop {
            let halting = self.halt.load(Ordering::Relaxed);
            if let Err(e) = reader.poll(&mut leases) {
                if errors_logged < 10 {
                    tracing::warn!(error = %e, "INT: receive failed; retrying.");
                    errors_logged += 1;
                }
            }
            if !leases.is_empty() {
                // One clock read per poll batch, not per report.
                let now = wall_ns();
                for lease in &leases {
                    let n = reader.bytes(lease).len();
                    let seg = reader.segment(lease).unwrap_or(n).max(1);
                    if seg < n {
                        self.dec.count_gro(n.div_ceil(seg) as u64);
                    }
                }
                // Every datagram of the poll in order — a GRO buffer cut every `seg` bytes (the
                // last may be shorter), the user-space filter applied — decoded as one batch:
                // the next datagram's bytes load while one is decoded.
                let (rule, filtered) = (&self.rule, &mut self.filtered);
                let reader_ref = &reader;
                let datagrams = leases
                    .iter()
                    .flat_map(|lease| {
                        let from = reader_ref.source(lease);
                        let bytes = reader_ref.bytes(lease);
                        let seg = reader_ref.segment(lease).unwrap_or(bytes.len()).max(1);
                        (0..bytes.len().max(1))
                            .step_by(seg)
                            .map(move |at| (from, &bytes[at..(at + seg).min(bytes.len())]))
                    })
                    .filter(|&(from, dgram)| match rule {
                        Some(r) => {
                            let v = r.verdict(from.map(|a| a.ip()), dgram);
                            filtered.count(v);
                            v.keep()
                        }
                        None => true,
                    })
                    .map(|(from, dgram)| (source_ip(from), now, dgram));
                self.dec.decode_batch(datagrams, &mut ToSink(&self.sink));
                for lease in leases.drain(..) {
                    reader.retire(lease);
                }
                last_data = Instant::now();
                idle_flushed = false;
            } else if halting {
                break;
            } else if !idle_flushed && last_data.elapsed() >= self.publish {
                // The feed went quiet: hand over what is batched so it reaches the tables.
                self.dec.flush(wall_ns(), &mut ToSink(&self.sink));
                idle_flushed = true;
            }
            let g = self.generation.load(Ordering::Acquire);
            if g != seen_generation {
                seen_generation = g;
                let m = Arc::clone(&self.map.lock().expect("evc map lock"));
                self.dec.set_evc_map(m);
            }
            if last_publish.elapsed() >= self.publish {
                self.publish_figures(&reader);
                last_publish = Instant::now();
            }
        }
        self.dec.flush(wall_ns(), &mut ToSink(&self.sink));
        self.dec.finish_sequences();
        self.publish_figures(&reader);
    }

    fn publish_figures(&mut self, reader: &Reader) {
        let drops = sys::meminfo_drops(self.fd.as_fd()).unwrap_or(0);
        self.fig
            .store(&reader.stats(), drops, &self.dec.stats(), &self.filtered);
        self.warnings.check(&self.dec);
    }
}

impl Drop for IntSource {
    fn drop(&mut self) {
        self.halt.store(true, Ordering::Relaxed);
        for h in self.threads.drain(..) {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every counter a thread publishes reads back in its place, and blocks of two threads
    /// never share a cache line (nor its prefetch partner).
    #[test]
    fn a_figure_block_round_trips_every_counter_on_lines_of_its_own() {
        let mut d = IntStats::default();
        let v: [u64; IntStats::PLAIN_COUNTERS] = std::array::from_fn(|i| 1000 + i as u64);
        d.set_plain_counters(&v);
        for (i, m) in d.malformed.0.iter_mut().enumerate() {
            *m = 5000 + i as u64;
        }
        let recv = RecvStats {
            datagrams: 1,
            bytes: 2,
            truncated: 3,
            rearms_no_buffers: 4,
            rearms: 5,
            errors: 6,
            no_free_slot: 7,
            polls: 8,
        };
        let filter = IntFilterStats {
            seen: 11,
            kept: 12,
            dropped_version: 13,
            dropped_source: 14,
            empty: 15,
        };
        let b = FigureBlock::default();
        b.store(&recv, 9, &d, &filter);
        let f = b.load();
        assert_eq!(f.recv, recv);
        assert_eq!(f.kernel_drops, 9);
        assert_eq!(f.decode, d);
        assert_eq!(f.decode.plain_counters(), v);
        assert_eq!(f.filter, filter);
        assert_eq!(std::mem::align_of::<FigureBlock>(), 128);
        assert_eq!(std::mem::size_of::<FigureBlock>() % 128, 0);
    }
}
