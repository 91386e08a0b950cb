//! STATE_DB session watcher: SONiC's HFT sessions → [`SessionEvent`]s.
//!
//! ```text
//!  STATE_DB (6)  HIGH_FREQUENCY_TELEMETRY_SESSION_TABLE|<profile>|<group>   (orchagent, current)
//!                STREAM_TELEMETRY_SESSION|<profile>|<group>                  (seed HLD)
//!                STREAM_TELEMETRY_SESSION|<profile>                          (deprecated: session_template)
//!        │ initial SCAN + HGETALL, then keyspace notifications (__keyspace@6__:<key>),
//!        │ full resync after every reconnect and every `resync_interval_ms`
//!        ▼
//!  watcher thread (current-thread tokio runtime) ── std mpsc ──▶ daemon: SessionEvent::{Register, Unregister}
//!        ▲                                                          │ Decoder::register_session / unregister,
//!        └──────────── SessionAcker::applied(key, version) ◀────────┘ eBPF template map
//!           → HSET <key> config_version <version + 1> (only if the key still exists)
//! ```
//!
//! Parsing (reference §4.3): `stream_status` (HFT table; `session_status` in the HLD tables)
//! `enabled`/`disabled`; `object_names` comma list paired positionally with `object_ids` (uint16
//! labels); `session_type` must be `ipfix` (absent = ipfix); `session_config` = raw bytes of one
//! or more IPFIX messages with template sets (a hex text of the same bytes is accepted too). The
//! observation domain comes from the IPFIX message header. Every template is checked with
//! [`TemplateRecord::parse`] and compiled, so a malformed template never reaches a decoder.
//!
//! A bad entry (length mismatch, non-numeric or duplicate ids, malformed template bytes, unknown
//! status) is logged (rate-limited), counted and ignored; a session registered earlier under the
//! same key stays as it was; other sessions are unaffected. Changes that touch only
//! `config_version` (our own acknowledgements) are not re-emitted.
//!
//! The deprecated `STREAM_TELEMETRY_SESSION|<profile>` form has no group and no names: its group
//! is the object type of the template's first counter field, and its labels stay unnamed
//! (`unknown_<label>` in the decoder).

use std::{
    collections::{hash_map::DefaultHasher, HashMap},
    hash::{Hash, Hasher},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        mpsc, Arc,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use stel_store::sai::ObjectType;
use tokio::sync::{mpsc as tmpsc, Notify};

use crate::{
    decode::SessionSpec,
    ipfix::{split_enterprise_number, TemplateMessages, VERSION},
};

/// The STATE_DB table names.
pub const HFT_SESSION_TABLE: &str = "HIGH_FREQUENCY_TELEMETRY_SESSION_TABLE";
pub const STREAM_SESSION_TABLE: &str = "STREAM_TELEMETRY_SESSION";

/// Watcher settings. `Default` is for a SONiC switch.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StateDbConfig {
    /// Redis URL (`unix:///var/run/redis/redis.sock`, `redis://127.0.0.1:6379`); the database
    /// index in it is ignored.
    pub url: String,
    /// STATE_DB index (SONiC: 6).
    pub state_db: i64,
    /// Turn on keyspace notifications (`notify-keyspace-events` += `Khg`) when they are off.
    /// Without them changes are only seen at the periodic resync.
    pub enable_notifications: bool,
    /// Full rescan period, ms (catches anything a notification missed); 0 = only after connects.
    pub resync_interval_ms: u64,
    /// Connect / command timeout, ms.
    pub io_timeout_ms: u64,
    /// Reconnect backoff: first delay, doubling up to the max, ms.
    pub reconnect_min_ms: u64,
    pub reconnect_max_ms: u64,
}

impl Default for StateDbConfig {
    fn default() -> Self {
        Self {
            url: "unix:///var/run/redis/redis.sock".to_string(),
            state_db: 6,
            enable_notifications: true,
            resync_interval_ms: 30_000,
            io_timeout_ms: 2_000,
            reconnect_min_ms: 100,
            reconnect_max_ms: 5_000,
        }
    }
}

impl StateDbConfig {
    /// Short backoff for tests.
    pub fn for_test(url: &str) -> Self {
        Self {
            url: url.to_string(),
            reconnect_min_ms: 20,
            reconnect_max_ms: 200,
            io_timeout_ms: 1_000,
            ..Self::default()
        }
    }
}

/// Watcher errors (only at start; at run time everything is retried and counted).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid redis url `{}`: {source}", stel_store::redact::redact(url))]
    Url {
        url: String,
        source: redis::RedisError,
    },
    #[error("cannot start the STATE_DB watcher: {0}")]
    Start(#[from] std::io::Error),
}

/// Which table a session key lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum SessionTable {
    /// `HIGH_FREQUENCY_TELEMETRY_SESSION_TABLE|<profile>|<group>`.
    HighFrequency,
    /// `STREAM_TELEMETRY_SESSION|<profile>|<group>`.
    Stream,
    /// `STREAM_TELEMETRY_SESSION|<profile>` (deprecated; `session_template`).
    StreamLegacy,
}

/// A session's STATE_DB identity.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SessionKey {
    pub table: SessionTable,
    pub profile: String,
    /// Empty for [`SessionTable::StreamLegacy`] (the event's spec carries the derived group).
    pub group: String,
}

impl SessionKey {
    /// Parses a STATE_DB key (`|` separated).
    pub fn parse(key: &str) -> Option<Self> {
        let mut it = key.splitn(3, '|');
        let table = it.next()?;
        let profile = it.next()?.to_string();
        let group = it.next();
        if profile.is_empty() {
            return None;
        }
        let (table, group) = match (table, group) {
            (HFT_SESSION_TABLE, Some(g)) if !g.is_empty() => (SessionTable::HighFrequency, g),
            (STREAM_SESSION_TABLE, Some(g)) if !g.is_empty() => (SessionTable::Stream, g),
            (STREAM_SESSION_TABLE, None) => (SessionTable::StreamLegacy, ""),
            _ => return None,
        };
        Some(Self {
            table,
            profile,
            group: group.to_string(),
        })
    }

    /// The STATE_DB key.
    pub fn redis_key(&self) -> String {
        match self.table {
            SessionTable::HighFrequency => {
                format!("{HFT_SESSION_TABLE}|{}|{}", self.profile, self.group)
            }
            SessionTable::Stream => {
                format!("{STREAM_SESSION_TABLE}|{}|{}", self.profile, self.group)
            }
            SessionTable::StreamLegacy => format!("{STREAM_SESSION_TABLE}|{}", self.profile),
        }
    }
}

/// What the daemon must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionEvent {
    /// Register (or replace) a session: `Decoder::register_session(spec, &session_config, sink)`
    /// on the decoder that owns `spec.domain`, and add `template_ids` to the eBPF map. Then call
    /// [`SessionAcker::applied`] (or `rejected` if the decoder refused it).
    Register {
        key: SessionKey,
        spec: SessionSpec,
        /// One or more IPFIX messages with template sets, validated.
        session_config: Vec<u8>,
        /// The template IDs in `session_config`, in order.
        template_ids: Vec<u16>,
        /// `config_version` as read (for the acknowledgement).
        config_version: Option<u32>,
    },
    /// Unregister: `Decoder::unregister_session(domain, template_ids[0], sink)` and remove
    /// `template_ids` from the eBPF map. Sent when a session is disabled, deleted, or replaced
    /// by one with other templates.
    Unregister {
        key: SessionKey,
        profile: String,
        group: String,
        domain: u32,
        template_ids: Vec<u16>,
    },
}

/// Watcher counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct StateDbStats {
    pub full_scans: u64,
    pub notifications: u64,
    pub registers: u64,
    pub unregisters: u64,
    /// Entries ignored as malformed.
    pub bad_entries: u64,
    /// Entries ignored because `session_type` is not `ipfix`.
    pub unsupported_type: u64,
    pub acks_written: u64,
    pub rejects: u64,
    pub redis_errors: u64,
    pub connects: u64,
    pub notifications_enabled_by_us: u64,
    pub connected: bool,
}

#[derive(Debug, Default)]
struct Shared {
    full_scans: AtomicU64,
    notifications: AtomicU64,
    registers: AtomicU64,
    unregisters: AtomicU64,
    bad: AtomicU64,
    unsupported: AtomicU64,
    acks: AtomicU64,
    rejects: AtomicU64,
    errors: AtomicU64,
    connects: AtomicU64,
    enabled_by_us: AtomicU64,
    connected: AtomicBool,
}

impl Shared {
    fn stats(&self) -> StateDbStats {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        StateDbStats {
            full_scans: l(&self.full_scans),
            notifications: l(&self.notifications),
            registers: l(&self.registers),
            unregisters: l(&self.unregisters),
            bad_entries: l(&self.bad),
            unsupported_type: l(&self.unsupported),
            acks_written: l(&self.acks),
            rejects: l(&self.rejects),
            redis_errors: l(&self.errors),
            connects: l(&self.connects),
            notifications_enabled_by_us: l(&self.enabled_by_us),
            connected: self.connected.load(Ordering::Relaxed),
        }
    }
}

#[derive(Debug)]
enum Ack {
    Applied(SessionKey, Option<u32>),
}

/// Acknowledges applied sessions back to STATE_DB (`config_version` + 1). Cloneable, cheap,
/// never blocks.
#[derive(Debug, Clone)]
pub struct SessionAcker {
    tx: tmpsc::UnboundedSender<Ack>,
    shared: Arc<Shared>,
}

impl SessionAcker {
    /// The daemon applied a [`SessionEvent::Register`]: the watcher writes
    /// `config_version = version + 1` (absent version → 1) into the session's key, as the HLD
    /// workflow says, if the key still exists.
    pub fn applied(&self, key: &SessionKey, config_version: Option<u32>) {
        let _ = self.tx.send(Ack::Applied(key.clone(), config_version));
    }

    /// The daemon could not apply a Register (e.g. the decoder refused it): counted and logged;
    /// `config_version` is left alone so the HLD's orchagent side can see it was not applied.
    pub fn rejected(&self, key: &SessionKey, reason: &str) {
        self.shared.rejects.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(key = %key.redis_key(), reason, "Session rejected by the daemon.");
    }
}

/// The running watcher. Dropping it (or [`StateDbWatcher::shutdown`]) stops it.
#[derive(Debug)]
pub struct StateDbWatcher {
    shared: Arc<Shared>,
    acker: SessionAcker,
    stop: Arc<Notify>,
    stopping: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl StateDbWatcher {
    /// Starts the watcher thread. Sessions arrive on the returned receiver; the first events
    /// come from the initial full scan. Redis being down is not an error here: it is retried.
    ///
    /// # Errors
    /// A bad URL, or the thread/runtime could not be created.
    pub fn start(
        cfg: StateDbConfig,
    ) -> Result<(StateDbWatcher, mpsc::Receiver<SessionEvent>), Error> {
        let client = redis::Client::open(cfg.url.as_str()).map_err(|source| Error::Url {
            url: cfg.url.clone(),
            source,
        })?;
        let mut info = client.get_connection_info().clone();
        info.redis.db = cfg.state_db;
        let client = redis::Client::open(info).map_err(|source| Error::Url {
            url: cfg.url.clone(),
            source,
        })?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let (tx, rx) = mpsc::channel();
        let (ack_tx, ack_rx) = tmpsc::unbounded_channel();
        let shared = Arc::new(Shared::default());
        let stop = Arc::new(Notify::new());
        let stopping = Arc::new(AtomicBool::new(false));
        let mut w = Watcher {
            cfg,
            client,
            tx,
            ack_rx,
            shared: Arc::clone(&shared),
            known: HashMap::new(),
            bad_log: HashMap::new(),
        };
        let (stop2, stopping2) = (Arc::clone(&stop), Arc::clone(&stopping));
        let thread = std::thread::Builder::new()
            .name("stel-statedb".into())
            .spawn(move || rt.block_on(w.run(stop2, stopping2)))?;
        Ok((
            StateDbWatcher {
                acker: SessionAcker {
                    tx: ack_tx,
                    shared: Arc::clone(&shared),
                },
                shared,
                stop,
                stopping,
                thread: Some(thread),
            },
            rx,
        ))
    }

    pub fn acker(&self) -> SessionAcker {
        self.acker.clone()
    }

    pub fn stats(&self) -> StateDbStats {
        self.shared.stats()
    }

    /// Stops the watcher and joins its thread.
    pub fn shutdown(mut self) {
        self.stop_now();
    }

    fn stop_now(&mut self) {
        self.stopping.store(true, Ordering::Relaxed);
        self.stop.notify_one();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for StateDbWatcher {
    fn drop(&mut self) {
        self.stop_now();
    }
}

/// Why an entry was ignored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadEntry {
    #[error("object_names has {names} entries but object_ids has {ids}")]
    LengthMismatch { names: usize, ids: usize },
    #[error("object_ids entry `{0}` is not a uint16 label")]
    BadId(String),
    #[error("duplicate object id {0}")]
    DuplicateId(u16),
    #[error("unknown status `{0}` (expected enabled or disabled)")]
    BadStatus(String),
    #[error("no session_config")]
    NoConfig,
    #[error("session_config: {0}")]
    Config(String),
}

/// A parsed, valid entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedSession {
    pub enabled: bool,
    /// False when `session_type` is not ipfix (ignored, but counted).
    pub ipfix: bool,
    pub spec: SessionSpec,
    pub session_config: Vec<u8>,
    pub template_ids: Vec<u16>,
    pub config_version: Option<u32>,
}

fn text(fields: &HashMap<String, Vec<u8>>, name: &str) -> Option<String> {
    fields
        .get(name)
        .map(|v| String::from_utf8_lossy(v).trim().to_string())
}

fn split_list(s: &str) -> Vec<String> {
    if s.trim().is_empty() {
        return Vec::new();
    }
    s.split(',').map(|x| x.trim().to_string()).collect()
}

/// Decodes `session_config`: raw bytes, or (tolerated) the same bytes as hex text.
fn config_bytes(raw: &[u8]) -> Vec<u8> {
    let is_ipfix = raw.len() >= 2 && u16::from_be_bytes([raw[0], raw[1]]) == VERSION;
    let t = raw.trim_ascii();
    if !is_ipfix && !t.is_empty() {
        if let Some(b) = std::str::from_utf8(t).ok().and_then(crate::hex::decode) {
            return b;
        }
    }
    raw.to_vec()
}

/// Checks `session_config` the way a decoder will use it: returns (domain, template ids, SAI
/// object type of the first counter field).
pub fn validate_session_config(b: &[u8]) -> Result<(u32, Vec<u16>, Option<u32>), BadEntry> {
    let m = TemplateMessages::parse(b).map_err(|e| BadEntry::Config(e.to_string()))?;
    let mut ids = Vec::with_capacity(m.records.len());
    for rec in &m.records {
        rec.compile()
            .map_err(|e| BadEntry::Config(format!("template {}: {e}", rec.template_id)))?;
        if ids.contains(&rec.template_id) {
            return Err(BadEntry::Config("a template ID appears twice".into()));
        }
        ids.push(rec.template_id);
    }
    // The SAI object type of the first counter field (enterprise-numbered) in the config.
    let first_type = m
        .records
        .iter()
        .find_map(|rec| rec.fields.iter().find_map(|f| f.enterprise))
        .map(|en| split_enterprise_number(en).0);
    if ids.is_empty() {
        return Err(BadEntry::Config("no template in it".into()));
    }
    Ok((m.domain, ids, first_type))
}

/// Parses one STATE_DB entry. See the module docs for the rules.
///
/// # Errors
/// [`BadEntry`] for anything the daemon must not apply.
pub fn parse_entry(
    key: &SessionKey,
    fields: &HashMap<String, Vec<u8>>,
) -> Result<ParsedSession, BadEntry> {
    let status = match key.table {
        SessionTable::HighFrequency => {
            text(fields, "stream_status").or_else(|| text(fields, "session_status"))
        }
        _ => text(fields, "session_status").or_else(|| text(fields, "stream_status")),
    };
    let enabled = match status.as_deref().map(str::to_ascii_lowercase).as_deref() {
        Some("enabled" | "enable" | "active" | "true") => true,
        // The deprecated form had no status: present means active.
        None if key.table == SessionTable::StreamLegacy => true,
        Some("disabled" | "disable" | "inactive" | "false") => false,
        Some(other) => return Err(BadEntry::BadStatus(other.to_string())),
        None => return Err(BadEntry::BadStatus(String::new())),
    };
    let ipfix = text(fields, "session_type").is_none_or(|t| t.eq_ignore_ascii_case("ipfix"));
    let raw = match key.table {
        SessionTable::StreamLegacy => fields
            .get("session_template")
            .or_else(|| fields.get("session_config")),
        _ => fields.get("session_config"),
    };
    let session_config = config_bytes(raw.ok_or(BadEntry::NoConfig)?);
    let (domain, template_ids, first_type) = validate_session_config(&session_config)?;
    let names = split_list(&text(fields, "object_names").unwrap_or_default());
    let ids_text = split_list(&text(fields, "object_ids").unwrap_or_default());
    if names.len() != ids_text.len() {
        return Err(BadEntry::LengthMismatch {
            names: names.len(),
            ids: ids_text.len(),
        });
    }
    let mut ids = Vec::with_capacity(ids_text.len());
    for t in &ids_text {
        let id: u16 = t.parse().map_err(|_| BadEntry::BadId(t.clone()))?;
        if ids.contains(&id) {
            return Err(BadEntry::DuplicateId(id));
        }
        ids.push(id);
    }
    let group = if key.group.is_empty() {
        first_type
            .and_then(ObjectType::from_id)
            .map_or_else(|| "UNKNOWN".to_string(), |t| t.name().to_string())
    } else {
        key.group.clone()
    };
    let config_version = text(fields, "config_version").and_then(|v| v.parse().ok());
    Ok(ParsedSession {
        enabled,
        ipfix,
        spec: SessionSpec {
            profile: key.profile.clone(),
            group,
            domain,
            object_names: names,
            object_ids: ids,
        },
        session_config,
        template_ids,
        config_version,
    })
}

/// What we last did for a key.
#[derive(Debug)]
struct Known {
    fingerprint: u64,
    /// (profile, group, domain, template ids) while registered.
    registered: Option<(String, String, u32, Vec<u16>)>,
}

fn fingerprint(fields: &HashMap<String, Vec<u8>>) -> u64 {
    let mut v: Vec<_> = fields
        .iter()
        .filter(|(k, _)| k.as_str() != "config_version")
        .collect();
    v.sort();
    let mut h = DefaultHasher::new();
    v.hash(&mut h);
    h.finish()
}

struct Watcher {
    cfg: StateDbConfig,
    client: redis::Client,
    tx: mpsc::Sender<SessionEvent>,
    ack_rx: tmpsc::UnboundedReceiver<Ack>,
    shared: Arc<Shared>,
    known: HashMap<String, Known>,
    /// Per key: when a bad entry was last logged (rate limit: once per 10 s per key).
    bad_log: HashMap<String, Instant>,
}

type RResult<T> = redis::RedisResult<T>;

impl Watcher {
    async fn run(&mut self, stop: Arc<Notify>, stopping: Arc<AtomicBool>) {
        let mut backoff = Duration::from_millis(self.cfg.reconnect_min_ms);
        let mut last_warn: Option<Instant> = None;
        while !stopping.load(Ordering::Relaxed) {
            let started = Instant::now();
            let r = tokio::select! {
                r = self.session() => r,
                _ = stop.notified() => break,
            };
            self.shared.connected.store(false, Ordering::Relaxed);
            if let Err(e) = r {
                self.shared.errors.fetch_add(1, Ordering::Relaxed);
                if last_warn.is_none_or(|t| t.elapsed() > Duration::from_secs(10)) {
                    last_warn = Some(Instant::now());
                    tracing::warn!(error = %e, retry_in_ms = backoff.as_millis() as u64,
                        "STATE_DB watcher lost Redis; will reconnect and resync.");
                }
            }
            if started.elapsed() > Duration::from_secs(5) {
                backoff = Duration::from_millis(self.cfg.reconnect_min_ms);
            }
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = stop.notified() => break,
            }
            backoff = (backoff * 2).min(Duration::from_millis(self.cfg.reconnect_max_ms));
        }
    }

    /// One connection's life: subscribe, full scan, then follow notifications.
    async fn session(&mut self) -> RResult<()> {
        let t = Duration::from_millis(self.cfg.io_timeout_ms);
        let cc = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(t)
            .set_response_timeout(t);
        let mut conn = self
            .client
            .get_multiplexed_async_connection_with_config(&cc)
            .await?;
        if self.cfg.enable_notifications {
            self.ensure_notifications(&mut conn).await?;
        }
        let mut pubsub = tokio::time::timeout(t, self.client.get_async_pubsub())
            .await
            .map_err(|_| timeout_err("pubsub connect"))??;
        let db = self.cfg.state_db;
        for table in [HFT_SESSION_TABLE, STREAM_SESSION_TABLE] {
            pubsub
                .psubscribe(format!("__keyspace@{db}__:{table}|*"))
                .await?;
        }
        self.shared.connects.fetch_add(1, Ordering::Relaxed);
        self.shared.connected.store(true, Ordering::Relaxed);
        tracing::info!(url = %stel_store::redact::redact(&self.cfg.url), db, "STATE_DB watcher connected; full resync.");
        // Subscribed first, then scanned: no change can fall between the two.
        self.full_resync(&mut conn).await?;
        let prefix = format!("__keyspace@{db}__:");
        let period = Duration::from_millis(self.cfg.resync_interval_ms.max(1));
        let mut resync = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        let mut msgs = pubsub.on_message();
        loop {
            tokio::select! {
                m = msgs.next() => {
                    let Some(m) = m else {
                        return Err(timeout_err("keyspace subscription closed"));
                    };
                    self.shared.notifications.fetch_add(1, Ordering::Relaxed);
                    if let Some(key) = m.get_channel_name().strip_prefix(&prefix) {
                        let key = key.to_string();
                        self.process_key(&mut conn, &key).await?;
                    }
                }
                a = self.ack_rx.recv() => {
                    if let Some(a) = a {
                        self.ack(&mut conn, a).await?;
                    }
                }
                _ = resync.tick(), if self.cfg.resync_interval_ms > 0 => {
                    self.full_resync(&mut conn).await?;
                }
            }
        }
    }

    async fn ensure_notifications(
        &self,
        conn: &mut redis::aio::MultiplexedConnection,
    ) -> RResult<()> {
        let (_, cur): (String, String) = redis::cmd("CONFIG")
            .arg("GET")
            .arg("notify-keyspace-events")
            .query_async(conn)
            .await?;
        let has = |c: char| cur.contains(c);
        if has('K') && (has('A') || (has('g') && has('h'))) {
            return Ok(());
        }
        let mut want: String = cur.clone();
        for c in ['K', 'g', 'h'] {
            if !want.contains(c) {
                want.push(c);
            }
        }
        redis::cmd("CONFIG")
            .arg("SET")
            .arg("notify-keyspace-events")
            .arg(&want)
            .query_async::<()>(conn)
            .await?;
        self.shared.enabled_by_us.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(before = %cur, after = %want,
            "Redis keyspace notifications were off; enabled them (notify-keyspace-events) to follow STATE_DB sessions.");
        Ok(())
    }

    async fn full_resync(&mut self, conn: &mut redis::aio::MultiplexedConnection) -> RResult<()> {
        self.shared.full_scans.fetch_add(1, Ordering::Relaxed);
        let mut keys = Vec::new();
        for table in [HFT_SESSION_TABLE, STREAM_SESSION_TABLE] {
            let mut cursor: u64 = 0;
            loop {
                let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(format!("{table}|*"))
                    .arg("COUNT")
                    .arg(1000)
                    .query_async(conn)
                    .await?;
                keys.extend(batch);
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        keys.sort();
        keys.dedup();
        let gone: Vec<String> = self
            .known
            .keys()
            .filter(|k| keys.binary_search(k).is_err())
            .cloned()
            .collect();
        for k in keys.iter().chain(gone.iter()) {
            self.process_key(conn, k).await?;
        }
        Ok(())
    }

    fn send(&self, e: SessionEvent) {
        match &e {
            SessionEvent::Register { .. } => &self.shared.registers,
            SessionEvent::Unregister { .. } => &self.shared.unregisters,
        }
        .fetch_add(1, Ordering::Relaxed);
        // The daemon gone means we are shutting down; nothing to do.
        let _ = self.tx.send(e);
    }

    fn unregister(&self, key: &SessionKey, reg: (String, String, u32, Vec<u16>)) {
        let (profile, group, domain, template_ids) = reg;
        self.send(SessionEvent::Unregister {
            key: key.clone(),
            profile,
            group,
            domain,
            template_ids,
        });
    }

    async fn process_key(
        &mut self,
        conn: &mut redis::aio::MultiplexedConnection,
        redis_key: &str,
    ) -> RResult<()> {
        let Some(key) = SessionKey::parse(redis_key) else {
            return Ok(());
        };
        let ty: String = redis::cmd("TYPE").arg(redis_key).query_async(conn).await?;
        let fields: HashMap<String, Vec<u8>> = if ty == "hash" {
            redis::cmd("HGETALL")
                .arg(redis_key)
                .query_async(conn)
                .await?
        } else {
            HashMap::new()
        };
        if fields.is_empty() {
            // Deleted (or not a hash): unregister what we registered.
            if let Some(k) = self.known.remove(redis_key) {
                if let Some(reg) = k.registered {
                    tracing::info!(key = redis_key, "Session deleted; unregistering.");
                    self.unregister(&key, reg);
                }
            }
            return Ok(());
        }
        let fp = fingerprint(&fields);
        if self
            .known
            .get(redis_key)
            .is_some_and(|k| k.fingerprint == fp)
        {
            return Ok(()); // unchanged, or only our config_version ack
        }
        let prev = self.known.remove(redis_key).and_then(|k| k.registered);
        let parsed = match parse_entry(&key, &fields) {
            Ok(p) => p,
            Err(e) => {
                self.shared.bad.fetch_add(1, Ordering::Relaxed);
                let now = Instant::now();
                let last = self.bad_log.get(redis_key).copied();
                if last.is_none_or(|t| now - t > Duration::from_secs(10)) {
                    self.bad_log.insert(redis_key.to_string(), now);
                    tracing::warn!(key = redis_key, error = %e,
                        "Ignoring a bad STATE_DB session entry; the session stays as it was.");
                }
                self.known.insert(
                    redis_key.to_string(),
                    Known {
                        fingerprint: fp,
                        registered: prev,
                    },
                );
                return Ok(());
            }
        };
        if !parsed.ipfix {
            self.shared.unsupported.fetch_add(1, Ordering::Relaxed);
        }
        let registered = if parsed.enabled && parsed.ipfix {
            let new_reg = (
                parsed.spec.profile.clone(),
                parsed.spec.group.clone(),
                parsed.spec.domain,
                parsed.template_ids.clone(),
            );
            if let Some(p) = prev {
                if (p.2, &p.3) != (new_reg.2, &new_reg.3) {
                    self.unregister(&key, p);
                }
            }
            tracing::info!(key = redis_key, domain = parsed.spec.domain,
                templates = ?parsed.template_ids, objects = parsed.spec.object_names.len(),
                "Session registered from STATE_DB.");
            self.send(SessionEvent::Register {
                key: key.clone(),
                spec: parsed.spec,
                session_config: parsed.session_config,
                template_ids: parsed.template_ids,
                config_version: parsed.config_version,
            });
            Some(new_reg)
        } else {
            if let Some(p) = prev {
                tracing::info!(key = redis_key, "Session disabled; unregistering.");
                self.unregister(&key, p);
            }
            None
        };
        self.known.insert(
            redis_key.to_string(),
            Known {
                fingerprint: fp,
                registered,
            },
        );
        Ok(())
    }

    async fn ack(&self, conn: &mut redis::aio::MultiplexedConnection, a: Ack) -> RResult<()> {
        let Ack::Applied(key, version) = a;
        let next = version.map_or(1, |v| v.wrapping_add(1));
        // Only if the key still exists: never resurrect a deleted session as a bare hash.
        let n: i64 = redis::cmd("EVAL")
            .arg("if redis.call('EXISTS', KEYS[1]) == 1 then return redis.call('HSET', KEYS[1], 'config_version', ARGV[1]) end return -1")
            .arg(1)
            .arg(key.redis_key())
            .arg(next)
            .query_async(conn)
            .await?;
        if n >= 0 {
            self.shared.acks.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }
}

fn timeout_err(what: &'static str) -> redis::RedisError {
    redis::RedisError::from((redis::ErrorKind::IoError, what))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys() {
        let k = SessionKey::parse("HIGH_FREQUENCY_TELEMETRY_SESSION_TABLE|p1|PORT").unwrap();
        assert_eq!(k.table, SessionTable::HighFrequency);
        assert_eq!((k.profile.as_str(), k.group.as_str()), ("p1", "PORT"));
        assert_eq!(
            k.redis_key(),
            "HIGH_FREQUENCY_TELEMETRY_SESSION_TABLE|p1|PORT"
        );
        let l = SessionKey::parse("STREAM_TELEMETRY_SESSION|p1").unwrap();
        assert_eq!(l.table, SessionTable::StreamLegacy);
        assert_eq!(l.redis_key(), "STREAM_TELEMETRY_SESSION|p1");
        assert_eq!(
            SessionKey::parse("STREAM_TELEMETRY_SESSION|p1|QUEUE")
                .unwrap()
                .table,
            SessionTable::Stream
        );
        assert!(SessionKey::parse("HIGH_FREQUENCY_TELEMETRY_SESSION_TABLE|p1").is_none());
        assert!(SessionKey::parse("PORT_TABLE|Ethernet0").is_none());
    }

    #[test]
    fn hex_config_is_accepted() {
        assert_eq!(config_bytes(b"000a0010"), vec![0, 10, 0, 16]);
        assert_eq!(config_bytes(&[0, 10, 0x41]), vec![0, 10, 0x41]);
    }
}
