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
mod simd;
pub mod sink;
pub mod writer;

pub use chunk::{encode_in_memory, kernel_name, FileEncoder};
pub(crate) use chunk::{EncodeOptions, PagedChunk, SeriesPage};
pub use config::{Codec, CounterEncoding, ParquetSinkConfig, WhenFull};
pub use sink::{accounting, ParquetSink, Shed, ShedReason};
pub use writer::{RecoveryReport, SessionRecovery};

/// Key-value metadata keys written into every file's footer (besides Arrow's `ARROW:schema`,
/// which carries the per-column `stel.*` field metadata).
pub mod keys {
    /// HFT profile (unescaped).
    pub const PROFILE: &str = "stel.profile";
    /// HFT group (unescaped).
    pub const GROUP: &str = "stel.group";
    /// IPFIX observation domain.
    pub const DOMAIN: &str = "stel.domain";
    /// Template IDs of the snapshot's parts, comma-separated, in column order.
    pub const TEMPLATE_IDS: &str = "stel.template_ids";
    /// Session schema generation (changes whenever the templates change).
    pub const GENERATION: &str = "stel.generation";
    /// stel version that wrote the file.
    pub const VERSION: &str = "stel.version";
    /// Switch identity (config `switch_name` or the host name).
    pub const SWITCH: &str = "stel.switch";
    /// JSON object `{"<label>": "<object name>", …}`.
    pub const OBJECTS: &str = "stel.objects";
    /// JSON object `{"<SHORT>": "<SAI_…_STAT_…>", …}`: column suffix → SAI stat name.
    pub const SAI_NAMES: &str = "stel.sai_names";
    /// First and last timestamp in the file (ns since the epoch), rows and counter values.
    pub const FIRST_NS: &str = "stel.first_ns";
    pub const LAST_NS: &str = "stel.last_ns";
    pub const ROWS: &str = "stel.rows";
    pub const SAMPLES: &str = "stel.samples";
    /// Values that are null because a split snapshot's part never arrived.
    pub const MISSING_SAMPLES: &str = "stel.missing_samples";
    /// JSON object `{"<port>": <Mb/s>, …}`: each port's speed from SONiC's PORT tables when the
    /// daemon read them (absent otherwise); stel-query's utilisation uses it.
    pub const PORT_SPEED_MBPS: &str = "stel.port_speed_mbps";
}

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
