//! `stel-query sql "<query>"`: any SQL over the registered tables.
//!
//! Tables: one wide table per session, `<profile>_<group>` (e.g. `stel_demo_port`: `ts`, one
//! `"<object>.<STAT>"` column per counter, partition columns `date`, `hour`), and the long view
//! `counters(ts, profile, "group", object, stat, value)` over all of them
//! ([`crate::longview`]): filters on `profile`/`group`/`object`/`stat` choose the wide columns
//! read (one column for one object × stat), and `ts` filters reach the partition directories and
//! the Parquet statistics in both.

use std::{process::ExitCode, time::Instant};

use arrow_array::Array;
use arrow_schema::DataType;
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use futures::StreamExt;
use serde_json::{json, Value};

use crate::{
    catalog::Catalog,
    error::Result,
    output::{Cell, Printer},
};

/// Run SQL over the history (DataFusion dialect).
///
/// Tables: `<profile>_<group>` per session (wide: ts + "<object>.<STAT>" columns, partitions
/// date/hour) and the long view counters(ts, profile, "group", object, stat, value).
/// `SHOW TABLES` lists them.
///
/// Examples:
///   stel-query sql 'SHOW TABLES'
///   stel-query sql 'SELECT max(ts), count(*) FROM stel_demo_port'
///   stel-query sql "SELECT object, max(value) - min(value) AS octets FROM counters WHERE stat = 'IF_IN_OCTETS' GROUP BY object ORDER BY 2 DESC LIMIT 5"
///   stel-query sql 'SELECT date_bin(INTERVAL 1 second, ts) AS s, max("Ethernet0.IF_IN_OCTETS") FROM stel_demo_port GROUP BY 1 ORDER BY 1' --csv
#[derive(Debug, clap::Args)]
#[command(verbatim_doc_comment)]
pub struct Args {
    #[command(flatten)]
    pub common: crate::settings::CommonArgs,
    /// The query.
    pub query: String,
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

/// # Errors
/// Planning or execution failures (the engine's message says what is wrong with the SQL).
pub async fn run(a: Args) -> Result<ExitCode> {
    let started = Instant::now();
    let set = a.common.resolve();
    let cat = match Catalog::open(&set.data).await {
        Ok(c) => c,
        // A data dir with only INT tables is still something to query.
        Err(crate::error::Error::NotFound(m)) => super::int::int_only_catalog(&set.data)
            .await?
            .ok_or(crate::error::Error::NotFound(m))?,
        Err(e) => return Err(e),
    };
    if a.query.to_ascii_lowercase().contains("counters") {
        crate::longview::LongView::register(&cat).await?;
    }
    // The INT tables (int_reports, int_hops, int_drops) when the data has them.
    super::int::register(&cat.ctx, &cat.location).await?;
    let df = cat.ctx.sql(&a.query).await?;
    let schema = df.schema().as_arrow().clone();
    let header: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    let mut p = Printer::new(set.format);
    p.begin(
        &header,
        json!({"command": "sql", "query": a.query,
               "tables": cat.sessions.iter().map(|s| &s.table).collect::<Vec<_>>(),
               "columns": header}),
    )?;
    let mut stream = df.execute_stream().await?;
    let opts = FormatOptions::default().with_null("N/A");
    while let Some(b) = stream.next().await {
        let b = b?;
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
    p.summary(json!({"rows": p.rows(), "elapsed_s": started.elapsed().as_secs_f64()}))?;
    Ok(super::exit_for(p.rows()))
}
