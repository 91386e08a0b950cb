//! The Spark SQL each fleet question compiles to. Pure functions of the question, so every
//! statement is pinned by an exact-string test and can be pasted into `spark-sql` or a notebook.
//!
//! All of them read the temporary view `lake` (the lake root, Hive partitions `switch`,
//! `profile`, `group`, `date`, `hour`; schema merged by name across files) and start from the
//! same two CTEs:
//!
//! ```sql
//! WITH base AS (SELECT switch, profile, <ts ns> AS t, CAST(`Ethernet0.IF_IN_OCTETS` AS BIGINT) AS c0, …
//!               FROM lake WHERE `group` = 'PORT' AND <date/hour partition bounds> [AND switch IN (…)]),
//!      win AS (SELECT * FROM base WHERE t >= <from ns> AND t < <to ns>)
//! ```
//!
//! The partition bounds are what lets the engine skip whole directories (the files read are a
//! fraction of the files in the lake); the exact window is applied on `t`. Counters are cast to
//! signed `BIGINT` (Spark reads Parquet UINT64 as DECIMAL(20,0), Sail as unsigned) so that a
//! difference across a counter reset is negative, not an overflow. Floating-point expressions
//! are written in the same order of operations as the local engine's Rust, so both compare the
//! same doubles with a threshold.

pub use crate::burst::{BurstParams, Series};
use crate::window::TimeRange;

/// What a question covers.
#[derive(Debug, Clone)]
pub struct Scope {
    /// HFT group (PORT, QUEUE, …): the `group` partition value.
    pub group: String,
    pub profile: Option<String>,
    /// Switch names to keep (empty: all).
    pub switches: Vec<String>,
    pub range: TimeRange,
    /// This engine's exact expression of `ts` as ns since the epoch ([`super::lake::Lake::ts`]).
    pub ts: String,
}

/// A quoted identifier: `` `a.b` `` (a backtick inside is doubled).
pub fn ident(name: &str) -> String {
    format!("`{}`", name.replace('`', "``"))
}

/// A string literal: `'x'` (quote and backslash escaped with a backslash, Spark's default).
pub fn string_lit(s: &str) -> String {
    format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'"))
}

/// A double literal that parses back to exactly `v` (Spark reads `1.5` as DECIMAL, so it is
/// cast; the shortest round-trip decimal form is exact as a decimal).
pub fn double_lit(v: f64) -> String {
    format!("CAST({v:?} AS DOUBLE)")
}

/// `date`/`hour` partition bounds of `[from, to)` (UTC hours; `hour` is `HH`).
pub fn partition_filter(r: &TimeRange) -> String {
    let part = |ns: i64| {
        let t = chrono::DateTime::from_timestamp_nanos(ns);
        (t.format("%Y-%m-%d").to_string(), t.format("%H").to_string())
    };
    let (d0, h0) = part(r.from_ns);
    let (d1, h1) = part(r.to_ns - 1);
    format!(
        "(date > '{d0}' OR (date = '{d0}' AND hour >= '{h0}')) AND (date < '{d1}' OR (date = '{d1}' AND hour <= '{h1}'))"
    )
}

/// The scope's `WHERE` on partition columns.
pub fn scope_filter(s: &Scope) -> String {
    let mut w = vec![format!("{} = {}", ident("group"), string_lit(&s.group))];
    if let Some(p) = &s.profile {
        w.push(format!("profile IN ({})", both_forms(p)));
    }
    if !s.switches.is_empty() {
        let v: Vec<String> = s.switches.iter().map(|x| both_forms(x)).collect();
        w.push(format!("switch IN ({})", v.join(", ")));
    }
    w.push(partition_filter(&s.range));
    w.join(" AND ")
}

/// A partition value as the engine may show it: Apache Spark decodes the `%XX` escapes of a
/// directory name, DataFusion-based engines (Sail) keep them; both forms are matched.
fn both_forms(v: &str) -> String {
    let raw = string_lit(v);
    let esc = stel_store::paths::switch_segment(v);
    let esc = esc.trim_start_matches("switch=");
    if esc == v {
        raw
    } else {
        format!("{raw}, {}", string_lit(esc))
    }
}

/// `WITH base AS (…), win AS (…)` over `columns` (named `c0`, `c1`, … in order).
pub fn base_ctes(s: &Scope, columns: &[String]) -> String {
    let mut sel = vec![
        "switch".to_string(),
        "profile".to_string(),
        format!("{} AS t", s.ts),
    ];
    for (i, c) in columns.iter().enumerate() {
        sel.push(format!("CAST({} AS BIGINT) AS c{i}", ident(c)));
    }
    format!(
        "WITH base AS (SELECT {} FROM lake WHERE {}), win AS (SELECT * FROM base WHERE t >= {} AND t < {})",
        sel.join(", "),
        scope_filter(s),
        s.range.from_ns,
        s.range.to_ns
    )
}

/// Per switch, profile and time bucket `i = (t - origin) DIV width`: rows, first and last time,
/// each column's value at the first (`f<k>`) and last (`l<k>`) row, and with `stats` its min,
/// max, sum and count. What the local bucket scan keeps, computed by the engine.
pub fn buckets_sql(
    s: &Scope,
    columns: &[String],
    origin_ns: i64,
    width_ns: i64,
    stats: bool,
) -> String {
    let mut agg = vec![
        "COUNT(*) AS n".to_string(),
        "MIN(t) AS ft".to_string(),
        "MAX(t) AS lt".to_string(),
    ];
    for k in 0..columns.len() {
        agg.push(format!("min_by(c{k}, t) AS f{k}"));
        agg.push(format!("max_by(c{k}, t) AS l{k}"));
        if stats {
            agg.push(format!("MIN(c{k}) AS mn{k}"));
            agg.push(format!("MAX(c{k}) AS mx{k}"));
            agg.push(format!("SUM(CAST(c{k} AS DOUBLE)) AS sm{k}"));
            agg.push(format!("COUNT(c{k}) AS ct{k}"));
        }
    }
    format!(
        "{}, b AS (SELECT *, (t - {origin_ns}) DIV {width_ns} AS i FROM win) SELECT switch, profile, i, {} FROM b GROUP BY switch, profile, i ORDER BY switch, profile, i",
        base_ctes(s, columns),
        agg.join(", ")
    )
}

/// The microbursts of every series: consecutive snapshots whose utilisation since the previous
/// one is above the threshold form a run (gaps and islands: the run id is the count of non-hot
/// intervals so far); runs of at least `min_ns` are kept. Columns: switch, profile, object, dir,
/// start_t, end_t, peak (%), bytes, open (1 when still running at the window's end).
///
/// Same rules as the local engine at the stream's resolution: a null value is skipped (the
/// previous snapshot stays the reference), a counter that went down ends the run without a
/// spike, the utilisation of an interval is
/// `(v - pv) / ((t - pt) / 1e9) / bytes_per_s * 100`.
pub fn bursts_ctes(s: &Scope, series: &[Series], p: &BurstParams) -> String {
    let cols: Vec<String> = series.iter().map(|x| x.column.clone()).collect();
    let stack: Vec<String> = series
        .iter()
        .enumerate()
        .map(|(k, x)| format!("{}, {}, c{k}", string_lit(&x.object), string_lit(&x.dir)))
        .collect();
    let hot = format!("COALESCE(util > {}, false)", double_lit(p.threshold));
    format!(
        "{base}, \
         long AS (SELECT switch, profile, t, stack({n}, {stack}) AS (object, dir, v) FROM win), \
         d AS (SELECT switch, profile, object, dir, t, v, LAG(t) OVER w AS pt, LAG(v) OVER w AS pv FROM long WHERE v IS NOT NULL WINDOW w AS (PARTITION BY switch, profile, object, dir ORDER BY t)), \
         u AS (SELECT switch, profile, object, dir, t, pt, v - pv AS dv, CASE WHEN pt IS NOT NULL AND t > pt AND v >= pv THEN CAST(v - pv AS DOUBLE) / (CAST(t - pt AS DOUBLE) / 1e9) / {bps} * 100.0 END AS util FROM d), \
         h AS (SELECT *, {hot} AS hot, SUM(CASE WHEN {hot} THEN 0 ELSE 1 END) OVER (PARTITION BY switch, profile, object, dir ORDER BY t ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS grp, MAX(t) OVER (PARTITION BY switch, profile, object, dir) AS last_t FROM u), \
         runs AS (SELECT switch, profile, object, dir, MIN(pt) AS start_t, MAX(t) AS end_t, MAX(util) AS peak, SUM(dv) AS bytes, MAX(CASE WHEN t = last_t THEN 1 ELSE 0 END) AS open FROM h WHERE hot GROUP BY switch, profile, object, dir, grp), \
         kept AS (SELECT * FROM runs WHERE end_t - start_t >= {min})",
        base = base_ctes(s, &cols),
        n = series.len(),
        stack = stack.join(", "),
        bps = double_lit(p.bytes_per_s),
        min = p.min_ns,
    )
}

/// Every burst, in time order.
pub fn bursts_sql(s: &Scope, series: &[Series], p: &BurstParams) -> String {
    format!(
        "{} SELECT switch, profile, object, dir, start_t, end_t, peak, bytes, open FROM kept ORDER BY start_t, switch, object, dir",
        bursts_ctes(s, series, p)
    )
}

/// Per switch, object and direction: the number of bursts, their total time and the peak
/// (what `top --by bursts` ranks).
pub fn burst_totals_sql(s: &Scope, series: &[Series], p: &BurstParams) -> String {
    format!(
        "{} SELECT switch, profile, object, dir, COUNT(*) AS bursts, SUM(end_t - start_t) AS burst_ns, MAX(peak) AS peak FROM kept GROUP BY switch, profile, object, dir ORDER BY switch, profile, object, dir",
        bursts_ctes(s, series, p)
    )
}

/// Per switch, object and direction: bursts and their total time over a rollup tier's view
/// (`store/ROLLUPS.md` §4): the window's rows in time order, each row's inner figures plus its
/// entry delta (but the window's first row's), a burst counted once where the entry joins the
/// previous row's tail or the row's head run. Equal to the local engine's segment fold when
/// every row has inner deltas (the stream is faster than the tier). `min_dt` is the smallest
/// snapshot interval seen: no burst is shorter.
pub fn tier_burst_totals_sql(s: &Scope, view: &str, label: &str) -> String {
    let mut filt = vec![format!("{} = {}", ident("group"), string_lit(&s.group))];
    if let Some(p) = &s.profile {
        filt.push(format!("profile IN ({})", both_forms(p)));
    }
    if !s.switches.is_empty() {
        let v: Vec<String> = s.switches.iter().map(|x| both_forms(x)).collect();
        filt.push(format!("switch IN ({})", v.join(", ")));
    }
    let d0 = stel_store::paths::UtcHour::of_ns(s.range.from_ns).date_value();
    let d1 = stel_store::paths::UtcHour::of_ns(s.range.to_ns - 1).date_value();
    filt.push(format!(
        "date >= {} AND date <= {}",
        string_lit(&d0),
        string_lit(&d1)
    ));
    let mut cols = Vec::new();
    for (k, d) in ["rx", "tx"].iter().enumerate() {
        for (name, c) in [
            (format!("{d}_above{label}_ns"), "a"),
            (format!("{d}_bursts{label}"), "r"),
            (format!("{d}_head{label}_ns"), "h"),
            (format!("{d}_tail{label}_ns"), "l"),
            (format!("{d}_entry{label}_ns"), "e"),
        ] {
            cols.push(format!("CAST({} AS BIGINT) AS {c}{k}", ident(&name)));
        }
    }
    let per_dir = |k: usize, dir: &str| {
        format!(
            "SELECT switch, profile, object, '{dir}' AS dir,              SUM(a{k} + CASE WHEN rn > 1 THEN e{k} ELSE 0 END) AS burst_ns,              SUM(r{k} + CASE WHEN rn > 1 AND e{k} > 0 THEN 1 - CASE WHEN pl{k} > 0 THEN 1 ELSE 0 END - CASE WHEN h{k} > 0 THEN 1 ELSE 0 END ELSE 0 END) AS bursts,              MIN(mdt) AS min_dt, CAST(0.0 AS DOUBLE) AS peak              FROM u WHERE a{k} IS NOT NULL GROUP BY switch, profile, object"
        )
    };
    format!(
        "WITH t AS (SELECT switch, profile, object, {ts} AS t, CAST(min_dt_ns AS BIGINT) AS mdt, {cols} FROM {view} WHERE {filt}),          w AS (SELECT * FROM t WHERE t >= {from} AND t < {to}),          u AS (SELECT *, ROW_NUMBER() OVER x AS rn, LAG(l0) OVER x AS pl0, LAG(l1) OVER x AS pl1 FROM w WINDOW x AS (PARTITION BY switch, profile, object ORDER BY t))          SELECT * FROM ({rx} UNION ALL {tx}) ORDER BY switch, profile, object, dir",
        ts = s.ts,
        cols = cols.join(", "),
        view = view,
        filt = filt.join(" AND "),
        from = s.range.from_ns,
        to = s.range.to_ns,
        rx = per_dir(0, "RX"),
        tx = per_dir(1, "TX"),
    )
}

/// Newest sample time of the scope's group in the partition `date`/`hour` (the engine reads
/// only that hour's files).
pub fn newest_sql(ts: &str, group: &str, date: &str, hour: &str) -> String {
    format!(
        "SELECT MAX({ts}) AS t FROM lake WHERE {} = {} AND date = {} AND hour = {}",
        ident("group"),
        string_lit(group),
        string_lit(date),
        string_lit(hour)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: i64 = 1_700_000_000_000_000_000; // 2023-11-14T22:13:20Z

    fn scope() -> Scope {
        Scope {
            group: "PORT".into(),
            profile: None,
            switches: vec!["leaf 1".into(), "spine".into()],
            range: TimeRange {
                from_ns: T - 3_600_000_000_000,
                to_ns: T,
            },
            ts: "ts".into(),
        }
    }

    #[test]
    fn literals_and_identifiers() {
        assert_eq!(ident("Ethernet0.IF_IN_OCTETS"), "`Ethernet0.IF_IN_OCTETS`");
        assert_eq!(ident("a`b"), "`a``b`");
        assert_eq!(string_lit("it's a\\b"), "'it\\'s a\\\\b'");
        assert_eq!(
            double_lit(12_500_000_000.0),
            "CAST(12500000000.0 AS DOUBLE)"
        );
        assert_eq!(double_lit(0.1), "CAST(0.1 AS DOUBLE)");
    }

    #[test]
    fn the_window_becomes_partition_bounds_and_an_exact_time_filter() {
        assert_eq!(
            base_ctes(&scope(), &["Ethernet0.IF_IN_DISCARDS".to_string()]),
            "WITH base AS (SELECT switch, profile, ts AS t, CAST(`Ethernet0.IF_IN_DISCARDS` AS BIGINT) AS c0 FROM lake \
             WHERE `group` = 'PORT' AND switch IN ('leaf 1', 'leaf%201', 'spine') \
             AND (date > '2023-11-14' OR (date = '2023-11-14' AND hour >= '21')) \
             AND (date < '2023-11-14' OR (date = '2023-11-14' AND hour <= '22'))), \
             win AS (SELECT * FROM base WHERE t >= 1699996400000000000 AND t < 1700000000000000000)"
        );
    }

    #[test]
    fn buckets_keep_first_and_last_rows_per_switch() {
        let q = buckets_sql(&scope(), &["a.X".to_string()], 10, 1000, false);
        assert!(q.ends_with(
            ", b AS (SELECT *, (t - 10) DIV 1000 AS i FROM win) SELECT switch, profile, i, COUNT(*) AS n, \
             MIN(t) AS ft, MAX(t) AS lt, min_by(c0, t) AS f0, max_by(c0, t) AS l0 FROM b \
             GROUP BY switch, profile, i ORDER BY switch, profile, i"
        ), "{q}");
    }

    #[test]
    fn bursts_are_gaps_and_islands_over_the_unpivoted_series() {
        let series = vec![
            Series {
                object: "Ethernet0".into(),
                dir: "RX".into(),
                column: "Ethernet0.IF_IN_OCTETS".into(),
            },
            Series {
                object: "Ethernet0".into(),
                dir: "TX".into(),
                column: "Ethernet0.IF_OUT_OCTETS".into(),
            },
        ];
        let p = BurstParams {
            bytes_per_s: 12.5e9,
            threshold: 90.0,
            min_ns: 10_000,
        };
        let q = burst_totals_sql(&scope(), &series, &p);
        assert!(q.contains("long AS (SELECT switch, profile, t, stack(2, 'Ethernet0', 'RX', c0, 'Ethernet0', 'TX', c1) AS (object, dir, v) FROM win)"), "{q}");
        assert!(q.contains("CAST(v - pv AS DOUBLE) / (CAST(t - pt AS DOUBLE) / 1e9) / CAST(12500000000.0 AS DOUBLE) * 100.0"), "{q}");
        assert!(q.contains("SUM(CASE WHEN COALESCE(util > CAST(90.0 AS DOUBLE), false) THEN 0 ELSE 1 END) OVER (PARTITION BY switch, profile, object, dir ORDER BY t ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS grp"), "{q}");
        assert!(
            q.contains("kept AS (SELECT * FROM runs WHERE end_t - start_t >= 10000)"),
            "{q}"
        );
        assert!(q.ends_with("SELECT switch, profile, object, dir, COUNT(*) AS bursts, SUM(end_t - start_t) AS burst_ns, MAX(peak) AS peak FROM kept GROUP BY switch, profile, object, dir ORDER BY switch, profile, object, dir"), "{q}");
    }
}
