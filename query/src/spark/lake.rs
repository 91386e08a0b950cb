//! The lake as a Spark Connect session sees it: the temporary view `lake` over the lake root,
//! its counter columns, the exact time expression, and the pruning evidence (files in the lake
//! vs files a question reads, both from the engine).

use std::collections::BTreeSet;

use arrow_array::{cast::AsArray, Array, RecordBatch};
use arrow_schema::DataType;

use super::{
    client::{Answer, Remote, SparkClient},
    compile::{self, string_lit},
};
use crate::{
    catalog::Column,
    error::{Error, Result},
};

/// The name of the view every compiled question reads.
pub const VIEW: &str = "lake";

/// Sail (DataFusion) keeps Parquet's nanosecond timestamps; `unix_micros` truncates to µs and
/// `date_part('NANOSECOND', ts)` is the ns within the minute, so the two give the exact value.
pub const TS_NS_NANOS: &str =
    "(unix_micros(ts) DIV 60000000) * 60000000000 + date_part('NANOSECOND', ts)";
/// Fallback for engines with µs timestamps and no nanosecond field (exact to the µs).
pub const TS_NS_MICROS: &str = "unix_micros(ts) * 1000";

/// An open session over a lake.
#[derive(Debug)]
pub struct Lake {
    pub client: SparkClient,
    /// The lake root as the engine reads it.
    pub root: String,
    /// Counter columns of the merged schema (`<object>.<STAT>`), in schema order.
    pub columns: Vec<Column>,
    /// `ts` as exact ns since the epoch, for this engine.
    pub ts: String,
    /// Every data file of the lake (the engine's `inputFiles` of the whole view).
    pub files: Vec<String>,
    /// The server's Spark version.
    pub version: String,
    /// The lake's rollup tiers, each a view (`lake_<tier>`), coarsest first.
    pub tiers: Vec<LakeTier>,
}

/// One rollup tier of a lake, as a view of every switch's files of it.
#[derive(Debug, Clone)]
pub struct LakeTier {
    pub name: String,
    pub interval_ns: i64,
    pub view: String,
    /// Its burst rule (a file's footer).
    pub speed_mbps: Option<f64>,
    pub thresholds: Vec<f64>,
}

/// The rollup tiers under the lake root `root` (`data` as given): every `_tiers/tier=<t>/`,
/// registered as a view of every switch's files of it (`switch=`, `profile=`, `group=`,
/// `date=` partitions); a tier the engine cannot read is left out (the raw view still answers).
async fn lake_tiers(client: &SparkClient, root: &str, data: &str) -> Vec<LakeTier> {
    let Ok(loc) = crate::catalog::Location::parse(data, false) else {
        return Vec::new();
    };
    let dir = stel_store::paths::TIERS_DIR;
    let mut out = Vec::new();
    for t in loc.subdirs_pub(dir, "tier").await.unwrap_or_default() {
        let Ok(interval_ns) = crate::window::parse_duration_ns(&t) else {
            continue;
        };
        let view = format!("{VIEW}_{}", t.to_ascii_lowercase());
        let sql = format!(
            "CREATE OR REPLACE TEMPORARY VIEW {view} USING parquet OPTIONS (path {}, mergeSchema 'true')",
            string_lit(&format!("{root}{dir}/tier={t}/"))
        );
        if client.sql(&sql).await.is_err() {
            continue;
        }
        let (speed_mbps, thresholds) =
            crate::tiers::tier_rule_at(&loc, &format!("{dir}/tier={t}")).await;
        out.push(LakeTier {
            name: t,
            interval_ns,
            view,
            speed_mbps,
            thresholds,
        });
    }
    out.sort_by_key(|t| std::cmp::Reverse(t.interval_ns));
    out
}

/// The error for a lake of rollup tiers only (`[upload] raw = false`), when `data` is one.
async fn tiers_only(data: &str, root: &str) -> Option<Error> {
    let loc = crate::catalog::Location::parse(data, false).ok()?;
    let tiers = loc
        .subdirs_pub(stel_store::paths::TIERS_DIR, "tier")
        .await
        .ok()?;
    let under = format!("{}/tier=<t>/switch=<s>/", stel_store::paths::TIERS_DIR);
    (!tiers.is_empty()).then(|| crate::catalog::tiers_only(root, &tiers, &under))
}

/// The lake root as a path the server can open: local directories are made absolute.
fn server_path(data: &str) -> String {
    if data.contains("://") {
        return data.trim_end_matches('/').to_string() + "/";
    }
    let p = std::path::Path::new(data);
    let abs = p.canonicalize().unwrap_or_else(|_| p.to_path_buf());
    format!("{}/", abs.display().to_string().trim_end_matches('/'))
}

/// Strings of column `i` of every batch (any string or numeric type, via a cast).
pub fn strings(a: &Answer, i: usize) -> Result<Vec<Option<String>>> {
    let mut out = Vec::new();
    for b in &a.batches {
        let c = datafusion::arrow::compute::cast(b.column(i), &DataType::Utf8)?;
        let s = c.as_string::<i32>();
        out.extend((0..s.len()).map(|k| s.is_valid(k).then(|| s.value(k).to_string())));
    }
    Ok(out)
}

/// Column `name` of a batch cast to Int64.
pub fn i64s(b: &RecordBatch, name: &str) -> Result<Vec<Option<i64>>> {
    let c = b
        .column_by_name(name)
        .ok_or_else(|| Error::Engine(format!("spark: result has no column {name}")))?;
    let c = datafusion::arrow::compute::cast(c, &DataType::Int64)?;
    let a = c.as_primitive::<arrow_array::types::Int64Type>();
    Ok((0..a.len())
        .map(|k| a.is_valid(k).then(|| a.value(k)))
        .collect())
}

/// Column `name` of a batch cast to Float64.
pub fn f64s(b: &RecordBatch, name: &str) -> Result<Vec<Option<f64>>> {
    let c = b
        .column_by_name(name)
        .ok_or_else(|| Error::Engine(format!("spark: result has no column {name}")))?;
    let c = datafusion::arrow::compute::cast(c, &DataType::Float64)?;
    let a = c.as_primitive::<arrow_array::types::Float64Type>();
    Ok((0..a.len())
        .map(|k| a.is_valid(k).then(|| a.value(k)))
        .collect())
}

/// Column `name` of a batch as strings.
pub fn strs(b: &RecordBatch, name: &str) -> Result<Vec<Option<String>>> {
    let c = b
        .column_by_name(name)
        .ok_or_else(|| Error::Engine(format!("spark: result has no column {name}")))?;
    let c = datafusion::arrow::compute::cast(c, &DataType::Utf8)?;
    let a = c.as_string::<i32>();
    Ok((0..a.len())
        .map(|k| a.is_valid(k).then(|| a.value(k).to_string()))
        .collect())
}

/// A switch (or profile) name as the engine returned it, with Hive escapes undone (DataFusion
/// keeps `%XX`; Spark has decoded them already, and then there is nothing to undo).
pub fn partition_value(v: &str) -> String {
    stel_store::paths::unescape_value(v).unwrap_or_else(|| v.to_string())
}

impl Lake {
    /// Connects, registers the view over `data` (a path or URL the server can read), reads the
    /// merged schema and the file list, and checks that the lake has every switch of
    /// `switches` (`--switch`; empty: all).
    ///
    /// # Errors
    /// No server, a path the server cannot read, not a stel lake, a switch it does not have.
    pub async fn open(remote: Remote, data: &str, switches: &[String]) -> Result<Self> {
        let client = SparkClient::connect(remote).await?;
        let version = client.version().await.unwrap_or_default();
        // Apache Spark refuses Parquet's nanosecond timestamps unless they are read as longs;
        // other engines (Sail) have no such setting and say so: not an error.
        let _ = client
            .sql("SET spark.sql.legacy.parquet.nanosAsLong=true")
            .await;
        let root = server_path(data);
        if root.contains('\'') {
            return Err(Error::Usage(format!(
                "lake path {root} must not contain a quote"
            )));
        }
        // The raw files: rollup tiers live under the hidden `_tiers/` (engines skip `_` names
        // when they list the root), each tier its own view ([`LakeTier`]).
        let view = client
            .sql(&format!(
                "CREATE OR REPLACE TEMPORARY VIEW {VIEW} USING parquet OPTIONS (path {}, mergeSchema 'true')",
                string_lit(&root)
            ))
            .await;
        if let Err(e) = view {
            return Err(match tiers_only(data, &root).await {
                Some(t) => t,
                // An error (exit 2), not an empty window: a wrong bucket or path.
                None => Error::Engine(format!("the engine cannot read the lake at {root}: {e}")),
            });
        }
        let desc = client.sql(&format!("DESCRIBE TABLE {VIEW}")).await?;
        let names = strings(&desc, 0)?;
        let types = strings(&desc, 1)?;
        let mut columns = Vec::new();
        let mut ts_type = None;
        let mut partitions = BTreeSet::new();
        for (n, t) in names.iter().zip(&types) {
            let (Some(n), Some(t)) = (n, t) else { continue };
            if n.starts_with('#') || n.is_empty() {
                continue;
            }
            match n.as_str() {
                "ts" => ts_type = Some(t.to_ascii_lowercase()),
                "switch" | "profile" | "group" | "date" | "hour" => {
                    partitions.insert(n.clone());
                }
                _ => {
                    if let Some(c) = Column::parse(n) {
                        if !columns.contains(&c) {
                            columns.push(c);
                        }
                    }
                }
            }
        }
        if partitions.len() < 5 || ts_type.is_none() {
            if partitions.is_empty() {
                if let Some(e) = tiers_only(data, &root).await {
                    return Err(e);
                }
            }
            // A wrong prefix reads as an empty lake: an error (exit 2), not an empty window.
            return Err(Error::Usage(format!(
                "{root} is not a stel lake as the engine sees it (found partitions {partitions:?}; expected switch=…/profile=…/group=…/date=…/hour=…/part-*.parquet with a ts column, store/LAKE.md)"
            )));
        }
        let ts = match ts_type.as_deref() {
            Some("bigint") | Some("long") => "ts".to_string(),
            _ => {
                // Probe the exact form on one row; engines without a nanosecond field get µs.
                let probe = format!("SELECT {TS_NS_NANOS} AS t FROM {VIEW} LIMIT 1");
                if client.sql(&probe).await.is_ok() {
                    TS_NS_NANOS.to_string()
                } else {
                    TS_NS_MICROS.to_string()
                }
            }
        };
        let files = client.input_files(&format!("SELECT * FROM {VIEW}")).await?;
        // Before any question: a name the lake does not have would otherwise be an empty
        // answer ("no bursts in …"), which reads as a fact about the switch.
        crate::fleet::check_switches(data, switches, &switch_names(&files))?;
        let tiers = lake_tiers(&client, &root, data).await;
        Ok(Self {
            client,
            root,
            columns,
            ts,
            files,
            version,
            tiers,
        })
    }

    /// What a summary says about the engine and the pruning: `engine`, `spark_version`,
    /// `files_in_lake`, `files_read`, `files_read_from` (`metrics` or `plan`).
    pub fn about(&self, read: Option<FilesRead>) -> serde_json::Value {
        serde_json::json!({
            "engine": "spark",
            "remote": format!("sc://{}:{}", self.client.remote.host, self.client.remote.port),
            "spark_version": self.version,
            "files_in_lake": self.files.len(),
            "files_read": read.map(|f| f.files),
            "files_read_from": read.map(|f| f.source),
        })
    }

    /// The (date, hour) partitions of `group` that have files, from the file list.
    pub fn hours(&self, group: &str) -> BTreeSet<(String, String)> {
        let g = format!("/group={group}/");
        let mut out = BTreeSet::new();
        for f in self.files.iter().filter(|f| f.contains(&g)) {
            if let Some(h) = stel_store::paths::UtcHour::parse_path(f) {
                out.insert((h.date_value(), h.hour_value()));
            }
        }
        out
    }

    /// How many raw files of the lake `scope` touches by its partitions (group, switch, hours;
    /// the profile is not in every engine's file name form, so it is not counted out): what a
    /// raw question over `scope` reads at most.
    pub fn raw_files(&self, scope: &compile::Scope) -> usize {
        let g = format!("/group={}/", scope.group);
        let (first, last) = (
            stel_store::paths::UtcHour::of_ns(scope.range.from_ns).start_ns(),
            scope.range.to_ns,
        );
        self.files
            .iter()
            .filter(|f| f.contains(&g))
            .filter(|f| {
                scope.switches.is_empty()
                    || switch_of(f).is_some_and(|s| scope.switches.contains(&s))
            })
            .filter(|f| {
                stel_store::paths::UtcHour::parse_path(f)
                    .is_some_and(|h| h.start_ns() >= first && h.start_ns() < last)
            })
            .count()
    }

    /// The newest sample of `group` in the lake: one query over the newest hour's files only.
    ///
    /// # Errors
    /// Engine errors.
    pub async fn newest(&self, group: &str) -> Result<Option<i64>> {
        let Some((d, h)) = self.hours(group).into_iter().next_back() else {
            return Ok(None);
        };
        let a = self
            .client
            .sql(&compile::newest_sql(&self.ts, group, &d, &h))
            .await?;
        Ok(a.batches
            .iter()
            .find(|b| b.num_rows() > 0)
            .map(|b| i64s(b, "t"))
            .transpose()?
            .and_then(|v| v.into_iter().next().flatten()))
    }

    /// Runs `query` and says how many of the lake's files it read: from the engine's metrics
    /// when it reports them (Apache Spark: the scans' "number of files read"), else from its
    /// physical plan (`EXPLAIN VERBOSE`: the files of every Parquet scan after partition
    /// pruning).
    ///
    /// # Errors
    /// Engine errors.
    pub async fn run(&self, query: &str) -> Result<(Answer, Option<FilesRead>)> {
        let a = self.client.sql(query).await?;
        let from_metrics: i64 = a
            .metrics
            .iter()
            .filter(|(_, k, _)| k == "numFiles" || k == "number of files read")
            .map(|(_, _, v)| *v)
            .sum();
        if from_metrics > 0 {
            return Ok((
                a,
                Some(FilesRead {
                    files: from_metrics as u64,
                    source: "metrics",
                }),
            ));
        }
        let plan = match self.client.sql(&format!("EXPLAIN VERBOSE {query}")).await {
            Ok(p) => strings(&p, 0)?
                .into_iter()
                .flatten()
                .collect::<Vec<_>>()
                .join("\n"),
            Err(_) => String::new(),
        };
        let files = plan_files(&plan);
        Ok((
            a,
            (!files.is_empty()).then_some(FilesRead {
                files: files.len() as u64,
                source: "plan",
            }),
        ))
    }
}

/// The switch names of a lake's files (their `switch=<name>/` segment, escapes undone).
pub fn switch_names(files: &[String]) -> Vec<String> {
    let names: BTreeSet<String> = files.iter().filter_map(|f| switch_of(f)).collect();
    names.into_iter().collect()
}

/// The switch a file's path names (its `switch=` partition), if any.
fn switch_of(file: &str) -> Option<String> {
    file.split('/')
        .find_map(|seg| seg.strip_prefix("switch="))
        .map(partition_value)
}

/// One switch's (and profile's) answer.
#[derive(Debug)]
pub struct PerSwitch<T> {
    pub switch: String,
    pub profile: String,
    pub value: T,
}

impl Lake {
    /// The buckets of `columns` over `grid` for every switch of `scope`, computed by the engine
    /// ([`compile::buckets_sql`]) and laid out as the local bucket scan lays them out, so the
    /// commands' own code turns them into rates, drops or peaks.
    ///
    /// # Errors
    /// Engine errors; a grid too fine to bring back (cells over `max_cells`).
    pub async fn buckets(
        &self,
        scope: &compile::Scope,
        columns: &[String],
        grid: crate::engine::Grid,
        aggs: crate::engine::Aggs,
    ) -> Result<(Vec<PerSwitch<crate::engine::Buckets>>, Option<FilesRead>)> {
        use crate::engine::Buckets;
        const MAX_CELLS: usize = 50_000_000;
        if grid.n.saturating_mul(columns.len().max(1)) > MAX_CELLS {
            return Err(Error::Usage(format!(
                "{} buckets × {} columns per switch is too fine to bring back from the engine; use a coarser --resolution",
                grid.n,
                columns.len()
            )));
        }
        let q = compile::buckets_sql(scope, columns, grid.origin_ns, grid.width_ns, aggs.stats);
        let (a, files) = self.run(&q).await?;
        let cols = columns.len();
        let mut out: Vec<PerSwitch<Buckets>> = Vec::new();
        for b in &a.batches {
            let sw = strs(b, "switch")?;
            let pr = strs(b, "profile")?;
            let idx = i64s(b, "i")?;
            let n = i64s(b, "n")?;
            let ft = i64s(b, "ft")?;
            let lt = i64s(b, "lt")?;
            let mut f = Vec::with_capacity(cols);
            let mut l = Vec::with_capacity(cols);
            let mut st = Vec::new();
            for k in 0..cols {
                f.push(i64s(b, &format!("f{k}"))?);
                l.push(i64s(b, &format!("l{k}"))?);
                if aggs.stats {
                    st.push((
                        i64s(b, &format!("mn{k}"))?,
                        i64s(b, &format!("mx{k}"))?,
                        f64s(b, &format!("sm{k}"))?,
                        i64s(b, &format!("ct{k}"))?,
                    ));
                }
            }
            for r in 0..b.num_rows() {
                let switch = partition_value(sw[r].as_deref().unwrap_or_default());
                let profile = partition_value(pr[r].as_deref().unwrap_or_default());
                if out
                    .last()
                    .is_none_or(|p| p.switch != switch || p.profile != profile)
                {
                    out.push(PerSwitch {
                        switch,
                        profile,
                        value: Buckets::new(grid.origin_ns, grid.width_ns, grid.n, cols, aggs),
                    });
                }
                let Some(acc) = out.last_mut().map(|p| &mut p.value) else {
                    continue;
                };
                let (Some(i), Some(lt), Some(ft)) = (idx[r], lt[r], ft[r]) else {
                    continue;
                };
                let Some(i) = usize::try_from(i).ok().filter(|i| *i < grid.n) else {
                    continue;
                };
                acc.rows += n[r].unwrap_or(0) as u64;
                acc.last_ts[i] = lt;
                for k in 0..cols {
                    let cell = i * cols + k;
                    acc.valid[cell] = l[k][r].is_some();
                    acc.last[cell] = l[k][r].unwrap_or(0) as u64;
                    if aggs.stats {
                        let (mn, mx, sm, ct) = &st[k];
                        if let (Some(mn), Some(mx)) = (mn[r], mx[r]) {
                            acc.min[cell] = mn as u64;
                            acc.max[cell] = mx as u64;
                        }
                        acc.sum[cell] = sm[r].unwrap_or(0.0);
                        acc.count[cell] = ct[r].unwrap_or(0) as u64;
                    }
                }
                if acc.first.as_ref().is_none_or(|(t, _, _)| ft < *t) {
                    let v = (0..cols).map(|k| f[k][r].unwrap_or(0) as u64).collect();
                    let ok = (0..cols).map(|k| f[k][r].is_some()).collect();
                    acc.first = Some((ft, v, ok));
                }
            }
        }
        Ok((out, files))
    }

    /// Every microburst of `series` for every switch of `scope` ([`compile::bursts_sql`]).
    ///
    /// # Errors
    /// Engine errors.
    pub async fn bursts(
        &self,
        scope: &compile::Scope,
        series: &[compile::Series],
        p: &compile::BurstParams,
    ) -> Result<(Vec<PerSwitch<crate::burst::Burst>>, Option<FilesRead>)> {
        let (a, files) = self.run(&compile::bursts_sql(scope, series, p)).await?;
        let mut out = Vec::new();
        for b in &a.batches {
            let (sw, pr, ob, dir) = (
                strs(b, "switch")?,
                strs(b, "profile")?,
                strs(b, "object")?,
                strs(b, "dir")?,
            );
            let (st, en, bytes, open) = (
                i64s(b, "start_t")?,
                i64s(b, "end_t")?,
                i64s(b, "bytes")?,
                i64s(b, "open")?,
            );
            let peak = f64s(b, "peak")?;
            for r in 0..b.num_rows() {
                out.push(PerSwitch {
                    switch: partition_value(sw[r].as_deref().unwrap_or_default()),
                    profile: partition_value(pr[r].as_deref().unwrap_or_default()),
                    value: crate::burst::Burst {
                        object: ob[r].clone().unwrap_or_default(),
                        dir: if dir[r].as_deref() == Some("TX") {
                            "TX"
                        } else {
                            "RX"
                        },
                        start_ns: st[r].unwrap_or(0),
                        end_ns: en[r].unwrap_or(0),
                        peak: peak[r].unwrap_or(0.0),
                        bytes: bytes[r].unwrap_or(0).max(0) as u64,
                        open: open[r] == Some(1),
                    },
                });
            }
        }
        Ok((out, files))
    }

    /// Per switch, object and direction: (bursts, total burst time ns, peak %)
    /// ([`compile::burst_totals_sql`]).
    ///
    /// # Errors
    /// Engine errors.
    pub async fn burst_totals(
        &self,
        scope: &compile::Scope,
        series: &[compile::Series],
        p: &compile::BurstParams,
    ) -> Result<(Vec<PerSwitch<BurstTotal>>, Option<FilesRead>)> {
        let (a, files) = self
            .run(&compile::burst_totals_sql(scope, series, p))
            .await?;
        let mut out = Vec::new();
        for b in &a.batches {
            let (sw, pr, ob, dir) = (
                strs(b, "switch")?,
                strs(b, "profile")?,
                strs(b, "object")?,
                strs(b, "dir")?,
            );
            let (n, ns) = (i64s(b, "bursts")?, i64s(b, "burst_ns")?);
            let peak = f64s(b, "peak")?;
            for r in 0..b.num_rows() {
                out.push(PerSwitch {
                    switch: partition_value(sw[r].as_deref().unwrap_or_default()),
                    profile: partition_value(pr[r].as_deref().unwrap_or_default()),
                    value: BurstTotal {
                        object: ob[r].clone().unwrap_or_default(),
                        dir: dir[r].clone().unwrap_or_default(),
                        bursts: n[r].unwrap_or(0).max(0) as u64,
                        burst_ns: ns[r].unwrap_or(0),
                        peak: peak[r].unwrap_or(0.0),
                    },
                });
            }
        }
        Ok((out, files))
    }
}

impl Lake {
    /// `top --by bursts` from tier `t` (its view, threshold `label`): per switch, object and
    /// direction the bursts and their time, and the smallest snapshot interval the rows saw.
    ///
    /// # Errors
    /// Engine errors.
    pub async fn tier_burst_totals(
        &self,
        scope: &compile::Scope,
        t: &LakeTier,
        label: &str,
    ) -> Result<(Vec<PerSwitch<BurstTotal>>, i64, Option<FilesRead>)> {
        let (a, files) = self
            .run(&compile::tier_burst_totals_sql(scope, &t.view, label))
            .await?;
        let mut out = Vec::new();
        let mut min_dt = i64::MAX;
        for b in &a.batches {
            let (sw, pr, ob, dir) = (
                strs(b, "switch")?,
                strs(b, "profile")?,
                strs(b, "object")?,
                strs(b, "dir")?,
            );
            let (n, ns, md) = (i64s(b, "bursts")?, i64s(b, "burst_ns")?, i64s(b, "min_dt")?);
            for r in 0..b.num_rows() {
                if let Some(m) = md[r] {
                    min_dt = min_dt.min(m);
                }
                let bursts = n[r].unwrap_or(0).max(0) as u64;
                if bursts == 0 {
                    continue;
                }
                out.push(PerSwitch {
                    switch: partition_value(sw[r].as_deref().unwrap_or_default()),
                    profile: partition_value(pr[r].as_deref().unwrap_or_default()),
                    value: BurstTotal {
                        object: ob[r].clone().unwrap_or_default(),
                        dir: dir[r].clone().unwrap_or_default(),
                        bursts,
                        burst_ns: ns[r].unwrap_or(0),
                        peak: 0.0,
                    },
                });
            }
        }
        Ok((out, min_dt, files))
    }
}

/// One series' bursts summed up.
#[derive(Debug, Clone, PartialEq)]
pub struct BurstTotal {
    pub object: String,
    pub dir: String,
    pub bursts: u64,
    pub burst_ns: i64,
    pub peak: f64,
}

/// How many files a question read, and where that number comes from (`metrics` or `plan`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FilesRead {
    pub files: u64,
    pub source: &'static str,
}

/// The distinct files of every `DataSourceExec: file_groups={…}` of a DataFusion physical plan
/// (byte ranges `:a..b` of one file count once). Empty when the plan lists none (or elides them).
pub fn plan_files(plan: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = plan;
    while let Some(i) = rest.find("file_groups={") {
        let body = &rest[i + "file_groups={".len()..];
        let end = body.find("]]}").map_or(body.len(), |e| e + 2);
        let groups = &body[..end];
        let list = groups.split_once(": ").map_or(groups, |(_, l)| l);
        for f in list.split(", ") {
            let f = f.trim_matches(|c| c == '[' || c == ']' || c == ' ');
            if f.is_empty() || f == "..." {
                continue;
            }
            let f = match f.rsplit_once(':') {
                Some((p, range)) if range.contains("..") => p,
                _ => f,
            };
            out.insert(f.to_string());
        }
        rest = &body[end.min(body.len())..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_of_a_datafusion_plan() {
        let plan = "ProjectionExec: expr=[…]\n  DataSourceExec: file_groups={2 groups: [[l/switch=a/x.parquet:4..100, l/switch=b/y.parquet], [l/switch=a/x.parquet:100..200]]}, projection=[switch@7 as #7], file_type=parquet\n  DataSourceExec: file_groups={1 group: [[l/switch=c/z.parquet]]}, projection=[a]";
        let f = plan_files(plan);
        assert_eq!(
            f.into_iter().collect::<Vec<_>>(),
            vec![
                "l/switch=a/x.parquet",
                "l/switch=b/y.parquet",
                "l/switch=c/z.parquet"
            ]
        );
        assert!(plan_files("FileScan parquet [ts#1] Batched: true").is_empty());
    }

    #[test]
    fn switch_names_of_the_files() {
        let f = [
            "s3://lake/fleet/switch=leaf-02/profile=p/group=PORT/date=2024-05-01/hour=00/a.parquet",
            "s3://lake/fleet/switch=leaf-01/profile=p/group=PORT/date=2024-05-01/hour=00/b.parquet",
            "s3://lake/fleet/switch=leaf%201/profile=p/group=QUEUE/date=2024-05-01/hour=00/c.parquet",
            "s3://lake/fleet/switch=leaf-01/profile=p/group=QUEUE/date=2024-05-01/hour=00/d.parquet",
        ]
        .map(String::from);
        assert_eq!(switch_names(&f), vec!["leaf 1", "leaf-01", "leaf-02"]);
    }

    #[test]
    fn partition_values_are_unescaped() {
        assert_eq!(partition_value("leaf%201"), "leaf 1");
        assert_eq!(partition_value("leaf 1"), "leaf 1");
        assert_eq!(partition_value("50%"), "50%");
    }
}
