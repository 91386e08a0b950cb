//! [`IntSinkStats`]: the INT sink's counters, shared by the queue ([`super::sink`]) and the
//! writer thread ([`super::writer`]) — both update them, neither owns the other.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use serde::Serialize;

macro_rules! counters {
    ($($(#[doc = $doc:literal])* $name:ident,)*) => {
        #[derive(Debug, Default)]
        pub(crate) struct Counters {
            $(pub(crate) $name: AtomicU64,)*
        }

        /// A snapshot of the INT sink's counters (cumulative since start unless noted).
        ///
        /// Accounting identity once the sink has shut down:
        /// `rows_submitted = rows_written + shed_*_rows + lost_*_rows`.
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
        pub struct IntSinkStats {
            $($(#[doc = $doc])* pub $name: u64,)*
        }

        impl Counters {
            pub(crate) fn snapshot(&self) -> IntSinkStats {
                IntSinkStats { $($name: self.$name.load(Relaxed),)* }
            }
        }
    };
}

counters! {
    /// Batches passed to `submit`.
    batches_submitted,
    /// Rows (all three tables) passed to `submit`.
    rows_submitted,
    /// Batches put on the queue (pushed).
    batches_queued,
    /// Batches taken off the queue by the writer (popped).
    batches_dequeued,
    /// Rows shed because the queue was full (`drop_newest`).
    shed_queue_full_rows,
    /// Rows shed because the queue stayed full for `block_timeout_ms` (`block`).
    shed_queue_timeout_rows,
    /// Rows shed because the sink would have gone over `memory_budget_bytes`.
    shed_memory_budget_rows,
    /// Rows shed because the writer thread was gone.
    shed_closed_rows,
    /// Rows in published files.
    rows_written,
    /// Files published.
    files_published,
    /// Bytes of published files.
    bytes_published,
    /// Rows not written because the disk was full.
    lost_disk_full_rows,
    /// Rows not written because of another I/O or encoding error.
    lost_write_error_rows,
    /// Failed open/write/publish operations.
    write_errors,
    /// Parts published because the next rows belonged to another hour.
    rotations_hour,
    /// Parts published at `max_file_bytes`.
    rotations_size,
    /// Parts published at `flush_interval_ms`.
    rotations_age,
    /// Parts published because their switch sent nothing for `idle_publish_ms` (the switch's
    /// slot is given up).
    rotations_idle,
    /// Rows refused because `max_switches` other switches were being written (a new switch id
    /// gets a slot once one goes idle).
    shed_switch_limit_rows,
    /// Rows refused because new switch ids came faster than `new_switches_per_s` (once the
    /// first `max_switches` were admitted).
    shed_switch_rate_rows,
    /// New switch ids refused (once per id per decoder batch), for either reason.
    switch_refusals,
    /// Switches being written now (gauge; at most `max_switches`).
    open_switches,
    /// Files open now (gauge; at most 3 × `max_switches`).
    open_files,
    /// Row groups flushed early because buffered rows reached half the memory budget.
    budget_row_group_flushes,
    /// Bytes of batches waiting in the queue now (gauge).
    queued_bytes,
    /// Bytes buffered in unfinished row groups now (gauge).
    writer_bytes,
    /// Temporary parts of a killed writer removed at start.
    stale_temp_files_removed,
    /// Bytes of those.
    stale_temp_bytes_removed,
    /// Files deleted by retention.
    retention_files_deleted,
    /// Bytes deleted by retention.
    retention_bytes_deleted,
    /// Bytes of published INT history now (gauge).
    history_bytes,
}

impl IntSinkStats {
    /// Every shed row.
    pub fn shed_rows(&self) -> u64 {
        self.shed_queue_full_rows
            + self.shed_queue_timeout_rows
            + self.shed_memory_budget_rows
            + self.shed_closed_rows
            + self.shed_switch_limit_rows
            + self.shed_switch_rate_rows
    }

    /// Every row accepted but not written.
    pub fn lost_rows(&self) -> u64 {
        self.lost_disk_full_rows + self.lost_write_error_rows
    }
}
