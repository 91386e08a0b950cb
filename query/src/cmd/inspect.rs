//! `stel-query inspect <profile>`: the profile's live counters for a duration.
//!
//! The daemon has no live query endpoint (yet), so this tails what it publishes: every
//! `--every` it lists the newest hour partitions of each of the profile's groups, reads the last
//! snapshot of every Parquet file that appeared (files are published by an atomic rename, so a
//! listed file is complete), and prints each counter's value and its rate since the previous
//! snapshot. Freshness is therefore bounded by the Parquet sink's rotation interval.

//! `stel-query inspect <profile>`: the profile's live counters for a duration, from the running
//! daemon.
//!
//! Live (the normal case): it connects to the daemon's inspect socket (`stel_store::live`: one
//! JSON request line, then the latest snapshot of each of the profile's groups every `--every`)
//! and prints each counter's value and its rate since the previous snapshot. Freshness is the
//! decoder's batch flush (~10 ms) plus `--every`.
//!
//! Fallback (no socket, a stale socket, or `--from-files`): it tails what the daemon publishes:
//! every `--every` it lists the newest hour partitions of each of the profile's groups, reads the
//! last snapshot of every Parquet file that appeared (files are published by an atomic rename, so
//! a listed file is complete), and prints the same rows. Freshness is then bounded by the Parquet
//! sink's rotation interval (`flush_interval_ms`), which a one-line notice on stderr says.

use std::{
    collections::{HashMap, HashSet},
    path::{Path, PathBuf},
    process::ExitCode,
    time::{Duration, Instant},
};

use arrow_array::{
    cast::AsArray,
    types::{TimestampNanosecondType, UInt64Type},
    Array, RecordBatch,
};
use datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use futures::TryStreamExt;
use object_store::ObjectMeta;
use object_store::ObjectStoreExt;
use serde_json::json;
use stel_store::{
    live::{self, Client, Message, Request, Snapshot},
    paths::{escape_value, unescape_value},
};

use crate::{
    catalog::{Column, Location},
    error::{Error, Result},
    output::{Cell, Format, Printer},
    settings::{fmt_ts, parse_duration_ns},
};

/// The profile's live counters for a duration, from the running daemon.
///
/// Reads the daemon's inspect socket (stel-ingestd serves it next to its status file:
/// /run/stel/inspect.sock, or ./stel-data/inspect.sock with --demo). Without one it tails the
/// Parquet files the daemon publishes (fresh only every flush_interval_ms) and says so.
///
/// Examples:
///   stel-query inspect stel_demo --table --duration 10s
///   stel-query inspect stel_demo --json --duration 1m \
///       -o Ethernet0 -s IF_IN_OCTETS
///   stel-query inspect stel_demo --socket /run/stel/inspect.sock --every 100ms
///   stel-query inspect stel_demo --from-files -d /var/lib/stel
#[derive(Debug, clap::Args)]
#[command(verbatim_doc_comment)]
pub struct Args {
    /// HFT profile name.
    pub profile: String,
    /// JSON Lines output.
    #[arg(long, conflicts_with = "table")]
    pub json: bool,
    /// Table output (the default).
    #[arg(long)]
    pub table: bool,
    /// How long to watch.
    #[arg(long, default_value = "10s")]
    pub duration: String,
    /// How often to print the latest snapshot (live: 10ms..60s) / look for new files.
    #[arg(long, default_value = "500ms")]
    pub every: String,
    /// Only these objects.
    #[arg(long, short = 'o', value_delimiter = ',')]
    pub object: Vec<String>,
    /// Only these stats (short names).
    #[arg(long, short = 's', value_delimiter = ',')]
    pub stat: Vec<String>,
    /// The daemon's inspect socket (default: DATA_DIR/inspect.sock when --data-dir is given,
    /// else ./stel-data/inspect.sock, then /run/stel/inspect.sock).
    #[arg(long, env = "STEL_INSPECT_SOCKET", conflicts_with = "from_files")]
    pub socket: Option<PathBuf>,
    /// Tail the published Parquet files instead of asking the daemon.
    #[arg(long)]
    pub from_files: bool,
    /// History to tail in the fallback (a directory or s3://bucket/prefix; default ./stel-data).
    #[arg(long, short = 'd', env = "STEL_DATA_DIR")]
    pub data_dir: Option<String>,
}

const DEFAULT_DATA_DIR: &str = "./stel-data";
const HEADER: [&str; 6] = ["TIME", "GROUP", "OBJECT", "STAT", "VALUE", "RATE/S"];

/// The sockets to try, in order, when `--socket` is not given.
fn socket_candidates(data_dir: Option<&str>) -> Vec<PathBuf> {
    match data_dir {
        Some(d) if d.starts_with("s3://") => Vec::new(),
        Some(d) => vec![Path::new(d).join(live::SOCKET_NAME)],
        None => vec![
            Path::new(DEFAULT_DATA_DIR).join(live::SOCKET_NAME),
            PathBuf::from(live::DEFAULT_SOCKET),
        ],
    }
}

/// Rows and rates from successive snapshots (rate = Δvalue / Δts of the same counter; none
/// across a counter reset or for the first snapshot).
#[derive(Debug, Default)]
struct LiveRates {
    seq: HashMap<String, u64>,
    prev: HashMap<(String, String, String), (i64, u64)>,
    /// Snapshots newer than the first one seen of their group.
    fresh: u64,
    newest: Option<i64>,
}

/// One printed row: (ts, group, object, stat, value, rate/s).
type LiveRow = (i64, String, String, String, u64, Option<f64>);

impl LiveRates {
    /// The rows of `s` that pass the filters; nothing when the daemon has nothing new.
    fn rows(&mut self, s: &Snapshot, objects: &[String], stats: &[String]) -> Vec<LiveRow> {
        match self.seq.insert(s.group.clone(), s.seq) {
            Some(old) if old == s.seq => return Vec::new(),
            Some(_) => self.fresh += 1,
            None => {}
        }
        self.newest = Some(self.newest.map_or(s.ts, |n| n.max(s.ts)));
        let mut out = Vec::new();
        for (o, row) in s.objects.iter().zip(&s.values) {
            if !objects.is_empty() && !objects.contains(o) {
                continue;
            }
            for (st, v) in s.stats.iter().zip(row) {
                let Some(v) = *v else { continue };
                if !stats.is_empty() && !stats.contains(st) {
                    continue;
                }
                let key = (s.group.clone(), o.clone(), st.clone());
                let rate = self
                    .prev
                    .insert(key, (s.ts, v))
                    .filter(|(pt, pv)| s.ts > *pt && v >= *pv)
                    .map(|(pt, pv)| (v - pv) as f64 / ((s.ts - pt) as f64 / 1e9));
                out.push((s.ts, s.group.clone(), o.clone(), st.clone(), v, rate));
            }
        }
        out
    }
}

fn print_row(p: &mut Printer, r: LiveRow) -> Result<()> {
    p.row(vec![
        Cell::time(r.0),
        Cell::str(r.1),
        Cell::str(r.2),
        Cell::str(r.3),
        Cell::u64(r.4),
        Cell::opt_f64(r.5, |x| format!("{x:.2}")),
    ])
}

/// Watches the daemon's socket for `dur`. `Ok(None)`: nobody listens there (stale socket).
fn run_live(
    a: &Args,
    path: &Path,
    format: Format,
    dur: Duration,
    every: Duration,
) -> Result<Option<ExitCode>> {
    let every_ms = (every.as_millis() as u64).clamp(live::MIN_INTERVAL_MS, live::MAX_INTERVAL_MS);
    let req = Request {
        profile: a.profile.clone(),
        interval_ms: every_ms,
    };
    let timeout = (every * 3).max(Duration::from_secs(5));
    let mut c = match Client::connect(path, &req, timeout) {
        Ok(c) => c,
        Err(e) if a.socket.is_none() => {
            eprintln!(
                "stel-query: no daemon answers on {} ({e}); tailing published Parquet files instead: fresh only every flush_interval_ms",
                path.display()
            );
            return Ok(None);
        }
        Err(e) => {
            return Err(Error::Usage(format!(
                "cannot connect to the inspect socket {}: {e} (is stel-ingestd running? its [inspect] socket setting decides the path)",
                path.display()
            )))
        }
    };
    let started = Instant::now();
    let mut p = Printer::new(format);
    let mut rates = LiveRates::default();
    let mut began = false;
    let mut matched = false;
    let mut names: (HashSet<String>, HashSet<String>) = Default::default();
    while started.elapsed() < dur {
        let m = match c.next_message() {
            Ok(Some(m)) => m,
            Ok(None) => break, // the daemon stopped
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Err(Error::NotFound(format!(
                    "the daemon sent nothing for {timeout:?} on {}",
                    path.display()
                )))
            }
            Err(e) => return Err(e.into()),
        };
        let s = match m {
            Message::Snapshot(s) => s,
            Message::Error { message, .. } => {
                return Err(Error::NotFound(format!("stel-ingestd: {message}")))
            }
        };
        if !began {
            p.begin(
                &HEADER,
                json!({"command": "inspect", "profile": a.profile, "duration_ns": dur.as_nanos() as u64,
                       "interval_ns": every_ms * 1_000_000,
                       "source": format!("daemon inspect socket {}", path.display())}),
            )?;
            began = true;
        }
        names.0.extend(s.objects.iter().cloned());
        names.1.extend(s.stats.iter().cloned());
        let rows = rates.rows(&s, &a.object, &a.stat);
        matched |= !rows.is_empty();
        for r in rows {
            print_row(&mut p, r)?;
        }
        if p.rows() > 0 {
            // Fix the table's column widths now, so later rows print as they come.
            p.text("")?;
        }
        p.flush()?;
    }
    if !began {
        return Err(Error::NotFound(format!(
            "the daemon at {} closed the connection without data for profile {}",
            path.display(),
            a.profile
        )));
    }
    if !matched {
        let mut o: Vec<_> = names.0.into_iter().collect();
        let mut s: Vec<_> = names.1.into_iter().collect();
        o.sort();
        s.sort();
        return Err(Error::NotFound(format!(
            "no counter of profile {} matches -o/-s; objects: {}; stats: {}",
            a.profile,
            o.join(", "),
            s.join(", ")
        )));
    }
    p.summary(json!({"rows": p.rows(), "new_snapshots": rates.fresh,
                     "newest": rates.newest.map(fmt_ts), "source": "daemon"}))?;
    if rates.fresh == 0 {
        return Err(Error::NotFound(format!(
            "no new snapshot of profile {} arrived in {} (newest {}); is the switch still sending?",
            a.profile,
            a.duration,
            rates.newest.map_or("none".into(), fmt_ts)
        )));
    }
    Ok(Some(ExitCode::SUCCESS))
}

async fn list_recent(loc: &Location, dir: &str) -> Result<Vec<ObjectMeta>> {
    // Newest date, newest two hours (a rotation may just have crossed the hour).
    let mut out = Vec::new();
    let dates = loc.subdirs_pub(dir, "date").await?;
    let mut hours: Vec<String> = Vec::new();
    for d in dates.iter().rev().take(2) {
        for h in loc.subdirs_pub(&format!("{dir}/date={d}"), "hour").await? {
            hours.push(format!("{dir}/date={d}/hour={h}"));
        }
    }
    hours.sort();
    for h in hours.iter().rev().take(2) {
        let l: Vec<ObjectMeta> = loc.store.list(Some(&loc.path(h))).try_collect().await?;
        out.extend(l.into_iter().filter(|m| {
            m.location
                .filename()
                .is_some_and(|f| f.ends_with(".parquet") && !f.starts_with('.'))
        }));
    }
    out.sort_by(|a, b| a.location.cmp(&b.location));
    Ok(out)
}

async fn last_row(loc: &Location, m: &ObjectMeta) -> Result<Option<RecordBatch>> {
    let bytes = loc.store.get(&m.location).await?.bytes().await?;
    let b = ParquetRecordBatchReaderBuilder::try_new(bytes)?;
    let n = b.metadata().num_row_groups();
    if n == 0 {
        return Ok(None);
    }
    let mut last = None;
    for x in b.with_row_groups(vec![n - 1]).build()? {
        let x = x?;
        if x.num_rows() > 0 {
            last = Some(x.slice(x.num_rows() - 1, 1));
        }
    }
    Ok(last)
}

/// # Errors
/// No such profile, a daemon that cannot be reached at an explicit `--socket`, unreadable
/// files; no new snapshot during the duration is exit 1.
pub async fn run(a: Args) -> Result<ExitCode> {
    let format = if a.json { Format::Json } else { Format::Table };
    let dur = Duration::from_nanos(parse_duration_ns(&a.duration)? as u64);
    let every = Duration::from_nanos(parse_duration_ns(&a.every)? as u64);
    if every.is_zero() {
        return Err(Error::Usage("--every must be more than 0".into()));
    }
    if !a.from_files {
        let socket = a.socket.clone().or_else(|| {
            socket_candidates(a.data_dir.as_deref())
                .into_iter()
                .find(|p| p.exists())
        });
        if let Some(path) = socket {
            // The client is blocking I/O on a unix socket: keep it off the async workers.
            let (a, code) = tokio::task::spawn_blocking(move || {
                let r = run_live(&a, &path, format, dur, every);
                (a, r)
            })
            .await
            .map_err(|e| Error::Usage(format!("inspect client: {e}")))?;
            if let Some(code) = code? {
                return Ok(code);
            }
            return run_files(a, format, dur, every).await;
        }
        eprintln!(
            "stel-query: no daemon inspect socket ({}); tailing published Parquet files instead: fresh only every flush_interval_ms (--socket PATH to point at the daemon)",
            socket_candidates(a.data_dir.as_deref())
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
    } else {
        eprintln!(
            "stel-query: --from-files: tailing published Parquet files (fresh only every flush_interval_ms)"
        );
    }
    run_files(a, format, dur, every).await
}

/// The fallback: tails the published files.
async fn run_files(a: Args, format: Format, dur: Duration, every: Duration) -> Result<ExitCode> {
    let data_dir = a.data_dir.as_deref().unwrap_or(DEFAULT_DATA_DIR);
    let loc = Location::parse(data_dir, false)?;
    let pdir = format!("profile={}", escape_value(&a.profile));
    let groups = loc.subdirs_pub(&pdir, "group").await?;
    if groups.is_empty() {
        let profiles: Vec<String> = loc
            .subdirs_pub("", "profile")
            .await?
            .iter()
            .map(|p| unescape_value(p).unwrap_or_else(|| p.clone()))
            .collect();
        return Err(Error::NotFound(format!(
            "no data for profile {} under {}; profiles there: {}",
            a.profile,
            loc.url,
            if profiles.is_empty() {
                "none".to_string()
            } else {
                profiles.join(", ")
            }
        )));
    }
    let mut p = Printer::new(format);
    p.begin(
        &HEADER,
        json!({"command": "inspect", "profile": a.profile, "groups": groups,
               "duration_ns": dur.as_nanos() as u64, "source": "published Parquet files"}),
    )?;
    let mut seen: HashSet<String> = HashSet::new();
    let mut prev: HashMap<(String, String), (i64, u64)> = HashMap::new();
    let started = Instant::now();
    let mut first_pass = true;
    let mut fresh = 0u64;
    let mut newest: Option<(String, i64)> = None;
    loop {
        for g in &groups {
            let files = list_recent(&loc, &format!("{pdir}/group={g}")).await?;
            // At start only the newest existing file (a baseline); later every new one in order.
            let new: Vec<&ObjectMeta> = if first_pass {
                files.last().into_iter().collect()
            } else {
                files
                    .iter()
                    .filter(|m| !seen.contains(m.location.as_ref()))
                    .collect()
            };
            for f in &files {
                seen.insert(f.location.to_string());
            }
            for m in new {
                let Some(b) = last_row(&loc, m).await? else {
                    continue;
                };
                let t = b
                    .column(0)
                    .as_primitive::<TimestampNanosecondType>()
                    .value(0);
                if newest.as_ref().is_none_or(|(_, n)| t > *n) {
                    newest = Some((m.location.to_string(), t));
                }
                if !first_pass {
                    fresh += 1;
                }
                let schema = b.schema();
                for (i, f) in schema.fields().iter().enumerate().skip(1) {
                    let Some(c) = Column::parse(f.name()) else {
                        continue;
                    };
                    if (!a.object.is_empty() && !a.object.contains(&c.object))
                        || (!a.stat.is_empty() && !a.stat.contains(&c.stat))
                    {
                        continue;
                    }
                    let arr = b.column(i).as_primitive::<UInt64Type>();
                    if arr.is_null(0) {
                        continue;
                    }
                    let v = arr.value(0);
                    let key = (g.clone(), f.name().clone());
                    let rate = prev
                        .insert(key, (t, v))
                        .filter(|(pt, pv)| t > *pt && v >= *pv)
                        .map(|(pt, pv)| (v - pv) as f64 / ((t - pt) as f64 / 1e9));
                    p.row(vec![
                        Cell::time(t),
                        Cell::str(g.clone()),
                        Cell::str(c.object),
                        Cell::str(c.stat),
                        Cell::u64(v),
                        Cell::opt_f64(rate, |r| format!("{r:.2}")),
                    ])?;
                }
            }
        }
        p.flush()?;
        first_pass = false;
        if started.elapsed() >= dur {
            break;
        }
        tokio::time::sleep(every.min(dur.saturating_sub(started.elapsed()))).await;
    }
    p.summary(json!({"rows": p.rows(), "new_snapshots": fresh,
                     "newest": newest.as_ref().map(|(f, t)| json!({"file": f, "time": fmt_ts(*t)}))}))?;
    if fresh == 0 {
        return Err(Error::NotFound(format!(
            "no new files published for profile {} in {} (newest snapshot {}); is stel-ingestd running with its Parquet sink on {}?",
            a.profile,
            a.duration,
            newest.map_or("none".into(), |(f, t)| format!("{} in {f}", fmt_ts(t))),
            loc.url
        )));
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use std::sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    };

    use stel_emu::{default_stats, EmuConfig, Emulator, Pattern};
    use stel_ingest::decode::{CounterBatch, DecodeConfig, Decoder};
    use stel_store::{
        live::{LiveState, Server},
        sai::ObjectType,
    };

    use super::*;

    /// The daemon's live path without the netlink socket: the emulator's messages through the
    /// real decoder into the real snapshot store, served on a real unix socket.
    fn serve(dir: &Path) -> (Server, Arc<AtomicBool>, std::thread::JoinHandle<()>) {
        let state = Arc::new(LiveState::default());
        let server =
            Server::start(&dir.join(live::SOCKET_NAME), Arc::clone(&state), 4, None).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let halt = Arc::clone(&stop);
        let feeder = std::thread::spawn(move || {
            let mut emu = Emulator::new(EmuConfig {
                ports: 4,
                stats: default_stats(ObjectType::Port, 5),
                pattern: Pattern::Steady,
                profile: "lab".into(),
                ..EmuConfig::design()
            })
            .unwrap();
            let mut dec = Decoder::new(DecodeConfig::default());
            let mut sink = |b: CounterBatch| state.update(&b);
            dec.register_session(emu.session_spec(), &emu.session_config(), &mut sink)
                .unwrap();
            let mut buf = Vec::new();
            while !halt.load(Ordering::Relaxed) {
                buf.clear();
                emu.data_message(&mut buf);
                dec.decode(&buf, &mut sink);
                dec.flush(&mut sink);
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        (server, stop, feeder)
    }

    fn args(profile: &str, dir: &Path) -> Args {
        Args {
            profile: profile.into(),
            json: true,
            table: false,
            duration: "600ms".into(),
            every: "50ms".into(),
            object: vec!["Ethernet0".into()],
            stat: vec!["IF_IN_OCTETS".into()],
            socket: None,
            from_files: false,
            data_dir: Some(dir.to_str().unwrap().into()),
        }
    }

    #[test]
    fn live_rows_and_rates_from_the_socket() {
        let dir = tempfile::tempdir().unwrap();
        let (server, stop, feeder) = serve(dir.path());
        let path = dir.path().join(live::SOCKET_NAME);
        assert_eq!(
            socket_candidates(Some(dir.path().to_str().unwrap()))[0],
            path
        );
        // Until the feeder's first batch, the daemon knows no profile.
        let deadline = Instant::now() + Duration::from_secs(10);
        let (mut c, first) = loop {
            let mut c = Client::connect(
                &path,
                &Request {
                    profile: "lab".into(),
                    interval_ms: 20,
                },
                Duration::from_secs(5),
            )
            .unwrap();
            if let Some(Message::Snapshot(s)) = c.next_message().unwrap() {
                break (c, s);
            }
            assert!(Instant::now() < deadline, "no data");
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut r = LiveRates::default();
        let (objs, stats) = (
            vec!["Ethernet0".to_string()],
            vec!["IF_IN_OCTETS".to_string()],
        );
        let mut rows = r.rows(&first, &objs, &stats);
        while rows.len() < 3 {
            let Some(Message::Snapshot(s)) = c.next_message().unwrap() else {
                panic!("no snapshot");
            };
            assert_eq!(s.group, "PORT");
            assert_eq!(s.objects[0], "Ethernet0");
            rows.extend(r.rows(&s, &objs, &stats));
        }
        assert!(rows
            .iter()
            .all(|x| x.2 == "Ethernet0" && x.3 == "IF_IN_OCTETS"));
        assert!(rows[0].5.is_none(), "no rate for the first snapshot");
        assert!(rows[1].4 > rows[0].4 && rows[1].0 > rows[0].0, "{rows:?}");
        // Steady load: the same byte rate from one snapshot to the next.
        let (a, b) = (rows[1].5.unwrap(), rows[2].5.unwrap());
        assert!(a > 0.0 && (a - b).abs() / a < 0.01, "{a} {b}");
        drop(c);
        // The whole command: live, exit 0.
        let a = args("lab", dir.path());
        let code = run_live(
            &a,
            &path,
            Format::Json,
            Duration::from_millis(300),
            Duration::from_millis(50),
        )
        .unwrap();
        assert_eq!(code, Some(ExitCode::SUCCESS));
        // An unknown profile: the daemon's answer lists what it has.
        let e = run_live(
            &args("nope", dir.path()),
            &path,
            Format::Json,
            Duration::from_millis(300),
            Duration::from_millis(50),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("profiles with data: lab"), "{e}");
        // Filters that match nothing say what exists.
        let mut bad = args("lab", dir.path());
        bad.object = vec!["Ethernet999".into()];
        let e = run_live(
            &bad,
            &path,
            Format::Json,
            Duration::from_millis(300),
            Duration::from_millis(50),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("objects: Ethernet0"), "{e}");
        stop.store(true, Ordering::Relaxed);
        feeder.join().unwrap();
        server.shutdown();
        // A stale socket file (daemon gone) is not an error: the caller falls back to files.
        std::os::unix::net::UnixListener::bind(&path).unwrap();
        assert!(run_live(
            &args("lab", dir.path()),
            &path,
            Format::Json,
            Duration::from_millis(100),
            Duration::from_millis(50)
        )
        .unwrap()
        .is_none());
    }
}
