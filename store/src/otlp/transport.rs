//! The two OTLP transports: gRPC (tonic, a codec that passes the encoded request through) and
//! HTTP/protobuf (reqwest). One [`Client`] per collector endpoint; both are cheap to clone and
//! multiplex concurrent requests (HTTP/2 streams, or a small HTTP/1.1 connection pool).

use std::{path::Path, sync::Arc, time::Duration};

use bytes::Bytes;
use http::{header::HeaderValue, HeaderMap, Uri};
use http_body_util::BodyExt;
use tonic::{
    client::GrpcService,
    transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity},
    Code,
};

use super::config::{OtlpConfig, Protocol};

const EXPORT_PATH: &str = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export";

/// Why an export attempt failed (a bounded label value).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failure {
    /// No connection (refused, reset, DNS), or the collector said UNAVAILABLE / HTTP 502-504.
    Unavailable,
    /// The attempt took longer than `timeout_ms`.
    Timeout,
    /// The collector is overloaded (RESOURCE_EXHAUSTED, HTTP 429).
    Throttled,
    /// The collector refused the request for good (INVALID_ARGUMENT, HTTP 400, …).
    Rejected,
    /// A reply that is not an OTLP response.
    BadResponse,
}

impl Failure {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Failure::Unavailable => "unavailable",
            Failure::Timeout => "timeout",
            Failure::Throttled => "throttled",
            Failure::Rejected => "rejected",
            Failure::BadResponse => "bad_response",
        }
    }

    pub(crate) const ALL: [Failure; 5] = [
        Failure::Unavailable,
        Failure::Timeout,
        Failure::Throttled,
        Failure::Rejected,
        Failure::BadResponse,
    ];

    /// Whether sending the same request again may succeed (OTLP spec, "Failures").
    pub(crate) fn retryable(self) -> bool {
        !matches!(self, Failure::Rejected | Failure::BadResponse)
    }
}

/// A failed attempt: the kind and the collector's or transport's words.
#[derive(Debug, Clone)]
pub(crate) struct AttemptError {
    pub(crate) failure: Failure,
    pub(crate) detail: String,
}

fn failure_of_code(c: Code) -> Failure {
    match c {
        // The OTLP spec's retryable codes.
        Code::Unavailable | Code::Cancelled | Code::Aborted | Code::OutOfRange | Code::DataLoss => {
            Failure::Unavailable
        }
        Code::DeadlineExceeded => Failure::Timeout,
        Code::ResourceExhausted => Failure::Throttled,
        _ => Failure::Rejected,
    }
}

/// Normalises an endpoint: a bare `host:port` gets `http://`; HTTP/protobuf gets `/v1/metrics`
/// when the URL has no path.
///
/// # Errors
/// A text naming the endpoint and what is wrong with it.
pub(crate) fn parse_endpoint(url: &str, protocol: Protocol) -> Result<String, String> {
    let url = url.trim();
    let full = if url.contains("://") {
        url.to_string()
    } else {
        format!("http://{url}")
    };
    let uri: Uri = full.parse().map_err(|e| {
        format!(
            "endpoint `{}`: {e} (expected http://host:port or https://host:port)",
            crate::redact::redact(url)
        )
    })?;
    match uri.scheme_str() {
        Some("http" | "https") => {}
        _ => {
            return Err(format!(
                "endpoint `{}`: scheme must be http or https",
                crate::redact::redact(url)
            ))
        }
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(format!(
            "endpoint `{}`: no host",
            crate::redact::redact(url)
        ));
    }
    Ok(match protocol {
        Protocol::Grpc => full,
        Protocol::HttpProtobuf => {
            if matches!(uri.path(), "" | "/") {
                format!("{}/v1/metrics", full.trim_end_matches('/'))
            } else {
                full
            }
        }
    })
}

fn read_pem(what: &str, p: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(p).map_err(|e| format!("tls {what} {}: {e}", p.display()))
}

/// gRPC's length prefix of one uncompressed message (the request buffer reserves room for it,
/// so the framed request goes to HTTP/2 without a copy).
pub(crate) const GRPC_PREFIX: usize = 5;

/// The first gRPC message of a response body (its 5-byte prefix removed).
fn grpc_message(body: &[u8]) -> Option<&[u8]> {
    if body.is_empty() {
        return Some(body);
    }
    let (head, rest) = body.split_first_chunk::<GRPC_PREFIX>()?;
    let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
    (head[0] == 0).then_some(())?;
    rest.get(..len)
}

/// One collector endpoint.
#[derive(Debug, Clone)]
pub(crate) enum Client {
    /// The channel is used as a plain HTTP/2 service: the request body is the already framed
    /// message (tonic's codecs would copy it once more), the status comes from the trailers.
    Grpc {
        channel: Channel,
        headers: Arc<HeaderMap>,
        timeout: Duration,
    },
    Http {
        client: reqwest::Client,
        url: reqwest::Url,
    },
}

impl Client {
    /// A client for `endpoint` (normalised by [`parse_endpoint`]); `ca_file` overrides
    /// `cfg.tls.ca_file` (a profile's `otel_certs`). Connects lazily: an unreachable collector
    /// is not an error here. Must run inside the sink's tokio runtime.
    ///
    /// # Errors
    /// A bad endpoint, header, or unreadable TLS file.
    pub(crate) fn new(
        endpoint: &str,
        cfg: &OtlpConfig,
        ca_file: Option<&Path>,
    ) -> Result<Self, String> {
        let url = parse_endpoint(endpoint, cfg.protocol)?;
        let tls = url.starts_with("https://");
        let ca = match ca_file.or(cfg.tls.ca_file.as_deref()) {
            Some(p) if tls => Some(read_pem("ca_file", p)?),
            _ => None,
        };
        let identity = match (&cfg.tls.cert_file, &cfg.tls.key_file) {
            (Some(c), Some(k)) if tls => {
                Some((read_pem("cert_file", c)?, read_pem("key_file", k)?))
            }
            _ => None,
        };
        let timeout = Duration::from_millis(cfg.timeout_ms);
        match cfg.protocol {
            Protocol::Grpc => {
                let mut ep = Endpoint::from_shared(url.clone())
                    .map_err(|e| format!("endpoint `{}`: {e}", crate::redact::redact(&url)))?
                    .connect_timeout(timeout)
                    .timeout(timeout)
                    .tcp_nodelay(true)
                    .http2_keep_alive_interval(Duration::from_secs(30))
                    .keep_alive_timeout(Duration::from_secs(10));
                if tls {
                    let mut t = ClientTlsConfig::new().with_native_roots();
                    if let Some(ca) = ca {
                        t = t.ca_certificate(Certificate::from_pem(ca));
                    }
                    if let Some((c, k)) = identity {
                        t = t.identity(Identity::from_pem(c, k));
                    }
                    if let Some(n) = &cfg.tls.server_name {
                        t = t.domain_name(n.clone());
                    }
                    ep = ep.tls_config(t).map_err(|e| {
                        format!("endpoint `{}`: tls: {e}", crate::redact::redact(&url))
                    })?;
                }
                let mut headers = HeaderMap::new();
                headers.insert(
                    http::header::CONTENT_TYPE,
                    HeaderValue::from_static("application/grpc"),
                );
                headers.insert(http::header::TE, HeaderValue::from_static("trailers"));
                headers.insert(
                    "grpc-timeout",
                    HeaderValue::from_str(&format!("{}m", cfg.timeout_ms.min(99_999_999)))
                        .map_err(|e| format!("timeout_ms: {e}"))?,
                );
                for (k, v) in &cfg.headers {
                    let key =
                        http::header::HeaderName::from_bytes(k.to_ascii_lowercase().as_bytes())
                            .map_err(|e| format!("headers: `{k}`: {e}"))?;
                    let val = HeaderValue::from_str(v)
                        .map_err(|e| format!("headers: value of `{k}`: {e}"))?;
                    headers.insert(key, val);
                }
                Ok(Client::Grpc {
                    channel: ep.connect_lazy(),
                    headers: Arc::new(headers),
                    timeout,
                })
            }
            Protocol::HttpProtobuf => {
                let mut url: reqwest::Url = url
                    .parse()
                    .map_err(|e| format!("endpoint `{}`: {e}", crate::redact::redact(&url)))?;
                let mut headers = reqwest::header::HeaderMap::new();
                for (k, v) in &cfg.headers {
                    let key = reqwest::header::HeaderName::from_bytes(k.as_bytes())
                        .map_err(|e| format!("headers: `{k}`: {e}"))?;
                    let val = reqwest::header::HeaderValue::from_str(v)
                        .map_err(|e| format!("headers: value of `{k}`: {e}"))?;
                    headers.insert(key, val);
                }
                headers.insert(
                    reqwest::header::CONTENT_TYPE,
                    reqwest::header::HeaderValue::from_static("application/x-protobuf"),
                );
                let mut b = reqwest::Client::builder()
                    .default_headers(headers)
                    .timeout(timeout)
                    .connect_timeout(timeout)
                    .tcp_nodelay(true)
                    .pool_max_idle_per_host(cfg.max_in_flight)
                    .user_agent(concat!("stel/", env!("CARGO_PKG_VERSION")));
                if tls {
                    b = b.use_rustls_tls().tls_built_in_native_certs(true);
                    if let Some(ca) = ca {
                        let c = reqwest::Certificate::from_pem(&ca)
                            .map_err(|e| format!("tls ca_file: {e}"))?;
                        b = b.add_root_certificate(c);
                    }
                    if let Some((c, k)) = identity {
                        let mut pem = k;
                        pem.extend_from_slice(&c);
                        let id = reqwest::Identity::from_pem(&pem)
                            .map_err(|e| format!("tls cert_file/key_file: {e}"))?;
                        b = b.identity(id);
                    }
                    if let Some(name) = &cfg.tls.server_name {
                        // Verify against `server_name`: connect to the endpoint's address under
                        // that name.
                        let host = url.host_str().unwrap_or_default().to_string();
                        let port = url.port_or_known_default().unwrap_or(443);
                        let addrs: Vec<std::net::SocketAddr> =
                            std::net::ToSocketAddrs::to_socket_addrs(&(host.as_str(), port))
                                .map_err(|e| {
                                    format!(
                                        "endpoint `{}`: resolve {host}: {e}",
                                        crate::redact::redact(url.as_str())
                                    )
                                })?
                                .collect();
                        b = b.resolve_to_addrs(name, &addrs);
                        url.set_host(Some(name))
                            .map_err(|e| format!("tls server_name `{name}`: {e}"))?;
                    }
                }
                let client = b.build().map_err(|e| {
                    format!("endpoint `{}`: {e}", crate::redact::redact(url.as_str()))
                })?;
                Ok(Client::Http { client, url })
            }
        }
    }

    /// One export attempt; the response body on success.
    pub(crate) async fn export(&self, body: Bytes) -> Result<Bytes, AttemptError> {
        match self {
            Client::Grpc {
                channel,
                headers,
                timeout,
            } => {
                let err = |failure, detail: String| AttemptError { failure, detail };
                let mut ch = channel.clone();
                std::future::poll_fn(|cx| GrpcService::poll_ready(&mut ch, cx))
                    .await
                    .map_err(|e| err(Failure::Unavailable, error_chain(&e)))?;
                let mut req = http::Request::post(Uri::from_static(EXPORT_PATH))
                    .body(tonic::body::Body::new(http_body_util::Full::new(body)))
                    .map_err(|e| err(Failure::Rejected, e.to_string()))?;
                *req.headers_mut() = (**headers).clone();
                let call = async {
                    let resp = GrpcService::call(&mut ch, req)
                        .await
                        .map_err(|e| err(Failure::Unavailable, error_chain(&e)))?;
                    let (parts, body) = resp.into_parts();
                    let collected = body
                        .collect()
                        .await
                        .map_err(|e| err(Failure::Unavailable, e.to_string()))?;
                    let trailers = collected.trailers().cloned().unwrap_or_default();
                    let bytes = collected.to_bytes();
                    Ok::<_, AttemptError>((parts, trailers, bytes))
                };
                let (parts, trailers, bytes) =
                    tokio::time::timeout(*timeout, call).await.map_err(|_| {
                        err(Failure::Timeout, format!("no answer within {timeout:?}"))
                    })??;
                if parts.status != http::StatusCode::OK {
                    let f = match parts.status.as_u16() {
                        429 => Failure::Throttled,
                        502..=504 => Failure::Unavailable,
                        _ => Failure::Rejected,
                    };
                    return Err(err(f, format!("HTTP {}", parts.status)));
                }
                // A trailers-only response carries the status in the headers.
                let field = |k: &str| {
                    trailers
                        .get(k)
                        .or_else(|| parts.headers.get(k))
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_string)
                };
                let code = field("grpc-status")
                    .and_then(|c| c.parse::<i32>().ok())
                    .map(Code::from_i32)
                    .ok_or_else(|| err(Failure::BadResponse, "no grpc-status".into()))?;
                if code != Code::Ok {
                    let msg = field("grpc-message").unwrap_or_default();
                    return Err(err(failure_of_code(code), format!("{code:?}: {msg}")));
                }
                grpc_message(&bytes)
                    .map(|m| bytes.slice_ref(m))
                    .ok_or_else(|| err(Failure::BadResponse, "not a gRPC message".into()))
            }
            Client::Http { client, url } => {
                let err = |failure, detail: String| AttemptError { failure, detail };
                let resp = client
                    .post(url.clone())
                    .body(body)
                    .send()
                    .await
                    .map_err(|e| {
                        let f = if e.is_timeout() {
                            Failure::Timeout
                        } else {
                            Failure::Unavailable
                        };
                        err(f, error_chain(&e))
                    })?;
                let status = resp.status();
                let bytes = resp.bytes().await.map_err(|e| {
                    let f = if e.is_timeout() {
                        Failure::Timeout
                    } else {
                        Failure::Unavailable
                    };
                    err(f, error_chain(&e))
                })?;
                if status.is_success() {
                    return Ok(bytes);
                }
                let f = match status.as_u16() {
                    429 => Failure::Throttled,
                    502..=504 => Failure::Unavailable,
                    _ => Failure::Rejected,
                };
                let text = String::from_utf8_lossy(&bytes[..bytes.len().min(200)]).into_owned();
                Err(err(f, format!("HTTP {status}: {text}")))
            }
        }
    }
}

/// An error and its sources, one line (reqwest's Display hides the cause).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_normalised_and_bad_ones_named() {
        let g = Protocol::Grpc;
        let h = Protocol::HttpProtobuf;
        assert_eq!(
            parse_endpoint("localhost:4317", g).unwrap(),
            "http://localhost:4317"
        );
        assert_eq!(
            parse_endpoint("https://c:4317", g).unwrap(),
            "https://c:4317"
        );
        assert_eq!(
            parse_endpoint("http://c:4318", h).unwrap(),
            "http://c:4318/v1/metrics"
        );
        assert_eq!(
            parse_endpoint("http://c:4318/", h).unwrap(),
            "http://c:4318/v1/metrics"
        );
        assert_eq!(
            parse_endpoint("http://c:4318/otlp/v1/metrics", h).unwrap(),
            "http://c:4318/otlp/v1/metrics"
        );
        let e = parse_endpoint("ftp://c:1", g).unwrap_err();
        assert!(e.contains("ftp://c:1") && e.contains("scheme"), "{e}");
        assert!(parse_endpoint("http://", g).is_err());
    }

    #[test]
    fn status_codes_follow_the_otlp_retry_rules() {
        assert!(failure_of_code(Code::Unavailable).retryable());
        assert!(failure_of_code(Code::DeadlineExceeded).retryable());
        assert!(failure_of_code(Code::ResourceExhausted).retryable());
        assert!(!failure_of_code(Code::InvalidArgument).retryable());
        assert!(!failure_of_code(Code::Unauthenticated).retryable());
        assert!(!failure_of_code(Code::Unimplemented).retryable());
    }
}
