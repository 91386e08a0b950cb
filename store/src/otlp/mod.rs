//! The OTLP metrics sink: the counters themselves, as SONiC's countersyncd sends them to an
//! OpenTelemetry collector — but as cumulative monotonic **sums** for counters and **gauges** for
//! levels (occupancy, watermarks; [`crate::sai::is_level`]), each data point carrying
//! `object_name`, `sai_stat` (the full SAI name) and `profile`, stamped with the snapshot's own
//! time from the stream. gRPC or HTTP/protobuf, TLS, headers, per-profile endpoints from
//! CONFIG_DB (`otel_endpoint`), and optionally the daemon's own metrics registry.
//!
//! ```text
//!  decode threads ──submit(Arc<CounterBatch>)──▶ bounded queue (try_send; full → when_full:
//!                                                  │  drop_newest | drop_oldest, counted)
//!                 exporter thread `stel-otlp` ◀────┘
//!    route by profile (CONFIG_DB otel_endpoint, else `endpoint`)
//!    rows per `resolution_ms` → protobuf written straight from the row-major batch
//!    (per-column prefixes encoded once per schema, see `encode`) into a pooled request buffer;
//!    a request goes at `max_points_per_request` points or `interval_ms` after its first point
//!                               │ one of `max_in_flight` request slots per endpoint
//!                               ▼
//!    I/O thread `stel-otlp-io` (current-thread tokio): tonic gRPC / reqwest HTTP, retries with
//!    exponential backoff and jitter up to `retry_max_elapsed_ms`, partial success counted
//! ```
//!
//! # Never stalls decode; an unreachable collector costs nothing upstream
//! `submit` is one `try_send`. When the collector is slower than the feed the exporter waits for
//! a request slot, the queue fills and sheds by `when_full`. When an endpoint fails, its requests
//! in flight retry with backoff, and data arriving meanwhile is dropped before it is encoded
//! (`unavailable`) unless a slot is free to probe with. Every dropped point is counted by
//! [`DropReason`]; once the sink has shut down `samples_received = samples_delivered +
//! samples_downsampled + dropped` (see [`OtlpStats`]).
//!
//! # Data model
//! One `ResourceMetrics` (`service.name = stel`, `service.version`, `host.name`) and one scope
//! (`stel`) per request; one `Metric` per (stat, run of rows) named `sai.<type>.<stat>`
//! (or countersyncd's `sai_counter_type_<t>_stat_<s>`, see [`MetricNames`]) with the full SAI
//! name as description and a UCUM unit (`By`, `{packet}`, `{cell}`, …). Values are `as_int`
//! (exact; a counter at or past 2^63 reads as negative, i.e. its two's complement). A sum's
//! start time is the first snapshot seen of its series; a value lower than the previous one is
//! a reset and starts the series anew at the previous snapshot's time.
//!
//! [`testutil`] runs a real OTLP receiver (`deploy/otlp_receiver.py`: grpcio and the
//! OpenTelemetry protobuf definitions from PyPI) for tests.

mod config;
mod encode;
#[cfg(feature = "redis")]
mod profiles;
mod sink;
pub mod testutil;
mod transport;

use std::path::PathBuf;

pub use config::{ConfigDbConfig, MetricNames, OtlpConfig, Protocol, TlsConfig, WhenFull};
pub use encode::{count_points, encode_requests, encode_response, parse_response};
#[cfg(feature = "redis")]
pub use profiles::PROFILE_TABLE;
pub use sink::{DropCounts, DropReason, OtlpSink, OtlpStats};

/// OTLP sink errors (only at start; at run time everything is retried or counted).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid otlp config: {0}")]
    Config(String),
    #[error("cannot start an otlp sink thread: {0}")]
    Spawn(#[source] std::io::Error),
}

/// A profile's own collector (CONFIG_DB `otel_endpoint`, `otel_certs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProfileEndpoint {
    pub endpoint: String,
    /// PEM CA file for the endpoint's TLS certificate.
    pub certs: Option<PathBuf>,
}
