//! The daemon's own figures in the metrics registry ([`stel_store::metrics`]), published once
//! per status tick from the [`DaemonStatus`] the main loop already builds (and from the INT
//! source's counters), so `/metrics` (Prometheus), OTLP's own-metrics export and the status
//! file tell the same numbers. Not on the data path: one registry lookup per series per tick.
//!
//! Labels are bounded: the source kind, reasons from closed enums, sink names.
use std::{
    borrow::Cow,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::SystemTime,
};

use stel_store::{
    labels,
    metrics::{Label, Metric, Registry},
};

use crate::{
    config::SourceKind, daemon::DaemonStatus, decode::Malformed, int::source::IntSourceStats,
};

/// The bounded `source` label value of a source kind.
pub fn source_label(k: SourceKind) -> &'static str {
    match k {
        SourceKind::Genl => "genl",
        SourceKind::Usersock => "usersock",
        SourceKind::Demo => "demo",
        SourceKind::File => "file",
        SourceKind::None => "none",
    }
}

/// Whether the data path is live, as `/health` reports it: set by the main loop each tick;
/// a main loop that stops ticking makes it unhealthy by itself.
#[derive(Debug)]
pub struct Health {
    /// Unix seconds of the main loop's last tick.
    last_tick_s: AtomicU64,
    verdict: Mutex<Result<(), String>>,
    /// Longest a tick may be late before the data path counts as stalled, s.
    stall_s: u64,
}

fn unix_s() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl Health {
    pub fn new(stall_s: u64) -> Arc<Self> {
        Arc::new(Self {
            last_tick_s: AtomicU64::new(unix_s()),
            verdict: Mutex::new(Ok(())),
            stall_s,
        })
    }

    /// The main loop's verdict this tick.
    pub fn set(&self, v: Result<(), String>) {
        self.last_tick_s.store(unix_s(), Ordering::Relaxed);
        *self.verdict.lock().unwrap_or_else(|e| e.into_inner()) = v;
    }

    /// `Ok` while live; else why not (for `/health`'s 503 body).
    pub fn check(&self) -> Result<(), String> {
        let late = unix_s().saturating_sub(self.last_tick_s.load(Ordering::Relaxed));
        if late > self.stall_s {
            return Err(format!(
                "the main loop has not ticked for {late} s (reader stalled)"
            ));
        }
        self.verdict
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// Publishes a tick's figures into the registry.
#[derive(Debug)]
pub struct StatusMetrics {
    registry: Arc<Registry>,
    source: &'static str,
}

impl StatusMetrics {
    pub fn new(registry: Arc<Registry>, source: SourceKind) -> Self {
        Self {
            registry,
            source: source_label(source),
        }
    }

    fn total(&self, m: Metric, labels: &[(Label, Cow<'static, str>)], v: u64) {
        self.registry.counter(m, labels).set_total(v);
    }

    /// Sets every series from this tick's status (`healthy`: what `/health` says now).
    pub fn publish(&self, st: &DaemonStatus, int: Option<&IntSourceStats>, healthy: bool) {
        let src = self.source;
        self.total(
            Metric::ReaderDatagrams,
            labels!(Source = src),
            st.recv.datagrams,
        );
        self.total(Metric::ReaderBytes, labels!(Source = src), st.recv.bytes);
        self.total(
            Metric::ReaderTruncatedDatagrams,
            labels!(Source = src),
            st.recv.truncated,
        );
        self.total(
            Metric::ReaderKernelDroppedDatagrams,
            labels!(Source = src),
            st.kernel_drops,
        );
        self.total(
            Metric::FilterKeptMessages,
            labels!(Source = src),
            st.filter.kept,
        );
        self.total(
            Metric::FilterDroppedMessages,
            labels!(Source = src),
            st.filter.dropped,
        );
        self.total(
            Metric::DispatchShedMessages,
            labels!(Reason = "decoder_full"),
            st.pipeline.dispatch.shed_decoder_full,
        );
        let d = &st.pipeline.decode;
        self.total(Metric::DecodeMessages, labels!(), d.messages);
        self.total(Metric::DecodeRecords, labels!(), d.records);
        self.total(Metric::DecodeValues, labels!(), d.counters);
        self.total(
            Metric::DecodeSeqLostMessages,
            labels!(),
            d.seq_lost_messages,
        );
        for r in Malformed::ALL {
            self.total(
                Metric::DecodeMalformed,
                labels!(Reason = r.name()),
                d.malformed(r),
            );
        }
        self.registry
            .gauge(Metric::SessionRegisteredSessions, labels!())
            .set(st.sessions as u64);
        // Sinks report plain JSON; the Parquet history's fields are fixed names.
        if let Some(p) = st.sinks.get("parquet").and_then(|v| v.as_object()) {
            let f = |k: &str| p.get(k).and_then(serde_json::Value::as_u64).unwrap_or(0);
            self.total(
                Metric::SinkWrittenSamples,
                labels!(Sink = "parquet"),
                f("samples_written"),
            );
            self.total(
                Metric::SinkPublishedFiles,
                labels!(Sink = "parquet"),
                f("files_published"),
            );
            for reason in ["queue_full", "queue_timeout", "memory_budget", "closed"] {
                self.total(
                    Metric::SinkDroppedSamples,
                    labels!(Sink = "parquet", Reason = reason),
                    f(&format!("shed_{reason}_samples")),
                );
            }
        }
        if let Some(i) = int {
            self.total(
                Metric::ReaderDatagrams,
                labels!(Source = "int"),
                i.recv.datagrams,
            );
            self.total(Metric::ReaderBytes, labels!(Source = "int"), i.recv.bytes);
            self.total(
                Metric::ReaderTruncatedDatagrams,
                labels!(Source = "int"),
                i.recv.truncated,
            );
            self.total(
                Metric::ReaderKernelDroppedDatagrams,
                labels!(Source = "int"),
                i.kernel_drops,
            );
            self.total(
                Metric::IntDecodedReports,
                labels!(),
                i.decode.reports_decoded,
            );
            self.total(Metric::IntDecodedHops, labels!(), i.decode.hops);
            self.total(Metric::IntSeqLostReports, labels!(), i.decode.seq_lost);
            for r in crate::int::Malformed::ALL {
                self.total(
                    Metric::IntMalformedReports,
                    labels!(Reason = r.name()),
                    i.decode.malformed(*r),
                );
            }
            self.total(
                Metric::SinkWrittenSamples,
                labels!(Sink = "int"),
                i.sink.rows_written,
            );
            self.total(
                Metric::SinkPublishedFiles,
                labels!(Sink = "int"),
                i.sink.files_published,
            );
        }
        self.registry
            .gauge(Metric::DaemonHealthyState, labels!())
            .set(u64::from(healthy));
    }
}
