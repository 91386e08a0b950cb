//! [`ParquetSink`]: the bounded queue in front of the writer thread, and its counters.

use std::{
    fmt,
    sync::{
        atomic::{AtomicU64, Ordering::Relaxed},
        Arc,
    },
    thread::JoinHandle,
    time::Duration,
};

use crossbeam_channel::{Receiver, RecvTimeoutError, SendTimeoutError, Sender, TrySendError};
use serde::Serialize;

use crate::log_limit::SharedLogLimiter;

use super::{
    writer::{RecoveryReport, Writer},
    Error, ParquetSinkConfig, Result, WhenFull,
};
use crate::batch::CounterBatch;

macro_rules! counters {
    ($($(#[doc = $doc:literal])* $name:ident,)*) => {
        /// The sink's counters, shared by the submitting threads and the writer thread.
        #[derive(Debug, Default)]
        pub(crate) struct Counters {
            $(pub(crate) $name: AtomicU64,)*
        }

        /// A snapshot of the sink's counters (all cumulative since start unless noted).
        ///
        /// Accounting identity once the sink has shut down:
        /// `samples_submitted = samples_written + shed_*_samples + lost_*_samples`.
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
        pub struct ParquetStats {
            $($(#[doc = $doc])* pub $name: u64,)*
        }

        impl Counters {
            fn snapshot(&self) -> ParquetStats {
                ParquetStats { $($name: self.$name.load(Relaxed),)* }
            }
        }
    };
}

counters! {
    /// Batches passed to `submit` (empty ones included).
    batches_submitted,
    /// Counter values (rows × width) passed to `submit`.
    samples_submitted,
    /// Batches put on the queue (pushed).
    batches_queued,
    /// Batches taken off the queue by the writer (popped).
    batches_dequeued,
    /// Shed because the queue was full (`when_full = "drop_newest"`).
    shed_queue_full_batches,
    /// Counter values in those batches.
    shed_queue_full_samples,
    /// Shed because the queue stayed full for `block_timeout_ms` (`when_full = "block"`).
    shed_queue_timeout_batches,
    /// Counter values in those batches.
    shed_queue_timeout_samples,
    /// Shed because queued plus buffered bytes would exceed `memory_budget_bytes`.
    shed_memory_budget_batches,
    /// Counter values in those batches.
    shed_memory_budget_samples,
    /// Shed because the writer thread was gone.
    shed_closed_batches,
    /// Counter values in those batches.
    shed_closed_samples,
    /// Batches fully handed to open parts.
    batches_written,
    /// Rows and counter values in published files.
    rows_written,
    /// Counter values in published files.
    samples_written,
    /// Of `samples_written`, values that are null (a split snapshot's part never arrived).
    missing_samples_written,
    /// Files published (renamed into place).
    files_published,
    /// Bytes of published files.
    bytes_published,
    /// Values not written because the disk was full (in an abandoned part, or arriving while
    /// writes were paused after ENOSPC).
    lost_disk_full_samples,
    /// Values not written because of another I/O error.
    lost_write_error_samples,
    /// Values not written because the batch could not be turned into Arrow.
    lost_encode_samples,
    /// Failed open/write/flush/publish operations.
    write_errors,
    /// Of `write_errors`, those that were ENOSPC/EDQUOT.
    disk_full_errors,
    /// Runs of failures starting with ENOSPC (an episode ends at the next publish).
    disk_full_episodes,
    /// Runs of failures starting with another I/O error.
    io_error_episodes,
    /// Episodes that ended with a successful publish.
    recoveries,
    /// Batches that could not be turned into Arrow.
    encode_errors,
    /// Parts published because the session's schema changed.
    rotations_schema,
    /// Parts published because the next rows belonged to another hour.
    rotations_hour,
    /// Parts published at `max_file_bytes`.
    rotations_size,
    /// Parts published at `flush_interval_ms`.
    rotations_age,
    /// Row groups flushed early because buffered rows reached half the memory budget.
    budget_row_group_flushes,
    /// The configured memory budget (bytes).
    memory_budget_bytes,
    /// Bytes of batches waiting in the queue now (gauge).
    queued_bytes,
    /// Highest `queued_bytes` seen.
    queued_bytes_peak,
    /// Bytes the writer buffers in unfinished row groups now (gauge).
    writer_bytes,
    /// Highest `writer_bytes` seen.
    writer_bytes_peak,
    /// Temporary parts of a killed writer removed at start, and their bytes.
    stale_temp_files_removed,
    /// Bytes of those temporary parts.
    stale_temp_bytes_removed,
    /// Files and bytes deleted by retention.
    retention_files_deleted,
    /// Bytes deleted by retention.
    retention_bytes_deleted,
    /// Files retention could not delete.
    retention_errors,
    /// Bytes of published history under the root now (gauge).
    history_bytes,
}

impl ParquetStats {
    /// Every shed sample.
    pub fn shed_samples(&self) -> u64 {
        self.shed_queue_full_samples
            + self.shed_queue_timeout_samples
            + self.shed_memory_budget_samples
            + self.shed_closed_samples
    }

    /// Every sample accepted but not written.
    pub fn lost_samples(&self) -> u64 {
        self.lost_disk_full_samples + self.lost_write_error_samples + self.lost_encode_samples
    }

    /// Submitted samples neither written, shed nor lost: in the queue or in open parts. Zero
    /// after [`ParquetSink::shutdown`].
    pub fn in_flight_samples(&self) -> u64 {
        self.samples_submitted
            .saturating_sub(self.samples_written + self.shed_samples() + self.lost_samples())
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

/// A batch the sink did not take (already counted in [`ParquetStats`]).
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
    pub fn start(cfg: ParquetSinkConfig) -> Result<ParquetSink> {
        cfg.validate()?;
        std::fs::create_dir_all(&cfg.dir).map_err(|source| Error::CreateDir {
            path: cfg.dir.clone(),
            source,
        })?;
        let c = Arc::new(Counters::default());
        c.memory_budget_bytes
            .store(cfg.memory_budget_bytes, Relaxed);
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
        self.c.batches_submitted.fetch_add(1, Relaxed);
        self.c.samples_submitted.fetch_add(samples, Relaxed);
        if batch.rows() == 0 {
            return Ok(());
        }
        let bytes = batch_bytes(&batch);
        let queued = self.c.queued_bytes.fetch_add(bytes, Relaxed) + bytes;
        let held = queued + self.c.writer_bytes.load(Relaxed);
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
                self.c.batches_queued.fetch_add(1, Relaxed);
                self.c.queued_bytes_peak.fetch_max(queued, Relaxed);
                Ok(())
            }
            Err(reason) => {
                self.c.queued_bytes.fetch_sub(bytes, Relaxed);
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
                b.fetch_add(1, Relaxed);
                s.fetch_add(samples, Relaxed);
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

    /// The counters now.
    pub fn stats(&self) -> ParquetStats {
        self.c.snapshot()
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
    pub fn shutdown(mut self) -> Result<ParquetStats> {
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
                c.batches_dequeued.fetch_add(1, Relaxed);
                c.queued_bytes.fetch_sub(batch_bytes(&batch), Relaxed);
                writer.push(batch);
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => break,
        }
        writer.tick();
    }
    writer.close_all();
}
