//! [`ParquetSinkConfig`]: everything the Parquet sink can be told, with production defaults.

use std::{path::PathBuf, time::Duration};

use ::parquet::{
    basic::{Compression as PqCompression, Encoding, ZstdLevel},
    file::properties::{EnabledStatistics, WriterProperties, WriterVersion},
};
use serde::{Deserialize, Serialize};

use super::ConfigError;

/// What [`super::ParquetSink::submit`] does when the queue is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WhenFull {
    /// Wait up to `block_timeout_ms` for room, then shed the batch (reason `queue_timeout`).
    /// Costs: the calling decode thread stalls for at most the timeout, which backs the socket
    /// buffer up; history is complete unless the disk is slower than the feed for longer.
    Block,
    /// Shed the batch at once (reason `queue_full`). Costs: history gets holes under overload;
    /// decode never waits.
    DropNewest,
}

/// Counter column encoding (the `ts` column always uses DELTA_BINARY_PACKED).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CounterEncoding {
    /// Bit-packed deltas: a rising counter costs only the bits of its per-interval increase.
    DeltaBinaryPacked,
    /// Bytes of each value split into streams: helps the compressor on noisy gauges.
    ByteStreamSplit,
    /// Plain little-endian u64, left to the compressor.
    Plain,
}

impl CounterEncoding {
    pub(crate) fn parquet(self) -> Encoding {
        match self {
            Self::DeltaBinaryPacked => Encoding::DELTA_BINARY_PACKED,
            Self::ByteStreamSplit => Encoding::BYTE_STREAM_SPLIT,
            Self::Plain => Encoding::PLAIN,
        }
    }
}

/// Page compression codec.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Codec {
    /// zstd at `compression_level` (1..=22).
    Zstd,
    /// LZ4 (raw; `compression_level` ignored).
    Lz4,
    /// No compression.
    None,
}

/// Writes counter batches under
/// `dir/profile=<p>/group=<g>/date=<yyyy-mm-dd>/hour=<hh>/part-<first_ns>-<seq>.parquet`
/// (see [`crate::paths`]), one file per session at a time, from its own thread.
///
/// Defaults are production values measured on the emulator's counters (store/PERSISTENCE.md);
/// [`ParquetSinkConfig::for_test`] gives small, fast ones.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ParquetSinkConfig {
    /// Root directory of the history (created if missing).
    pub dir: PathBuf,
    /// Batches the queue between the decoders and the writer holds.
    pub queue_batches: usize,
    /// What `submit` does when the queue is full.
    pub when_full: WhenFull,
    /// Longest `submit` waits for room with `when_full = "block"`, in ms.
    pub block_timeout_ms: u64,
    /// A file is published once its encoded size reaches this many bytes (checked after each
    /// write, so a file may exceed it by one write of `write_batch_rows` rows).
    pub max_file_bytes: u64,
    /// A file is published at the latest this many ms after it was opened. This bounds what a
    /// SIGKILL or power loss can take (plus what sits in the queue).
    pub flush_interval_ms: u64,
    /// Rows (snapshots) per row group.
    pub row_group_rows: usize,
    /// Decoder batches of a session are coalesced until they hold this many rows (or waited
    /// 200 ms) before they are encoded (1 = write each batch as it comes). Worth raising for
    /// sessions whose decoder batches are only a few rows.
    pub write_batch_rows: usize,
    /// Rows per data page.
    pub page_rows: usize,
    /// Encoding of the counter columns.
    pub encoding: CounterEncoding,
    /// Compression codec.
    pub compression: Codec,
    /// Compression level (zstd: 1..=22).
    pub compression_level: i32,
    /// Memory the sink may hold, in bytes: queued batches plus rows being encoded. When a batch
    /// would exceed it, `submit` sheds it (reason `memory_budget`); when the writer's buffered row
    /// groups exceed half of it, they are flushed early. The seed's sizing formula is
    /// `cache × chunk × 8 B × objects × stats` ([`ParquetSinkConfig::seed_budget`]).
    pub memory_budget_bytes: u64,
    /// Delete the oldest files while the history is larger than this (0 = no limit).
    pub retention_max_bytes: u64,
    /// Delete files published longer ago than this many seconds (0 = no limit).
    pub retention_max_age_s: u64,
    /// After a write error (disk full, I/O error), wait this many ms before writing again;
    /// batches arriving meanwhile are counted as not written.
    pub retry_interval_ms: u64,
    /// Switch identity written into every file; the host name when unset.
    pub switch_name: Option<String>,
    /// Threads that encode a row group's column chunks (the writer thread is one of them);
    /// 0 = one per CPU. Column ranges are independent, so encoding scales with cores; file
    /// order and atomic publish are the writer's.
    pub encode_threads: usize,
    /// Test knob: the writer sleeps this long (µs) before each batch it writes, to show that a
    /// slow history never stalls the decoders (0 = off; never set it in production).
    pub test_write_delay_us: u64,
    /// The data dir's disk budget shared with the rollup tiers (set by the daemon from
    /// `[retention]`, not a key of this section): raw keeps what the tiers leave.
    #[serde(skip)]
    pub disk_budget: crate::retention::BudgetHandle,
    /// Each port's speed in Mb/s (set by the daemon from SONiC's PORT tables, not a key of this
    /// section), written into every file's footer ([`super::keys::PORT_SPEED_MBPS`]).
    #[serde(skip)]
    pub port_speeds_mbps: std::collections::BTreeMap<String, u64>,
}

impl Default for ParquetSinkConfig {
    fn default() -> Self {
        Self {
            dir: PathBuf::from("/var/lib/stel"),
            queue_batches: 1024,
            // The decoders never wait on history: a burst is absorbed by the memory budget
            // (1 GiB ≈ 0.7 s of the design rate on top of what the writer keeps up with), then
            // whole batches are shed, counted and logged. `block` made the decode thread wait up
            // to 50 ms and COUNTERS_DB's lag p99 miss 10 ms (issue 13).
            when_full: WhenFull::DropNewest,
            block_timeout_ms: 50,
            max_file_bytes: 256 << 20,
            flush_interval_ms: 10_000,
            row_group_rows: 16_384,
            // Measured with ArrowWriter: coalescing decoder batches (546 rows at the design
            // session) to 4,096 rows cost more (a copy) than it saved (24.9 vs 39.3 M samples per
            // CPU-second); the column-chunk encoder has no per-call cost left to amortise.
            write_batch_rows: 1,
            page_rows: 8_192,
            encoding: CounterEncoding::DeltaBinaryPacked,
            // Measured (store/PERSISTENCE.md): on DELTA_BINARY_PACKED pages LZ4 costs almost
            // nothing over no compression and lands at 0.008–0.034 B/sample; zstd saves up to
            // a third of that for ~30 % more CPU, which the design rate cannot spare.
            compression: Codec::Lz4,
            compression_level: 1,
            memory_budget_bytes: 1 << 30,
            retention_max_bytes: 0,
            retention_max_age_s: 0,
            retry_interval_ms: 1_000,
            switch_name: None,
            encode_threads: 0,
            test_write_delay_us: 0,
            disk_budget: crate::retention::BudgetHandle::default(),
            port_speeds_mbps: std::collections::BTreeMap::new(),
        }
    }
}

impl ParquetSinkConfig {
    /// Small and fast: for tests under `dir`.
    pub fn for_test(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            queue_batches: 64,
            // Tests count every sample: they wait for room rather than shed.
            when_full: WhenFull::Block,
            block_timeout_ms: 5_000,
            max_file_bytes: 4 << 20,
            flush_interval_ms: 60_000,
            row_group_rows: 1_024,
            write_batch_rows: 256,
            page_rows: 512,
            memory_budget_bytes: 256 << 20,
            retry_interval_ms: 50,
            switch_name: Some("test-switch".into()),
            ..Self::default()
        }
    }

    /// The seed's memory formula: `cache` batches of `chunk` snapshots of `objects × stats`
    /// 8-byte counters.
    pub fn seed_budget(cache: u64, chunk: u64, objects: u64, stats: u64) -> u64 {
        cache
            .saturating_mul(chunk)
            .saturating_mul(8)
            .saturating_mul(objects)
            .saturating_mul(stats)
    }

    /// Every problem with this config, in one go.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut problems = Vec::new();
        if self.dir.as_os_str().is_empty() {
            problems.push("dir is empty".to_string());
        }
        if self.queue_batches == 0 {
            problems.push("queue_batches must be at least 1".into());
        }
        if self.row_group_rows == 0 {
            problems.push("row_group_rows must be at least 1".into());
        }
        if self.write_batch_rows == 0 {
            problems.push("write_batch_rows must be at least 1".into());
        }
        if self.page_rows == 0 {
            problems.push("page_rows must be at least 1".into());
        }
        if self.max_file_bytes == 0 {
            problems.push("max_file_bytes must be at least 1".into());
        }
        if self.flush_interval_ms == 0 {
            problems.push("flush_interval_ms must be at least 1".into());
        }
        if self.memory_budget_bytes == 0 {
            problems.push("memory_budget_bytes must be at least 1".into());
        }
        if self.compression == Codec::Zstd && ZstdLevel::try_new(self.compression_level).is_err() {
            problems.push(format!(
                "compression_level {} is not a zstd level (1..=22)",
                self.compression_level
            ));
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ConfigError { problems })
        }
    }

    /// `encode_threads` resolved (0 = one per CPU).
    pub fn encode_threads(&self) -> usize {
        if self.encode_threads > 0 {
            self.encode_threads
        } else {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        }
    }

    pub(crate) fn flush_interval(&self) -> Duration {
        Duration::from_millis(self.flush_interval_ms)
    }

    /// Parquet writer properties for counter files.
    pub fn writer_properties(&self) -> WriterProperties {
        let compression = match self.compression {
            Codec::Zstd => {
                PqCompression::ZSTD(ZstdLevel::try_new(self.compression_level).unwrap_or_default())
            }
            Codec::Lz4 => PqCompression::LZ4_RAW,
            Codec::None => PqCompression::UNCOMPRESSED,
        };
        WriterProperties::builder()
            .set_writer_version(WriterVersion::PARQUET_2_0)
            .set_dictionary_enabled(false)
            .set_encoding(self.encoding.parquet())
            .set_column_encoding(
                crate::schema::TS_COLUMN.into(),
                Encoding::DELTA_BINARY_PACKED,
            )
            .set_compression(compression)
            .set_max_row_group_row_count(Some(self.row_group_rows))
            .set_data_page_row_count_limit(self.page_rows)
            .set_write_batch_size(self.page_rows.min(8_192))
            // Chunk min/max let readers prune row groups by time and value; page-level
            // statistics and indexes cost a lot per column × page for little more.
            .set_statistics_enabled(EnabledStatistics::Chunk)
            .set_offset_index_disabled(true)
            .set_created_by(concat!("stel ", env!("CARGO_PKG_VERSION")).to_string())
            .build()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_fields_rejected_and_defaults_filled() {
        let c: ParquetSinkConfig =
            serde_json::from_str(r#"{"dir":"/d","when_full":"drop_newest"}"#).unwrap();
        assert_eq!(c.when_full, WhenFull::DropNewest);
        assert_eq!(
            c.row_group_rows,
            ParquetSinkConfig::default().row_group_rows
        );
        let e = serde_json::from_str::<ParquetSinkConfig>(r#"{"dirr":"/d"}"#).unwrap_err();
        assert!(e.to_string().contains("unknown field `dirr`"), "{e}");
    }

    #[test]
    fn validation_lists_every_problem() {
        let c = ParquetSinkConfig {
            queue_batches: 0,
            compression: Codec::Zstd,
            compression_level: 40,
            ..ParquetSinkConfig::default()
        };
        let e = c.validate().unwrap_err();
        assert_eq!(e.problems.len(), 2, "{e}");
        assert!(e.to_string().contains("compression_level 40"), "{e}");
        ParquetSinkConfig::default().validate().unwrap();
        ParquetSinkConfig::for_test("/tmp/x").validate().unwrap();
    }

    #[test]
    fn seed_budget_formula() {
        // 4 cached chunks of 128 snapshots of 64 ports × 30 stats.
        assert_eq!(ParquetSinkConfig::seed_budget(4, 128, 64, 30), 7_864_320);
    }
}
