//! The registry ([`crate::metrics`]) in the Prometheus text exposition format, and a small HTTP
//! endpoint serving it: `/metrics` (every series of the registry at scrape time) and `/health`
//! (200 while the caller's check says the data path is live, 503 with its reason otherwise).
//!
//! The format (OpenMetrics text, which Prometheus scrapes natively) is written by `prometheus-client` (the Prometheus project's Rust client library)
//! through a [`Collector`] that reads one registry [`Snapshot`] per scrape: nothing is copied
//! into a second set of metric objects, and nothing runs between scrapes.
//!
//! The server is one thread running a non-blocking event loop over the listener and at most
//! [`MAX_CONNECTIONS`] connections: each request must arrive whole (up to 8 KiB) within
//! [`HEADER_TIMEOUT`], is answered and closed. A slow or idle client holds one slot, never the
//! thread, and when every slot is taken the oldest client still sending its request is closed
//! for the newcomer, so half-sent requests can never make `/health` time out (a liveness probe
//! would restart a healthy daemon). Dropped connections are counted
//! (`stel_daemon_http_dropped_connections_total{reason}`) and logged at most once a minute.
//! A scrape costs one snapshot (one short lock over the series list, no lock on the data path:
//! the hot paths write their own atomic cells).
use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{counter::ConstCounter, gauge::ConstGauge},
    registry::Registry as PromRegistry,
};

use crate::{
    log_limit::LogLimiter,
    metrics::{Counter, Kind, Metric, Registry, Sample, Snapshot},
};

/// Reads the registry on each scrape.
#[derive(Debug)]
struct Snap(Arc<Registry>);

impl Collector for Snap {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        encode_snapshot(&self.0.snapshot(), &mut encoder)
    }
}

fn encode_snapshot(s: &Snapshot, encoder: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
    let mut i = 0;
    while i < s.samples.len() {
        let metric = s.samples[i].metric;
        let end = i + s.samples[i..]
            .iter()
            .take_while(|x| x.metric == metric)
            .count();
        // prometheus-client appends `_total` to counters itself.
        let name = match metric.kind() {
            Kind::Counter => metric.name().trim_end_matches("_total"),
            Kind::Gauge | Kind::Histogram => metric.name(),
        };
        let kind = match metric.kind() {
            Kind::Counter => prometheus_client::metrics::MetricType::Counter,
            Kind::Gauge => prometheus_client::metrics::MetricType::Gauge,
            Kind::Histogram => prometheus_client::metrics::MetricType::Histogram,
        };
        let mut family = encoder.encode_descriptor(name, metric.help(), None, kind)?;
        if metric.labels().is_empty() {
            // One series, no label set (`name 3`, not `name{} 3`).
            encode_value(&s.samples[i], family)?;
        } else {
            for sample in &s.samples[i..end] {
                let labels: Vec<(&str, &str)> = sample.label_pairs().collect();
                encode_value(sample, family.encode_family(&labels)?)?;
            }
        }
        i = end;
    }
    Ok(())
}

fn encode_value(
    s: &Sample,
    mut m: prometheus_client::encoding::MetricEncoder,
) -> Result<(), std::fmt::Error> {
    let v = s.value;
    match s.metric.kind() {
        Kind::Counter => ConstCounter::new(v).encode(m),
        Kind::Gauge => ConstGauge::new(i64::try_from(v).unwrap_or(i64::MAX)).encode(m),
        Kind::Histogram => {
            // prometheus-client takes per-bucket counts and accumulates them itself; the
            // registry's are cumulative, and `+Inf` holds the rest.
            let h = s.histogram.as_deref().cloned().unwrap_or_default();
            let mut prev = 0;
            let mut buckets: Vec<(f64, u64)> = h
                .buckets
                .iter()
                .map(|&(le, cum)| {
                    let n = cum.saturating_sub(prev);
                    prev = prev.max(cum);
                    (le, n)
                })
                .collect();
            buckets.push((f64::INFINITY, h.count.saturating_sub(prev)));
            m.encode_histogram::<prometheus_client::encoding::NoLabelSet>(
                h.sum_seconds,
                h.count,
                &buckets,
                None,
            )
        }
    }
}

/// The registry now, as Prometheus text (what `/metrics` answers).
pub fn render(registry: &Arc<Registry>) -> String {
    let mut r = PromRegistry::default();
    r.register_collector(Box::new(Snap(Arc::clone(registry))));
    let mut out = String::new();
    // Writing into a String cannot fail; the encoder refusing a series can.
    if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &r) {
        tracing::warn!(error = %e, "metrics endpoint: a series could not be encoded");
    }
    out
}

/// What `/health` asks: `Ok` while the data path is live, else why not.
pub type HealthCheck = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

/// Why the endpoint could not start.
#[derive(Debug, thiserror::Error)]
#[error("metrics endpoint on {addr}: {source} (choose another address with --metrics, or drop [metrics] listen)")]
pub struct ServeError {
    pub addr: SocketAddr,
    #[source]
    pub source: std::io::Error,
}

/// Connections held open at once. A new connection beyond it closes the oldest one still
/// sending its request (counted `reason="full"`), so idle or slow clients can never lock the
/// probe out: the newest connection always gets a turn.
pub const MAX_CONNECTIONS: usize = 32;
/// Longest a client may take to send its request line and headers (counted `reason="timeout"`
/// when it does not).
pub const HEADER_TIMEOUT: Duration = Duration::from_millis(1000);
/// Longest a client may take to read its answer.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest request accepted (request line and headers), bytes.
pub const MAX_REQUEST_BYTES: usize = 8192;

/// The running `/metrics` + `/health` endpoint.
#[derive(Debug)]
pub struct MetricsServer {
    /// The bound address (the real port when 0 was asked).
    pub addr: SocketAddr,
    stop: Arc<AtomicBool>,
    /// Requests answered (any path).
    pub requests: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
}

impl MetricsServer {
    /// Binds `addr` and serves from a thread.
    ///
    /// # Errors
    /// The address cannot be bound (in use, not local, privileged port).
    pub fn start(
        addr: SocketAddr,
        registry: Arc<Registry>,
        health: HealthCheck,
    ) -> Result<Self, ServeError> {
        let l = TcpListener::bind(addr).map_err(|source| ServeError { addr, source })?;
        let bound = l
            .local_addr()
            .map_err(|source| ServeError { addr, source })?;
        l.set_nonblocking(true)
            .map_err(|source| ServeError { addr, source })?;
        let stop = Arc::new(AtomicBool::new(false));
        let requests = Arc::new(AtomicU64::new(0));
        let mut server = Serve {
            listener: l,
            conns: Vec::new(),
            scrapes: registry.counter(Metric::DaemonScrapes, crate::labels!()),
            dropped_full: registry.counter(
                Metric::DaemonHttpDroppedConnections,
                crate::labels!(Reason = "full"),
            ),
            dropped_timeout: registry.counter(
                Metric::DaemonHttpDroppedConnections,
                crate::labels!(Reason = "timeout"),
            ),
            log: LogLimiter::new(Duration::from_secs(60)),
            registry,
            health,
            stop: Arc::clone(&stop),
            requests: Arc::clone(&requests),
        };
        let thread = std::thread::Builder::new()
            .name("stel-metrics".into())
            .spawn(move || server.run())
            .map_err(|source| ServeError { addr, source })?;
        Ok(Self {
            addr: bound,
            stop,
            requests,
            thread: Some(thread),
        })
    }

    /// Stops serving.
    pub fn shutdown(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One client connection: reading its request, then writing its answer (non-blocking both).
#[derive(Debug)]
struct Conn {
    stream: TcpStream,
    /// Request bytes so far, then the answer being written.
    buf: Vec<u8>,
    /// Answer bytes written so far (`None` while reading the request).
    written: Option<usize>,
    deadline: Instant,
}

/// The endpoint's thread: one non-blocking event loop over the listener and at most
/// [`MAX_CONNECTIONS`] connections, so a slow or idle client costs a slot, never the thread.
struct Serve {
    listener: TcpListener,
    conns: Vec<Conn>,
    registry: Arc<Registry>,
    health: HealthCheck,
    stop: Arc<AtomicBool>,
    requests: Arc<AtomicU64>,
    scrapes: Counter,
    dropped_full: Counter,
    dropped_timeout: Counter,
    log: LogLimiter,
}

impl Serve {
    fn run(&mut self) {
        while !self.stop.load(Ordering::Relaxed) {
            let mut progress = self.accept();
            let now = Instant::now();
            let mut i = 0;
            while i < self.conns.len() {
                match self.step(i, now) {
                    Step::Busy => progress = true,
                    Step::Idle => {}
                    Step::Done => {
                        self.conns.swap_remove(i);
                        progress = true;
                        continue;
                    }
                    Step::TimedOut => {
                        self.dropped_timeout.add(1);
                        self.warn("a client did not send its request (or read its answer) in time");
                        self.conns.swap_remove(i);
                        continue;
                    }
                }
                i += 1;
            }
            if !progress {
                // Nothing to do: wait a little (accept and reads are non-blocking).
                std::thread::sleep(if self.conns.is_empty() {
                    Duration::from_millis(20)
                } else {
                    Duration::from_millis(2)
                });
            }
        }
    }

    fn warn(&mut self, what: &str) {
        if let Some(suppressed) = self.log.allow() {
            tracing::warn!(
                suppressed,
                max_connections = MAX_CONNECTIONS,
                "Metrics endpoint: {what}; connection closed."
            );
        }
    }

    /// Accepts every pending connection; returns whether there was one.
    fn accept(&mut self) -> bool {
        let mut any = false;
        loop {
            match self.listener.accept() {
                Ok((c, _)) => {
                    any = true;
                    if c.set_nonblocking(true).is_err() {
                        continue;
                    }
                    let _ = c.set_nodelay(true);
                    if self.conns.len() >= MAX_CONNECTIONS {
                        // Make room: close the oldest connection still sending its request.
                        let victim = self
                            .conns
                            .iter()
                            .enumerate()
                            .filter(|(_, c)| c.written.is_none())
                            .min_by_key(|(_, c)| c.deadline)
                            .map(|(i, _)| i);
                        match victim {
                            Some(v) => {
                                self.conns.swap_remove(v);
                            }
                            None => {
                                // Every slot is writing an answer: this one waits its turn
                                // by being refused (it retries).
                                self.dropped_full.add(1);
                                self.warn("too many connections");
                                continue;
                            }
                        }
                        self.dropped_full.add(1);
                        self.warn("too many connections, the oldest idle one");
                    }
                    self.conns.push(Conn {
                        stream: c,
                        buf: Vec::with_capacity(512),
                        written: None,
                        deadline: Instant::now() + HEADER_TIMEOUT,
                    });
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return any,
                Err(e) => {
                    if let Some(suppressed) = self.log.allow() {
                        tracing::warn!(error = %e, suppressed, "Metrics endpoint: accept failed.");
                    }
                    return any;
                }
            }
        }
    }

    fn step(&mut self, i: usize, now: Instant) -> Step {
        let c = &mut self.conns[i];
        if now >= c.deadline {
            return Step::TimedOut;
        }
        match c.written {
            None => {
                let mut chunk = [0u8; 2048];
                match c.stream.read(&mut chunk) {
                    Ok(0) => Step::Done, // closed before a full request
                    Ok(k) => {
                        c.buf.extend_from_slice(&chunk[..k]);
                        let complete = c.buf.windows(4).any(|w| w == b"\r\n\r\n");
                        if complete || c.buf.len() >= MAX_REQUEST_BYTES {
                            let req = std::mem::take(&mut c.buf);
                            c.buf = answer(&req, &self.registry, &self.health, &self.scrapes);
                            c.written = Some(0);
                            c.deadline = now + WRITE_TIMEOUT;
                            self.requests.fetch_add(1, Ordering::Relaxed);
                        }
                        Step::Busy
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Step::Idle,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => Step::Busy,
                    Err(_) => Step::Done,
                }
            }
            Some(w) => match c.stream.write(&c.buf[w..]) {
                Ok(k) => {
                    let w = w + k;
                    if w >= c.buf.len() {
                        let _ = c.stream.shutdown(std::net::Shutdown::Write);
                        return Step::Done;
                    }
                    c.written = Some(w);
                    Step::Busy
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Step::Idle,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => Step::Busy,
                Err(_) => Step::Done,
            },
        }
    }
}

enum Step {
    /// Made progress.
    Busy,
    /// Waiting for the client.
    Idle,
    /// Finished (answered, or the client went away).
    Done,
    /// The client took longer than its deadline.
    TimedOut,
}

/// The whole answer (status line, headers, body) to one request.
fn answer(
    req: &[u8],
    registry: &Arc<Registry>,
    health: &HealthCheck,
    scrapes: &Counter,
) -> Vec<u8> {
    let req = String::from_utf8_lossy(req);
    let mut parts = req.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = path.split('?').next().unwrap_or("");
    let (status, ctype, body) = match (method, path) {
        ("GET" | "HEAD", "/metrics") => {
            // Counted before the snapshot, so a scrape shows itself.
            scrapes.add(1);
            (
                "200 OK",
                // prometheus-client writes OpenMetrics text (Prometheus ≥ 2.5 reads it).
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                render(registry),
            )
        }
        ("GET" | "HEAD", "/health") => match health() {
            Ok(()) => ("200 OK", "text/plain", "ok\n".to_string()),
            Err(why) => ("503 Service Unavailable", "text/plain", format!("{why}\n")),
        },
        ("GET" | "HEAD", _) => (
            "404 Not Found",
            "text/plain",
            "stel-ingestd serves /metrics and /health\n".to_string(),
        ),
        _ => ("405 Method Not Allowed", "text/plain", String::new()),
    };
    let mut out = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    if method != "HEAD" {
        out.extend_from_slice(body.as_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{labels, metrics::Metric};

    #[test]
    fn every_series_is_rendered_with_help_type_and_labels() {
        let r = Registry::new();
        r.counter(Metric::ReaderDatagrams, labels!(Source = "demo"))
            .add(7);
        r.counter(Metric::DecodeMalformed, labels!(Reason = "bad_length"))
            .add(2);
        r.gauge(Metric::SessionRegisteredSessions, labels!()).set(3);
        let t = render(&r);
        assert!(t.contains("# TYPE stel_reader_datagrams counter"), "{t}");
        assert!(
            t.contains("stel_reader_datagrams_total{source=\"demo\"} 7"),
            "{t}"
        );
        assert!(
            t.contains("stel_decode_malformed_total{reason=\"bad_length\"} 2"),
            "{t}"
        );
        assert!(
            t.contains("# TYPE stel_session_registered_sessions gauge"),
            "{t}"
        );
        assert!(t.contains("stel_session_registered_sessions 3"), "{t}");
        assert!(
            t.contains("# HELP stel_reader_datagrams Datagrams received whole"),
            "{t}"
        );
        assert!(t.ends_with("# EOF\n"), "{t}");
    }

    #[test]
    fn a_histogram_has_cumulative_buckets_sum_and_count() {
        let r = Registry::new();
        let h = r.histogram(Metric::CountersDbLag, labels!());
        for us in [50, 150, 2_500, 2_000_000] {
            h.record_us(us);
        }
        let t = render(&r);
        assert!(
            t.contains("# TYPE stel_counters_db_lag_seconds histogram"),
            "{t}"
        );
        assert!(t.contains("stel_counters_db_lag_seconds_count 4"), "{t}");
        assert!(t.contains("stel_counters_db_lag_seconds_sum 2.0027"), "{t}");
        // 50 µs ≤ 0.1 ms; 150 µs ≤ 0.5 ms; 2.5 ms ≤ 5 ms; 2 s only in +Inf.
        for (le, n) in [
            ("0.0001", 1),
            ("0.0005", 2),
            ("0.002", 2),
            ("0.005", 3),
            ("1.0", 3),
            ("10.0", 4),
            ("+Inf", 4),
        ] {
            let line = format!("stel_counters_db_lag_seconds_bucket{{le=\"{le}\"}} {n}");
            assert!(t.contains(&line), "{line} in {t}");
        }
    }
}

#[cfg(test)]
mod more {
    use super::*;
    use crate::{labels, metrics::Metric};

    #[test]
    fn zero_and_many_series() {
        let r = Registry::new();
        r.counter(Metric::ReaderDatagrams, labels!(Source = "demo"))
            .set_total(0);
        r.counter(Metric::DecodeRecords, labels!()).set_total(5);
        r.counter(
            Metric::SinkDroppedSamples,
            labels!(Sink = "parquet", Reason = "queue_full"),
        )
        .set_total(1);
        r.gauge(Metric::DaemonHealthyState, labels!()).set(1);
        let t = render(&r);
        assert!(t.contains("stel_decode_records_total 5"), "{t}");
    }
}

#[cfg(test)]
mod served {
    use super::*;
    use crate::{labels, metrics::Metric};

    fn get(addr: SocketAddr, path: &str) -> String {
        let mut c = TcpStream::connect(addr).unwrap();
        write!(c, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut s = String::new();
        c.read_to_string(&mut s).unwrap();
        s
    }

    #[test]
    fn metrics_and_health_over_http() {
        let r = Registry::new();
        r.counter(Metric::DecodeRecords, labels!()).set_total(5);
        let ok = Arc::new(AtomicBool::new(true));
        let o = Arc::clone(&ok);
        let s = MetricsServer::start(
            "127.0.0.1:0".parse().unwrap(),
            Arc::clone(&r),
            Arc::new(move || {
                if o.load(Ordering::Relaxed) {
                    Ok(())
                } else {
                    Err("decoders stopped".into())
                }
            }),
        )
        .unwrap();
        let m = get(s.addr, "/metrics");
        assert!(m.starts_with("HTTP/1.1 200 OK"), "{m}");
        assert!(m.contains("stel_decode_records_total 5"), "{m}");
        assert!(get(s.addr, "/health").starts_with("HTTP/1.1 200 OK"));
        ok.store(false, Ordering::Relaxed);
        let h = get(s.addr, "/health");
        assert!(
            h.starts_with("HTTP/1.1 503") && h.ends_with("decoders stopped\n"),
            "{h}"
        );
        assert!(get(s.addr, "/nope").starts_with("HTTP/1.1 404"));
        s.shutdown();
    }
}
