//! The on-disk layout of the Parquet history and of the data lake: the only place that formats
//! (or parses) a path.
//!
//! ```text
//! <root>/profile=<p>/group=<g>/date=YYYY-MM-DD/hour=HH/part-<first_ns:020>-<seq:06>.parquet
//! <root>/profile=<p>/group=<g>/date=YYYY-MM-DD/hour=HH/.part-<first_ns:020>-<seq:06>.parquet.tmp
//! <lake>/switch=<s>/profile=<p>/group=<g>/date=YYYY-MM-DD/hour=HH/part-….parquet   (uploaded)
//! <root>/table=<t>/switch=<s>/date=YYYY-MM-DD/hour=HH/part-<first_ns:020>-<seq:06>.parquet
//! <root>/tier=<i>/profile=<p>/group=<g>/date=YYYY-MM-DD/part-<first_ns:020>-<seq:06>.parquet
//! ```
//!
//! The `tier=` tree holds the rollup tiers (`store/ROLLUPS.md`), one per interval (`1s`, `1m`),
//! partitioned by UTC date only ([`TierDir`], [`classify_tier`]); [`published_parts`] lists it
//! too, so the uploader sends it under the same `switch=` prefix.
//!
//! The `table=`/`switch=` tree holds the INT tables (`int_reports`, `int_hops`, `int_drops`), one
//! directory per reporting switch ([`TableDir`]); the same partitions, names and escaping below
//! apply. The counter sink never sees it ([`classify`] calls it `Other`); [`classify_table`] is
//! its counterpart, and [`published_parts`] lists both trees (the uploader copies both).
//!
//! The lake (what the uploader writes, `store/LAKE.md`) is every switch's history under one more
//! Hive level, `switch=<name>` ([`switch_segment`], [`lake_key`]), so engines prune by switch.
//!
//! * Partition values follow Hive's `key=value` convention, so DuckDB (`hive_partitioning`),
//!   pyarrow (`partitioning="hive"`), Spark and DataFusion see `profile`, `group`, `date` and
//!   `hour` as columns and prune on them.
//! * `date`/`hour` are UTC and come from the **first** timestamp of the file; the sink splits
//!   batches at hour boundaries, so every row of a file lies in its partition's hour.
//! * `first_ns` is zero-padded to 20 digits (the width of `u64::MAX`) and `seq` to 6, so a
//!   lexical listing of a partition is time order, oldest first.
//! * Files being written are hidden: a leading dot and a `.tmp` suffix, in the same directory as
//!   the final file (so the publishing `rename` never crosses a filesystem). DuckDB, pyarrow and
//!   DataFusion all skip names starting with `.` or `_` when they list a directory.
//! * Profile and group values are escaped with [`escape_value`]: every byte outside
//!   `[A-Za-z0-9_-]` becomes `%XX` (upper-case hex), so a value can never contain `/`, be `..`,
//!   start with a dot or contain `=`. pyarrow's Hive partitioning (`segment_encoding="uri"`, its
//!   default) and DuckDB decode the escapes back.

use std::path::{Path, PathBuf};

/// The Hive value written for an empty profile or group (Hive's own spelling).
pub const EMPTY_VALUE: &str = "__HIVE_DEFAULT_PARTITION__";

/// Nanoseconds in an hour (the partition width).
pub const NS_PER_HOUR: i64 = 3_600_000_000_000;

/// Escapes a partition value: keeps `[A-Za-z0-9_-]`, percent-encodes every other byte of its
/// UTF-8 form as `%XX`. An empty value becomes [`EMPTY_VALUE`].
pub fn escape_value(v: &str) -> String {
    if v.is_empty() {
        return EMPTY_VALUE.to_string();
    }
    let mut out = String::with_capacity(v.len());
    for b in v.bytes() {
        if b.is_ascii_alphanumeric() || b == b'_' || b == b'-' {
            out.push(b as char);
        } else {
            out.push('%');
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 15)]));
        }
    }
    out
}

const HEX: &[u8; 16] = b"0123456789ABCDEF";

/// Reverses [`escape_value`]. `None` for a malformed escape or non-UTF-8 result.
pub fn unescape_value(v: &str) -> Option<String> {
    if v == EMPTY_VALUE {
        return Some(String::new());
    }
    let b = v.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = v.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The lake's top partition level for switch `name`: `switch=<escaped name>`.
///
/// Escaped like [`escape_value`], except that a `.` after the first byte is kept: switch names
/// are host names (`leaf01.dc2`), and a dot that cannot lead can neither hide the directory nor
/// form `..`. [`unescape_value`] reverses it.
pub fn switch_segment(name: &str) -> String {
    if name.is_empty() {
        return format!("switch={EMPTY_VALUE}");
    }
    let mut out = String::with_capacity(7 + name.len());
    out.push_str("switch=");
    for (i, b) in name.bytes().enumerate() {
        if b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || (b == b'.' && i > 0) {
            out.push(b as char);
        } else {
            out.push('%');
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 15)]));
        }
    }
    out
}

/// A published file's path inside one switch's part of the lake: the counters' `rel` as it is;
/// an INT table's `table=<t>/switch=<reporting switch>/…` becomes `table=<t>/reporter=<…>/…`,
/// because the lake already has `switch=<collector>` above it and Hive partitioning cannot hold
/// one key twice (store/LAKE.md).
pub fn lake_rel(rel: &str) -> std::borrow::Cow<'_, str> {
    match rel.split_once('/') {
        Some((t, rest)) if t.starts_with("table=") && rest.starts_with("switch=") => {
            std::borrow::Cow::Owned(format!("{t}/reporter={}", &rest["switch=".len()..]))
        }
        _ => std::borrow::Cow::Borrowed(rel),
    }
}

/// The lake key of a published file, given its path relative to the data dir (as
/// [`published_parts`] lists it): `switch=<escaped name>/<lake_rel(rel)>`; a rollup tier's
/// `tier=<t>/…` goes to `_tiers/tier=<t>/switch=<escaped name>/…` — a hidden top-level tree, so
/// engines that read the lake root as one table of raw files (Spark, Sail: they skip `_` names)
/// never see the tiers, and each tier is one table of every switch (`store/ROLLUPS.md` §8).
pub fn lake_key(switch: &str, rel: &str) -> String {
    let rel = rel.trim_start_matches('/');
    if let Some((tier, rest)) = rel.split_once('/').filter(|(t, _)| t.starts_with("tier=")) {
        return format!("{TIERS_DIR}/{tier}/{}/{rest}", switch_segment(switch));
    }
    format!("{}/{}", switch_segment(switch), lake_rel(rel))
}

/// The lake's top-level directory of the rollup tiers (hidden: see [`lake_key`]).
pub const TIERS_DIR: &str = "_tiers";

/// A UTC civil hour: the `date=`/`hour=` partition of a timestamp.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct UtcHour {
    pub year: i32,
    pub month: u32,
    pub day: u32,
    pub hour: u32,
}

impl UtcHour {
    /// The hour containing `ts_ns` (ns since the Unix epoch; negative values are before 1970).
    pub fn of_ns(ts_ns: i64) -> Self {
        let hours = ts_ns.div_euclid(NS_PER_HOUR);
        let days = hours.div_euclid(24);
        let hour = hours.rem_euclid(24) as u32;
        let (year, month, day) = civil_from_days(days);
        Self {
            year,
            month,
            day,
            hour,
        }
    }

    /// First ns of the next hour: where the sink splits a batch that crosses it.
    pub fn next_start_ns(ts_ns: i64) -> i64 {
        (ts_ns.div_euclid(NS_PER_HOUR) + 1).saturating_mul(NS_PER_HOUR)
    }

    /// `date=YYYY-MM-DD`
    pub fn date_segment(&self) -> String {
        format!("date={}", self.date_value())
    }

    /// `hour=HH`
    pub fn hour_segment(&self) -> String {
        format!("hour={}", self.hour_value())
    }

    /// `YYYY-MM-DD`: the `date` partition value (what a Hive-partitioned reader sees).
    pub fn date_value(&self) -> String {
        format!("{:04}-{:02}-{:02}", self.year, self.month, self.day)
    }

    /// `HH`: the `hour` partition value.
    pub fn hour_value(&self) -> String {
        format!("{:02}", self.hour)
    }

    /// First ns of this hour.
    pub fn start_ns(&self) -> i64 {
        let days = days_from_civil(self.year, self.month, self.day);
        (days * 24 + i64::from(self.hour)).saturating_mul(NS_PER_HOUR)
    }

    /// The hour of a path with `date=YYYY-MM-DD` and `hour=HH` segments (a partition directory
    /// or a file under one, relative or absolute); `None` when either is missing or malformed.
    pub fn parse_path(path: &str) -> Option<Self> {
        let (mut date, mut hour) = (None, None);
        for seg in path.split('/') {
            if let Some(d) = seg.strip_prefix("date=") {
                date = Some(d);
            } else if let Some(h) = seg.strip_prefix("hour=") {
                hour = Some(h);
            }
        }
        let (date, hour) = (date?, hour?);
        let num = |s: &str, len: usize| {
            (s.len() == len && s.bytes().all(|b| b.is_ascii_digit()))
                .then(|| s.parse::<u32>().ok())?
        };
        let mut ymd = date.split('-');
        let (y, m, d) = (
            num(ymd.next()?, 4)?,
            num(ymd.next()?, 2)?,
            num(ymd.next()?, 2)?,
        );
        let hour = num(hour, 2)?;
        let ok = ymd.next().is_none()
            && (1..=12).contains(&m)
            && (1..=31).contains(&d)
            && hour < 24
            && civil_from_days(days_from_civil(y as i32, m, d)) == (y as i32, m, d);
        ok.then_some(Self {
            year: y as i32,
            month: m,
            day: d,
            hour,
        })
    }
}

/// (year, month, day) → days since 1970-01-01, proleptic Gregorian (the inverse of
/// [`civil_from_days`], H. Hinnant's algorithm).
fn days_from_civil(y: i32, m: u32, d: u32) -> i64 {
    let y = i64::from(y) - i64::from(m <= 2);
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (i64::from(m) + 9) % 12;
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Days since 1970-01-01 → (year, month, day), proleptic Gregorian (H. Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i32, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    ((if m <= 2 { y + 1 } else { y }) as i32, m, d)
}

/// One session's directory: `<root>/profile=<p>/group=<g>`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SessionDir(PathBuf);

impl SessionDir {
    pub fn new(root: &Path, profile: &str, group: &str) -> Self {
        Self(
            root.join(format!("profile={}", escape_value(profile)))
                .join(format!("group={}", escape_value(group))),
        )
    }

    pub fn as_path(&self) -> &Path {
        &self.0
    }

    /// The hour partition holding `ts_ns`.
    pub fn partition(&self, ts_ns: i64) -> PartitionDir {
        let h = UtcHour::of_ns(ts_ns);
        PartitionDir(self.0.join(h.date_segment()).join(h.hour_segment()))
    }
}

/// An hour partition: `<session dir>/date=YYYY-MM-DD/hour=HH`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PartitionDir(PathBuf);

impl PartitionDir {
    pub fn as_path(&self) -> &Path {
        &self.0
    }

    /// The final and temporary paths of part `name` in this partition.
    pub fn part(&self, name: PartName) -> PartPaths {
        PartPaths {
            published: self.0.join(name.file_name()),
            temp: self.0.join(name.temp_file_name()),
            name,
        }
    }
}

/// The name of one Parquet part: first timestamp and a sequence number that tells apart parts
/// starting at the same ns (a schema change mid-batch, a restart replaying the same time).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PartName {
    /// First timestamp (ns since the epoch). Negative timestamps are written as 0.
    pub first_ns: u64,
    /// 0..=999_999; wraps.
    pub seq: u32,
}

/// Largest `seq` (6 digits).
pub const MAX_SEQ: u32 = 999_999;

impl PartName {
    pub fn new(first_ns: i64, seq: u32) -> Self {
        Self {
            first_ns: first_ns.max(0) as u64,
            seq: seq % (MAX_SEQ + 1),
        }
    }

    /// `part-<first_ns:020>-<seq:06>.parquet`
    pub fn file_name(&self) -> String {
        format!("part-{:020}-{:06}.parquet", self.first_ns, self.seq)
    }

    /// `.part-<first_ns:020>-<seq:06>.parquet.tmp`
    pub fn temp_file_name(&self) -> String {
        format!(".{}.tmp", self.file_name())
    }

    /// Parses a published name (`part-….parquet`).
    pub fn parse(file_name: &str) -> Option<Self> {
        let rest = file_name.strip_prefix("part-")?.strip_suffix(".parquet")?;
        let (ns, seq) = rest.split_once('-')?;
        if ns.len() != 20 || seq.len() != 6 {
            return None;
        }
        if !ns.bytes().chain(seq.bytes()).all(|b| b.is_ascii_digit()) {
            return None;
        }
        Some(Self {
            first_ns: ns.parse().ok()?,
            seq: seq.parse().ok()?,
        })
    }

    /// Parses a temporary name (`.part-….parquet.tmp`).
    pub fn parse_temp(file_name: &str) -> Option<Self> {
        Self::parse(file_name.strip_prefix('.')?.strip_suffix(".tmp")?)
    }
}

/// Where a part is written (`temp`) and where it is published (`published`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartPaths {
    pub name: PartName,
    pub temp: PathBuf,
    pub published: PathBuf,
}

/// What a path under the root is, as far as the layout is concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LayoutEntry {
    /// A published part.
    Part {
        profile: String,
        group: String,
        name: PartName,
    },
    /// A temporary part left by a writer that did not finish.
    Temp {
        profile: String,
        group: String,
        name: PartName,
    },
    /// Anything else (not ours; never touched).
    Other,
}

/// Classifies `path` (a file under `root`): a published part, a stale temporary part or other.
pub fn classify(root: &Path, path: &Path) -> LayoutEntry {
    match classify_in(root, path, ["profile=", "group="], true) {
        Some(([profile, group], false, name)) => LayoutEntry::Part {
            profile,
            group,
            name,
        },
        Some(([profile, group], true, name)) => LayoutEntry::Temp {
            profile,
            group,
            name,
        },
        None => LayoutEntry::Other,
    }
}

/// The one walk behind [`classify`], [`classify_tier`] and [`classify_table`]: `path` relative to
/// `root` is `K` `key=value` segments (in `keys`' order), `date=…`, `hour=…` when `hourly`, then
/// a part's file name. Returns the unescaped values, whether the part is a writer's temporary
/// file, and its name; `None` for anything else.
fn classify_in<const K: usize>(
    root: &Path,
    path: &Path,
    keys: [&str; K],
    hourly: bool,
) -> Option<([String; K], bool, PartName)> {
    let rel = path.strip_prefix(root).ok()?;
    let parts: Vec<&str> = rel.iter().filter_map(|s| s.to_str()).collect();
    let (file, dirs) = parts.split_last()?;
    if dirs.len() != K + 1 + usize::from(hourly) {
        return None;
    }
    let mut values: [String; K] = std::array::from_fn(|_| String::new());
    for (i, key) in keys.iter().enumerate() {
        values[i] = unescape_value(dirs[i].strip_prefix(key)?)?;
    }
    if !dirs[K].starts_with("date=") || (hourly && !dirs[K + 1].starts_with("hour=")) {
        return None;
    }
    if let Some(name) = PartName::parse(file) {
        Some((values, false, name))
    } else {
        PartName::parse_temp(file).map(|name| (values, true, name))
    }
}

/// Published parts under `root`: (relative path with `/`, full path, first_ns). Unreadable
/// directories are skipped (nothing found there). The uploader's scan and the tests' listing.
pub fn published_parts(root: &Path) -> Vec<(String, PathBuf, u64)> {
    fn subdirs(d: &Path, key: &str) -> Vec<(String, PathBuf)> {
        let Ok(rd) = std::fs::read_dir(d) else {
            return Vec::new();
        };
        rd.filter_map(Result::ok)
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .filter_map(|e| {
                let n = e.file_name().into_string().ok()?;
                n.starts_with(key).then(|| (n, e.path()))
            })
            .collect()
    }
    let mut out = Vec::new();
    for (p, pd) in subdirs(root, "profile=") {
        for (g, gd) in subdirs(&pd, "group=") {
            for (d, dd) in subdirs(&gd, "date=") {
                for (h, hd) in subdirs(&dd, "hour=") {
                    let Ok(rd) = std::fs::read_dir(&hd) else {
                        continue;
                    };
                    for e in rd.filter_map(Result::ok) {
                        let path = e.path();
                        if let LayoutEntry::Part { name, .. } = classify(root, &path) {
                            let f = e.file_name();
                            let f = f.to_string_lossy();
                            out.push((format!("{p}/{g}/{d}/{h}/{f}"), path, name.first_ns));
                        }
                    }
                }
            }
        }
    }
    for (i, id) in subdirs(root, "tier=") {
        for (p, pd) in subdirs(&id, "profile=") {
            for (g, gd) in subdirs(&pd, "group=") {
                for (d, dd) in subdirs(&gd, "date=") {
                    let Ok(rd) = std::fs::read_dir(&dd) else {
                        continue;
                    };
                    for e in rd.filter_map(Result::ok) {
                        let path = e.path();
                        if let TierEntry::Part { name, .. } = classify_tier(root, &path) {
                            let f = e.file_name();
                            let f = f.to_string_lossy();
                            out.push((format!("{i}/{p}/{g}/{d}/{f}"), path, name.first_ns));
                        }
                    }
                }
            }
        }
    }
    for (t, td) in subdirs(root, "table=") {
        for (s, sd) in subdirs(&td, "switch=") {
            for (d, dd) in subdirs(&sd, "date=") {
                for (h, hd) in subdirs(&dd, "hour=") {
                    let Ok(rd) = std::fs::read_dir(&hd) else {
                        continue;
                    };
                    for e in rd.filter_map(Result::ok) {
                        let path = e.path();
                        if let TableEntry::Part { name, .. } = classify_table(root, &path) {
                            let f = e.file_name();
                            let f = f.to_string_lossy();
                            out.push((format!("{t}/{s}/{d}/{h}/{f}"), path, name.first_ns));
                        }
                    }
                }
            }
        }
    }
    out
}

/// One session's directory of a rollup tier: `<root>/tier=<i>/profile=<p>/group=<g>`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TierDir(PathBuf);

impl TierDir {
    /// `tier` is the tier's name (`1s`, `1m`), escaped like every partition value.
    pub fn new(root: &Path, tier: &str, profile: &str, group: &str) -> Self {
        Self(
            root.join(format!("tier={}", escape_value(tier)))
                .join(format!("profile={}", escape_value(profile)))
                .join(format!("group={}", escape_value(group))),
        )
    }

    pub fn as_path(&self) -> &Path {
        &self.0
    }

    /// The date partition holding `ts_ns`: `<tier dir>/date=YYYY-MM-DD`.
    pub fn partition(&self, ts_ns: i64) -> PartitionDir {
        PartitionDir(self.0.join(UtcHour::of_ns(ts_ns).date_segment()))
    }
}

/// What a path under the root is in the `tier=` tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TierEntry {
    /// A published part.
    Part {
        tier: String,
        profile: String,
        group: String,
        name: PartName,
    },
    /// A temporary part left by a writer that did not finish.
    Temp {
        tier: String,
        profile: String,
        group: String,
        name: PartName,
    },
    /// Anything else (not ours; never touched).
    Other,
}

/// Classifies `path` (a file under `root`) in the `tier=` tree.
pub fn classify_tier(root: &Path, path: &Path) -> TierEntry {
    match classify_in(root, path, ["tier=", "profile=", "group="], false) {
        Some(([tier, profile, group], false, name)) => TierEntry::Part {
            tier,
            profile,
            group,
            name,
        },
        Some(([tier, profile, group], true, name)) => TierEntry::Temp {
            tier,
            profile,
            group,
            name,
        },
        None => TierEntry::Other,
    }
}

/// One table's directory for one switch: `<root>/table=<t>/switch=<s>` (the INT tables).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TableDir(PathBuf);

impl TableDir {
    pub fn new(root: &Path, table: &str, switch: &str) -> Self {
        Self(
            root.join(format!("table={}", escape_value(table)))
                .join(format!("switch={}", escape_value(switch))),
        )
    }

    pub fn as_path(&self) -> &Path {
        &self.0
    }

    /// The hour partition holding `ts_ns`.
    pub fn partition(&self, ts_ns: i64) -> PartitionDir {
        let h = UtcHour::of_ns(ts_ns);
        PartitionDir(self.0.join(h.date_segment()).join(h.hour_segment()))
    }
}

/// What a path under the root is in the `table=`/`switch=` tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TableEntry {
    /// A published part.
    Part {
        table: String,
        switch: String,
        name: PartName,
    },
    /// A temporary part left by a writer that did not finish.
    Temp {
        table: String,
        switch: String,
        name: PartName,
    },
    /// Anything else (not ours; never touched).
    Other,
}

/// Classifies `path` (a file under `root`) in the `table=`/`switch=` tree.
pub fn classify_table(root: &Path, path: &Path) -> TableEntry {
    match classify_in(root, path, ["table=", "switch="], true) {
        Some(([table, switch], false, name)) => TableEntry::Part {
            table,
            switch,
            name,
        },
        Some(([table, switch], true, name)) => TableEntry::Temp {
            table,
            switch,
            name,
        },
        None => TableEntry::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: i64 = 1_700_000_000_123_456_789; // 2023-11-14T22:13:20.123456789Z

    #[test]
    fn part_paths_exact() {
        let s = SessionDir::new(Path::new("/var/lib/stel"), "stel_demo", "PORT");
        let p = s.partition(T).part(PartName::new(T, 7));
        assert_eq!(
            p.published.to_str().unwrap(),
            "/var/lib/stel/profile=stel_demo/group=PORT/date=2023-11-14/hour=22/\
             part-01700000000123456789-000007.parquet"
        );
        assert_eq!(
            p.temp.to_str().unwrap(),
            "/var/lib/stel/profile=stel_demo/group=PORT/date=2023-11-14/hour=22/\
             .part-01700000000123456789-000007.parquet.tmp"
        );
    }

    #[test]
    fn names_sort_in_time_order_and_parse_back() {
        let a = PartName::new(999, 1).file_name();
        let b = PartName::new(1000, 0).file_name();
        assert_eq!(a, "part-00000000000000000999-000001.parquet");
        assert!(a < b);
        assert_eq!(PartName::parse(&b), Some(PartName::new(1000, 0)));
        assert_eq!(
            PartName::parse_temp(&PartName::new(5, 2).temp_file_name()),
            Some(PartName::new(5, 2))
        );
        assert_eq!(PartName::parse("part-1-2.parquet"), None);
        assert_eq!(
            PartName::parse(".part-00000000000000000999-000001.parquet.tmp"),
            None
        );
        assert_eq!(PartName::new(-5, 1_000_001), PartName::new(0, 1));
        assert_eq!(
            PartName::new(i64::MAX, MAX_SEQ).file_name(),
            "part-09223372036854775807-999999.parquet"
        );
    }

    #[test]
    fn escaping_is_safe_and_reversible() {
        for (raw, esc) in [
            ("stel_demo", "stel_demo"),
            ("..", "%2E%2E"),
            ("a/b", "a%2Fb"),
            ("x=y z", "x%3Dy%20z"),
            (".hidden", "%2Ehidden"),
            ("Ethernet0|3", "Ethernet0%7C3"),
            ("é", "%C3%A9"),
            ("", EMPTY_VALUE),
        ] {
            assert_eq!(escape_value(raw), esc, "{raw}");
            assert_eq!(unescape_value(esc).as_deref(), Some(raw));
        }
        let s = SessionDir::new(Path::new("/r"), "../../etc", "a/b");
        assert_eq!(
            s.as_path().to_str().unwrap(),
            "/r/profile=%2E%2E%2F%2E%2E%2Fetc/group=a%2Fb"
        );
        assert_eq!(unescape_value("%G1"), None);
        assert_eq!(unescape_value("%4"), None);
    }

    #[test]
    fn lake_keys_exact() {
        let s = SessionDir::new(Path::new("/var/lib/stel"), "stel_demo", "PORT");
        let p = s.partition(T).part(PartName::new(T, 7));
        let rel = p
            .published
            .strip_prefix("/var/lib/stel")
            .unwrap()
            .to_str()
            .unwrap()
            .to_string();
        assert_eq!(
            lake_key("leaf-01", &rel),
            "switch=leaf-01/profile=stel_demo/group=PORT/date=2023-11-14/hour=22/\
             part-01700000000123456789-000007.parquet"
        );
        assert_eq!(switch_segment("spine1.dc2"), "switch=spine1.dc2");
        assert_eq!(switch_segment("../x"), "switch=%2E.%2Fx");
        assert_eq!(switch_segment(".hidden"), "switch=%2Ehidden");
        assert_eq!(unescape_value("%2E.%2Fx").as_deref(), Some("../x"));
        assert_eq!(switch_segment(""), "switch=__HIVE_DEFAULT_PARTITION__");
        assert_eq!(lake_key("a b", "/profile=p/x"), "switch=a%20b/profile=p/x");
    }

    #[test]
    fn civil_hours() {
        assert_eq!(
            UtcHour::of_ns(0),
            UtcHour {
                year: 1970,
                month: 1,
                day: 1,
                hour: 0
            }
        );
        assert_eq!(
            UtcHour::of_ns(-1),
            UtcHour {
                year: 1969,
                month: 12,
                day: 31,
                hour: 23
            }
        );
        // 2024-02-29T23:59:59.999999999Z then the next hour is March 1st.
        let leap = 1_709_251_199_999_999_999;
        assert_eq!(UtcHour::of_ns(leap).date_segment(), "date=2024-02-29");
        assert_eq!(UtcHour::of_ns(leap).hour_segment(), "hour=23");
        let next = UtcHour::next_start_ns(leap);
        assert_eq!(next, leap + 1);
        assert_eq!(UtcHour::of_ns(next).date_segment(), "date=2024-03-01");
        assert_eq!(UtcHour::of_ns(next).hour_segment(), "hour=00");
        assert_eq!(UtcHour::next_start_ns(next), next + NS_PER_HOUR);
    }

    #[test]
    fn hour_paths_parse_and_round_trip() {
        for ts in [
            0,
            -1,
            1_709_251_199_999_999_999,
            1_700_000_000_123_456_789,
            4_102_444_800 * 1_000_000_000,
        ] {
            let h = UtcHour::of_ns(ts);
            let p = format!(
                "profile=p/group=PORT/{}/{}/part-1-000000.parquet",
                h.date_segment(),
                h.hour_segment()
            );
            assert_eq!(UtcHour::parse_path(&p), Some(h), "{p}");
            assert!(
                h.start_ns() <= ts && ts < h.start_ns() + NS_PER_HOUR,
                "{ts}"
            );
            assert_eq!(UtcHour::of_ns(h.start_ns()), h);
        }
        for bad in [
            "date=2023-11-14",
            "hour=22",
            "date=2023-11-14/hour=24",
            "date=2023-02-30/hour=01",
            "date=2023-1-14/hour=01",
            "date=2023-11-14-1/hour=01",
            "date=+023-11-14/hour=01",
            "date=2023-11-14/hour=1",
        ] {
            assert_eq!(UtcHour::parse_path(bad), None, "{bad}");
        }
    }

    #[test]
    fn table_paths_exact_and_classified() {
        let root = Path::new("/var/lib/stel");
        let t = TableDir::new(root, "int_hops", "4217755253");
        let p = t.partition(T).part(PartName::new(T, 2));
        assert_eq!(
            p.published.to_str().unwrap(),
            "/var/lib/stel/table=int_hops/switch=4217755253/date=2023-11-14/hour=22/\
             part-01700000000123456789-000002.parquet"
        );
        assert_eq!(
            classify_table(root, &p.published),
            TableEntry::Part {
                table: "int_hops".into(),
                switch: "4217755253".into(),
                name: PartName::new(T, 2)
            }
        );
        assert!(matches!(
            classify_table(root, &p.temp),
            TableEntry::Temp { .. }
        ));
        // The two trees never mistake each other's files.
        assert_eq!(classify(root, &p.published), LayoutEntry::Other);
        let s = SessionDir::new(root, "p", "PORT")
            .partition(T)
            .part(PartName::new(T, 0));
        assert_eq!(classify_table(root, &s.published), TableEntry::Other);
    }

    #[test]
    fn classify_layout_entries() {
        let root = Path::new("/r");
        let s = SessionDir::new(root, "p/1", "PORT");
        let part = s.partition(T).part(PartName::new(T, 3));
        assert_eq!(
            classify(root, &part.published),
            LayoutEntry::Part {
                profile: "p/1".into(),
                group: "PORT".into(),
                name: PartName::new(T, 3)
            }
        );
        assert!(matches!(
            classify(root, &part.temp),
            LayoutEntry::Temp { .. }
        ));
        assert_eq!(
            classify(root, &s.as_path().join("notes.txt")),
            LayoutEntry::Other
        );
        assert_eq!(
            classify(root, Path::new("/elsewhere/x.parquet")),
            LayoutEntry::Other
        );
    }

    #[test]
    fn tier_paths_exact_classified_and_listed() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let t = TierDir::new(root, "1m", "stel_demo", "PORT");
        let p = t.partition(T).part(PartName::new(T, 4));
        assert_eq!(
            p.published.strip_prefix(root).unwrap().to_str().unwrap(),
            "tier=1m/profile=stel_demo/group=PORT/date=2023-11-14/\
             part-01700000000123456789-000004.parquet"
        );
        assert_eq!(
            classify_tier(root, &p.published),
            TierEntry::Part {
                tier: "1m".into(),
                profile: "stel_demo".into(),
                group: "PORT".into(),
                name: PartName::new(T, 4)
            }
        );
        assert!(matches!(
            classify_tier(root, &p.temp),
            TierEntry::Temp { .. }
        ));
        // The raw and tier trees never mistake each other's files.
        assert_eq!(classify(root, &p.published), LayoutEntry::Other);
        let raw = SessionDir::new(root, "stel_demo", "PORT")
            .partition(T)
            .part(PartName::new(T, 0));
        assert_eq!(classify_tier(root, &raw.published), TierEntry::Other);
        std::fs::create_dir_all(p.published.parent().unwrap()).unwrap();
        std::fs::write(&p.published, b"x").unwrap();
        std::fs::write(&p.temp, b"x").unwrap();
        let listed = published_parts(root);
        assert_eq!(listed.len(), 1);
        assert_eq!(
            lake_key("sw", &listed[0].0),
            "_tiers/tier=1m/switch=sw/profile=stel_demo/group=PORT/date=2023-11-14/\
             part-01700000000123456789-000004.parquet"
        );
    }

    #[test]
    fn int_tables_get_a_reporter_partition_in_the_lake() {
        assert_eq!(
            lake_rel("table=int_hops/switch=7/date=2026-01-01/hour=00/part-1-2.parquet"),
            "table=int_hops/reporter=7/date=2026-01-01/hour=00/part-1-2.parquet"
        );
        let c = "profile=p/group=PORT/date=2026-01-01/hour=00/part-1-2.parquet";
        assert_eq!(lake_rel(c), c);
        assert_eq!(
            lake_key("sw1", "table=int_reports/switch=9/x.parquet"),
            "switch=sw1/table=int_reports/reporter=9/x.parquet"
        );
    }
}
