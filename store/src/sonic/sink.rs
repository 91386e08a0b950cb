use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use super::{name_map_for, name_map_key, CountersDbConfig, Error, NAME_MAPS};
use crate::log_limit::LogLimiter;

/// How often a repeated COUNTERS_DB error is logged.
const LOG_EVERY: Duration = Duration::from_secs(10);

use crate::{
    batch::CounterBatch,
    labels,
    metrics::{Counter, Gauge, Histogram, Metric, Registry, Snapshot},
    rate::{
        parse_alpha, port_speed_mbps, rates_key, IntervalPicker, Outcome, RateKind, RateSample,
        RateState, DEFAULT_ALPHA, INIT_DONE_FIELD,
    },
    schema::SessionSchema,
};
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TrySendError};

/// Why [`CountersDbSink::submit`] did not take a batch. Every shed batch is counted by reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Shed {
    /// The queue is full (the writer is behind): the batch is dropped (drop newest). Only latest
    /// values are written, so the next accepted batch supersedes it.
    #[error("counters-db queue full")]
    QueueFull,
    /// The sink is shutting down.
    #[error("counters-db sink is shutting down")]
    ShuttingDown,
}

/// The writer's counters: registry handles (the daemon's registry, or one of the sink's own),
/// updated per batch / per write round. `stats()` is their snapshot: the `stel_counters_db_*`
/// series and the `stel_sink_*{sink="counters_db"}` ones.
#[derive(Debug)]
struct Shared {
    stopping: AtomicBool,
    registry: Arc<Registry>,
    /// Batches offered (`submit`), accepted (queued), taken by the writer (dequeued).
    received: Counter,
    queued: Counter,
    dequeued: Counter,
    shed_full: Counter,
    shed_shutdown: Counter,
    rounds: Counter,
    fields: Counter,
    rates: Counter,
    rate_resets: Counter,
    no_oid: Gauge,
    deferred: Counter,
    resolved: Gauge,
    oid_changes: Counter,
    errors: Counter,
    connects: Counter,
    connected: Gauge,
    lag: Histogram,
    /// The server's URL, credentials masked, for [`CountersDbHandle::down`].
    url: String,
    /// The last connect or write error while not connected (`None` once connected): what the
    /// status line says of a Redis that is down. Not a counter: text.
    down: Mutex<Option<String>>,
}

impl Shared {
    fn new(parent: Option<&Arc<Registry>>, url: &str) -> Self {
        let r = Registry::child_of(parent);
        let sink = labels!(Sink = "counters_db");
        let c = |m: Metric| r.counter(m, labels!());
        let g = |m: Metric| r.gauge(m, labels!());
        Self {
            stopping: AtomicBool::new(false),
            received: r.counter(Metric::SinkReceivedBatches, sink),
            queued: r.counter(Metric::SinkQueuedBatches, sink),
            dequeued: r.counter(Metric::SinkDequeuedBatches, sink),
            shed_full: r.counter(
                Metric::SinkDroppedBatches,
                labels!(Sink = "counters_db", Reason = "queue_full"),
            ),
            shed_shutdown: r.counter(
                Metric::SinkDroppedBatches,
                labels!(Sink = "counters_db", Reason = "shutdown"),
            ),
            rounds: c(Metric::CountersDbWriteRounds),
            fields: c(Metric::CountersDbWrittenFields),
            rates: c(Metric::CountersDbWrittenRates),
            rate_resets: c(Metric::CountersDbRateResets),
            no_oid: g(Metric::CountersDbObjectsWithoutOid),
            deferred: c(Metric::CountersDbDeferredWrites),
            resolved: g(Metric::CountersDbResolvedOids),
            oid_changes: c(Metric::CountersDbOidChanges),
            errors: c(Metric::CountersDbErrors),
            connects: c(Metric::CountersDbConnects),
            connected: g(Metric::CountersDbConnected),
            lag: r.histogram(Metric::CountersDbLag, labels!()),
            registry: r,
            url: crate::redact::redact(url).into_owned(),
            down: Mutex::new(None),
        }
    }
}

type Msg = (Arc<CounterBatch>, Instant);

/// A cloneable, non-blocking submit handle for decode threads.
#[derive(Debug, Clone)]
pub struct CountersDbHandle {
    tx: Sender<Msg>,
    shared: Arc<Shared>,
}

impl CountersDbHandle {
    /// Queues a batch for COUNTERS_DB/RATES. Never blocks.
    ///
    /// # Errors
    /// [`Shed`] when the batch was dropped (counted by reason).
    pub fn submit(&self, batch: Arc<CounterBatch>) -> Result<(), Shed> {
        self.shared.received.add(1);
        if self.shared.stopping.load(Ordering::Relaxed) {
            self.shared.shed_shutdown.add(1);
            return Err(Shed::ShuttingDown);
        }
        match self.tx.try_send((batch, Instant::now())) {
            Ok(()) => {
                self.shared.queued.add(1);
                Ok(())
            }
            Err(TrySendError::Full(_)) => {
                self.shared.shed_full.add(1);
                Err(Shed::QueueFull)
            }
            Err(TrySendError::Disconnected(_)) => {
                self.shared.shed_shutdown.add(1);
                Err(Shed::ShuttingDown)
            }
        }
    }

    /// The sink's counters now (`stel_counters_db_*`, `stel_sink_*{sink="counters_db"}`).
    pub fn stats(&self) -> Snapshot {
        self.shared.registry.snapshot()
    }

    /// Batch arrival → values acknowledged by Redis.
    pub fn lag(&self) -> &Histogram {
        &self.shared.lag
    }

    /// `Some("<url>: <error>")` while the writer is not connected after a failed connect or
    /// write (it retries with back-off), `None` once connected or before the first attempt
    /// ended. The URL's credentials and any in the error are masked ([`crate::redact`]).
    pub fn down(&self) -> Option<String> {
        let e = self.shared.down.lock().ok()?.clone()?;
        Some(crate::redact::redact(&format!("{}: {e}", self.shared.url)).into_owned())
    }
}

/// The COUNTERS_DB + RATES writer: its own thread, its own bounded queue. See the module docs.
#[derive(Debug)]
pub struct CountersDbSink {
    handle: CountersDbHandle,
    thread: Option<JoinHandle<()>>,
}

impl CountersDbSink {
    /// Validates `cfg` and starts the writer thread. Does not wait for Redis: an unreachable
    /// server is retried in the background (counted in `redis_errors`, `connected` = false).
    ///
    /// # Errors
    /// A bad config or URL, or the thread could not be spawned.
    /// With a `registry`, the counters are registered in it (a child; see
    /// [`crate::metrics::Registry::child`]).
    pub fn start(
        cfg: CountersDbConfig,
        registry: Option<&Arc<Registry>>,
    ) -> Result<CountersDbSink, Error> {
        let client = cfg.validate()?;
        let (tx, rx) = crossbeam_channel::bounded(cfg.queue_batches);
        let shared = Arc::new(Shared::new(registry, &cfg.url));
        let writer = Writer::new(cfg, client, rx, Arc::clone(&shared));
        let thread = std::thread::Builder::new()
            .name("stel-countersdb".into())
            .spawn(move || writer.run())?;
        Ok(CountersDbSink {
            handle: CountersDbHandle { tx, shared },
            thread: Some(thread),
        })
    }

    /// See [`CountersDbHandle::submit`].
    ///
    /// # Errors
    /// [`Shed`] when the batch was dropped.
    pub fn submit(&self, batch: Arc<CounterBatch>) -> Result<(), Shed> {
        self.handle.submit(batch)
    }

    /// A handle for another thread.
    pub fn handle(&self) -> CountersDbHandle {
        self.handle.clone()
    }

    /// The sink's counters now (`stel_counters_db_*`, `stel_sink_*{sink="counters_db"}`).
    pub fn stats(&self) -> Snapshot {
        self.handle.stats()
    }

    /// Batch arrival → values acknowledged by Redis.
    pub fn lag(&self) -> &Histogram {
        self.handle.lag()
    }

    /// See [`CountersDbHandle::down`].
    pub fn down(&self) -> Option<String> {
        self.handle.down()
    }

    /// Forgets lag samples so far (e.g. after a benchmark's warm-up).
    pub fn reset_lag(&self) {
        self.handle.shared.lag.reset();
    }

    /// Stops accepting batches, writes what is queued (one attempt if Redis is reachable) and
    /// joins the writer.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        self.handle.shared.stopping.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            if t.join().is_err() {
                tracing::error!("The counters-db writer thread panicked.");
            }
        }
    }
}

impl Drop for CountersDbSink {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One object of a session: its columns, its name-map entry and, once resolved, its OID.
#[derive(Debug)]
struct ObjPlan {
    /// HFT object name (`Ethernet0|3`).
    name: String,
    map: Option<&'static str>,
    /// Name-map key (`Ethernet0:3`).
    lookup: String,
    /// (column, full SAI stat name).
    cols: Vec<(usize, String)>,
    oid: Option<String>,
    counters_key: String,
}

#[derive(Debug)]
struct RateObj {
    obj: usize,
    kind: RateKind,
    cols: [Option<usize>; crate::rate::input::COUNT],
    state: RateState,
    dirty: bool,
}

#[derive(Debug)]
struct SessionState {
    schema: Arc<SessionSchema>,
    objs: Vec<ObjPlan>,
    latest: Vec<u64>,
    have: Vec<bool>,
    /// Value last acknowledged by Redis, per column (`None`: must be written).
    written: Vec<Option<u64>>,
    dirty: bool,
    arrivals: Vec<Instant>,
    rates: Vec<RateObj>,
    picker: IntervalPicker,
}

impl SessionState {
    fn new(schema: Arc<SessionSchema>, rate_interval_ns: i64, with_rates: bool) -> Self {
        let mut objs: Vec<ObjPlan> = Vec::new();
        let mut index: HashMap<(&str, u32), usize> = HashMap::new();
        for (c, col) in schema.columns.iter().enumerate() {
            let k = (col.object.as_str(), col.key.object_type);
            let i = *index.entry(k).or_insert_with(|| {
                objs.push(ObjPlan {
                    name: col.object.clone(),
                    map: name_map_for(col.key.object_type),
                    lookup: name_map_key(&col.object),
                    cols: Vec::new(),
                    oid: None,
                    counters_key: String::new(),
                });
                objs.len() - 1
            });
            objs[i].cols.push((c, col.key.full_name()));
        }
        let mut rates = Vec::new();
        for (i, o) in objs.iter().enumerate().filter(|_| with_rates) {
            let Some(t) = schema.columns.get(o.cols[0].0).map(|c| c.key.object_type) else {
                continue;
            };
            let Some(kind) = RateKind::from_object_type(t) else {
                continue;
            };
            let mut cols = [None; crate::rate::input::COUNT];
            for (c, full) in &o.cols {
                if let Some(k) = kind.input_index(full) {
                    cols[k] = Some(*c);
                }
            }
            if cols.iter().any(Option::is_some) {
                rates.push(RateObj {
                    obj: i,
                    kind,
                    cols,
                    state: RateState::new(kind),
                    dirty: false,
                });
            }
        }
        let w = schema.width();
        Self {
            schema,
            objs,
            latest: vec![0; w],
            have: vec![false; w],
            written: vec![None; w],
            dirty: false,
            arrivals: Vec::new(),
            rates,
            picker: IntervalPicker::new(rate_interval_ns),
        }
    }

    /// Whether a write round has something to write.
    fn pending(&self) -> bool {
        self.dirty
            || self
                .rates
                .iter()
                .any(|r| r.dirty && self.objs[r.obj].oid.is_some())
    }

    /// Takes the batch's latest values and its rate samples.
    fn ingest(&mut self, b: &CounterBatch, alpha: [f64; 2], resets: &Counter) {
        let rows = b.rows();
        if rows == 0 {
            return;
        }
        let w = self.schema.width();
        if b.part_masks.is_empty() {
            self.latest.copy_from_slice(b.row(rows - 1));
            self.have.fill(true);
        } else {
            // Split snapshots: the latest valid value of each column.
            for r in 0..rows {
                for c in 0..w {
                    if b.is_valid(r, c) {
                        self.latest[c] = b.values[r * w + c];
                        self.have[c] = true;
                    }
                }
            }
        }
        self.dirty = true;
        if self.rates.is_empty() {
            return;
        }
        for r in 0..rows {
            let ts = b.ts[r];
            if !self.picker.due(ts) {
                continue;
            }
            let row = b.row(r);
            for ro in &mut self.rates {
                let mut s = RateSample {
                    ts_ns: ts,
                    ..Default::default()
                };
                for (k, c) in ro.cols.iter().enumerate() {
                    if let Some(c) = *c {
                        if b.is_valid(r, c) {
                            s.inputs[k] = Some(row[c]);
                        }
                    }
                }
                let a = match ro.kind {
                    RateKind::Port => alpha[0],
                    RateKind::Rif => alpha[1],
                };
                let out = ro.state.update(&s, a);
                if out == Outcome::Reset {
                    resets.add(1);
                }
                ro.dirty |= out.changed();
            }
        }
    }
}

type SessionId = (String, String, u32);

/// Arrival times kept per session between two acknowledged rounds.
const MAX_ARRIVALS: usize = 4096;

struct Writer {
    cfg: CountersDbConfig,
    client: redis::Client,
    rx: Receiver<Msg>,
    shared: Arc<Shared>,
    conn: Option<redis::Connection>,
    retry_at: Instant,
    backoff: Duration,
    err_log: LogLimiter,
    sessions: HashMap<SessionId, SessionState>,
    /// map name → (object name → OID)
    maps: HashMap<&'static str, HashMap<String, String>>,
    alpha: [f64; 2],
    speeds: HashMap<String, f64>,
    last_flush: Instant,
    next_refresh: Instant,
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer")
            .field("sessions", &self.sessions.len())
            .finish_non_exhaustive()
    }
}

impl Writer {
    fn new(
        cfg: CountersDbConfig,
        client: redis::Client,
        rx: Receiver<Msg>,
        shared: Arc<Shared>,
    ) -> Self {
        let now = Instant::now();
        Self {
            backoff: Duration::from_millis(cfg.reconnect_min_ms),
            cfg,
            client,
            rx,
            shared,
            conn: None,
            retry_at: now,
            err_log: LogLimiter::new(LOG_EVERY),
            sessions: HashMap::new(),
            maps: HashMap::new(),
            alpha: [DEFAULT_ALPHA; 2],
            speeds: HashMap::new(),
            last_flush: now,
            next_refresh: now,
        }
    }

    fn run(mut self) {
        let flush_every = Duration::from_micros(self.cfg.flush_interval_us);
        let refresh_every = Duration::from_millis(self.cfg.map_refresh_ms);
        tracing::info!(url = %crate::redact::redact(&self.cfg.url), "Counters-db writer started.");
        loop {
            let stopping = self.shared.stopping.load(Ordering::Relaxed);
            let now = Instant::now();
            if self.conn.is_none() && now >= self.retry_at {
                self.connect();
            }
            if self.conn.is_some() && Instant::now() >= self.next_refresh {
                self.refresh();
                self.next_refresh = Instant::now() + refresh_every;
            }
            let dirty = self.sessions.values().any(SessionState::pending);
            if dirty && self.conn.is_some() && Instant::now() >= self.last_flush + flush_every {
                self.flush();
            }
            if stopping {
                // Drain what was accepted, write it once, leave.
                while let Ok(m) = self.rx.try_recv() {
                    self.take(m);
                }
                if self.conn.is_none() {
                    self.connect();
                }
                if self.conn.is_some() {
                    self.flush();
                }
                break;
            }
            // Sleep until the next thing to do (bounded, so `stopping` is seen promptly).
            let mut wake = Instant::now() + Duration::from_millis(20);
            if self.conn.is_none() {
                wake = wake.min(self.retry_at);
            } else {
                wake = wake.min(self.next_refresh);
                if dirty {
                    wake = wake.min(self.last_flush + flush_every);
                }
            }
            let timeout = wake.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(timeout) {
                Ok(m) => {
                    self.take(m);
                    // Coalesce whatever else is already queued.
                    for _ in 0..4096 {
                        match self.rx.try_recv() {
                            Ok(m) => self.take(m),
                            Err(_) => break,
                        }
                    }
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    self.shared.stopping.store(true, Ordering::Relaxed);
                }
            }
        }
        self.shared.connected.set(0);
        tracing::info!("Counters-db writer stopped.");
    }

    fn take(&mut self, (batch, arrived): Msg) {
        self.shared.dequeued.add(1);
        let s = &batch.schema;
        let id = (s.profile.clone(), s.group.clone(), s.domain);
        let interval =
            i64::try_from(self.cfg.rate_interval_ms.saturating_mul(1_000_000)).unwrap_or(i64::MAX);
        let rebuild = match self.sessions.get(&id) {
            Some(st) => !Arc::ptr_eq(&st.schema, s) && *st.schema != **s,
            None => true,
        };
        if rebuild {
            let mut st = SessionState::new(Arc::clone(s), interval, self.cfg.write_rates);
            self.resolve(&mut st);
            self.sessions.insert(id.clone(), st);
            self.count_unresolved();
            // Read the new session's port speeds (and retry its missing OIDs) before writing.
            self.next_refresh = Instant::now();
        } else if let Some(st) = self.sessions.get_mut(&id) {
            if !Arc::ptr_eq(&st.schema, s) {
                st.schema = Arc::clone(s); // equal content: keep state, hold the live Arc
            }
        }
        let alpha = self.alpha;
        if let Some(st) = self.sessions.get_mut(&id) {
            st.ingest(&batch, alpha, &self.shared.rate_resets);
            // Bounded while Redis is down; the oldest arrivals (the largest lags) are kept.
            if st.arrivals.len() < MAX_ARRIVALS {
                st.arrivals.push(arrived);
            }
        }
        crate::batch::release(batch);
    }

    /// Looks every object up in the current name maps; an object whose OID appears or changes
    /// gets all its values (and rates) written again. Returns how many OIDs changed.
    fn resolve(&self, st: &mut SessionState) -> u64 {
        let mut changed = 0;
        for i in 0..st.objs.len() {
            let o = &mut st.objs[i];
            let oid = o
                .map
                .and_then(|m| self.maps.get(m))
                .and_then(|m| m.get(&o.lookup))
                .cloned();
            if oid == o.oid {
                continue;
            }
            if o.oid.is_some() && oid.is_some() {
                changed += 1;
            }
            o.counters_key = oid
                .as_ref()
                .map_or_else(String::new, |x| format!("COUNTERS:{x}"));
            o.oid = oid;
            for (c, _) in &o.cols {
                st.written[*c] = None;
            }
            st.dirty = true;
            for r in st.rates.iter_mut().filter(|r| r.obj == i) {
                r.dirty |= r.state.init().as_str().is_some();
            }
        }
        changed
    }

    fn count_unresolved(&self) {
        let (mut no, mut yes) = (0, 0);
        for st in self.sessions.values() {
            for o in &st.objs {
                if o.oid.is_some() {
                    yes += 1;
                } else {
                    no += 1;
                }
            }
        }
        self.shared.no_oid.set(no);
        self.shared.resolved.set(yes);
    }

    fn connect(&mut self) {
        let t = Duration::from_millis(self.cfg.io_timeout_ms);
        let r = self
            .client
            .get_connection_with_timeout(t)
            .and_then(|mut c| {
                c.set_read_timeout(Some(t))?;
                c.set_write_timeout(Some(t))?;
                redis::cmd("SELECT")
                    .arg(self.cfg.counters_db)
                    .query::<()>(&mut c)?;
                Ok(c)
            });
        match r {
            Ok(c) => {
                tracing::info!(url = %crate::redact::redact(&self.cfg.url), "Connected to COUNTERS_DB.");
                self.conn = Some(c);
                self.shared.connects.add(1);
                self.shared.connected.set(1);
                if let Ok(mut d) = self.shared.down.lock() {
                    *d = None;
                }
                self.backoff = Duration::from_millis(self.cfg.reconnect_min_ms);
                self.err_log.reset();
                // A new server may have lost everything: write all values and rates again.
                for st in self.sessions.values_mut() {
                    st.written.fill(None);
                    st.dirty = true;
                    for r in &mut st.rates {
                        r.dirty |= r.state.init().as_str().is_some();
                    }
                }
                self.next_refresh = Instant::now();
            }
            Err(e) => self.failed("connect", &e),
        }
    }

    fn failed(&mut self, what: &'static str, e: &redis::RedisError) {
        self.shared.errors.add(1);
        self.shared.connected.set(0);
        if let Ok(mut d) = self.shared.down.lock() {
            *d = Some(e.to_string());
        }
        self.conn = None;
        self.retry_at = Instant::now() + self.backoff;
        if let Some(suppressed) = self.err_log.allow() {
            tracing::warn!(
                error = %e, op = what, retry_in_ms = self.backoff.as_millis() as u64,
                suppressed, "Counters-db Redis failed; values are coalesced in memory and rewritten after reconnect."
            );
        }
        self.backoff = (self.backoff * 2).min(Duration::from_millis(self.cfg.reconnect_max_ms));
    }

    /// Re-reads the name maps, α and port speeds; re-resolves every object.
    fn refresh(&mut self) {
        let Some(conn) = self.conn.as_mut() else {
            return;
        };
        let ports: Vec<String> = {
            let mut v: Vec<String> = self
                .sessions
                .values()
                .flat_map(|s| {
                    s.rates
                        .iter()
                        .filter(|r| r.kind == RateKind::Port)
                        .map(|r| s.objs[r.obj].name.clone())
                })
                .collect();
            v.sort();
            v.dedup();
            v
        };
        let mut p = redis::pipe();
        for m in NAME_MAPS {
            p.cmd("HGETALL").arg(m);
        }
        p.cmd("HGET")
            .arg(RateKind::Port.config_key())
            .arg(RateKind::Port.alpha_field());
        p.cmd("HGET")
            .arg(RateKind::Rif.config_key())
            .arg(RateKind::Rif.alpha_field());
        p.cmd("SELECT").arg(self.cfg.state_db).ignore();
        for port in &ports {
            p.cmd("HGET").arg(format!("PORT_TABLE|{port}")).arg("speed");
        }
        p.cmd("SELECT").arg(self.cfg.appl_db).ignore();
        for port in &ports {
            p.cmd("HMGET")
                .arg(format!("PORT_TABLE:{port}"))
                .arg("speed")
                .arg("oper_status");
        }
        p.cmd("SELECT").arg(self.cfg.counters_db).ignore();
        type Reply = (
            Vec<HashMap<String, String>>,
            Option<String>,
            Option<String>,
            Vec<Option<String>>,
            Vec<(Option<String>, Option<String>)>,
        );
        let r: Result<Vec<redis::Value>, _> = p.query(conn);
        let vals = match r {
            Ok(v) => v,
            Err(e) => return self.failed("refresh", &e),
        };
        let parsed: Result<Reply, redis::RedisError> = (|| {
            let mut it = vals.into_iter();
            let mut maps = Vec::new();
            for _ in NAME_MAPS {
                maps.push(redis::from_redis_value(
                    &it.next().unwrap_or(redis::Value::Nil),
                )?);
            }
            let pa = redis::from_redis_value(&it.next().unwrap_or(redis::Value::Nil))?;
            let ra = redis::from_redis_value(&it.next().unwrap_or(redis::Value::Nil))?;
            let mut st = Vec::new();
            for _ in &ports {
                st.push(redis::from_redis_value(
                    &it.next().unwrap_or(redis::Value::Nil),
                )?);
            }
            let mut ap = Vec::new();
            for _ in &ports {
                ap.push(redis::from_redis_value(
                    &it.next().unwrap_or(redis::Value::Nil),
                )?);
            }
            Ok((maps, pa, ra, st, ap))
        })();
        let (maps, pa, ra, st, ap) = match parsed {
            Ok(x) => x,
            Err(e) => return self.failed("refresh (reply)", &e),
        };
        self.maps = NAME_MAPS.into_iter().zip(maps).collect();
        self.alpha = [
            pa.as_deref().and_then(parse_alpha).unwrap_or(DEFAULT_ALPHA),
            ra.as_deref().and_then(parse_alpha).unwrap_or(DEFAULT_ALPHA),
        ];
        self.speeds.clear();
        for ((port, s), (a, oper)) in ports.iter().zip(st).zip(ap) {
            if let Some(v) = port_speed_mbps(s.as_deref(), a.as_deref(), oper.as_deref()) {
                self.speeds.insert(port.clone(), v);
            }
        }
        let mut sessions = std::mem::take(&mut self.sessions);
        let mut changes = 0;
        for st in sessions.values_mut() {
            changes += self.resolve(st);
        }
        self.sessions = sessions;
        if changes > 0 {
            self.shared.oid_changes.add(changes);
            tracing::info!(
                objects = changes,
                "Name maps changed: objects re-resolved to new OIDs."
            );
        }
        self.count_unresolved();
    }

    /// One write round: changed counters and dirty rates, one pipeline.
    fn flush(&mut self) {
        self.last_flush = Instant::now();
        let Some(conn) = self.conn.as_mut() else {
            return;
        };
        let mut p = redis::pipe();
        let mut fields = 0u64;
        let mut rates = 0u64;
        let mut deferred = 0u64;
        let mut cmds = 0usize;
        for st in self.sessions.values() {
            if st.dirty {
                for o in &st.objs {
                    if o.oid.is_none() {
                        deferred += 1;
                        continue;
                    }
                    let mut cmd: Option<redis::Cmd> = None;
                    for (c, name) in &o.cols {
                        let v = st.latest[*c];
                        if !st.have[*c] || st.written[*c] == Some(v) {
                            continue;
                        }
                        cmd.get_or_insert_with(|| {
                            let mut x = redis::cmd("HSET");
                            x.arg(&o.counters_key);
                            x
                        })
                        .arg(name)
                        .arg(v);
                        fields += 1;
                    }
                    if let Some(cmd) = cmd {
                        p.add_command(cmd).ignore();
                        cmds += 1;
                    }
                }
            }
            for r in st.rates.iter().filter(|r| r.dirty) {
                let o = &st.objs[r.obj];
                let (Some(oid), Some(init)) = (&o.oid, r.state.init().as_str()) else {
                    continue;
                };
                let speed = match r.kind {
                    RateKind::Port => self.speeds.get(&o.name).copied(),
                    RateKind::Rif => None,
                };
                let f = r.state.fields(speed);
                if !f.is_empty() {
                    let mut cmd = redis::cmd("HSET");
                    cmd.arg(rates_key(oid));
                    for (name, v) in f {
                        cmd.arg(name).arg(v.to_string());
                    }
                    p.add_command(cmd).ignore();
                }
                p.cmd("HSET")
                    .arg(r.kind.state_key(oid))
                    .arg(INIT_DONE_FIELD)
                    .arg(init)
                    .ignore();
                rates += 1;
                cmds += 2;
            }
        }
        if deferred > 0 {
            self.shared.deferred.add(deferred);
        }
        if cmds > 0 {
            if let Err(e) = p.query::<()>(conn) {
                return self.failed("write", &e);
            }
        }
        let acked = Instant::now();
        for st in self.sessions.values_mut() {
            if st.dirty {
                for o in st.objs.iter().filter(|o| o.oid.is_some()) {
                    for (c, _) in &o.cols {
                        if st.have[*c] {
                            st.written[*c] = Some(st.latest[*c]);
                        }
                    }
                }
                st.dirty = false;
            }
            // A batch's lag is known once all its objects were written; batches of sessions
            // with objects still waiting for an OID are not measured.
            let complete = st.objs.iter().all(|o| o.oid.is_some());
            for a in st.arrivals.drain(..) {
                if complete {
                    self.shared
                        .lag
                        .record_us((acked - a).as_micros().min(u128::from(u64::MAX)) as u64);
                }
            }
            let objs = &st.objs;
            for r in &mut st.rates {
                if objs[r.obj].oid.is_some() && r.state.init().as_str().is_some() {
                    r.dirty = false;
                }
            }
        }
        self.shared.rounds.add(1);
        self.shared.fields.add(fields);
        self.shared.rates.add(rates);
    }
}
