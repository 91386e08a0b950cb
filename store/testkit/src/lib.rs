//! Test harnesses for stel's tests and benchmarks, kept out of the libraries (a
//! dev-dependency of `stel-store`, `stel-ingest` and `stel-query`; `stel-bench` uses it too).
//! Each starts a real service and **panics** with how to install it when it is missing: a test
//! never passes without its service.
//!
//! - [`redis::TestRedis`]: a private `redis-server`.
//! - [`otlp::Receiver`]: a real OTLP receiver.
//! - [`MotoS3`], [`SailServer`], [`python3`]: below.
//! - [`KillOnDrop`], [`kill`], [`sigterm`]: a test's own child processes (a daemon it starts).
//!
//! A local S3-compatible server for tests (`stel-ingest`'s uploader tests, `stel-query`'s export
//! tests): `python3 -m moto.server` from PyPI (`deploy/setup.sh --test` installs it). If it cannot
//! start it **panics** with how to install it: a test never passes silently without a server.
//! Also the one way tests run a Python read-back script ([`python3`]).

pub mod otlp;
pub mod redis;

use std::{
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

/// A `python3 -c` command for `script` that ends the interpreter with `os._exit(0)` once the
/// script has run to its end (stdout flushed). pyarrow and DuckDB keep native thread pools that
/// can `std::terminate` while Python tears down ("terminate called without an active
/// exception", apache/arrow#34314): that failed a CI run after every comparison had passed. A
/// script that fails raises before the epilogue, so its exit status still fails the test.
pub fn python3(script: &str) -> Command {
    let mut c = Command::new("python3");
    c.arg("-c").arg(format!(
        "{script}\nimport os as _os, sys as _sys\n_sys.stdout.flush(); _sys.stderr.flush(); _os._exit(0)\n"
    ));
    c
}

/// Runs `script` with [`python3`] and parses the JSON it prints last (a pyarrow/DuckDB read-back);
/// panics with the interpreter's stderr when it fails and with its stdout when that is not JSON.
pub fn python3_json(script: &str) -> serde_json::Value {
    let o = python3(script).output().expect("cannot run python3");
    assert!(
        o.status.success(),
        "python3 failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "python3 printed no JSON ({e}): {}",
            String::from_utf8_lossy(&o.stdout)
        )
    })
}

/// A moto S3 server owned by a test (killed on drop), with one bucket created.
#[derive(Debug)]
pub struct MotoS3 {
    child: Child,
    port: u16,
}

/// A binary of another workspace package for a test that runs it (`stel-ingestd` in the query
/// tests): `target/<profile>/<name>` beside the running test executable, which `cargo test
/// --workspace` builds; when it is missing it is built with `cargo build -p <package> --bin
/// <name>` into the same target directory first, and stderr says so.
///
/// # Panics
/// When the build fails or does not produce the binary.
pub fn workspace_bin(package: &str, name: &str) -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("test executable");
    // target/<profile>/deps/<test>-<hash>
    let profile_dir = exe
        .parent()
        .and_then(std::path::Path::parent)
        .expect("target/<profile>")
        .to_path_buf();
    let bin = profile_dir.join(name);
    if bin.exists() {
        return bin;
    }
    let target = profile_dir.parent().expect("target dir").to_path_buf();
    let release = profile_dir.file_name().is_some_and(|n| n == "release");
    eprintln!(
        "{} is missing; building it: cargo build -p {package} --bin {name}{} --target-dir {}",
        bin.display(),
        if release { " --release" } else { "" },
        target.display()
    );
    let mut c = nested_cargo();
    c.args(["build", "-p", package, "--bin", name])
        .arg("--target-dir")
        .arg(&target)
        .current_dir(env!("CARGO_MANIFEST_DIR"));
    if release {
        c.arg("--release");
    }
    let st = c.status().expect("run cargo build");
    assert!(st.success(), "building {name} failed");
    assert!(
        bin.exists(),
        "cargo build did not produce {}",
        bin.display()
    );
    bin
}

/// Cargo (`$CARGO`, else `cargo` on the PATH) for a build started from a process that cargo
/// itself ran (`cargo run`, `cargo test`), without the environment cargo gives such a process:
/// the package's `CARGO_PKG_*`, `CARGO_MANIFEST_*`, `CARGO_CRATE_NAME`, `OUT_DIR`, … . Build
/// scripts that declare `rerun-if-env-changed` on those names (ring's does) would see them set
/// here and unset in a `cargo build` from a shell, and rerun: ring, rustls, object_store and all
/// of DataFusion rebuilt after a plain `cargo build` had built the very same thing.
pub fn nested_cargo() -> Command {
    let mut c = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    for (k, _) in std::env::vars_os() {
        let Some(k) = k.to_str() else { continue };
        if k.starts_with("CARGO_PKG_")
            || k.starts_with("CARGO_MANIFEST_")
            || matches!(
                k,
                "CARGO_CRATE_NAME"
                    | "CARGO_BIN_NAME"
                    | "CARGO_PRIMARY_PACKAGE"
                    | "CARGO_TARGET_TMPDIR"
                    | "CARGO_RUSTC_CURRENT_DIR"
                    | "OUT_DIR"
            )
        {
            c.env_remove(k);
        }
    }
    c
}

/// Sends `signal` (`-TERM`, `-INT`, …) to `pid` (std has no signal API: the `kill` command
/// sends it).
pub fn kill(pid: u32, signal: &str) {
    let rc = Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(rc.success(), "kill {signal} {pid}");
}

/// Sends SIGTERM to `pid`, as systemd stops a service.
pub fn sigterm(pid: u32) {
    kill(pid, "-TERM");
}

/// A child process a test owns: SIGKILLed and reaped when dropped, so that a failing assertion
/// (a panic unwinds through it) does not leave it running — a daemon started with `--duration
/// 600s` would go on for ten minutes. The child is reachable through `Deref` (`id()`,
/// `try_wait()`); a test that checks how the child stops sends its own signal and then takes it
/// back with [`KillOnDrop::into_inner`] to wait for it.
#[derive(Debug)]
pub struct KillOnDrop(Option<Child>);

impl KillOnDrop {
    /// Guards `child`.
    pub fn new(child: Child) -> Self {
        Self(Some(child))
    }

    /// The child, no longer killed on drop (to `wait()` or `wait_with_output()` for it after
    /// stopping it).
    pub fn into_inner(mut self) -> Child {
        self.0.take().expect("the child is taken only here")
    }
}

impl std::ops::Deref for KillOnDrop {
    type Target = Child;
    fn deref(&self) -> &Child {
        self.0
            .as_ref()
            .expect("the child is taken only by into_inner")
    }
}

impl std::ops::DerefMut for KillOnDrop {
    fn deref_mut(&mut self) -> &mut Child {
        self.0
            .as_mut()
            .expect("the child is taken only by into_inner")
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(c) = self.0.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A TCP port that was free a moment ago (for a server started later on purpose).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind 127.0.0.1:0")
}

/// The environment a client (stel-query, stel-ingestd's uploader) needs for a moto server at
/// `url`: endpoint, moto's dummy credentials, a region, and plain HTTP allowed.
pub fn s3_client_env(url: &str) -> [(&'static str, &str); 5] {
    [
        ("AWS_ENDPOINT_URL", url),
        ("AWS_ACCESS_KEY_ID", "k"),
        ("AWS_SECRET_ACCESS_KEY", "s"),
        ("AWS_REGION", "us-east-1"),
        ("AWS_ALLOW_HTTP", "true"),
    ]
}

impl MotoS3 {
    /// Starts the server on a free port and creates `bucket`.
    pub fn start(bucket: &str) -> Self {
        Self::start_on(free_port(), bucket)
    }

    /// Starts the server on `port` and creates `bucket`; waits up to 30 s for it.
    pub fn start_on(port: u16, bucket: &str) -> Self {
        let child = Command::new("python3")
            .args(["-m", "moto.server", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 -m moto.server (install moto: deploy/setup.sh --test)");
        let me = Self { child, port };
        let url = me.url();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ok = Command::new("python3")
                .args([
                    "-c",
                    &format!(
                        "import boto3; boto3.client('s3', endpoint_url='{url}', aws_access_key_id='k', aws_secret_access_key='s', region_name='us-east-1').create_bucket(Bucket='{bucket}')"
                    ),
                ])
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if ok {
                return me;
            }
            assert!(
                Instant::now() < deadline,
                "moto server on {url} did not come up (is moto installed? deploy/setup.sh --test)"
            );
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    /// `http://127.0.0.1:<port>` (set `AWS_ENDPOINT_URL` to it, with `AWS_ALLOW_HTTP=true`).
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for MotoS3 {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A Sail Spark Connect server (`sail spark server`, from PyPI's `pysail`; `deploy/setup.sh
/// --test` installs it) owned by a test or a bench (killed on drop), in local-cluster mode:
/// a driver and `workers` worker actors that exchange tasks and shuffle data over gRPC, as a
/// cluster does. `env` reaches the server (the AWS_* settings of an S3 lake). If it cannot start
/// it **panics** with how to install it.
#[derive(Debug)]
pub struct SailServer {
    child: Child,
    port: u16,
}

impl SailServer {
    /// Starts the server on a free port and waits (up to 60 s) until it accepts connections.
    pub fn start(workers: usize, env: &[(&str, &str)]) -> Self {
        let port = free_port();
        let mut c = Command::new("sail");
        c.args([
            "spark",
            "server",
            "--ip",
            "127.0.0.1",
            "--port",
            &port.to_string(),
        ])
        .env("SAIL_MODE", "local-cluster")
        .env("SAIL_CLUSTER__WORKER_INITIAL_COUNT", workers.to_string())
        .env("SAIL_CLUSTER__WORKER_MAX_COUNT", workers.to_string())
        .env("RUST_LOG", "error")
        .stdout(Stdio::null())
        .stderr(Stdio::null());
        for (k, v) in env {
            c.env(k, v);
        }
        let child = c
            .spawn()
            .expect("sail spark server (install pysail: deploy/setup.sh --test)");
        let mut me = Self { child, port };
        let deadline = Instant::now() + Duration::from_secs(60);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Ok(Some(st)) = me.child.try_wait() {
                panic!("sail spark server exited at start ({st}); is pysail installed? deploy/setup.sh --test");
            }
            assert!(
                Instant::now() < deadline,
                "sail spark server on port {port} did not come up in 60 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        me.port = port;
        me
    }

    /// `sc://127.0.0.1:<port>` (stel-query's `--remote`).
    pub fn remote(&self) -> String {
        format!("sc://127.0.0.1:{}", self.port)
    }
}

impl Drop for SailServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
