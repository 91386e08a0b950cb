use std::sync::atomic::{AtomicU64, Ordering};

/// Bucket width, µs.
const BUCKET_US: u64 = 100;
/// Buckets below the overflow bucket: 0..100 ms at 0.1 ms resolution.
const BUCKETS: usize = 1000;

/// A lock-free latency histogram: 0.1 ms buckets up to 100 ms, an overflow bucket, and the max.
/// Written by one thread, read by any (`stats()`); quantiles are bucket upper edges, so they
/// never under-report.
#[derive(Debug)]
pub struct LagHistogram {
    buckets: Box<[AtomicU64]>,
    count: AtomicU64,
    max_us: AtomicU64,
}

impl Default for LagHistogram {
    fn default() -> Self {
        Self {
            buckets: (0..=BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            count: AtomicU64::new(0),
            max_us: AtomicU64::new(0),
        }
    }
}

impl LagHistogram {
    pub fn record_us(&self, us: u64) {
        let i = ((us / BUCKET_US) as usize).min(BUCKETS);
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
        self.max_us.fetch_max(us, Ordering::Relaxed);
    }

    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    pub fn max_ms(&self) -> f64 {
        self.max_us.load(Ordering::Relaxed) as f64 / 1e3
    }

    /// The `q` quantile (0..=1) in ms: the upper edge of the bucket holding it (the max when it
    /// lies in the overflow bucket). 0 with no samples.
    pub fn quantile_ms(&self, q: f64) -> f64 {
        let counts: Vec<u64> = self
            .buckets
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect();
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return 0.0;
        }
        let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, c) in counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                if i == BUCKETS {
                    return self.max_ms();
                }
                let edge = ((i as u64 + 1) * BUCKET_US) as f64 / 1e3;
                return edge.min(self.max_ms());
            }
        }
        self.max_ms()
    }

    /// Forgets every sample (e.g. after a warm-up).
    pub fn reset(&self) {
        for b in self.buckets.iter() {
            b.store(0, Ordering::Relaxed);
        }
        self.count.store(0, Ordering::Relaxed);
        self.max_us.store(0, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles() {
        let h = LagHistogram::default();
        assert_eq!(h.quantile_ms(0.99), 0.0);
        for us in 0..1000 {
            h.record_us(us * 10); // 0 .. 9.99 ms uniform
        }
        assert!(
            (h.quantile_ms(0.5) - 5.0).abs() <= 0.1,
            "{}",
            h.quantile_ms(0.5)
        );
        assert!(
            (h.quantile_ms(0.99) - 9.9).abs() <= 0.1,
            "{}",
            h.quantile_ms(0.99)
        );
        h.record_us(500_000);
        assert_eq!(h.max_ms(), 500.0);
        assert_eq!(h.quantile_ms(1.0), 500.0);
        h.reset();
        assert_eq!(h.count(), 0);
    }
}
