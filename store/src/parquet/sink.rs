//! [`ParquetSink`]: the bounded queue in front of the writer thread, and its counters.

use std::{fmt, sync::Arc, thread::JoinHandle, time::Duration};

use crossbeam_channel::{Receiver, RecvTimeoutError, SendTimeoutError, Sender, TrySendError};
use serde::Serialize;

use crate::log_limit::SharedLogLimiter;

use super::{
    writer::{RecoveryReport, Writer},
    Error, ParquetSinkConfig, Result, WhenFull,
};
use crate::{
    batch::CounterBatch,
    labels,
    metrics::{Counter, Gauge, Metric, Registry, Snapshot},
};

macro_rules! counters {
    ($($name:ident: $ty:ident $metric:ident [$($k:ident = $v:literal),*],)*) => {
        /// The sink's counters: handles of registry series (the daemon's registry, or one of
        /// the sink's own), shared by the submitting threads and the writer thread.
        ///
        /// Accounting identity once the sink has shut down (see [`accounting`]):
        /// `stel_sink_received_samples_total = stel_sink_delivered_samples_total +
        /// Σ stel_sink_dropped_samples_total` (all `{sink="parquet"}`).
        #[derive(Debug)]
        pub(crate) struct Counters {
            pub(crate) registry: Arc<Registry>,
            $(pub(crate) $name: $ty,)*
        }

        impl Counters {
            fn new(parent: Option<&Arc<Registry>>) -> Self {
                let r = Registry::child_of(parent);
                Self {
                    $($name: counters!(@reg r, $ty, Metric::$metric, labels!($($k = $v),*)),)*
                    registry: r,
                }
            }
        }
    };
    (@reg $r:ident, Counter, $m:expr, $l:expr) => { $r.counter($m, $l) };
    (@reg $r:ident, Gauge, $m:expr, $l:expr) => { $r.gauge($m, $l) };
}

counters! {
    batches_submitted: Counter SinkReceivedBatches [Sink = "parquet"],
    samples_submitted: Counter SinkReceivedSamples [Sink = "parquet"],
    batches_queued: Counter SinkQueuedBatches [Sink = "parquet"],
    batches_dequeued: Counter SinkDequeuedBatches [Sink = "parquet"],
    shed_queue_full_batches: Counter SinkDroppedBatches [Sink = "parquet", Reason = "queue_full"],
    shed_queue_full_samples: Counter SinkDroppedSamples [Sink = "parquet", Reason = "queue_full"],
    shed_queue_timeout_batches: Counter SinkDroppedBatches [Sink = "parquet", Reason = "queue_timeout"],
    shed_queue_timeout_samples: Counter SinkDroppedSamples [Sink = "parquet", Reason = "queue_timeout"],
    shed_memory_budget_batches: Counter SinkDroppedBatches [Sink = "parquet", Reason = "memory_budget"],
    shed_memory_budget_samples: Counter SinkDroppedSamples [Sink = "parquet", Reason = "memory_budget"],
    shed_closed_batches: Counter SinkDroppedBatches [Sink = "parquet", Reason = "closed"],
    shed_closed_samples: Counter SinkDroppedSamples [Sink = "parquet", Reason = "closed"],
    lost_disk_full_samples: Counter SinkDroppedSamples [Sink = "parquet", Reason = "disk_full"],
    lost_write_error_samples: Counter SinkDroppedSamples [Sink = "parquet", Reason = "write_error"],
    samples_written: Counter SinkDeliveredSamples [Sink = "parquet"],
    batches_written: Counter ParquetWrittenBatches [],
    rows_written: Counter ParquetWrittenRows [],
    missing_samples_written: Counter ParquetMissingSamples [],
    files_published: Counter SinkPublishedFiles [Sink = "parquet"],
    bytes_published: Counter ParquetPublishedBytes [],
    disk_full_errors: Counter ParquetWriteErrors [Reason = "disk_full"],
    io_errors: Counter ParquetWriteErrors [Reason = "io"],
    disk_full_episodes: Counter ParquetErrorEpisodes [Reason = "disk_full"],
    io_error_episodes: Counter ParquetErrorEpisodes [Reason = "io"],
    recoveries: Counter ParquetRecoveries [],
    rotations_schema: Counter ParquetRotations [Reason = "schema"],
    rotations_hour: Counter ParquetRotations [Reason = "hour"],
    rotations_size: Counter ParquetRotations [Reason = "size"],
    rotations_age: Counter ParquetRotations [Reason = "age"],
    rotations_open_files: Counter ParquetRotations [Reason = "open_files"],
    budget_row_group_flushes: Counter ParquetBudgetFlushes [],
    memory_budget_bytes: Gauge ParquetMemoryBudgetBytes [],
    queued_bytes: Gauge SinkQueuedBytes [Sink = "parquet"],
    queued_bytes_peak: Gauge SinkQueuedBytesPeak [Sink = "parquet"],
    writer_bytes: Gauge ParquetBufferedBytes [],
    writer_bytes_peak: Gauge ParquetBufferedBytesPeak [],
    stale_temp_files_removed: Counter ParquetStaleTempFiles [],
    stale_temp_bytes_removed: Counter ParquetStaleTempBytes [],
    retention_files_deleted: Counter ParquetRetentionFiles [],
    retention_bytes_deleted: Counter ParquetRetentionBytes [],
    retention_errors: Counter ParquetRetentionErrors [],
    history_bytes: Gauge ParquetHistoryBytes [],
}

/// The Parquet sink's accounting over a snapshot of its counters ([`ParquetSink::stats`]).
pub mod accounting {
    use crate::metrics::{Label, Metric, Snapshot};

    fn parquet(s: &Snapshot, m: Metric) -> u64 {
        s.sum_where(m, Label::Sink, "parquet")
    }

    /// Values submitted (`stel_sink_received_samples_total`).
    pub fn submitted(s: &Snapshot) -> u64 {
        parquet(s, Metric::SinkReceivedSamples)
    }

    /// Values in published files (`stel_sink_delivered_samples_total`).
    pub fn written(s: &Snapshot) -> u64 {
        parquet(s, Metric::SinkDeliveredSamples)
    }

    /// Values shed before the writer took them (queue full or timed out, memory budget, closed).
    pub fn shed(s: &Snapshot) -> u64 {
        ["queue_full", "queue_timeout", "memory_budget", "closed"]
            .iter()
            .map(|r| dropped(s, r))
            .sum()
    }

    /// Values accepted but not written (disk full, other write errors).
    pub fn lost(s: &Snapshot) -> u64 {
        dropped(s, "disk_full") + dropped(s, "write_error")
    }

    /// Values dropped for `reason`.
    pub fn dropped(s: &Snapshot, reason: &str) -> u64 {
        s.series(Metric::SinkDroppedSamples)
            .filter(|x| x.label(Label::Sink) == "parquet" && x.label(Label::Reason) == reason)
            .map(|x| x.value)
            .sum()
    }

    /// Submitted values neither written nor dropped: in the queue or in open parts. Zero after
    /// [`super::ParquetSink::shutdown`].
    pub fn in_flight(s: &Snapshot) -> u64 {
        submitted(s).saturating_sub(written(s) + shed(s) + lost(s))
    }
}

/// Why [`ParquetSink::submit`] did not take a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ShedReason {
    /// The queue was full (`when_full = "drop_newest"`).
    QueueFull,
    /// The queue stayed full for `block_timeout_ms` (`when_full = "block"`).
    QueueTimeout,
    /// The batch would have pushed the sink over `memory_budget_bytes`.
    MemoryBudget,
    /// The writer thread has stopped.
    Closed,
}

impl ShedReason {
    /// The metric label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::QueueFull => "queue_full",
            Self::QueueTimeout => "queue_timeout",
            Self::MemoryBudget => "memory_budget",
            Self::Closed => "closed",
        }
    }
}

impl fmt::Display for ShedReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A batch the sink did not take (already counted, by reason).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("parquet sink shed a batch of {samples} counter values: {reason}")]
pub struct Shed {
    pub reason: ShedReason,
    pub samples: u64,
}

fn batch_bytes(b: &CounterBatch) -> u64 {
    (b.values.len() * 8 + b.ts.len() * 8 + b.part_masks.len() * 4) as u64
}

/// The Parquet sink. Decode threads call [`ParquetSink::submit`]; a dedicated thread
/// (`stel-parquet`) turns batches into wide Parquet files and publishes them atomically.
///
/// Dropping the sink without [`ParquetSink::shutdown`] also drains the queue and publishes
/// (it joins the writer thread).
pub struct ParquetSink {
    tx: Option<Sender<Arc<CounterBatch>>>,
    thread: Option<JoinHandle<()>>,
    c: Arc<Counters>,
    when_full: WhenFull,
    block_timeout: Duration,
    budget: u64,
    recovery: RecoveryReport,
    shed_log: SharedLogLimiter,
}

impl fmt::Debug for ParquetSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ParquetSink")
            .field("when_full", &self.when_full)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl ParquetSink {
    /// Validates `cfg`, creates the root, recovers what a previous run left (stale temporary
    /// parts removed and reported, see [`ParquetSink::recovery`]), and starts the writer thread.
    ///
    /// # Errors
    /// An invalid config (every problem listed), an uncreatable root, or no thread.
    /// With a `registry`, the counters are registered in it (a child; see
    /// [`crate::metrics::Registry::child`]).
    pub fn start(cfg: ParquetSinkConfig, registry: Option<&Arc<Registry>>) -> Result<ParquetSink> {
        cfg.validate()?;
        crate::durable::check_writable(&cfg.dir).map_err(|source| Error::CreateDir {
            path: cfg.dir.clone(),
            source,
        })?;
        let c = Arc::new(Counters::new(registry));
        c.memory_budget_bytes.set(cfg.memory_budget_bytes);
        let mut writer = Writer::new(cfg.clone(), Arc::clone(&c)).map_err(Error::Spawn)?;
        let recovery = writer.recover();
        if recovery.stale_temp_files > 0 {
            for s in recovery.sessions.iter().filter(|s| s.stale_temp_files > 0) {
                tracing::warn!(
                    profile = %s.profile,
                    group = %s.group,
                    stale_temp_files = s.stale_temp_files,
                    stale_temp_bytes = s.stale_temp_bytes,
                    last_durable_ns = ?s.last_durable_ns,
                    lost_from_ns = ?s.lost_from_ns,
                    "The previous run stopped without publishing; its unpublished rows are lost."
                );
            }
        }
        let (tx, rx) = crossbeam_channel::bounded(cfg.queue_batches);
        let wc = Arc::clone(&c);
        let thread = std::thread::Builder::new()
            .name("stel-parquet".into())
            .spawn(move || run(writer, rx, wc))
            .map_err(Error::Spawn)?;
        tracing::info!(
            dir = %cfg.dir.display(),
            published_files = recovery.published_files,
            published_bytes = recovery.published_bytes,
            "Parquet sink started."
        );
        Ok(ParquetSink {
            tx: Some(tx),
            thread: Some(thread),
            c,
            when_full: cfg.when_full,
            block_timeout: Duration::from_millis(cfg.block_timeout_ms),
            budget: cfg.memory_budget_bytes,
            recovery,
            shed_log: SharedLogLimiter::new(Duration::from_secs(10)),
        })
    }

    /// Hands a batch to the writer. Called from decode threads: never waits longer than
    /// `block_timeout_ms` (`when_full = "block"`) and not at all with `drop_newest`.
    ///
    /// # Errors
    /// [`Shed`] when the batch was not taken; it is already counted by reason.
    pub fn submit(&self, batch: Arc<CounterBatch>) -> Result<(), Shed> {
        let samples = batch.samples() as u64;
        self.c.batches_submitted.add(1);
        self.c.samples_submitted.add(samples);
        if batch.rows() == 0 {
            return Ok(());
        }
        let bytes = batch_bytes(&batch);
        let queued = self.c.queued_bytes.add(bytes) + bytes;
        let held = queued + self.c.writer_bytes.get();
        let result = if held > self.budget {
            Err(ShedReason::MemoryBudget)
        } else {
            match (&self.tx, self.when_full) {
                (None, _) => Err(ShedReason::Closed),
                (Some(tx), WhenFull::DropNewest) => tx.try_send(batch).map_err(|e| match e {
                    TrySendError::Full(_) => ShedReason::QueueFull,
                    TrySendError::Disconnected(_) => ShedReason::Closed,
                }),
                (Some(tx), WhenFull::Block) => match tx.try_send(batch) {
                    Ok(()) => Ok(()),
                    Err(TrySendError::Disconnected(_)) => Err(ShedReason::Closed),
                    Err(TrySendError::Full(b)) => {
                        tx.send_timeout(b, self.block_timeout).map_err(|e| match e {
                            SendTimeoutError::Timeout(_) => ShedReason::QueueTimeout,
                            SendTimeoutError::Disconnected(_) => ShedReason::Closed,
                        })
                    }
                },
            }
        };
        match result {
            Ok(()) => {
                self.c.batches_queued.add(1);
                self.c.queued_bytes_peak.max(queued);
                Ok(())
            }
            Err(reason) => {
                self.c.queued_bytes.sub(bytes);
                let (b, s) = match reason {
                    ShedReason::QueueFull => (
                        &self.c.shed_queue_full_batches,
                        &self.c.shed_queue_full_samples,
                    ),
                    ShedReason::QueueTimeout => (
                        &self.c.shed_queue_timeout_batches,
                        &self.c.shed_queue_timeout_samples,
                    ),
                    ShedReason::MemoryBudget => (
                        &self.c.shed_memory_budget_batches,
                        &self.c.shed_memory_budget_samples,
                    ),
                    ShedReason::Closed => {
                        (&self.c.shed_closed_batches, &self.c.shed_closed_samples)
                    }
                };
                b.add(1);
                s.add(samples);
                if self.shed_log.allow() {
                    tracing::warn!(
                        reason = reason.as_str(),
                        samples,
                        "Parquet sink shed a batch; history has a hole."
                    );
                }
                Err(Shed { reason, samples })
            }
        }
    }

    /// The counters now (`stel_parquet_*`, `stel_sink_*{sink="parquet"}`; see [`accounting`]).
    pub fn stats(&self) -> Snapshot {
        self.c.registry.snapshot()
    }

    /// What was found (and cleaned) under the root at start.
    pub fn recovery(&self) -> &RecoveryReport {
        &self.recovery
    }

    /// Stops taking batches, writes everything queued, publishes every open part, and returns
    /// the final counters.
    ///
    /// # Errors
    /// Only if the writer thread panicked (a bug); write errors are in the counters.
    pub fn shutdown(mut self) -> Result<Snapshot> {
        self.stop()?;
        Ok(self.stats())
    }

    fn stop(&mut self) -> Result<()> {
        drop(self.tx.take());
        if let Some(t) = self.thread.take() {
            t.join().map_err(|_| Error::WriterPanicked)?;
        }
        Ok(())
    }
}

impl Drop for ParquetSink {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            tracing::error!(error = %e, "Parquet sink did not stop cleanly.");
        }
    }
}

fn run(mut writer: Writer, rx: Receiver<Arc<CounterBatch>>, c: Arc<Counters>) {
    loop {
        match rx.recv_timeout(writer.next_deadline()) {
            Ok(batch) => {
                c.batches_dequeued.add(1);
                c.queued_bytes.sub(batch_bytes(&batch));
                writer.push(batch);
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => break,
        }
        writer.tick();
    }
    writer.close_all();
}
