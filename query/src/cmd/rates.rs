//! `stel-query rates`: RX/TX BPS, PPS and utilisation per port (or router interface), the way
//! SONiC computes them, over a window at a chosen resolution.

use std::{process::ExitCode, time::Instant};

use serde_json::json;
use stel_store::rate::RateUnit;

use crate::{
    catalog::{Catalog, Session},
    engine::{resolve_resolution, Aggs, Buckets, Grid, Progress},
    error::{Error, Result},
    output::{human_ns, Cell, Format, Printer},
    plot,
    rates::{self, fmt_ok, fmt_pps, fmt_util, RateState, RateStats, Rates, Speeds},
    settings::{
        fmt_ts, parse_duration_ns, CommonArgs, ObjectArg, ProfileArg, SpeedArg, TimeArgs,
        TimeRange, UnitArg,
    },
    spark::{compile::Scope, Lake},
    tiers::{self, Need, Planned},
};

/// RX/TX BPS, PPS and UTIL per port (portstat -R's columns and units).
///
/// BPS is bytes/s as in SONiC (MB/s); --unit bits shows bits/s (Gb/s).
/// Without --resolution, one row per port for the whole window: the traffic counted over the
/// time the window's samples cover (COVERED), so a restart (counters back to 0) or a gap in the
/// data does not distort it — a line before the table says what the window held. With
/// --resolution, one row per interval and port. --ema smooths like SONiC (α = 2/(N+1)).
///
/// Examples:
///   stel-query rates
///   stel-query rates --last 10s -r 1s -o Ethernet0,Ethernet4 --ema
///   stel-query rates --last 1h --unit bits --csv > rates.csv
///   stel-query rates --from 2024-05-01T12:00:00Z --to 2024-05-01T12:00:01Z \
///       -r stream --json
#[derive(Debug, clap::Args)]
#[command(verbatim_doc_comment)]
pub struct Args {
    #[command(flatten)]
    pub common: CommonArgs,
    #[command(flatten)]
    pub time: TimeArgs,
    #[command(flatten)]
    pub profile: ProfileArg,
    /// Router interfaces (ROUTER_INTERFACE group, rif_rates.lua) instead of ports.
    #[arg(long)]
    pub rif: bool,
    #[command(flatten)]
    pub objects: ObjectArg,
    /// Interval per row: a duration (10us … 5m) or `stream` for every snapshot.
    #[arg(long, short = 'r')]
    pub resolution: Option<String>,
    /// Smooth with SONiC's EMA over N intervals (α = 2/(N+1); N = 10 when no value is given).
    #[arg(long, num_args = 0..=1, default_missing_value = "10", value_name = "N")]
    pub ema: Option<u32>,
    #[command(flatten)]
    pub speed: SpeedArg,
    #[command(flatten)]
    pub unit: UnitArg,
    /// Draw RX_BPS over time: alone in the terminal (table output), with a file name as an image
    /// (`--plot rx.svg`, `--plot rx.png`). At most 8 interfaces, those with the highest peak
    /// RX rate (-o picks others).
    #[arg(long, num_args = 0..=1, default_missing_value = "", value_name = "FILE.svg|FILE.png")]
    pub plot: Option<String>,
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
#[derive(Debug, Clone, Copy)]
pub struct RateRow<'a> {
    pub t_ns: i64,
    /// Borrowed from the feed, not counted per row (a stream-resolution hour is 23 M rows; an
    /// `Arc` here was two atomic operations per row, most of the feed's own time).
    pub object: &'a str,
    pub rates: Rates,
}

/// A [`RateRow`] kept past its feed (whole-window rows are printed after the window's note).
#[derive(Debug, Clone)]
struct Held {
    t_ns: i64,
    object: Box<str>,
    rates: Rates,
}

impl Held {
    fn of(r: &RateRow<'_>) -> Self {
        Self {
            t_ns: r.t_ns,
            object: r.object.into(),
            rates: r.rates,
        }
    }

    fn row(&self) -> RateRow<'_> {
        RateRow {
            t_ns: self.t_ns,
            object: &self.object,
            rates: self.rates,
        }
    }
}

/// What the data of a window looked like to a [`RateFeed`]: where its samples start and end,
/// where they stop for longer than the data's own spacing (gaps), and where counters went back
/// (resets: a restart, a clear, a wrap).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WindowReport {
    /// First and last sample time fed.
    pub first_ns: Option<i64>,
    pub last_ns: Option<i64>,
    /// Spans between consecutive polls longer than twice the usual spacing, `(from, to)`.
    pub gaps: Vec<(i64, i64)>,
    /// Polls whose counters went back, over all objects, and how many objects had one.
    pub resets: u64,
    pub objects_reset: usize,
    /// Time of the last reset.
    pub last_reset_ns: Option<i64>,
}

impl WindowReport {
    /// Adds another switch's report (a fleet).
    pub fn merge(&mut self, o: &WindowReport) {
        self.first_ns = match (self.first_ns, o.first_ns) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self.last_ns = self.last_ns.max(o.last_ns);
        self.gaps.extend(o.gaps.iter().copied());
        self.resets += o.resets;
        self.objects_reset += o.objects_reset;
        self.last_reset_ns = self.last_reset_ns.max(o.last_reset_ns);
    }

    /// Total time inside gaps, ns.
    pub fn gap_ns(&self) -> i64 {
        self.gaps.iter().map(|(a, b)| b - a).sum()
    }

    /// The report as JSON (`window` of the summary).
    pub fn to_json(&self) -> serde_json::Value {
        json!({
            "first_sample": self.first_ns.map(fmt_ts),
            "last_sample": self.last_ns.map(fmt_ts),
            "gaps": self.gaps.iter().map(|(a, b)| json!({"from": fmt_ts(*a), "to": fmt_ts(*b), "ns": b - a})).collect::<Vec<_>>(),
            "gap_ns": self.gap_ns(),
            "resets": self.resets,
            "objects_reset": self.objects_reset,
        })
    }

    /// The sentence about gaps and resets, if there were any.
    pub fn caveat(&self, whole_window: bool) -> Option<String> {
        let mut parts = Vec::new();
        if let Some(&(a, b)) = self.gaps.iter().max_by_key(|(a, b)| b - a) {
            parts.push(format!(
                "{} gap{} without samples ({} in all; the longest {} from {})",
                self.gaps.len(),
                if self.gaps.len() == 1 { "" } else { "s" },
                human_ns(self.gap_ns()),
                human_ns(b - a),
                fmt_ts(a)
            ));
        }
        if self.resets > 0 {
            parts.push(format!(
                "counters went back (a restart or clear) {} time{} on {} interface{}, last at {}",
                self.resets,
                if self.resets == 1 { "" } else { "s" },
                self.objects_reset,
                if self.objects_reset == 1 { "" } else { "s" },
                self.last_reset_ns.map(fmt_ts).unwrap_or_default()
            ));
        }
        if parts.is_empty() {
            return None;
        }
        Some(format!(
            "the window has {}: {}",
            parts.join(" and "),
            if whole_window {
                "each rate is the traffic counted over the time its samples cover, leaving out the interval holding each reset (COVERED)"
            } else {
                "intervals without samples, and the one holding each reset, have no row"
            }
        ))
    }
}

/// Poll times as the feed sees them: for the gaps of a [`WindowReport`].
#[derive(Debug, Clone, Default)]
struct Timeline {
    first: Option<i64>,
    last: Option<i64>,
    /// Smallest spacing between consecutive polls.
    min_dt: Option<i64>,
    /// Spacings longer than twice the grid's width, as `(from, to)` (gaps are those longer than
    /// twice the usual spacing, which is known at the end); at most [`MAX_CANDIDATES`].
    long: Vec<(i64, i64)>,
    width_ns: i64,
}

/// Long spacings kept for the gap report.
const MAX_CANDIDATES: usize = 10_000;

impl Timeline {
    fn poll(&mut self, t: i64) {
        if let Some(prev) = self.last {
            let dt = t - prev;
            if dt > 0 {
                self.min_dt = Some(self.min_dt.map_or(dt, |m| m.min(dt)));
                if dt > 2 * self.width_ns && self.long.len() < MAX_CANDIDATES {
                    self.long.push((prev, t));
                }
            }
        }
        self.first.get_or_insert(t);
        self.last = Some(t);
    }

    fn gaps(&self) -> Vec<(i64, i64)> {
        let usual = self.width_ns.max(self.min_dt.unwrap_or(0));
        self.long
            .iter()
            .copied()
            .filter(|(a, b)| b - a > 2 * usual)
            .collect()
    }
}

/// Whole-window totals of one object: the traffic of every interval with a rate, and the time
/// those intervals cover.
#[derive(Debug, Clone, Copy, Default)]
struct Totals {
    /// RX bytes, TX bytes, RX packets, TX packets.
    sum: [Option<u64>; 4],
    covered_ns: i64,
    last_ns: i64,
}

impl Totals {
    fn add(&mut self, r: &Rates, t: i64) {
        for (acc, d) in self
            .sum
            .iter_mut()
            .zip([r.rx_bytes, r.tx_bytes, r.rx_ok, r.tx_ok])
        {
            if let Some(d) = d {
                *acc = Some(acc.unwrap_or(0).saturating_add(d));
            }
        }
        self.covered_ns += r.dt_ns;
        self.last_ns = t;
    }

    fn rates(&self) -> Option<Rates> {
        if self.covered_ns <= 0 {
            return None;
        }
        let per_s = |v: Option<u64>| v.map(|v| v as f64 * 1e9 / self.covered_ns as f64);
        Some(Rates {
            rx_bps: per_s(self.sum[0]),
            tx_bps: per_s(self.sum[1]),
            rx_pps: per_s(self.sum[2]),
            tx_pps: per_s(self.sum[3]),
            rx_bytes: self.sum[0],
            tx_bytes: self.sum[1],
            rx_ok: self.sum[2],
            tx_ok: self.sum[3],
            dt_ns: self.covered_ns,
        })
    }
}

/// The rate state machines of a set of objects, fed bucket by bucket (by the local scan or by a
/// remote engine's per-bucket last values) in time order.
///
/// Per interval ([`RateFeed::new`]), each completed (interval, object) is one row. Over the
/// whole window ([`RateFeed::whole_window`]) the intervals are short sub-intervals of the
/// window and each object's row, given by [`RateFeed::finish`], is the traffic of every
/// interval that has a rate over the time those intervals cover: a counter reset (restart,
/// clear) or a gap in the data does not turn the answer into the difference of two unrelated
/// counter values.
#[derive(Debug)]
pub struct RateFeed {
    inputs: Vec<Inputs>,
    states: Vec<RateState>,
    names: Vec<Box<str>>,
    alpha: Option<f64>,
    seeded: bool,
    /// Whole-window mode: per object totals.
    totals: Option<Vec<Totals>>,
    timeline: Timeline,
}

/// Sub-intervals a whole window is cut into: fine enough that a reset costs a thousandth of the
/// window, coarse enough that the scan stays a cheap last-value gather.
pub const WINDOW_INTERVALS: i64 = 1000;

/// A whole window's sub-interval, rounded up to whole seconds (from 1 s) or minutes (from
/// 10 min) so the rollup tiers can answer long windows (`crate::tiers`): the rounding depends
/// only on the window, so raw files and tiers cut the same grid.
fn round_width(w: i64) -> i64 {
    let up = |w: i64, u: i64| (w + u - 1) / u * u;
    if w >= 600_000_000_000 {
        up(w, 60_000_000_000)
    } else if w >= 1_000_000_000 {
        up(w, 1_000_000_000)
    } else {
        w
    }
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
                totals: None,
                timeline: Timeline::default(),
            },
        ))
    }

    /// This feed in whole-window mode (no smoothing; rows come from [`RateFeed::finish`]).
    pub fn whole_window(mut self) -> Self {
        self.alpha = None;
        self.totals = Some(vec![Totals::default(); self.inputs.len()]);
        self
    }

    /// The grid to feed this feed over `r`: `width_ns` per row, or (whole window) a
    /// [`WINDOW_INTERVALS`]th of the window.
    pub fn grid(&mut self, r: &TimeRange, width_ns: Option<i64>) -> Grid {
        let w = match (&self.totals, width_ns) {
            (Some(_), _) | (None, None) => {
                round_width((r.len_ns() + WINDOW_INTERVALS - 1) / WINDOW_INTERVALS)
            }
            (None, Some(w)) => w,
        }
        .max(1);
        self.timeline.width_ns = w;
        Grid::new(r, Some(w))
    }

    /// The same objects with fresh state machines (one per switch of a fleet).
    pub fn fresh(&self) -> Self {
        Self {
            states: vec![RateState::default(); self.inputs.len()],
            inputs: self.inputs.clone(),
            names: self.names.clone(),
            alpha: self.alpha,
            seeded: false,
            totals: self
                .totals
                .as_ref()
                .map(|t| vec![Totals::default(); t.len()]),
            timeline: Timeline {
                width_ns: self.timeline.width_ns,
                ..Timeline::default()
            },
        }
    }

    /// Consumes one chunk of buckets (the first chunk seeds the state machines with the
    /// window's first row), calling `each` per completed (interval, object) — in whole-window
    /// mode adding to the totals instead.
    ///
    /// # Errors
    /// Whatever `each` returns.
    pub fn feed(
        &mut self,
        b: &Buckets,
        mut each: impl FnMut(&RateRow<'_>) -> Result<()>,
    ) -> Result<()> {
        if !self.seeded {
            if let Some((t, v, ok)) = &b.first {
                for (inp, stt) in self.inputs.iter().zip(self.states.iter_mut()) {
                    let q = inp.quantities(|i| ok[i].then(|| v[i]));
                    stt.poll(*t, q, self.alpha);
                }
                self.timeline.poll(*t);
                self.seeded = true;
            }
        }
        for i in 0..b.n {
            let t = b.last_ts[i];
            if t == i64::MIN || self.timeline.last.is_some_and(|l| t <= l) {
                continue;
            }
            self.timeline.poll(t);
            for (k, ((inp, stt), name)) in self
                .inputs
                .iter()
                .zip(self.states.iter_mut())
                .zip(&self.names)
                .enumerate()
            {
                let q = inp.quantities(|c| b.last(i, c));
                if let Some(rates) = stt.poll(t, q, self.alpha) {
                    match &mut self.totals {
                        Some(tot) => tot[k].add(&rates, t),
                        None => each(&RateRow {
                            t_ns: t,
                            object: name,
                            rates,
                        })?,
                    }
                }
            }
        }
        Ok(())
    }

    /// Whole-window mode: one row per object that has a rate (at least one interval without a
    /// reset), in object order. Per interval: nothing.
    ///
    /// # Errors
    /// Whatever `each` returns.
    pub fn finish(&self, mut each: impl FnMut(&RateRow<'_>) -> Result<()>) -> Result<()> {
        let Some(tot) = &self.totals else {
            return Ok(());
        };
        for (t, name) in tot.iter().zip(&self.names) {
            if let Some(rates) = t.rates() {
                each(&RateRow {
                    t_ns: t.last_ns,
                    object: name,
                    rates,
                })?;
            }
        }
        Ok(())
    }

    /// What the fed data looked like.
    pub fn report(&self) -> WindowReport {
        let mut r = WindowReport {
            first_ns: self.timeline.first,
            last_ns: self.timeline.last,
            gaps: self.timeline.gaps(),
            ..WindowReport::default()
        };
        for s in &self.states {
            let (n, at) = s.resets();
            if n > 0 {
                r.resets += n;
                r.objects_reset += 1;
                r.last_reset_ns = r.last_reset_ns.max(at);
            }
        }
        r
    }
}

/// What [`compute`] did.
#[derive(Debug, Clone, Default)]
pub struct Computed {
    /// Snapshots scanned.
    pub scanned: u64,
    /// Columns read.
    pub columns: usize,
    pub report: WindowReport,
    /// Where each part of the window came from (raw files or a rollup tier).
    pub plan: Planned,
}

/// Runs the rates scan, calling `each` per completed (interval, object) in time order — or,
/// with no `width_ns`, once per object for the whole window (see [`RateFeed`]). The window is
/// planned over the raw files and the rollup tiers ([`crate::tiers`]: the coarsest source exact
/// at the grid's width for each part).
///
/// # Errors
/// Engine failures, a window only sources that cannot answer it hold, or an error from `each`.
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
    mut each: impl FnMut(&RateRow<'_>) -> Result<()>,
) -> Result<Computed> {
    let (cols, mut feed) = RateFeed::new(s, objects, st, alpha)?;
    if width_ns.is_none() {
        feed = feed.whole_window();
    }
    // Rows only where there is data (raw files or tiers).
    let raw = cat.raw_extent(s).await?;
    let Some(r) = tiers::clamp_to_data(cat, s, r, raw).await? else {
        return Ok(Computed {
            columns: cols.len(),
            ..Computed::default()
        });
    };
    let grid = feed.grid(&r, width_ns);
    let need = Need {
        width: Some(grid.width_ns),
        ..Need::default()
    };
    let plan = tiers::plan(s, raw, &r, &need)?;
    let scanned = tiers::scan(
        cat,
        s,
        &cols,
        &plan,
        Some(grid.width_ns),
        Aggs::default(),
        progress,
        |b| feed.feed(b, &mut each),
    )
    .await?;
    feed.finish(&mut each)?;
    Ok(Computed {
        scanned,
        columns: cols.len(),
        report: feed.report(),
        plan,
    })
}

/// Interfaces `--plot` draws (the chart's markers and colours stay apart up to here).
const PLOTTED: usize = 8;

/// # Errors
/// See [`Error`]; an empty window is `NotFound` and names the range that exists.
pub async fn run(a: Args) -> Result<ExitCode> {
    let started = Instant::now();
    let set = a.common.resolve();
    let unit: RateUnit = a.unit.get();
    let group = if a.rif { "ROUTER_INTERFACE" } else { "PORT" };
    let st = if a.rif { rates::RIF } else { rates::PORT };
    let alpha = a.ema.map(|n| rates::alpha(n.max(1)));
    let plot_to = crate::chart::PlotTo::new(a.plot.as_deref(), set.format == Format::Table);
    let want_plot = plot_to.wanted();
    let progress = Progress::new("rates");
    let mut series: Vec<plot::Series> = Vec::new();
    let mut p = Printer::new(set.format);
    // Prints one row (the switch column only for fleets).
    let mut emit = |p: &mut Printer,
                    sw: Option<&str>,
                    per_interval: bool,
                    speeds: &Speeds,
                    row: &RateRow<'_>|
     -> Result<()> {
        let x = &row.rates;
        let speed = speeds.of(row.object);
        let rx_util = Rates::util(x.rx_bps, Some(speed));
        let tx_util = Rates::util(x.tx_bps, Some(speed));
        // JSON and CSV print the values only: their text is not formatted.
        let text = p.wants_text();
        let txt = |v: f64, f: &dyn Fn(f64) -> String| if text { f(v) } else { String::new() };
        let bps = |v: Option<f64>| {
            v.map_or_else(Cell::na, |v| {
                Cell::f64(unit.value(v), txt(v, &|v| unit.format(v)))
            })
        };
        let opt = |v: Option<f64>, f: fn(f64) -> String| {
            v.map_or_else(Cell::na, |v| Cell::f64(v, txt(v, &f)))
        };
        let ok = |v: Option<u64>| {
            v.map_or_else(Cell::na, |v| Cell {
                json: json!(v),
                text: if text { fmt_ok(v) } else { String::new() },
            })
        };
        let mut cells = Vec::with_capacity(12);
        if per_interval {
            cells.push(Cell::time(row.t_ns));
        }
        if let Some(sw) = sw {
            cells.push(Cell::str(sw));
        }
        cells.extend([
            Cell::str(row.object),
            ok(x.rx_ok),
            bps(x.rx_bps),
            opt(x.rx_pps, fmt_pps),
            opt(rx_util, fmt_util),
            ok(x.tx_ok),
            bps(x.tx_bps),
            opt(x.tx_pps, fmt_pps),
            opt(tx_util, fmt_util),
        ]);
        if !per_interval {
            cells.push(Cell {
                json: json!(x.dt_ns),
                text: human_ns(x.dt_ns),
            });
        }
        if want_plot {
            let name = match sw {
                Some(sw) => format!("{sw} {}", row.object),
                None => row.object.to_string(),
            };
            let v = x.rx_bps.unwrap_or(f64::NAN);
            match series.iter_mut().find(|(n, _)| *n == name) {
                Some((_, s)) => s.push((row.t_ns, v)),
                None => series.push((name, vec![(row.t_ns, v)])),
            }
        }
        p.row(cells)
    };
    let begin = |p: &mut Printer,
                 fleet: bool,
                 per_interval: bool,
                 profile: &str,
                 r: &TimeRange,
                 width: Option<i64>,
                 speeds: &Speeds|
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
        if !per_interval {
            header.push("COVERED");
        }
        p.set_units(&[
            ("TIME", "RFC 3339"),
            ("RX_OK", "packets"),
            ("TX_OK", "packets"),
            ("RX_BPS", unit.name()),
            ("TX_BPS", unit.name()),
            ("RX_PPS", "packets/s"),
            ("TX_PPS", "packets/s"),
            ("RX_UTIL", "%"),
            ("TX_UTIL", "%"),
            ("COVERED", "ns"),
        ]);
        if let Some(w) = width {
            p.note(&format!(
                "Rates per {} interval over {r} ({}).",
                human_ns(w),
                human_ns(r.len_ns())
            ))?;
            if w > r.len_ns() {
                crate::diag::note(&format!(
                    "rates: -r {} is longer than the window ({}): the rows are the parts of intervals inside it (leave -r out for one row per port over the whole window)",
                    human_ns(w),
                    human_ns(r.len_ns())
                ));
            }
        }
        p.begin(
            &header,
            json!({
                "command": "rates", "profile": profile, "group": group,
                "from": fmt_ts(r.from_ns), "to": fmt_ts(r.to_ns),
                "resolution_ns": width, "alpha": alpha, "speeds": speeds.to_json(),
                "units": {"rx_bps": unit.name(), "rx_pps": "packets/s", "rx_util": "%",
                          "rx_ok": "packets", "covered": "ns"},
            }),
        )
    };
    let (mut scanned, mut samples) = (0u64, 0u64);
    let mut summary = json!({"engine": "local"});
    let mut report = WindowReport::default();
    // A chart needs points over time: --plot without -r picks a round interval (~120 points).
    let auto_width = want_plot && a.resolution.is_none();
    let chart_step = |r: &TimeRange| {
        let w = r.chart_step_ns(120);
        crate::diag::note(&format!(
            "rates: --plot without -r: one point per {} (-r sets another)",
            human_ns(w)
        ));
        w
    };
    let whole = a.resolution.is_none() && !auto_width;
    // Whole-window rows come at the end of each switch's scan; they are printed after the
    // sentence about the window's gaps and resets.
    let mut held: Vec<(Option<String>, Held, std::sync::Arc<Speeds>)> = Vec::new();
    // The first switch's speeds, for the sentence about them.
    let mut speeds_seen: Option<std::sync::Arc<Speeds>> = None;
    let targets;
    let (r, first_session) = if let Some(remote) = set.spark_remote()? {
        let lake = Lake::open(remote, &set.data, &set.switches).await?;
        let extent = lake.newest(group).await?.map(|t| (t, t));
        let r = a.time.resolve(extent)?;
        let width = match a.resolution.as_deref() {
            None => auto_width.then(|| chart_step(&r)),
            Some("stream") | Some("native") => {
                return Err(Error::Usage(
                    "--engine spark: give --resolution as a duration (e.g. 1s); `stream` is measured per switch by the local engine only".into(),
                ))
            }
            Some(d) => Some(parse_duration_ns(d)?),
        };
        let s = crate::fleet::lake_session(&lake.columns, group, a.profile.get());
        let objects = super::objects_of(&s, &a.objects.list, true)?;
        let (cols, mut proto_feed) = RateFeed::new(&s, &objects, &st, alpha)?;
        if whole {
            proto_feed = proto_feed.whole_window();
        }
        let scope = Scope {
            group: group.into(),
            profile: a.profile.profile.clone(),
            switches: set.switches.clone(),
            range: r,
            ts: lake.ts.clone(),
        };
        let grid = proto_feed.grid(&r, width);
        let (per_switch, files) = lake.buckets(&scope, &cols, grid, Aggs::default()).await?;
        // The engine reads no footers: --speed or 100G for every port.
        let speeds = std::sync::Arc::new(Speeds::new(a.speed.flag_mbps()?, Default::default()));
        speeds_seen = Some(std::sync::Arc::clone(&speeds));
        begin(
            &mut p,
            true,
            width.is_some(),
            &s.profile,
            &r,
            width,
            &speeds,
        )?;
        for sw in per_switch {
            // Each switch's objects: the ones it has data for (its own rows come back non-null).
            let mut feed = proto_feed.fresh();
            scanned += sw.value.rows;
            samples += sw.value.rows * cols.len() as u64;
            let mut keep = |row: &RateRow<'_>| -> Result<()> {
                if row.rates.rx_bps.is_none()
                    && row.rates.tx_bps.is_none()
                    && row.rates.rx_pps.is_none()
                    && row.rates.tx_pps.is_none()
                {
                    return Ok(()); // an object this switch does not have
                }
                if whole {
                    held.push((
                        Some(sw.switch.clone()),
                        Held::of(row),
                        std::sync::Arc::clone(&speeds),
                    ));
                    Ok(())
                } else {
                    emit(&mut p, Some(&sw.switch), true, &speeds, row)
                }
            };
            feed.feed(&sw.value, &mut keep)?;
            feed.finish(&mut keep)?;
            report.merge(&feed.report());
        }
        summary = lake.about(files);
        if scanned == 0 {
            return Err(Error::NotFound(format!(
                "no {group} samples in {r} in the lake at {}",
                lake.root
            )));
        }
        (r, None)
    } else {
        targets = crate::fleet::open(&set.data, &set.switches, set.strict).await?;
        let fleet = targets.iter().any(|t| t.switch.is_some());
        let (found, r) = crate::fleet::sessions(&targets, a.profile.get(), group, &a.time).await?;
        let mut begun = false;
        // The chart's interval when --plot picked it (the same for every switch).
        let mut auto = None;
        for (t, s) in &found {
            let objects = super::objects_of(s, &a.objects.list, fleet)?;
            let width = match resolve_resolution(&t.cat, s, &r, a.resolution.as_deref()).await {
                Ok(None) if auto_width => {
                    if auto.is_none() {
                        // Over the data's own span in the window: an hour's window over a few
                        // seconds of data would get one point.
                        let span = match t.cat.extent_in(s, &r).await? {
                            Some((a, b)) => TimeRange {
                                from_ns: a.max(r.from_ns),
                                to_ns: b.saturating_add(1).min(r.to_ns),
                            },
                            None => r,
                        };
                        auto = Some(chart_step(&span));
                    }
                    auto
                }
                Ok(w) => w,
                Err(Error::NotFound(_)) if fleet => continue,
                // `-r stream` over a window without two snapshots: the begin record (the
                // window, the units) before the error, as any other empty window has (one
                // session outside a fleet: nothing has begun yet).
                Err(e @ Error::NotFound(_)) => {
                    let speeds = a.speed.resolve(&t.cat, s).await?;
                    begin(&mut p, fleet, true, &s.profile, &r, None, &speeds)?;
                    return Err(e);
                }
                Err(e) => return Err(e),
            };
            let speeds = std::sync::Arc::new(a.speed.resolve(&t.cat, s).await?);
            if !begun {
                begin(
                    &mut p,
                    fleet,
                    width.is_some(),
                    &s.profile,
                    &r,
                    width,
                    &speeds,
                )?;
                speeds_seen = Some(std::sync::Arc::clone(&speeds));
                begun = true;
            }
            let sw = t.switch.as_deref();
            let c = compute(
                &t.cat,
                s,
                &objects,
                &st,
                &r,
                width,
                alpha,
                &progress,
                |row| {
                    if whole {
                        held.push((
                            sw.map(str::to_string),
                            Held::of(row),
                            std::sync::Arc::clone(&speeds),
                        ));
                        Ok(())
                    } else {
                        emit(&mut p, sw, true, &speeds, row)
                    }
                },
            )
            .await?;
            scanned += c.scanned;
            samples += c.scanned * c.columns as u64;
            report.merge(&c.report);
            let about = c.plan.describe(s);
            if set.verbose {
                eprintln!(
                    "stel-query: rates{}: {}",
                    sw.map(|w| format!(" ({w})")).unwrap_or_default(),
                    c.plan.verbose_line(s)
                );
            }
            super::merge(
                &mut summary,
                json!({"tier": about["tier"], "segments": about["segments"]}),
            );
        }
        if scanned == 0 {
            let (t, s) = found[0];
            return Err(t.cat.empty_window(s, &r).await);
        }
        (r, Some(found[0]))
    };
    progress.finish();
    if whole && !held.is_empty() {
        if let (Some(x), Some(y)) = (report.first_ns, report.last_ns) {
            p.note(&format!(
                "Rates over {r} ({}), samples from {} to {}: one per interface, the traffic counted over the time its samples cover (COVERED).",
                human_ns(r.len_ns()),
                fmt_ts(x),
                fmt_ts(y)
            ))?;
        }
        if let Some(c) = report.caveat(true) {
            p.note(&format!("Note: {c}."))?;
        }
        if let Some(c) = speeds_seen.as_ref().and_then(|s| s.caveat()) {
            p.note(&format!("Note: {c}"))?;
        }
        for (sw, row, speeds) in &held {
            emit(&mut p, sw.as_deref(), false, speeds, &row.row())?;
        }
    } else if let Some(c) = report.caveat(false) {
        p.note(&format!("Note: {c}."))?;
    }
    if p.rows() == 0 {
        // Samples, but no two to make a rate from.
        let what = match (report.first_ns, report.last_ns) {
            (Some(a), Some(b)) if a != b => format!("samples from {} to {}", fmt_ts(a), fmt_ts(b)),
            (Some(a), _) => format!("one snapshot (at {})", fmt_ts(a)),
            _ => "no snapshot".to_string(),
        };
        let exists = match first_session {
            Some((t, s)) => match t.cat.extent(s).await? {
                Some((x, y)) => format!("; data exists for {}..{}", fmt_ts(x), fmt_ts(y)),
                None => String::new(),
            },
            None => String::new(),
        };
        return Err(Error::NotFound(format!(
            "the window {r} holds {what}: a rate needs two snapshots of an interface without a reset between them{exists} (widen --last, or use --from/--to)"
        )));
    }
    if want_plot {
        // The eight interfaces with the highest peak RX rate, so the chart stays readable.
        let peak = |s: &plot::Series| s.1.iter().map(|p| p.1).fold(0.0, f64::max);
        series.sort_by(|a, b| peak(b).total_cmp(&peak(a)));
        if series.len() > PLOTTED {
            crate::diag::note(&format!(
                "rates: --plot draws the {PLOTTED} interfaces with the highest peak RX rate of the {} in the window (-o picks others)",
                series.len()
            ));
        }
        series.truncate(PLOTTED);
        let label = format!("RX_BPS ({})", unit.name());
        let y = format!("RX rate ({})", unit.name());
        let labels = crate::chart::Labels {
            title: &label,
            y: &y,
        };
        // One unit on the axis: the one of the highest value drawn.
        let top = series.first().map_or(0.0, peak);
        plot_to.draw(&mut p, labels, &series, 16, &plot::rate_axis(unit, top))?;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let mut out = json!({
        "rows": p.rows(), "snapshots_scanned": scanned, "samples_scanned": samples,
        "elapsed_s": elapsed, "from": fmt_ts(r.from_ns), "to": fmt_ts(r.to_ns),
        "window": report.to_json(),
    });
    super::merge(&mut out, summary);
    p.summary(out)?;
    Ok(super::exit_for(p.rows()))
}
