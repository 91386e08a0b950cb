//! The Parquet tree as DataFusion tables.
//!
//! The daemon writes `<root>/profile=<p>/group=<g>/date=YYYY-MM-DD/hour=HH/part-<first_ns>-<seq>.parquet`
//! (temp files are `.part-*.parquet.tmp` and never match). Each session (profile × group) becomes
//! one listing table named `<profile>_<group>` (lower case, non-alphanumerics → `_`) with the
//! Hive partition columns `date` and `hour`; its schema is the union of its files' schemas, so
//! files written before a template change simply read as null in the columns they lack.
//!
//! Time filters are always given twice: as `date`/`hour` predicates (whole directories are pruned
//! before a file is opened) and as `ts` predicates (row groups whose `ts` statistics miss the
//! window are skipped, and the page index prunes inside a row group).
//!
//! The root is a local directory or `s3://bucket/prefix`; [`Catalog`] also keeps an
//! [`ObjectStore`] rooted at it for listing and for `export`.

use std::{path::PathBuf, sync::Arc};

use arrow_schema::{DataType, SchemaRef};
use datafusion::{
    common::{DFSchema, ScalarValue},
    datasource::{
        file_format::parquet::ParquetFormat,
        listing::{ListingOptions, ListingTable, ListingTableConfig, ListingTableUrl},
        source::DataSourceExec,
    },
    execution::SendableRecordBatchStream,
    logical_expr::{col, lit, Expr},
    physical_plan::ExecutionPlan,
    prelude::{SessionConfig, SessionContext},
};
use object_store::{aws::AmazonS3Builder, local::LocalFileSystem, path::Path, ObjectStore};
use stel_store::paths::unescape_value;
use url::Url;

use crate::{
    error::{Error, Result},
    quarantine::{HidingStore, Quarantine, Shape},
    window::{fmt_ts, TimeRange},
};

/// One counter column of a session's wide table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column {
    /// The Parquet column name, `<object>.<STAT>`.
    pub name: String,
    /// `Ethernet0`, `Ethernet0|3`, `egress_lossless_pool`.
    pub object: String,
    /// Short SAI stat name, `IF_IN_OCTETS`.
    pub stat: String,
}

impl Column {
    /// Splits `<object>.<STAT>` at the last `.` (stat short names never contain one).
    pub fn parse(name: &str) -> Option<Self> {
        let (object, stat) = name.rsplit_once('.')?;
        Some(Self {
            name: name.to_string(),
            object: object.to_string(),
            stat: stat.to_string(),
        })
    }
}

/// One HFT session's history: a table of the wide layout.
#[derive(Debug, Clone)]
pub struct Session {
    pub profile: String,
    pub group: String,
    /// SQL table name.
    pub table: String,
    /// Root-relative directory `profile=<p>/group=<g>`.
    pub dir: String,
    pub schema: SchemaRef,
    pub columns: Vec<Column>,
    /// Its rollup tiers, coarsest first (`crate::tiers`).
    pub tiers: Vec<crate::tiers::Tier>,
    /// Whether raw files back `table` (false for a fleet view standing for several).
    pub raw: bool,
}

impl Session {
    /// Distinct object names, in natural order (Ethernet0, Ethernet4, …, Ethernet100).
    pub fn objects(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for c in &self.columns {
            if out.last() != Some(&c.object) && !out.contains(&c.object) {
                out.push(c.object.clone());
            }
        }
        out.sort_by(|a, b| crate::output::natural_cmp(a, b));
        out
    }

    /// The column for `object` × `stat`, if the session has it.
    pub fn column(&self, object: &str, stat: &str) -> Option<&Column> {
        self.columns
            .iter()
            .find(|c| c.object == object && c.stat == stat)
    }
}

/// SQL-safe table name for a session.
pub fn table_name(profile: &str, group: &str) -> String {
    format!("{profile}_{group}")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .collect()
}

/// Where the data lives.
#[derive(Debug, Clone)]
pub struct Location {
    /// URL of the root directory, with a trailing `/` (`file:///var/lib/stel/`, `s3://b/p/`).
    pub url: Url,
    /// A store whose paths are relative to `prefix`.
    pub store: Arc<dyn ObjectStore>,
    /// The root inside `store`.
    pub prefix: Path,
}

impl Location {
    /// Parses a directory or `s3://bucket/prefix`.
    ///
    /// # Errors
    /// A missing local directory, an unusable URL or S3 settings.
    pub fn parse(s: &str, create: bool) -> Result<Self> {
        if let Some(rest) = s.strip_prefix("s3://") {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            if bucket.is_empty() {
                return Err(Error::Usage(format!(
                    "`{s}` has no bucket; use s3://<bucket>/<prefix>"
                )));
            }
            let store = AmazonS3Builder::from_env()
                .with_bucket_name(bucket)
                .build()
                .map_err(|e| {
                    Error::Usage(format!(
                        "cannot use {s}: {e} (set AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION; AWS_ALLOW_HTTP=true for http endpoints)"
                    ))
                })?;
            let prefix = prefix.trim_matches('/');
            let url = Url::parse(&format!(
                "s3://{bucket}/{}{}",
                prefix,
                if prefix.is_empty() { "" } else { "/" }
            ))
            .map_err(|e| Error::Usage(format!("`{s}`: {e}")))?;
            return Ok(Self {
                url,
                store: Arc::new(store),
                prefix: Path::from(prefix),
            });
        }
        let path = PathBuf::from(s);
        if create {
            std::fs::create_dir_all(&path)
                .map_err(|e| Error::Usage(format!("cannot create {s}: {e}")))?;
        }
        // A directory that is not there is a wrong flag (exit 2), not an empty answer.
        let dir = path.canonicalize().map_err(|_| {
            Error::Usage(format!(
                "no data directory {s} (pass --data-dir <dir|s3://bucket/prefix> or set STEL_DATA_DIR; the daemon writes to ./stel-data by default)"
            ))
        })?;
        let url = Url::from_directory_path(&dir)
            .map_err(|()| Error::Usage(format!("{} is not an absolute path", dir.display())))?;
        let store = LocalFileSystem::new_with_prefix(&dir)?;
        Ok(Self {
            url,
            store: Arc::new(store),
            prefix: Path::default(),
        })
    }

    /// The object-store URL DataFusion registers the store under (`s3://bucket`, `file://`).
    pub fn store_url(&self) -> Url {
        let mut u = self.url.clone();
        u.set_path("");
        u
    }

    /// `prefix/rel` as a store path. `rel` is a path the store wrote (Hive-escaped values, so
    /// only `[A-Za-z0-9_=.%-]`), taken verbatim: `Path::join` would percent-encode the `%` of
    /// `profile=lab%201` into a different key (`lab%25201`), which no listing returns.
    pub fn path(&self, rel: &str) -> Path {
        let rel = rel.trim_matches('/');
        let full = if self.prefix.as_ref().is_empty() {
            rel.to_string()
        } else if rel.is_empty() {
            self.prefix.as_ref().to_string()
        } else {
            format!("{}/{rel}", self.prefix.as_ref())
        };
        Path::parse(&full).unwrap_or_else(|_| {
            // Not a store-written path (empty segments, `..`): escape it part by part.
            rel.split('/')
                .filter(|s| !s.is_empty())
                .fold(self.prefix.clone(), |p, part| p.join(part))
        })
    }

    /// The `key=value` subdirectories of `rel`, values sorted.
    ///
    /// # Errors
    /// Listing failures.
    pub async fn subdirs_pub(&self, rel: &str, key: &str) -> Result<Vec<String>> {
        self.subdirs(rel, key).await
    }

    async fn subdirs(&self, rel: &str, key: &str) -> Result<Vec<String>> {
        let p = self.path(rel);
        let list = self.store.list_with_delimiter(Some(&p)).await?;
        let mut out: Vec<String> = list
            .common_prefixes
            .iter()
            // The directory's own name (object_store 0.13 keeps a listed name verbatim); its
            // value is Hive-escaped by the store.
            .filter_map(|c| c.filename().map(str::to_string))
            .filter_map(|f| f.strip_prefix(&format!("{key}=")).map(str::to_string))
            .collect();
        out.sort();
        Ok(out)
    }
}

/// The registered tables of one data location.
pub struct Catalog {
    pub ctx: SessionContext,
    pub location: Location,
    pub sessions: Vec<Session>,
    /// Files found unreadable or foreign while registering, hidden from the context's scans.
    pub quarantine: Arc<Quarantine>,
}

impl std::fmt::Debug for Catalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Catalog")
            .field("location", &self.location.url.as_str())
            .field("sessions", &self.sessions)
            .finish_non_exhaustive()
    }
}

/// A session context tuned for scans of wide counter files.
pub fn session_context() -> SessionContext {
    let mut cfg = SessionConfig::new()
        .with_target_partitions(
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(2),
        )
        .with_batch_size(16384)
        .with_information_schema(true);
    let opts = cfg.options_mut();
    opts.execution.collect_statistics = true;
    opts.execution.parquet.pushdown_filters = false;
    opts.execution.parquet.pruning = true;
    opts.execution.parquet.enable_page_index = true;
    SessionContext::new_with_config(cfg)
}

/// A root that holds rollup tiers and no raw stream (a lake uploaded with `[upload] raw =
/// false`, or a copy of `tier=` directories): what is there, and where its questions go.
pub fn tiers_only(root: &str, tiers: &[String], under: &str) -> Error {
    Error::Usage(format!(
        "{root} holds rollup tiers only ({} under {under}) and no raw stream: stel-query's questions read the raw stream (and the tiers where they answer), so point it at a switch's data dir or a lake uploaded with [upload] raw = true; the tier files themselves are plain Parquet for DuckDB, Spark or Athena (store/LAKE.md)",
        tiers.join(", ")
    ))
}

impl Catalog {
    /// A context over `data` with no table registered yet. Its object store hides the files
    /// [`Catalog::register_listing`] finds unusable.
    ///
    /// # Errors
    /// An unusable location.
    pub fn empty(data: &str, strict: bool) -> Result<Self> {
        let location = Location::parse(data, false)?;
        let ctx = session_context();
        let quarantine = Arc::new(Quarantine::new(strict));
        ctx.register_object_store(
            &location.store_url(),
            Arc::new(HidingStore::new(
                location.store_for_df()?,
                Arc::clone(&quarantine),
            )),
        );
        Ok(Self {
            ctx,
            location,
            sessions: Vec::new(),
            quarantine,
        })
    }

    /// Opens a data location and registers one table per session found in it. Unreadable or
    /// foreign files are skipped with a warning (`strict`: the first one is the error).
    ///
    /// # Errors
    /// An unusable location, or one that holds no session at all.
    pub async fn open(data: &str, strict: bool) -> Result<Self> {
        let mut cat = Self::empty(data, strict)?;
        let location = &cat.location;
        // Directory values are Hive-escaped (`lab 1` → `profile=lab%201`); tables and messages
        // use the names themselves.
        let mut sessions = Vec::new();
        for pdir in location.subdirs("", "profile").await? {
            let profile = unescape_value(&pdir).unwrap_or_else(|| pdir.clone());
            for gdir in location
                .subdirs(&format!("profile={pdir}"), "group")
                .await?
            {
                let group = unescape_value(&gdir).unwrap_or_else(|| gdir.clone());
                let dir = format!("profile={pdir}/group={gdir}");
                let table = table_name(&profile, &group);
                let Some(schema) = cat
                    .register_listing(&table, &dir, &["date", "hour"], Shape::Counters)
                    .await?
                else {
                    continue;
                };
                let columns = schema
                    .fields()
                    .iter()
                    .filter(|f| f.name() != "ts")
                    .filter_map(|f| Column::parse(f.name()))
                    .collect();
                let tiers = crate::tiers::discover(&cat, &pdir, &gdir, &table).await?;
                sessions.push(Session {
                    profile: profile.clone(),
                    group,
                    table,
                    dir,
                    schema,
                    columns,
                    tiers,
                    raw: true,
                });
            }
        }
        if sessions.is_empty() {
            let tiers = cat.location.subdirs("", "tier").await?;
            if !tiers.is_empty() {
                return Err(tiers_only(cat.location.url.as_ref(), &tiers, "tier=<t>/"));
            }
            // INT history only (`stel-ingestd --int-only`): say where its questions are. Exit 1
            // still, as for a directory with no counter history written yet.
            let int: Vec<String> = cat
                .location
                .subdirs("", "table")
                .await?
                .into_iter()
                .filter(|t| crate::cmd::int::TABLES.contains(&t.as_str()))
                .collect();
            if !int.is_empty() {
                return Err(Error::NotFound(format!(
                    "{} holds INT tables only ({} under table=<t>/), no counter history: ask `stel-query int flows|hops|drops|evc -d {}`, or `stel-query sql` over {}",
                    cat.location.url,
                    int.join(", "),
                    data,
                    int.join(", ")
                )));
            }
            let skipped = cat.quarantine.skipped().len();
            return Err(Error::NotFound(format!(
                "no {}Parquet files under {} (expected profile=<p>/group=<g>/date=…/hour=…/part-*.parquet; is stel-ingestd writing with its Parquet sink, or is --data-dir wrong?)",
                if skipped > 0 { format!("readable ({skipped} skipped) ") } else { String::new() },
                cat.location.url
            )));
        }
        cat.sessions = sessions;
        Ok(cat)
    }

    /// Registers the Parquet files under `rel` (root-relative directory; `""`: the root) as the
    /// table `name`, with the Hive partition columns `parts` (strings). Its schema is the union
    /// of its files' schemas, so files written before a template change simply read as null in
    /// the columns they lack; files that are unreadable or not of `shape` are skipped (see
    /// [`crate::quarantine`]). Returns the schema, `None` when no usable file exists yet.
    ///
    /// # Errors
    /// Listing and engine failures; with --strict, the first bad file.
    pub async fn register_listing(
        &self,
        name: &str,
        rel: &str,
        parts: &[&str],
        shape: Shape,
    ) -> Result<Option<SchemaRef>> {
        // In a URL a `%` of the directory name must be `%25`.
        let rel = rel.trim_matches('/');
        let url = if rel.is_empty() {
            self.location.url.to_string()
        } else {
            format!("{}{}/", self.location.url, rel.replace('%', "%25"))
        };
        self.register_listing_url(name, &url, parts, shape).await
    }

    /// [`Catalog::register_listing`] of a directory given as a URL of this catalog's store (a
    /// lake's `_tiers/…` tree, beside a switch's root).
    ///
    /// # Errors
    /// As [`Catalog::register_listing`].
    pub async fn register_listing_url(
        &self,
        name: &str,
        url: &str,
        parts: &[&str],
        shape: Shape,
    ) -> Result<Option<SchemaRef>> {
        let url = ListingTableUrl::parse(url)?;
        let opts = ListingOptions::new(Arc::new(ParquetFormat::default()))
            .with_file_extension(".parquet")
            .with_table_partition_cols(
                parts
                    .iter()
                    .map(|p| (p.to_string(), DataType::Utf8))
                    .collect(),
            );
        let raw = self.location.store_for_df()?;
        let state = self.ctx.state();
        let Some(schema) =
            crate::quarantine::infer_schema(&state, &raw, &url, &opts, shape, &self.quarantine)
                .await?
        else {
            return Ok(None);
        };
        let config = ListingTableConfig::new(url)
            .with_listing_options(opts)
            .with_schema(Arc::clone(&schema));
        // The context's file statistics cache (what `register_listing_table` would attach):
        // without it every query recomputes the statistics of every file it lists — on wide
        // counter files the biggest part of planning a chunk. Entries are checked against the
        // file's size and modification time, so files that arrive or change are read again.
        let stats = self
            .ctx
            .runtime_env()
            .cache_manager
            .get_file_statistic_cache();
        self.ctx.register_table(
            name,
            Arc::new(ListingTable::try_new(config)?.with_cache(stats)),
        )?;
        Ok(Some(schema))
    }

    /// The session for `profile` (optional when there is one) and `group`.
    ///
    /// # Errors
    /// [`Error::Usage`] (exit 2) for a group no session has: the message says which groups
    /// the history has (`--profile` cannot help). [`Error::NotFound`] when the group exists
    /// under other profiles only, or there are no sessions at all; the message lists them.
    pub fn session(&self, profile: Option<&str>, group: &str) -> Result<&Session> {
        if !self.sessions.is_empty() && !self.has_group(group) {
            return Err(Error::Usage(format!(
                "no {group} session under {}: this history has {} only",
                self.location.url,
                self.groups()
            )));
        }
        let found: Vec<&Session> = self
            .sessions
            .iter()
            .filter(|s| s.group.eq_ignore_ascii_case(group))
            .filter(|s| profile.is_none_or(|p| s.profile == p))
            .collect();
        match found.as_slice() {
            [one] => Ok(one),
            [] => Err(Error::NotFound(format!(
                "no {group} session{} under {}; sessions: {} (pick one with --profile)",
                profile
                    .map(|p| format!(" for profile {p}"))
                    .unwrap_or_default(),
                self.location.url,
                self.list()
            ))),
            many => Err(Error::Usage(format!(
                "{} profiles have a {group} session ({}); pick one with --profile",
                many.len(),
                many.iter()
                    .map(|s| s.profile.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))),
        }
    }

    /// Whether some session (of any profile) is of `group`.
    pub fn has_group(&self, group: &str) -> bool {
        self.sessions
            .iter()
            .any(|s| s.group.eq_ignore_ascii_case(group))
    }

    /// The groups the sessions are of, for messages: `PORT`, `PORT and QUEUE`,
    /// `BUFFER_POOL, PORT and QUEUE`.
    pub fn groups(&self) -> String {
        let mut g: Vec<&str> = self.sessions.iter().map(|s| s.group.as_str()).collect();
        g.sort_unstable();
        g.dedup();
        match g.split_last() {
            Some((last, rest)) if !rest.is_empty() => format!("{} and {last}", rest.join(", ")),
            _ => g.join(""),
        }
    }

    /// `profile/group` of every session, for messages.
    pub fn list(&self) -> String {
        self.sessions
            .iter()
            .map(|s| format!("{}/{}", s.profile, s.group))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// First and last sample time of a session, raw files and rollup tiers together (a tier's
    /// first and last summarised snapshot: a window ending at "the newest sample" ends there,
    /// not at the end of the tier's last interval).
    ///
    /// # Errors
    /// Engine failures.
    pub async fn extent(&self, s: &Session) -> Result<Option<(i64, i64)>> {
        let mut e = self.raw_extent(s).await?;
        for t in &s.tiers {
            if let Some((a, b)) = t.samples {
                e = Some(e.map_or((a, b - 1), |(x, y)| (x.min(a), y.max(b - 1))));
            }
        }
        Ok(e)
    }

    /// First and last sample time of a session's raw files (from Parquet statistics; cheap).
    ///
    /// # Errors
    /// Engine failures.
    pub async fn raw_extent(&self, s: &Session) -> Result<Option<(i64, i64)>> {
        let df = self
            .ctx
            .sql(&format!(
                "SELECT CAST(min(ts) AS BIGINT), CAST(max(ts) AS BIGINT) FROM \"{}\"",
                s.table
            ))
            .await?;
        let batches = df.collect().await?;
        let Some(b) = batches.first().filter(|b| b.num_rows() > 0) else {
            return Ok(None);
        };
        let get = |i: usize| {
            b.column(i)
                .as_any()
                .downcast_ref::<arrow_array::Int64Array>()
                .and_then(|a| (!a.is_null(0)).then(|| a.value(0)))
        };
        use arrow_array::Array;
        Ok(get(0).zip(get(1)))
    }

    /// First and last sample time of a session inside `r` (partition and `ts` statistics prune
    /// the scan to the window's files and row groups; only `ts` is read).
    ///
    /// # Errors
    /// Engine failures.
    pub async fn extent_in(&self, s: &Session, r: &TimeRange) -> Result<Option<(i64, i64)>> {
        use datafusion::functions_aggregate::expr_fn::{max, min};
        let ts = || datafusion::logical_expr::cast(col("ts"), DataType::Int64);
        let df = self
            .ctx
            .table(s.table.as_str())
            .await?
            .filter(time_filter(r))?
            .aggregate(vec![], vec![min(ts()).alias("a"), max(ts()).alias("b")])?;
        let batches = df.collect().await?;
        let Some(b) = batches.first().filter(|b| b.num_rows() > 0) else {
            return Ok(None);
        };
        use arrow_array::Array;
        let get = |i: usize| {
            b.column(i)
                .as_any()
                .downcast_ref::<arrow_array::Int64Array>()
                .and_then(|a| (!a.is_null(0)).then(|| a.value(0)))
        };
        Ok(get(0).zip(get(1)))
    }

    /// Each port's speed in Mb/s as the daemon recorded it (SONiC's PORT tables, footer key
    /// `stel.port_speed_mbps`) in the newest readable file of `s`; empty when it recorded none.
    ///
    /// # Errors
    /// Listing or footer read failures.
    pub async fn port_speeds(
        &self,
        s: &Session,
    ) -> Result<std::collections::BTreeMap<String, f64>> {
        use datafusion::datasource::physical_plan::parquet::metadata::DFParquetMetadata;
        use futures::TryStreamExt;
        let store = self
            .ctx
            .runtime_env()
            .object_store(ListingTableUrl::parse(self.location.url.as_str())?)?;
        let prefix = ListingTableUrl::parse(format!(
            "{}{}/",
            self.location.url,
            s.dir.replace('%', "%25")
        ))?;
        let newest = store
            .list(Some(prefix.prefix()))
            .try_filter(|m| {
                futures::future::ready(m.location.as_ref().ends_with(".parquet") && m.size > 0)
            })
            .try_fold(None::<object_store::ObjectMeta>, |acc, m| async move {
                Ok(match acc {
                    Some(a) if a.location >= m.location => Some(a),
                    _ => Some(m),
                })
            })
            .await?;
        let Some(m) = newest else {
            return Ok(Default::default());
        };
        let md = DFParquetMetadata::new(store.as_ref(), &m)
            .with_file_metadata_cache(Some(
                self.ctx
                    .runtime_env()
                    .cache_manager
                    .get_file_metadata_cache(),
            ))
            .fetch_metadata()
            .await?;
        let json = md
            .file_metadata()
            .key_value_metadata()
            .and_then(|kv| {
                kv.iter()
                    .find(|k| k.key == stel_store::parquet::keys::PORT_SPEED_MBPS)
            })
            .and_then(|k| k.value.clone());
        Ok(json
            .and_then(|j| serde_json::from_str::<std::collections::BTreeMap<String, f64>>(&j).ok())
            .unwrap_or_default()
            .into_iter()
            .filter(|(_, v)| *v > 0.0)
            .collect())
    }

    /// Error for a window with no data: says which range exists.
    pub async fn empty_window(&self, s: &Session, r: &TimeRange) -> Error {
        match self.extent(s).await {
            Ok(Some((a, b))) => Error::NotFound(format!(
                "no samples of {}/{} in {r}; data exists for {}..{} (use --from/--to or --last inside that range)",
                s.profile,
                s.group,
                fmt_ts(a),
                fmt_ts(b)
            )),
            _ => Error::NotFound(format!("no samples of {}/{} at all", s.profile, s.group)),
        }
    }

    /// Streams `ts` plus `columns` of `s` around `r`, split into (up to) `partitions` streams
    /// by file byte ranges.
    ///
    /// The table's own scan is used directly, without a logical plan: the window prunes
    /// `date`/`hour` directories, row groups and pages (statistics), but rows are **not**
    /// filtered — callers keep only rows inside `r` (the bucket engine does so for free, while a
    /// filter operator would copy every batch that straddles an edge). Skipping the planner also
    /// skips resolving the projection against a 1,920-column schema on every chunk.
    ///
    /// # Errors
    /// Engine failures.
    pub async fn scan_partitions(
        &self,
        s: &Session,
        columns: &[String],
        r: &TimeRange,
        partitions: usize,
    ) -> Result<Vec<SendableRecordBatchStream>> {
        let table = self.ctx.table_provider(s.table.as_str()).await?;
        let schema = table.schema();
        let mut proj = vec![schema.index_of("ts")?];
        for c in columns {
            proj.push(schema.index_of(c)?);
        }
        let ts_type = schema.field(proj[0]).data_type().clone();
        let mut state = self.ctx.state();
        state.config_mut().options_mut().execution.target_partitions = partitions.max(1);
        let plan = table
            .scan(&state, Some(&proj), &[partition_filter(r)], None)
            .await?;
        let plan = with_pruning(plan, &ts_filter_typed(r, &ts_type), &state)?;
        let plan = if partitions > 1 {
            plan.repartitioned(partitions, state.config_options())?
                .unwrap_or(plan)
        } else {
            plan
        };
        let ctx = state.task_ctx();
        use datafusion::physical_plan::ExecutionPlanProperties;
        (0..plan.output_partitioning().partition_count())
            .map(|i| plan.execute(i, Arc::clone(&ctx)).map_err(Into::into))
            .collect()
    }
}

impl Location {
    /// The store DataFusion reads through: for local data the plain filesystem (DataFusion's
    /// URLs are absolute paths), for S3 the bucket's store.
    pub fn store_for_df(&self) -> Result<Arc<dyn ObjectStore>> {
        if self.url.scheme() == "file" {
            Ok(Arc::new(LocalFileSystem::new()))
        } else {
            Ok(Arc::clone(&self.store))
        }
    }
}

fn ts_lit(ns: i64) -> Expr {
    lit(ScalarValue::TimestampNanosecond(
        Some(ns),
        Some("UTC".into()),
    ))
}

/// The `ts` predicates of [`time_filter`] with literals of the column's exact type (a scan
/// built directly from a table gets no type coercion).
fn ts_filter_typed(r: &TimeRange, ts_type: &DataType) -> Expr {
    let tz = match ts_type {
        DataType::Timestamp(_, tz) => tz.clone(),
        _ => Some("UTC".into()),
    };
    let l = |ns: i64| lit(ScalarValue::TimestampNanosecond(Some(ns), tz.clone()));
    col("ts").gt_eq(l(r.from_ns)).and(col("ts").lt(l(r.to_ns)))
}

/// Gives a table scan `predicate` (over its output columns) for statistics pruning: row groups
/// and pages whose statistics miss it are skipped. Rows are not filtered.
///
/// DataFusion 55's `ListingTable::scan` uses filters only for partition pruning; the planner
/// normally hands a `FilterExec`'s predicate down to the Parquet source afterwards. Scans built
/// without the planner (the bucket engine, the long view) do that step here.
///
/// # Errors
/// A predicate that does not fit the scan's schema.
pub fn with_pruning(
    plan: Arc<dyn ExecutionPlan>,
    predicate: &Expr,
    state: &dyn datafusion::catalog::Session,
) -> Result<Arc<dyn ExecutionPlan>> {
    let Some(exec) = plan.downcast_ref::<DataSourceExec>() else {
        return Ok(plan);
    };
    let schema = DFSchema::try_from(plan.schema())?;
    let pe = state.create_physical_expr(predicate.clone(), &schema)?;
    let res = exec
        .data_source()
        .try_pushdown_filters(vec![pe], state.config_options())?;
    Ok(match res.updated_node {
        Some(ds) => Arc::new(exec.clone().with_data_source(ds)),
        None => plan,
    })
}

/// `date`/`hour` partition predicates for `ts` in `[lo, hi]` (inclusive; `None`: unbounded):
/// whole hour directories outside the range are pruned before any file is opened.
pub(crate) fn partition_bounds(lo: Option<i64>, hi: Option<i64>) -> Vec<Expr> {
    use stel_store::paths::UtcHour;
    let mut out = Vec::new();
    if let Some(lo) = lo {
        let h = UtcHour::of_ns(lo);
        let d = h.date_value();
        out.push(
            col("date").gt(lit(d.clone())).or(col("date")
                .eq(lit(d))
                .and(col("hour").gt_eq(lit(h.hour_value())))),
        );
    }
    if let Some(hi) = hi {
        let h = UtcHour::of_ns(hi);
        let d = h.date_value();
        out.push(
            col("date").lt(lit(d.clone())).or(col("date")
                .eq(lit(d))
                .and(col("hour").lt_eq(lit(h.hour_value())))),
        );
    }
    out
}

/// `date`/`hour` partition predicates for `[from, to)`.
fn partition_filter(r: &TimeRange) -> Expr {
    partition_bounds(Some(r.from_ns), Some(r.to_ns - 1))
        .into_iter()
        .reduce(Expr::and)
        .expect("two bounds")
}

/// `date`/`hour` partition predicates plus `ts` predicates for `[from, to)`.
pub fn time_filter(r: &TimeRange) -> Expr {
    partition_filter(r)
        .and(col("ts").gt_eq(ts_lit(r.from_ns)))
        .and(col("ts").lt(ts_lit(r.to_ns)))
}

/// SQL text of [`time_filter`], for engines given SQL (the DuckDB baseline, `sql` help).
pub fn time_filter_sql(r: &TimeRange) -> String {
    format!(
        "ts >= '{}' AND ts < '{}'",
        fmt_ts_sql(r.from_ns),
        fmt_ts_sql(r.to_ns)
    )
}

fn fmt_ts_sql(ns: i64) -> String {
    chrono::DateTime::from_timestamp_nanos(ns)
        .format("%Y-%m-%d %H:%M:%S%.9f+00")
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn column_names_split_at_the_last_dot() {
        let c = Column::parse("Ethernet0|3.WATERMARK_BYTES").unwrap();
        assert_eq!(c.object, "Ethernet0|3");
        assert_eq!(c.stat, "WATERMARK_BYTES");
        assert_eq!(table_name("stel_demo", "PORT"), "stel_demo_port");
        assert_eq!(table_name("a-b", "QUEUE"), "a_b_queue");
    }
}
