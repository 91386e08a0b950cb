//! `stel-query serve` through real Flight SQL clients, none written here: Python's ADBC driver
//! (`adbc-driver-flightsql`, the Go driver Grafana's data source also builds on) and
//! `pyarrow.flight` (plain Flight with the Flight SQL messages encoded by hand), against the
//! real `stel-query serve` binary over history the real daemon wrote (`stel-ingestd --demo`
//! for counters, `stel-ingestd --int-only` fed by `stel-emu int` for INT).
//!
//! - the clients ask the CLI's questions (rates, an INT question, SQL over the long view) and
//!   must get the CLI's answers, value for value; they browse the catalog (GetTables,
//!   GetSqlInfo, ADBC's get_objects); over TLS with a private CA;
//! - a missing/wrong token, bad SQL, a write, a query over the memory limit, one over the
//!   concurrency limit and one over the time limit each get their documented gRPC code, the
//!   server answers the next query, and on SIGTERM it exits 0 printing exactly those counts;
//! - every panel of the Grafana dashboards in deploy/grafana runs through the endpoint with the
//!   macros expanded as the FlightSQL data source expands them, and returns rows with a time
//!   column and the value columns the panel plots.
//!
//! The server is ready when it prints its address (no sleeps).

use std::{
    io::{BufRead, BufReader, Read},
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    sync::{mpsc, OnceLock},
    time::{Duration, Instant},
};

use serde_json::{json, Value};
use stel_query::settings::parse_time_ns;
use stel_testkit::{kill, python3, sigterm, workspace_bin};

/// Polls `f` every 50 ms until it returns something, for at most `secs`.
fn wait_for<T>(secs: u64, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn read_json(p: &Path) -> Option<Value> {
    serde_json::from_str(&std::fs::read_to_string(p).ok()?).ok()
}

/// History the real daemon wrote, once per test process: 2 s of the demo (64 ports × 30 stats
/// every 10 µs, PORT) and INT reports from `stel-emu int` received over UDP with EVC names.
fn history() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("flightsql-history");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let data = dir.join("data");
        let daemon = workspace_bin("stel-ingest", "stel-ingestd");
        let emu = workspace_bin("stel-ingest", "stel-emu");
        let o = Command::new(&daemon)
            .args(["--demo", "--no-ebpf", "--pattern", "microburst"])
            .args(["--duration", "2s", "--no-inspect", "--json", "--data-dir"])
            .arg(&data)
            .arg("--status-file")
            .arg(dir.join("demo-status.json"))
            .current_dir(&dir)
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "stel-ingestd --demo: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        // INT: the emulator's EVC listing, the daemon listening, the emulator sending.
        let evcs = dir.join("evcs.json");
        let topo = ["--format", "amlight", "--flows", "8", "--max-hops", "6"];
        let o = Command::new(&emu)
            .args(["int", "--count", "0"])
            .args(topo)
            .arg("--kytos-evcs")
            .arg(&evcs)
            .arg("--pcap")
            .arg(dir.join("unused.pcap"))
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let status = dir.join("int-status.json");
        let mut child = Command::new(&daemon)
            .args([
                "--int-only",
                "--int-listen",
                "127.0.0.1:0",
                "--int-kytos-evcs",
            ])
            .arg(&evcs)
            .arg("--data-dir")
            .arg(&data)
            .arg("--status-file")
            .arg(&status)
            .args(["--no-inspect", "--json"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let addr = wait_for(60, "the INT listen address", || {
            assert!(child.try_wait().unwrap().is_none(), "the INT daemon exited");
            read_json(&status)?["info"]["components"]["int"]["listen"][0]
                .as_str()
                .map(str::to_string)
        });
        let truth = dir.join("truth.json");
        let o = Command::new(&emu)
            .args(["int", "--to", &addr, "--count", "4000", "--rate", "0"])
            .args(topo)
            .args([
                "--loss",
                "0.01",
                "--drops",
                "0.05",
                "--path-change-every",
                "300",
            ])
            .arg("--truth")
            .arg(&truth)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let sent = read_json(&truth).unwrap()["packets_sent"].as_u64().unwrap();
        wait_for(60, "every INT datagram received", || {
            let m = stel_store::metrics::Snapshot::from_json(&read_json(&status)?["metrics"]);
            (m.sum_where(
                stel_store::metrics::Metric::ReaderDatagrams,
                stel_store::metrics::Label::Source,
                "int",
            ) == sent)
                .then_some(())
        });
        sigterm(child.id());
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "INT daemon: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        dir
    })
}

fn data_dir() -> PathBuf {
    history().join("data")
}

/// A running `stel-query serve`.
struct Serve {
    child: Child,
    /// `host:port` it printed.
    addr: String,
    /// The line it printed that on.
    line: String,
    stderr: std::thread::JoinHandle<String>,
}

impl Serve {
    /// Starts the server on a free port and waits for the line with its address.
    fn start(extra: &[&str]) -> Self {
        Self::start_on(&data_dir(), extra)
    }

    /// [`Self::start`] over another data directory.
    fn start_on(dir: &Path, extra: &[&str]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_stel-query"))
            .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(dir)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut err = child.stderr.take().unwrap();
        let stderr = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = err.read_to_string(&mut s);
            s
        });
        let out = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let line = rx
            .recv_timeout(Duration::from_secs(120))
            .unwrap_or_else(|e| panic!("stel-query serve printed no address: {e}"));
        let addr = line
            .split("://")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .unwrap_or_else(|| panic!("no address in {line:?}"))
            .to_string();
        Self {
            child,
            addr,
            line,
            stderr,
        }
    }

    /// SIGTERM; the exit status and everything it wrote on stderr.
    fn stop(mut self) -> (ExitStatus, String) {
        sigterm(self.child.id());
        let st = self.child.wait().unwrap();
        (st, self.stderr.join().unwrap())
    }
}

/// The count and the names of the tables in the start-up line
/// (`… (file:///…/, 7 tables: counters, int_drops, …; no token; …)`).
fn startup_tables(line: &str) -> (usize, Vec<String>) {
    let about = line
        .split_once(" (")
        .and_then(|(_, r)| r.split("; ").next())
        .and_then(|r| r.split_once(", "))
        .map(|(_, tables)| tables)
        .unwrap_or_else(|| panic!("no tables in {line:?}"));
    let (n, names) = about.split_once(": ").unwrap_or((about, ""));
    let n = n
        .split(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no table count in {line:?}"));
    let names = names
        .split(", ")
        .filter(|t| !t.is_empty())
        .map(str::to_string)
        .collect();
    (n, names)
}

/// The stop line's counts.
fn counts(stderr: &str) -> Value {
    let line = stderr
        .lines()
        .find_map(|l| l.strip_prefix("stel-query: serve stopped: "))
        .unwrap_or_else(|| panic!("no stop line in: {stderr}"));
    let mut m = serde_json::Map::new();
    for kv in line.split_whitespace() {
        let (k, v) = kv.split_once('=').unwrap();
        m.insert(k.into(), json!(v.parse::<u64>().unwrap()));
    }
    Value::Object(m)
}

/// Runs `stel-query <args> --json` over the history; returns (begin, rows).
fn cli(args: &[&str]) -> (Value, Vec<Value>) {
    let o = Command::new(env!("CARGO_BIN_EXE_stel-query"))
        .args(args)
        .arg("--data-dir")
        .arg(data_dir())
        .arg("--json")
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "stel-query {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let lines: Vec<Value> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let begin = lines.iter().find(|l| l["type"] == "begin").unwrap()["data"].clone();
    let rows = lines
        .iter()
        .filter(|l| l["type"] == "row")
        .map(|l| l["data"].clone())
        .collect();
    (begin, rows)
}

/// The Python side: helpers both clients share (hand-encoded Flight SQL commands for pyarrow,
/// Arrow tables to JSON rows with timestamps as ns).
const PY_CLIENTS: &str = r#"
import json, sys
import pyarrow as pa
import pyarrow.flight as flight
import adbc_driver_flightsql.dbapi as fsql
import adbc_driver_manager

def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)

def field(num, data):
    return varint(num << 3 | 2) + varint(len(data)) + data

def command(name, body=b""):
    # google.protobuf.Any{type_url, value} around a Flight SQL command message.
    return field(1, ("type.googleapis.com/arrow.flight.protocol.sql." + name).encode()) + field(2, body)

def rows(t):
    cols = {}
    for i, f in enumerate(t.schema):
        c = t.column(i)
        if pa.types.is_timestamp(f.type):
            c = c.cast(pa.int64())
        cols[f.name] = c.to_pylist()
    return [{k: v[i] for k, v in cols.items()} for i in range(t.num_rows)]

class Flight:
    """Flight SQL over plain pyarrow.flight."""
    def __init__(self, uri, token=None, ca=None):
        kw = {"tls_root_certs": open(ca, "rb").read()} if ca else {}
        self.client = flight.FlightClient(uri, **kw)
        headers = [(b"authorization", b"Bearer " + token.encode())] if token else []
        self.opts = flight.FlightCallOptions(headers=headers)
    def fetch(self, cmd):
        info = self.client.get_flight_info(flight.FlightDescriptor.for_command(cmd), self.opts)
        assert len(info.endpoints) == 1
        return self.client.do_get(info.endpoints[0].ticket, self.opts).read_all()
    def query(self, sql):
        return self.fetch(command("CommandStatementQuery", field(1, sql.encode())))
    def tables(self):
        return sorted(self.fetch(command("CommandGetTables")).column("table_name").to_pylist())

class Adbc:
    def __init__(self, uri, token=None, ca=None):
        kw = {}
        if token:
            kw["adbc.flight.sql.authorization_header"] = "Bearer " + token
        if ca:
            kw["adbc.flight.sql.client_option.tls_root_certs"] = open(ca).read()
        self.conn = fsql.connect(uri, db_kwargs=kw, autocommit=True)
    def query(self, sql):
        with self.conn.cursor() as cur:
            cur.execute(sql)
            return cur.fetch_arrow_table()
    def tables(self):
        objs = self.conn.adbc_get_objects(depth="tables").read_all().to_pylist()
        return sorted(t["table_name"] for c in objs for s in c["catalog_db_schemas"] for t in s["db_schema_tables"])

def error(f):
    """(exception class, message) of what f raises, or None."""
    try:
        f()
    except Exception as e:
        return [type(e).__name__, str(e)]
    return None
"#;

/// Runs a client script; its input is `input` (as `A`), its last stdout line JSON.
fn run_clients(script: &str, input: &Value) -> Value {
    let o = python3(&format!(
        "{PY_CLIENTS}\nA = json.loads({:?})\n{script}",
        input.to_string()
    ))
    .output()
    .unwrap();
    assert!(
        o.status.success(),
        "client script failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let out = String::from_utf8_lossy(&o.stdout);
    serde_json::from_str(out.lines().last().unwrap_or(""))
        .unwrap_or_else(|e| panic!("client output ({e}): {out}"))
}

#[test]
fn clients_get_the_cli_answers_over_tls() {
    let dir = tempfile::tempdir().unwrap();
    let pki = stel_testkit::otlp::test_pki(dir.path());
    let s = Serve::start(&[
        "--tls-cert",
        pki.cert.to_str().unwrap(),
        "--tls-key",
        pki.key.to_str().unwrap(),
    ]);

    // The CLI's answers.
    // 5 ms: several intervals even when a loaded machine's debug daemon wrote only tens of ms
    // of the demo in its 2 s (at 100 ms such a history held one interval).
    let (rb, cli_rates) = cli(&["rates", "-r", "5ms"]);
    let (from, to) = (
        rb["from"].as_str().unwrap().to_string(),
        rb["to"].as_str().unwrap().to_string(),
    );
    assert!(cli_rates.len() > 64, "{}", cli_rates.len());
    let (ib, cli_evc) = cli(&["int", "evc"]);
    assert!(!cli_evc.is_empty());
    let (ifrom, ito) = (
        parse_time_ns(ib["from"].as_str().unwrap()).unwrap(),
        parse_time_ns(ib["to"].as_str().unwrap()).unwrap(),
    );
    let counters_sql = "SELECT object, max(value) - min(value) AS octets FROM counters \
                        WHERE stat = 'IF_IN_OCTETS' GROUP BY object ORDER BY object";
    let (_, cli_sql) = cli(&["sql", counters_sql]);
    assert_eq!(cli_sql.len(), 64);

    let queries = json!({
        "rates": format!("SELECT * FROM rates('PORT', '5ms') WHERE ts >= '{from}' AND ts < '{to}' ORDER BY ts, iface"),
        "int": format!("SELECT evc_id, count(*) AS reports, max(latency_sum_ns) AS max_ns, \
                        sum(CAST(path_changed AS INT)) AS path_changes, sum(seq_gap) AS lost_before \
                        FROM int_reports WHERE ts >= to_timestamp_nanos({ifrom}) AND ts < to_timestamp_nanos({ito}) \
                        AND evc_id IS NOT NULL GROUP BY evc_id ORDER BY evc_id"),
        "sql": counters_sql,
    });
    let got = run_clients(
        r#"
uri = "grpc+tls://" + A["addr"]
out = {}
for name, cls in (("adbc", Adbc), ("flight", Flight)):
    c = cls(uri, ca=A["ca"])
    out[name] = {q: rows(c.query(sql)) for q, sql in A["queries"].items()}
    out[name]["tables"] = c.tables()
a = Adbc(uri, ca=A["ca"])
out["info"] = {k: str(v) for k, v in a.conn.adbc_get_info().items()}
out["schema"] = [f.name for f in a.conn.adbc_get_table_schema("stel_demo_port")][:3]
print(json.dumps(out))
"#,
        &json!({"addr": s.addr, "ca": pki.ca, "queries": queries}),
    );

    let key = |r: &Value, t: &str| (r[t].clone(), r["iface"].as_str().unwrap().to_string());
    for client in ["adbc", "flight"] {
        let g = &got[client];
        // rates: every (interval, interface) of the CLI, same values.
        let rates = g["rates"].as_array().unwrap();
        assert_eq!(rates.len(), cli_rates.len(), "{client} rates rows");
        let mut want: Vec<(Value, String, &Value)> = cli_rates
            .iter()
            .map(|r| {
                let t = json!(parse_time_ns(r["time"].as_str().unwrap()).unwrap());
                let (t, i) = (t, r["iface"].as_str().unwrap().to_string());
                (t, i, r)
            })
            .collect();
        want.sort_by(|a, b| (a.0.as_i64(), &a.1).cmp(&(b.0.as_i64(), &b.1)));
        for (r, (t, iface, c)) in rates.iter().zip(&want) {
            assert_eq!(key(r, "ts"), (t.clone(), iface.clone()), "{client}");
            for k in [
                "rx_ok", "rx_bps", "rx_pps", "rx_util", "tx_ok", "tx_bps", "tx_pps", "tx_util",
            ] {
                assert_eq!(r[k], c[k], "{client} {k} of {iface} at {t}: {r} vs {c}");
            }
        }
        // INT: per EVC, the CLI's counts and maxima.
        let evc = g["int"].as_array().unwrap();
        assert_eq!(evc.len(), cli_evc.len(), "{client} EVCs");
        for (r, c) in evc.iter().zip(&cli_evc) {
            for k in ["evc_id", "reports", "max_ns", "path_changes", "lost_before"] {
                assert_eq!(r[k], c[k], "{client} {k}: {r} vs {c}");
            }
        }
        // SQL over the long view.
        assert_eq!(g["sql"].as_array().unwrap(), &cli_sql, "{client} sql");
        // Browsing: the session table, the long view, the INT tables.
        let tables: Vec<&str> = g["tables"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_str().unwrap())
            .collect();
        for t in ["stel_demo_port", "counters", "int_reports", "int_hops"] {
            assert!(tables.contains(&t), "{client} tables {tables:?}");
        }
    }
    assert_eq!(got["info"]["vendor_name"], "stel-query", "{}", got["info"]);
    assert_eq!(
        got["schema"],
        json!(["ts", "Ethernet0.IF_IN_OCTETS", "Ethernet0.IF_IN_UCAST_PKTS"])
    );
    let (st, err) = s.stop();
    assert!(st.success(), "{err}");
    let c = counts(&err);
    assert_eq!(c["failed"], 0, "{err}");
    assert_eq!(c["queries"], c["completed"], "{err}");
}

#[test]
fn refusals_are_flight_errors_and_the_server_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "s3cret-token\n").unwrap();
    let limited = Serve::start(&[
        "--token-file",
        token.to_str().unwrap(),
        "--max-queries",
        "1",
        "--query-memory",
        "8MiB",
    ]);
    let slow = Serve::start(&["--query-timeout", "2s"]);
    let got = run_clients(
        r#"
uri, tok = "grpc://" + A["addr"], "s3cret-token"
good = "SELECT count(*) AS n FROM stel_demo_port"
f = Flight(uri, token=tok)
out = {"good": rows(f.query(good))[0]["n"]}
out["no_token"] = error(lambda: Flight(uri).query(good))
out["wrong_token"] = error(lambda: Flight(uri, token="guess").query(good))
out["adbc_wrong_token"] = error(lambda: Adbc(uri, token="guess").query(good))
# Username/password: the handshake answers with the bearer token.
hf = flight.FlightClient(uri)
pair = hf.authenticate_basic_token(b"grafana", tok.encode())
hopts = flight.FlightCallOptions(headers=[pair])
info = hf.get_flight_info(flight.FlightDescriptor.for_command(command("CommandStatementQuery", field(1, good.encode()))), hopts)
out["basic_auth"] = hf.do_get(info.endpoints[0].ticket, hopts).read_all().num_rows
out["bad_sql"] = error(lambda: f.query("SELEC count(*) FROM stel_demo_port"))
out["adbc_bad_sql"] = error(lambda: Adbc(uri, token=tok).query("SELECT nope FROM stel_demo_port"))
out["write"] = error(lambda: f.query("COPY (SELECT 1) TO '" + A["dir"] + "/x.csv'"))
out["adbc_write"] = error(lambda: Adbc(uri, token=tok).query("CREATE TABLE t AS SELECT 1"))
out["wrote"] = __import__("os").path.exists(A["dir"] + "/x.csv")
# Queries whose size does not depend on how much history the demo wrote on this machine:
# a sort of 10^8 rows needs far more than --query-memory 8MiB, and a count over 10^12 rows
# runs far longer than --query-timeout 2s (minutes, not hours, should the timeout fail).
out["memory"] = error(lambda: f.query("SELECT * FROM generate_series(1, 100000000) ORDER BY value DESC"))
out["after_memory"] = rows(f.query(good))[0]["n"]
# One query held open (first batch read, the rest waiting): the next is over --max-queries 1.
info = f.client.get_flight_info(flight.FlightDescriptor.for_command(command("CommandStatementQuery", field(1, b"SELECT * FROM generate_series(1, 1000000000000)"))), f.opts)
held = f.client.do_get(info.endpoints[0].ticket, f.opts)
held.read_chunk()
out["busy"] = error(lambda: f.query(good))
held.cancel()
# The permit comes back when the server sees the cancel: poll.
import time
deadline = time.time() + 60
while True:
    e = error(lambda: f.query(good))
    if e is None or time.time() > deadline:
        break
out["after_busy"] = e
s = Flight("grpc://" + A["slow"])
out["timeout"] = error(lambda: s.query("SELECT count(*) AS n FROM generate_series(1, 10000000000)"))
out["after_timeout"] = rows(s.query(good))[0]["n"]
print(json.dumps(out))
"#,
        &json!({"addr": limited.addr, "slow": slow.addr, "dir": dir.path()}),
    );
    let n = got["good"].as_u64().unwrap();
    assert!(n > 1000, "{got}");
    let class = |k: &str| {
        got[k][0]
            .as_str()
            .unwrap_or_else(|| panic!("{k} did not fail: {got}"))
    };
    let msg = |k: &str| got[k][1].as_str().unwrap().to_string();
    // pyarrow maps gRPC codes to its exception classes; ADBC names the code.
    assert_eq!(class("no_token"), "FlightUnauthenticatedError", "{got}");
    assert!(msg("no_token").contains("--token-file"), "{got}");
    assert_eq!(class("wrong_token"), "FlightUnauthenticatedError", "{got}");
    assert!(msg("adbc_wrong_token").contains("UNAUTHENTICATED"), "{got}");
    assert_eq!(got["basic_auth"], 1, "{got}");
    assert_eq!(class("bad_sql"), "ArrowInvalid", "{got}");
    assert!(msg("bad_sql").contains("SELEC"), "{got}");
    assert!(msg("adbc_bad_sql").contains("INVALID_ARGUMENT"), "{got}");
    assert_eq!(class("write"), "FlightUnauthorizedError", "{got}");
    assert!(msg("write").contains("read-only"), "{got}");
    assert!(msg("adbc_write").contains("read-only"), "{got}");
    assert_eq!(got["wrote"], false);
    assert!(msg("memory").contains("--query-memory"), "{got}");
    assert_eq!(got["after_memory"], n);
    assert!(msg("busy").contains("busy: 1 query is running"), "{got}");
    assert_eq!(got["after_busy"], Value::Null, "{got}");
    assert_eq!(class("timeout"), "FlightTimedOutError", "{got}");
    assert!(msg("timeout").contains("--query-timeout"), "{got}");
    assert_eq!(got["after_timeout"], n);

    let (st, err) = limited.stop();
    assert!(st.success(), "{err}");
    let c = counts(&err);
    eprintln!("limited server: {c}");
    assert!(c["unauthenticated"].as_u64().unwrap() >= 3, "{err}");
    assert_eq!(c["invalid_sql"], 2, "{err}");
    assert_eq!(c["read_only"], 2, "{err}");
    assert_eq!(c["memory"], 1, "{err}");
    assert!(c["busy"].as_u64().unwrap() >= 1, "{err}");
    assert_eq!(c["timeout"], 0, "{err}");
    assert_eq!(c["failed"], 0, "{err}");
    let (st, err) = slow.stop();
    assert!(st.success(), "{err}");
    let c = counts(&err);
    assert_eq!(c["timeout"], 1, "{err}");
    assert_eq!(c["completed"], 1, "{err}");
}

/// Expands a panel's SQL as Grafana does before the query reaches the server: Grafana's own
/// interval variable, then the FlightSQL data source's macros (grafana-plugin-sdk-go's
/// `sqlutil` defaults `$__timeFilter/$__timeFrom/$__timeTo`, and the plugin's
/// `$__dateBin/$__dateBinAlias`), with times as RFC 3339 seconds in UTC.
fn grafana_expand(sql: &str, from_ns: i64, to_ns: i64, interval_ms: i64) -> String {
    let rfc = |ns: i64| {
        chrono::DateTime::from_timestamp(ns.div_euclid(1_000_000_000), 0)
            .unwrap()
            .format("%Y-%m-%dT%H:%M:%SZ")
            .to_string()
    };
    let (from, to) = (rfc(from_ns), rfc(to_ns));
    let mut s = sql
        .replace("${__interval_ms}", &interval_ms.to_string())
        .replace("$__interval_ms", &interval_ms.to_string());
    let secs = interval_ms / 1000;
    let expand = |name: &str, args: &[&str]| -> String {
        let col = args.first().copied().unwrap_or("");
        match name {
            "timeFilter" => format!("{col} >= '{from}' AND {col} <= '{to}'"),
            "timeFrom" => format!("{col} >= '{from}'"),
            "timeTo" => format!("{col} <= '{to}'"),
            "dateBin" => format!(
                "date_bin(interval '{secs} second', {col}, timestamp '1970-01-01T00:00:00Z')"
            ),
            "dateBinAlias" => format!(
                "date_bin(interval '{secs} second', {col}, timestamp '1970-01-01T00:00:00Z') as {col}_binned"
            ),
            other => panic!("macro $__{other} is not one the FlightSQL data source expands"),
        }
    };
    // Longest names first so `$__dateBin` does not match inside `$__dateBinAlias`.
    for name in [
        "timeFilter",
        "timeFrom",
        "timeTo",
        "dateBinAlias",
        "dateBin",
    ] {
        let pat = format!("$__{name}");
        while let Some(at) = s.find(&pat) {
            let rest = &s[at + pat.len()..];
            if rest.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_') {
                break;
            }
            // Arguments between balanced parentheses.
            let (args, len) = if rest.starts_with('(') {
                let mut depth = 0;
                let end = rest
                    .char_indices()
                    .find(|(_, c)| {
                        match c {
                            '(' => depth += 1,
                            ')' => depth -= 1,
                            _ => {}
                        }
                        depth == 0
                    })
                    .map(|(i, _)| i)
                    .expect("unbalanced macro arguments");
                (rest[1..end].to_string(), end + 1)
            } else {
                (String::new(), 0)
            };
            let args: Vec<&str> = args.split(',').map(str::trim).collect();
            let with = expand(name, &args);
            s.replace_range(at..at + pat.len() + len, &with);
        }
    }
    assert!(!s.contains("$__"), "unexpanded macro left in {s}");
    s
}

#[test]
fn grafana_macros_expand_like_the_data_source() {
    let s = grafana_expand(
        "SELECT $__dateBinAlias(ts), x FROM t WHERE $__timeFilter(ts) AND f(${__interval_ms})",
        1_700_000_000_500_000_000,
        1_700_000_060_000_000_000,
        5000,
    );
    assert_eq!(
        s,
        "SELECT date_bin(interval '5 second', ts, timestamp '1970-01-01T00:00:00Z') as ts_binned, x FROM t \
         WHERE ts >= '2023-11-14T22:13:20Z' AND ts <= '2023-11-14T22:14:20Z' AND f(5000)"
    );
}

/// The extent `[first, last]` of `ts` in `table`, from the CLI.
fn extent(table: &str) -> (i64, i64) {
    let (_, rows) = cli(&[
        "sql",
        &format!("SELECT CAST(min(ts) AS BIGINT) AS a, CAST(max(ts) AS BIGINT) AS b FROM {table}"),
    ]);
    (
        rows[0]["a"].as_i64().unwrap(),
        rows[0]["b"].as_i64().unwrap(),
    )
}

#[test]
fn every_grafana_panel_runs_and_returns_what_it_plots() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/grafana");
    let mut panels = Vec::new();
    for (file, table) in [
        ("stel-ports.json", "stel_demo_port"),
        ("stel-int.json", "int_reports"),
    ] {
        let d: Value =
            serde_json::from_str(&std::fs::read_to_string(root.join(file)).unwrap()).unwrap();
        // Grafana's time picker over the data, whole seconds; its interval for ~1,000 points.
        let (a, b) = extent(table);
        let (from, to) = (a - 1_000_000_000, b + 1_000_000_000);
        let interval_ms = ((to - from) / 1_000_000 / 1000).max(1);
        for p in d["panels"].as_array().unwrap() {
            assert_eq!(
                p["datasource"]["type"], "influxdata-flightsql-datasource",
                "{file}: {}",
                p["title"]
            );
            for t in p["targets"].as_array().unwrap() {
                panels.push(json!({
                    "panel": format!("{file}: {}", p["title"].as_str().unwrap()),
                    "format": t["format"],
                    "sql": grafana_expand(t["queryText"].as_str().unwrap(), from, to, interval_ms),
                }));
            }
        }
    }
    assert!(panels.len() >= 10, "{}", panels.len());
    let s = Serve::start(&[]);
    let got = run_clients(
        r#"
c = Adbc("grpc://" + A["addr"])
out = []
for p in A["panels"]:
    t = c.query(p["sql"])
    times = t.column("time").cast(pa.int64()).to_pylist() if "time" in t.schema.names else []
    out.append({"panel": p["panel"], "rows": t.num_rows,
                "fields": [[f.name, str(f.type)] for f in t.schema],
                "sorted": times == sorted(times)})
print(json.dumps(out))
"#,
        &json!({"addr": s.addr, "panels": panels}),
    );
    for r in got.as_array().unwrap() {
        let name = r["panel"].as_str().unwrap();
        assert!(r["rows"].as_u64().unwrap() > 0, "{name}: no rows: {r}");
        let fields: Vec<(&str, &str)> = r["fields"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| (f[0].as_str().unwrap(), f[1].as_str().unwrap()))
            .collect();
        // The data source's time series format needs a `time` column and reads timestamps,
        // strings, float64 and int64 (other types arrive empty).
        let time = fields.iter().find(|f| f.0 == "time");
        assert!(
            time.is_some_and(|t| t.1.starts_with("timestamp")),
            "{name}: no timestamp `time` column: {fields:?}"
        );
        assert_eq!(r["sorted"], true, "{name}: rows not in time order");
        let values: Vec<_> = fields
            .iter()
            .filter(|f| f.0 != "time" && f.1 != "string")
            .collect();
        assert!(!values.is_empty(), "{name}: nothing to plot: {fields:?}");
        for v in values {
            assert!(
                v.1 == "double" || v.1 == "int64",
                "{name}: {} is {}, which the data source does not read",
                v.0,
                v.1
            );
        }
    }
    let (st, err) = s.stop();
    assert!(st.success(), "{err}");
    assert_eq!(counts(&err)["failed"], 0, "{err}");
}

/// Width and height from a PNG's IHDR chunk (after checking the signature).
fn png_size(b: &[u8]) -> (u32, u32) {
    assert_eq!(&b[..8], b"\x89PNG\r\n\x1a\n", "not a PNG");
    assert_eq!(&b[12..16], b"IHDR");
    let be = |o: usize| u32::from_be_bytes(b[o..o + 4].try_into().unwrap());
    (be(16), be(20))
}

#[test]
fn charts_render_as_svg_and_png() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&str, &[&str], &str); 4] = [
        ("rates", &["rates", "-r", "100ms"], "RX rate ("),
        (
            "history",
            &[
                "history",
                "-o",
                "Ethernet0",
                "-s",
                "OUT_CURR_OCCUPANCY_BYTES",
                "-r",
                "50ms",
            ],
            "counter value",
        ),
        (
            "bursts",
            &["bursts", "--threshold", "90"],
            "peak utilisation",
        ),
        ("int", &["int", "evc"], "latency (µs"),
    ];
    for (name, args, y) in cases {
        for ext in ["svg", "png"] {
            let file = dir.path().join(format!("{name}.{ext}"));
            let o = Command::new(env!("CARGO_BIN_EXE_stel-query"))
                .args(args)
                .arg("--data-dir")
                .arg(data_dir())
                .arg("--plot")
                .arg(&file)
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(o.status.success(), "{name} --plot {ext}: {err}");
            assert!(err.contains("wrote the chart"), "{err}");
            if name == "rates" {
                // Which 8 of the demo's 64 ports, and why, said once.
                assert_eq!(
                    err.matches("--plot draws the 8 interfaces with the highest peak RX rate of the 64 in the window (-o picks others)").count(),
                    1,
                    "{err}"
                );
            }
            let bytes = std::fs::read(&file).unwrap();
            assert!(bytes.len() > 10_000, "{name}.{ext}: {} bytes", bytes.len());
            if ext == "png" {
                assert_eq!(png_size(&bytes), (1280, 720), "{name}.png");
            } else {
                // Well-formed XML with an <svg> root of the size asked for, the axis texts and
                // a legend entry.
                let got = stel_testkit::python3_json(&format!(
                    r#"
import json, xml.etree.ElementTree as ET
root = ET.parse({:?}).getroot()
texts = [t.text or "" for t in root.iter() if t.tag.endswith("text")]
print(json.dumps({{"tag": root.tag, "w": root.get("width"), "h": root.get("height"), "texts": texts}}))
"#,
                    file.to_str().unwrap()
                ));
                assert!(got["tag"].as_str().unwrap().ends_with("svg"), "{got}");
                assert_eq!(
                    (got["w"].as_str(), got["h"].as_str()),
                    (Some("1280"), Some("720"))
                );
                let texts: Vec<&str> = got["texts"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|t| t.as_str().unwrap())
                    .collect();
                assert!(
                    texts.iter().any(|t| t.contains("time (UTC)")),
                    "{name}: {texts:?}"
                );
                assert!(texts.iter().any(|t| t.contains(y)), "{name}: {texts:?}");
                if name == "rates" {
                    // One unit on the rate axis (it drew `0.00 B/s` below `1000.00 MB/s`).
                    let mut units: Vec<&str> = texts
                        .iter()
                        .map(|t| t.trim())
                        .filter(|t| t.starts_with(|c: char| c.is_ascii_digit()))
                        .filter_map(|t| t.strip_suffix("/s"))
                        .filter_map(|t| t.rsplit(' ').next())
                        .collect();
                    units.sort_unstable();
                    units.dedup();
                    assert_eq!(units.len(), 1, "{name}: {texts:?}");
                }
                let legend = match name {
                    "int" => "vlan_",
                    "history" => "Ethernet0.OUT_CURR_OCCUPANCY_BYTES",
                    _ => "Ethernet",
                };
                assert!(
                    texts.iter().any(|t| t.contains(legend)),
                    "{name}: {texts:?}"
                );
            }
        }
    }
}

/// The start-up line counts and names the tables a client lists (GetTables, ADBC's
/// get_objects): the session tables and their rollup tiers, the long view, the INT tables; and
/// on a data directory with INT tables only, those (it counted the session tables alone: "3
/// tables" where clients listed 7, "0 tables" over INT tables a client could query).
#[test]
fn the_startup_line_counts_the_tables_clients_list() {
    let int_only = tempfile::tempdir().unwrap();
    for t in ["int_reports", "int_hops", "int_drops"] {
        let st = Command::new("cp")
            .arg("-a")
            .arg(data_dir().join(format!("table={t}")))
            .arg(int_only.path())
            .status()
            .unwrap();
        assert!(st.success());
    }
    for (dir, at_least) in [(data_dir(), 7), (int_only.path().to_path_buf(), 3)] {
        let s = Serve::start_on(&dir, &[]);
        let (n, named) = startup_tables(&s.line);
        let got = run_clients(
            r#"
uri = "grpc://" + A["addr"]
print(json.dumps({"adbc": Adbc(uri).tables(), "flight": Flight(uri).tables(),
                  "count": rows(Flight(uri).query("SELECT count(*) AS n FROM int_reports"))}))
"#,
            &json!({"addr": s.addr}),
        );
        let listed: Vec<String> = serde_json::from_value(got["adbc"].clone()).unwrap();
        assert_eq!(got["flight"], got["adbc"], "{dir:?}");
        assert!(listed.len() >= at_least, "{dir:?}: {listed:?}");
        assert_eq!(n, listed.len(), "{dir:?}: {} vs {listed:?}", s.line);
        assert_eq!(named, listed, "{dir:?}: {}", s.line);
        assert!(got["count"][0]["n"].as_u64().unwrap() > 0, "{dir:?}: {got}");
        let (st, err) = s.stop();
        assert!(st.success(), "{err}");
    }
}

/// An address already in use is only an error, exit 2, suggesting another --listen: no
/// "serve stopped: queries=0 …" counts of a server that never served before it.
#[test]
fn an_address_in_use_is_only_an_error() {
    let s = Serve::start(&[]);
    let o = Command::new(env!("CARGO_BIN_EXE_stel-query"))
        .args(["serve", "--listen", &s.addr, "--data-dir"])
        .arg(data_dir())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with(&format!("stel-query: cannot listen on {}: ", s.addr))
            && err.contains("another --listen"),
        "{err}"
    );
    assert!(
        o.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    let (st, err) = s.stop();
    assert!(st.success(), "{err}");
}

/// A server started before the daemon published anything (systemd starts both) waits for the
/// first files, says so once, then serves them; a data directory that does not exist is still
/// an error at once (exit 2).
#[test]
fn serve_waits_for_the_first_files() {
    let o = Command::new(env!("CARGO_BIN_EXE_stel-query"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            "/nonexistent/stel",
        ])
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );

    let serve = |dir: &Path| {
        Command::new(env!("CARGO_BIN_EXE_stel-query"))
            .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let dir = tempfile::tempdir().unwrap();
    let mut child = serve(dir.path());
    let lines = |r: Box<dyn Read + Send>| {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(r).lines().map_while(Result::ok) {
                let _ = tx.send(l);
            }
        });
        rx
    };
    let err = lines(Box::new(child.stderr.take().unwrap()));
    let out = lines(Box::new(child.stdout.take().unwrap()));
    let waiting = err.recv_timeout(Duration::from_secs(60)).unwrap();
    assert!(
        waiting.contains("nothing to serve yet")
            && waiting.contains("waiting for the daemon's first files"),
        "{waiting}"
    );
    assert!(
        child.try_wait().unwrap().is_none(),
        "serve exited on an empty data dir"
    );
    // The daemon's history appears.
    let st = Command::new("cp")
        .arg("-a")
        .arg(data_dir().join("."))
        .arg(dir.path())
        .status()
        .unwrap();
    assert!(st.success());
    let serving = out.recv_timeout(Duration::from_secs(60)).unwrap();
    assert!(
        serving.contains("serving Flight SQL on grpc://127.0.0.1:"),
        "{serving}"
    );
    assert!(startup_tables(&serving).0 > 0, "{serving}");
    // SIGTERM the moment it says it serves: a clean stop.
    sigterm(child.id());
    assert!(child.wait().unwrap().success());

    // And while it waits: a clean stop too, on SIGTERM (systemd stopping a server whose daemon
    // never came) and on SIGINT (Ctrl-C).
    for signal in ["-TERM", "-INT"] {
        let empty = tempfile::tempdir().unwrap();
        let mut child = serve(empty.path());
        let err = lines(Box::new(child.stderr.take().unwrap()));
        let waiting = err.recv_timeout(Duration::from_secs(60)).unwrap();
        assert!(waiting.contains("nothing to serve yet"), "{waiting}");
        kill(child.id(), signal);
        let status = child.wait().unwrap();
        let stopped = err
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_default();
        assert!(status.success(), "{signal}: {status:?}: {stopped}");
        assert!(
            stopped.contains("stopped before the first files came"),
            "{signal}: {stopped}"
        );
    }
}
