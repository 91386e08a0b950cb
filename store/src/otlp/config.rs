//! [`OtlpConfig`]: everything the OTLP sink can be told, with production defaults.

use std::{collections::BTreeMap, path::PathBuf};

use serde::{Deserialize, Serialize};

use super::Error;

/// Wire protocol to the collector.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Protocol {
    /// OTLP/gRPC (`MetricsService/Export` over HTTP/2), the collector's port 4317.
    Grpc,
    /// OTLP/HTTP with a binary protobuf body (`POST /v1/metrics`), the collector's port 4318.
    HttpProtobuf,
}

/// What [`super::OtlpSink::submit`] does when its queue is full. Neither choice ever makes a
/// decode thread wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WhenFull {
    /// Drop the batch being submitted (reason `queue_full`). The queue keeps the oldest data, so
    /// when the collector catches up it gets an older stretch followed by a gap.
    DropNewest,
    /// Evict the oldest queued batch to make room (reason `queue_evicted`). The collector gets
    /// the freshest data after a stall, which is what a dashboard wants; costs one extra queue
    /// operation on the decode thread per eviction.
    DropOldest,
}

/// How metrics are named.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MetricNames {
    /// `sai.<object type>.<stat>` in lower case: `sai.port.if_in_octets`,
    /// `sai.queue.watermark_bytes` (a collector's Prometheus exporter makes that
    /// `sai_port_if_in_octets_bytes_total`).
    Sai,
    /// SONiC countersyncd's names, `sai_counter_type_<type id>_stat_<stat id>`
    /// (`sai_counter_type_1_stat_0`), for dashboards built on it.
    Countersyncd,
}

/// TLS to the collector. TLS is used when the endpoint is `https://…`; the system's root
/// certificates are always trusted, `ca_file` adds one more.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TlsConfig {
    /// PEM file with the CA certificate(s) that signed the collector's certificate (a private
    /// CA); unset = the system's roots only.
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate, for collectors that require mutual TLS (needs `key_file`).
    pub cert_file: Option<PathBuf>,
    /// PEM private key of `cert_file`.
    pub key_file: Option<PathBuf>,
    /// Name to verify the collector's certificate against; unset = the endpoint's host.
    pub server_name: Option<String>,
}

/// Where per-profile collector endpoints come from: SONiC's CONFIG_DB
/// `HIGH_FREQUENCY_TELEMETRY_PROFILE|<profile>` fields `otel_endpoint` (and `otel_certs`, a PEM
/// CA file for that endpoint). Needs stel-store's `redis` feature.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ConfigDbConfig {
    /// Redis URL (`unix:///var/run/redis/redis.sock`, `redis://127.0.0.1:6379`).
    pub url: String,
    /// CONFIG_DB index (SONiC: 4).
    pub db: i64,
    /// How often the profiles are re-read, ms. A changed `otel_endpoint` takes effect within
    /// this time; counters already queued for the old endpoint still go there.
    pub refresh_ms: u64,
    /// Connect / command timeout, ms.
    pub io_timeout_ms: u64,
}

impl Default for ConfigDbConfig {
    fn default() -> Self {
        Self {
            url: "unix:///var/run/redis/redis.sock".to_string(),
            db: 4,
            refresh_ms: 5_000,
            io_timeout_ms: 1_000,
        }
    }
}

/// The OTLP metrics sink: every counter of every snapshot (or one snapshot per `resolution_ms`)
/// as an OTLP data point — cumulative monotonic sums for counters, gauges for levels
/// (occupancy, watermarks), with `object_name`, `sai_stat` and `profile` attributes and the
/// snapshot's own timestamp — sent to an OpenTelemetry collector.
///
/// `Default` is for production (a collector on this host, as SONiC's countersyncd assumes);
/// [`OtlpConfig::for_test`] gives short intervals and timeouts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OtlpConfig {
    /// Collector endpoint. gRPC: `http://host:4317` or `https://host:4317`. HTTP/protobuf:
    /// `http://host:4318` (`/v1/metrics` is appended when the URL has no path) or the full
    /// URL. Empty: only profiles that name their own `otel_endpoint` in CONFIG_DB are exported.
    pub endpoint: String,
    /// `grpc` or `http_protobuf`.
    pub protocol: Protocol,
    /// Extra request headers (gRPC metadata), e.g. `{ authorization = "Bearer …" }`.
    pub headers: BTreeMap<String, String>,
    /// TLS settings (used for `https://` endpoints).
    pub tls: TlsConfig,
    /// Longest a data point waits before its request is sent, ms. Requests are sent as soon as
    /// they hold `max_points_per_request` points; at low rates this bounds the delay.
    pub interval_ms: u64,
    /// Data points per export request (the batch size). ~120 bytes each on the wire: the
    /// default 10,000 makes ~1.2 MB requests, under the collector's 4 MiB gRPC limit.
    pub max_points_per_request: usize,
    /// Export at most one snapshot per session every this many ms of switch time (the first
    /// one at or after each multiple); the others are counted as downsampled. 0 = every
    /// snapshot, as SONiC's countersyncd does (at 10 µs polling that is far more than most
    /// collectors take: set e.g. 1000 when the Parquet history keeps the full resolution).
    pub resolution_ms: u64,
    /// `sai` (`sai.port.if_in_octets`) or `countersyncd` (`sai_counter_type_1_stat_0`).
    pub metric_names: MetricNames,
    /// Batches the queue between the decoders and the exporter holds. A queued batch keeps its
    /// buffers (8 MiB at the design session with the default decoder batches), so this bounds
    /// the sink's memory: 8 × 8 MiB by default.
    pub queue_batches: usize,
    /// `drop_newest` or `drop_oldest` when the queue is full.
    pub when_full: WhenFull,
    /// Export requests in flight per endpoint. 1 keeps every series in time order at the
    /// collector even across retries; more overlaps round trips.
    pub max_in_flight: usize,
    /// Per-attempt timeout, ms.
    pub timeout_ms: u64,
    /// First retry delay after a retryable failure (collector unreachable, UNAVAILABLE, HTTP
    /// 429/502/503/504), ms; doubles per attempt up to `retry_max_ms`.
    pub retry_initial_ms: u64,
    /// Longest retry delay, ms.
    pub retry_max_ms: u64,
    /// A request still failing this long after its first attempt is dropped (reason
    /// `retries_exhausted`), ms. While an endpoint is failing, new data for it is dropped
    /// before it is encoded (reason `unavailable`), so an unreachable collector costs nothing
    /// upstream.
    pub retry_max_elapsed_ms: u64,
    /// At shutdown, keep sending what is queued for at most this long, ms.
    pub shutdown_timeout_ms: u64,
    /// Also export the daemon's own counters (its metrics registry) every this many ms; 0 = no.
    pub own_metrics_interval_ms: u64,
    /// `host.name` resource attribute (the switch); unset = this host's name.
    pub switch_name: Option<String>,
    /// Per-profile endpoints from CONFIG_DB (`otel_endpoint`); unset = `endpoint` for all.
    pub config_db: Option<ConfigDbConfig>,
}

impl Default for OtlpConfig {
    fn default() -> Self {
        Self {
            endpoint: "http://localhost:4317".to_string(),
            protocol: Protocol::Grpc,
            headers: BTreeMap::new(),
            tls: TlsConfig::default(),
            interval_ms: 1_000,
            max_points_per_request: 10_000,
            resolution_ms: 0,
            metric_names: MetricNames::Sai,
            queue_batches: 8,
            when_full: WhenFull::DropOldest,
            max_in_flight: 1,
            timeout_ms: 10_000,
            retry_initial_ms: 100,
            retry_max_ms: 5_000,
            retry_max_elapsed_ms: 30_000,
            shutdown_timeout_ms: 5_000,
            own_metrics_interval_ms: 10_000,
            switch_name: None,
            config_db: None,
        }
    }
}

impl OtlpConfig {
    /// Short intervals, timeouts and backoff, for tests against a local receiver at `endpoint`.
    pub fn for_test(endpoint: &str) -> Self {
        Self {
            endpoint: endpoint.to_string(),
            interval_ms: 50,
            timeout_ms: 2_000,
            retry_initial_ms: 20,
            retry_max_ms: 200,
            retry_max_elapsed_ms: 20_000,
            shutdown_timeout_ms: 10_000,
            own_metrics_interval_ms: 0,
            switch_name: Some("test-switch".to_string()),
            ..Self::default()
        }
    }

    /// Every problem at once.
    pub(crate) fn validate(&self) -> Result<(), Error> {
        let mut p: Vec<String> = Vec::new();
        let mut need = |ok: bool, what: &str| {
            if !ok {
                p.push(what.to_string());
            }
        };
        need(
            self.max_points_per_request > 0,
            "max_points_per_request must be at least 1",
        );
        need(self.queue_batches > 0, "queue_batches must be at least 1");
        need(self.max_in_flight > 0, "max_in_flight must be at least 1");
        need(self.interval_ms > 0, "interval_ms must be at least 1");
        need(self.timeout_ms > 0, "timeout_ms must be at least 1");
        need(
            self.retry_initial_ms > 0 && self.retry_initial_ms <= self.retry_max_ms,
            "need 0 < retry_initial_ms <= retry_max_ms",
        );
        need(
            self.tls.cert_file.is_some() == self.tls.key_file.is_some(),
            "tls.cert_file and tls.key_file go together",
        );
        if let Some(c) = &self.config_db {
            need(c.refresh_ms > 0, "config_db.refresh_ms must be at least 1");
            need(
                c.io_timeout_ms > 0,
                "config_db.io_timeout_ms must be at least 1",
            );
            if cfg!(not(feature = "redis")) {
                p.push("config_db needs stel-store built with the `redis` feature".into());
            }
        }
        for (k, v) in &self.headers {
            let key_ok = !k.is_empty()
                && k.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
            if !key_ok {
                p.push(format!(
                    "headers: `{k}` is not a valid header name (letters, digits, `-`, `_`, `.`)"
                ));
            }
            if v.bytes().any(|b| b < 0x20 || b == 0x7f) {
                p.push(format!(
                    "headers: the value of `{k}` has control characters"
                ));
            }
        }
        if !self.endpoint.is_empty() {
            if let Err(e) = super::transport::parse_endpoint(&self.endpoint, self.protocol) {
                p.push(e);
            }
        }
        if p.is_empty() {
            Ok(())
        } else {
            Err(Error::Config(p.join("; ")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate_and_problems_are_listed_together() {
        OtlpConfig::default().validate().unwrap();
        OtlpConfig::for_test("http://127.0.0.1:1")
            .validate()
            .unwrap();
        let c = OtlpConfig {
            max_points_per_request: 0,
            max_in_flight: 0,
            endpoint: "ftp://x".into(),
            headers: BTreeMap::from([("bad key".into(), "v".into())]),
            ..OtlpConfig::default()
        };
        let e = c.validate().unwrap_err().to_string();
        for want in [
            "max_points_per_request",
            "max_in_flight",
            "ftp://x",
            "bad key",
        ] {
            assert!(e.contains(want), "{want} missing in: {e}");
        }
    }

    #[test]
    fn toml_names_and_unknown_keys() {
        let c: OtlpConfig = toml::from_str(
            "endpoint = \"https://otel:4318\"\nprotocol = \"http_protobuf\"\nwhen_full = \"drop_newest\"\nmetric_names = \"countersyncd\"\n[headers]\nauthorization = \"Bearer x\"\n[tls]\nca_file = \"/etc/ca.pem\"\n",
        )
        .unwrap();
        assert_eq!(c.protocol, Protocol::HttpProtobuf);
        assert_eq!(c.when_full, WhenFull::DropNewest);
        assert_eq!(c.metric_names, MetricNames::Countersyncd);
        assert_eq!(c.headers["authorization"], "Bearer x");
        assert_eq!(
            c.tls.ca_file.as_deref(),
            Some(std::path::Path::new("/etc/ca.pem"))
        );
        let e = toml::from_str::<OtlpConfig>("endpont = \"x\"").unwrap_err();
        assert!(e.to_string().contains("endpont"), "{e}");
    }

    /// `deploy/stel-ingestd.toml` documents every key of `[otlp]` (commented out, with the
    /// defaults): uncommented, the section must parse and give exactly the defaults.
    #[test]
    fn the_documented_example_section_is_the_defaults() {
        let p =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/stel-ingestd.toml");
        let text = std::fs::read_to_string(&p).unwrap();
        let mut section = String::new();
        let mut out = String::new();
        for l in text.lines() {
            let l = l.strip_prefix("# ").unwrap_or(l);
            if l.starts_with('[') {
                section = l.to_string();
                if section.starts_with("[otlp") {
                    out.push_str(
                        l.replacen("[otlp]", "", 1)
                            .replacen("[otlp.", "[", 1)
                            .as_str(),
                    );
                    out.push('\n');
                }
            } else if section.starts_with("[otlp") && l.contains(" = ") && !l.starts_with('#') {
                out.push_str(l);
                out.push('\n');
            }
        }
        assert!(
            out.contains("endpoint"),
            "no [otlp] section in {}",
            p.display()
        );
        let c: OtlpConfig = toml::from_str(&out).unwrap_or_else(|e| panic!("{e}\n{out}"));
        let d = OtlpConfig::default();
        assert_eq!(
            OtlpConfig {
                config_db: None,
                ..c.clone()
            },
            d,
            "the documented [otlp] values are the defaults:\n{out}"
        );
        assert_eq!(c.config_db, Some(ConfigDbConfig::default()));
        let documented = out.lines().filter(|l| l.contains(" = ")).count();
        let fields = |v: serde_json::Value| v.as_object().unwrap().len();
        // Every key with a value; `headers`, `tls` (all optional paths), `switch_name` and the
        // `config_db` table are explained in `##` lines instead, and [otlp.config_db]'s keys
        // are documented in their own section.
        assert_eq!(
            documented,
            fields(serde_json::to_value(&d).unwrap()) - 4
                + fields(serde_json::to_value(ConfigDbConfig::default()).unwrap()),
            "every [otlp] key is documented:\n{out}"
        );
    }
}
