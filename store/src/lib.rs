//! stel-store: what decoded counters look like and where they go.
//!
//! Data flows through this crate in this order: [`sai`] names the (object type, stat) pairs a
//! template carries; [`schema`] describes one session's snapshot (timestamp + counters) as Arrow;
//! [`batch`] builds row-major counter batches that the decoders fill without allocating and that
//! become Arrow record batches without copying. The Parquet sink, the COUNTERS_DB/RATES writer and
//! the rate math land here too, so `stel-query` can read what the daemon wrote without linking the
//! daemon. [`live`] holds the newest snapshot of each session and serves it over a unix socket
//! (the daemon's live inspect endpoint; `stel-query inspect` is its client), `upload`
//! (feature `upload`) copies published Parquet files to a data lake (a directory or S3), and
//! `otlp` (feature `otlp`) sends the counters to an OpenTelemetry collector.
//! [`int`] holds the INT telemetry-report tables (`int_reports`, `int_hops`, `int_drops`) and
//! their writer.
//!
//! It is its own crate because both the daemon (`stel-ingest`) and the query tool (`stel-query`)
//! need the schema and names, and the query tool must never link the daemon's kernel plumbing.
// `deny`, not `forbid`: exactly two modules (`parquet::simd`, the encoder's runtime-dispatched
// SIMD kernels, and `rollup::kernel`, the rollups' row kernel) are allowed unsafe code, each
// block with a SAFETY note; see those modules.
#![deny(unsafe_code)]

pub mod batch;
pub mod durable;
pub mod hft;
pub mod int;
pub mod live;
pub mod log_limit;
pub mod metrics;
#[cfg(feature = "otlp")]
pub mod otlp;
pub mod parquet;
pub mod paths;
pub mod prometheus;
pub mod rate;
pub mod redact;
mod retention;
pub mod rollup;
pub mod sai;
pub mod schema;
#[cfg(feature = "redis")]
pub mod sonic;
pub mod units;
#[cfg(feature = "upload")]
pub mod upload;

pub use batch::{BatchBuilder, BatchShapeError, CounterBatch};
pub use retention::{BudgetHandle, DiskBudget};
pub use schema::{CounterColumn, SessionSchema};
