//! Rate-limited logging: a repeated warning goes out at most once per interval, and the next
//! line that does go out says how many were held back. One implementation for every stage
//! (the Parquet writer, COUNTERS_DB, upload, OTLP, INT, the genl source).

use std::{
    sync::atomic::{AtomicU64, Ordering::Relaxed},
    time::{Duration, Instant},
};

/// For one thread: `allow()` says whether to log now.
#[derive(Debug, Clone)]
pub struct LogLimiter {
    every: Duration,
    last: Option<Instant>,
    suppressed: u64,
}

impl LogLimiter {
    pub const fn new(every: Duration) -> Self {
        Self {
            every,
            last: None,
            suppressed: 0,
        }
    }

    /// `Some(lines held back since the last one)` when this one may be logged now.
    pub fn allow(&mut self) -> Option<u64> {
        self.allow_at(Instant::now())
    }

    /// [`allow`](Self::allow) at a given instant (for callers that already read the clock).
    pub fn allow_at(&mut self, now: Instant) -> Option<u64> {
        if self
            .last
            .is_some_and(|l| now.saturating_duration_since(l) < self.every)
        {
            self.suppressed += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.suppressed))
    }

    /// Forgets the last line: the next one is logged (a state change worth saying at once).
    pub fn reset(&mut self) {
        self.last = None;
        self.suppressed = 0;
    }
}

/// For a warning logged from many threads (no lock): at most one of them logs per interval.
#[derive(Debug)]
pub struct SharedLogLimiter {
    start: Instant,
    every_ms: u64,
    /// ms since `start` of the last line, plus `every_ms` (0: never logged).
    last_ms: AtomicU64,
}

impl SharedLogLimiter {
    pub fn new(every: Duration) -> Self {
        Self {
            start: Instant::now(),
            every_ms: every.as_millis() as u64,
            last_ms: AtomicU64::new(0),
        }
    }

    /// Whether this caller may log now.
    pub fn allow(&self) -> bool {
        let now = self.start.elapsed().as_millis() as u64 + self.every_ms;
        let last = self.last_ms.load(Relaxed);
        now >= last + self.every_ms
            && self
                .last_ms
                .compare_exchange(last, now, Relaxed, Relaxed)
                .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_back_and_counts() {
        let mut l = LogLimiter::new(Duration::from_secs(10));
        let t0 = Instant::now();
        assert_eq!(l.allow_at(t0), Some(0));
        assert_eq!(l.allow_at(t0 + Duration::from_secs(1)), None);
        assert_eq!(l.allow_at(t0 + Duration::from_secs(9)), None);
        assert_eq!(l.allow_at(t0 + Duration::from_secs(10)), Some(2));
        l.reset();
        assert_eq!(l.allow_at(t0 + Duration::from_secs(11)), Some(0));
        let s = SharedLogLimiter::new(Duration::from_secs(3600));
        assert!(s.allow());
        assert!(!s.allow());
    }
}
