//! `stel-ingestd`'s configuration file (TOML). Every section is the config struct of the stage it
//! configures, so the file and the code cannot drift; unknown keys are errors. Command-line
//! flags override the file. The documented example is `deploy/stel-ingestd.toml` (a test parses
//! it).
use std::path::{Path, PathBuf};

use crate::{pipeline::PipelineConfig, reader::ReaderConfig};

/// Where the daemon receives from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum SourceKind {
    /// The switch's generic netlink family (SONiC): names from constants.yml.
    #[default]
    Genl,
    /// A NETLINK_USERSOCK multicast group (`stel-emu --netlink-group N`, tests, benches).
    Usersock,
    /// The built-in emulator, in process, over a local socket pair (no root, no SONiC).
    Demo,
    /// Capture files, read once (no root): `[source] files`, `stel-ingestd --input FILE…`.
    File,
    /// No counter source: the daemon only collects INT reports (`[int]`, `--int-listen`), e.g.
    /// on a collector host that is not a SONiC switch.
    None,
}

/// `[source]`.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SourceConfig {
    pub kind: SourceKind,
    /// SONiC's constants.yml (genl family and group names); missing file = defaults
    /// `sonic_stel` / `ipfix`.
    pub constants: PathBuf,
    /// Backstop re-resolution of the genl family, seconds (notifications are immediate).
    pub genl_resync_s: u64,
    /// NETLINK_USERSOCK group (1..=32) for `kind = "usersock"`.
    pub usersock_group: u32,
    /// Socket receive buffer, bytes (SO_RCVBUFFORCE; needs CAP_NET_ADMIN past rmem_max).
    pub rcvbuf_bytes: usize,
    /// For `kind = "file"`: the files, read in order (IPFIX files, raw netlink recordings,
    /// pcap / pcapng; see `input_format`).
    pub files: Vec<PathBuf>,
    /// For `kind = "file"`: `auto` (from each file's first bytes), `ipfix`, `netlink`, `pcap`.
    pub input_format: crate::input::InputFormat,
}

impl Default for SourceConfig {
    fn default() -> Self {
        Self {
            kind: SourceKind::Genl,
            constants: PathBuf::from("/etc/sonic/constants.yml"),
            genl_resync_s: 5,
            usersock_group: 1,
            rcvbuf_bytes: 256 << 20,
            files: Vec::new(),
            input_format: crate::input::InputFormat::Auto,
        }
    }
}

/// `[filter]`.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FilterConfig {
    /// Load the eBPF socket filter (false: filter in user space, same rule).
    pub ebpf: bool,
    /// `auto` (`registered` for the switch's genl family with a `[state_db]` source, else
    /// `learn`), `registered` (only STATE_DB / session-file templates pass: SONiC's rule) or
    /// `learn` (a template seen on the socket is registered by the filter before its data
    /// arrives).
    pub policy: crate::filter::FilterPolicy,
    /// Most template IDs the filter map holds (registered and learned together). A
    /// registration past it fails as a whole and leaves nothing behind.
    pub max_templates: u32,
}

impl Default for FilterConfig {
    fn default() -> Self {
        Self {
            ebpf: true,
            policy: crate::filter::FilterPolicy::Auto,
            max_templates: crate::filter::TEMPLATE_MAP_MAX_ENTRIES,
        }
    }
}

/// `[status]`.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StatusConfig {
    /// Every counter, as JSON, rewritten atomically each interval (`stel-ingestd status` reads
    /// it; mode 0600). Unset: `status.json` in the data directory ([`DaemonConfig::data_dir`]),
    /// so everything a run writes follows it. Empty: none.
    pub file: Option<PathBuf>,
    /// Status line and file interval, ms.
    pub interval_ms: u64,
    /// Rates on the status line: `bytes` per second in SONiC's portstat style (`MB/s`, as
    /// RATES `RX_BPS` and `show interfaces counters`), or `bits` (`Gb/s`).
    pub rate_unit: stel_store::rate::RateUnit,
}

impl Default for StatusConfig {
    fn default() -> Self {
        Self {
            file: None,
            interval_ms: 1000,
            rate_unit: stel_store::rate::RateUnit::Bytes,
        }
    }
}

/// `[files]`: who may read what the daemon writes.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FilesConfig {
    /// The group of every file, directory and socket the daemon creates (a name or a number;
    /// `--group`): the daemon takes it as its group at start (as root, or when started with
    /// it). Empty: the daemon's own group. Modes are fixed whatever the umask: history 0640,
    /// sockets 0660, state files 0600, directories 0750 (`stel_store::durable`).
    pub group: String,
}

/// `[inspect]`: the live inspect endpoint (`stel-query inspect <profile>` reads it).
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct InspectConfig {
    /// Serve the latest snapshot of every session on a unix socket.
    pub enabled: bool,
    /// Socket path. Empty = `inspect.sock` next to the status file (`/run/stel/inspect.sock`
    /// for a root daemon with default settings, `stel-data/inspect.sock` with `--demo`).
    pub socket: PathBuf,
    /// Clients served at once (more are refused with an error line).
    pub max_clients: usize,
}

impl Default for InspectConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            socket: PathBuf::new(),
            max_clients: 16,
        }
    }
}

impl InspectConfig {
    /// The socket path: the configured one, else next to `status_file`, else (no status file)
    /// [`stel_store::live::DEFAULT_SOCKET`].
    pub fn socket_path(&self, status_file: &Path) -> PathBuf {
        if !self.socket.as_os_str().is_empty() {
            return self.socket.clone();
        }
        match status_file.parent() {
            Some(d) if !status_file.as_os_str().is_empty() => d.join(stel_store::live::SOCKET_NAME),
            _ => PathBuf::from(stel_store::live::DEFAULT_SOCKET),
        }
    }
}

/// A session given in the config file instead of STATE_DB: the JSON file `stel-emu --session`
/// writes (profile, group, domain, object_names, object_ids, session_config_hex).
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionFile {
    pub path: PathBuf,
}

impl SessionFile {
    /// The session file's JSON for `spec` and its `session_config` (what `stel-emu --session`
    /// writes and [`SessionFile::load`] reads; also the field names of a STATE_DB session entry).
    pub fn to_json(spec: &crate::decode::SessionSpec, session_config: &[u8]) -> serde_json::Value {
        let ids: Vec<String> = spec.object_ids.iter().map(u16::to_string).collect();
        serde_json::json!({
            "profile": spec.profile, "group": spec.group, "domain": spec.domain,
            "object_names": spec.object_names.join(","),
            "object_ids": ids.join(","),
            "session_type": "ipfix", "stream_status": "enabled",
            "session_config_hex": crate::hex::encode(session_config),
        })
    }

    /// Reads the session: its spec (names for the labels) and `session_config` bytes.
    ///
    /// # Errors
    /// Unreadable file, bad JSON, non-numeric ids or bad hex (the message names the field).
    pub fn load(&self) -> Result<(crate::decode::SessionSpec, Vec<u8>), String> {
        let p = self.path.display();
        let text = std::fs::read_to_string(&self.path).map_err(|e| format!("{p}: {e}"))?;
        let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| format!("{p}: {e}"))?;
        let opt = |k: &str| -> Result<Option<String>, String> {
            match v.get(k) {
                None | Some(serde_json::Value::Null) => Ok(None),
                Some(serde_json::Value::String(s)) => Ok(Some(s.clone())),
                Some(x) => Err(format!("{p}: {k}: expected a string, got {x}")),
            }
        };
        let required = |k: &str| -> Result<String, String> {
            match opt(k)? {
                Some(s) if !s.is_empty() => Ok(s),
                _ => Err(format!(
                    "{p}: missing \"{k}\" (a session needs profile, group, domain and \
                     session_config_hex; stel-emu --session writes all of them)"
                )),
            }
        };
        let list = |k: &str| -> Result<Vec<String>, String> {
            Ok(opt(k)?
                .unwrap_or_default()
                .split(',')
                .filter(|x| !x.is_empty())
                .map(String::from)
                .collect())
        };
        let profile = required("profile")?;
        let group = required("group")?;
        let domain = match v.get("domain") {
            Some(d) => d
                .as_u64()
                .and_then(|d| u32::try_from(d).ok())
                .ok_or_else(|| {
                    format!("{p}: domain: expected an integer 0..=4294967295, got {d}")
                })?,
            None => {
                return Err(format!(
                    "{p}: missing \"domain\" (the IPFIX observation domain of the session's \
                     exporter)"
                ))
            }
        };
        let object_ids = list("object_ids")?
            .iter()
            .map(|x| x.trim().parse::<u16>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("{p}: object_ids: {e}"))?;
        let config = crate::hex::decode(&required("session_config_hex")?).ok_or_else(|| {
            format!("{p}: session_config_hex: expected an even number of hex digits")
        })?;
        let spec = crate::decode::SessionSpec {
            profile,
            group,
            domain,
            object_names: list("object_names")?,
            object_ids,
        };
        Ok((spec, config))
    }
}

/// The whole file.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DaemonConfig {
    pub source: SourceConfig,
    pub reader: ReaderConfig,
    pub filter: FilterConfig,
    pub pipeline: PipelineConfig,
    pub status: StatusConfig,
    pub files: FilesConfig,
    /// Sessions registered at start (besides STATE_DB).
    pub sessions: Vec<SessionFile>,
    /// Parquet history (`stel_store::parquet`). On by default (`dir = "stel-data"`); set
    /// `enabled = false` under `[history]` to turn it off.
    pub parquet: Option<stel_store::parquet::ParquetSinkConfig>,
    pub history: HistoryConfig,
    /// COUNTERS_DB + RATES writer (`stel_store::sonic`); off unless this section is present.
    pub counters_db: Option<stel_store::sonic::CountersDbConfig>,
    /// STATE_DB session watcher (`sources::state_db`); off unless this section is present.
    pub state_db: Option<crate::sources::state_db::StateDbConfig>,
    /// Rollup tiers (`stel_store::rollup`, store/ROLLUPS.md), written next to the Parquet
    /// history; on with it by default (1 s and 1 min).
    pub rollup: stel_store::rollup::RollupConfig,
    /// The data dir's disk budget, shared by the raw history and the tiers.
    pub retention: RetentionConfig,
    /// Data-lake uploader (`stel_store::upload`): copies every published Parquet file to a
    /// directory or S3; off unless this section is present (or `--upload-to`).
    pub upload: Option<stel_store::upload::UploadConfig>,
    /// INT telemetry reports over UDP (`int::source`); off unless this section is present (or
    /// `--int-listen`).
    pub int: Option<crate::int::source::IntConfig>,
    /// Live inspect socket.
    pub inspect: InspectConfig,
    /// Prometheus `/metrics` and `/health` (`stel_store::prometheus`).
    pub metrics: MetricsConfig,
    /// OTLP export (`stel_store::otlp`); off unless this section is present (or
    /// `--otlp-endpoint`).
    pub otlp: Option<stel_store::otlp::OtlpConfig>,
}

/// `[history]`.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HistoryConfig {
    /// Write Parquet history (settings under `[parquet]`).
    pub enabled: bool,
}

impl Default for HistoryConfig {
    fn default() -> Self {
        Self { enabled: true }
    }
}

/// `[retention]`: what the data dir may hold in all.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetentionConfig {
    /// Bytes the raw history and the rollup tiers may take together (0 = no budget). The tiers
    /// keep their own limits (`[[rollup.tiers]]`); the raw history keeps what they leave (and
    /// never more than `[parquet] retention_max_bytes` when that is set).
    pub disk_budget_bytes: u64,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        Self {
            disk_budget_bytes: 16 << 30,
        }
    }
}

/// `[metrics]`: the Prometheus endpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// Address for `/metrics` and `/health`, e.g. "127.0.0.1:9464". Off (unset) by default: a
    /// switch daemon opens no TCP port unless asked (SONiC hosts expose services through their
    /// management VRF on purpose, and two daemons on one host would fight for one default port).
    pub listen: Option<std::net::SocketAddr>,
}

/// A config file that could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Parse { path: PathBuf, message: String },
}

impl DaemonConfig {
    /// Where the run writes: the history's root (`[parquet] dir`), else `stel-data`.
    pub fn data_dir(&self) -> PathBuf {
        self.parquet
            .as_ref()
            .map_or_else(|| PathBuf::from("stel-data"), |p| p.dir.clone())
    }

    /// The status file: `[status] file`, else `status.json` in [`Self::data_dir`]; empty: none.
    pub fn status_file(&self) -> PathBuf {
        self.status
            .file
            .clone()
            .unwrap_or_else(|| self.data_dir().join("status.json"))
    }

    /// Reads and validates a config file.
    ///
    /// # Errors
    /// The file is unreadable, not TOML, or has unknown keys / wrong types (the message names
    /// the key and line).
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text, path)
    }

    /// Parses config text (`path` only names it in errors).
    ///
    /// # Errors
    /// As [`Self::load`].
    pub fn parse(text: &str, path: &Path) -> Result<Self, ConfigError> {
        let cfg: Self = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_owned(),
            message: e.to_string(),
        })?;
        let problems = cfg.problems();
        if !problems.is_empty() {
            return Err(ConfigError::Parse {
                path: path.to_owned(),
                message: problems.join("; "),
            });
        }
        Ok(cfg)
    }

    /// Every problem across sections once the file parsed: values out of range, settings that
    /// need each other, resources two components would both claim. Each names the key and value.
    pub fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        if self.upload.is_some() && !self.history.enabled {
            p.push("[upload] copies the Parquet history: it needs [history] enabled = true".into());
        }
        if self.source.kind == SourceKind::File && self.source.files.is_empty() {
            p.push(
                "source.kind = \"file\" needs source.files (or stel-ingestd --input FILE)".into(),
            );
        }
        if !(1..=32).contains(&self.source.usersock_group) {
            p.push(format!(
                "source.usersock_group = {}: must be 1..=32",
                self.source.usersock_group
            ));
        }
        if self.source.kind == SourceKind::None && self.int.is_none() {
            p.push("source.kind = \"none\" collects nothing without [int]: add [int] listen = [\"0.0.0.0:5900\"]".into());
        }
        if let Some(i) = &self.int {
            p.extend(i.problems());
        }
        if self.rollup.enabled && self.history.enabled {
            if let Err(e) = self.rollup.resolve() {
                p.extend(e.iter().map(|x| format!("rollup.{x}")));
            }
        }
        if let Some(pq) = self.parquet.as_ref().filter(|_| self.history.enabled) {
            if let Err(e) = pq.validate() {
                p.extend(e.problems.iter().map(|x| format!("parquet.{x}")));
            }
            // Resources two components would both claim.
            if let Some(u) = &self.upload {
                let to = u.to.strip_prefix("file://").unwrap_or(&u.to);
                if !to.is_empty() && !to.contains("://") && Path::new(to) == pq.dir {
                    p.push(format!(
                        "upload.to = {:?} is the history's own directory (parquet.dir): the lake must be elsewhere",
                        u.to
                    ));
                }
            }
        }
        let status_file = self.status_file();
        if self.inspect.enabled
            && !status_file.as_os_str().is_empty()
            && self.inspect.socket_path(&status_file) == status_file
        {
            p.push(format!(
                "inspect.socket = {:?} is also status.file: choose another path",
                self.inspect.socket
            ));
        }
        p
    }

    /// `stel-ingestd --check-config`: every problem in `text`, not only the first. A TOML syntax
    /// error stops there (nothing after it can be read reliably); otherwise every key is tried
    /// on its own, so each unknown key or wrong type is reported, then the whole file's
    /// cross-section checks ([`Self::problems`]) run on what parsed.
    pub fn check(text: &str) -> Vec<String> {
        let mut table: toml::Table = match text.parse() {
            Ok(t) => t,
            Err(e) => return vec![format!("not valid TOML: {e}")],
        };
        let mut problems = Vec::new();
        let mut bad = Vec::new();
        for (k, v) in &table {
            check_key(&mut Vec::new(), k, v, &mut problems, &mut bad);
        }
        // The cross-section checks run on what is left once the refused keys are taken out
        // (their defaults stand in), so one bad key does not hide the others' problems.
        for path in &bad {
            remove_path(&mut table, path);
        }
        match toml::Value::Table(table).try_into::<Self>() {
            Ok(cfg) => problems.extend(cfg.problems()),
            Err(e) => problems.push(one_line(e.message())),
        }
        problems
    }
}

/// Tries `path.key = value` alone in an otherwise empty config, so each refused key is
/// reported; recurses into tables (an unknown section is reported once, by its name). Arrays of
/// tables are checked whole. Refused paths go to `bad`.
fn check_key(
    path: &mut Vec<String>,
    key: &str,
    value: &toml::Value,
    out: &mut Vec<String>,
    bad: &mut Vec<Vec<String>>,
) {
    let full = |path: &[String]| -> Vec<String> {
        path.iter().cloned().chain([key.to_string()]).collect()
    };
    if let toml::Value::Table(t) = value {
        // The section itself must exist.
        if let Err(e) = try_alone(path, key, toml::Value::Table(toml::Table::new())) {
            out.push(format!(
                "{}: {}",
                full(path).join("."),
                one_line(e.message())
            ));
            bad.push(full(path));
            return;
        }
        path.push(key.to_string());
        for (k, v) in t {
            check_key(path, k, v, out, bad);
        }
        path.pop();
        return;
    }
    if let Err(e) = try_alone(path, key, value.clone()) {
        out.push(format!(
            "{}: {}",
            full(path).join("."),
            one_line(e.message())
        ));
        bad.push(full(path));
    }
}

/// Deserialises a config holding only `path.key = value`.
fn try_alone(path: &[String], key: &str, value: toml::Value) -> Result<(), toml::de::Error> {
    let mut doc = toml::Table::new();
    doc.insert(key.to_string(), value);
    for p in path.iter().rev() {
        let mut outer = toml::Table::new();
        outer.insert(p.clone(), toml::Value::Table(doc));
        doc = outer;
    }
    toml::Value::Table(doc).try_into::<DaemonConfig>().map(drop)
}

fn remove_path(t: &mut toml::Table, path: &[String]) {
    match path {
        [] => {}
        [k] => {
            t.remove(k);
        }
        [k, rest @ ..] => {
            if let Some(toml::Value::Table(inner)) = t.get_mut(k) {
                remove_path(inner, rest);
            }
        }
    }
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_documented_example_parses() {
        let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/stel-ingestd.toml");
        let cfg = DaemonConfig::load(&p).unwrap();
        assert_eq!(cfg.source.kind, SourceKind::Genl);
        assert_eq!(cfg.reader.slots, 64);
        // The example documents every key of the optional sections too (commented out): each
        // one, uncommented, must parse and give the defaults.
        let text = std::fs::read_to_string(&p).unwrap();
        let mut section = String::new();
        let mut keys: Vec<(String, String)> = Vec::new();
        for l in text.lines() {
            // Commented-out keys are "# key = value"; their explanations "## text".
            let l = l.strip_prefix("# ").unwrap_or(l);
            if l.starts_with("[upload]") || l.starts_with("[parquet]") {
                section = l.to_string();
            } else if l.starts_with('[') {
                section.clear();
            } else if !section.is_empty() && l.contains(" = ") && !l.starts_with('#') {
                keys.push((section.clone(), l.to_string()));
            }
        }
        let up: String = std::iter::once("[upload]".to_string())
            .chain(
                keys.iter()
                    .filter(|(s, _)| s == "[upload]")
                    .map(|(_, k)| k.clone()),
            )
            .collect::<Vec<_>>()
            .join("\n");
        let c = DaemonConfig::parse(&up, &p).unwrap_or_else(|e| panic!("{e}\n{up}"));
        let u = c.upload.unwrap();
        let d = stel_store::upload::UploadConfig::default();
        assert_eq!(
            stel_store::upload::UploadConfig {
                to: d.to.clone(),
                ..u.clone()
            },
            d,
            "the documented [upload] values are the defaults"
        );
        let documented = keys.iter().filter(|(s, _)| s == "[upload]").count();
        let fields = serde_json::to_value(&d).unwrap().as_object().unwrap().len();
        assert_eq!(documented, fields, "every [upload] key is documented");
        let pq: String = std::iter::once("[parquet]".to_string())
            .chain(
                keys.iter()
                    .filter(|(s, _)| s == "[parquet]")
                    .map(|(_, k)| k.clone()),
            )
            .collect::<Vec<_>>()
            .join("\n");
        let c = DaemonConfig::parse(&pq, &p).unwrap_or_else(|e| panic!("{e}\n{pq}"));
        let d = stel_store::parquet::ParquetSinkConfig::default();
        assert_eq!(
            c.parquet.unwrap(),
            d,
            "the documented [parquet] values are the defaults"
        );
        let documented = keys.iter().filter(|(s, _)| s == "[parquet]").count();
        let fields = serde_json::to_value(&d).unwrap().as_object().unwrap().len();
        // switch_name (no default value to show) and test_write_delay_us (a test knob) are
        // described in prose, not as keys.
        assert_eq!(documented + 2, fields, "every [parquet] key is documented");
        assert!(cfg.inspect.enabled && cfg.inspect.socket.as_os_str().is_empty());
        assert_eq!(
            cfg.rollup,
            stel_store::rollup::RollupConfig::default(),
            "the documented [rollup] values are the defaults"
        );
        assert_eq!(cfg.retention, RetentionConfig::default());
    }

    #[test]
    fn unknown_keys_are_errors_that_name_them() {
        let e = DaemonConfig::parse("[reader]\nslotz = 3\n", Path::new("x.toml")).unwrap_err();
        assert!(e.to_string().contains("slotz"), "{e}");
        let e = DaemonConfig::parse("[source]\nusersock_group = 40\n", Path::new("x.toml"))
            .unwrap_err();
        assert!(e.to_string().contains("1..=32"), "{e}");
        let e = DaemonConfig::parse("[upload]\nto = \"/x\"\nretries = 3\n", Path::new("x.toml"))
            .unwrap_err();
        assert!(e.to_string().contains("retries"), "{e}");
        let e = DaemonConfig::parse(
            "[upload]\nto = \"/x\"\n[history]\nenabled = false\n",
            Path::new("x.toml"),
        )
        .unwrap_err();
        assert!(e.to_string().contains("needs [history]"), "{e}");
    }

    /// A session file without profile, group or domain is an error naming the field (it used
    /// to register a session named "" / domain 0).
    #[test]
    fn session_file_names_a_missing_field() {
        let dir = tempfile::tempdir().unwrap();
        let full = serde_json::json!({
            "profile": "p", "group": "PORT", "domain": 3,
            "object_names": "Ethernet0", "object_ids": "1",
            "session_config_hex": "000a0010000000000000000000000003",
        });
        let f = SessionFile {
            path: dir.path().join("s.json"),
        };
        std::fs::write(&f.path, full.to_string()).unwrap();
        let (spec, cfg) = f.load().unwrap();
        assert_eq!(
            (spec.profile.as_str(), spec.group.as_str(), spec.domain),
            ("p", "PORT", 3)
        );
        assert_eq!(cfg.len(), 16);
        for field in ["profile", "group", "domain", "session_config_hex"] {
            let mut v = full.clone();
            v.as_object_mut().unwrap().remove(field);
            std::fs::write(&f.path, v.to_string()).unwrap();
            let e = f.load().unwrap_err();
            assert!(e.contains(&format!("missing \"{field}\"")), "{field}: {e}");
        }
        let mut v = full.clone();
        v["domain"] = serde_json::json!("7");
        std::fs::write(&f.path, v.to_string()).unwrap();
        assert!(f
            .load()
            .unwrap_err()
            .contains("domain: expected an integer"));
    }

    #[test]
    fn inspect_socket_sits_next_to_the_status_file() {
        let c = InspectConfig::default();
        assert_eq!(
            c.socket_path(Path::new("/run/stel/status.json")),
            Path::new("/run/stel/inspect.sock")
        );
        assert_eq!(
            c.socket_path(Path::new("stel-data/status.json")),
            Path::new("stel-data/inspect.sock")
        );
        assert_eq!(
            c.socket_path(Path::new("")),
            Path::new("/run/stel/inspect.sock")
        );
    }
}
