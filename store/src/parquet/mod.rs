//! The Parquet sink: counter batches → wide Parquet files in a Hive layout, off the decode threads.
//!
//! ```text
//! decode threads ──submit(Arc<CounterBatch>)──▶ bounded queue ──▶ writer thread
//!   (never block longer than block_timeout;       (queue_batches,   per session: chunk encoder
//!    shed batches counted by reason)               memory budget)   (row-major → pages) → .part-….tmp
//!                                                                   → fsync → rename → fsync dir
//! ```
//!
//! * [`config`]: [`ParquetSinkConfig`] (serde, `deny_unknown_fields`, production defaults).
//! * [`sink`]: [`ParquetSink`], the queue, the writer thread, shed accounting, [`accounting`].
//! * `chunk`: the column-chunk encoder (row-major batches → DELTA pages → column chunks spliced
//!   into the file, column ranges encoded on a small thread pool; [`encode_in_memory`] for
//!   benchmarks).
//! * `simd`: the DELTA block kernels (AVX-512 / AVX2 / portable, chosen at run time); the only
//!   module of the crate with `unsafe`.
//! * [`writer`]: one open part per session (rotation by schema, hour, size and age; atomic
//!   publish), recovery at start (stale temp files, loss report), retention.
//!
//! The crash story is in `store/PERSISTENCE.md`.

use std::path::PathBuf;

pub(crate) mod chunk;
pub mod config;
#[allow(unsafe_code)]
pub(crate) mod simd;
pub mod sink;
pub mod writer;

pub use chunk::{encode_in_memory, kernel_name, FileEncoder};
pub(crate) use chunk::{EncodeOptions, PagedChunk, SeriesPage};
pub use config::{Codec, CounterEncoding, ParquetSinkConfig, WhenFull};
pub use sink::{accounting, ParquetSink, Shed, ShedReason};
pub use writer::{RecoveryReport, SessionRecovery};

// The footer keys are the session schema's (`crate::schema::keys`); re-exported where the files
// are written.
pub use crate::schema::keys;

/// A config that cannot be used; lists every problem.
#[derive(Debug, thiserror::Error)]
#[error("invalid parquet sink config: {}", problems.join("; "))]
pub struct ConfigError {
    pub problems: Vec<String>,
}

/// Errors of the Parquet sink. Write errors while running are not errors of the API: they are
/// counted (`stel_sink_dropped_samples_total{sink="parquet"}`) and logged, and the sink keeps going.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("cannot write the history under {path}: {source}")]
    CreateDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot start the parquet writer thread: {0}")]
    Spawn(std::io::Error),
    #[error("the parquet writer thread panicked")]
    WriterPanicked,
}

/// `Result` with this module's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
