//! `stel-query int flows|hops|drops|evc`: questions about the INT tables (`int_reports`,
//! `int_hops`, `int_drops` under `table=<t>/switch=<id>/date=…/hour=…`, written by the INT sink).
//!
//! Each question is one SQL query over the tables registered here ([`register`], also used by
//! `stel-query sql`), with the time window pushed down as `ts` bounds (and so to the Parquet
//! statistics). Same conventions as the other commands: `--since/--from/--to/--last`, table,
//! `--json` or `--csv`, exit 0 rows / 1 none / 2 error.

use std::{process::ExitCode, time::Instant};

use arrow_array::Array;
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use futures::StreamExt;
use serde_json::{json, Value};

use crate::{
    catalog::Catalog,
    error::{Error, Result},
    output::{Cell, Format, Printer},
    quarantine::Shape,
    settings::{CommonArgs, TimeArgs},
};

/// The INT tables.
pub const TABLES: [&str; 3] = ["int_reports", "int_hops", "int_drops"];

/// Registers every INT table present in `cat`'s location (partition columns `switch`, `date`,
/// `hour`); returns the names registered.
///
/// # Errors
/// Listing or schema inference failures.
pub async fn register(cat: &Catalog) -> Result<Vec<&'static str>> {
    let present = cat.location.subdirs_pub("", "table").await?;
    let mut out = Vec::new();
    for t in TABLES {
        if !present.iter().any(|p| p == t) {
            continue;
        }
        if cat.ctx.table_exist(t)?
            || cat
                .register_listing(
                    t,
                    &format!("table={t}"),
                    &["switch", "date", "hour"],
                    Shape::Timestamped,
                )
                .await?
                .is_some()
        {
            out.push(t);
        }
    }
    Ok(out)
}

/// A catalog with no counter session, only the INT tables (`None` when there are none either).
///
/// # Errors
/// An unusable location, listing or schema failures.
pub async fn int_only_catalog(data: &str, strict: bool) -> Result<Option<Catalog>> {
    let cat = Catalog::empty(data, strict)?;
    if register(&cat).await?.is_empty() {
        return Ok(None);
    }
    Ok(Some(cat))
}

/// Questions about INT telemetry: flow latency, per-hop breakdown, drops, per-EVC latency.
///
/// Examples:
///   stel-query int flows --last 10m -n 10   # flows by worst end-to-end latency
///   stel-query int hops --flow 1234567890   # one flow's per-hop latency, queues
///   stel-query int drops --since 1h         # drops by switch and reason
///   stel-query int evc --json               # per-EVC p50/p99/max, jitter, loss
#[derive(Debug, clap::Args)]
#[command(verbatim_doc_comment)]
pub struct Args {
    #[command(flatten)]
    pub common: CommonArgs,
    #[command(flatten)]
    pub time: TimeArgs,
    /// What to ask.
    #[arg(value_enum)]
    pub what: What,
    /// Rows to show (flows).
    #[arg(long, short = 'n', default_value_t = 20)]
    pub top: usize,
    /// The flow (its `flow_key`, as `int flows` prints it) for `hops`.
    #[arg(long)]
    pub flow: Option<u64>,
    /// Chart it over time — end-to-end latency per EVC (flows, evc), mean latency per hop
    /// (hops), drops per reason (drops): alone in the terminal (table output), with a file name
    /// as an image (`--plot evc.svg`, `--plot evc.png`).
    #[arg(long, num_args = 0..=1, default_missing_value = "", value_name = "FILE.svg|FILE.png")]
    pub plot: Option<String>,
}

/// `stel-query int <what>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum What {
    /// Flows ranked by their worst latency (sum of hop latencies).
    Flows,
    /// Per-hop latency and queue occupancy of one flow (--flow), or of all flows per switch.
    Hops,
    /// Drops by reporting switch and reason.
    Drops,
    /// Per EVC: reports, latency p50/p99/max, jitter (stddev), reports lost, path changes.
    Evc,
}

fn cell(a: &dyn Array, f: &ArrayFormatter<'_>, i: usize) -> Cell {
    if a.is_null(i) {
        return Cell::na();
    }
    let text = f.value(i).to_string();
    let json = if a.data_type().is_numeric() {
        serde_json::from_str::<Value>(&text).unwrap_or(Value::String(text.clone()))
    } else {
        Value::String(text.clone())
    };
    Cell { json, text }
}

/// ` AND <the hop row's report is of flow `f`>` for a query over `int_hops` aliased `h`: hop
/// rows do not repeat report-level columns, a hop belongs to the `int_reports` row with the same
/// (`ts`, `switch_id`, `hw_id`, `seq`, `report_index`). A semi-join (`EXISTS`), so a report
/// stored twice never counts its hops twice; `win` bounds the reports read.
fn of_flow(flow: Option<u64>, win: &str) -> String {
    flow.map(|f| {
        format!(
            " AND EXISTS (SELECT 1 FROM int_reports r WHERE r.{} AND r.flow_key = {f} \
             AND r.ts = h.ts AND r.switch_id = h.switch_id AND r.hw_id = h.hw_id \
             AND r.seq = h.seq AND r.report_index = h.report_index)",
            win.replace(" AND ts ", " AND r.ts ")
        )
    })
    .unwrap_or_default()
}

fn sql(a: &Args, from: i64, to: i64) -> (String, &'static str) {
    let win = format!("ts >= to_timestamp_nanos({from}) AND ts < to_timestamp_nanos({to})");
    match a.what {
        What::Flows => (
            format!(
                "SELECT flow_key, max(vlan) AS vlan, max(evc_name) AS evc_name, \
                 arrow_cast(max(ip_proto), 'Int64') AS proto, max(src_port) AS src_port, \
                 max(dst_port) AS dst_port, count(*) AS reports, max(hop_count) AS hops, \
                 CAST(avg(latency_sum_ns) AS BIGINT) AS avg_latency_ns, \
                 max(latency_sum_ns) AS max_latency_ns, \
                 sum(CAST(path_changed AS INT)) AS path_changes \
                 FROM int_reports WHERE {win} AND flow_key IS NOT NULL \
                 GROUP BY flow_key ORDER BY max_latency_ns DESC NULLS LAST LIMIT {}",
                a.top
            ),
            "int_reports",
        ),
        What::Hops => {
            let flow = of_flow(a.flow, &win);
            (
                format!(
                    "SELECT hop_index, node_id, count(*) AS reports, \
                     CAST(avg(latency_ns) AS BIGINT) AS avg_latency_ns, \
                     max(latency_ns) AS max_latency_ns, \
                     CAST(avg(queue_occupancy) AS BIGINT) AS avg_queue_occupancy, \
                     max(queue_occupancy) AS max_queue_occupancy \
                     FROM int_hops h WHERE {win}{flow} \
                     GROUP BY hop_index, node_id ORDER BY hop_index, node_id"
                ),
                "int_hops",
            )
        }
        What::Drops => (
            format!(
                "SELECT switch_id, drop_reason, count(*) AS drops, \
                 count(DISTINCT flow_key) AS flows, max(evc_id) AS evc_id \
                 FROM int_drops WHERE {win} \
                 GROUP BY switch_id, drop_reason ORDER BY drops DESC"
            ),
            "int_drops",
        ),
        What::Evc => (
            format!(
                "SELECT evc_id, max(evc_name) AS evc_name, count(*) AS reports, \
                 CAST(approx_percentile_cont(latency_sum_ns, 0.5) AS BIGINT) AS p50_ns, \
                 CAST(approx_percentile_cont(latency_sum_ns, 0.99) AS BIGINT) AS p99_ns, \
                 max(latency_sum_ns) AS max_ns, \
                 CAST(stddev(latency_sum_ns) AS BIGINT) AS jitter_ns, \
                 sum(seq_gap) AS lost_before, \
                 sum(CAST(path_changed AS INT)) AS path_changes, \
                 count(DISTINCT path_id) AS paths \
                 FROM int_reports WHERE {win} AND evc_id IS NOT NULL \
                 GROUP BY evc_id ORDER BY evc_id"
            ),
            "int_reports",
        ),
    }
}

/// The question over time, in about 120 buckets of the window, at most 8 series.
async fn series(
    ctx: &datafusion::prelude::SessionContext,
    what: What,
    flow: Option<u64>,
    r: crate::settings::TimeRange,
) -> Result<(Vec<crate::plot::Series>, crate::chart::Labels<'static>)> {
    let w = ((r.to_ns - r.from_ns) / 120).max(1);
    let win = format!(
        "ts >= to_timestamp_nanos({}) AND ts < to_timestamp_nanos({})",
        r.from_ns, r.to_ns
    );
    let t = format!("CAST(ts AS BIGINT) / {w} * {w}");
    let (q, labels) = match what {
        What::Flows | What::Evc => (
            format!(
                "SELECT {t} AS t, CAST(coalesce(evc_name, evc_id) AS VARCHAR) AS s, \
                     CAST(max(latency_sum_ns) AS DOUBLE) / 1000 AS v FROM int_reports \
                     WHERE {win} AND evc_id IS NOT NULL GROUP BY 1, 2 ORDER BY 2, 1"
            ),
            crate::chart::Labels {
                title: "worst end-to-end latency per EVC",
                y: "latency (µs, max per interval)",
            },
        ),
        What::Hops => (
            format!(
                "SELECT {t} AS t, concat('hop ', CAST(hop_index AS VARCHAR)) AS s, \
                     CAST(avg(latency_ns) AS DOUBLE) / 1000 AS v FROM int_hops h WHERE {win}{} \
                     GROUP BY 1, 2 ORDER BY 2, 1",
                of_flow(flow, &win)
            ),
            crate::chart::Labels {
                title: "mean latency per hop",
                y: "latency (µs, mean per interval)",
            },
        ),
        What::Drops => (
            format!(
                "SELECT {t} AS t, concat('reason ', CAST(drop_reason AS VARCHAR)) AS s, \
                     CAST(count(*) AS DOUBLE) AS v FROM int_drops WHERE {win} \
                     GROUP BY 1, 2 ORDER BY 2, 1"
            ),
            crate::chart::Labels {
                title: "drops per reason",
                y: "drop reports per interval",
            },
        ),
    };
    let mut out: Vec<crate::plot::Series> = Vec::new();
    for b in ctx.sql(&q).await?.collect().await? {
        use arrow_array::cast::AsArray;
        let ts = b.column(0).as_primitive::<arrow_array::types::Int64Type>();
        // Text comes back as Utf8 or Utf8View depending on the expression.
        let name = datafusion::arrow::compute::cast(b.column(1), &arrow_schema::DataType::Utf8)?;
        let name = name.as_string::<i32>();
        let v = b
            .column(2)
            .as_primitive::<arrow_array::types::Float64Type>();
        for i in 0..b.num_rows() {
            let n = name.value(i);
            match out.iter().position(|s| s.0 == n) {
                Some(k) => out[k].1.push((ts.value(i), v.value(i))),
                None if out.len() < 8 => out.push((n.to_string(), vec![(ts.value(i), v.value(i))])),
                None => {}
            }
        }
    }
    Ok((out, labels))
}

/// # Errors
/// No INT data, bad flags, query failures.
pub async fn run(a: Args) -> Result<ExitCode> {
    let started = Instant::now();
    let set = a.common.resolve();
    let cat = Catalog::empty(&set.data, set.strict)?;
    let tables = register(&cat).await?;
    let (ctx, location) = (&cat.ctx, &cat.location);
    let needed = match a.what {
        What::Hops => "int_hops",
        What::Drops => "int_drops",
        _ => "int_reports",
    };
    if !tables.contains(&needed) {
        if a.what == What::Drops && tables.contains(&"int_reports") {
            // Reports exist but no switch reported a drop: an empty answer, not an error.
            let mut p = Printer::new(set.format);
            p.begin(
                &["switch_id", "drop_reason", "drops"],
                json!({"command": "int drops"}),
            )?;
            p.summary(json!({"rows": 0}))?;
            return Ok(super::exit_for(0));
        }
        let unpublished = location.url.to_file_path().map_or(0, |root| {
            stel_store::int::tree::unpublished_parts(&root, needed)
        });
        if unpublished > 0 {
            return Err(Error::NotFound(format!(
                "no published INT table {needed} under {} yet: {unpublished} part(s) are still being written (stel-ingestd publishes a switch's files once it has sent nothing for [int.parquet] idle_publish_ms, 2 s by default, and at the latest every flush_interval_ms); try again in a few seconds",
                location.url
            )));
        }
        return Err(Error::NotFound(format!(
            "no INT table {needed} under {} (expected table={needed}/switch=<id>/date=…/hour=…/part-*.parquet; is the INT source on, or is --data-dir wrong?)",
            location.url
        )));
    }
    // The window: relative to the newest report.
    let ext = ctx
        .sql(&format!(
            "SELECT CAST(min(ts) AS BIGINT), CAST(max(ts) AS BIGINT) FROM {needed}"
        ))
        .await?
        .collect()
        .await?;
    let extent = ext.first().filter(|b| b.num_rows() > 0).and_then(|b| {
        let get = |i: usize| {
            b.column(i)
                .as_any()
                .downcast_ref::<arrow_array::Int64Array>()
                .and_then(|c| (!c.is_null(0)).then(|| c.value(0)))
        };
        get(0).zip(get(1))
    });
    let mut time = a.time.clone();
    if time.since.is_none() && time.from.is_none() && time.last.is_none() {
        // Default: everything there is (INT history is sparse compared with counters).
        time.from = extent.map(|(f, _)| f.to_string());
    }
    let r = time.resolve(extent)?;
    let (q, _) = sql(&a, r.from_ns, r.to_ns);
    let df = ctx.sql(&q).await?;
    let schema = df.schema().as_arrow().clone();
    let header: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    let mut p = Printer::new(set.format);
    p.begin(
        &header,
        json!({"command": format!("int {:?}", a.what).to_lowercase(),
               "from": crate::settings::fmt_ts(r.from_ns), "to": crate::settings::fmt_ts(r.to_ns),
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
            p.row(
                b.columns()
                    .iter()
                    .zip(&fmts)
                    .map(|(c, f)| cell(c.as_ref(), f, i))
                    .collect(),
            )?;
        }
    }
    let plot_to = crate::chart::PlotTo::new(a.plot.as_deref(), set.format == Format::Table);
    if plot_to.wanted() {
        let (series, labels) = series(ctx, a.what, a.flow, r).await?;
        plot_to.draw(&mut p, labels, &series, 12, &|v| format!("{v:.1}"))?;
    }
    p.summary(json!({"rows": p.rows(), "elapsed_s": started.elapsed().as_secs_f64()}))?;
    Ok(super::exit_for(p.rows()))
}
