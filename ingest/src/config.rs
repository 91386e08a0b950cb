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
}

impl Default for SourceConfig {
    fn default() -> Self {
        Self {
            kind: SourceKind::Genl,
            constants: PathBuf::from("/etc/sonic/constants.yml"),
            genl_resync_s: 5,
            usersock_group: 1,
            rcvbuf_bytes: 256 << 20,
        }
    }
}

/// `[filter]`.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FilterConfig {
    /// Load the eBPF socket filter (false: filter in user space, same rule).
    pub ebpf: bool,
}

impl Default for FilterConfig {
    fn default() -> Self {
        Self { ebpf: true }
    }
}

/// `[status]`.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StatusConfig {
    /// Every counter, as JSON, rewritten atomically each interval (`stel-ingestd status` reads
    /// it). Empty = none.
    pub file: PathBuf,
    /// Status line and file interval, ms.
    pub interval_ms: u64,
}

impl Default for StatusConfig {
    fn default() -> Self {
        Self {
            file: PathBuf::from("stel-data/status.json"),
            interval_ms: 1000,
        }
    }
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
    /// Reads the session: its spec (names for the labels) and `session_config` bytes.
    ///
    /// # Errors
    /// Unreadable file, bad JSON, non-numeric ids or bad hex (the message names the field).
    pub fn load(&self) -> Result<(crate::decode::SessionSpec, Vec<u8>), String> {
        let p = self.path.display();
        let text = std::fs::read_to_string(&self.path).map_err(|e| format!("{p}: {e}"))?;
        let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| format!("{p}: {e}"))?;
        let s = |k: &str| {
            v.get(k)
                .and_then(|x| x.as_str())
                .unwrap_or_default()
                .to_string()
        };
        let list = |k: &str| -> Vec<String> {
            s(k).split(',')
                .filter(|x| !x.is_empty())
                .map(String::from)
                .collect()
        };
        let object_ids = list("object_ids")
            .iter()
            .map(|x| x.trim().parse::<u16>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("{p}: object_ids: {e}"))?;
        let hex = s("session_config_hex");
        if hex.len() % 2 != 0 {
            return Err(format!("{p}: session_config_hex: odd length"));
        }
        let config = (0..hex.len() / 2)
            .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16))
            .collect::<Result<Vec<u8>, _>>()
            .map_err(|e| format!("{p}: session_config_hex: {e}"))?;
        let spec = crate::decode::SessionSpec {
            profile: s("profile"),
            group: s("group"),
            domain: v.get("domain").and_then(|d| d.as_u64()).unwrap_or(0) as u32,
            object_names: list("object_names"),
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
    /// Data-lake uploader (`stel_store::upload`): copies every published Parquet file to a
    /// directory or S3; off unless this section is present (or `--upload-to`).
    pub upload: Option<stel_store::upload::UploadConfig>,
    /// Live inspect socket.
    pub inspect: InspectConfig,
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
        if cfg.upload.is_some() && !cfg.history.enabled {
            return Err(ConfigError::Parse {
                path: path.to_owned(),
                message: "[upload] copies the Parquet history: it needs [history] enabled = true"
                    .into(),
            });
        }
        if !(1..=32).contains(&cfg.source.usersock_group) {
            return Err(ConfigError::Parse {
                path: path.to_owned(),
                message: format!(
                    "source.usersock_group = {}: must be 1..=32",
                    cfg.source.usersock_group
                ),
            });
        }
        Ok(cfg)
    }
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
            if l.starts_with("[upload]") {
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
        assert!(cfg.inspect.enabled && cfg.inspect.socket.as_os_str().is_empty());
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
