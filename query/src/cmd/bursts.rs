//! `stel-query bursts`: microbursts — utilisation above X % for at least Y, with start, duration
//! and peak. This is what 10 µs history is for: a 1 s poll averages a 50 µs burst away.

use std::{process::ExitCode, time::Instant};

use serde_json::json;

pub use crate::burst::Direction;
use crate::{
    burst::{detect, Burst, Rule},
    engine::Progress,
    error::{Error, Result},
    output::{human_ns, Cell, Format, Printer},
    plot,
    rates::{self, fmt_util},
    settings::{
        fmt_ts, BurstRuleArgs, CommonArgs, ObjectArg, ProfileArg, SpeedArg, TimeArgs, TimeRange,
    },
    spark::{compile::Scope, Lake},
};

/// Microbursts: where a port stays above --threshold % of line rate for at least --min-duration.
///
/// At the stream's own resolution unless -r says otherwise. The table leads with one line per
/// interface and direction (bursts, total and longest time, peak, bytes), then lists the
/// bursts (the first --limit; --json and --csv list all).
///
/// Examples:
///   stel-query bursts --last 1s
///   stel-query bursts --threshold 100 --min-duration 40us -o Ethernet0 --json
#[derive(Debug, clap::Args)]
#[command(verbatim_doc_comment)]
pub struct Args {
    #[command(flatten)]
    pub common: CommonArgs,
    #[command(flatten)]
    pub time: TimeArgs,
    #[command(flatten)]
    pub profile: ProfileArg,
    /// Router interfaces instead of ports.
    #[arg(long)]
    pub rif: bool,
    #[command(flatten)]
    pub objects: ObjectArg,
    #[command(flatten)]
    pub rule: BurstRuleArgs,
    #[command(flatten)]
    pub speed: SpeedArg,
    /// Direction(s) to look at.
    #[arg(long, value_enum, default_value = "both")]
    pub direction: Direction,
    /// Interval between the snapshots compared (default: every snapshot).
    #[arg(long, short = 'r', default_value = "stream")]
    pub resolution: String,
    /// Chart burst peaks over time: alone in the terminal (table output), with a file name as an
    /// image (`--plot b.svg`, `--plot b.png`).
    #[arg(long, num_args = 0..=1, default_missing_value = "", value_name = "FILE.svg|FILE.png")]
    pub plot: Option<String>,
    /// Table output: bursts listed after the per-interface summary (0: all). --json and
    /// --csv list every burst.
    #[arg(long, default_value_t = 50)]
    pub limit: usize,
}

/// One interface direction's bursts, summed.
#[derive(Debug, Clone)]
struct PortBursts {
    switch: Option<String>,
    object: String,
    dir: &'static str,
    bursts: u64,
    total_ns: i64,
    longest_ns: i64,
    peak: f64,
    bytes: u64,
}

/// Per (switch, interface, direction), in natural order.
fn per_port(bursts: &[(Option<String>, Burst)]) -> Vec<PortBursts> {
    let mut out: Vec<PortBursts> = Vec::new();
    let mut at: std::collections::HashMap<(Option<&str>, &str, &str), usize> =
        std::collections::HashMap::new();
    for (sw, b) in bursts {
        let d = b.end_ns - b.start_ns;
        let key = (sw.as_deref(), b.object.as_str(), b.dir);
        match at.get(&key).map(|i| &mut out[*i]) {
            Some(t) => {
                t.bursts += 1;
                t.total_ns += d;
                t.longest_ns = t.longest_ns.max(d);
                t.peak = t.peak.max(b.peak);
                t.bytes += b.bytes;
            }
            None => {
                at.insert(key, out.len());
                out.push(PortBursts {
                    switch: sw.clone(),
                    object: b.object.clone(),
                    dir: b.dir,
                    bursts: 1,
                    total_ns: d,
                    longest_ns: d,
                    peak: b.peak,
                    bytes: b.bytes,
                })
            }
        }
    }
    let nat = |a: &str, b: &str| crate::output::natural_cmp(a, b);
    out.sort_by(|x, y| {
        nat(
            x.switch.as_deref().unwrap_or(""),
            y.switch.as_deref().unwrap_or(""),
        )
        .then_with(|| nat(&x.object, &y.object))
        .then_with(|| x.dir.cmp(y.dir))
    });
    out
}

/// # Errors
/// See [`Error`].
pub async fn run(a: Args) -> Result<ExitCode> {
    let started = Instant::now();
    let set = a.common.resolve();
    let speed = a.speed.mbps()?;
    let rule = Rule::new(speed, a.rule.threshold, &a.rule.min_duration, a.direction)?;
    let group = if a.rif { "ROUTER_INTERFACE" } else { "PORT" };
    let st = if a.rif { rates::RIF } else { rates::PORT };
    let progress = Progress::new("bursts");
    // (switch, burst)
    let mut bursts: Vec<(Option<String>, Burst)> = Vec::new();
    let mut scanned = 0u64;
    let mut engine = json!({"engine": "local"});
    let fleet;
    let (profile, r, width): (String, TimeRange, Option<i64>);
    if let Some(remote) = set.spark_remote()? {
        if a.resolution != "stream" {
            return Err(Error::Usage(
                "--engine spark finds bursts at the stream's own resolution only (-r stream)"
                    .into(),
            ));
        }
        let lake = Lake::open(remote, &set.data, &set.switches).await?;
        let extent = lake.newest(group).await?.map(|t| (t, t));
        r = a.time.resolve(extent)?;
        let s = crate::fleet::lake_session(&lake.columns, group, a.profile.get());
        let objects = super::objects_of(&s, &a.objects.list, true)?;
        let series = rule.series(&s, &objects, &st);
        if series.is_empty() {
            return Err(Error::NotFound(format!(
                "the lake at {} has no {} / {} columns in its {group} sessions",
                lake.root, st.rx_octets, st.tx_octets
            )));
        }
        let scope = Scope {
            group: group.into(),
            profile: a.profile.profile.clone(),
            switches: set.switches.clone(),
            range: r,
            ts: lake.ts.clone(),
        };
        let (found, files) = lake.bursts(&scope, &series, &rule.params()).await?;
        bursts.extend(found.into_iter().map(|p| (Some(p.switch), p.value)));
        engine = lake.about(files);
        (profile, width, fleet) = (s.profile, None, true);
    } else {
        let targets = crate::fleet::open(&set.data, &set.switches, set.strict).await?;
        fleet = targets.iter().any(|t| t.switch.is_some());
        let (found, range) =
            crate::fleet::sessions(&targets, a.profile.get(), group, &a.time).await?;
        r = range;
        let mut w = None;
        let mut prof = String::new();
        for (t, s) in found {
            let objects = super::objects_of(s, &a.objects.list, fleet)?;
            let series = rule.series(s, &objects, &st);
            if series.is_empty() {
                if fleet {
                    continue;
                }
                return Err(Error::NotFound(format!(
                    "{}/{} carries no {} / {} counters to measure utilisation with",
                    s.profile, s.group, st.rx_octets, st.tx_octets
                )));
            }
            let width =
                match crate::engine::resolve_resolution(&t.cat, s, &r, Some(&a.resolution)).await {
                    Ok(w) => w.unwrap_or(r.len_ns()),
                    // A switch with fewer than two snapshots in the window has no interval.
                    Err(Error::NotFound(_)) if fleet => continue,
                    Err(e) => return Err(e),
                };
            w.get_or_insert(width);
            prof = s.profile.clone();
            let speeds = a.speed.resolve(&t.cat, s).await?;
            let (found, n, plan) =
                detect(&t.cat, s, &series, &r, width, &rule, &speeds, &progress).await?;
            scanned += n;
            let about = plan.describe(s);
            if set.verbose {
                eprintln!(
                    "stel-query: bursts{}: {}",
                    t.switch
                        .as_deref()
                        .map(|w| format!(" ({w})"))
                        .unwrap_or_default(),
                    plan.verbose_line(s)
                );
            }
            super::merge(&mut engine, json!({"tier": about["tier"]}));
            bursts.extend(found.into_iter().map(|b| (t.switch.clone(), b)));
        }
        if scanned == 0 && !fleet {
            let (t, s) = (&targets[0], targets[0].cat.session(a.profile.get(), group)?);
            return Err(t.cat.empty_window(s, &r).await);
        }
        (profile, width) = (prof, w);
    }
    progress.finish();
    bursts.sort_by(|(sa, x), (sb, y)| {
        let nat = |a: &str, b: &str| crate::output::natural_cmp(a, b);
        x.start_ns
            .cmp(&y.start_ns)
            .then_with(|| nat(sa.as_deref().unwrap_or(""), sb.as_deref().unwrap_or("")))
            .then_with(|| nat(&x.object, &y.object))
            .then_with(|| x.dir.cmp(y.dir))
    });
    let mut p = Printer::new(set.format);
    // The answer first: per interface and direction, how many bursts, how long in all, the
    // longest and the peak; then the bursts themselves.
    let per_port = per_port(&bursts);
    let table = set.format == Format::Table;
    let mut shown = bursts.len();
    if table && !bursts.is_empty() {
        p.note(&format!(
            "{} burst{} above {}% of {} for at least {} in {r}, on {} interface direction{}:",
            bursts.len(),
            if bursts.len() == 1 { "" } else { "s" },
            a.rule.threshold,
            a.speed.text(),
            human_ns(rule.min_ns),
            per_port.len(),
            if per_port.len() == 1 { "" } else { "s" },
        ))?;
        let mut h = Vec::new();
        if fleet {
            h.push("SWITCH");
        }
        h.extend([
            "IFACE",
            "DIR",
            "BURSTS",
            "TOTAL",
            "LONGEST",
            "PEAK_UTIL",
            "BYTES",
        ]);
        p.begin(&h, json!({}))?;
        for t in &per_port {
            let mut cells = Vec::new();
            if fleet {
                cells.push(Cell::str(t.switch.clone().unwrap_or_default()));
            }
            cells.extend([
                Cell::str(t.object.clone()),
                Cell::str(t.dir),
                Cell::count(t.bursts),
                Cell::str(human_ns(t.total_ns)),
                Cell::str(human_ns(t.longest_ns)),
                Cell::f64(t.peak, fmt_util(t.peak)),
                Cell::count(t.bytes),
            ]);
            p.row(cells)?;
        }
        p.end_table()?;
        if a.limit > 0 {
            shown = a.limit.min(bursts.len());
        }
        p.note(&if shown < bursts.len() {
            format!(
                "\nThe first {shown} of {} bursts (--limit 0 for all, or --json / --csv):",
                bursts.len()
            )
        } else {
            "\nThe bursts:".to_string()
        })?;
    }
    let mut header = vec!["START"];
    if fleet {
        header.push("SWITCH");
    }
    header.extend(["IFACE", "DIR", "DURATION", "PEAK_UTIL", "BYTES"]);
    p.set_units(&[
        ("START", "RFC 3339"),
        ("DURATION", "ns"),
        ("PEAK_UTIL", "%"),
        ("BYTES", "bytes"),
    ]);
    p.begin(
        &header,
        json!({"command": "bursts", "profile": profile, "group": group,
               "from": fmt_ts(r.from_ns), "to": fmt_ts(r.to_ns), "threshold_pct": a.rule.threshold,
               "min_duration_ns": rule.min_ns, "resolution_ns": width, "speed_mbps": speed,
               "engine": engine["engine"]}),
    )?;
    for (sw, bu) in bursts.iter().take(shown) {
        let d = bu.end_ns - bu.start_ns;
        let mut cells = vec![Cell {
            json: json!(fmt_ts(bu.start_ns)),
            text: fmt_ts(bu.start_ns),
        }];
        if fleet {
            cells.push(Cell::str(sw.clone().unwrap_or_default()));
        }
        cells.extend([
            Cell::str(bu.object.clone()),
            Cell::str(bu.dir),
            Cell {
                json: json!(d),
                text: format!("{}{}", human_ns(d), if bu.open { "+" } else { "" }),
            },
            Cell::f64(bu.peak, fmt_util(bu.peak)),
            Cell::count(bu.bytes),
        ]);
        p.row(cells)?;
    }
    let plot_to = crate::chart::PlotTo::new(a.plot.as_deref(), set.format == Format::Table);
    if plot_to.wanted() && !bursts.is_empty() {
        let mut series: Vec<plot::Series> = Vec::new();
        for (sw, bu) in &bursts {
            let name = match sw {
                Some(sw) => format!("{sw} {} {}", bu.object, bu.dir),
                None => format!("{} {}", bu.object, bu.dir),
            };
            match series.iter().position(|s| s.0 == name) {
                Some(i) => series[i].1.push((bu.start_ns, bu.peak)),
                None if series.len() < 8 => series.push((name, vec![(bu.start_ns, bu.peak)])),
                None => {}
            }
        }
        let labels = crate::chart::Labels {
            title: "burst peak utilisation",
            y: "peak utilisation (% of --speed)",
        };
        plot_to.draw(&mut p, labels, &series, 12, &|v| fmt_util(v))?;
    }
    let mut summary = json!({"rows": p.rows(), "bursts": per_port.iter().map(|t| t.bursts).sum::<u64>(),
                     "per_interface": per_port.iter().map(|t| json!({
                         "switch": t.switch, "iface": t.object, "dir": t.dir, "bursts": t.bursts,
                         "total_ns": t.total_ns, "longest_ns": t.longest_ns, "peak_util": t.peak,
                         "bytes": t.bytes})).collect::<Vec<_>>(),
                     "snapshots_scanned": scanned, "elapsed_s": started.elapsed().as_secs_f64()});
    super::merge(&mut summary, engine);
    p.summary(summary)?;
    if bursts.is_empty() && set.format != Format::Json {
        eprintln!(
            "stel-query: no bursts above {}% for ≥ {} in {r} ({} snapshots scanned)",
            a.rule.threshold,
            human_ns(rule.min_ns),
            scanned
        );
    }
    Ok(super::exit_for(p.rows()))
}
