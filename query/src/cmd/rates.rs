//! `stel-query rates`: RX/TX BPS, PPS and utilisation per port (or router interface), the way
//! SONiC computes them, over a window at a chosen resolution.

use std::{process::ExitCode, time::Instant};

use serde_json::json;

use crate::{
    catalog::{Catalog, Session},
    engine::{resolve_resolution, scan_buckets, Aggs, Buckets, Grid, Progress},
    error::{Error, Result},
    output::{Cell, Format, Printer},
    plot,
    rates::{self, fmt_bps, fmt_ok, fmt_pps, fmt_util, RateState, RateStats, Rates},
    settings::{fmt_ts, parse_duration_ns, CommonArgs, TimeArgs, TimeRange},
    spark::{compile::Scope, Lake},
};

/// RX/TX BPS, PPS and UTIL per port (portstat -R's columns and units).
///
/// Without --resolution the whole window is one interval (like two `portstat` runs at its ends);
/// with it, one row per interval and port. --ema smooths like SONiC (α = 2/(N+1)).
///
/// Examples:
///   stel-query rates
///   stel-query rates --last 10s -r 1s -i Ethernet0,Ethernet4 --ema
///   stel-query rates --from 2024-05-01T12:00:00Z --to 2024-05-01T12:00:01Z -r stream --json
#[derive(Debug, clap::Args)]
#[command(verbatim_doc_comment)]
pub struct Args {
    #[command(flatten)]
    pub common: CommonArgs,
    #[command(flatten)]
    pub time: TimeArgs,
    /// HFT profile (needed when several profiles have the group).
    #[arg(long, short = 'p')]
    pub profile: Option<String>,
    /// Router interfaces (ROUTER_INTERFACE group, rif_rates.lua) instead of ports.
    #[arg(long)]
    pub rif: bool,
    /// Only these interfaces (comma-separated names, e.g. Ethernet0,Ethernet4).
    #[arg(long, short = 'i', value_delimiter = ',')]
    pub interface: Vec<String>,
    /// Interval per row: a duration (10us … 5m) or `stream` for every snapshot.
    #[arg(long, short = 'r')]
    pub resolution: Option<String>,
    /// Smooth with SONiC's EMA over N intervals (α = 2/(N+1); N = 10 when no value is given).
    #[arg(long, num_args = 0..=1, default_missing_value = "10", value_name = "N")]
    pub ema: Option<u32>,
    /// Port speed for UTIL (the stream does not carry it): 100G, 25G, or Mb/s like SONiC.
    #[arg(long, default_value = "100G")]
    pub speed: String,
    /// Draw RX_BPS over time in the terminal (table output only).
    #[arg(long)]
    pub plot: bool,
}

/// Column indices of one object's rate inputs in the scanned projection.
#[derive(Debug, Clone)]
pub struct Inputs {
    pub object: String,
    /// RX octets, TX octets, RX packet parts, TX packet parts.
    pub rx_octets: Option<usize>,
    pub tx_octets: Option<usize>,
    pub rx_pkts: Vec<usize>,
    pub tx_pkts: Vec<usize>,
}

impl Inputs {
    /// The four rate quantities from one row of last values.
    pub fn quantities(&self, get: impl Fn(usize) -> Option<u64>) -> rates::Inputs {
        let sum = |idx: &[usize]| -> Option<u64> {
            let mut acc: Option<u64> = None;
            for (k, i) in idx.iter().enumerate() {
                match get(*i) {
                    Some(v) => acc = Some(acc.unwrap_or(0) + v),
                    // The first part (unicast) is required, the rest count as 0 when absent.
                    None if k == 0 => return None,
                    None => {}
                }
            }
            acc
        };
        [
            self.rx_octets.and_then(&get),
            self.tx_octets.and_then(&get),
            sum(&self.rx_pkts),
            sum(&self.tx_pkts),
        ]
    }
}

/// The projection (column names) and per-object inputs for `objects` of `s`.
pub fn plan_inputs(s: &Session, objects: &[String], st: &RateStats) -> (Vec<String>, Vec<Inputs>) {
    let mut cols: Vec<String> = Vec::new();
    let mut idx = |object: &str, stat: &str| -> Option<usize> {
        let c = s.column(object, stat)?;
        Some(match cols.iter().position(|n| *n == c.name) {
            Some(i) => i,
            None => {
                cols.push(c.name.clone());
                cols.len() - 1
            }
        })
    };
    let mut out = Vec::new();
    for o in objects {
        let rx_octets = idx(o, st.rx_octets);
        let tx_octets = idx(o, st.tx_octets);
        let rx_pkts: Vec<usize> = st.rx_pkts.iter().filter_map(|p| idx(o, p)).collect();
        let tx_pkts: Vec<usize> = st.tx_pkts.iter().filter_map(|p| idx(o, p)).collect();
        // The unicast part must be first when present, else the packet rate is N/A.
        let first_ok = |parts: &[&str]| s.column(o, parts[0]).is_some();
        out.push(Inputs {
            object: o.clone(),
            rx_octets,
            tx_octets,
            rx_pkts: if first_ok(st.rx_pkts) {
                rx_pkts
            } else {
                Vec::new()
            },
            tx_pkts: if first_ok(st.tx_pkts) {
                tx_pkts
            } else {
                Vec::new()
            },
        });
    }
    (cols, out)
}

/// One output row of `rates`.
#[derive(Debug, Clone)]
pub struct RateRow {
    pub t_ns: i64,
    /// Shared, not copied per row (a stream-resolution hour is 23 M rows).
    pub object: std::sync::Arc<str>,
    pub rates: Rates,
}

/// The rate state machines of a set of objects, fed bucket by bucket (by the local scan or by a
/// remote engine's per-bucket last values) in time order.
#[derive(Debug)]
pub struct RateFeed {
    inputs: Vec<Inputs>,
    states: Vec<RateState>,
    names: Vec<std::sync::Arc<str>>,
    alpha: Option<f64>,
    seeded: bool,
}

impl RateFeed {
    /// For `objects` of `s`: the projection to scan (column names) and the feed.
    ///
    /// # Errors
    /// The session carries none of the rate inputs.
    pub fn new(
        s: &Session,
        objects: &[String],
        st: &RateStats,
        alpha: Option<f64>,
    ) -> Result<(Vec<String>, Self)> {
        let (cols, inputs) = plan_inputs(s, objects, st);
        if cols.is_empty() {
            return Err(Error::NotFound(format!(
                "{}/{} carries none of the rate inputs ({}, {}, {})",
                s.profile,
                s.group,
                st.rx_octets,
                st.tx_octets,
                st.rx_pkts.join(", ")
            )));
        }
        let names = inputs.iter().map(|i| i.object.as_str().into()).collect();
        Ok((
            cols,
            Self {
                states: vec![RateState::default(); inputs.len()],
                inputs,
                names,
                alpha,
                seeded: false,
            },
        ))
    }

    /// The same objects with fresh state machines (one per switch of a fleet).
    pub fn fresh(&self) -> Self {
        Self {
            states: vec![RateState::default(); self.inputs.len()],
            inputs: self.inputs.clone(),
            names: self.names.clone(),
            alpha: self.alpha,
            seeded: false,
        }
    }

    /// Consumes one chunk of buckets (the first chunk seeds the state machines with the
    /// window's first row), calling `each` per completed (interval, object).
    ///
    /// # Errors
    /// Whatever `each` returns.
    pub fn feed(&mut self, b: &Buckets, mut each: impl FnMut(RateRow) -> Result<()>) -> Result<()> {
        if !self.seeded {
            if let Some((t, v, ok)) = &b.first {
                for (inp, stt) in self.inputs.iter().zip(self.states.iter_mut()) {
                    let q = inp.quantities(|i| ok[i].then(|| v[i]));
                    stt.poll(*t, q, self.alpha);
                }
                self.seeded = true;
            }
        }
        for i in 0..b.n {
            let t = b.last_ts[i];
            if t == i64::MIN {
                continue;
            }
            for ((inp, stt), name) in self
                .inputs
                .iter()
                .zip(self.states.iter_mut())
                .zip(&self.names)
            {
                let q = inp.quantities(|c| b.last(i, c));
                if let Some(rates) = stt.poll(t, q, self.alpha) {
                    each(RateRow {
                        t_ns: t,
                        object: std::sync::Arc::clone(name),
                        rates,
                    })?;
                }
            }
        }
        Ok(())
    }
}

/// Runs the rates scan, calling `each` per completed (interval, object) in time order.
/// Returns rows scanned.
///
/// # Errors
/// Engine failures or an error from `each`.
#[expect(clippy::too_many_arguments, reason = "the resolved query, spelled out")]
pub async fn compute(
    cat: &Catalog,
    s: &Session,
    objects: &[String],
    st: &RateStats,
    r: &TimeRange,
    width_ns: Option<i64>,
    alpha: Option<f64>,
    progress: &Progress,
    mut each: impl FnMut(RateRow) -> Result<()>,
) -> Result<(u64, usize)> {
    let (cols, mut feed) = RateFeed::new(s, objects, st, alpha)?;
    // Per-interval rows only where there is data (the whole-window form needs the window as is:
    // its single bucket starts at the window's start).
    let clamped;
    let r = match width_ns {
        Some(_) => match crate::engine::clamp_to_data(cat, s, r).await? {
            Some(c) => {
                clamped = c;
                &clamped
            }
            None => return Ok((0, cols.len())),
        },
        None => r,
    };
    let grid = Grid::new(r, width_ns);
    let rows = scan_buckets(cat, s, &cols, r, grid, Aggs::default(), progress, |b| {
        feed.feed(b, &mut each)
    })
    .await?;
    Ok((rows, cols.len()))
}

/// # Errors
/// See [`Error`]; an empty window is `NotFound` and names the range that exists.
pub async fn run(a: Args) -> Result<ExitCode> {
    let started = Instant::now();
    let set = a.common.resolve();
    let speed = rates::parse_speed_mbps(&a.speed).map_err(Error::Usage)?;
    let group = if a.rif { "ROUTER_INTERFACE" } else { "PORT" };
    let st = if a.rif { rates::RIF } else { rates::PORT };
    let alpha = a.ema.map(|n| rates::alpha(n.max(1)));
    let want_plot = a.plot && set.format == Format::Table;
    let progress = Progress::new("rates");
    let mut series: Vec<plot::Series> = Vec::new();
    let mut p = Printer::new(set.format);
    // Prints one row (the switch column only for fleets).
    let mut emit =
        |p: &mut Printer, sw: Option<&str>, per_interval: bool, row: RateRow| -> Result<()> {
            let x = &row.rates;
            let rx_util = Rates::util(x.rx_bps, Some(speed));
            let tx_util = Rates::util(x.tx_bps, Some(speed));
            let mut cells = Vec::with_capacity(11);
            if per_interval {
                cells.push(Cell::time(row.t_ns));
            }
            if let Some(sw) = sw {
                cells.push(Cell::str(sw));
            }
            cells.extend([
                Cell::str(&*row.object),
                x.rx_ok.map_or_else(Cell::na, |v| Cell {
                    json: json!(v),
                    text: fmt_ok(v),
                }),
                Cell::opt_f64(x.rx_bps, fmt_bps),
                Cell::opt_f64(x.rx_pps, fmt_pps),
                Cell::opt_f64(rx_util, fmt_util),
                x.tx_ok.map_or_else(Cell::na, |v| Cell {
                    json: json!(v),
                    text: fmt_ok(v),
                }),
                Cell::opt_f64(x.tx_bps, fmt_bps),
                Cell::opt_f64(x.tx_pps, fmt_pps),
                Cell::opt_f64(tx_util, fmt_util),
            ]);
            if want_plot {
                let name = match sw {
                    Some(sw) => format!("{sw} {}", row.object),
                    None => row.object.to_string(),
                };
                match series.iter_mut().find(|(n, _)| *n == name) {
                    Some((_, v)) => v.push((row.t_ns, x.rx_bps.unwrap_or(f64::NAN))),
                    None => series.push((name, vec![(row.t_ns, x.rx_bps.unwrap_or(f64::NAN))])),
                }
            }
            p.row(cells)
        };
    let begin = |p: &mut Printer,
                 fleet: bool,
                 per_interval: bool,
                 profile: &str,
                 r: &TimeRange,
                 width: Option<i64>|
     -> Result<()> {
        let mut header = vec![];
        if per_interval {
            header.push("TIME");
        }
        if fleet {
            header.push("SWITCH");
        }
        header.extend([
            "IFACE", "RX_OK", "RX_BPS", "RX_PPS", "RX_UTIL", "TX_OK", "TX_BPS", "TX_PPS", "TX_UTIL",
        ]);
        p.begin(
            &header,
            json!({
                "command": "rates", "profile": profile, "group": group,
                "from": fmt_ts(r.from_ns), "to": fmt_ts(r.to_ns),
                "resolution_ns": width, "alpha": alpha, "speed_mbps": speed,
                "units": {"rx_bps": "bytes/s", "rx_pps": "packets/s", "rx_util": "%"},
            }),
        )
    };
    let (mut scanned, mut samples) = (0u64, 0u64);
    let mut summary = json!({"engine": "local"});
    if let Some(remote) = set.spark_remote()? {
        let lake = Lake::open(remote, &set.data).await?;
        let extent = lake.newest(group).await?.map(|t| (t, t));
        let r = a.time.resolve(extent)?;
        let width = match a.resolution.as_deref() {
            None => None,
            Some("stream") | Some("native") => {
                return Err(Error::Usage(
                    "--engine spark: give --resolution as a duration (e.g. 1s); `stream` is measured per switch by the local engine only".into(),
                ))
            }
            Some(d) => Some(parse_duration_ns(d)?),
        };
        let s = crate::fleet::lake_session(&lake.columns, group, a.profile.as_deref());
        let objects = super::objects_of(&s, &a.interface, true)?;
        let (cols, proto_feed) = RateFeed::new(&s, &objects, &st, alpha)?;
        let scope = Scope {
            group: group.into(),
            profile: a.profile.clone(),
            switches: set.switches.clone(),
            range: r,
            ts: lake.ts.clone(),
        };
        let grid = Grid::new(&r, width);
        let (per_switch, files) = lake.buckets(&scope, &cols, grid, Aggs::default()).await?;
        begin(&mut p, true, width.is_some(), &s.profile, &r, width)?;
        for sw in per_switch {
            // Each switch's objects: the ones it has data for (its own rows come back non-null).
            let mut feed = proto_feed.fresh();
            scanned += sw.value.rows;
            samples += sw.value.rows * cols.len() as u64;
            feed.feed(&sw.value, |row| {
                if row.rates.rx_bps.is_none()
                    && row.rates.tx_bps.is_none()
                    && row.rates.rx_pps.is_none()
                    && row.rates.tx_pps.is_none()
                {
                    return Ok(()); // an object this switch does not have
                }
                emit(&mut p, Some(&sw.switch), width.is_some(), row)
            })?;
        }
        summary = lake.about(files);
        if scanned == 0 {
            return Err(Error::NotFound(format!(
                "no {group} samples in {r} in the lake at {}",
                lake.root
            )));
        }
    } else {
        let targets = crate::fleet::open(&set.data, &set.switches, set.strict).await?;
        let fleet = targets.iter().any(|t| t.switch.is_some());
        let (found, r) =
            crate::fleet::sessions(&targets, a.profile.as_deref(), group, &a.time).await?;
        let mut begun = false;
        for (t, s) in &found {
            let objects = super::objects_of(s, &a.interface, fleet)?;
            let width = match resolve_resolution(&t.cat, s, &r, a.resolution.as_deref()).await {
                Ok(w) => w,
                Err(Error::NotFound(_)) if fleet => continue,
                Err(e) => return Err(e),
            };
            if !begun {
                begin(&mut p, fleet, width.is_some(), &s.profile, &r, width)?;
                begun = true;
            }
            let sw = t.switch.as_deref();
            let (rows, ncols) = compute(
                &t.cat,
                s,
                &objects,
                &st,
                &r,
                width,
                alpha,
                &progress,
                |row| emit(&mut p, sw, width.is_some(), row),
            )
            .await?;
            scanned += rows;
            samples += rows * ncols as u64;
        }
        if scanned == 0 {
            let (t, s) = found[0];
            return Err(t.cat.empty_window(s, &r).await);
        }
    }
    progress.finish();
    if want_plot {
        // The eight busiest interfaces, so the chart stays readable.
        series.sort_by(|a, b| {
            let peak = |s: &plot::Series| s.1.iter().map(|p| p.1).fold(0.0, f64::max);
            peak(b).total_cmp(&peak(a))
        });
        series.truncate(8);
        p.text(&format!(
            "\n{}",
            plot::chart("RX_BPS", &series, 72, 16, &|v| fmt_bps(v))
        ))?;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let mut out = json!({
        "rows": p.rows(), "snapshots_scanned": scanned, "samples_scanned": samples,
        "elapsed_s": elapsed,
    });
    super::merge(&mut out, summary);
    p.summary(out)?;
    Ok(super::exit_for(p.rows()))
}
