//! A minimal Spark Connect client: SQL in, Arrow record batches and the engine's metrics out.
//!
//! Wire: gRPC (`tonic` over plain HTTP/2) to `spark.connect.SparkConnectService`; each
//! `ExecutePlan` sends a plan whose root relation is the SQL text and reads the response stream:
//! `arrow_batch` messages carry Arrow IPC streams (decoded with `arrow-ipc`, the workspace's one
//! arrow version), `metrics` the executed plan's SQL metrics. `AnalyzePlan` gives the plan
//! (`explain`) and the files a relation reads (`input_files`) without running it.
//!
//! Every request carries the same `session_id` (a random UUID), so temporary views registered by
//! one call are visible to the next: that is the session the lake view lives in.

use std::{io::Cursor, time::Duration};

use arrow_array::RecordBatch;
use tonic::{client::Grpc, codegen::http::uri::PathAndQuery, transport::Channel};
use tonic_prost::ProstCodec;

use super::proto::{self, Analyze, AnalyzeResult, Plan};
use crate::error::{Error, Result};

/// Largest response message accepted (Spark sends Arrow batches of up to ~4 MiB by default).
const MAX_MESSAGE_BYTES: usize = 256 << 20;

/// A parsed `sc://host:port[/;key=value…]` remote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Remote {
    pub host: String,
    pub port: u16,
    /// `user_id` parameter (default `stel`).
    pub user_id: String,
}

impl Remote {
    /// Parses a Spark Connect URL: `sc://host[:port][/;param=value;…]` (port 15002 by default,
    /// as Spark's). Supported parameter: `user_id`; `use_ssl=true` and `token` are refused
    /// (plain-text gRPC only: run it on a trusted network or behind a local tunnel).
    ///
    /// # Errors
    /// Anything else, with the expected form.
    pub fn parse(s: &str) -> Result<Self> {
        let bad = |why: &str| {
            Error::Usage(format!(
                "--remote {s}: {why}; expected sc://host:port (e.g. sc://127.0.0.1:15002)"
            ))
        };
        let rest = s
            .trim()
            .strip_prefix("sc://")
            .ok_or_else(|| bad("not an sc:// URL"))?;
        let (hostport, params) = match rest.split_once('/') {
            Some((h, p)) => (h, p.trim_start_matches(';')),
            None => (rest, ""),
        };
        let (host, port) = match hostport.rsplit_once(':') {
            Some((h, p)) if !h.ends_with(']') || h.starts_with('[') => (
                h,
                p.parse::<u16>()
                    .map_err(|_| bad(&format!("bad port `{p}`")))?,
            ),
            _ => (hostport, 15002),
        };
        if host.is_empty() {
            return Err(bad("no host"));
        }
        let mut user_id = "stel".to_string();
        for kv in params.split(';').filter(|p| !p.is_empty()) {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            match k {
                "user_id" => user_id = v.to_string(),
                "use_ssl" if v.eq_ignore_ascii_case("false") => {}
                "use_ssl" | "token" => {
                    return Err(bad(&format!(
                        "`{k}` is not supported (plain-text gRPC only)"
                    )))
                }
                // Other parameters (user_agent, session_id, …) do not change what is asked.
                _ => {}
            }
        }
        Ok(Self {
            host: host.to_string(),
            port,
            user_id,
        })
    }
}

/// What one `ExecutePlan` returned.
#[derive(Debug, Default)]
pub struct Answer {
    pub batches: Vec<RecordBatch>,
    /// Per executed plan node: (node name, metric name, value), as the engine reported them
    /// (Apache Spark sends them; Sail sends none).
    pub metrics: Vec<(String, String, i64)>,
}

impl Answer {
    pub fn rows(&self) -> usize {
        self.batches.iter().map(RecordBatch::num_rows).sum()
    }
}

/// A Spark Connect session.
#[derive(Debug, Clone)]
pub struct SparkClient {
    grpc: Grpc<Channel>,
    session_id: String,
    user: proto::UserContext,
    pub remote: Remote,
}

fn client_type() -> Option<String> {
    Some(format!("stel-query/{}", env!("CARGO_PKG_VERSION")))
}

/// A random (version 4) UUID: Spark requires the session id to be one.
fn uuid_v4() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut b = [0u8; 16];
    for (i, chunk) in b.chunks_mut(8).enumerate() {
        // RandomState is seeded from the OS per process (and differs per instance).
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_usize(i);
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0),
        );
        chunk.copy_from_slice(&h.finish().to_le_bytes());
    }
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

fn status_error(what: &str, remote: &Remote, s: tonic::Status) -> Error {
    // Spark puts the error class and message in the status message; the first lines are enough.
    let msg: String = s.message().lines().take(6).collect::<Vec<_>>().join("\n");
    if s.code() == tonic::Code::Unavailable {
        return Error::Engine(format!(
            "spark connect {}:{} is not answering ({msg}); is the server running (e.g. `sail spark server --port {}`)?",
            remote.host, remote.port, remote.port
        ));
    }
    if closed_mid_query(&msg) {
        return Error::Engine(format!(
            "{what}: {msg}: the Spark Connect server at sc://{}:{} closed the connection mid-query (did it stop or run out of memory? a long window over the raw stream is the heaviest question: shorten it, or for top --by bursts ask whole minutes with --from/--to to read the 1m tier)",
            remote.host, remote.port
        ));
    }
    Error::Engine(format!("{what}: {msg}"))
}

/// Whether a status message is the transport failing under a running answer (the server went
/// away, e.g. OOM-killed) rather than the engine refusing the question: tonic reports h2/hyper
/// failures as a status whose message is theirs.
fn closed_mid_query(msg: &str) -> bool {
    const SHAPES: [&str; 5] = [
        "h2 protocol error",
        "error reading a body from connection",
        "connection reset",
        "broken pipe",
        "connection closed",
    ];
    let m = msg.to_ascii_lowercase();
    SHAPES.iter().any(|s| m.contains(s))
}

impl SparkClient {
    /// Connects to `remote` (within 10 s) and starts a session.
    ///
    /// # Errors
    /// The server cannot be reached.
    pub async fn connect(remote: Remote) -> Result<Self> {
        let uri = format!("http://{}:{}", remote.host, remote.port);
        let channel = Channel::from_shared(uri.clone())
            .map_err(|e| Error::Usage(format!("--remote: {uri}: {e}")))?
            .connect_timeout(Duration::from_secs(10))
            .connect()
            .await
            .map_err(|e| {
                Error::Engine(format!(
                    "cannot reach the Spark Connect server at sc://{}:{} ({e}); start one (e.g. `sail spark server --port {}`) or fix --remote",
                    remote.host, remote.port, remote.port
                ))
            })?;
        let grpc = Grpc::new(channel)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        Ok(Self {
            grpc,
            session_id: uuid_v4(),
            user: proto::UserContext {
                user_id: remote.user_id.clone(),
                user_name: remote.user_id.clone(),
            },
            remote,
        })
    }

    /// Runs `query` and collects every result batch and the metrics.
    ///
    /// # Errors
    /// The engine's error (SQL, missing files, …), a lost connection, a batch that is not Arrow.
    pub async fn sql(&self, query: &str) -> Result<Answer> {
        let req = proto::ExecutePlanRequest {
            session_id: self.session_id.clone(),
            user_context: Some(self.user.clone()),
            plan: Some(Plan::sql(query)),
            client_type: client_type(),
            operation_id: None,
        };
        let mut grpc = self.grpc.clone();
        grpc.ready()
            .await
            .map_err(|e| Error::Engine(format!("spark connect: {e}")))?;
        let codec = ProstCodec::<proto::ExecutePlanRequest, proto::ExecutePlanResponse>::default();
        let mut stream = grpc
            .server_streaming(
                tonic::Request::new(req),
                PathAndQuery::from_static(proto::EXECUTE_PLAN),
                codec,
            )
            .await
            .map_err(|s| status_error("spark", &self.remote, s))?
            .into_inner();
        let mut out = Answer::default();
        while let Some(m) = stream
            .message()
            .await
            .map_err(|s| status_error("spark", &self.remote, s))?
        {
            if let Some(b) = m.arrow_batch {
                let reader = datafusion::arrow::ipc::reader::StreamReader::try_new(
                    Cursor::new(b.data),
                    None,
                )?;
                for batch in reader {
                    out.batches.push(batch?);
                }
            }
            if let Some(ms) = m.metrics {
                for node in ms.metrics {
                    for (k, v) in node.execution_metrics {
                        out.metrics.push((node.name.clone(), k, v.value));
                    }
                }
            }
        }
        Ok(out)
    }

    async fn analyze(&self, analyze: Analyze) -> Result<AnalyzeResult> {
        let req = proto::AnalyzePlanRequest {
            session_id: self.session_id.clone(),
            user_context: Some(self.user.clone()),
            client_type: client_type(),
            analyze: Some(analyze),
        };
        let mut grpc = self.grpc.clone();
        grpc.ready()
            .await
            .map_err(|e| Error::Engine(format!("spark connect: {e}")))?;
        let codec = ProstCodec::<proto::AnalyzePlanRequest, proto::AnalyzePlanResponse>::default();
        let r = grpc
            .unary(
                tonic::Request::new(req),
                PathAndQuery::from_static(proto::ANALYZE_PLAN),
                codec,
            )
            .await
            .map_err(|s| status_error("spark (analyze)", &self.remote, s))?
            .into_inner();
        r.result
            .ok_or_else(|| Error::Engine("spark: empty AnalyzePlan response".into()))
    }

    /// The engine's physical plan of `query` (not run).
    ///
    /// # Errors
    /// Planning errors.
    pub async fn explain(&self, query: &str) -> Result<String> {
        match self
            .analyze(Analyze::Explain(proto::Explain {
                plan: Some(Plan::sql(query)),
                explain_mode: 1,
            }))
            .await?
        {
            AnalyzeResult::Explain(e) => Ok(e.explain_string),
            other => Err(Error::Engine(format!("spark: unexpected answer {other:?}"))),
        }
    }

    /// The files the relation of `query` reads (Spark's `Dataset.inputFiles`: the files of its
    /// scans before any filter).
    ///
    /// # Errors
    /// Planning errors.
    pub async fn input_files(&self, query: &str) -> Result<Vec<String>> {
        match self
            .analyze(Analyze::InputFiles(proto::InputFiles {
                plan: Some(Plan::sql(query)),
            }))
            .await?
        {
            AnalyzeResult::InputFiles(f) => Ok(f.files),
            other => Err(Error::Engine(format!("spark: unexpected answer {other:?}"))),
        }
    }

    /// The server's Spark version string (Sail reports the Spark version it implements).
    ///
    /// # Errors
    /// Connection errors.
    pub async fn version(&self) -> Result<String> {
        match self
            .analyze(Analyze::SparkVersion(proto::SparkVersionRequest {}))
            .await?
        {
            AnalyzeResult::SparkVersion(v) => Ok(v.version),
            other => Err(Error::Engine(format!("spark: unexpected answer {other:?}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remotes_parse() {
        let r = Remote::parse("sc://127.0.0.1:15002").unwrap();
        assert_eq!(
            (r.host.as_str(), r.port, r.user_id.as_str()),
            ("127.0.0.1", 15002, "stel")
        );
        let r = Remote::parse("sc://spark.lab/;user_id=ops;use_ssl=false").unwrap();
        assert_eq!(
            (r.host.as_str(), r.port, r.user_id.as_str()),
            ("spark.lab", 15002, "ops")
        );
        for (bad, why) in [
            ("http://x:1", "not an sc:// URL"),
            ("sc://x:port", "bad port"),
            ("sc://:1", "no host"),
            ("sc://x:1/;use_ssl=true", "not supported"),
        ] {
            let e = Remote::parse(bad).unwrap_err().to_string();
            assert!(
                e.contains(why) && e.contains("sc://host:port"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn a_connection_lost_mid_query_says_what_to_suspect() {
        let r = Remote::parse("sc://10.0.0.5:15002").unwrap();
        let e = status_error(
            "spark",
            &r,
            tonic::Status::internal("h2 protocol error: error reading a body from connection"),
        );
        assert_eq!(
            e.to_string(),
            "spark: h2 protocol error: error reading a body from connection: the Spark Connect server at sc://10.0.0.5:15002 closed the connection mid-query (did it stop or run out of memory? a long window over the raw stream is the heaviest question: shorten it, or for top --by bursts ask whole minutes with --from/--to to read the 1m tier)"
        );
        // The engine refusing a question keeps its own words.
        let e = status_error(
            "spark",
            &r,
            tonic::Status::internal("[TABLE_OR_VIEW_NOT_FOUND] nope"),
        );
        assert_eq!(e.to_string(), "spark: [TABLE_OR_VIEW_NOT_FOUND] nope");
    }

    #[test]
    fn session_ids_are_v4_uuids() {
        let a = uuid_v4();
        assert_eq!(a.len(), 36);
        assert_eq!(&a[14..15], "4");
        assert!(matches!(&a[19..20], "8" | "9" | "a" | "b"), "{a}");
        assert_ne!(a, uuid_v4());
    }
}
