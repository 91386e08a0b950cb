//! Per-profile collector endpoints from SONiC's CONFIG_DB: `HIGH_FREQUENCY_TELEMETRY_PROFILE|<p>`
//! fields `otel_endpoint` (and `otel_certs`, a PEM CA file for it), re-read every `refresh_ms`
//! by a small thread with the blocking Redis client. The exporter picks up a new map by its
//! generation number (one atomic load per batch). Redis being down keeps the last good map.

use std::{
    collections::HashMap,
    path::PathBuf,
    sync::{
        atomic::{AtomicU64, Ordering::Relaxed},
        Arc, Mutex,
    },
    thread::JoinHandle,
    time::Duration,
};

use crossbeam_channel::{RecvTimeoutError, Sender};

use super::{config::ConfigDbConfig, sink::Counters, Error, ProfileEndpoint};
use crate::log_limit::LogLimiter;

/// CONFIG_DB table of HFT profiles.
pub const PROFILE_TABLE: &str = "HIGH_FREQUENCY_TELEMETRY_PROFILE";

/// The current map and its generation.
#[derive(Debug, Default)]
pub(crate) struct Shared {
    gen: AtomicU64,
    map: Mutex<Arc<HashMap<String, ProfileEndpoint>>>,
}

impl Shared {
    /// (generation, map); generation 0 means never read.
    pub(crate) fn current(&self) -> (u64, Arc<HashMap<String, ProfileEndpoint>>) {
        let gen = self.gen.load(Relaxed);
        let map = self.map.lock().map(|m| Arc::clone(&m)).unwrap_or_default();
        (gen, map)
    }

    fn publish(&self, map: HashMap<String, ProfileEndpoint>) {
        if let Ok(mut m) = self.map.lock() {
            *m = Arc::new(map);
        }
        self.gen.fetch_add(1, Relaxed);
    }
}

struct Poller {
    cfg: ConfigDbConfig,
    client: redis::Client,
    conn: Option<redis::Connection>,
    c: Arc<Counters>,
    shared: Arc<Shared>,
    last: Option<HashMap<String, ProfileEndpoint>>,
    log: LogLimiter,
}

impl Poller {
    fn connect(&self) -> redis::RedisResult<redis::Connection> {
        let t = Duration::from_millis(self.cfg.io_timeout_ms);
        let mut c = self.client.get_connection_with_timeout(t)?;
        c.set_read_timeout(Some(t))?;
        c.set_write_timeout(Some(t))?;
        redis::cmd("SELECT").arg(self.cfg.db).query::<()>(&mut c)?;
        Ok(c)
    }

    fn read(&mut self) -> redis::RedisResult<HashMap<String, ProfileEndpoint>> {
        if self.conn.is_none() {
            self.conn = Some(self.connect()?);
        }
        let Some(conn) = self.conn.as_mut() else {
            return Ok(HashMap::new());
        };
        let pattern = format!("{PROFILE_TABLE}|*");
        let mut keys: Vec<String> = Vec::new();
        let mut cursor = 0u64;
        loop {
            let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(256)
                .query(conn)?;
            keys.extend(batch);
            if next == 0 {
                break;
            }
            cursor = next;
        }
        let mut out = HashMap::new();
        for key in keys {
            let Some(profile) = key.split_once('|').map(|(_, p)| p.to_string()) else {
                continue;
            };
            let (ep, certs): (Option<String>, Option<String>) = redis::cmd("HMGET")
                .arg(&key)
                .arg("otel_endpoint")
                .arg("otel_certs")
                .query(conn)?;
            let Some(ep) = ep.map(|e| e.trim().to_string()).filter(|e| !e.is_empty()) else {
                continue;
            };
            out.insert(
                profile,
                ProfileEndpoint {
                    endpoint: ep,
                    certs: certs
                        .map(|c| c.trim().to_string())
                        .filter(|c| !c.is_empty())
                        .map(PathBuf::from),
                },
            );
        }
        Ok(out)
    }

    fn poll(&mut self) {
        match self.read() {
            Ok(map) => {
                if self.last.as_ref() != Some(&map) {
                    for (p, e) in &map {
                        tracing::info!(profile = %p, endpoint = %crate::redact::redact(&e.endpoint), "OTLP: profile exports to its own otel_endpoint.");
                    }
                    self.c.profile_endpoints.set(map.len() as u64);
                    self.shared.publish(map.clone());
                    self.last = Some(map);
                }
            }
            Err(e) => {
                self.conn = None;
                self.c.config_db_errors.add(1);
                if let Some(suppressed) = self.log.allow() {
                    tracing::warn!(url = %crate::redact::redact(&self.cfg.url), error = %e, suppressed, "OTLP: cannot read CONFIG_DB profiles; keeping the last endpoints.");
                }
            }
        }
    }
}

/// The CONFIG_DB reader thread.
#[derive(Debug)]
pub(crate) struct ProfileWatch {
    shared: Arc<Shared>,
    stop: Sender<()>,
    thread: JoinHandle<()>,
}

impl ProfileWatch {
    /// Reads the profiles once (so the first batches are routed right), then every
    /// `refresh_ms` on its own thread.
    pub(crate) fn start(cfg: ConfigDbConfig, c: Arc<Counters>) -> Result<Self, Error> {
        let client = redis::Client::open(cfg.url.as_str()).map_err(|e| {
            Error::Config(format!(
                "config_db.url `{}`: {e}",
                crate::redact::redact(&cfg.url)
            ))
        })?;
        let shared = Arc::new(Shared::default());
        let every = Duration::from_millis(cfg.refresh_ms);
        let mut p = Poller {
            cfg,
            client,
            conn: None,
            c,
            shared: Arc::clone(&shared),
            last: None,
            log: LogLimiter::new(Duration::from_secs(30)),
        };
        p.poll();
        let (stop, rx) = crossbeam_channel::bounded::<()>(1);
        let thread = std::thread::Builder::new()
            .name("stel-otlp-cfgdb".into())
            .spawn(move || {
                while let Err(RecvTimeoutError::Timeout) = rx.recv_timeout(every) {
                    p.poll();
                }
            })
            .map_err(Error::Spawn)?;
        Ok(Self {
            shared,
            stop,
            thread,
        })
    }

    pub(crate) fn shared(&self) -> Arc<Shared> {
        Arc::clone(&self.shared)
    }

    pub(crate) fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.thread.join();
    }
}
