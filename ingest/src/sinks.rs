//! The store's sinks behind the pipeline's [`Sink`] trait: Parquet history, COUNTERS_DB /
//! RATES, OTLP and the live snapshot (status line, inspect socket). Each owns its bounded queue and
//! overflow policy (see `stel_store::parquet` and `stel_store::sonic`); a refused batch is
//! counted there, so `submit` here just forwards. The data-lake uploader and the inspect server
//! take no batches (they follow the published files / the live snapshot) and report through
//! [`StatusSource`].
use std::{path::Path, sync::Arc};

use stel_store::{
    labels,
    live::{LiveState, Server},
    metrics::{Label, Metric, Registry, Snapshot},
    otlp::{OtlpConfig, OtlpSink, OtlpStats},
    parquet::{ParquetSink, ParquetSinkConfig},
    rollup::{RollupConfig, RollupSink, WriterTotals},
    sonic::{CountersDbConfig, CountersDbSink},
    upload::{UploadConfig, Uploader},
    CounterBatch,
};

use crate::pipeline::Sink;

/// Something whose counters go into the daemon's status (under `sinks.<name>`) without taking
/// batches.
pub trait StatusSource: Send + Sync {
    fn name(&self) -> &'static str;
    /// Its own series of the daemon's registry.
    fn stats(&self) -> Snapshot;
    /// What a reader of the status file needs next to the counters (not counters: names,
    /// the last error), merged into its section.
    fn info(&self) -> serde_json::Map<String, serde_json::Value> {
        serde_json::Map::new()
    }
}

/// The newest snapshot of every session (`stel_store::live`): feeds the status line and the
/// inspect socket. Copies one row per batch, never per counter.
#[derive(Debug)]
pub struct Live {
    state: Arc<LiveState>,
    registry: Arc<Registry>,
}

impl Live {
    /// The live view, its rows and profiles observed by `registry` (read at snapshot time).
    pub fn new(registry: &Arc<Registry>) -> Arc<Self> {
        let state = Arc::new(LiveState::default());
        let r = Registry::child_of(Some(registry));
        let st = Arc::clone(&state);
        r.observe(Metric::LiveRows, labels!(), move || st.rows());
        let st = Arc::clone(&state);
        r.observe(Metric::LiveProfiles, labels!(), move || {
            st.profiles().len() as u64
        });
        let st = Arc::clone(&state);
        r.observe(Metric::LiveEvictedSessions, labels!(), move || st.evicted());
        Arc::new(Self { state, registry: r })
    }

    /// The shared snapshot store (the inspect server reads it).
    pub fn state(&self) -> &Arc<LiveState> {
        &self.state
    }
}

impl Sink for Live {
    fn name(&self) -> &'static str {
        "live"
    }
    fn submit(&self, batch: &Arc<CounterBatch>) {
        self.state.update(batch);
    }
    fn stats(&self) -> Snapshot {
        self.registry.snapshot()
    }
}

/// The live inspect socket (`stel_store::live::Server`).
#[derive(Debug)]
pub(crate) struct InspectServer {
    server: Server,
}

impl InspectServer {
    /// Binds `path` and serves `live`'s snapshots from its own thread.
    ///
    /// # Errors
    /// The socket is in use by another daemon or cannot be created.
    pub(crate) fn start(
        path: &Path,
        live: &Live,
        max_clients: usize,
        registry: &Arc<Registry>,
    ) -> Result<Arc<Self>, String> {
        let server = Server::start(path, Arc::clone(live.state()), max_clients, Some(registry))
            .map_err(|e| e.to_string())?;
        Ok(Arc::new(Self { server }))
    }

    /// Stops serving and removes the socket.
    pub(crate) fn shutdown(self: Arc<Self>) {
        match Arc::try_unwrap(self) {
            Ok(me) => me.server.shutdown(),
            Err(_) => tracing::warn!("Inspect server still in use at shutdown."),
        }
    }
}

impl StatusSource for InspectServer {
    fn name(&self) -> &'static str {
        "inspect"
    }
    fn stats(&self) -> Snapshot {
        self.server.stats()
    }
}

/// The data-lake uploader (`stel_store::upload`).
#[derive(Debug)]
pub(crate) struct Upload {
    uploader: Uploader,
}

impl Upload {
    /// Starts the uploader thread over the Parquet history in `data_dir`.
    ///
    /// # Errors
    /// An invalid config or destination, an unreadable state file.
    /// The lake's switch name is `[upload] switch`, else `parquet_switch` (the Parquet sink's
    /// `switch_name`), else CONFIG_DB's `DEVICE_METADATA|localhost` hostname at `redis_url`,
    /// else the host name ([`stel_store::upload::resolve_switch`]).
    pub(crate) fn start(
        mut cfg: UploadConfig,
        data_dir: &Path,
        parquet_switch: Option<&str>,
        redis_url: Option<&str>,
        registry: &Arc<Registry>,
    ) -> Result<Arc<Self>, String> {
        let from = stel_store::upload::resolve_switch(&mut cfg, parquet_switch, redis_url);
        tracing::info!(switch = %cfg.switch, source = ?from, "Lake switch name resolved.");
        let to = cfg.to.clone();
        let uploader = Uploader::start(cfg, data_dir, Some(registry))
            .map_err(|e| format!("upload to {}: {e}", stel_store::redact::redact(&to)))?;
        Ok(Arc::new(Self { uploader }))
    }

    /// The destination as configured, credentials masked (for what the operator reads).
    pub(crate) fn destination(&self) -> String {
        stel_store::redact::redact(self.uploader.destination()).into_owned()
    }

    /// While uploads fail: `<destination>: <last error>` (credentials masked).
    pub(crate) fn failing(&self) -> Option<String> {
        self.uploader
            .failing()
            .map(|e| format!("{}: {e}", self.destination()))
    }

    /// Uploads what is pending (bounded by `shutdown_timeout_ms`) and stops. Call after the
    /// Parquet history has published its last files. Returns the final counters and, when the
    /// last attempt failed, its error (why files are still pending).
    pub(crate) fn shutdown(self: Arc<Self>) -> Option<(Snapshot, Option<String>)> {
        match Arc::try_unwrap(self) {
            Ok(me) => Some(me.uploader.shutdown_with_failure()),
            Err(_) => {
                tracing::warn!("Uploader still in use at shutdown.");
                None
            }
        }
    }
}

impl StatusSource for Upload {
    fn name(&self) -> &'static str {
        "upload"
    }
    fn stats(&self) -> Snapshot {
        self.uploader.stats()
    }
    fn info(&self) -> serde_json::Map<String, serde_json::Value> {
        let mut m = serde_json::Map::new();
        m.insert("switch".into(), self.uploader.switch().into());
        m.insert("last_error".into(), self.uploader.last_error().into());
        m
    }
}

/// Parquet history.
#[derive(Debug)]
pub struct ParquetHistory {
    handle: ParquetSink,
}

impl ParquetHistory {
    /// Starts the writer thread.
    ///
    /// # Errors
    /// The directory cannot be created, or the configuration is invalid.
    pub fn start(cfg: ParquetSinkConfig, registry: &Arc<Registry>) -> Result<Arc<Self>, String> {
        let dir = cfg.dir.display().to_string();
        let s = ParquetSink::start(cfg, Some(registry)).map_err(|e| match e {
            // Names the directory already.
            stel_store::parquet::Error::CreateDir { .. } => e.to_string(),
            e => format!("parquet sink ({dir}): {e}"),
        })?;
        Ok(Arc::new(Self { handle: s }))
    }

    /// Counters.
    pub fn stats(&self) -> Snapshot {
        self.handle.stats()
    }

    /// Flushes and publishes everything (call after the decoders have stopped).
    ///
    /// # Errors
    /// The final flush failed (what could not be written is counted in the stats).
    pub fn shutdown(self: Arc<Self>) -> Result<Snapshot, String> {
        let me = Arc::try_unwrap(self).map_err(|_| "parquet sink still in use at shutdown")?;
        me.handle.shutdown().map_err(|e| e.to_string())
    }
}

impl Sink for ParquetHistory {
    fn name(&self) -> &'static str {
        "parquet"
    }
    fn submit(&self, batch: &Arc<CounterBatch>) {
        // A refusal is counted by the sink (by reason); nothing else to do on the decode thread.
        let _ = self.handle.submit(Arc::clone(batch));
    }
    fn stats(&self) -> Snapshot {
        self.handle.stats()
    }
}

/// Rollup tiers (`stel_store::rollup`), next to the Parquet history.
#[derive(Debug)]
pub struct Rollups {
    sink: RollupSink,
}

impl Rollups {
    /// Starts the rollup thread over `dir` (the history's directory).
    ///
    /// # Errors
    /// An invalid config, an uncreatable directory, no thread.
    pub fn start(
        cfg: &RollupConfig,
        dir: &Path,
        switch: Option<String>,
        budget: stel_store::BudgetHandle,
        registry: &Arc<Registry>,
    ) -> Result<Arc<Self>, String> {
        let sink = RollupSink::start(cfg, dir.to_path_buf(), switch, budget, Some(registry))
            .map_err(|e| format!("rollup ({}): {e}", dir.display()))?;
        Ok(Arc::new(Self { sink }))
    }

    /// The tiers' names (`1s`, `1m`).
    pub fn tiers(&self) -> Vec<String> {
        self.sink.tiers().iter().map(|t| t.name.clone()).collect()
    }

    /// Counters.
    pub fn stats(&self) -> Snapshot {
        self.sink.stats()
    }

    /// Rolls up what is queued and publishes every open tier file (after the decoders stopped).
    ///
    /// # Errors
    /// The rollup thread panicked.
    pub fn shutdown(self: Arc<Self>) -> Result<(Snapshot, WriterTotals), String> {
        let me = Arc::try_unwrap(self).map_err(|_| "rollup sink still in use at shutdown")?;
        me.sink.shutdown().map_err(|e| e.to_string())
    }
}

impl Sink for Rollups {
    fn name(&self) -> &'static str {
        "rollup"
    }
    fn submit(&self, batch: &Arc<CounterBatch>) {
        // A refusal is counted by the sink (by reason); the tiers show it as lost snapshots.
        let _ = self.sink.submit(Arc::clone(batch));
    }
    fn stats(&self) -> Snapshot {
        self.sink.stats()
    }
}

/// COUNTERS_DB + RATES.
#[derive(Debug)]
pub struct CountersDb {
    sink: CountersDbSink,
}

impl CountersDb {
    /// Starts the writer thread (Redis being down is retried, not an error).
    ///
    /// # Errors
    /// A bad URL or configuration.
    pub fn start(cfg: CountersDbConfig, registry: &Arc<Registry>) -> Result<Arc<Self>, String> {
        let url = cfg.url.clone();
        let sink = CountersDbSink::start(cfg, Some(registry)).map_err(|e| {
            stel_store::redact::redact(&format!("counters-db ({url}): {e}")).into_owned()
        })?;
        Ok(Arc::new(Self { sink }))
    }

    /// Counters (incl. the arrival → written lag histogram).
    pub fn stats(&self) -> Snapshot {
        self.sink.stats()
    }

    /// `Some("<url>: <error>")` while Redis is not connected (retried), credentials masked;
    /// see [`stel_store::sonic::CountersDbHandle::down`].
    pub fn down(&self) -> Option<String> {
        self.sink.down()
    }

    /// Stops the writer after a last round; returns [`Self::down`] as that round left it
    /// (`Some`: the last values were not written).
    pub fn shutdown(self: Arc<Self>) -> Option<String> {
        match Arc::try_unwrap(self) {
            Ok(me) => {
                let h = me.sink.handle();
                me.sink.shutdown();
                h.down()
            }
            Err(me) => {
                tracing::warn!("COUNTERS_DB sink still in use at shutdown.");
                me.down()
            }
        }
    }
}

impl Sink for CountersDb {
    fn name(&self) -> &'static str {
        "counters_db"
    }
    fn submit(&self, batch: &Arc<CounterBatch>) {
        let _ = self.sink.submit(Arc::clone(batch));
    }
    fn stats(&self) -> Snapshot {
        self.sink.stats()
    }
}

/// OTLP export to an OpenTelemetry collector (`stel_store::otlp`).
#[derive(Debug)]
pub(crate) struct Otlp {
    sink: OtlpSink,
    registry: Option<Arc<Registry>>,
}

impl Otlp {
    /// Starts the exporter (a collector being down is retried, not an error). With a
    /// `registry` its counters are registered there, and exported too when
    /// `own_metrics_interval_ms` is set.
    ///
    /// # Errors
    /// A bad config (every problem listed) or an unreadable TLS file.
    pub(crate) fn start(
        cfg: OtlpConfig,
        registry: Option<Arc<Registry>>,
    ) -> Result<Arc<Self>, String> {
        let ep = cfg.endpoint.clone();
        let sink = OtlpSink::start(cfg, registry.clone())
            .map_err(|e| stel_store::redact::redact(&format!("otlp ({ep}): {e}")).into_owned())?;
        Ok(Arc::new(Self { sink, registry }))
    }

    /// Exports what is queued (bounded by `shutdown_timeout_ms`) and stops; the final counters.
    pub(crate) fn shutdown(self: Arc<Self>) -> Option<OtlpStats> {
        match Arc::try_unwrap(self) {
            Ok(me) => Some(me.sink.shutdown()),
            Err(_) => {
                tracing::warn!("OTLP sink still in use at shutdown.");
                None
            }
        }
    }
}

impl Sink for Otlp {
    fn name(&self) -> &'static str {
        "otlp"
    }
    fn submit(&self, batch: &Arc<CounterBatch>) {
        // A drop is counted by the sink (by reason); never waits.
        let _ = self.sink.submit(Arc::clone(batch));
    }
    fn stats(&self) -> Snapshot {
        // Its counters are registered in the daemon's registry itself (OTLP exports that
        // registry): the `sink="otlp"` series.
        match &self.registry {
            Some(r) => r.snapshot().with_label(Label::Sink, "otlp"),
            None => Snapshot::default(),
        }
    }
}
