//! Microbursts: what makes one ([`Rule`]: utilisation above a threshold for at least a minimum
//! duration), what one is ([`Burst`]), and finding them in one session's history ([`detect`]).
//! The local engine runs [`detect`] over the bucket scan; `--engine spark` runs the same rule as
//! SQL ([`crate::spark::compile::bursts_sql`]) and returns the same [`Burst`] rows.

use crate::{
    catalog::{Catalog, Session},
    engine::{Aggs, Progress},
    error::Result,
    rates,
    window::{parse_duration_ns, TimeRange},
};

/// One utilisation series: an object, a direction label and its octets column.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Series {
    pub object: String,
    pub dir: String,
    pub column: String,
}

/// Burst detection parameters (as `stel-query bursts` takes them).
#[derive(Debug, Clone, Copy)]
pub struct BurstParams {
    /// Line rate, bytes/s.
    pub bytes_per_s: f64,
    /// Utilisation threshold, %.
    pub threshold: f64,
    /// Shortest burst kept, ns.
    pub min_ns: i64,
}

/// Which octet counters a burst is looked for in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Direction {
    /// Received (IF_IN_OCTETS).
    Rx,
    /// Transmitted (IF_OUT_OCTETS).
    Tx,
    /// Both, each on its own.
    #[default]
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

/// What makes a burst, resolved from the flags.
#[derive(Debug, Clone, Copy)]
pub struct Rule {
    /// Line rate, bytes/s (from --speed).
    pub bytes_per_s: f64,
    /// Utilisation threshold, %.
    pub threshold: f64,
    /// Shortest burst kept, ns.
    pub min_ns: i64,
    pub direction: Direction,
}

impl Rule {
    /// # Errors
    /// A bad --speed or --min-duration.
    pub fn new(
        speed_mbps: f64,
        threshold: f64,
        min_duration: &str,
        direction: Direction,
    ) -> Result<Self> {
        let speed = speed_mbps;
        Ok(Self {
            bytes_per_s: speed * 1e6 / 8.0,
            threshold,
            min_ns: parse_duration_ns(min_duration)?,
            direction,
        })
    }

    /// The (object, direction, column) series of `objects` this rule looks at.
    pub fn series(&self, s: &Session, objects: &[String], st: &rates::RateStats) -> Vec<Series> {
        let mut out = Vec::new();
        for o in objects {
            if self.direction != Direction::Tx {
                if let Some(c) = s.column(o, st.rx_octets) {
                    out.push(Series {
                        object: o.clone(),
                        dir: "RX".into(),
                        column: c.name.clone(),
                    });
                }
            }
            if self.direction != Direction::Rx {
                if let Some(c) = s.column(o, st.tx_octets) {
                    out.push(Series {
                        object: o.clone(),
                        dir: "TX".into(),
                        column: c.name.clone(),
                    });
                }
            }
        }
        out
    }

    /// For the distributed engine.
    pub fn params(&self) -> BurstParams {
        BurstParams {
            bytes_per_s: self.bytes_per_s,
            threshold: self.threshold,
            min_ns: self.min_ns,
        }
    }
}

/// The bursts of `series` of one session over `r`, at `width_ns` (the stream's own interval
/// unless asked otherwise; at a tier's resolution the tiers answer, [`crate::tiers`]), each
/// port against its own line rate from `speeds`.
/// Returns the bursts (time order), the snapshots scanned and where they came from.
///
/// # Errors
/// Engine failures.
#[expect(
    clippy::too_many_arguments,
    reason = "the resolved question, spelled out"
)]
pub async fn detect(
    cat: &Catalog,
    s: &Session,
    series: &[Series],
    r: &TimeRange,
    width_ns: i64,
    rule: &Rule,
    speeds: &crate::rates::Speeds,
    progress: &Progress,
) -> Result<(Vec<Burst>, u64, crate::tiers::Planned)> {
    let names: Vec<String> = series.iter().map(|c| c.column.clone()).collect();
    // Each series against its own port's line rate, bytes/s.
    let line: Vec<f64> = series
        .iter()
        .map(|c| speeds.of(&c.object) * 1e6 / 8.0)
        .collect();
    let mut tracks = vec![Track::default(); series.len()];
    let mut bursts: Vec<Burst> = Vec::new();
    let min_ns = rule.min_ns;
    let close = |t: &mut Track, c: &Series, out: &mut Vec<Burst>, open: bool| {
        if let Some((st, en, peak, bytes)) = t.run.take() {
            if en - st >= min_ns {
                out.push(Burst {
                    object: c.object.clone(),
                    dir: if c.dir == "TX" { "TX" } else { "RX" },
                    start_ns: st,
                    end_ns: en,
                    peak,
                    bytes,
                    open,
                });
            }
        }
    };
    let need = crate::tiers::Need {
        width: Some(width_ns),
        ..crate::tiers::Need::default()
    };
    let plan = crate::tiers::plan(s, cat.raw_extent(s).await?, r, &need)?;
    let scanned = crate::tiers::scan(
        cat,
        s,
        &names,
        &plan,
        Some(width_ns),
        Aggs::default(),
        progress,
        |b| {
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
                        close(tr, &series[c], &mut bursts, false);
                        continue;
                    }
                    // The same operations in the same order as the Spark SQL (compile::bursts_ctes)
                    // and the rollup tiers (stel_store::rollup::burst::above), so every engine
                    // compares the same double with the threshold.
                    let util = stel_store::rollup::burst::utilisation(v - pv, t - pt, line[c]);
                    if util > rule.threshold {
                        let run = tr.run.get_or_insert((pt, t, util, 0));
                        run.1 = t;
                        run.2 = run.2.max(util);
                        run.3 += v - pv;
                    } else {
                        close(tr, &series[c], &mut bursts, false);
                    }
                }
            }
            Ok(())
        },
    )
    .await?;
    for (c, tr) in tracks.iter_mut().enumerate() {
        close(tr, &series[c], &mut bursts, true);
    }
    bursts.sort_by(|x, y| {
        x.start_ns
            .cmp(&y.start_ns)
            .then_with(|| crate::output::natural_cmp(&x.object, &y.object))
            .then_with(|| x.dir.cmp(y.dir))
    });
    Ok((bursts, scanned, plan))
}
