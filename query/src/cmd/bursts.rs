//! `stel-query bursts`: microbursts — utilisation above X % for at least Y, with start, duration
//! and peak. This is what 10 µs history is for: a 1 s poll averages a 50 µs burst away.

use std::{process::ExitCode, time::Instant};

use serde_json::json;

use crate::{
    catalog::Catalog,
    engine::{scan_buckets, Aggs, Grid, Progress},
    error::{Error, Result},
    output::{human_ns, Cell, Format, Printer},
    plot,
    rates::{self, fmt_util},
    settings::{fmt_ts, parse_duration_ns, CommonArgs, TimeArgs},
};

/// Microbursts: intervals where a port's utilisation stays above --threshold for at least
/// --min-duration, at the stream's own resolution unless -r says otherwise.
///
/// Examples:
///   stel-query bursts --last 1s
///   stel-query bursts --threshold 100 --min-duration 40us -i Ethernet0 --json
#[derive(Debug, clap::Args)]
#[command(verbatim_doc_comment)]
pub struct Args {
    #[command(flatten)]
    pub common: CommonArgs,
    #[command(flatten)]
    pub time: TimeArgs,
    #[arg(long, short = 'p')]
    pub profile: Option<String>,
    /// Router interfaces instead of ports.
    #[arg(long)]
    pub rif: bool,
    /// Only these interfaces (comma-separated).
    #[arg(long, short = 'i', value_delimiter = ',')]
    pub interface: Vec<String>,
    /// Utilisation threshold, % of --speed.
    #[arg(long, default_value_t = 90.0)]
    pub threshold: f64,
    /// Shortest burst reported (10us, 1ms, …).
    #[arg(long, default_value = "10us")]
    pub min_duration: String,
    /// Port speed (100G, 25G, Mb/s).
    #[arg(long, default_value = "100G")]
    pub speed: String,
    /// Direction(s) to look at.
    #[arg(long, value_enum, default_value = "both")]
    pub direction: Direction,
    /// Interval between the snapshots compared (default: every snapshot).
    #[arg(long, short = 'r', default_value = "stream")]
    pub resolution: String,
    /// Chart burst peaks over time in the terminal.
    #[arg(long)]
    pub plot: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Direction {
    Rx,
    Tx,
    Both,
}

/// One burst.
#[derive(Debug, Clone, PartialEq)]
pub struct Burst {
    pub object: String,
    /// `RX` or `TX`.
    pub dir: &'static str,
    pub start_ns: i64,
    pub end_ns: i64,
    /// Peak utilisation over one interval, %.
    pub peak: f64,
    /// Bytes moved during the burst.
    pub bytes: u64,
    /// Still above the threshold at the window's end.
    pub open: bool,
}

#[derive(Debug, Default, Clone)]
struct Track {
    prev: Option<(i64, u64)>,
    run: Option<(i64, i64, f64, u64)>,
}

/// # Errors
/// See [`Error`].
pub async fn run(a: Args) -> Result<ExitCode> {
    let started = Instant::now();
    let set = a.common.resolve();
    let speed = rates::parse_speed_mbps(&a.speed).map_err(Error::Usage)?;
    let min_ns = parse_duration_ns(&a.min_duration)?;
    let cat = Catalog::open(&set.data).await?;
    let group = if a.rif { "ROUTER_INTERFACE" } else { "PORT" };
    let (s, r) = super::open_session(&cat, a.profile.as_deref(), group, &a.time).await?;
    let objects = super::pick_objects(s, &a.interface)?;
    let st = if a.rif { rates::RIF } else { rates::PORT };
    let width = super::rates::resolve_resolution(&cat, s, &r, Some(&a.resolution))
        .await?
        .unwrap_or(r.len_ns());
    // (object, dir, column name)
    let mut cols: Vec<(String, &'static str, String)> = Vec::new();
    for o in &objects {
        if a.direction != Direction::Tx {
            if let Some(c) = s.column(o, st.rx_octets) {
                cols.push((o.clone(), "RX", c.name.clone()));
            }
        }
        if a.direction != Direction::Rx {
            if let Some(c) = s.column(o, st.tx_octets) {
                cols.push((o.clone(), "TX", c.name.clone()));
            }
        }
    }
    if cols.is_empty() {
        return Err(Error::NotFound(format!(
            "{}/{} carries no {} / {} counters to measure utilisation with",
            s.profile, s.group, st.rx_octets, st.tx_octets
        )));
    }
    let names: Vec<String> = cols.iter().map(|c| c.2.clone()).collect();
    let bytes_per_s = speed * 1e6 / 8.0;
    let mut tracks = vec![Track::default(); cols.len()];
    let mut bursts: Vec<Burst> = Vec::new();
    let close =
        |t: &mut Track, c: &(String, &'static str, String), out: &mut Vec<Burst>, open: bool| {
            if let Some((st, en, peak, bytes)) = t.run.take() {
                if en - st >= min_ns {
                    out.push(Burst {
                        object: c.0.clone(),
                        dir: c.1,
                        start_ns: st,
                        end_ns: en,
                        peak,
                        bytes,
                        open,
                    });
                }
            }
        };
    let progress = Progress::new("bursts");
    let grid = Grid::new(&r, Some(width));
    let scanned = scan_buckets(&cat, s, &names, &r, grid, Aggs::default(), &progress, |b| {
        for i in 0..b.n {
            let t = b.last_ts[i];
            if t == i64::MIN {
                continue;
            }
            for (c, tr) in tracks.iter_mut().enumerate() {
                let Some(v) = b.last(i, c) else { continue };
                let Some((pt, pv)) = tr.prev.replace((t, v)) else {
                    continue;
                };
                if t <= pt {
                    continue;
                }
                if v < pv {
                    // Counter reset: whatever was running ends here, no spike.
                    close(tr, &cols[c], &mut bursts, false);
                    continue;
                }
                let util = (v - pv) as f64 / ((t - pt) as f64 / 1e9) / bytes_per_s * 100.0;
                if util > a.threshold {
                    let run = tr.run.get_or_insert((pt, t, util, 0));
                    run.1 = t;
                    run.2 = run.2.max(util);
                    run.3 += v - pv;
                } else {
                    close(tr, &cols[c], &mut bursts, false);
                }
            }
        }
        Ok(())
    })
    .await?;
    progress.finish();
    for (c, tr) in tracks.iter_mut().enumerate() {
        close(tr, &cols[c], &mut bursts, true);
    }
    if scanned == 0 {
        return Err(cat.empty_window(s, &r).await);
    }
    bursts.sort_by(|x, y| (x.start_ns, &x.object, x.dir).cmp(&(y.start_ns, &y.object, y.dir)));
    let mut p = Printer::new(set.format);
    p.begin(
        &["START", "IFACE", "DIR", "DURATION", "PEAK_UTIL", "BYTES"],
        json!({"command": "bursts", "profile": s.profile, "group": s.group,
               "from": fmt_ts(r.from_ns), "to": fmt_ts(r.to_ns), "threshold_pct": a.threshold,
               "min_duration_ns": min_ns, "resolution_ns": width, "speed_mbps": speed}),
    )?;
    for bu in &bursts {
        let d = bu.end_ns - bu.start_ns;
        p.row(vec![
            Cell {
                json: json!(fmt_ts(bu.start_ns)),
                text: fmt_ts(bu.start_ns),
            },
            Cell::str(bu.object.clone()),
            Cell::str(bu.dir),
            Cell {
                json: json!(d),
                text: format!("{}{}", human_ns(d), if bu.open { "+" } else { "" }),
            },
            Cell::f64(bu.peak, fmt_util(bu.peak)),
            Cell::u64(bu.bytes),
        ])?;
    }
    if a.plot && set.format == Format::Table && !bursts.is_empty() {
        let mut series: Vec<plot::Series> = Vec::new();
        for bu in &bursts {
            let name = format!("{} {}", bu.object, bu.dir);
            match series.iter().position(|s| s.0 == name) {
                Some(i) => series[i].1.push((bu.start_ns, bu.peak)),
                None if series.len() < 8 => series.push((name, vec![(bu.start_ns, bu.peak)])),
                None => {}
            }
        }
        p.text(&format!(
            "\n{}",
            plot::chart("burst peak utilisation", &series, 72, 12, &|v| fmt_util(v))
        ))?;
    }
    p.summary(
        json!({"rows": p.rows(), "bursts": bursts.len(), "snapshots_scanned": scanned,
                     "elapsed_s": started.elapsed().as_secs_f64()}),
    )?;
    if bursts.is_empty() && set.format != Format::Json {
        eprintln!(
            "stel-query: no bursts above {}% for ≥ {} in {r} ({} snapshots scanned)",
            a.threshold,
            human_ns(min_ns),
            scanned
        );
    }
    Ok(super::exit_for(p.rows()))
}
