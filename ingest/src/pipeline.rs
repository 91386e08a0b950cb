//! Dispatch and per-core decode: the reader's leases go over lock-free SPSC rings to N decoder
//! threads, whose batches fan out to the sinks.
//!
//! ```text
//!             ┌─ jobs ring (Job) ──▶ decoder 0 ── Arc<CounterBatch> ──▶ sinks (own queues)
//!  reader ────┤                          │
//!  (dispatch) └─ jobs ring (Job) ──▶ decoder 1 ...
//!      ▲                                 │
//!      ├──────────── returns ring (Lease) ◀┘   (slot back to the kernel when its last lease is in)
//!      └──────────── control replies (mpsc) ◀┘  (session applied / rejected, by ticket)
//! ```
//!
//! # Sharding
//! A netlink message's IPFIX payload goes to decoder `observation_domain % N`. Templates are
//! scoped by (domain, template ID) and sequence numbers are counted per domain, so everything
//! that shares state stays on one decoder, which owns its column builders alone (no locks). One
//! domain is decoded by one core: measured at 1.3 G counters/s per core (`stel-bench decode`),
//! ~7× the design rate of one switch, so the cost of not splitting a domain is nil, and the
//! benefit (exact sequence accounting, templates never shared) is real. Several switches or
//! domains spread over the cores.
//!
//! # Control in order with data
//! Session changes ([`Control`]) travel in the same ring as the data of their domain, so a
//! decoder applies a registration exactly between the datagrams the reader dispatched before
//! and after it — never "when idle", never racing the data — and the reader never waits for a
//! decoder: when a ring is full the control job waits in a per-decoder queue (in order) and is
//! pushed at the next dispatch or [`Pipeline::flush_control`]. Outcomes come back on a channel
//! the reader polls ([`Pipeline::poll_replies`]); the session registry
//! (`crate::sessions`) turns them into acknowledgements.
//!
//! # Zero copy
//! Decoders read the kernel-filled receive slot through their [`Lease`]; nothing is copied
//! between receive and decode. (Measured alternative: copying each datagram into a per-decoder
//! byte ring costs a memcpy of every byte, ~10 % of decode time at 1.3 G counters/s, and frees
//! slots sooner; with 512 × 64 KiB slots the kernel never starved in `stel-bench netlink`, so
//! leases win.)
//!
//! # Back-pressure
//! When a decoder's ring is full the dispatcher waits, collecting returned leases, for at most
//! `max_stall`; then it sheds that message and counts it (`shed_decoder_full_messages`, exported
//! as `stel_dispatch_shed_messages_total{reason="decoder_full"}`). While it waits the reader does
//! not receive, so the socket buffer absorbs the burst; if that overflows, the kernel's own drop
//! counter (SO_MEMINFO) reports it. Nothing is lost silently.
use std::{
    cell::RefCell,
    collections::VecDeque,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        mpsc, Arc,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use crate::{
    decode::{
        CounterBatch, DecodeConfig, DecodeStats, Decoder, DomainSeqStats, Malformed, SessionSpec,
    },
    ipfix::{MESSAGE_HEADER_LEN, VERSION},
    netlink::{self, FrameErrors, UnitFraming},
    reader::Reader,
    sys::slots::{Lease, SlotView},
};

/// Where decoded batches go. Implementations must not block: each sink owns a bounded queue
/// with an explicit, counted overflow policy (Parquet, COUNTERS_DB) or is cheap (status).
pub trait Sink: Send + Sync {
    /// Short name for logs and stats.
    fn name(&self) -> &'static str;
    /// Takes one finished batch. Called on decoder threads.
    fn submit(&self, batch: &Arc<CounterBatch>);
    /// The sink's own series of the daemon's registry (its section of the status file).
    fn stats(&self) -> stel_store::metrics::Snapshot {
        stel_store::metrics::Snapshot::default()
    }
}

/// Pipeline settings.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PipelineConfig {
    /// Decoder threads; 0 = one per CPU.
    pub decoders: usize,
    /// Leases in flight per decoder (SPSC ring capacity).
    pub queue_depth: usize,
    /// Longest the dispatcher waits for a full decoder ring before shedding, ms.
    pub max_stall_ms: u64,
    /// Partial batches are flushed to the sinks when no batch was emitted for this long, ms
    /// (keeps COUNTERS_DB fresh at low rates).
    pub flush_interval_ms: u64,
    /// Decoder settings.
    pub decode: DecodeConfig,
}

impl Default for PipelineConfig {
    fn default() -> Self {
        Self {
            decoders: 0,
            queue_depth: 256,
            max_stall_ms: 250,
            flush_interval_ms: 10,
            decode: DecodeConfig::default(),
        }
    }
}

/// Control-plane requests to a decoder (from the session registry), in order with the data.
#[derive(Debug)]
pub enum Control {
    /// Register (or replace) a session: labels → names, templates from `session_config`. The
    /// registry validated both; the outcome comes back as a [`ControlReply`] with `ticket`.
    Register {
        spec: SessionSpec,
        session_config: Vec<u8>,
        ticket: u64,
    },
    /// Forget expected sequence numbers (the exporter restarted).
    ResetSequences,
    /// Forget a session (flushes what it has first).
    Unregister {
        profile: String,
        group: String,
        domain: u32,
    },
}

/// A decoder's answer to a [`Control::Register`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlReply {
    /// The ticket of the request.
    pub ticket: u64,
    /// `Err` with the decoder's reason when it refused the session.
    pub result: Result<(), String>,
}

/// One item of a decoder's ring.
#[derive(Debug)]
enum Job {
    /// Decode the IPFIX bytes of this lease.
    Decode(Lease),
    /// The user-space filter dropped message `seq` of `domain`: sequence accounting only.
    Filtered { domain: u32, seq: u32 },
    /// A control request, in order with the data around it.
    Control(Box<Control>),
}

/// Counters of the dispatch stage.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct DispatchStats {
    /// IPFIX payloads (netlink messages or IPFIX messages) handed to decoders.
    pub messages: u64,
    /// Netlink control messages (NOOP, ERROR, DONE, OVERRUN) skipped.
    pub control_frames: u64,
    /// Messages shed because a decoder stayed full longer than `max_stall`.
    pub shed_decoder_full_messages: u64,
    pub shed_decoder_full_bytes: u64,
    /// Times the dispatcher had to wait for a decoder.
    pub stalls: u64,
    /// Control requests queued behind a full decoder ring (pushed later, in order).
    pub control_deferred: u64,
}

/// Everything the pipeline counts, summed over decoders. Netlink framing errors counted by the
/// dispatcher are folded into `decode.malformed` (and their bytes into `discarded_bytes`), so
/// every malformed input is in one place, counted once.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct PipelineStats {
    pub dispatch: DispatchStats,
    pub decode: DecodeStats,
    /// Per decoder: counters decoded (shows the sharding).
    pub per_decoder_counters: Vec<u64>,
}

/// What one decoder thread shares with the reader thread: its counters (written by the decoder
/// only) and the reader's requests (written by the reader only), each on cache lines of its own.
#[derive(Debug, Default)]
struct Shared {
    counters: CounterBlock,
    requests: Requests,
}

/// A decoder's published counters. The decoder counts in plain integers ([`DecodeStats`]) and
/// copies them here with relaxed stores every [`PUBLISH_INTERVAL`] and when it stops — never per
/// record or per message, and with no lock; the status tick reads them with relaxed loads. The
/// alignment (128 bytes: a cache line and its adjacent-line prefetch partner) gives every decoder
/// lines no other thread writes, so decoders never invalidate each other's caches.
#[derive(Debug)]
#[repr(align(128))]
struct CounterBlock {
    plain: [AtomicU64; DecodeStats::PLAIN_COUNTERS],
    malformed: [AtomicU64; Malformed::ALL.len()],
}

impl Default for CounterBlock {
    fn default() -> Self {
        Self {
            plain: std::array::from_fn(|_| AtomicU64::new(0)),
            malformed: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

impl CounterBlock {
    /// Decoder side: publishes its totals (one relaxed store per counter).
    fn store(&self, s: &DecodeStats) {
        for (a, v) in self.plain.iter().zip(s.plain_counters()) {
            a.store(v, Ordering::Relaxed);
        }
        for (a, &v) in self.malformed.iter().zip(s.malformed.iter()) {
            a.store(v, Ordering::Relaxed);
        }
    }

    /// Reader side: the totals last published (no `domains`).
    fn load(&self) -> DecodeStats {
        let mut s = DecodeStats::default();
        s.set_plain_counters(&std::array::from_fn(|i| {
            self.plain[i].load(Ordering::Relaxed)
        }));
        for (v, a) in s.malformed.iter_mut().zip(self.malformed.iter()) {
            *v = a.load(Ordering::Relaxed);
        }
        s
    }
}

/// What the reader thread asks of a decoder (written by the reader, read by the decoder).
#[derive(Debug, Default)]
#[repr(align(128))]
struct Requests {
    /// Stop once the jobs ring is empty.
    closing: AtomicBool,
    /// Status ticks that asked for the per-domain sequence figures: the decoder sends a copy on
    /// its `domains` ring at its next publish when this moved (per status tick, not per batch).
    domains_wanted: AtomicU64,
}

/// How often a decoder publishes its counters (and answers a request for its domain figures).
const PUBLISH_INTERVAL: Duration = Duration::from_millis(5);

#[derive(Debug)]
struct Worker {
    jobs: rtrb::Producer<Job>,
    returns: rtrb::Consumer<Lease>,
    /// Control jobs waiting for room in `jobs` (kept in order; data waits behind them).
    deferred: VecDeque<Job>,
    shared: Arc<Shared>,
    /// The decoder's per-domain sequence figures, sent when asked ([`Requests::domains_wanted`])
    /// and when it stops, and the newest received. Only the reader thread touches it (a
    /// `RefCell`: [`Pipeline::stats`] takes `&self`, and `Pipeline` is not `Sync`).
    domains: RefCell<(rtrb::Consumer<Vec<DomainSeqStats>>, Vec<DomainSeqStats>)>,
    thread: Option<JoinHandle<()>>,
}

/// The dispatcher plus its decoder threads. Owned by the reader thread.
#[derive(Debug)]
pub struct Pipeline {
    workers: Vec<Worker>,
    stats: DispatchStats,
    frame_errors: FrameErrors,
    max_stall: Duration,
    replies: mpsc::Receiver<ControlReply>,
    /// Reused per datagram: what to push for each payload.
    scratch: Vec<Planned>,
}

/// What dispatch decided for one payload of a unit.
#[derive(Debug, Clone, Copy)]
enum Planned {
    Decode {
        off: usize,
        len: usize,
        worker: usize,
    },
    Filtered {
        domain: u32,
        seq: u32,
        worker: usize,
    },
}

/// Number of decoders for `configured` (0 = one per CPU).
pub fn decoder_count(configured: usize) -> usize {
    if configured > 0 {
        configured
    } else {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    }
}

/// Calls `f` with each IPFIX message of a unit of concatenated messages. A header that cannot
/// be trusted (too short, not version 10, a length below 16 or past the unit) ends the walk:
/// the rest is handed over as one last piece, so the decoder counts it under its reason exactly
/// as it would inside a netlink payload.
pub fn for_each_ipfix_message(unit: &[u8], mut f: impl FnMut(&[u8])) {
    let mut off = 0;
    while off < unit.len() {
        let rest = &unit[off..];
        let len = if rest.len() >= MESSAGE_HEADER_LEN
            && u16::from_be_bytes([rest[0], rest[1]]) == VERSION
        {
            u16::from_be_bytes([rest[2], rest[3]]) as usize
        } else {
            0
        };
        if len < MESSAGE_HEADER_LEN || len > rest.len() {
            f(rest);
            return;
        }
        f(&rest[..len]);
        off += len;
    }
}

/// (domain, sequence number) of each IPFIX message header in `payload`, in order, while the
/// headers hold (for the sequence accounting of filtered payloads).
fn message_sequences(payload: &[u8], mut f: impl FnMut(u32, u32)) {
    for_each_ipfix_message(payload, |m| {
        if m.len() >= MESSAGE_HEADER_LEN && u16::from_be_bytes([m[0], m[1]]) == VERSION {
            f(
                u32::from_be_bytes([m[12], m[13], m[14], m[15]]),
                u32::from_be_bytes([m[8], m[9], m[10], m[11]]),
            );
        }
    });
}

impl Pipeline {
    /// Starts the decoder threads. `view` reads the reader's slots.
    pub fn start(cfg: &PipelineConfig, view: &SlotView, sinks: Vec<Arc<dyn Sink>>) -> Self {
        let n = decoder_count(cfg.decoders);
        let sinks: Arc<[Arc<dyn Sink>]> = sinks.into();
        let (reply_tx, replies) = mpsc::channel();
        let workers = (0..n)
            .map(|i| {
                let depth = cfg.queue_depth.max(1);
                let (jobs, jobs_rx) = rtrb::RingBuffer::<Job>::new(depth);
                // One more than the jobs ring: a lease is in exactly one of the two rings or in
                // the worker's hands, so the returns ring can never be full.
                let (returns_tx, returns) = rtrb::RingBuffer::<Lease>::new(depth + 1);
                let shared = Arc::new(Shared::default());
                // At most one answer per status tick plus the final one are in flight between
                // two reads (the reader drains it whenever it asks).
                let (domains_tx, domains_rx) = rtrb::RingBuffer::new(4);
                let mut w = DecodeWorker {
                    decoder: Decoder::new(cfg.decode.clone()),
                    jobs: jobs_rx,
                    returns: returns_tx,
                    replies: reply_tx.clone(),
                    view: view.clone(),
                    sinks: Arc::clone(&sinks),
                    shared: Arc::clone(&shared),
                    domains_tx,
                    domains_served: 0,
                    flush_interval: Duration::from_millis(cfg.flush_interval_ms.max(1)),
                    batches: Vec::new(),
                };
                let thread = std::thread::Builder::new()
                    .name(format!("stel-decode-{i}"))
                    .spawn(move || w.run())
                    .expect("spawn decoder thread");
                Worker {
                    jobs,
                    returns,
                    deferred: VecDeque::new(),
                    shared,
                    domains: RefCell::new((domains_rx, Vec::new())),
                    thread: Some(thread),
                }
            })
            .collect();
        Self {
            workers,
            stats: DispatchStats::default(),
            frame_errors: FrameErrors::default(),
            max_stall: Duration::from_millis(cfg.max_stall_ms),
            replies,
            scratch: Vec::with_capacity(16),
        }
    }

    /// Decoder threads.
    pub fn decoders(&self) -> usize {
        self.workers.len()
    }

    /// The decoder that owns observation domain `domain`.
    pub fn shard(&self, domain: u32) -> usize {
        domain as usize % self.workers.len()
    }

    /// Tells every decoder that the exporter restarted (sequence numbers start over).
    pub fn broadcast_reset_sequences(&mut self) {
        for w in 0..self.workers.len() {
            self.enqueue(w, Job::Control(Box::new(Control::ResetSequences)));
        }
    }

    /// Queues a control request for the decoder that owns its domain, in order with the data
    /// dispatched so far. Never blocks.
    pub fn control(&mut self, c: Control) {
        let domain = match &c {
            Control::Register { spec, .. } => spec.domain,
            Control::Unregister { domain, .. } => *domain,
            Control::ResetSequences => return self.broadcast_reset_sequences(),
        };
        let w = self.shard(domain);
        self.enqueue(w, Job::Control(Box::new(c)));
    }

    fn enqueue(&mut self, w: usize, job: Job) {
        let worker = &mut self.workers[w];
        worker.deferred.push_back(job);
        Self::flush_worker(worker);
        if !worker.deferred.is_empty() {
            self.stats.control_deferred += 1;
        }
    }

    /// Pushes deferred control jobs of `worker` while its ring has room; true when none is left.
    fn flush_worker(worker: &mut Worker) -> bool {
        while let Some(job) = worker.deferred.pop_front() {
            if let Err(rtrb::PushError::Full(job)) = worker.jobs.push(job) {
                worker.deferred.push_front(job);
                return false;
            }
        }
        true
    }

    /// Pushes deferred control jobs wherever there is room (call once per receive round).
    pub fn flush_control(&mut self) {
        for w in &mut self.workers {
            Self::flush_worker(w);
        }
    }

    /// Control jobs still waiting for room in a decoder ring.
    pub fn control_pending(&self) -> usize {
        self.workers.iter().map(|w| w.deferred.len()).sum()
    }

    /// Takes the decoders' answers to [`Control::Register`] received so far (never blocks).
    pub fn poll_replies(&self, out: &mut Vec<ControlReply>) {
        while let Ok(r) = self.replies.try_recv() {
            out.push(r);
        }
    }

    /// Splits one received unit into IPFIX payloads and hands each to its decoder. `keep` is the
    /// user-space template filter (always true when the eBPF filter runs); what it drops still
    /// reaches its decoder's sequence accounting, as filtered.
    pub fn dispatch(
        &mut self,
        reader: &mut Reader,
        lease: Lease,
        framing: UnitFraming,
        keep: &mut dyn FnMut(&[u8]) -> bool,
    ) {
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.clear();
        {
            let bytes = reader.bytes(&lease);
            let base = bytes.as_ptr() as usize;
            let n = self.workers.len();
            let mut plan = |p: &[u8]| {
                if !keep(p) {
                    message_sequences(p, |domain, seq| {
                        scratch.push(Planned::Filtered {
                            domain,
                            seq,
                            worker: domain as usize % n,
                        })
                    });
                    return;
                }
                let domain = if p.len() >= MESSAGE_HEADER_LEN {
                    u32::from_be_bytes([p[12], p[13], p[14], p[15]])
                } else {
                    0 // too short: any decoder counts it as malformed
                };
                scratch.push(Planned::Decode {
                    off: p.as_ptr() as usize - base,
                    len: p.len(),
                    worker: domain as usize % n,
                });
            };
            match framing {
                UnitFraming::Netlink => {
                    netlink::for_each_payload(bytes, &mut self.frame_errors, &mut plan)
                }
                UnitFraming::Ipfix => for_each_ipfix_message(bytes, &mut plan),
                // Not IPFIX: the daemon routes these to the INT decoder (and counts any it
                // could not, see `DaemonStatus::int_units_unrouted`).
                UnitFraming::Int => {}
            }
        }
        for &p in &scratch {
            match p {
                Planned::Decode { off, len, worker } => {
                    let sub = reader.sublease(&lease, off, off + len);
                    self.push(reader, worker, Job::Decode(sub));
                }
                Planned::Filtered {
                    domain,
                    seq,
                    worker,
                } => self.push(reader, worker, Job::Filtered { domain, seq }),
            }
        }
        reader.retire(lease);
        self.scratch = scratch;
        self.stats.control_frames = self.frame_errors.control;
    }

    fn push(&mut self, reader: &mut Reader, w: usize, mut job: Job) {
        let mut since: Option<Instant> = None;
        let decode = matches!(job, Job::Decode(_));
        loop {
            let worker = &mut self.workers[w];
            if Self::flush_worker(worker) {
                match worker.jobs.push(job) {
                    Ok(()) => {
                        self.stats.messages += decode as u64;
                        return;
                    }
                    Err(rtrb::PushError::Full(j)) => job = j,
                }
            }
            let start = *since.get_or_insert_with(|| {
                self.stats.stalls += 1;
                Instant::now()
            });
            self.collect_returns(reader);
            if start.elapsed() >= self.max_stall {
                self.stats.shed_decoder_full_messages += 1;
                if let Job::Decode(lease) = job {
                    self.stats.shed_decoder_full_bytes += lease.len() as u64;
                    reader.retire(lease);
                }
                return;
            }
            std::thread::yield_now();
        }
    }

    /// Takes back the leases decoders are done with (their slots go back to the kernel).
    pub fn collect_returns(&mut self, reader: &mut Reader) {
        for w in &mut self.workers {
            while let Ok(l) = w.returns.pop() {
                reader.retire(l);
            }
        }
    }

    /// Snapshot of all counters (decoders publish theirs every few ms). The per-domain sequence
    /// figures are those the decoders sent for the previous call (they are asked here and answer
    /// within a few ms); after [`Self::finish`] they are final.
    pub fn stats(&self) -> PipelineStats {
        let mut s = PipelineStats {
            dispatch: self.stats,
            ..Default::default()
        };
        for w in &self.workers {
            let mut d = w.shared.counters.load();
            {
                let (rx, newest) = &mut *w.domains.borrow_mut();
                while let Ok(v) = rx.pop() {
                    *newest = v;
                }
                d.domains.clone_from(newest);
            }
            w.shared
                .requests
                .domains_wanted
                .fetch_add(1, Ordering::Relaxed);
            s.per_decoder_counters.push(d.counters);
            s.decode.add(&d);
        }
        let f = &self.frame_errors;
        let m = &mut s.decode.malformed;
        m[Malformed::NetlinkLengthTooSmall as usize] += f.length_too_small;
        m[Malformed::NetlinkLengthPastDatagram as usize] += f.length_past_datagram;
        m[Malformed::NetlinkTrailingBytes as usize] += f.trailing_bytes;
        s.decode.discarded_bytes += f.discarded_bytes;
        s
    }

    /// Stops the decoders after they have decoded everything already dispatched (deferred
    /// control included), flushes their batches to the sinks, and returns the final counters.
    /// Decoder answers still in the channel stay readable ([`Self::poll_replies`]).
    pub fn finish(&mut self, reader: &mut Reader) -> PipelineStats {
        // Deferred control goes first (in order); a decoder that died takes its queue with it.
        while self
            .workers
            .iter()
            .any(|w| !w.deferred.is_empty() && w.thread.as_ref().is_some_and(|t| !t.is_finished()))
        {
            self.flush_control();
            self.collect_returns(reader);
            std::thread::sleep(Duration::from_micros(200));
        }
        for w in &self.workers {
            w.shared.requests.closing.store(true, Ordering::Release);
        }
        for i in 0..self.workers.len() {
            while self.workers[i]
                .thread
                .as_ref()
                .is_some_and(|t| !t.is_finished())
            {
                self.collect_returns(reader);
                std::thread::sleep(Duration::from_micros(200));
            }
            if let Some(t) = self.workers[i].thread.take() {
                if t.join().is_err() {
                    tracing::error!(decoder = i, "Decoder thread panicked.");
                }
            }
        }
        self.collect_returns(reader);
        self.stats()
    }
}

struct DecodeWorker {
    decoder: Decoder,
    jobs: rtrb::Consumer<Job>,
    returns: rtrb::Producer<Lease>,
    replies: mpsc::Sender<ControlReply>,
    view: SlotView,
    sinks: Arc<[Arc<dyn Sink>]>,
    shared: Arc<Shared>,
    domains_tx: rtrb::Producer<Vec<DomainSeqStats>>,
    /// The last [`Requests::domains_wanted`] answered.
    domains_served: u64,
    flush_interval: Duration,
    batches: Vec<CounterBatch>,
}

/// The reader hands datagrams over in batches (`reader.batch_wait_us`, 200 µs by default), so a
/// shorter first sleep mostly wakes to an empty ring (each wakeup cost ~16 µs of the decoder's
/// CPU in `stel-bench e2e` on this VM).
const IDLE_SLEEP_MIN: Duration = Duration::from_micros(200);
const IDLE_SLEEP_MAX: Duration = Duration::from_millis(1);

impl DecodeWorker {
    fn run(&mut self) {
        let mut last_emit = Instant::now();
        let mut last_publish = Instant::now();
        // Idle back-off: 200 µs while data flows (the reader's batch interval), doubling
        // to 1 ms while there is none. A fixed 50 µs made an idle daemon wake 20,000 times a
        // second per decoder (40 % of a core doing nothing); 1 ms bounds the extra latency of
        // the first message after a pause well under the 10 ms flush interval.
        let mut idle_sleep = IDLE_SLEEP_MIN;
        loop {
            let mut did = 0;
            while let Ok(job) = self.jobs.pop() {
                match job {
                    Job::Decode(lease) => {
                        let batches = &mut self.batches;
                        self.decoder
                            .decode(self.view.bytes(&lease), &mut |b: CounterBatch| {
                                batches.push(b)
                            });
                        // Cannot fail: the returns ring is one larger than the jobs ring.
                        let _ = self.returns.push(lease);
                    }
                    Job::Filtered { domain, seq } => self.decoder.skip_filtered(domain, seq),
                    Job::Control(c) => self.apply(*c),
                }
                did += 1;
                if did == 64 {
                    break;
                }
            }
            if !self.batches.is_empty() {
                self.emit();
                last_emit = Instant::now();
            }
            let now = Instant::now();
            if now.duration_since(last_emit) >= self.flush_interval {
                self.flush();
                last_emit = now;
            }
            if now.duration_since(last_publish) >= PUBLISH_INTERVAL {
                self.publish(false);
                last_publish = now;
            }
            if did == 0 {
                if self.shared.requests.closing.load(Ordering::Acquire) && self.jobs.is_empty() {
                    self.flush();
                    self.decoder.settle_sequences();
                    self.publish(true);
                    return;
                }
                std::thread::sleep(idle_sleep);
                idle_sleep = (idle_sleep * 2).min(IDLE_SLEEP_MAX);
            } else {
                idle_sleep = IDLE_SLEEP_MIN;
            }
        }
    }

    fn apply(&mut self, c: Control) {
        let batches = &mut self.batches;
        match c {
            Control::Register {
                spec,
                session_config,
                ticket,
            } => {
                let (profile, group) = (spec.profile.clone(), spec.group.clone());
                // A re-registration replaces the session whole (its templates may differ).
                self.decoder
                    .unregister_named(&profile, &group, &mut |b: CounterBatch| batches.push(b));
                let result = self
                    .decoder
                    .register_session(spec, &session_config, &mut |b: CounterBatch| {
                        batches.push(b)
                    })
                    .map(drop)
                    .map_err(|e| e.to_string());
                tracing::debug!(%profile, %group, ok = result.is_ok(), "Decoder applied a session.");
                let _ = self.replies.send(ControlReply { ticket, result });
            }
            Control::ResetSequences => self.decoder.reset_sequences(),
            Control::Unregister { profile, group, .. } => {
                let found =
                    self.decoder
                        .unregister_named(&profile, &group, &mut |b: CounterBatch| batches.push(b));
                tracing::debug!(%profile, %group, found, "Decoder dropped a session.");
            }
        }
        self.emit();
    }

    fn flush(&mut self) {
        let batches = &mut self.batches;
        self.decoder.flush(&mut |b: CounterBatch| batches.push(b));
        self.emit();
    }

    fn emit(&mut self) {
        for b in self.batches.drain(..) {
            let b = Arc::new(b);
            for s in self.sinks.iter() {
                s.submit(&b);
            }
            // Reuse the buffers when no sink kept the batch (avoids page-faulting fresh ones).
            if let Ok(b) = Arc::try_unwrap(b) {
                self.decoder.recycle(b);
            }
        }
    }

    /// Copies the counters into the shared block; sends the per-domain figures when the reader
    /// asked for them since the last time, or when `last`.
    fn publish(&mut self, last: bool) {
        let stats = self.decoder.stats();
        self.shared.counters.store(stats);
        let wanted = self.shared.requests.domains_wanted.load(Ordering::Relaxed);
        if (last || wanted != self.domains_served)
            && self.domains_tx.push(stats.domains.clone()).is_ok()
        {
            self.domains_served = wanted;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every plain counter and every malformed reason survives the trip through a decoder's
    /// counter block (a field left out of `with_plain_counters!` would read back as 0).
    #[test]
    fn counter_block_round_trips_every_counter() {
        let mut s = DecodeStats::default();
        let v: [u64; DecodeStats::PLAIN_COUNTERS] = std::array::from_fn(|i| 1000 + i as u64);
        s.set_plain_counters(&v);
        for (i, m) in s.malformed.iter_mut().enumerate() {
            *m = 7 + i as u64;
        }
        let b = CounterBlock::default();
        b.store(&s);
        assert_eq!(b.load(), s);
        assert_eq!(b.load().plain_counters(), v);
        // Every number field of the struct is in the list (serde sees them all).
        let j = serde_json::to_value(b.load()).unwrap();
        for (k, x) in j.as_object().unwrap() {
            assert!(x.as_u64() != Some(0), "{k} is not in with_plain_counters!");
        }
        assert_eq!(std::mem::align_of::<CounterBlock>(), 128);
        assert_eq!(std::mem::size_of::<CounterBlock>() % 128, 0);
    }
}
