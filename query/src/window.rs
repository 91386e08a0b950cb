//! The time window of a question and time as text: [`TimeRange`], RFC 3339 with ns
//! ([`fmt_ts`]), durations and times as typed ([`parse_duration_ns`], [`parse_time_ns`]). Below
//! everything that plans or prints a window; `settings` resolves the flags into one.

use crate::error::{Error, Result};

/// A half-open window `[from_ns, to_ns)`, ns since the Unix epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TimeRange {
    pub from_ns: i64,
    pub to_ns: i64,
}

impl TimeRange {
    pub fn len_ns(&self) -> i64 {
        self.to_ns - self.from_ns
    }

    /// A round interval that cuts the window into at most `points` (1, 2, 5 × a power of ten
    /// below a second; 1, 2, 5, 10, 15, 30 s and min, then hours): the resolution of a chart
    /// nobody gave one for.
    pub fn chart_step_ns(&self, points: i64) -> i64 {
        const S: i64 = 1_000_000_000;
        let want = (self.len_ns() / points.max(1)).max(1);
        let mut steps = Vec::with_capacity(40);
        let mut p = 1;
        while p < S {
            steps.extend([p, 2 * p, 5 * p]);
            p *= 10;
        }
        for unit in [S, 60 * S] {
            steps.extend([1, 2, 5, 10, 15, 30].map(|k| k * unit));
        }
        steps.extend([1, 2, 3, 6, 12, 24].map(|k| k * 3_600 * S));
        steps.into_iter().find(|&s| s >= want).unwrap_or(want)
    }
}

#[cfg(test)]
#[test]
fn chart_steps_are_round() {
    let r = |len_ns: i64| TimeRange {
        from_ns: 7,
        to_ns: 7 + len_ns,
    };
    let s = 1_000_000_000;
    assert_eq!(r(30_000_000).chart_step_ns(120), 500_000);
    assert_eq!(r(60 * s).chart_step_ns(120), s / 2);
    assert_eq!(r(3_600 * s).chart_step_ns(120), 30 * s);
    assert_eq!(r(86_400 * s).chart_step_ns(120), 15 * 60 * s);
    assert_eq!(r(1).chart_step_ns(120), 1);
    assert_eq!(
        r(1_000 * 86_400 * s).chart_step_ns(120),
        1_000 * 86_400 * s / 120
    );
}

impl std::fmt::Display for TimeRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}..{}", fmt_ts(self.from_ns), fmt_ts(self.to_ns))
    }
}

/// RFC 3339 with ns, UTC: exact (the store's timestamps are ns; µs lost the sub-µs phase of a
/// stream, so a printed time did not name the snapshot it came from).
pub fn fmt_ts(ns: i64) -> String {
    chrono::DateTime::from_timestamp_nanos(ns).to_rfc3339_opts(chrono::SecondsFormat::Nanos, true)
}

/// Parses `10m`, `1h30m`, `500ms`, `10us`, `250ns` into ns. A bare number is refused: `--last
/// 10` meant seconds or minutes to whoever typed it, never 10 ns.
///
/// # Errors
/// A text that is not a duration, or has no unit; the message shows the units.
pub fn parse_duration_ns(s: &str) -> Result<i64> {
    let t = s.trim();
    if !t.is_empty() && t.chars().all(|c| c.is_ascii_digit() || c == '.') {
        return Err(Error::Usage(format!(
            "`{s}` has no unit; durations need one: {t}ns, {t}us, {t}ms, {t}s, {t}m, {t}h or {t}d (e.g. 10s, 1h30m)"
        )));
    }
    let ns = stel_store::units::parse_duration_ns(s).map_err(Error::Usage)?;
    i64::try_from(ns)
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| Error::Usage(format!("duration `{s}` must be > 0 and < 292 years")))
}

/// Parses an RFC 3339 time or an integer of ns since the epoch.
///
/// # Errors
/// Anything else; the message shows the format.
pub fn parse_time_ns(s: &str) -> Result<i64> {
    if let Ok(n) = s.trim().parse::<i64>() {
        return Ok(n);
    }
    chrono::DateTime::parse_from_rfc3339(s.trim())
        .ok()
        .and_then(|t| t.timestamp_nanos_opt())
        .ok_or_else(|| {
            Error::Usage(format!(
                "`{s}` is not a time; use RFC 3339 like 2024-05-01T12:00:00Z (or ns since the epoch)"
            ))
        })
}
