//! A real OTLP receiver for tests: `deploy/otlp_receiver.py`, which decodes every request with
//! the OpenTelemetry protobuf definitions (PyPI `opentelemetry-proto`, `grpcio`; installed by
//! `deploy/setup.sh --test`) and dumps each data point as a JSON line. If it cannot start it
//! **panics** with how to install it: a test never passes without a receiver.

use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::atomic::{AtomicU64, Ordering},
    time::{Duration, Instant},
};

use serde::Deserialize;

/// What the receiver is told to do.
#[derive(Debug, Clone, Default)]
pub struct ReceiverOptions {
    /// Serve gRPC.
    pub grpc: bool,
    /// Serve HTTP/protobuf.
    pub http: bool,
    /// Serve TLS with this (certificate chain, key) PEM pair.
    pub tls: Option<(PathBuf, PathBuf)>,
    /// Refuse every request for good (INVALID_ARGUMENT / HTTP 400).
    pub reject: bool,
    /// Report this many rejected points per request (OTLP partial success).
    pub partial: u64,
}

/// One data point as the receiver decoded it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Point {
    pub metric: String,
    /// `sum`, `gauge` or `histogram`.
    pub kind: String,
    pub monotonic: bool,
    /// 2 = cumulative.
    pub temporality: i64,
    pub unit: String,
    pub description: String,
    pub attrs: BTreeMap<String, String>,
    pub start: u64,
    pub time: u64,
    /// `as_int` (a histogram's count).
    pub value: i64,
    pub resource: BTreeMap<String, String>,
    pub scope: String,
}

/// A receiver process owned by a test (killed on drop).
#[derive(Debug)]
pub struct Receiver {
    opts: ReceiverOptions,
    child: Option<Child>,
    dir: PathBuf,
    grpc: Option<u16>,
    http: Option<u16>,
}

/// The receiver script in the source tree.
pub fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/otlp_receiver.py")
}

impl Receiver {
    /// Starts a receiver on free ports.
    ///
    /// # Panics
    /// When python3, grpcio or opentelemetry-proto is missing, or it does not come up in 60 s.
    pub fn start(opts: ReceiverOptions) -> Receiver {
        static N: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "stel-otlp-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        let mut r = Receiver {
            grpc: opts.grpc.then_some(0),
            http: opts.http.then_some(0),
            opts,
            child: None,
            dir,
        };
        r.spawn();
        r
    }

    fn spawn(&mut self) {
        let mut c = Command::new("python3");
        c.arg(script()).arg("--dump").arg(self.dump());
        if let Some(p) = self.grpc {
            c.args(["--grpc", &p.to_string()]);
        }
        if let Some(p) = self.http {
            c.args(["--http", &p.to_string()]);
        }
        if let Some((cert, key)) = &self.opts.tls {
            c.arg("--tls-cert").arg(cert).arg("--tls-key").arg(key);
        }
        if self.opts.reject {
            c.arg("--reject");
        }
        if self.opts.partial > 0 {
            c.args(["--partial", &self.opts.partial.to_string()]);
        }
        let mut child = c
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run python3 {}: {e}", script().display()));
        let out = child.stdout.take().expect("piped stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(out).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx.recv_timeout(Duration::from_secs(60)).unwrap_or_default();
        let ready: serde_json::Value = serde_json::from_str(&line).unwrap_or_else(|_| {
            let _ = child.kill();
            let st = child.wait().map(|s| s.to_string()).unwrap_or_default();
            panic!(
                "the OTLP receiver {} did not start ({st}; stdout {line:?}). It needs python3 with \
                 grpcio and opentelemetry-proto: deploy/setup.sh --test \
                 (pip install grpcio opentelemetry-proto).",
                script().display()
            )
        });
        let port = |k: &str| ready[k].as_u64().map(|p| p as u16);
        self.grpc = self.grpc.and(port("grpc"));
        self.http = self.http.and(port("http"));
        self.child = Some(child);
    }

    fn dump(&self) -> PathBuf {
        self.dir.join("points.jsonl")
    }

    fn scheme(&self) -> &'static str {
        if self.opts.tls.is_some() {
            "https"
        } else {
            "http"
        }
    }

    /// `http://127.0.0.1:<port>` of the gRPC listener (`https` with TLS).
    pub fn grpc_endpoint(&self) -> String {
        format!(
            "{}://127.0.0.1:{}",
            self.scheme(),
            self.grpc.expect("started with grpc")
        )
    }

    /// `http://127.0.0.1:<port>` of the HTTP listener (`https` with TLS).
    pub fn http_endpoint(&self) -> String {
        format!(
            "{}://127.0.0.1:{}",
            self.scheme(),
            self.http.expect("started with http")
        )
    }

    /// Every point received so far.
    pub fn points(&self) -> Vec<Point> {
        let text = std::fs::read_to_string(self.dump()).unwrap_or_default();
        text.lines()
            .filter(|l| !l.is_empty())
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad dump line {l}: {e}")))
            .collect()
    }

    /// Waits until at least `n` points are in (polling the dump file), up to `timeout`.
    ///
    /// # Panics
    /// When they do not arrive in time.
    pub fn wait_points(&self, n: usize, timeout: Duration) -> Vec<Point> {
        let deadline = Instant::now() + timeout;
        loop {
            let p = self.points();
            if p.len() >= n {
                return p;
            }
            assert!(
                Instant::now() < deadline,
                "the receiver has {} points, expected {n} within {timeout:?}",
                p.len()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kills the receiver (SIGKILL: connections drop, nothing is acknowledged any more).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on the same ports, keeping what it has received.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A private CA and a server certificate it signed, for `127.0.0.1` / `localhost`, made with
/// the `openssl` command in `dir`. (A self-signed server certificate will not do: rustls refuses
/// a CA certificate used as an end entity.)
#[derive(Debug, Clone)]
pub struct TestPki {
    /// The CA certificate (pass as `tls.ca_file`).
    pub ca: PathBuf,
    /// The server's certificate and key (the receiver's `tls`).
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// Makes a [`TestPki`] in `dir`.
///
/// # Panics
/// When `openssl` is missing or fails.
pub fn test_pki(dir: &Path) -> TestPki {
    let run = |args: &[&str]| {
        let st = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap_or_else(|e| panic!("cannot run openssl (apt-get install openssl): {e}"));
        assert!(st.success(), "openssl {args:?} failed: {st}");
    };
    run(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=stel test CA",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
    ]);
    run(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=localhost",
        "-keyout",
        "key.pem",
        "-out",
        "server.csr",
    ]);
    std::fs::write(
        dir.join("ext.cnf"),
        "basicConstraints=CA:FALSE\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n",
    )
    .unwrap_or_else(|e| panic!("write ext.cnf: {e}"));
    run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        "ext.cnf",
        "-out",
        "cert.pem",
    ]);
    TestPki {
        ca: dir.join("ca.pem"),
        cert: dir.join("cert.pem"),
        key: dir.join("key.pem"),
    }
}
