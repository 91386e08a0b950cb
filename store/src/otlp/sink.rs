//! [`OtlpSink`]: the bounded queue in front of the exporter, the exporter thread (encode, route,
//! batch into requests) and the delivery tasks (send, retry with backoff) on the I/O thread.

use std::{
    collections::HashMap,
    fmt,
    path::PathBuf,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering::Relaxed},
        Arc, Mutex,
    },
    thread::JoinHandle,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use bytes::Bytes;
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TrySendError};
use serde::Serialize;

use super::{
    config::{OtlpConfig, WhenFull},
    encode::{self, Envelope, Plan, RequestBuf},
    transport::{Client, Failure},
    Error,
};
use crate::{
    batch::{release, CounterBatch},
    labels,
    log_limit::LogLimiter,
    metrics::{Counter, Gauge, Metric, Registry},
    schema::SessionSchema,
};

macro_rules! reasons {
    ($($(#[doc = $doc:literal])+ $variant:ident => $field:ident, $label:literal;)*) => {
        /// Why data points were dropped (the `reason` label of `stel_sink_dropped_*`).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum DropReason {
            $($(#[doc = $doc])+ $variant,)*
        }

        impl DropReason {
            /// Every reason.
            pub const ALL: &'static [DropReason] = &[$(DropReason::$variant,)*];

            /// The label value.
            pub const fn as_str(self) -> &'static str {
                match self { $(DropReason::$variant => $label,)* }
            }
        }

        /// Counts per [`DropReason`].
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
        pub struct DropCounts {
            $($(#[doc = $doc])+ pub $field: u64,)*
        }

        impl DropCounts {
            /// The count of one reason.
            pub fn get(&self, r: DropReason) -> u64 {
                match r { $(DropReason::$variant => self.$field,)* }
            }

            fn set(&mut self, r: DropReason, v: u64) {
                match r { $(DropReason::$variant => self.$field = v,)* }
            }

            /// All reasons together.
            pub fn total(&self) -> u64 {
                0 $(+ self.$field)*
            }
        }
    };
}

reasons! {
    /// The queue was full (`when_full = "drop_newest"`, or a racing submit took the room).
    QueueFull => queue_full, "queue_full";
    /// Evicted from the full queue to make room for a newer batch (`when_full = "drop_oldest"`).
    QueueEvicted => queue_evicted, "queue_evicted";
    /// The endpoint was failing and every request slot was busy retrying: dropped before it was
    /// encoded.
    Unavailable => unavailable, "unavailable";
    /// Still failing `retry_max_elapsed_ms` after the first attempt.
    RetriesExhausted => retries_exhausted, "retries_exhausted";
    /// The collector refused the request for good (INVALID_ARGUMENT, HTTP 400, …).
    Rejected => rejected, "rejected";
    /// The collector took the request but rejected these points (OTLP partial success).
    PartiallyRejected => partially_rejected, "partially_rejected";
    /// No endpoint for the session's profile (`endpoint` empty and no `otel_endpoint`, or the
    /// profile's `otel_endpoint` is not a valid URL).
    NoEndpoint => no_endpoint, "no_endpoint";
    /// The sink was stopping (submitted after shutdown began, or still unsent at its deadline).
    Shutdown => shutdown, "shutdown";
}

/// A snapshot of the sink's counters (cumulative since start).
///
/// Accounting identity once the sink has shut down:
/// `samples_received = samples_delivered + samples_downsampled + dropped_samples.total()`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct OtlpStats {
    /// Batches passed to `submit`.
    pub batches_received: u64,
    /// Counter values in them (values of split snapshots' missing parts excluded).
    pub samples_received: u64,
    /// Batches put on the queue (pushed).
    pub batches_queued: u64,
    /// Batches the exporter took off the queue (popped).
    pub batches_dequeued: u64,
    /// Batches dropped before the exporter saw them, by reason (queue_full, queue_evicted,
    /// shutdown).
    pub dropped_batches: DropCounts,
    /// Counter values dropped, by reason.
    pub dropped_samples: DropCounts,
    /// Counter values left out by `resolution_ms`.
    pub samples_downsampled: u64,
    /// Counter values the collector acknowledged (data points delivered).
    pub samples_delivered: u64,
    /// Data points of the daemon's own metrics delivered / dropped.
    pub own_points_delivered: u64,
    pub own_points_dropped: u64,
    /// Requests acknowledged, and their protobuf bytes.
    pub requests: u64,
    pub request_bytes: u64,
    /// Failed attempts, by failure (some were retried).
    pub errors_unavailable: u64,
    pub errors_timeout: u64,
    pub errors_throttled: u64,
    pub errors_rejected: u64,
    pub errors_bad_response: u64,
    /// Attempts that were retries.
    pub retries: u64,
    /// Requests in flight now (started − finished).
    pub requests_in_flight: u64,
    /// Profiles routed to their own `otel_endpoint` now.
    pub profile_endpoints: u64,
    /// CONFIG_DB reads that failed.
    pub config_db_errors: u64,
}

impl OtlpStats {
    /// Received values not yet delivered, dropped or downsampled (queued or in flight). Zero
    /// after [`OtlpSink::shutdown`].
    pub fn in_flight_samples(&self) -> u64 {
        self.samples_received.saturating_sub(
            self.samples_delivered + self.samples_downsampled + self.dropped_samples.total(),
        )
    }
}

/// The sink's counters: registry handles (or detached ones), updated once per batch / request.
#[derive(Debug)]
pub(crate) struct Counters {
    received_batches: Counter,
    received_samples: Counter,
    queued: Counter,
    dequeued: Counter,
    dropped_batches: Vec<Counter>,
    dropped_samples: Vec<Counter>,
    downsampled: Counter,
    delivered: Counter,
    requests: Counter,
    request_bytes: Counter,
    errors: Vec<Counter>,
    retries: Counter,
    pub(crate) profile_endpoints: Gauge,
    pub(crate) config_db_errors: Counter,
    own_delivered: AtomicU64,
    own_dropped: AtomicU64,
    started: AtomicU64,
    finished: AtomicU64,
}

impl Counters {
    fn new(registry: Option<&Registry>) -> Self {
        let sink = labels!(Sink = "otlp");
        let c = |m: Metric| registry.map_or_else(Counter::detached, |r| r.counter(m, sink));
        let by = |m: Metric, reason: &'static str| {
            registry.map_or_else(Counter::detached, |r| {
                r.counter(m, labels!(Sink = "otlp", Reason = reason))
            })
        };
        Self {
            received_batches: c(Metric::SinkReceivedBatches),
            received_samples: c(Metric::SinkReceivedSamples),
            queued: c(Metric::SinkQueuedBatches),
            dequeued: c(Metric::SinkDequeuedBatches),
            dropped_batches: DropReason::ALL
                .iter()
                .map(|r| by(Metric::SinkDroppedBatches, r.as_str()))
                .collect(),
            dropped_samples: DropReason::ALL
                .iter()
                .map(|r| by(Metric::SinkDroppedSamples, r.as_str()))
                .collect(),
            downsampled: c(Metric::SinkDownsampledSamples),
            delivered: c(Metric::SinkDeliveredSamples),
            requests: c(Metric::SinkRequests),
            request_bytes: c(Metric::SinkRequestBytes),
            errors: Failure::ALL
                .iter()
                .map(|f| by(Metric::SinkRequestErrors, f.as_str()))
                .collect(),
            retries: c(Metric::SinkRetries),
            profile_endpoints: registry.map_or_else(Gauge::detached, |r| {
                r.gauge(Metric::SinkProfileEndpoints, sink)
            }),
            config_db_errors: c(Metric::SinkConfigDbErrors),
            own_delivered: AtomicU64::new(0),
            own_dropped: AtomicU64::new(0),
            started: AtomicU64::new(0),
            finished: AtomicU64::new(0),
        }
    }

    fn idx(r: DropReason) -> usize {
        DropReason::ALL.iter().position(|x| *x == r).unwrap_or(0)
    }

    fn drop_batch(&self, r: DropReason, samples: u64) {
        self.dropped_batches[Self::idx(r)].add(1);
        self.dropped_samples[Self::idx(r)].add(samples);
    }

    fn drop_samples(&self, r: DropReason, samples: u64, own: u64) {
        self.dropped_samples[Self::idx(r)].add(samples);
        self.own_dropped.fetch_add(own, Relaxed);
    }

    fn error(&self, f: Failure) {
        let i = Failure::ALL.iter().position(|x| *x == f).unwrap_or(0);
        self.errors[i].add(1);
    }

    fn snapshot(&self) -> OtlpStats {
        let mut dropped_batches = DropCounts::default();
        let mut dropped_samples = DropCounts::default();
        for (i, r) in DropReason::ALL.iter().enumerate() {
            dropped_batches.set(*r, self.dropped_batches[i].get());
            dropped_samples.set(*r, self.dropped_samples[i].get());
        }
        let e = |f: Failure| {
            let i = Failure::ALL.iter().position(|x| *x == f).unwrap_or(0);
            self.errors[i].get()
        };
        let started = self.started.load(Relaxed);
        OtlpStats {
            batches_received: self.received_batches.get(),
            samples_received: self.received_samples.get(),
            batches_queued: self.queued.get(),
            batches_dequeued: self.dequeued.get(),
            dropped_batches,
            dropped_samples,
            samples_downsampled: self.downsampled.get(),
            samples_delivered: self.delivered.get(),
            own_points_delivered: self.own_delivered.load(Relaxed),
            own_points_dropped: self.own_dropped.load(Relaxed),
            requests: self.requests.get(),
            request_bytes: self.request_bytes.get(),
            errors_unavailable: e(Failure::Unavailable),
            errors_timeout: e(Failure::Timeout),
            errors_throttled: e(Failure::Throttled),
            errors_rejected: e(Failure::Rejected),
            errors_bad_response: e(Failure::BadResponse),
            retries: self.retries.get(),
            requests_in_flight: started.saturating_sub(self.finished.load(Relaxed)),
            profile_endpoints: self.profile_endpoints.get(),
            config_db_errors: self.config_db_errors.get(),
        }
    }
}

/// Counter values of a batch that can be exported (a split snapshot's missing parts excluded).
fn valid_samples(b: &CounterBatch) -> u64 {
    (b.samples() - b.missing_samples()) as u64
}

/// The OTLP metrics sink. Decode threads call [`OtlpSink::submit`] (never blocks); a thread
/// (`stel-otlp`) encodes and routes, an I/O thread (`stel-otlp-io`, a current-thread tokio
/// runtime) sends and retries. See the module docs.
pub struct OtlpSink {
    tx: Option<Sender<Arc<CounterBatch>>>,
    /// The queue's receiving end, for evicting the oldest batch (`drop_oldest`).
    rx: Receiver<Arc<CounterBatch>>,
    when_full: WhenFull,
    c: Arc<Counters>,
    stopping: Arc<AtomicBool>,
    exporter: Option<JoinHandle<()>>,
    io: Option<(JoinHandle<()>, tokio::sync::oneshot::Sender<()>)>,
    #[cfg(feature = "redis")]
    profiles: Option<super::profiles::ProfileWatch>,
}

impl fmt::Debug for OtlpSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OtlpSink")
            .field("when_full", &self.when_full)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl OtlpSink {
    /// Validates `cfg`, starts the I/O thread, the exporter thread and (with `config_db`) the
    /// CONFIG_DB profile reader, whose first read is done before this returns. The collector is
    /// connected lazily: it being down is not an error. With a `registry`, the sink's counters
    /// are registered there (`stel_sink_*{sink="otlp"}`), and with `own_metrics_interval_ms` the
    /// registry itself is exported too.
    ///
    /// # Errors
    /// An invalid config (every problem listed), an unreadable TLS file, or no thread.
    pub fn start(cfg: OtlpConfig, registry: Option<Arc<Registry>>) -> Result<OtlpSink, Error> {
        cfg.validate()?;
        // reqwest and tonic use rustls with ring; a provider installed earlier is kept.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let c = Arc::new(Counters::new(registry.as_deref()));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(Error::Spawn)?;
        let handle = rt.handle().clone();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let io = std::thread::Builder::new()
            .name("stel-otlp-io".into())
            .spawn(move || {
                rt.block_on(async {
                    let _ = stop_rx.await;
                });
                // Dropping the runtime cancels what is still in flight; each request's guard
                // counts its points as dropped (shutdown).
                drop(rt);
            })
            .map_err(Error::Spawn)?;
        #[cfg(feature = "redis")]
        let profiles = match &cfg.config_db {
            Some(db) => Some(super::profiles::ProfileWatch::start(
                db.clone(),
                Arc::clone(&c),
            )?),
            None => None,
        };
        let stopping = Arc::new(AtomicBool::new(false));
        let mut ex = Exporter::new(cfg.clone(), Arc::clone(&c), handle, registry)?;
        ex.stopping = Arc::clone(&stopping);
        #[cfg(feature = "redis")]
        {
            ex.profiles = profiles.as_ref().map(|p| p.shared());
        }
        let (tx, rx) = crossbeam_channel::bounded(cfg.queue_batches);
        let erx = rx.clone();
        let exporter = std::thread::Builder::new()
            .name("stel-otlp".into())
            .spawn(move || ex.run(erx))
            .map_err(Error::Spawn)?;
        tracing::info!(
            endpoint = %crate::redact::redact(&cfg.endpoint),
            protocol = ?cfg.protocol,
            resolution_ms = cfg.resolution_ms,
            "OTLP sink started."
        );
        Ok(OtlpSink {
            tx: Some(tx),
            rx,
            when_full: cfg.when_full,
            c,
            stopping,
            exporter: Some(exporter),
            io: Some((io, stop_tx)),
            #[cfg(feature = "redis")]
            profiles,
        })
    }

    /// Queues a batch for export. Called on decode threads: never waits. When the queue is full
    /// the `when_full` policy decides which batch is dropped.
    ///
    /// # Errors
    /// The reason when (this or an evicted older) batch was dropped; it is already counted.
    pub fn submit(&self, batch: Arc<CounterBatch>) -> Result<(), DropReason> {
        let samples = valid_samples(&batch);
        self.c.received_batches.add(1);
        self.c.received_samples.add(samples);
        if batch.rows() == 0 {
            return Ok(());
        }
        let Some(tx) = self.tx.as_ref().filter(|_| !self.stopping.load(Relaxed)) else {
            self.c.drop_batch(DropReason::Shutdown, samples);
            return Err(DropReason::Shutdown);
        };
        let r = match tx.try_send(batch) {
            Ok(()) => Ok(()),
            Err(TrySendError::Disconnected(_)) => Err(DropReason::Shutdown),
            Err(TrySendError::Full(b)) => match self.when_full {
                WhenFull::DropNewest => Err(DropReason::QueueFull),
                WhenFull::DropOldest => {
                    let evicted = self.rx.try_recv().ok();
                    let r = match tx.try_send(b) {
                        Ok(()) => Ok(()),
                        // Another decoder took the room first.
                        Err(TrySendError::Full(_)) => Err(DropReason::QueueFull),
                        Err(TrySendError::Disconnected(_)) => Err(DropReason::Shutdown),
                    };
                    if let Some(old) = evicted {
                        self.c
                            .drop_batch(DropReason::QueueEvicted, valid_samples(&old));
                        release(old);
                    }
                    r
                }
            },
        };
        match r {
            Ok(()) => {
                self.c.queued.add(1);
                Ok(())
            }
            Err(reason) => {
                self.c.drop_batch(reason, samples);
                Err(reason)
            }
        }
    }

    /// Counters now.
    pub fn stats(&self) -> OtlpStats {
        self.c.snapshot()
    }

    /// Stops taking batches, exports what is queued (for at most `shutdown_timeout_ms`), counts
    /// what could not be sent (reason `shutdown`) and stops the threads. The returned counters
    /// are final and satisfy the accounting identity of [`OtlpStats`].
    pub fn shutdown(mut self) -> OtlpStats {
        self.stop();
        self.stats()
    }

    fn stop(&mut self) {
        self.stopping.store(true, Relaxed);
        self.tx = None;
        if let Some(h) = self.exporter.take() {
            if h.join().is_err() {
                tracing::error!("The OTLP exporter thread panicked.");
            }
        }
        if let Some((h, stop)) = self.io.take() {
            let _ = stop.send(());
            let _ = h.join();
        }
        // Whatever an exporter panic left queued.
        while let Ok(b) = self.rx.try_recv() {
            self.c.drop_batch(DropReason::Shutdown, valid_samples(&b));
        }
        #[cfg(feature = "redis")]
        if let Some(p) = self.profiles.take() {
            p.stop();
        }
    }
}

impl Drop for OtlpSink {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A request buffer on its way back to the exporter once the transport is done with it.
struct Pooled {
    buf: Vec<u8>,
    back: Sender<Vec<u8>>,
}

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        let _ = self.back.try_send(std::mem::take(&mut self.buf));
    }
}

/// Tells delivery tasks in backoff to give up (the shutdown deadline passed).
#[derive(Debug, Default)]
struct GiveUp {
    flag: AtomicBool,
    notify: tokio::sync::Notify,
}

/// One endpoint: its client, request slots, health and the request being filled.
struct Dest {
    endpoint: String,
    ca: Option<PathBuf>,
    client: Client,
    /// One token per request slot (`max_in_flight`).
    slots: (Sender<()>, Receiver<()>),
    /// The last attempt failed (retryable): new data is dropped unless a slot is free.
    down: Arc<AtomicBool>,
    req: Option<RequestBuf>,
    since: Option<Instant>,
}

/// A session's plan and where its batches go.
struct Route {
    plan: Plan,
    /// Destination index, `None` = no endpoint.
    dest: Option<usize>,
    /// Profile-map generation the route was resolved with.
    gen: u64,
}

struct Exporter {
    cfg: OtlpConfig,
    c: Arc<Counters>,
    env: Envelope,
    rt: tokio::runtime::Handle,
    routes: Vec<Route>,
    dests: Vec<Dest>,
    pool: (Sender<Vec<u8>>, Receiver<Vec<u8>>),
    rows: Vec<u32>,
    registry: Option<Arc<Registry>>,
    own_next: Option<Instant>,
    start_ns: u64,
    give_up: Arc<GiveUp>,
    log: Arc<Mutex<LogLimiter>>,
    /// Set by `OtlpSink::shutdown`; `stop_at` is its deadline once seen.
    stopping: Arc<AtomicBool>,
    stop_at: Option<Instant>,
    #[cfg(feature = "redis")]
    profiles: Option<Arc<super::profiles::Shared>>,
    profiles_gen: u64,
    profile_map: Arc<HashMap<String, super::ProfileEndpoint>>,
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".to_string())
}

impl Exporter {
    fn new(
        cfg: OtlpConfig,
        c: Arc<Counters>,
        rt: tokio::runtime::Handle,
        registry: Option<Arc<Registry>>,
    ) -> Result<Self, Error> {
        let env = Envelope::new(&cfg.switch_name.clone().unwrap_or_else(host_name));
        let own_next = (cfg.own_metrics_interval_ms > 0 && registry.is_some())
            .then(|| Instant::now() + Duration::from_millis(cfg.own_metrics_interval_ms));
        let pool = crossbeam_channel::bounded(cfg.max_in_flight * 2 + 2);
        let mut me = Self {
            cfg,
            c,
            env,
            rt,
            routes: Vec::new(),
            dests: Vec::new(),
            pool,
            rows: Vec::new(),
            registry,
            own_next,
            start_ns: now_ns(),
            give_up: Arc::new(GiveUp::default()),
            log: Arc::new(Mutex::new(LogLimiter::new(Duration::from_secs(10)))),
            stopping: Arc::new(AtomicBool::new(false)),
            stop_at: None,
            #[cfg(feature = "redis")]
            profiles: None,
            profiles_gen: 0,
            profile_map: Arc::new(HashMap::new()),
        };
        if !me.cfg.endpoint.is_empty() {
            let ep = me.cfg.endpoint.clone();
            me.dest_for(&ep, None).map_err(Error::Config)?;
        }
        Ok(me)
    }

    /// The destination for (endpoint, CA file), created on first use. Index 0 is the default
    /// endpoint when there is one.
    fn dest_for(&mut self, endpoint: &str, ca: Option<PathBuf>) -> Result<usize, String> {
        if let Some(i) = self
            .dests
            .iter()
            .position(|d| d.endpoint == endpoint && d.ca == ca)
        {
            return Ok(i);
        }
        let client = {
            let _g = self.rt.enter();
            Client::new(endpoint, &self.cfg, ca.as_deref())?
        };
        let slots = crossbeam_channel::bounded(self.cfg.max_in_flight);
        for _ in 0..self.cfg.max_in_flight {
            let _ = slots.0.send(());
        }
        self.dests.push(Dest {
            endpoint: endpoint.to_string(),
            ca,
            client,
            slots,
            down: Arc::new(AtomicBool::new(false)),
            req: None,
            since: None,
        });
        Ok(self.dests.len() - 1)
    }

    fn default_dest(&self) -> Option<usize> {
        (!self.cfg.endpoint.is_empty()).then_some(0)
    }

    /// Picks up a new profile → endpoint map (CONFIG_DB).
    fn refresh_profiles(&mut self) {
        #[cfg(feature = "redis")]
        if let Some(p) = &self.profiles {
            let (gen, map) = p.current();
            if gen != self.profiles_gen {
                self.profiles_gen = gen;
                self.profile_map = map;
            }
        }
    }

    fn resolve_dest(&mut self, profile: &str) -> Option<usize> {
        let Some(pe) = self.profile_map.get(profile).cloned() else {
            return self.default_dest();
        };
        match self.dest_for(&pe.endpoint, pe.certs.clone()) {
            Ok(d) => Some(d),
            Err(e) => {
                tracing::error!(profile, endpoint = %crate::redact::redact(&pe.endpoint), error = %e, "The profile's otel_endpoint is unusable; its counters are dropped (no_endpoint).");
                None
            }
        }
    }

    /// The route of `schema`'s session (plan built on first use, rebuilt for a new generation).
    fn route_for(&mut self, schema: &Arc<SessionSchema>) -> usize {
        let i = match self
            .routes
            .iter()
            .position(|r| Arc::ptr_eq(&r.plan.schema, schema))
        {
            Some(i) => i,
            None => {
                let prev = self.routes.iter().position(|r| r.plan.same_session(schema));
                let plan = Plan::new(
                    Arc::clone(schema),
                    self.cfg.metric_names,
                    prev.map(|p| &self.routes[p].plan),
                );
                let route = Route {
                    plan,
                    dest: None,
                    gen: u64::MAX,
                };
                match prev {
                    Some(p) => {
                        self.routes[p] = route;
                        p
                    }
                    None => {
                        self.routes.push(route);
                        self.routes.len() - 1
                    }
                }
            }
        };
        if self.routes[i].gen != self.profiles_gen {
            let profile = self.routes[i].plan.schema.profile.clone();
            self.routes[i].dest = self.resolve_dest(&profile);
            self.routes[i].gen = self.profiles_gen;
        }
        i
    }

    fn run(mut self, rx: Receiver<Arc<CounterBatch>>) {
        let interval = Duration::from_millis(self.cfg.interval_ms);
        loop {
            let now = Instant::now();
            let mut wake = now + interval;
            for d in &self.dests {
                if let Some(s) = d.since {
                    wake = wake.min(s + interval);
                }
            }
            if let Some(t) = self.own_next {
                wake = wake.min(t);
            }
            match rx.recv_timeout(wake.saturating_duration_since(now)) {
                Ok(b) => {
                    self.c.dequeued.add(1);
                    self.export(&b);
                    release(b);
                    // Keep draining while batches wait; timers are checked between batches.
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
            if self.stop_at.is_none() && self.stopping.load(Relaxed) {
                self.stop_at =
                    Some(Instant::now() + Duration::from_millis(self.cfg.shutdown_timeout_ms));
            }
            self.tick(interval);
        }
        self.finish();
    }

    /// Sends requests older than the interval, and the daemon's own metrics when due.
    fn tick(&mut self, interval: Duration) {
        let now = Instant::now();
        if let Some(t) = self.own_next.filter(|t| *t <= now) {
            self.own_next = Some(t + Duration::from_millis(self.cfg.own_metrics_interval_ms));
            self.export_own();
        }
        for d in 0..self.dests.len() {
            if self.dests[d].since.is_some_and(|s| now >= s + interval) {
                self.send(d);
            }
        }
    }

    fn export_own(&mut self) {
        let (Some(reg), Some(d)) = (self.registry.clone(), self.default_dest()) else {
            return;
        };
        let snap = reg.snapshot();
        let start_ns = self.start_ns;
        let req = self.request(d);
        encode::write_snapshot(&snap, start_ns, now_ns(), req);
        self.send(d);
    }

    fn request(&mut self, d: usize) -> &mut RequestBuf {
        let (pool, env) = (&self.pool.1, &self.env);
        let dest = &mut self.dests[d];
        if dest.since.is_none() {
            dest.since = Some(Instant::now());
        }
        dest.req
            .get_or_insert_with(|| RequestBuf::new(pool.try_recv().unwrap_or_default(), env))
    }

    fn export(&mut self, b: &Arc<CounterBatch>) {
        self.refresh_profiles();
        let samples = valid_samples(b);
        if self.stop_at.is_some_and(|t| Instant::now() >= t) {
            self.c.drop_samples(DropReason::Shutdown, samples, 0);
            return;
        }
        let r = self.route_for(&b.schema);
        let Some(d) = self.routes[r].dest else {
            self.c.drop_samples(DropReason::NoEndpoint, samples, 0);
            return;
        };
        // An unreachable collector costs nothing upstream: while its endpoint is failing and
        // every slot is retrying, new data is dropped here, before any encoding.
        if self.dests[d].down.load(Relaxed) && self.dests[d].slots.1.is_empty() {
            self.c.drop_samples(DropReason::Unavailable, samples, 0);
            return;
        }
        let res_ns = (self.cfg.resolution_ms as i64).saturating_mul(1_000_000);
        let mut rows = std::mem::take(&mut self.rows);
        self.routes[r].plan.select_rows(b, res_ns, &mut rows);
        let width = b.schema.width().max(1);
        let valid = |rows: &[u32]| -> u64 {
            if b.part_masks.is_empty() {
                (rows.len() * width) as u64
            } else {
                rows.iter()
                    .map(|&i| (width - b.missing_samples_in(i as usize, i as usize + 1)) as u64)
                    .sum()
            }
        };
        self.c.downsampled.add(samples - valid(&rows));
        let max = self.cfg.max_points_per_request;
        let mut i = 0;
        while i < rows.len() {
            let have = self.dests[d].req.as_ref().map_or(0, |q| q.points);
            let n = (max.saturating_sub(have) / width).clamp(1, rows.len() - i);
            // Split borrows: the plan lives in `routes`, the request in `dests`.
            let (pool, env) = (&self.pool.1, &self.env);
            let dest = &mut self.dests[d];
            if dest.since.is_none() {
                dest.since = Some(Instant::now());
            }
            let req = dest
                .req
                .get_or_insert_with(|| RequestBuf::new(pool.try_recv().unwrap_or_default(), env));
            self.routes[r].plan.write_rows(b, &rows[i..i + n], req);
            i += n;
            if req.points >= max {
                self.send(d);
                // The endpoint failed meanwhile: the rest of the batch is not encoded either.
                if i < rows.len()
                    && self.dests[d].down.load(Relaxed)
                    && self.dests[d].slots.1.is_empty()
                {
                    self.c
                        .drop_samples(DropReason::Unavailable, valid(&rows[i..]), 0);
                    break;
                }
            }
        }
        self.rows = rows;
    }

    /// Hands `d`'s request to the I/O thread. Waits for a free request slot (the collector is
    /// slower than we are: the queue fills and sheds by policy meanwhile) unless the endpoint
    /// is failing, in which case the request is dropped (`unavailable`). The shutdown deadline
    /// bounds the wait.
    fn send(&mut self, d: usize) {
        let dest = &mut self.dests[d];
        dest.since = None;
        let Some(req) = dest.req.take() else {
            return;
        };
        if req.is_empty() {
            let _ = self.pool.0.try_send(req.finish(&self.env).0);
            return;
        }
        let (points, own) = (req.points as u64, req.own_points as u64);
        loop {
            match dest.slots.1.recv_timeout(Duration::from_millis(20)) {
                Ok(()) => break,
                Err(RecvTimeoutError::Timeout) => {
                    if self.stop_at.is_none() && self.stopping.load(Relaxed) {
                        self.stop_at = Some(
                            Instant::now() + Duration::from_millis(self.cfg.shutdown_timeout_ms),
                        );
                    }
                    let past = self.stop_at.is_some_and(|t| Instant::now() >= t);
                    if dest.down.load(Relaxed) || past {
                        let r = if past {
                            DropReason::Shutdown
                        } else {
                            DropReason::Unavailable
                        };
                        self.c.drop_samples(r, points, own);
                        let _ = self.pool.0.try_send(req.finish(&self.env).0);
                        return;
                    }
                }
                Err(RecvTimeoutError::Disconnected) => return,
            }
        }
        let grpc = self.cfg.protocol == super::config::Protocol::Grpc;
        let (buf, start) = req.finish_framed(&self.env, grpc);
        let body = Bytes::from_owner(Pooled {
            buf,
            back: self.pool.0.clone(),
        })
        .slice(start..);
        let job = Delivery {
            client: dest.client.clone(),
            body,
            frame: if grpc {
                super::transport::GRPC_PREFIX
            } else {
                0
            },
            guard: Pending {
                points,
                own,
                c: Arc::clone(&self.c),
                slot: Some(dest.slots.0.clone()),
                settled: false,
            },
            down: Arc::clone(&dest.down),
            give_up: Arc::clone(&self.give_up),
            log: Arc::clone(&self.log),
            endpoint: dest.endpoint.clone(),
            retry_initial: Duration::from_millis(self.cfg.retry_initial_ms),
            retry_max: Duration::from_millis(self.cfg.retry_max_ms),
            max_elapsed: Duration::from_millis(self.cfg.retry_max_elapsed_ms),
        };
        self.c.started.fetch_add(1, Relaxed);
        self.rt.spawn(job.run());
    }

    /// Shutdown: the queue is drained (its sender is gone); send what is buffered, wait for
    /// the requests in flight up to the deadline, then make the rest give up.
    fn finish(&mut self) {
        let deadline = *self.stop_at.get_or_insert_with(|| {
            Instant::now() + Duration::from_millis(self.cfg.shutdown_timeout_ms)
        });
        if self.own_next.is_some() {
            self.export_own();
        }
        for d in 0..self.dests.len() {
            self.send(d);
        }
        let all_back = |me: &Self| {
            me.dests
                .iter()
                .all(|d| d.slots.1.len() == me.cfg.max_in_flight)
        };
        while !all_back(self) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        if !all_back(self) {
            self.give_up.flag.store(true, Relaxed);
            self.give_up.notify.notify_waiters();
            // Attempts in progress end within their timeout; cancelled with the runtime
            // otherwise (their guards count the points).
            let t = Instant::now() + Duration::from_millis(self.cfg.timeout_ms.min(2_000));
            while !all_back(self) && Instant::now() < t {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }
}

/// The points of a request until it is settled; counted as dropped (shutdown) if it never is
/// (its task was cancelled). Returns the request slot.
struct Pending {
    points: u64,
    own: u64,
    c: Arc<Counters>,
    slot: Option<Sender<()>>,
    settled: bool,
}

impl Pending {
    fn delivered(&mut self, rejected: u64, bytes: usize) {
        let rejected = rejected.min(self.points + self.own);
        // Rejections are charged to the counter values first (the own metrics are few).
        let rej_samples = rejected.min(self.points);
        self.c.delivered.add(self.points - rej_samples);
        self.c
            .own_delivered
            .fetch_add(self.own - (rejected - rej_samples), Relaxed);
        self.c.drop_samples(
            DropReason::PartiallyRejected,
            rej_samples,
            rejected - rej_samples,
        );
        self.c.requests.add(1);
        self.c.request_bytes.add(bytes as u64);
        self.settled = true;
    }

    fn dropped(&mut self, r: DropReason) {
        self.c.drop_samples(r, self.points, self.own);
        self.settled = true;
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if !self.settled {
            self.c
                .drop_samples(DropReason::Shutdown, self.points, self.own);
        }
        self.c.finished.fetch_add(1, Relaxed);
        if let Some(s) = self.slot.take() {
            let _ = s.try_send(());
        }
    }
}

/// One request's delivery: attempts with exponential backoff until acknowledged, refused for
/// good, out of time, or told to give up.
struct Delivery {
    client: Client,
    body: Bytes,
    /// Bytes of transport framing in `body` (gRPC's prefix).
    frame: usize,
    guard: Pending,
    down: Arc<AtomicBool>,
    give_up: Arc<GiveUp>,
    log: Arc<Mutex<LogLimiter>>,
    endpoint: String,
    retry_initial: Duration,
    retry_max: Duration,
    max_elapsed: Duration,
}

impl Delivery {
    fn warn(&self, what: &str, detail: &str) {
        let allow = self.log.lock().map(|mut l| l.allow()).unwrap_or(None);
        if let Some(suppressed) = allow {
            tracing::warn!(endpoint = %crate::redact::redact(&self.endpoint), error = %crate::redact::redact(detail), suppressed, "{what}");
        }
    }

    async fn run(mut self) {
        let first = Instant::now();
        let mut delay = self.retry_initial;
        let mut seed = now_ns() | 1;
        loop {
            match self.client.export(self.body.clone()).await {
                Ok(resp) => {
                    self.down.store(false, Relaxed);
                    let (rejected, msg) = match encode::parse_response(&resp) {
                        Some(r) => r,
                        None => {
                            self.guard.c.error(Failure::BadResponse);
                            (0, String::new())
                        }
                    };
                    if rejected > 0 {
                        self.warn(
                            "The collector rejected part of a request (partial success).",
                            &msg,
                        );
                    }
                    self.guard.delivered(rejected, self.body.len() - self.frame);
                    return;
                }
                Err(e) => {
                    self.guard.c.error(e.failure);
                    if !e.failure.retryable() {
                        self.warn(
                            "The collector refused a request; its points are dropped (rejected).",
                            &e.detail,
                        );
                        self.guard.dropped(DropReason::Rejected);
                        return;
                    }
                    self.down.store(true, Relaxed);
                    if self.give_up.flag.load(Relaxed) {
                        self.guard.dropped(DropReason::Shutdown);
                        return;
                    }
                    if first.elapsed() + delay > self.max_elapsed {
                        self.warn(
                            "Export kept failing; the request's points are dropped (retries_exhausted).",
                            &e.detail,
                        );
                        self.guard.dropped(DropReason::RetriesExhausted);
                        return;
                    }
                    self.warn("Export failed; retrying with backoff.", &e.detail);
                    // ±25 % jitter so several requests do not retry in lockstep.
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    let jitter = 0.75 + (seed % 1000) as f64 / 2000.0;
                    let wait = delay.mul_f64(jitter);
                    tokio::select! {
                        () = tokio::time::sleep(wait) => {}
                        () = self.give_up.notify.notified() => {}
                    }
                    delay = (delay * 2).min(self.retry_max);
                    self.guard.c.retries.add(1);
                }
            }
        }
    }
}
