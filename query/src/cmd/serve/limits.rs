//! What one query may use, and how every refusal is told and counted.
//!
//! Each refusal is a gRPC status with a code a client can branch on ([`Refusal::code`]) and a
//! message that says what to change ([`Stats::refuse`]); each is counted ([`Stats`], printed
//! when the server stops) and logged to stderr at most once a second per kind.

use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use datafusion::error::DataFusionError;
use tonic::{Code, Status};

use crate::error::{Error, Result};

/// The limits a query runs under.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Queries executing at once; one more is refused (not queued).
    pub max_queries: usize,
    /// Bytes the engine's memory-tracking operators (sorts, aggregations, joins) may hold per
    /// query; no spilling to disk.
    pub query_memory: usize,
    /// Wall time from the request to the last batch.
    pub query_timeout: Duration,
}

/// Why a request was refused or failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// No or a wrong bearer token (`UNAUTHENTICATED`).
    Unauthenticated,
    /// SQL the engine cannot parse or plan (`INVALID_ARGUMENT`).
    InvalidSql,
    /// A statement that would write or change state (`PERMISSION_DENIED`).
    ReadOnly,
    /// `--max-queries` queries already running (`RESOURCE_EXHAUSTED`).
    Busy,
    /// The query needed more than `--query-memory` (`RESOURCE_EXHAUSTED`).
    Memory,
    /// The query ran past `--query-timeout` (`DEADLINE_EXCEEDED`).
    Timeout,
    /// The server is stopping (`UNAVAILABLE`).
    ShuttingDown,
    /// Anything else the engine failed with (`INTERNAL`).
    Failed,
}

impl Refusal {
    /// Every kind, in the order the stop line prints them.
    pub const ALL: [Refusal; 8] = [
        Refusal::Unauthenticated,
        Refusal::InvalidSql,
        Refusal::ReadOnly,
        Refusal::Busy,
        Refusal::Memory,
        Refusal::Timeout,
        Refusal::ShuttingDown,
        Refusal::Failed,
    ];

    /// The name in counts and logs.
    pub fn name(self) -> &'static str {
        match self {
            Refusal::Unauthenticated => "unauthenticated",
            Refusal::InvalidSql => "invalid_sql",
            Refusal::ReadOnly => "read_only",
            Refusal::Busy => "busy",
            Refusal::Memory => "memory",
            Refusal::Timeout => "timeout",
            Refusal::ShuttingDown => "shutting_down",
            Refusal::Failed => "failed",
        }
    }

    /// The gRPC code clients see.
    pub fn code(self) -> Code {
        match self {
            Refusal::Unauthenticated => Code::Unauthenticated,
            Refusal::InvalidSql => Code::InvalidArgument,
            Refusal::ReadOnly => Code::PermissionDenied,
            Refusal::Busy | Refusal::Memory => Code::ResourceExhausted,
            Refusal::Timeout => Code::DeadlineExceeded,
            Refusal::ShuttingDown => Code::Unavailable,
            Refusal::Failed => Code::Internal,
        }
    }

    fn index(self) -> usize {
        Refusal::ALL.iter().position(|r| *r == self).unwrap_or(0)
    }
}

/// Counters of one server run.
#[derive(Debug, Default)]
pub struct Stats {
    /// Statements received for execution (`DoGet` of a query).
    pub queries: AtomicU64,
    /// Statements whose results were sent to the end.
    pub completed: AtomicU64,
    /// Rows sent.
    pub rows: AtomicU64,
    refused: [AtomicU64; Refusal::ALL.len()],
    /// Last log time per kind (ms since `started`), for the once-a-second limit.
    last_log_ms: [AtomicU64; Refusal::ALL.len()],
    started: Option<Instant>,
}

impl Stats {
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            started: Some(Instant::now()),
            ..Self::default()
        })
    }

    /// How many requests were refused for `r`.
    pub fn refused(&self, r: Refusal) -> u64 {
        self.refused[r.index()].load(Ordering::Relaxed)
    }

    /// Counts and logs a refusal; returns the status to send.
    pub fn refuse(&self, r: Refusal, message: impl Into<String>) -> Status {
        let message = message.into();
        let n = self.refused[r.index()].fetch_add(1, Ordering::Relaxed) + 1;
        let now = self
            .started
            .map_or(0, |s| s.elapsed().as_millis() as u64 + 1_000);
        let last = &self.last_log_ms[r.index()];
        let prev = last.load(Ordering::Relaxed);
        if now >= prev + 1_000
            && last
                .compare_exchange(prev, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            eprintln!(
                "stel-query: serve: refused ({}, {} so far): {message}",
                r.name(),
                n
            );
        }
        Status::new(r.code(), message)
    }

    /// The counts as one line (`key=value`), printed when the server stops.
    pub fn line(&self) -> String {
        let mut s = format!(
            "queries={} completed={} rows={}",
            self.queries.load(Ordering::Relaxed),
            self.completed.load(Ordering::Relaxed),
            self.rows.load(Ordering::Relaxed)
        );
        for r in Refusal::ALL {
            s.push_str(&format!(" {}={}", r.name(), self.refused(r)));
        }
        s
    }
}

/// What an engine error means for the client.
pub fn classify(e: &DataFusionError) -> Refusal {
    match e.find_root() {
        DataFusionError::ResourcesExhausted(_) => Refusal::Memory,
        DataFusionError::SQL(..)
        | DataFusionError::Plan(_)
        | DataFusionError::SchemaError(..)
        | DataFusionError::NotImplemented(_) => Refusal::InvalidSql,
        _ => Refusal::Failed,
    }
}

/// Parses a byte size: `1073741824`, `512MiB`, `1GiB`, `2G`, `64M`, `100k` (K, M, G, T are
/// powers of 1024, with or without `iB`/`B`).
///
/// # Errors
/// Anything else; the message shows the forms.
pub fn parse_bytes(s: &str) -> Result<usize> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let bad = || {
        Error::Usage(format!(
            "`{s}` is not a size; use bytes or a number with K, M, G or T (powers of 1024), e.g. 512MiB, 2G"
        ))
    };
    let n: f64 = num.parse().map_err(|_| bad())?;
    let unit = unit.trim().to_ascii_lowercase();
    let unit = unit
        .strip_suffix("ib")
        .or_else(|| unit.strip_suffix('b'))
        .unwrap_or(&unit);
    let mul: f64 = match unit {
        "" => 1.0,
        "k" => 1024.0,
        "m" => 1024.0 * 1024.0,
        "g" => 1024.0 * 1024.0 * 1024.0,
        "t" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        _ => return Err(bad()),
    };
    let v = n * mul;
    if !(1.0..1e18).contains(&v) {
        return Err(bad());
    }
    Ok(v as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_in_powers_of_1024() {
        assert_eq!(parse_bytes("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_bytes("2G").unwrap(), 2 << 30);
        assert_eq!(parse_bytes("1.5k").unwrap(), 1536);
        assert_eq!(parse_bytes("4096").unwrap(), 4096);
        assert!(parse_bytes("lots").is_err());
        assert!(parse_bytes("5 parsecs").is_err());
    }

    #[test]
    fn refusals_are_counted_with_their_codes() {
        let s = Stats::new();
        let st = s.refuse(Refusal::ReadOnly, "no writes");
        assert_eq!(st.code(), Code::PermissionDenied);
        assert_eq!(st.message(), "no writes");
        s.refuse(Refusal::ReadOnly, "again");
        assert_eq!(s.refused(Refusal::ReadOnly), 2);
        assert!(s.line().contains("read_only=2"), "{}", s.line());
        assert_eq!(
            classify(&DataFusionError::ResourcesExhausted("x".into())),
            Refusal::Memory
        );
        assert_eq!(
            classify(&DataFusionError::Plan("x".into())),
            Refusal::InvalidSql
        );
    }
}
