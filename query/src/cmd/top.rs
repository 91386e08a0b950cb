//! `stel-query top`: the N busiest objects of a window by rate, drops or buffer occupancy.

use std::{collections::BTreeMap, process::ExitCode, time::Instant};

use serde_json::json;

use crate::{
    catalog::Catalog,
    engine::{scan_buckets, Aggs, Grid, Progress},
    error::{Error, Result},
    output::{thousands, Cell, Printer},
    rates::{self, fmt_bps, fmt_util, Rates},
    settings::{fmt_ts, CommonArgs, TimeArgs},
};

/// Top-N objects of a window by rate (bytes/s), drops (discarded/dropped packets) or occupancy
/// (peak buffer bytes).
///
/// Examples:
///   stel-query top                          # busiest ports over the last minute of data
///   stel-query top --by drops -n 5 --since 10m
///   stel-query top --by occupancy --group QUEUE --last 1s
#[derive(Debug, clap::Args)]
#[command(verbatim_doc_comment)]
pub struct Args {
    #[command(flatten)]
    pub common: CommonArgs,
    #[command(flatten)]
    pub time: TimeArgs,
    #[arg(long, short = 'p')]
    pub profile: Option<String>,
    /// Session group: PORT, QUEUE, INGRESS_PRIORITY_GROUP, BUFFER_POOL, ROUTER_INTERFACE.
    #[arg(long, short = 'g', default_value = "PORT")]
    pub group: String,
    /// What to rank by.
    #[arg(long, value_enum, default_value = "rate")]
    pub by: By,
    /// How many objects.
    #[arg(long, short = 'n', default_value_t = 10)]
    pub top: usize,
    /// Port speed for UTIL (100G, 25G, Mb/s).
    #[arg(long, default_value = "100G")]
    pub speed: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum By {
    Rate,
    Drops,
    Occupancy,
}

/// # Errors
/// See [`Error`].
pub async fn run(a: Args) -> Result<ExitCode> {
    let started = Instant::now();
    let set = a.common.resolve();
    let speed = rates::parse_speed_mbps(&a.speed).map_err(Error::Usage)?;
    let cat = Catalog::open(&set.data).await?;
    let (s, r) = super::open_session(&cat, a.profile.as_deref(), &a.group, &a.time).await?;
    let mut p = Printer::new(set.format);
    let about = json!({"command": "top", "by": format!("{:?}", a.by).to_lowercase(),
        "profile": s.profile, "group": s.group, "from": fmt_ts(r.from_ns), "to": fmt_ts(r.to_ns)});
    let progress = Progress::new("top");
    let scanned;
    let group = s.group.to_ascii_uppercase();
    match a.by {
        By::Rate if group == "PORT" || group == "ROUTER_INTERFACE" => {
            let st = if group == "PORT" {
                rates::PORT
            } else {
                rates::RIF
            };
            let objects = s.objects();
            let mut rows = Vec::new();
            (scanned, _) =
                super::rates::compute(&cat, s, &objects, &st, &r, None, None, &progress, |row| {
                    rows.push(row);
                    Ok(())
                })
                .await?;
            let total = |x: &Rates| x.rx_bps.unwrap_or(0.0) + x.tx_bps.unwrap_or(0.0);
            rows.sort_by(|x, y| total(&y.rates).total_cmp(&total(&x.rates)));
            p.begin(
                &["RANK", "IFACE", "RX_BPS", "TX_BPS", "RX_UTIL", "TX_UTIL"],
                about,
            )?;
            for (i, row) in rows.iter().take(a.top).enumerate() {
                let x = &row.rates;
                p.row(vec![
                    Cell::u64(i as u64 + 1),
                    Cell::str(&*row.object),
                    Cell::opt_f64(x.rx_bps, fmt_bps),
                    Cell::opt_f64(x.tx_bps, fmt_bps),
                    Cell::opt_f64(Rates::util(x.rx_bps, Some(speed)), fmt_util),
                    Cell::opt_f64(Rates::util(x.tx_bps, Some(speed)), fmt_util),
                ])?;
            }
        }
        by => {
            let pick: &dyn Fn(&str) -> bool = match by {
                By::Rate => &|st: &str| st == "BYTES",
                By::Drops => &|st: &str| st.contains("DISCARDS") || st.contains("DROPPED"),
                By::Occupancy => &|st: &str| st.contains("CURR_OCCUPANCY_BYTES"),
            };
            let cols: Vec<&crate::catalog::Column> =
                s.columns.iter().filter(|c| pick(&c.stat)).collect();
            if cols.is_empty() {
                return Err(Error::NotFound(format!(
                    "{}/{} carries no {} counter (try another --group or --by)",
                    s.profile,
                    s.group,
                    match by {
                        By::Rate => "BYTES",
                        By::Drops => "*DISCARDS / *DROPPED*",
                        By::Occupancy => "*CURR_OCCUPANCY_BYTES",
                    }
                )));
            }
            let names: Vec<String> = cols.iter().map(|c| c.name.clone()).collect();
            let grid = Grid::new(&r, None);
            // Per object: score, and per-stat detail.
            let mut score: BTreeMap<String, (f64, Vec<String>)> = BTreeMap::new();
            scanned = scan_buckets(
                &cat,
                s,
                &names,
                &r,
                grid,
                Aggs {
                    stats: by == By::Occupancy,
                },
                &progress,
                |b| {
                    let Some((t0, first, fok)) = &b.first else {
                        return Ok(());
                    };
                    let dt = (b.last_ts[0] - t0) as f64 / 1e9;
                    for (c, col) in cols.iter().enumerate() {
                        let e = score.entry(col.object.clone()).or_default();
                        match by {
                            By::Occupancy => {
                                if b.count[c] > 0 {
                                    e.0 = e.0.max(b.max[c] as f64);
                                    e.1.push(format!("{}={}", col.stat, thousands(b.max[c])));
                                }
                            }
                            _ => {
                                if let (Some(l), true) = (b.last(0, c), fok[c]) {
                                    let d = l.saturating_sub(first[c]) as f64;
                                    let v = if by == By::Rate && dt > 0.0 {
                                        d / dt
                                    } else {
                                        d
                                    };
                                    e.0 += v;
                                    e.1.push(format!("{}={}", col.stat, thousands(v as u64)));
                                }
                            }
                        }
                    }
                    Ok(())
                },
            )
            .await?;
            let mut rows: Vec<(String, (f64, Vec<String>))> = score.into_iter().collect();
            rows.sort_by(|x, y| y.1 .0.total_cmp(&x.1 .0));
            let value_name = match by {
                By::Rate => "BPS",
                By::Drops => "DROPS",
                By::Occupancy => "PEAK_BYTES",
            };
            p.begin(&["RANK", "OBJECT", value_name, "DETAIL"], about)?;
            for (i, (o, (v, detail))) in rows.into_iter().take(a.top).enumerate() {
                p.row(vec![
                    Cell::u64(i as u64 + 1),
                    Cell::str(o),
                    match by {
                        By::Rate => Cell::f64(v, fmt_bps(v)),
                        _ => Cell {
                            json: json!(v as u64),
                            text: thousands(v as u64),
                        },
                    },
                    Cell::str(detail.join(" ")),
                ])?;
            }
        }
    }
    progress.finish();
    if scanned == 0 {
        return Err(cat.empty_window(s, &r).await);
    }
    p.summary(json!({"rows": p.rows(), "snapshots_scanned": scanned,
                     "elapsed_s": started.elapsed().as_secs_f64()}))?;
    Ok(super::exit_for(p.rows()))
}
