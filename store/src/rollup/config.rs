//! [`RollupConfig`]: the tiers, the burst rule and the sink's queue, with production defaults.

use serde::{Deserialize, Serialize};

use crate::parquet::WhenFull;
use crate::units::{parse_duration_ns, parse_speed_mbps};

/// One tier: its interval, how much of it one file covers, its retention.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TierConfig {
    /// Interval (`1s`, `10s`, `1m`, `1h`): rows are per interval, aligned to multiples of it
    /// since the epoch. Every tier is a whole multiple of the finest one.
    pub interval: String,
    /// How much time one file covers (`1h`, `1d`; never more than a UTC day). Empty: 1 h for
    /// tiers under a minute, else 1 d. A SIGKILL loses the open file of each tier.
    #[serde(default)]
    pub file_span: String,
    /// Delete this tier's oldest files while it holds more than this many bytes (0 = no limit).
    #[serde(default)]
    pub retention_max_bytes: u64,
    /// Delete this tier's files whose data is older than this many seconds (0 = no limit).
    #[serde(default)]
    pub retention_max_age_s: u64,
}

impl TierConfig {
    /// A tier of `interval` with the default span and no retention limit.
    pub fn new(interval: &str) -> Self {
        Self {
            interval: interval.into(),
            file_span: String::new(),
            retention_max_bytes: 0,
            retention_max_age_s: 0,
        }
    }
}

/// `[rollup]`: burst-preserving rollups of every session, written next to the raw history
/// (`store/ROLLUPS.md`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RollupConfig {
    /// Write the tiers (needs the Parquet history: they live in its directory).
    pub enabled: bool,
    /// The tiers, finest first.
    pub tiers: Vec<TierConfig>,
    /// Port speed that utilisation is measured against (`100G`, `25G`, or Mb/s), as
    /// `stel-query --speed`.
    pub speed: String,
    /// Burst thresholds, % of `speed` (each gets its burst columns).
    pub thresholds: Vec<f64>,
    /// Batches the queue in front of the rollup thread holds.
    pub queue_batches: usize,
    /// What `submit` does when the queue is full (`drop_newest`: never waits; a shed batch is
    /// counted and shows in the tiers as lost snapshots).
    pub when_full: WhenFull,
    /// Longest `submit` waits for room with `when_full = "block"`, ms.
    pub block_timeout_ms: u64,
    /// Sessions rolled up at once; a new session past it closes the least recently active
    /// one's files (counted: `stel_rollup_evicted_sessions_total`). Bounds memory against a
    /// flood of sessions.
    pub max_sessions: usize,
    /// Bytes the open tier files may hold (encoded pages of every session and tier); past it
    /// the oldest open files are published early (counted: `stel_rollup_memory_flushes_total`).
    pub memory_budget_bytes: u64,
}

impl Default for RollupConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            tiers: vec![
                TierConfig {
                    retention_max_bytes: 8 << 30,
                    retention_max_age_s: 30 * 86_400,
                    ..TierConfig::new("1s")
                },
                TierConfig {
                    retention_max_bytes: 2 << 30,
                    retention_max_age_s: 400 * 86_400,
                    ..TierConfig::new("1m")
                },
            ],
            speed: "100G".into(),
            thresholds: vec![50.0, 90.0],
            queue_batches: 64,
            when_full: WhenFull::DropNewest,
            block_timeout_ms: 50,
            max_sessions: 64,
            memory_budget_bytes: 256 << 20,
        }
    }
}

/// A tier, resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tier {
    /// Canonical name (`1s`, `1m`): the `tier=` partition value.
    pub name: String,
    pub interval_ns: i64,
    /// Time one file covers, ns (divides a day, or is a day).
    pub file_span_ns: i64,
    pub retention_max_bytes: u64,
    pub retention_max_age_s: u64,
}

/// Nanoseconds in a day.
pub const NS_PER_DAY: i64 = 86_400_000_000_000;

/// `ns` spelled as the shortest whole number of one unit: `1s`, `10s`, `1m`, `90m`, `1h`,
/// `1d`, `500ms`, `10us`, `7ns`.
pub fn tier_name(ns: i64) -> String {
    const UNITS: [(i64, &str); 7] = [
        (NS_PER_DAY, "d"),
        (3_600_000_000_000, "h"),
        (60_000_000_000, "m"),
        (1_000_000_000, "s"),
        (1_000_000, "ms"),
        (1_000, "us"),
        (1, "ns"),
    ];
    for (u, s) in UNITS {
        if ns >= u && ns % u == 0 {
            return format!("{}{s}", ns / u);
        }
    }
    format!("{ns}ns")
}

/// The burst rule of the tiers, resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct BurstRule {
    /// Bytes per second at 100 % (speed Mb/s × 1e6 / 8).
    pub bytes_per_s: f64,
    pub speed_mbps: f64,
    /// Thresholds, % of speed, as configured.
    pub thresholds: Vec<f64>,
}

/// `T` as it appears in a column name: `90`, `92_5`.
pub fn threshold_label(t: f64) -> String {
    let s = format!("{t}");
    s.replace('.', "_")
}

impl RollupConfig {
    /// Small and fast: for tests (on, same tiers, no retention limits).
    pub fn for_test() -> Self {
        Self {
            enabled: true,
            tiers: vec![TierConfig::new("1s"), TierConfig::new("1m")],
            queue_batches: 64,
            when_full: WhenFull::Block,
            block_timeout_ms: 5_000,
            ..Self::default()
        }
    }

    /// The tiers, resolved and checked; the burst rule.
    ///
    /// # Errors
    /// Every problem at once: unparsable intervals, tiers not a multiple of the finest, not
    /// dividing a day, out of order or twice, a bad span, speed or threshold.
    pub fn resolve(&self) -> Result<(Vec<Tier>, BurstRule), Vec<String>> {
        let mut problems = Vec::new();
        let mut tiers: Vec<Tier> = Vec::new();
        if self.enabled && self.tiers.is_empty() {
            problems.push("tiers is empty (add one, e.g. { interval = \"1s\" })".into());
        }
        for (i, t) in self.tiers.iter().enumerate() {
            let iv = match parse_duration_ns(&t.interval) {
                Ok(ns) if ns > 0 && ns <= NS_PER_DAY as u64 => ns as i64,
                Ok(_) => {
                    problems.push(format!(
                        "tiers[{i}].interval = {:?}: must be above 0 and at most 1d",
                        t.interval
                    ));
                    continue;
                }
                Err(e) => {
                    problems.push(format!("tiers[{i}].interval: {e}"));
                    continue;
                }
            };
            if NS_PER_DAY % iv != 0 {
                problems.push(format!(
                    "tiers[{i}].interval = {:?} does not divide a day (intervals align to UTC days)",
                    t.interval
                ));
                continue;
            }
            let span = if t.file_span.trim().is_empty() {
                if iv < 60_000_000_000 {
                    3_600_000_000_000
                } else {
                    NS_PER_DAY
                }
            } else {
                match parse_duration_ns(&t.file_span) {
                    Ok(ns) => ns as i64,
                    Err(e) => {
                        problems.push(format!("tiers[{i}].file_span: {e}"));
                        continue;
                    }
                }
            };
            if span < iv || span % iv != 0 || span > NS_PER_DAY || NS_PER_DAY % span != 0 {
                problems.push(format!(
                    "tiers[{i}].file_span = {:?}: must be a multiple of the interval that divides a day",
                    t.file_span
                ));
                continue;
            }
            if let Some(first) = tiers.first() {
                if iv % first.interval_ns != 0 || iv <= tiers.last().map_or(0, |l| l.interval_ns) {
                    problems.push(format!(
                        "tiers[{i}].interval = {:?}: tiers go finest first, each a multiple of the first ({})",
                        t.interval, first.name
                    ));
                    continue;
                }
            }
            tiers.push(Tier {
                name: tier_name(iv),
                interval_ns: iv,
                file_span_ns: span,
                retention_max_bytes: t.retention_max_bytes,
                retention_max_age_s: t.retention_max_age_s,
            });
        }
        let speed_mbps = match parse_speed_mbps(&self.speed) {
            Ok(s) => s,
            Err(e) => {
                problems.push(format!("speed: {e}"));
                0.0
            }
        };
        for t in &self.thresholds {
            if !(t.is_finite() && *t > 0.0) {
                problems.push(format!("thresholds: {t} is not a percentage above 0"));
            }
        }
        let mut seen = Vec::new();
        for t in &self.thresholds {
            let l = threshold_label(*t);
            if seen.contains(&l) {
                problems.push(format!("thresholds: {t} is listed twice"));
            }
            seen.push(l);
        }
        if self.queue_batches == 0 {
            problems.push("queue_batches must be at least 1".into());
        }
        if self.max_sessions == 0 {
            problems.push("max_sessions must be at least 1".into());
        }
        if problems.is_empty() {
            Ok((
                tiers,
                BurstRule {
                    bytes_per_s: speed_mbps * 1e6 / 8.0,
                    speed_mbps,
                    thresholds: self.thresholds.clone(),
                },
            ))
        } else {
            Err(problems)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_resolve_and_names_are_canonical() {
        let (t, r) = RollupConfig::default().resolve().unwrap();
        assert_eq!(t[0].name, "1s");
        assert_eq!(t[0].file_span_ns, 3_600_000_000_000);
        assert_eq!(t[1].name, "1m");
        assert_eq!(t[1].file_span_ns, NS_PER_DAY);
        assert_eq!(r.bytes_per_s, 100_000.0 * 1e6 / 8.0);
        assert_eq!(tier_name(60_000_000_000), "1m");
        assert_eq!(tier_name(90_000_000_000), "90s");
        assert_eq!(tier_name(10_000), "10us");
        assert_eq!(tier_name(3_600_000_000_000), "1h");
        assert_eq!(threshold_label(92.5), "92_5");
        assert_eq!(threshold_label(90.0), "90");
    }

    #[test]
    fn every_problem_is_listed() {
        let c = RollupConfig {
            tiers: vec![
                TierConfig::new("1m"),
                TierConfig::new("7s"),
                TierConfig::new("1s"),
                TierConfig::new("soon"),
            ],
            speed: "fast".into(),
            thresholds: vec![90.0, -1.0, 90.0],
            ..RollupConfig::default()
        };
        let p = c.resolve().unwrap_err();
        assert_eq!(p.len(), 6, "{p:#?}");
        assert!(
            p.iter().any(|x| x.contains("does not divide a day")),
            "{p:#?}"
        );
        assert!(p.iter().any(|x| x.contains("finest first")), "{p:#?}");
        assert!(p.iter().any(|x| x.contains("speed")), "{p:#?}");
        assert!(p.iter().any(|x| x.contains("twice")), "{p:#?}");
    }
}
