//! `stel-query serve`: the history over Arrow Flight SQL, for Grafana's FlightSQL data source,
//! ADBC and JDBC drivers, pyarrow and anything else that speaks it.
//!
//! The catalog is the one `stel-query sql` opens ([`crate::cmd::sql::open`]: session tables,
//! the long view `counters`, the INT tables), and SQL runs through the same DataFusion planner
//! under the same read-only gate ([`crate::engine::SqlAccess`]). Around it, what makes it safe
//! to leave running on a switch:
//! - it binds loopback unless `--listen` says otherwise; `--token-file` requires a bearer token
//!   (`auth.rs`); `--tls-cert`/`--tls-key` serve TLS (rustls);
//! - limits ([`limits`]): `--max-queries` running at once (one more is refused, not queued),
//!   `--query-memory` per query (DataFusion's memory pool, no spilling), `--query-timeout`;
//! - every refusal is a gRPC status with its own code, counted; the counts are printed on
//!   stderr when the server stops (SIGTERM or Ctrl-C).
//!
//! Two runtimes: queries execute on one sized to the machine, the gRPC server runs on a
//! one-thread runtime of its own, so a busy query never delays accepting, refusing or
//! answering metadata calls.

mod auth;
pub mod functions;
pub mod limits;
mod service;

use std::{
    io::Write,
    net::{SocketAddr, ToSocketAddrs},
    path::PathBuf,
    process::ExitCode,
    sync::Arc,
    time::Duration,
};

use arrow_flight::flight_service_server::FlightServiceServer;
use tonic::transport::{server::TcpIncoming, Identity, Server, ServerTlsConfig};

use crate::{
    error::{Error, Result},
    settings::parse_duration_ns,
};
use limits::{Limits, Stats};

/// Serve the history over Arrow Flight SQL (Grafana, ADBC, JDBC, pyarrow).
///
/// Tables are the ones `stel-query sql` sees: `<profile>_<group>` per session and its rollup
/// tiers (`_1s`, `_1m`), the long view `counters`, and `int_reports`, `int_hops`, `int_drops`
/// when the data has INT history. The table function rates(group, resolution, profile, speed)
/// answers as `stel-query rates` does (the Grafana dashboards query it); the window is the
/// query's ts bounds, else the last minute of data:
///   SELECT * FROM rates('PORT', '1s')
///     WHERE ts >= '2024-05-01T12:00:00Z' AND ts < '2024-05-01T12:05:00Z'
/// Statements are read-only. Prints the address it listens on and the tables; stops on SIGTERM
/// or Ctrl-C and prints its counts (queries, rows, refusals by kind) on stderr.
///
/// Refusals (gRPC status codes): UNAUTHENTICATED no/wrong token; INVALID_ARGUMENT SQL that does
/// not parse or plan; PERMISSION_DENIED a statement that writes; RESOURCE_EXHAUSTED
/// --max-queries already running, or a query over --query-memory; DEADLINE_EXCEEDED a query
/// over --query-timeout.
///
/// Examples:
///   stel-query serve -d /var/lib/stel
///   stel-query serve --listen 0.0.0.0:50051 --token-file /etc/stel/token \
///       --tls-cert cert.pem --tls-key key.pem
///   stel-query serve --max-queries 2 --query-memory 256MiB --query-timeout 30s
#[derive(Debug, clap::Args)]
#[command(verbatim_doc_comment)]
pub struct Args {
    /// Where the daemon writes Parquet: a directory or an `s3://bucket/prefix` URL.
    #[arg(
        long,
        short = 'd',
        env = "STEL_DATA_DIR",
        default_value = "./stel-data"
    )]
    pub data_dir: String,
    /// Address to listen on (port 0: any free port; the chosen address is printed).
    #[arg(long, default_value = "127.0.0.1:50051", value_name = "HOST:PORT")]
    pub listen: String,
    /// Require `authorization: Bearer <token>` (or a password equal to the token) on every call;
    /// the token is this file's content.
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// Serve TLS with this certificate chain (PEM); needs --tls-key.
    #[arg(long, value_name = "PEM", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The certificate's private key (PEM); needs --tls-cert.
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Queries running at once; one more is refused with RESOURCE_EXHAUSTED.
    #[arg(long, default_value_t = 4)]
    pub max_queries: usize,
    /// Memory one query's sorts, aggregations and joins may hold (e.g. 512MiB, 2G); more is
    /// refused with RESOURCE_EXHAUSTED (nothing spills to disk).
    #[arg(long, default_value = "1GiB", value_name = "SIZE")]
    pub query_memory: String,
    /// Longest a query may run, from the request to its last batch; longer ones are cancelled
    /// with DEADLINE_EXCEEDED.
    #[arg(long, default_value = "60s", value_name = "DURATION")]
    pub query_timeout: String,
}

/// How long a stopping server waits for running answers before it exits anyway.
const DRAIN: Duration = Duration::from_secs(5);
/// How old a table's file listing may be (new files the daemon publishes appear within this).
const LISTING_TTL: Duration = Duration::from_secs(1);

fn listen_addr(s: &str) -> Result<SocketAddr> {
    s.to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| {
            Error::Usage(format!(
                "--listen `{s}` is not HOST:PORT (e.g. 127.0.0.1:50051, [::1]:50051, 0.0.0.0:50051)"
            ))
        })
}

fn tls_config(a: &Args) -> Result<Option<ServerTlsConfig>> {
    let (Some(cert), Some(key)) = (&a.tls_cert, &a.tls_key) else {
        return Ok(None);
    };
    let read = |p: &PathBuf, what: &str| {
        std::fs::read(p)
            .map_err(|e| Error::Usage(format!("cannot read {what} {}: {e}", p.display())))
    };
    let identity = Identity::from_pem(read(cert, "--tls-cert")?, read(key, "--tls-key")?);
    Ok(Some(ServerTlsConfig::new().identity(identity)))
}

/// SIGTERM and SIGINT (Ctrl-C), listened for from the start of `run`: one arriving while the
/// server waits for the first files, opens the catalog or binds, or right after it says it
/// serves, stops it cleanly (once listened for, the default action that would kill it is gone,
/// so neither may go unheard in between).
struct Stop {
    #[cfg(unix)]
    term: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    int: Option<tokio::signal::unix::Signal>,
}

impl Stop {
    /// Starts listening (inside a runtime; [`Self::recv`] may be polled from another one).
    fn listen() -> Self {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            Self {
                term: signal(SignalKind::terminate()).ok(),
                int: signal(SignalKind::interrupt()).ok(),
            }
        }
        #[cfg(not(unix))]
        {
            Self {}
        }
    }

    /// Resolves on the first SIGTERM or SIGINT.
    async fn recv(&mut self) {
        #[cfg(unix)]
        {
            async fn one(s: &mut Option<tokio::signal::unix::Signal>) {
                match s {
                    Some(s) => {
                        s.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            }
            if self.term.is_some() || self.int.is_some() {
                tokio::select! {
                    () = one(&mut self.term) => {}
                    () = one(&mut self.int) => {}
                }
                return;
            }
        }
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// How often a server started before the daemon's first files looks for them.
const FIRST_FILES_POLL: Duration = Duration::from_secs(2);

/// The catalog of `data`, once it has something to serve: a server started (by systemd, say)
/// before the daemon published its first file waits for it, saying so once. A data directory
/// that is not there at all is an error.
async fn first_history(data: &str) -> Result<crate::catalog::Catalog> {
    let mut said = false;
    loop {
        match crate::cmd::sql::open(data, false).await {
            Err(Error::NotFound(m)) => {
                if !said {
                    eprintln!(
                        "stel-query: serve: nothing to serve yet ({m}); waiting for the daemon's first files (looking every {}s)",
                        FIRST_FILES_POLL.as_secs()
                    );
                    said = true;
                }
                tokio::time::sleep(FIRST_FILES_POLL).await;
            }
            r => return r.map(|(cat, _)| cat),
        }
    }
}

/// How many tables there are, with their names (the first [`NAMED`] of them): `7 tables:
/// counters, int_drops, …`.
fn tables_phrase<'a>(names: impl ExactSizeIterator<Item = &'a str>) -> String {
    let n = names.len();
    let mut shown: Vec<&str> = names.take(NAMED).collect();
    if n > NAMED {
        shown.push("…");
    }
    format!(
        "{n} table{}{}",
        if n == 1 { "" } else { "s" },
        if n == 0 {
            String::new()
        } else {
            format!(": {}", shown.join(", "))
        }
    )
}

/// Tables named in the start-up line; more are counted only.
const NAMED: usize = 8;

/// # Errors
/// Bad flags, no data, an address that cannot be bound, TLS files that do not load.
pub fn run(a: Args) -> Result<ExitCode> {
    let limits = Limits {
        max_queries: a.max_queries.max(1),
        query_memory: limits::parse_bytes(&a.query_memory)?,
        query_timeout: Duration::from_nanos(parse_duration_ns(&a.query_timeout)? as u64),
    };
    let addr = listen_addr(&a.listen)?;
    let token = a.token_file.as_deref().map(auth::read_token).transpose()?;
    let tls = tls_config(&a)?;
    let exec = tokio::runtime::Builder::new_multi_thread()
        .thread_name("stel-query-exec")
        .enable_all()
        .build()?;
    let io = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("stel-query-grpc")
        .enable_all()
        .build()?;
    // Registered on the gRPC runtime, whose worker drives it while the engine's runtime waits
    // for the first files.
    let mut stop = io.block_on(async { Stop::listen() });
    // Unreadable files are skipped with a warning (a server keeps serving what it can read).
    let first = exec.block_on(async {
        tokio::select! {
            r = first_history(&a.data_dir) => r.map(Some),
            () = stop.recv() => Ok(None),
        }
    })?;
    let Some(cat) = first else {
        eprintln!("stel-query: serve: stopped before the first files came");
        exec.shutdown_background();
        return Ok(ExitCode::SUCCESS);
    };
    let cat = Arc::new(cat);
    functions::register(&cat.ctx, Arc::clone(&cat));
    // DataFusion caches a table's file listing for the process's life by default; a server
    // must see the files the daemon keeps publishing.
    if let Some(c) = cat.ctx.runtime_env().cache_manager.get_list_files_cache() {
        c.update_cache_ttl(Some(LISTING_TTL));
    }
    let stats = Stats::new();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let svc = service::FlightSqlServer::new(
        cat.ctx.clone(),
        exec.handle().clone(),
        limits.clone(),
        Arc::clone(&stats),
        token.clone(),
        stop_rx,
    )?;
    // The tables named in the start-up line are the ones clients list (GetTables), not only the
    // session tables: the long view and the INT tables are served too.
    let tables = exec.block_on(service::listed_tables(&cat.ctx));
    let tables = tables_phrase(tables.iter().map(|t| t.name.as_str()));
    // Bound before serving: an address that cannot be bound is only an error (no counts of a
    // server that never ran).
    let listener = match io.block_on(tokio::net::TcpListener::bind(addr)) {
        Ok(l) => l,
        Err(e) => {
            exec.shutdown_background();
            return Err(Error::Usage(format!(
                "cannot listen on {addr}: {e}; give another --listen HOST:PORT (port 0: any free port)"
            )));
        }
    };
    let counts = Arc::clone(&stats);
    let served = io.block_on(async move {
        let local = listener.local_addr()?;
        let scheme = if tls.is_some() { "grpc+tls" } else { "grpc" };
        {
            let mut out = std::io::stdout().lock();
            writeln!(
                out,
                "stel-query: serving Flight SQL on {scheme}://{local} ({}, {tables}; {}; read-only; max {} queries, {} per query, {:?} each)",
                cat.location.url,
                if token.is_some() { "bearer token required" } else { "no token" },
                limits.max_queries,
                a.query_memory,
                limits.query_timeout,
            )?;
            out.flush()?;
        }
        let mut server = Server::builder();
        if let Some(t) = tls {
            server = server
                .tls_config(t)
                .map_err(|e| Error::Usage(format!("TLS: {e}")))?;
        }
        let interceptor = auth::Auth::new(token, Arc::clone(&stats));
        let service = FlightServiceServer::with_interceptor(svc, interceptor);
        let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
        let (stopped_tx, stopped_rx) = tokio::sync::oneshot::channel::<()>();
        let shutdown = async move {
            stop.recv().await;
            eprintln!("stel-query: serve: stopping");
            let _ = stop_tx.send(true);
            let _ = stopped_tx.send(());
        };
        let serving = server
            .add_service(service)
            .serve_with_incoming_shutdown(incoming, shutdown);
        tokio::pin!(serving);
        tokio::select! {
            r = &mut serving => r.map_err(|e| Error::Usage(format!("serving on {local}: {e}")))?,
            _ = async {
                let _ = stopped_rx.await;
                tokio::time::sleep(DRAIN).await;
            } => {
                eprintln!("stel-query: serve: answers still running after {DRAIN:?}; exiting");
            }
        }
        Ok::<_, Error>(())
    });
    eprintln!("stel-query: serve stopped: {}", counts.line());
    // Do not wait for query tasks still unwinding on the engine's runtime.
    exec.shutdown_background();
    served?;
    Ok(ExitCode::SUCCESS)
}
