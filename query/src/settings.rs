//! What was typed → what it means: the data location, the time window, the output format.
//!
//! [`CommonArgs`] is flattened into every subcommand's `Args`; [`CommonArgs::resolve`] turns it
//! into [`Settings`] (data location parsed, output mode chosen). Time windows are resolved later,
//! against the data ([`TimeArgs::resolve`]), because "the last minute" means the last minute that
//! exists.

use std::time::SystemTime;

use clap::Args;

pub use crate::window::{fmt_ts, parse_duration_ns, parse_time_ns, TimeRange};
use crate::{
    error::{Error, Result},
    output::Format,
};

/// Flags every data subcommand shares.
#[derive(Debug, Clone, Args)]
pub struct CommonArgs {
    /// Where the daemon writes Parquet: a directory or an `s3://bucket/prefix` URL (S3 settings
    /// from AWS_* variables: AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
    /// AWS_REGION, AWS_ALLOW_HTTP).
    #[arg(
        long,
        short = 'd',
        env = "STEL_DATA_DIR",
        default_value = "./stel-data"
    )]
    pub data_dir: String,
    /// Print JSON Lines: {"type":"begin"|"row"|"summary","data":{…}}.
    #[arg(long, conflicts_with = "csv")]
    pub json: bool,
    /// Print CSV: raw numbers (no units, no thousands separators), units in the header.
    #[arg(long)]
    pub csv: bool,
    /// Where the question runs: `local` (this process, over --data-dir) or `spark` (a Spark
    /// Connect server at --remote, which reads the lake at --data-dir itself: give a path or
    /// s3:// URL the server can reach).
    #[arg(long, value_enum, env = "STEL_ENGINE", default_value = "local")]
    pub engine: Engine,
    /// Spark Connect endpoint for --engine spark, e.g. sc://127.0.0.1:15002 (Sail or Apache
    /// Spark's connect server).
    #[arg(long, env = "SPARK_REMOTE", value_name = "sc://HOST:PORT")]
    pub remote: Option<String>,
    /// Fleet lakes (a root of switch=NAME/ directories): only these switches
    /// (comma-separated; default all).
    #[arg(long, value_delimiter = ',', value_name = "NAME")]
    pub switch: Vec<String>,
    /// Fail on the first unreadable or foreign Parquet file (a truncated copy, random bytes,
    /// another schema) instead of skipping it with a warning and counting it in the summary.
    #[arg(long)]
    pub strict: bool,
    /// Say on stderr where each part of the answer came from (raw files or a rollup tier).
    #[arg(long, short = 'v')]
    pub verbose: bool,
}

/// `-p/--profile`: one definition for every command that picks a session.
#[derive(Debug, Clone, Default, Args)]
pub struct ProfileArg {
    /// HFT profile; needed only when several profiles have the group (export: only this
    /// profile).
    #[arg(long = "profile", short = 'p', value_name = "PROFILE")]
    pub profile: Option<String>,
}

impl ProfileArg {
    pub fn get(&self) -> Option<&str> {
        self.profile.as_deref()
    }
}

/// `-o/--object`: one definition for every command that picks objects (`-i/--interface` is
/// the same flag, kept for portstat habits).
#[derive(Debug, Clone, Default, Args)]
pub struct ObjectArg {
    /// Only these objects, comma-separated: ports (Ethernet0,Ethernet4), router interfaces,
    /// queues and priority groups ('Ethernet0|3'), buffer pools; default all.
    #[arg(
        long = "object",
        short = 'o',
        value_delimiter = ',',
        value_name = "NAME",
        alias = "interface",
        short_alias = 'i'
    )]
    pub list: Vec<String>,
}

/// `--speed`: one definition for every command that computes utilisation.
#[derive(Debug, Clone, Default, Args)]
pub struct SpeedArg {
    /// Port speed for utilisation, for every port: 100G, 25G, or Mb/s like SONiC's PORT
    /// `speed` (400000). Default: each port's speed as the daemon recorded it from SONiC, else
    /// 100G.
    #[arg(long, value_name = "SPEED")]
    pub speed: Option<String>,
}

impl SpeedArg {
    /// The speed given for every port, Mb/s (`None`: none given).
    ///
    /// # Errors
    /// A text that is not a speed.
    pub fn flag_mbps(&self) -> Result<Option<f64>> {
        self.speed
            .as_deref()
            .map(|s| crate::rates::parse_speed_mbps(s).map_err(Error::Usage))
            .transpose()
    }

    /// One speed for every port, Mb/s: the flag, else 100G (for engines that do not read the
    /// files' recorded speeds).
    ///
    /// # Errors
    /// A text that is not a speed.
    pub fn mbps(&self) -> Result<f64> {
        Ok(self
            .flag_mbps()?
            .unwrap_or(crate::rates::DEFAULT_SPEED_MBPS))
    }

    /// The speeds of `s`'s ports: the flag, else what the files recorded, else 100G.
    ///
    /// # Errors
    /// A bad flag; failures reading the newest file's footer.
    pub async fn resolve(
        &self,
        cat: &crate::catalog::Catalog,
        s: &crate::catalog::Session,
    ) -> Result<crate::rates::Speeds> {
        let flag = self.flag_mbps()?;
        let recorded = match flag {
            Some(_) => Default::default(),
            None => cat.port_speeds(s).await?,
        };
        Ok(crate::rates::Speeds::new(flag, recorded))
    }

    /// As typed (or the default), for messages.
    pub fn text(&self) -> &str {
        self.speed.as_deref().unwrap_or("100G")
    }
}

/// `--unit`: one definition for every command that prints rates.
#[derive(Debug, Clone, Copy, Default, Args)]
pub struct UnitArg {
    /// Rate unit: bytes (bytes/s, SONiC's RX_BPS and portstat's MB/s) or bits (bits/s, Gb/s).
    #[arg(long = "unit", value_enum, default_value = "bytes")]
    pub unit: Unit,
}

impl UnitArg {
    pub fn get(&self) -> stel_store::rate::RateUnit {
        self.unit.into()
    }
}

/// `--threshold`, `--min-duration`: what makes a microburst (bursts, top --by bursts).
#[derive(Debug, Clone, Args)]
pub struct BurstRuleArgs {
    /// Utilisation a burst stays above, % of --speed.
    #[arg(long, default_value_t = 90.0, value_name = "PCT")]
    pub threshold: f64,
    /// Shortest burst counted (10us, 1ms, …).
    #[arg(long, default_value = "10us", value_name = "DURATION")]
    pub min_duration: String,
}

/// How rates are shown (see [`stel_store::rate::RateUnit`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Unit {
    /// Bytes per second: SONiC's RX_BPS, portstat's MB/s.
    #[default]
    Bytes,
    /// Bits per second: Gb/s, line-rate terms.
    Bits,
}

impl From<Unit> for stel_store::rate::RateUnit {
    fn from(u: Unit) -> Self {
        match u {
            Unit::Bytes => Self::Bytes,
            Unit::Bits => Self::Bits,
        }
    }
}

/// Which engine answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Engine {
    /// DataFusion and the bucket scan in this process.
    #[default]
    Local,
    /// A Spark Connect server (Sail, Apache Spark): the question is compiled to Spark SQL.
    Spark,
}

/// The time window flags.
#[derive(Debug, Clone, Default, Args)]
pub struct TimeArgs {
    /// Window ending now: 10m, 30s, 1h, 500ms.
    #[arg(long, conflicts_with_all = ["from", "last"])]
    pub since: Option<String>,
    /// Window start, RFC 3339 (2024-05-01T12:00:00Z) or ns since the epoch.
    #[arg(long)]
    pub from: Option<String>,
    /// Window end (exclusive), RFC 3339 or ns since the epoch; default: the newest sample.
    #[arg(long)]
    pub to: Option<String>,
    /// Window ending at the newest sample in the data: 10s, 1m (the default is 1m).
    #[arg(long)]
    pub last: Option<String>,
}

fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

impl TimeArgs {
    /// The window, given the extent of the data (`[first, last]` sample times).
    ///
    /// # Errors
    /// Unparsable flags or an empty window.
    pub fn resolve(&self, extent: Option<(i64, i64)>) -> Result<TimeRange> {
        let newest = extent.map(|(_, l)| l + 1);
        let r = if let Some(s) = &self.since {
            let to = now_ns();
            TimeRange {
                from_ns: to - parse_duration_ns(s)?,
                to_ns: to,
            }
        } else {
            let to = match &self.to {
                Some(t) => parse_time_ns(t)?,
                None => newest.unwrap_or_else(now_ns),
            };
            let from = match (&self.from, &self.last) {
                (Some(f), _) => parse_time_ns(f)?,
                (None, Some(l)) => to - parse_duration_ns(l)?,
                (None, None) => to - 60_000_000_000,
            };
            TimeRange {
                from_ns: from,
                to_ns: to,
            }
        };
        if r.to_ns <= r.from_ns {
            return Err(Error::Usage(format!(
                "empty window {r}: --to must be after --from"
            )));
        }
        Ok(r)
    }
}

/// What was resolved from [`CommonArgs`].
#[derive(Debug, Clone)]
pub struct Settings {
    pub data: String,
    pub format: Format,
    pub engine: Engine,
    pub remote: Option<String>,
    /// Switches to keep (empty: all).
    pub switches: Vec<String>,
    /// Fail on unreadable files instead of skipping them.
    pub strict: bool,
    /// Say where the answer came from (stderr).
    pub verbose: bool,
}

impl Settings {
    /// The Spark Connect endpoint, when the engine is Spark.
    ///
    /// # Errors
    /// `--engine spark` without `--remote`.
    pub fn spark_remote(&self) -> Result<Option<crate::spark::Remote>> {
        match (self.engine, &self.remote) {
            (Engine::Local, _) => Ok(None),
            (Engine::Spark, Some(r)) => crate::spark::Remote::parse(r).map(Some),
            (Engine::Spark, None) => Err(Error::Usage(
                "--engine spark needs --remote sc://host:port (or SPARK_REMOTE)".into(),
            )),
        }
    }
}

impl CommonArgs {
    pub fn resolve(&self) -> Settings {
        Settings {
            engine: self.engine,
            remote: self.remote.clone(),
            switches: self.switch.clone(),
            strict: self.strict,
            verbose: self.verbose,
            data: self.data_dir.clone(),
            format: if self.json {
                Format::Json
            } else if self.csv {
                Format::Csv
            } else {
                Format::Table
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_print_in_rfc_3339_with_ns() {
        for (ns, want) in [
            (0, "1970-01-01T00:00:00.000000000Z"),
            (1_714_564_800_000_000_001, "2024-05-01T12:00:00.000000001Z"),
            (1_714_564_800_123_456_789, "2024-05-01T12:00:00.123456789Z"),
            (-1, "1969-12-31T23:59:59.999999999Z"),
        ] {
            assert_eq!(fmt_ts(ns), want);
        }
    }

    #[test]
    fn durations_and_times_parse() {
        assert_eq!(parse_duration_ns("10us").unwrap(), 10_000);
        assert_eq!(parse_duration_ns("1m").unwrap(), 60_000_000_000);
        assert_eq!(parse_duration_ns("1h30m").unwrap(), 5_400_000_000_000);
        assert!(parse_duration_ns("ten").is_err());
        let e = parse_duration_ns("10").unwrap_err().to_string();
        assert!(
            e.contains("no unit") && e.contains("10s") && e.contains("10ms"),
            "{e}"
        );
        assert_eq!(parse_duration_ns("250ns").unwrap(), 250);
        assert_eq!(
            parse_time_ns("2023-11-14T22:13:20Z").unwrap(),
            1_700_000_000_000_000_000
        );
        assert_eq!(
            parse_time_ns("1700000000000000000").unwrap(),
            1_700_000_000_000_000_000
        );
        let e = parse_time_ns("yesterday").unwrap_err().to_string();
        assert!(e.contains("RFC 3339"), "{e}");
    }

    #[test]
    fn default_window_is_the_last_minute_of_data() {
        let t = TimeArgs::default();
        let r = t.resolve(Some((0, 100_000_000_000))).unwrap();
        assert_eq!(r.to_ns, 100_000_000_001);
        assert_eq!(r.len_ns(), 60_000_000_000);
        let t = TimeArgs {
            from: Some("100".into()),
            to: Some("50".into()),
            ..Default::default()
        };
        assert!(t
            .resolve(None)
            .unwrap_err()
            .to_string()
            .contains("empty window"));
    }
}
