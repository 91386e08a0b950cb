//! [`IntSink`]: the bounded queue in front of the INT table writer thread, and its counters.
//!
//! ```text
//! INT decoders ──submit(IntBatch)──▶ bounded queue ──▶ stel-int-parquet thread
//!  (never wait longer than block_timeout;   (queue_batches,   per (table, switch, hour): ArrowWriter
//!   shed batches counted by reason)          memory budget)   → .part-….tmp → fsync → rename → fsync dir
//! ```

use std::{
    fmt,
    sync::{atomic::Ordering::Relaxed, Arc},
    thread::JoinHandle,
    time::Duration,
};

use crossbeam_channel::{Receiver, RecvTimeoutError, SendTimeoutError, Sender, TrySendError};

pub use super::stats::IntSinkStats;
use super::{stats::Counters, writer::Writer, IntBatch, IntSinkConfig};
use crate::parquet::{ConfigError, Error, Result, ShedReason, WhenFull};

/// The INT table sink. Decoders call [`IntSink::submit`]; the `stel-int-parquet` thread writes.
pub struct IntSink {
    tx: Option<Sender<IntBatch>>,
    thread: Option<JoinHandle<()>>,
    c: Arc<Counters>,
    when_full: WhenFull,
    block_timeout: Duration,
    budget: u64,
}

impl fmt::Debug for IntSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IntSink")
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl IntSink {
    /// Validates `cfg`, creates the root, removes temporary parts a killed writer left (counted)
    /// and indexes published INT files for retention, then starts the writer thread.
    ///
    /// # Errors
    /// An invalid config (every problem listed), an uncreatable root, or no thread.
    pub fn start(cfg: IntSinkConfig) -> Result<IntSink> {
        cfg.validate()?;
        if cfg.dir.as_os_str().is_empty() {
            return Err(ConfigError {
                problems: vec!["int.parquet.dir is empty: give the tables' root directory".into()],
            }
            .into());
        }
        crate::durable::create_dirs(&cfg.dir).map_err(|source| Error::CreateDir {
            path: cfg.dir.clone(),
            source,
        })?;
        let c = Arc::new(Counters::default());
        let mut writer = Writer::new(cfg.clone(), Arc::clone(&c));
        writer.recover();
        let (tx, rx) = crossbeam_channel::bounded(cfg.queue_batches);
        let wc = Arc::clone(&c);
        let thread = std::thread::Builder::new()
            .name("stel-int-parquet".into())
            .spawn(move || run(writer, rx, wc))
            .map_err(Error::Spawn)?;
        Ok(IntSink {
            tx: Some(tx),
            thread: Some(thread),
            c,
            when_full: cfg.when_full,
            block_timeout: Duration::from_millis(cfg.block_timeout_ms),
            budget: cfg.memory_budget_bytes,
        })
    }

    /// Hands a batch to the writer. Never waits longer than `block_timeout_ms` (`block`) and not
    /// at all with `drop_newest`.
    ///
    /// # Errors
    /// The reason the batch was shed (already counted).
    pub fn submit(&self, batch: IntBatch) -> Result<(), ShedReason> {
        let rows = batch.rows() as u64;
        self.c.batches_submitted.fetch_add(1, Relaxed);
        self.c.rows_submitted.fetch_add(rows, Relaxed);
        if rows == 0 {
            return Ok(());
        }
        let bytes = batch.bytes() as u64;
        let queued = self.c.queued_bytes.fetch_add(bytes, Relaxed) + bytes;
        let result = if queued + self.c.writer_bytes.load(Relaxed) > self.budget {
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
                Ok(())
            }
            Err(reason) => {
                self.c.queued_bytes.fetch_sub(bytes, Relaxed);
                let counter = match reason {
                    ShedReason::QueueFull => &self.c.shed_queue_full_rows,
                    ShedReason::QueueTimeout => &self.c.shed_queue_timeout_rows,
                    ShedReason::MemoryBudget => &self.c.shed_memory_budget_rows,
                    ShedReason::Closed => &self.c.shed_closed_rows,
                };
                counter.fetch_add(rows, Relaxed);
                Err(reason)
            }
        }
    }

    /// The counters now.
    pub fn stats(&self) -> IntSinkStats {
        self.c.snapshot()
    }

    /// Writes everything queued, publishes every open part, returns the final counters.
    ///
    /// # Errors
    /// Only if the writer thread panicked (a bug).
    pub fn shutdown(mut self) -> Result<IntSinkStats> {
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

impl Drop for IntSink {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            tracing::error!(error = %e, "INT sink did not stop cleanly.");
        }
    }
}

fn run(mut writer: Writer, rx: Receiver<IntBatch>, c: Arc<Counters>) {
    loop {
        match rx.recv_timeout(writer.next_deadline()) {
            Ok(batch) => {
                c.batches_dequeued.fetch_add(1, Relaxed);
                c.queued_bytes.fetch_sub(batch.bytes() as u64, Relaxed);
                writer.push(batch);
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => break,
        }
        // While batches wait, no switch is idle: its rows may be in them.
        writer.tick(!rx.is_empty());
    }
    writer.close_all();
}
