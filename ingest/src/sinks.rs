//! The store's sinks behind the pipeline's [`Sink`] trait: Parquet history and COUNTERS_DB /
//! RATES. Each owns its bounded queue and overflow policy (see `stel_store::parquet` and
//! `stel_store::sonic`); a refused batch is counted there, so `submit` here just forwards.
use std::sync::Arc;

use stel_store::{
    parquet::{ParquetSink, ParquetSinkConfig, ParquetStats},
    sonic::{CountersDbConfig, CountersDbSink, CountersDbStats},
    CounterBatch,
};

use crate::pipeline::Sink;

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
    pub fn start(cfg: ParquetSinkConfig) -> Result<Arc<Self>, String> {
        let dir = cfg.dir.display().to_string();
        let s = ParquetSink::start(cfg).map_err(|e| format!("parquet sink ({dir}): {e}"))?;
        Ok(Arc::new(Self { handle: s }))
    }

    /// Counters.
    pub fn stats(&self) -> ParquetStats {
        self.handle.stats()
    }

    /// Flushes and publishes everything (call after the decoders have stopped).
    ///
    /// # Errors
    /// The final flush failed (what could not be written is counted in the stats).
    pub fn shutdown(self: Arc<Self>) -> Result<ParquetStats, String> {
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
    fn stats_json(&self) -> serde_json::Value {
        serde_json::to_value(self.handle.stats()).unwrap_or_default()
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
    pub fn start(cfg: CountersDbConfig) -> Result<Arc<Self>, String> {
        let url = cfg.url.clone();
        let sink = CountersDbSink::start(cfg).map_err(|e| format!("counters-db ({url}): {e}"))?;
        Ok(Arc::new(Self { sink }))
    }

    /// Counters (incl. the arrival → written lag histogram).
    pub fn stats(&self) -> CountersDbStats {
        self.sink.stats()
    }

    /// Stops the writer after a last round.
    pub fn shutdown(self: Arc<Self>) {
        match Arc::try_unwrap(self) {
            Ok(me) => me.sink.shutdown(),
            Err(_) => tracing::warn!("COUNTERS_DB sink still in use at shutdown."),
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
    fn stats_json(&self) -> serde_json::Value {
        serde_json::to_value(self.sink.stats()).unwrap_or_default()
    }
}
