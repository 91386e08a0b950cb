//! [`IntSinkConfig`]: the INT table writer's settings, with production defaults.

use std::{path::PathBuf, time::Duration};

use ::parquet::{
    basic::{Compression, Encoding, ZstdLevel},
    file::properties::{EnabledStatistics, WriterProperties, WriterVersion},
    schema::types::ColumnPath,
};
use serde::{Deserialize, Serialize};

use crate::parquet::{Codec, ConfigError, WhenFull};

/// Writes the INT tables under
/// `dir/table=<int_reports|int_hops|int_drops>/switch=<id>/date=<yyyy-mm-dd>/hour=<hh>/part-<first_ns>-<seq>.parquet`
/// (see [`crate::paths::TableDir`]), one open file per (table, switch), from its own thread.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct IntSinkConfig {
    /// Root directory of the history (the INT tables live under `table=`). Empty (the default)
    /// = the counters' history root, which the daemon fills in.
    pub dir: PathBuf,
    /// Decoder batches the queue in front of the writer holds.
    pub queue_batches: usize,
    /// What `submit` does when the queue is full.
    pub when_full: WhenFull,
    /// Longest `submit` waits for room with `when_full = "block"`, in ms.
    pub block_timeout_ms: u64,
    /// A file is published once its encoded size reaches this many bytes.
    pub max_file_bytes: u64,
    /// A file is published at the latest this many ms after it was opened (bounds what a crash
    /// loses, plus what sits in the queue).
    pub flush_interval_ms: u64,
    /// A switch that sent no rows for this many ms has its open files published (so queries see
    /// a stopped sender's reports within seconds) and gives up its slot (`max_switches`).
    pub idle_publish_ms: u64,
    /// Switch ids written at once (each has up to one open file per table). Rows of a further
    /// switch id are refused (counted, reason `switch_limit`) until a switch goes idle for
    /// `idle_publish_ms`: the switch id is whatever a datagram says, so this is what bounds the
    /// open files and their memory when a sender floods made-up ids.
    pub max_switches: usize,
    /// New switch ids admitted per second once the first `max_switches` are in (a token bucket
    /// of `max_switches` tokens, refilled at this rate). Each new id costs files, directories
    /// and fsyncs when it is published; this bounds that work when made-up ids keep coming,
    /// so the switches already being written keep their writer. Rows refused for it are counted
    /// with reason `switch_rate`.
    pub new_switches_per_s: f64,
    /// Rows per row group.
    pub row_group_rows: usize,
    /// Page codec, applied where it shrinks a page (`store/INT.md`). Default `lz4`: on the
    /// encoder bench (`stel-bench int`) zstd level 3 gives 55 B/report at 1.6 M reports per
    /// CPU-second, LZ4 60 B at 2.2 M.
    pub compression: Codec,
    /// zstd level (1..=22).
    pub compression_level: i32,
    /// Bytes the sink may hold (queued batches plus unflushed row groups); a batch that would
    /// exceed it is shed (reason `memory_budget`); buffered row groups above half of it are
    /// flushed early.
    pub memory_budget_bytes: u64,
    /// Delete the oldest INT files while they take more than this (0 = no limit).
    pub retention_max_bytes: u64,
    /// Delete INT files published longer ago than this many seconds (0 = no limit).
    pub retention_max_age_s: u64,
    /// After a write error, wait this many ms before writing again (rows meanwhile are lost,
    /// counted).
    pub retry_interval_ms: u64,
}

impl Default for IntSinkConfig {
    fn default() -> Self {
        Self {
            dir: PathBuf::new(),
            queue_batches: 256,
            when_full: WhenFull::Block,
            block_timeout_ms: 50,
            max_file_bytes: 128 << 20,
            flush_interval_ms: 60_000,
            idle_publish_ms: 2_000,
            max_switches: 256,
            new_switches_per_s: 4.0,
            row_group_rows: 128 * 1024,
            compression: Codec::Lz4,
            compression_level: 3,
            memory_budget_bytes: 512 << 20,
            retention_max_bytes: 0,
            retention_max_age_s: 0,
            retry_interval_ms: 1000,
        }
    }
}

impl IntSinkConfig {
    /// Small and fast: for tests.
    pub fn for_test(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            queue_batches: 16,
            flush_interval_ms: 200,
            idle_publish_ms: 200,
            row_group_rows: 1024,
            memory_budget_bytes: 64 << 20,
            retry_interval_ms: 50,
            ..Self::default()
        }
    }

    pub(crate) fn flush_interval(&self) -> Duration {
        Duration::from_millis(self.flush_interval_ms.max(1))
    }

    pub(crate) fn idle_publish(&self) -> Duration {
        Duration::from_millis(self.idle_publish_ms.max(1))
    }

    /// Every problem at once.
    ///
    /// # Errors
    /// [`ConfigError`] listing each bad value.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut problems = Vec::new();
        if self.queue_batches == 0 {
            problems.push("queue_batches must be at least 1".to_string());
        }
        if self.max_switches == 0 {
            problems.push("max_switches must be at least 1".to_string());
        }
        if !(self.new_switches_per_s.is_finite() && self.new_switches_per_s > 0.0) {
            problems.push(format!(
                "new_switches_per_s {} must be a positive number",
                self.new_switches_per_s
            ));
        }
        if self.row_group_rows == 0 {
            problems.push("row_group_rows must be at least 1".to_string());
        }
        if self.max_file_bytes < 4096 {
            problems.push(format!(
                "max_file_bytes {} is below 4096; use a size in bytes such as 134217728",
                self.max_file_bytes
            ));
        }
        if self.compression == Codec::Zstd && !(1..=22).contains(&self.compression_level) {
            problems.push(format!(
                "compression_level {} is outside zstd's 1..=22",
                self.compression_level
            ));
        }
        if self.memory_budget_bytes < (1 << 20) {
            problems.push(format!(
                "memory_budget_bytes {} is below 1 MiB",
                self.memory_budget_bytes
            ));
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ConfigError { problems })
        }
    }

    /// Properties for parquet's `ArrowWriter` on the INT tables (what the sink used before its
    /// own encoder): the benchmark's baseline ([`super::encode::encode_with_arrow_writer`]).
    pub(crate) fn writer_properties(&self) -> WriterProperties {
        let compression = match self.compression {
            Codec::Zstd => {
                Compression::ZSTD(ZstdLevel::try_new(self.compression_level).unwrap_or_default())
            }
            Codec::Lz4 => Compression::LZ4_RAW,
            Codec::None => Compression::UNCOMPRESSED,
        };
        // Dictionaries only for the EVC strings: hashing every value of every column was the
        // writer's largest cost (perf: parquet's Interner::intern), and the integer columns
        // encode as well with DELTA_BINARY_PACKED (sorted times, constant or slowly changing
        // ids) plus the codec. Random-looking columns (hashes, addresses) stay PLAIN.
        let mut b = WriterProperties::builder()
            .set_writer_version(WriterVersion::PARQUET_2_0)
            .set_compression(compression)
            .set_max_row_group_row_count(Some(self.row_group_rows))
            .set_statistics_enabled(EnabledStatistics::Page)
            .set_dictionary_enabled(false);
        for c in ["evc_id", "evc_name"] {
            b = b.set_column_dictionary_enabled(ColumnPath::from(c), true);
        }
        for c in ["flow_key", "path_id", "src_addr", "dst_addr"] {
            b = b.set_column_encoding(ColumnPath::from(c), Encoding::PLAIN);
        }
        b.build()
    }
}
