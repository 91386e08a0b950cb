//! A private `redis-server` for tests (this crate's and `stel-ingest`'s).
//!
//! [`TestRedis::start`] runs `/usr/bin/redis-server` (or `redis-server` on `PATH`, or
//! `$STEL_REDIS_SERVER`) on a unix socket in a fresh temp directory with persistence off
//! (`--save '' --appendonly no`) and keyspace notifications off (SONiC's default is the same:
//! the STATE_DB watcher must turn them on). If the binary is missing it **panics** with a message
//! saying how to install it: tests never pass silently without a server.
//!
//! With `STEL_REDIS_URL` set, [`TestRedis::start`] uses that server instead and flushes the
//! databases the tests use (0, 2, 4, 6) — point it only at a throw-away server and run the tests
//! with `--test-threads=1`. [`TestRedis::start_private`] always starts its own server (needed to
//! kill and restart it).

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::atomic::{AtomicU64, Ordering},
    time::{Duration, Instant},
};

/// A redis-server owned by a test (killed on drop) or an external one from `STEL_REDIS_URL`.
#[derive(Debug)]
pub struct TestRedis {
    dir: Option<PathBuf>,
    child: Option<Child>,
    url: String,
}

fn server_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("STEL_REDIS_SERVER") {
        return PathBuf::from(p);
    }
    let default = Path::new("/usr/bin/redis-server");
    if default.exists() {
        return default.to_path_buf();
    }
    if let Some(path) = std::env::var_os("PATH") {
        for d in std::env::split_paths(&path) {
            let c = d.join("redis-server");
            if c.exists() {
                return c;
            }
        }
    }
    panic!(
        "redis-server not found (looked at $STEL_REDIS_SERVER, /usr/bin/redis-server and PATH). \
         The Redis tests need a real server: install it with `deploy/setup.sh --test` \
         (apt-get install redis-server), or point STEL_REDIS_URL at a throw-away server."
    );
}

impl TestRedis {
    /// A server for one test: `STEL_REDIS_URL` if set (flushed), else a private one.
    ///
    /// # Panics
    /// When no server can be started or reached (with a message saying why and what to do).
    pub fn start() -> TestRedis {
        match std::env::var("STEL_REDIS_URL") {
            Ok(url) if !url.is_empty() => {
                let t = TestRedis {
                    dir: None,
                    child: None,
                    url,
                };
                let mut c = t.connect(0);
                for db in [0, 2, 4, 6] {
                    redis::cmd("SELECT").arg(db).query::<()>(&mut c).ok();
                    redis::cmd("FLUSHDB")
                        .query::<()>(&mut c)
                        .unwrap_or_else(|e| panic!("STEL_REDIS_URL={}: FLUSHDB: {e}", t.url));
                }
                t
            }
            _ => Self::start_private(),
        }
    }

    /// Always a private server on a temp unix socket.
    ///
    /// # Panics
    /// When `redis-server` is missing or does not come up within 10 s.
    pub fn start_private() -> TestRedis {
        static N: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "stel-redis-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        let url = format!("unix://{}", dir.join("redis.sock").display());
        let mut t = TestRedis {
            dir: Some(dir),
            child: None,
            url,
        };
        t.spawn();
        t
    }

    fn socket(&self) -> PathBuf {
        self.dir
            .as_ref()
            .map(|d| d.join("redis.sock"))
            .unwrap_or_default()
    }

    fn spawn(&mut self) {
        let dir = self
            .dir
            .clone()
            .unwrap_or_else(|| panic!("cannot start a server for STEL_REDIS_URL={}", self.url));
        let sock = self.socket();
        let _ = std::fs::remove_file(&sock);
        let bin = server_binary();
        let child = Command::new(&bin)
            .args(["--port", "0", "--unixsocket"])
            .arg(&sock)
            .args([
                "--unixsocketperm",
                "700",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .args(["--daemonize", "no", "--dir"])
            .arg(&dir)
            .args(["--notify-keyspace-events", ""])
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", bin.display()));
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(client) = redis::Client::open(self.url.as_str()) {
                if let Ok(mut c) = client.get_connection() {
                    if redis::cmd("PING").query::<String>(&mut c).is_ok() {
                        return;
                    }
                }
            }
            if let Some(Ok(Some(st))) = self.child.as_mut().map(Child::try_wait) {
                panic!("{} exited at start: {st}", bin.display());
            }
            assert!(
                Instant::now() < deadline,
                "{} did not answer on {} within 10 s",
                bin.display(),
                sock.display()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// `unix:///tmp/…/redis.sock` (or the `STEL_REDIS_URL`).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// A new connection with database `db` selected.
    ///
    /// # Panics
    /// When the server cannot be reached.
    pub fn connect(&self, db: i64) -> redis::Connection {
        let client = redis::Client::open(self.url.as_str())
            .unwrap_or_else(|e| panic!("bad redis url {}: {e}", self.url));
        let mut c = client
            .get_connection_with_timeout(Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("cannot connect to {}: {e}", self.url));
        redis::cmd("SELECT")
            .arg(db)
            .query::<()>(&mut c)
            .unwrap_or_else(|e| panic!("SELECT {db} on {}: {e}", self.url));
        c
    }

    /// Kills the server (SIGKILL: no shutdown, clients see the connection drop).
    ///
    /// # Panics
    /// For an external (`STEL_REDIS_URL`) server.
    pub fn kill(&mut self) {
        let mut c = self
            .child
            .take()
            .unwrap_or_else(|| panic!("cannot kill the external server {}", self.url));
        let _ = c.kill();
        let _ = c.wait();
    }

    /// Starts the server again on the same socket (empty: persistence is off).
    ///
    /// # Panics
    /// For an external server, or when it does not come up.
    pub fn restart(&mut self) {
        if self.child.is_some() {
            self.kill();
        }
        self.spawn();
    }

    /// Polls `f` every 10 ms until it returns `Some`, for at most `secs` seconds.
    ///
    /// # Panics
    /// On timeout, with `what` in the message.
    pub fn wait_for<T>(secs: u64, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            if let Some(v) = f() {
                return v;
            }
            assert!(
                Instant::now() < deadline,
                "timed out after {secs} s waiting for {what}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for TestRedis {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if let Some(d) = &self.dir {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}
