//! The data-lake uploader end to end: the real `stel-ingestd --demo` (emulator → socket →
//! reader → decoder → Parquet history → uploader) copying to a local directory and to a real S3
//! server (moto's server mode, started here; the test fails, never skips, if it cannot start).
//! What arrived is read back with pyarrow and compared with the local files.

use std::{
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;
use stel_testkit::{free_port, s3_client_env, MotoS3};

/// Runs the demo daemon for `secs` with `extra` config (TOML) under `dir`; returns its status.
fn run_daemon(dir: &Path, extra: &str, secs: u32, env: &[(&str, &str)]) -> Value {
    let (child, status) = spawn_daemon(dir, extra, secs, env);
    finish(child, &status)
}

fn spawn_daemon(dir: &Path, extra: &str, secs: u32, env: &[(&str, &str)]) -> (Child, String) {
    let data = dir.join("data");
    let status = data.join("status.json");
    let cfg = dir.join("stel-ingestd.toml");
    std::fs::write(
        &cfg,
        format!(
            "[parquet]\ndir = {data:?}\nflush_interval_ms = 400\n[status]\nfile = {status:?}\n[rollup]\nenabled = true\n{extra}\n"
        ),
    )
    .unwrap();
    let mut c = Command::new(env!("CARGO_BIN_EXE_stel-ingestd"));
    c.args(["--config", cfg.to_str().unwrap(), "--demo", "--no-ebpf"])
        .args(["--ports", "8", "--stats", "10", "--interval", "1ms"])
        .args(["--decoders", "1", "--duration", &format!("{secs}s")])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for (k, v) in env {
        c.env(k, v);
    }
    (
        c.spawn().expect("stel-ingestd"),
        status.display().to_string(),
    )
}

fn finish(child: Child, status: &str) -> Value {
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "stel-ingestd failed:\n{err}");
    let st: Value = serde_json::from_str(&std::fs::read_to_string(status).unwrap()).unwrap();
    eprintln!(
        "{}",
        err.lines()
            .filter(|l| l.contains("upload"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    st
}

/// The lake's switch name the tests configure (`[upload] switch`).
const SWITCH: &str = "leaf-01.lab";

/// Compares every published file with its copy in the lake — under `switch=<SWITCH>/`, rollup
/// tiers under `_tiers/tier=<t>/switch=<SWITCH>/` (bytes and pyarrow tables; nothing else in
/// the lake; with `tiers_only`, the tiers alone); returns (files, rows).
fn compare(data: &Path, dest: &str, env: &[(&str, &str)], tiers_only: bool) -> (u64, u64) {
    const SCRIPT: &str = r#"
import io, os, sys
import pyarrow.parquet as pq
data, dest, switch = sys.argv[1], sys.argv[2], sys.argv[3]
def walk(root):
    out = {}
    for d, _, files in os.walk(root):
        for f in files:
            if f.startswith("part-") and f.endswith(".parquet"):
                p = os.path.join(d, f)
                out[os.path.relpath(p, root)] = open(p, "rb").read()
    return out
local = walk(data)
if sys.argv[4] == "tiers":
    local = {k: v for k, v in local.items() if k.startswith("tier=")}
if dest.startswith("s3://"):
    import boto3
    bucket, _, prefix = dest[5:].partition("/")
    s3 = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"], region_name="us-east-1")
    remote = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/"):
        for o in page.get("Contents", []):
            remote[o["Key"][len(prefix) + 1:]] = s3.get_object(Bucket=bucket, Key=o["Key"])["Body"].read()
else:
    remote = walk(dest)
assert local, "no local files"
# Every uploaded key is switch=<name>/<the data dir's relative path>, or for a tier
# _tiers/tier=<t>/switch=<name>/<the rest of it>.
sw = "switch=" + switch + "/"
def local_rel(k):
    if k.startswith(sw):
        return k[len(sw):]
    parts = k.split("/")
    assert parts[0] == "_tiers" and parts[1].startswith("tier=") and parts[2] + "/" == sw, k
    return "/".join([parts[1]] + parts[3:])
remote = {local_rel(k): v for k, v in remote.items()}
assert sorted(local) == sorted(remote), (sorted(set(local) ^ set(remote)))
rows = 0
for k, b in local.items():
    a, r = pq.read_table(io.BytesIO(b)), pq.read_table(io.BytesIO(remote[k]))
    assert a.equals(r) and a.schema.metadata == r.schema.metadata, k
    assert b == remote[k], k
    rows += a.num_rows
print(len(local), rows)
"#;
    let mut c = stel_testkit::python3(SCRIPT);
    c.args([
        data.to_str().unwrap(),
        dest,
        SWITCH,
        if tiers_only { "tiers" } else { "all" },
    ]);
    for (k, v) in env {
        c.env(k, v);
    }
    let o = c
        .output()
        .expect("python3 (pyarrow, boto3: deploy/setup.sh --test)");
    assert!(
        o.status.success(),
        "comparison failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let out = String::from_utf8_lossy(&o.stdout);
    let mut it = out.split_whitespace().map(|x| x.parse::<u64>().unwrap());
    (it.next().unwrap(), it.next().unwrap())
}

#[test]
fn daemon_uploads_every_published_file_to_a_directory() {
    let dir = tempfile::tempdir().unwrap();
    let lake = dir.path().join("lake");
    let extra = format!(
        "[upload]\nto = {:?}\nscan_interval_ms = 200\nswitch = {SWITCH:?}\n",
        lake.display()
    );
    let st = run_daemon(dir.path(), &extra, 3, &[]);
    let up = &st;
    let pq = &st;
    assert_eq!(metric(up, "stel_upload_failures_total"), 0, "{up}");
    assert_eq!(up["info"]["components"]["upload"]["switch"], SWITCH, "{up}");
    assert_eq!(metric(up, "stel_upload_pending_files"), 0, "{up}");
    assert_eq!(metric(up, "stel_upload_vanished_files_total"), 0, "{up}");
    assert_eq!(
        metric(up, "stel_upload_files_total"),
        metric(pq, "stel_sink_published_files_total"),
        "{up}\n{pq}"
    );
    // Raw files and the rollup tiers beside them (stel_sink_published_files_total counts both).
    assert_eq!(
        metric(up, "stel_upload_bytes_total"),
        metric(pq, "stel_parquet_published_bytes_total")
            + metric(pq, "stel_rollup_published_bytes_total"),
        "{up}\n{pq}"
    );
    assert!(metric(pq, "stel_rollup_published_bytes_total") > 0);
    let (files, rows) = compare(&dir.path().join("data"), lake.to_str().unwrap(), &[], false);
    assert_eq!(files, metric(pq, "stel_sink_published_files_total"));
    assert_eq!(
        rows,
        metric(pq, "stel_parquet_written_rows_total")
            + metric(pq, "stel_rollup_written_rows_total")
    );
    // A restart uploads only what is new.
    let st = run_daemon(dir.path(), &extra, 2, &[]);
    let up = &st;
    assert_eq!(metric(up, "stel_upload_resumed_files"), files, "{up}");
    assert_eq!(
        metric(up, "stel_upload_files_total"),
        metric(&st, "stel_sink_published_files_total")
    );
    compare(&dir.path().join("data"), lake.to_str().unwrap(), &[], false);
}

#[test]
fn daemon_uploads_to_s3_and_rides_out_an_outage() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let env = s3_client_env(&url);
    // The daemon starts while the S3 server is not there yet: uploads fail, are counted, and
    // are retried with backoff; once it is up, everything goes through.
    let extra = format!("[upload]\nto = \"s3://lake/stel\"\nscan_interval_ms = 200\nretry_initial_ms = 100\nretry_max_ms = 400\nswitch = {SWITCH:?}\n");
    let (child, status) = spawn_daemon(dir.path(), &extra, 6, &env);
    let deadline = Instant::now() + Duration::from_secs(20);
    let down = loop {
        let st: Option<Value> = std::fs::read_to_string(&status)
            .ok()
            .and_then(|s| serde_json::from_str(&s).ok());
        if let Some(st) = st.filter(|s| metric(s, "stel_upload_failures_total") >= 2) {
            break st;
        }
        assert!(
            Instant::now() < deadline,
            "no upload failures while S3 is down"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(metric(&down, "stel_upload_files_total"), 0);
    assert!(down["info"]["components"]["upload"]["last_error"].is_string());
    let _moto = MotoS3::start_on(port, "lake");
    let st = finish(child, &status);
    let up = &st;
    let pq = &st;
    assert!(metric(up, "stel_upload_failures_total") >= 2, "{up}");
    assert!(metric(up, "stel_upload_retries_total") >= 1, "{up}");
    assert_eq!(metric(up, "stel_upload_pending_files"), 0, "{up}");
    assert_eq!(metric(up, "stel_upload_vanished_files_total"), 0, "{up}");
    assert_eq!(
        metric(up, "stel_upload_files_total"),
        metric(pq, "stel_sink_published_files_total"),
        "{up}\n{pq}"
    );
    let (files, rows) = compare(&dir.path().join("data"), "s3://lake/stel", &env, false);
    assert_eq!(files, metric(pq, "stel_sink_published_files_total"));
    assert_eq!(
        rows,
        metric(pq, "stel_parquet_written_rows_total")
            + metric(pq, "stel_rollup_written_rows_total")
    );
}

/// `[upload] raw = false` to a real S3 server: the tiers go to the lake (same `switch=`
/// partition, under `_tiers/`), byte for byte; the raw stream stays on the switch.
#[test]
fn raw_upload_off_sends_only_the_rollup_tiers() {
    let dir = tempfile::tempdir().unwrap();
    let moto = MotoS3::start("lake");
    let url = moto.url();
    let env = s3_client_env(&url);
    let extra = format!(
        "[upload]\nto = \"s3://lake/stel\"\nscan_interval_ms = 200\nswitch = {SWITCH:?}\nraw = false\n"
    );
    let st = run_daemon(dir.path(), &extra, 3, &env);
    assert_eq!(metric(&st, "stel_upload_failures_total"), 0, "{st}");
    assert_eq!(metric(&st, "stel_upload_pending_files"), 0, "{st}");
    assert!(
        metric(&st, "stel_parquet_published_bytes_total") > 0,
        "{st}"
    );
    assert_eq!(
        metric(&st, "stel_upload_bytes_total"),
        metric(&st, "stel_rollup_published_bytes_total"),
        "{st}"
    );
    // Every tier file and nothing else, under _tiers/tier=<t>/switch=<name>/.
    let (files, rows) = compare(&dir.path().join("data"), "s3://lake/stel", &env, true);
    assert_eq!(files, metric(&st, "stel_upload_files_total"), "{st}");
    assert_eq!(rows, metric(&st, "stel_rollup_written_rows_total"), "{st}");
    for t in ["1s", "1m"] {
        assert!(dir.path().join(format!("data/tier={t}")).is_dir(), "{t}");
    }
}

/// `[upload] to` a bucket that does not exist (on a real S3 server, moto): while it runs, the
/// status line says `| UPLOAD FAILING (s3://…: bucket … does not exist (NoSuchBucket: …))`, and
/// the last line says how many files were not uploaded, where and why (`| UPLOAD PENDING N`);
/// the files stay in the data dir. It logged "Object at location … not found" and ended
/// "stopped cleanly" (exit 0 kept: the history was written).
#[test]
fn a_bucket_that_does_not_exist_is_on_the_status_line_and_the_last_line() {
    let dir = tempfile::tempdir().unwrap();
    let moto = MotoS3::start("lake");
    let url = moto.url();
    let (err, st) = run_failing_upload(dir.path(), &s3_client_env(&url));
    let data = dir.path().join("data");
    let why = "bucket no-such-bucket does not exist (NoSuchBucket: create the bucket, or check \
               [upload] to)";
    let failing = format!("| UPLOAD FAILING (s3://no-such-bucket/stel: {why})");
    assert!(
        err.lines()
            .any(|l| l.contains(" M counters/s ") && l.ends_with(&failing)),
        "{err}"
    );
    let pending = metric(&st, "stel_upload_pending_files");
    assert!(pending >= 1, "{st}");
    assert_eq!(metric(&st, "stel_upload_files_total"), 0, "{st}");
    let last = err.lines().last().unwrap_or_default();
    assert_eq!(
        last.split_once(", but ").map(|(_, b)| b),
        Some(
            format!(
                "{pending} files were not uploaded to s3://no-such-bucket/stel ({why}; they stay \
                 in the data dir and are uploaded at the next start) | UPLOAD PENDING {pending}"
            )
            .as_str()
        ),
        "{err}"
    );
    assert!(last.starts_with("stel-ingestd: stopped: "), "{err}");
    // Still there, for the next start.
    let parts = stel_store::paths::published_parts(&data);
    assert!(parts.len() as u64 >= pending, "{parts:?}");
}

/// Runs a 4 s demo with its status line whose uploads to `s3://no-such-bucket/stel` fail
/// (`env`: the S3 settings; other AWS_* credentials removed); exit 0. Returns stderr and the
/// final status.
fn run_failing_upload(dir: &Path, env: &[(&str, &str)]) -> (String, Value) {
    let data = dir.join("data");
    let status = data.join("status.json");
    let cfg = dir.join("stel-ingestd.toml");
    std::fs::write(
        &cfg,
        format!(
            "[parquet]\ndir = {data:?}\nflush_interval_ms = 400\n[status]\nfile = {status:?}\n\
             [upload]\nto = \"s3://no-such-bucket/stel\"\nscan_interval_ms = 200\n\
             retry_initial_ms = 100\nretry_max_ms = 400\nshutdown_timeout_ms = 1000\n\
             switch = {SWITCH:?}\n"
        ),
    )
    .unwrap();
    let mut c = Command::new(env!("CARGO_BIN_EXE_stel-ingestd"));
    c.args(["--config", cfg.to_str().unwrap(), "--demo", "--no-ebpf"])
        .args(["--no-inspect", "--ports", "2", "--stats", "2"])
        .args([
            "--interval",
            "1ms",
            "--duration",
            "4s",
            "--status-line",
            "on",
        ]);
    for k in [
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        "AWS_ALLOW_HTTP",
    ] {
        c.env_remove(k);
    }
    let o = c.envs(env.iter().copied()).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "{err}");
    let st = serde_json::from_str(&std::fs::read_to_string(&status).unwrap()).unwrap();
    (err, st)
}

/// No AWS credentials at all: object_store asks the EC2 metadata endpoint (here a closed port,
/// through AWS_METADATA_ENDPOINT), and the error said only that a PUT to
/// `…/latest/api/token` failed; now it says credentials were not found and where they come
/// from. A plain-http endpoint without AWS_ALLOW_HTTP=true ("HTTP error: builder error") says
/// to set it. Both on the status line and the last line.
#[test]
fn missing_credentials_and_a_refused_http_endpoint_say_what_to_set() {
    let moto = MotoS3::start("lake");
    let url = moto.url();
    let metadata = format!("http://127.0.0.1:{}", free_port());
    let no_credentials = [
        ("AWS_ENDPOINT_URL", url.as_str()),
        ("AWS_REGION", "us-east-1"),
        ("AWS_ALLOW_HTTP", "true"),
        ("AWS_METADATA_ENDPOINT", metadata.as_str()),
    ];
    let no_allow_http = [
        ("AWS_ENDPOINT_URL", url.as_str()),
        ("AWS_REGION", "us-east-1"),
        ("AWS_ACCESS_KEY_ID", "k"),
        ("AWS_SECRET_ACCESS_KEY", "s"),
    ];
    let cases: [(&[(&str, &str)], String); 2] = [
        (
            &no_credentials,
            "no AWS credentials found (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, \
             AWS_WEB_IDENTITY_TOKEN_FILE with AWS_ROLE_ARN, or an instance role; ~/.aws profiles \
             are not read): "
                .to_string(),
        ),
        (
            &no_allow_http,
            format!("the endpoint {url} is plain http: set AWS_ALLOW_HTTP=true to use it: "),
        ),
    ];
    for (env, hint) in cases {
        let dir = tempfile::tempdir().unwrap();
        let (err, _) = run_failing_upload(dir.path(), env);
        let failing = format!("| UPLOAD FAILING (s3://no-such-bucket/stel: {hint}");
        assert!(
            err.lines()
                .any(|l| l.contains(" M counters/s ") && l.contains(&failing)),
            "{err}"
        );
        let last = err.lines().last().unwrap_or_default();
        assert!(
            last.contains(&format!(
                " files were not uploaded to s3://no-such-bucket/stel ({hint}"
            )),
            "{err}"
        );
    }
}

/// The sum of a metric's series in a status-file sink section (the registry's JSON form).
/// A registry series of a status file, summed over its labels (0 when not registered).
fn metric(st: &Value, name: &str) -> u64 {
    let m =
        stel_store::metrics::Metric::by_name(name).unwrap_or_else(|| panic!("no metric {name}"));
    stel_store::metrics::Snapshot::from_json(&st["metrics"]).sum(m)
}
