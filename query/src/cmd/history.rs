//! `stel-query history`: raw or bucketed (min/max/avg/last) values of chosen objects × stats.

use std::{process::ExitCode, time::Instant};

use arrow_array::{cast::AsArray, types::TimestampNanosecondType, Array};
use datafusion::{
    common::Column as DfColumn,
    logical_expr::{col, Expr},
};
use futures::StreamExt;
use serde_json::json;

use crate::{
    catalog::{time_filter, Catalog},
    engine::{Aggs, Progress},
    error::{Error, Result},
    output::{Cell, Format, Printer},
    plot,
    settings::{fmt_ts, parse_duration_ns, CommonArgs, ObjectArg, ProfileArg, TimeArgs},
};

/// Values of chosen objects × stats: every snapshot, or per interval (min/max/avg/last).
///
/// Examples:
///   stel-query history -o Ethernet0 -s IF_IN_OCTETS --last 100us
///   stel-query history --group QUEUE -o 'Ethernet0|3' -s CURR_OCCUPANCY_BYTES \
///       -r 1ms --agg max,avg --plot
#[derive(Debug, clap::Args)]
#[command(verbatim_doc_comment)]
pub struct Args {
    #[command(flatten)]
    pub common: CommonArgs,
    #[command(flatten)]
    pub time: TimeArgs,
    #[command(flatten)]
    pub profile: ProfileArg,
    /// Session group: PORT, QUEUE, INGRESS_PRIORITY_GROUP, BUFFER_POOL.
    #[arg(long, short = 'g', default_value = "PORT")]
    pub group: String,
    #[command(flatten)]
    pub objects: ObjectArg,
    /// Stats, short or full SAI names (comma-separated); default all.
    #[arg(long, short = 's', value_delimiter = ',')]
    pub stat: Vec<String>,
    /// Bucket width (e.g. 100us, 1s); without it every snapshot is printed.
    #[arg(long, short = 'r')]
    pub resolution: Option<String>,
    /// Aggregates per bucket.
    #[arg(long, value_delimiter = ',', default_value = "min,max,avg,last")]
    pub agg: Vec<Agg>,
    /// Most rows printed without --resolution (a row is one object × stat at one snapshot;
    /// 0 = no limit). When the window holds more, a warning on stderr says so and how to see
    /// the rest.
    #[arg(long, default_value_t = 10_000)]
    pub limit: usize,
    /// Draw the values (avg per bucket, or raw): alone in the terminal (table output), with a
    /// file name as an image (`--plot h.svg`, `--plot h.png`).
    #[arg(long, num_args = 0..=1, default_missing_value = "", value_name = "FILE.svg|FILE.png")]
    pub plot: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Agg {
    /// Smallest value in the bucket.
    Min,
    /// Largest value in the bucket.
    Max,
    /// Mean of the bucket's values.
    Avg,
    /// The bucket's last value (a counter's reading at the bucket's end).
    Last,
}

/// # Errors
/// See [`Error`].
pub async fn run(a: Args) -> Result<ExitCode> {
    let started = Instant::now();
    let set = a.common.resolve();
    let cat = Catalog::open(&set.data, set.strict).await?;
    let (s, r) = super::open_session(&cat, a.profile.get(), &a.group, &a.time).await?;
    let objects = super::pick_objects(s, &a.objects.list)?;
    let stats = super::pick_stats(s, &a.stat)?;
    let cols: Vec<(String, String, String)> = objects
        .iter()
        .flat_map(|o| stats.iter().map(move |st| (o.clone(), st.clone())))
        .filter_map(|(o, st)| s.column(&o, &st).map(|c| (c.name.clone(), o, st)))
        .collect();
    if cols.is_empty() {
        return Err(Error::NotFound(format!(
            "{}/{} has none of {} × {}",
            s.profile,
            s.group,
            objects.join(","),
            stats.join(",")
        )));
    }
    let names: Vec<String> = cols.iter().map(|c| c.0.clone()).collect();
    let mut p = Printer::new(set.format);
    let plot_to = crate::chart::PlotTo::new(a.plot.as_deref(), set.format == Format::Table);
    let want_plot = plot_to.wanted();
    let mut series: Vec<plot::Series> = cols
        .iter()
        .take(8)
        .map(|(_, o, st)| (format!("{o}.{st}"), Vec::new()))
        .collect();
    let progress = Progress::new("history");
    let scanned;
    // Without --resolution: the first snapshot not printed whole when --limit cut the output.
    let mut cut = None;
    let mut tier = None;
    match a.resolution.as_deref() {
        None => {
            p.begin(
                &["TIME", "OBJECT", "STAT", "VALUE"],
                json!({"command": "history", "profile": s.profile, "group": s.group,
                       "from": fmt_ts(r.from_ns), "to": fmt_ts(r.to_ns), "raw": true, "limit": a.limit}),
            )?;
            let mut sel = vec![col("ts")];
            sel.extend(
                names
                    .iter()
                    .map(|n| Expr::Column(DfColumn::new_unqualified(n))),
            );
            // Enough snapshots for `limit` rows and one more: whether the window holds more
            // than is printed.
            let snapshots = (a.limit > 0).then(|| a.limit.div_ceil(cols.len()) + 1);
            let df = cat
                .ctx
                .table(s.table.as_str())
                .await?
                .filter(time_filter(&r))?
                .select(sel)?
                .sort(vec![col("ts").sort(true, false)])?
                .limit(0, snapshots)?;
            let mut stream = df.execute_stream().await?;
            let mut n = 0u64;
            'snapshots: while let Some(b) = stream.next().await {
                let b = b?;
                let ts = b.column(0).as_primitive::<TimestampNanosecondType>();
                for i in 0..b.num_rows() {
                    n += 1;
                    for (c, (_, o, st)) in cols.iter().enumerate() {
                        if a.limit > 0 && p.rows() >= a.limit as u64 {
                            cut = Some(ts.value(i));
                            break 'snapshots;
                        }
                        let a = b
                            .column(c + 1)
                            .as_primitive::<arrow_array::types::UInt64Type>();
                        let v = (!a.is_null(i)).then(|| a.value(i));
                        if want_plot && c < 8 {
                            series[c]
                                .1
                                .push((ts.value(i), v.map_or(f64::NAN, |v| v as f64)));
                        }
                        p.row(vec![
                            Cell::time(ts.value(i)),
                            Cell::str(o.clone()),
                            Cell::str(st.clone()),
                            v.map_or_else(Cell::na, Cell::u64),
                        ])?;
                    }
                }
            }
            scanned = n;
        }
        Some(res) => {
            let width = if res == "stream" {
                crate::engine::stream_interval(&cat, s, &r).await?
            } else {
                parse_duration_ns(res)?
            };
            let mut header = vec!["TIME", "OBJECT", "STAT"];
            for g in &a.agg {
                header.push(match g {
                    Agg::Min => "MIN",
                    Agg::Max => "MAX",
                    Agg::Avg => "AVG",
                    Agg::Last => "LAST",
                });
            }
            p.begin(
                &header,
                json!({"command": "history", "profile": s.profile, "group": s.group,
                       "from": fmt_ts(r.from_ns), "to": fmt_ts(r.to_ns), "resolution_ns": width}),
            )?;
            // Tiers hold min/max/sum/count of levels and the last value of everything: they
            // answer unless min/max/avg of a cumulative counter is asked.
            let counter_stats = a.agg.iter().any(|g| *g != Agg::Last)
                && cols.iter().any(|(_, _, st)| !stel_store::sai::is_level(st));
            let need = crate::tiers::Need {
                width: Some(width),
                stats: true,
                counter_stats,
                ..crate::tiers::Need::default()
            };
            let plan = crate::tiers::plan(s, cat.raw_extent(s).await?, &r, &need)?;
            let about = plan.describe(s);
            if set.verbose {
                eprintln!("stel-query: history: {}", plan.verbose_line(s));
            }
            tier = Some(about["tier"].clone());
            scanned = crate::tiers::scan(
                &cat,
                s,
                &names,
                &plan,
                Some(width),
                Aggs { stats: true },
                &progress,
                |b| {
                    for i in 0..b.n {
                        if b.last_ts[i] == i64::MIN {
                            continue;
                        }
                        for (c, (_, o, st)) in cols.iter().enumerate() {
                            let k = i * b.cols + c;
                            let cnt = b.count[k];
                            let mut cells = vec![
                                Cell::time(b.start(i)),
                                Cell::str(o.clone()),
                                Cell::str(st.clone()),
                            ];
                            for g in &a.agg {
                                cells.push(match (g, cnt) {
                                    (_, 0) => Cell::na(),
                                    (Agg::Min, _) => Cell::u64(b.min[k]),
                                    (Agg::Max, _) => Cell::u64(b.max[k]),
                                    (Agg::Avg, _) => {
                                        let v = b.sum[k] / cnt as f64;
                                        Cell::f64(v, format!("{v:.2}"))
                                    }
                                    (Agg::Last, _) => b.last(i, c).map_or_else(Cell::na, Cell::u64),
                                });
                            }
                            if want_plot && c < 8 && cnt > 0 {
                                series[c].1.push((b.start(i), b.sum[k] / cnt as f64));
                            }
                            p.row(cells)?;
                        }
                    }
                    Ok(())
                },
            )
            .await?;
        }
    }
    progress.finish();
    if p.rows() == 0 {
        return Err(cat.empty_window(s, &r).await);
    }
    if let Some(at) = cut {
        crate::diag::warn(
            &format!(
                "history: printed the first {} rows only (--limit), stopping at the snapshot of {}; the window {r} holds more: narrow it (--last, --from/--to, -o, -s), bucket it (-r 1ms), or raise --limit (0: no limit)",
                crate::output::thousands(a.limit as u64),
                fmt_ts(at)
            ),
            json!({"limit": a.limit, "next_snapshot": fmt_ts(at)}),
        );
    }
    if want_plot {
        let labels = crate::chart::Labels {
            title: if a.resolution.is_some() {
                "avg per interval"
            } else {
                "value"
            },
            y: "counter value (avg per interval)",
        };
        plot_to.draw(&mut p, labels, &series, 16, &|v| {
            crate::output::human_count(v)
        })?;
    }
    p.summary(
        json!({"rows": p.rows(), "snapshots_scanned": scanned, "truncated": cut.is_some(),
                     "elapsed_s": started.elapsed().as_secs_f64(),
                     "tier": tier.unwrap_or_else(|| json!("raw"))}),
    )?;
    Ok(super::exit_for(p.rows()))
}
