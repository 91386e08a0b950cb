//! `stel-query sql "<query>"`: any SQL over the registered tables.
//!
//! Tables: one wide table per session, `<profile>_<group>` (e.g. `stel_demo_port`: `ts`, one
//! `"<object>.<STAT>"` column per counter, partition columns `date`, `hour`), and the long view
//! `counters(ts, profile, "group", object, stat, value)` over all of them
//! ([`crate::longview`]): filters on `profile`/`group`/`object`/`stat` choose the wide columns
//! read (one column for one object × stat), and `ts` filters reach the partition directories and
//! the Parquet statistics in both.
//!
//! A fleet lake (a root of `switch=<name>/` directories), locally or with `--engine spark`, is
//! the one table `lake`: partition columns `switch`, `profile`, `group`, `date`, `hour`, and the
//! union by name of every file's columns (store/LAKE.md).

use std::{process::ExitCode, time::Instant};

use arrow_array::Array;
use arrow_schema::DataType;
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use futures::StreamExt;
use serde_json::{json, Value};

use crate::{
    catalog::Catalog,
    engine::{check_remote_sql, plan_sql, SqlAccess},
    error::{Error, Result},
    output::{Cell, Printer},
    quarantine::Shape,
    spark::Lake,
};

/// Run SQL over the history (DataFusion dialect).
///
/// Tables: `<profile>_<group>` per session (wide: ts + "<object>.<STAT>" columns, partitions
/// date/hour), its rollup tiers `<profile>_<group>_1s`, `_1m` (when the data has them), the
/// long view counters(ts, profile, "group", object, stat, value), and int_reports, int_hops,
/// int_drops when the data has INT history (a fleet lake: the one table `lake`).
/// `SHOW TABLES` lists them. Read-only unless --allow-writes.
///
/// Examples:
///   stel-query sql 'SHOW TABLES'
///   stel-query sql 'SELECT max(ts), count(*) FROM stel_demo_port'
///   stel-query sql "SELECT object, max(value) - min(value) AS octets FROM counters
///       WHERE stat = 'IF_IN_OCTETS' GROUP BY object ORDER BY 2 DESC LIMIT 5"
///   stel-query sql --csv 'SELECT date_bin(INTERVAL 1 second, ts) AS s,
///       max("Ethernet0.IF_IN_OCTETS") FROM stel_demo_port GROUP BY 1 ORDER BY 1'
#[derive(Debug, clap::Args)]
#[command(verbatim_doc_comment)]
pub struct Args {
    #[command(flatten)]
    pub common: crate::settings::CommonArgs,
    /// The query.
    pub query: String,
    /// Let the statement write or change state (COPY … TO, INSERT, CREATE/DROP, SET). Without
    /// it only reading statements run (SELECT, WITH, VALUES, SHOW, DESCRIBE, EXPLAIN); anything
    /// else is refused before it runs (exit 2).
    #[arg(long)]
    pub allow_writes: bool,
}

fn cell(a: &dyn Array, f: &ArrayFormatter<'_>, i: usize) -> Cell {
    if a.is_null(i) {
        return Cell::na();
    }
    let text = f.value(i).to_string();
    let json = match a.data_type() {
        t if t.is_numeric() => {
            serde_json::from_str::<Value>(&text).unwrap_or(Value::String(text.clone()))
        }
        DataType::Boolean => Value::Bool(text == "true"),
        _ => Value::String(text.clone()),
    };
    Cell { json, text }
}

/// Prints `batches` (a header from `schema`) and returns the printer.
fn print_batches<'a>(
    p: &mut Printer,
    batches: impl IntoIterator<Item = &'a arrow_array::RecordBatch>,
) -> Result<()> {
    let opts = FormatOptions::default().with_null("N/A");
    for b in batches {
        let fmts: Vec<ArrayFormatter<'_>> = b
            .columns()
            .iter()
            .map(|c| ArrayFormatter::try_new(c.as_ref(), &opts))
            .collect::<std::result::Result<_, _>>()?;
        for i in 0..b.num_rows() {
            let cells = b
                .columns()
                .iter()
                .zip(&fmts)
                .map(|(c, f)| cell(c.as_ref(), f, i))
                .collect();
            p.row(cells)?;
        }
    }
    Ok(())
}

/// The fleet lake at `data` (a root of `switch=` directories) as one DataFusion table `lake`
/// with the partition columns switch, profile, group, date, hour and the schema merged by name
/// over every file — the same view `--engine spark` registers.
async fn register_lake(data: &str, strict: bool) -> Result<Catalog> {
    let cat = Catalog::empty(data, strict)?;
    cat.register_listing(
        crate::spark::lake::VIEW,
        "",
        &["switch", "profile", "group", "date", "hour"],
        Shape::Timestamped,
    )
    .await?
    .ok_or_else(|| {
        Error::NotFound(format!(
            "no readable Parquet files under {}",
            cat.location.url
        ))
    })?;
    Ok(cat)
}

/// Everything SQL can name under `data`, registered in one context: for one switch's data the
/// session tables, the long view `counters` and the INT tables (a data dir with only INT tables
/// opens too); for a fleet lake (a root of `switch=` directories) the one table `lake`. Returns
/// the catalog and the names to show as "tables". `stel-query sql` and `stel-query serve` both
/// open their catalog here, so a table added here is queryable from both.
///
/// # Errors
/// An unusable location, no data at all, listing or schema failures.
pub async fn open(data: &str, strict: bool) -> Result<(Catalog, Vec<String>)> {
    let location = crate::catalog::Location::parse(data, false)?;
    if !location.subdirs_pub("", "switch").await?.is_empty() {
        let cat = register_lake(data, strict).await?;
        return Ok((cat, vec![crate::spark::lake::VIEW.to_string()]));
    }
    let cat = match Catalog::open(data, strict).await {
        Ok(c) => c,
        // A data dir with only INT tables is still something to query.
        Err(Error::NotFound(m)) => super::int::int_only_catalog(data, strict)
            .await?
            .ok_or(Error::NotFound(m))?,
        Err(e) => return Err(e),
    };
    crate::longview::LongView::register(&cat).await?;
    // The INT tables (int_reports, int_hops, int_drops) when the data has them.
    super::int::register(&cat).await?;
    // Each session's table and its rollup tiers' (`<table>_<tier>`).
    let t = cat
        .sessions
        .iter()
        .flat_map(|s| {
            std::iter::once(s.table.clone()).chain(s.tiers.iter().map(|t| t.table.clone()))
        })
        .collect();
    Ok((cat, t))
}

/// # Errors
/// Planning or execution failures (the engine's message says what is wrong with the SQL).
pub async fn run(a: Args) -> Result<ExitCode> {
    let started = Instant::now();
    let set = a.common.resolve();
    let access = SqlAccess::from_allow_writes(a.allow_writes);
    let mut p = Printer::new(set.format);
    if let Some(remote) = set.spark_remote()? {
        check_remote_sql(&a.query, access)?;
        let lake = Lake::open(remote, &set.data, &set.switches).await?;
        let (answer, files) = lake.run(&a.query).await?;
        let header: Vec<String> = answer
            .batches
            .first()
            .map(|b| {
                b.schema()
                    .fields()
                    .iter()
                    .map(|f| f.name().clone())
                    .collect()
            })
            .unwrap_or_default();
        let h: Vec<&str> = header.iter().map(String::as_str).collect();
        p.begin(
            &h,
            json!({"command": "sql", "query": a.query, "tables": [crate::spark::lake::VIEW],
                   "columns": header, "engine": "spark"}),
        )?;
        print_batches(&mut p, &answer.batches)?;
        let mut summary = json!({"rows": p.rows(), "elapsed_s": started.elapsed().as_secs_f64()});
        super::merge(&mut summary, lake.about(files));
        p.summary(summary)?;
        return Ok(super::exit_for(p.rows()));
    }
    let (cat, tables) = open(&set.data, set.strict).await?;
    let df = match plan_sql(&cat.ctx, &a.query, access).await {
        // The dashboards' table function exists in the Flight SQL server only.
        Err(Error::DataFusion(e)) if e.to_string().contains("table function 'rates' not found") => {
            return Err(Error::Usage(format!(
                "{e}: rates(…) is a table function of `stel-query serve` (Flight SQL, what the Grafana dashboards query); here, ask `stel-query rates`"
            )))
        }
        r => r?,
    };
    let schema = df.schema().as_arrow().clone();
    let header: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    p.begin(
        &header,
        json!({"command": "sql", "query": a.query, "tables": tables, "columns": header,
               "engine": "local"}),
    )?;
    let mut stream = df.execute_stream().await?;
    while let Some(b) = stream.next().await {
        print_batches(&mut p, [&b?])?;
    }
    p.summary(json!({"rows": p.rows(), "elapsed_s": started.elapsed().as_secs_f64()}))?;
    Ok(super::exit_for(p.rows()))
}
