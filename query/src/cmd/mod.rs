//! One module per subcommand, each with its `Args` (what was typed) and a `run` that resolves
//! them into settings and returns the exit code.

pub mod bursts;
pub mod completions;
pub mod export;
pub mod history;
pub mod inspect;
pub mod int;
pub mod rates;
pub mod serve;
pub mod sql;
pub mod stat;
pub mod top;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::{
    catalog::{Catalog, Session},
    error::{Error, Result},
    output::Format,
};

/// Questions about stel's counter history: rates, history, microbursts, live counters, SQL.
///
/// Data comes from the Parquet tree stel-ingestd writes (--data-dir, STEL_DATA_DIR), a local
/// directory or s3://bucket/prefix. Every command prints a table by default, --json for JSON
/// Lines ({"type":"begin"|"row"|"summary","data":{…}}) and --csv (raw numbers, units in the
/// header). Rates are bytes/s as in SONiC (MB/s); --unit bits shows bits/s (Gb/s). Durations
/// always take a unit (10s, 500ms, 1h30m). Unreadable or foreign Parquet files are skipped
/// with a warning (--strict: an error).
/// Exit codes: 0 rows printed, 1 no rows (an empty window, nothing matched), 2 error (a bad
/// flag, a missing data directory, a group, object or stat the data does not have).
#[derive(Debug, Parser)]
#[command(
    name = "stel-query",
    version,
    verbatim_doc_comment,
    after_help = "Examples:
  stel-query rates                     # port rates, the last minute of data
  stel-query rates --last 10s -r 1s -o Ethernet0 --ema --plot
  stel-query history -o Ethernet0 -s IF_IN_OCTETS,IF_IN_DISCARDS \\
      -r 100ms --agg min,max,last
  stel-query top --by drops -n 5 --since 10m
  stel-query bursts --threshold 90 --min-duration 30us --last 1s
  stel-query top --by bursts -n 10 --last 1h -d s3://lake/fleet \\
      --engine spark --remote sc://127.0.0.1:15002
  stel-query inspect stel_demo --table --duration 10s
  stel-query sql \"SELECT object, max(value) FROM counters
      WHERE stat = 'IF_IN_OCTETS' GROUP BY object\"
  stel-query int evc --last 10m        # per-EVC INT latency p50/p99, loss
  stel-query serve --listen 127.0.0.1:50051    # Flight SQL: Grafana, pyarrow
  stel-query export s3://lake/stel --from 2024-05-01T00:00:00Z \\
      --to 2024-05-01T01:00:00Z
  stel-query completions bash > /etc/bash_completion.d/stel-query"
)]
pub struct Cli {
    #[command(subcommand)]
    pub cmd: Cmd,
}

#[derive(Debug, Subcommand)]
pub enum Cmd {
    Rates(rates::Args),
    History(history::Args),
    Top(top::Args),
    Bursts(bursts::Args),
    Inspect(inspect::Args),
    Sql(sql::Args),
    Export(export::Args),
    Int(int::Args),
    Stat(stat::Args),
    Serve(serve::Args),
    Completions(completions::Args),
}

impl Cmd {
    /// The output format asked for (errors are JSON when it is JSON).
    pub fn format(&self) -> Format {
        let c = match self {
            Cmd::Rates(a) => &a.common,
            Cmd::History(a) => &a.common,
            Cmd::Top(a) => &a.common,
            Cmd::Bursts(a) => &a.common,
            Cmd::Sql(a) => &a.common,
            Cmd::Export(a) => &a.common,
            Cmd::Int(a) => &a.common,
            Cmd::Inspect(a) => return if a.json { Format::Json } else { Format::Table },
            Cmd::Stat(a) => return if a.json { Format::Json } else { Format::Table },
            Cmd::Completions(_) | Cmd::Serve(_) => return Format::Table,
        };
        c.resolve().format
    }

    /// Runs the command on a multi-threaded runtime (DataFusion's scans run on it).
    ///
    /// # Errors
    /// Whatever the command fails with.
    pub fn run(self) -> Result<ExitCode> {
        match self {
            Cmd::Stat(a) => return stat::run(a),
            Cmd::Completions(a) => return completions::run(a),
            Cmd::Serve(a) => return serve::run(a),
            _ => {}
        }
        let remote_ok = matches!(
            self,
            Cmd::Rates(_) | Cmd::Top(_) | Cmd::Bursts(_) | Cmd::Sql(_)
        );
        let common = match &self {
            Cmd::History(a) => Some(&a.common),
            Cmd::Export(a) => Some(&a.common),
            Cmd::Int(a) => Some(&a.common),
            _ => None,
        };
        if !remote_ok && common.is_some_and(|c| c.engine == crate::settings::Engine::Spark) {
            return Err(Error::Usage(
                "--engine spark answers top, bursts, rates and sql; history, export and int run on the local engine only (drop --engine spark)".into(),
            ));
        }
        let rt = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?;
        rt.block_on(async move {
            match self {
                Cmd::Rates(a) => rates::run(a).await,
                Cmd::History(a) => history::run(a).await,
                Cmd::Top(a) => top::run(a).await,
                Cmd::Bursts(a) => bursts::run(a).await,
                Cmd::Inspect(a) => inspect::run(a).await,
                Cmd::Sql(a) => sql::run(a).await,
                Cmd::Export(a) => export::run(a).await,
                Cmd::Int(a) => int::run(a).await,
                Cmd::Stat(_) | Cmd::Completions(_) | Cmd::Serve(_) => {
                    unreachable!("handled above")
                }
            }
        })
    }
}

/// 0 when rows were printed, 1 when none.
pub fn exit_for(rows: u64) -> ExitCode {
    if rows > 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// The objects of `s` named in `wanted` (all when empty).
///
/// # Errors
/// [`Error::Usage`]: a name the session does not have; the message lists some that exist.
pub fn pick_objects(s: &Session, wanted: &[String]) -> Result<Vec<String>> {
    let all = s.objects();
    if wanted.is_empty() {
        return Ok(all);
    }
    for w in wanted {
        if !all.contains(w) {
            let some: Vec<&str> = all.iter().take(8).map(String::as_str).collect();
            // A name the data does not have (a typo, most often) is an error, exit 2: a
            // script tells it from an empty window (exit 1).
            return Err(Error::Usage(format!(
                "{}/{} has no object {w}; it has {} objects: {}{}",
                s.profile,
                s.group,
                all.len(),
                some.join(", "),
                if all.len() > 8 { ", …" } else { "" }
            )));
        }
    }
    Ok(wanted.to_vec())
}

/// The stats of `s` named in `wanted` (all when empty).
///
/// # Errors
/// [`Error::Usage`]: a stat the session does not carry.
pub fn pick_stats(s: &Session, wanted: &[String]) -> Result<Vec<String>> {
    let mut all: Vec<String> = Vec::new();
    for c in &s.columns {
        if !all.contains(&c.stat) {
            all.push(c.stat.clone());
        }
    }
    if wanted.is_empty() {
        return Ok(all);
    }
    let mut out = Vec::new();
    for w in wanted {
        let w = short_stat(w);
        if !all.contains(&w) {
            return Err(Error::Usage(format!(
                "{}/{} does not carry {w}; it carries {}",
                s.profile,
                s.group,
                all.join(", ")
            )));
        }
        out.push(w);
    }
    Ok(out)
}

/// `SAI_PORT_STAT_IF_IN_OCTETS` → `IF_IN_OCTETS`; short names pass through.
pub fn short_stat(s: &str) -> String {
    if let Some((_, st)) = stel_store::sai::stat_by_full_name(s) {
        return st.short.to_string();
    }
    s.to_string()
}

/// Opens the catalog and resolves the session and window, with the "what exists" error for an
/// empty window.
///
/// # Errors
/// No data, no session, bad flags.
pub async fn open_session<'a>(
    cat: &'a Catalog,
    profile: Option<&str>,
    group: &str,
    time: &crate::settings::TimeArgs,
) -> Result<(&'a Session, crate::settings::TimeRange)> {
    let s = cat.session(profile, group)?;
    let extent = cat.extent(s).await?;
    let r = time.resolve(extent)?;
    Ok((s, r))
}

/// The objects of `s` to look at: `wanted` (those the session has, in a fleet where switches
/// differ; all of them, checked, for one switch) or every object.
pub fn objects_of(s: &Session, wanted: &[String], fleet: bool) -> Result<Vec<String>> {
    if fleet && !wanted.is_empty() {
        let have = s.objects();
        return Ok(wanted
            .iter()
            .filter(|w| have.contains(w))
            .cloned()
            .collect());
    }
    pick_objects(s, wanted)
}

/// Adds the fields of `extra` (an object) to `v` (an object).
pub fn merge(v: &mut serde_json::Value, extra: serde_json::Value) {
    if let (Some(m), serde_json::Value::Object(e)) = (v.as_object_mut(), extra) {
        m.extend(e);
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// Every example line of every `--help` fits an 80-column terminal: wider ones are wrapped
    /// by clap, and a wrapped command line pasted into a shell runs half a command.
    #[test]
    fn help_examples_fit_80_columns() {
        fn walk(c: &clap::Command, path: &str, bad: &mut Vec<String>) {
            let text = c.clone().term_width(1000).render_long_help().to_string();
            let mut examples = false;
            for line in text.lines() {
                if line.trim_end().ends_with("Examples:") {
                    examples = true;
                } else if examples && !line.starts_with("  ") {
                    examples = false;
                } else if examples && line.chars().count() > 80 {
                    bad.push(format!("{path}: {line}"));
                }
            }
            for sub in c.get_subcommands() {
                walk(sub, &format!("{path} {}", sub.get_name()), bad);
            }
        }
        let mut bad = Vec::new();
        let mut cli = super::Cli::command();
        cli.build();
        walk(&cli, "stel-query", &mut bad);
        assert!(
            bad.is_empty(),
            "example lines over 80 columns:\n{}",
            bad.join("\n")
        );
    }
}
