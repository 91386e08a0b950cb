//! Uploader tests over real files: the Parquet sink publishes into a temp data dir, the uploader
//! copies to a temp "lake" directory. (S3 against a real moto server: ingest/tests/upload.rs.)
use std::sync::Arc;

use super::*;
use crate::{
    batch::CounterBatch,
    parquet::{ParquetSink, ParquetSinkConfig},
    sai::StatKey,
    schema::{CounterColumn, SessionSchema},
};

/// The uploader's counters under the names these assertions use, read from the registry
/// snapshot (`stel_upload_*`).
#[derive(Debug)]
struct UpStats {
    files_uploaded: u64,
    bytes_uploaded: u64,
    failures: u64,
    retries: u64,
    backing_off: bool,
    vanished_files: u64,
    vanished_bytes: u64,
    pending_files: u64,
    resumed_files: u64,
    deleted_after_upload: u64,
    skipped_backfill: u64,
    scans: u64,
}

fn up_stats(s: Snapshot) -> UpStats {
    UpStats {
        files_uploaded: s.get(Metric::UploadFiles),
        bytes_uploaded: s.get(Metric::UploadBytes),
        failures: s.get(Metric::UploadFailures),
        retries: s.get(Metric::UploadRetries),
        backing_off: s.get(Metric::UploadBackingOff) == 1,
        vanished_files: s.get(Metric::UploadVanishedFiles),
        vanished_bytes: s.get(Metric::UploadVanishedBytes),
        pending_files: s.get(Metric::UploadPendingFiles),
        resumed_files: s.get(Metric::UploadResumedFiles),
        deleted_after_upload: s.get(Metric::UploadDeletedFiles),
        skipped_backfill: s.get(Metric::UploadSkippedFiles),
        scans: s.get(Metric::UploadScans),
    }
}

const T0: i64 = 1_700_000_000_000_000_000;

fn schema() -> Arc<SessionSchema> {
    let columns = (0..4u16)
        .map(|o| CounterColumn {
            label: o + 1,
            object: format!("Ethernet{}", 4 * o),
            key: StatKey {
                object_type: 1,
                stat_id: 0,
            },
        })
        .collect();
    // Escaped as lab%2F1: the key must keep the escape.
    Arc::new(SessionSchema::one_template(
        "lab/1".into(),
        "PORT".into(),
        columns,
    ))
}

/// Publishes one file of `rows` snapshots starting at `t` through the real Parquet sink.
fn publish(dir: &Path, t: i64, rows: usize) {
    let s = schema();
    let sink = ParquetSink::start(ParquetSinkConfig::for_test(dir), None).unwrap();
    sink.submit(Arc::new(CounterBatch {
        schema: Arc::clone(&s),
        ts: (0..rows as i64).map(|i| t + i * 1000).collect(),
        values: (0..rows * s.width()).map(|i| i as u64 * 7).collect(),
        part_masks: Vec::new(),
    }))
    .unwrap();
    let st = sink.shutdown().unwrap();
    assert_eq!(st.sum(Metric::SinkPublishedFiles), 1);
}

fn published(dir: &Path) -> Vec<(String, PathBuf, u64)> {
    let mut v = crate::paths::published_parts(dir);
    v.sort();
    v
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Where `UploadConfig::for_test` puts a file of relative path `rel` under `lake`.
fn in_lake(lake: &Path, rel: &str) -> PathBuf {
    lake.join(crate::paths::lake_key("test-switch", rel))
}

fn same_files(data: &Path, lake: &Path) {
    for (rel, path, _) in published(data) {
        let a = fs::read(&path).unwrap();
        let b = fs::read(in_lake(lake, &rel)).unwrap_or_else(|e| panic!("{rel}: {e}"));
        assert!(a == b, "{rel} differs");
    }
}

#[test]
fn uploads_to_a_directory_resumes_and_never_reuploads() {
    let data = tempfile::tempdir().unwrap();
    let lake = tempfile::tempdir().unwrap();
    for k in 0..3 {
        publish(data.path(), T0 + k * 3_600_000_000_000, 100); // three hours
    }
    let files = published(data.path());
    assert_eq!(files.len(), 3);
    assert!(files[0]
        .0
        .starts_with("profile=lab%2F1/group=PORT/date=2023-11-14/hour=22/part-"));
    let cfg = UploadConfig::for_test(lake.path().to_str().unwrap());
    let up = Uploader::start(cfg.clone(), data.path(), None).unwrap();
    wait_for("3 uploads", || up_stats(up.stats()).files_uploaded == 3);
    same_files(data.path(), lake.path());
    // A file published while it runs.
    publish(data.path(), T0 + 10_000_000, 50);
    wait_for("the 4th upload", || {
        up_stats(up.stats()).files_uploaded == 4
    });
    let st = up_stats(up.shutdown());
    assert_eq!(
        (st.failures, st.vanished_files, st.pending_files),
        (0, 0, 0)
    );
    let total: u64 = published(data.path())
        .iter()
        .map(|(_, p, _)| fs::metadata(p).unwrap().len())
        .sum();
    assert_eq!(st.bytes_uploaded, total);
    same_files(data.path(), lake.path());
    // No temp files left in the lake.
    let mut stack = vec![lake.path().to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(d).unwrap() {
            let e = e.unwrap();
            assert!(!e.file_name().to_string_lossy().starts_with('.'));
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            }
        }
    }
    // Restart: nothing is uploaded again; a new file is.
    publish(data.path(), T0 + 20_000_000, 50);
    let up = Uploader::start(cfg.clone(), data.path(), None).unwrap();
    wait_for("the 5th upload", || {
        up_stats(up.stats()).files_uploaded == 1
    });
    let st = up_stats(up.shutdown());
    assert_eq!((st.resumed_files, st.files_uploaded), (4, 1), "{st:?}");
    same_files(data.path(), lake.path());
    // A torn last line (crash mid-append) is not "done": that file is uploaded again.
    let state = data.path().join(STATE_FILE);
    let mut text = fs::read_to_string(&state).unwrap();
    let last = text.trim_end().rsplit('\n').next().unwrap().to_string();
    text.truncate(text.len() - 3);
    fs::write(&state, &text).unwrap();
    fs::remove_file(in_lake(lake.path(), &last)).unwrap();
    let up = Uploader::start(cfg, data.path(), None).unwrap();
    wait_for("the re-upload", || up_stats(up.stats()).files_uploaded == 1);
    let st = up_stats(up.shutdown());
    assert_eq!(st.resumed_files, 4, "{st:?}");
    same_files(data.path(), lake.path());
}

#[test]
fn a_failing_destination_is_retried_counted_and_recovered() {
    let data = tempfile::tempdir().unwrap();
    let lake_parent = tempfile::tempdir().unwrap();
    let lake = lake_parent.path().join("lake");
    publish(data.path(), T0, 100);
    let up = Uploader::start(
        UploadConfig::for_test(lake.to_str().unwrap()),
        data.path(),
        None,
    )
    .unwrap();
    wait_for("the first upload", || {
        up_stats(up.stats()).files_uploaded == 1
    });
    // The destination breaks: a plain file where the directory was (root ignores permissions,
    // so this is the failure a test can cause reliably).
    fs::remove_dir_all(&lake).unwrap();
    fs::write(&lake, b"not a directory").unwrap();
    publish(data.path(), T0 + 10_000_000, 100);
    publish(data.path(), T0 + 20_000_000, 100);
    wait_for("failures and retries", || {
        let s = up_stats(up.stats());
        s.failures >= 3 && s.retries >= 1 && s.backing_off
    });
    let s = up_stats(up.stats());
    assert_eq!((s.files_uploaded, s.pending_files), (1, 2), "{s:?}");
    assert!(up.last_error().is_some());
    // A pending file deleted locally (retention) before the destination came back: counted.
    let victim = published(data.path())[1].1.clone();
    let victim_bytes = fs::metadata(&victim).unwrap().len();
    fs::remove_file(&victim).unwrap();
    // The destination comes back.
    fs::remove_file(&lake).unwrap();
    fs::create_dir(&lake).unwrap();
    wait_for("recovery", || up_stats(up.stats()).files_uploaded == 2);
    let s = up_stats(up.shutdown());
    assert_eq!(
        (s.vanished_files, s.vanished_bytes),
        (1, victim_bytes),
        "{s:?}"
    );
    assert_eq!(s.pending_files, 0);
    // The first file was deleted with the old lake directory; the third made it.
    let third = &published(data.path())[1];
    assert_eq!(
        fs::read(in_lake(&lake, &third.0)).unwrap(),
        fs::read(&third.1).unwrap()
    );
}

#[test]
fn delete_after_upload_and_no_backfill() {
    let data = tempfile::tempdir().unwrap();
    let lake = tempfile::tempdir().unwrap();
    publish(data.path(), T0, 10);
    let old = published(data.path());
    let cfg = UploadConfig {
        backfill: false,
        delete_after_upload: true,
        ..UploadConfig::for_test(lake.path().to_str().unwrap())
    };
    let up = Uploader::start(cfg, data.path(), None).unwrap();
    wait_for("the first scan", || up_stats(up.stats()).scans >= 1);
    publish(data.path(), T0 + 1_000_000, 10);
    wait_for("one upload", || up_stats(up.stats()).files_uploaded == 1);
    let s = up_stats(up.shutdown());
    assert_eq!(
        (s.skipped_backfill, s.deleted_after_upload),
        (1, 1),
        "{s:?}"
    );
    // The old file stays local and never went to the lake; the new one moved.
    assert_eq!(published(data.path()), old);
    assert!(!in_lake(lake.path(), &old[0].0).exists());
}

#[test]
fn bad_configs_say_what_to_change() {
    let data = tempfile::tempdir().unwrap();
    let e = Uploader::start(
        UploadConfig {
            concurrency: 0,
            multipart_bytes: 1,
            ..UploadConfig::default()
        },
        data.path(),
        None,
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("to is empty") && e.contains("concurrency") && e.contains("5 MiB"),
        "{e}"
    );
    let e = Uploader::start(UploadConfig::for_test("ftp://x/y"), data.path(), None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("unsupported scheme"), "{e}");
    let inside = data.path().join("lake");
    let e = Uploader::start(
        UploadConfig::for_test(inside.to_str().unwrap()),
        data.path(),
        None,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("overlaps the data dir"), "{e}");
    let e = Uploader::start(UploadConfig::for_test("s3:///p"), data.path(), None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("no bucket"), "{e}");
}

#[test]
fn every_file_goes_under_the_switch_prefix_and_a_new_name_uploads_again() {
    let data = tempfile::tempdir().unwrap();
    let lake = tempfile::tempdir().unwrap();
    publish(data.path(), T0, 10);
    let rel = published(data.path())[0].0.clone();
    let cfg = UploadConfig {
        switch: "leaf01.dc2".into(),
        ..UploadConfig::for_test(lake.path().to_str().unwrap())
    };
    let st = Uploader::start(cfg.clone(), data.path(), None).unwrap();
    wait_for("one upload", || up_stats(st.stats()).files_uploaded == 1);
    assert_eq!(st.switch(), "leaf01.dc2");
    st.shutdown();
    let key = format!("switch=leaf01.dc2/{rel}");
    assert!(lake.path().join(&key).exists(), "{key}");
    // The state file's destination is the switch's own root.
    let state = fs::read_to_string(data.path().join(STATE_FILE)).unwrap();
    let header = format!(
        "{STATE_HEADER}{}/switch=leaf01.dc2\n",
        lake.path().display()
    );
    assert!(state.starts_with(&header), "{state}");
    // Renamed switch: another destination, so the history goes again under the new name.
    let renamed = UploadConfig {
        switch: "leaf01".into(),
        ..cfg
    };
    let st = Uploader::start(renamed, data.path(), None).unwrap();
    wait_for("the upload under the new name", || {
        up_stats(st.stats()).files_uploaded == 1
    });
    let s = up_stats(st.shutdown());
    assert_eq!(s.resumed_files, 0, "{s:?}");
    assert!(lake.path().join(format!("switch=leaf01/{rel}")).exists());
}

#[test]
fn the_switch_name_comes_from_config_then_parquet_then_host() {
    let mut c = UploadConfig::for_test("/x");
    assert_eq!(
        resolve_switch(&mut c, Some("p"), None),
        SwitchSource::Config
    );
    assert_eq!(c.switch, "test-switch");
    c.switch.clear();
    assert_eq!(
        resolve_switch(&mut c, Some(" spine-1 "), None),
        SwitchSource::ParquetSink
    );
    assert_eq!(c.switch, "spine-1");
    c.switch.clear();
    assert_eq!(resolve_switch(&mut c, None, None), SwitchSource::HostName);
    assert_eq!(c.switch, host_name());
    assert_eq!(
        lake_root("s3://lake/stel/", "a b"),
        "s3://lake/stel/switch=a%20b"
    );
}

/// SONiC's own name for the switch, from a real redis-server's CONFIG_DB.
#[cfg(feature = "redis")]
#[test]
fn the_switch_name_comes_from_config_db_when_redis_is_configured() {
    let r = stel_testkit::redis::TestRedis::start();
    let mut c = r.connect(CONFIG_DB);
    let mut cfg = UploadConfig::for_test("/x");
    cfg.switch.clear();
    // No DEVICE_METADATA yet: the host name.
    assert_eq!(
        resolve_switch(&mut cfg, None, Some(r.url())),
        SwitchSource::HostName
    );
    redis::cmd("HSET")
        .arg("DEVICE_METADATA|localhost")
        .arg("hostname")
        .arg("sonic-leaf-07")
        .query::<()>(&mut c)
        .unwrap();
    cfg.switch.clear();
    assert_eq!(
        resolve_switch(&mut cfg, None, Some(r.url())),
        SwitchSource::ConfigDb
    );
    assert_eq!(cfg.switch, "sonic-leaf-07");
    // The Parquet sink's explicit name wins over CONFIG_DB (it is what the files' footers say).
    cfg.switch.clear();
    assert_eq!(
        resolve_switch(&mut cfg, Some("lab"), Some(r.url())),
        SwitchSource::ParquetSink
    );
    // A Redis that is not there: logged, the host name.
    cfg.switch.clear();
    assert_eq!(
        resolve_switch(&mut cfg, None, Some("unix:///nonexistent/redis.sock")),
        SwitchSource::HostName
    );
}

#[test]
fn backoff_doubles_and_caps() {
    assert_eq!(backoff(100, 1000, 1), Duration::from_millis(100));
    assert_eq!(backoff(100, 1000, 3), Duration::from_millis(400));
    assert_eq!(backoff(100, 1000, 30), Duration::from_millis(1000));
}

/// S3 reports a missing bucket and a missing key both as object_store's "not found"; the
/// bucket's is told apart by its error code and named, without the key.
#[test]
fn a_missing_bucket_is_named_as_such() {
    let key = ObjectPath::parse("stel/switch=a/x.parquet").unwrap();
    let e = "Object at location stel/switch=a/x.parquet not found: Client error with status 404 \
             Not Found: <Error><Code>NoSuchBucket</Code></Error>";
    let lake = S3Facts {
        bucket: "lake".into(),
        http_refused: None,
    };
    assert_eq!(
        explain_store_error(&lake, &key, e),
        "bucket lake does not exist (NoSuchBucket: create the bucket, or check [upload] to)"
    );
    let e = "Object at location stel/switch=a/x.parquet not found: <Code>NoSuchKey</Code>";
    assert_eq!(
        explain_store_error(&lake, &key, e),
        format!("stel/switch=a/x.parquet: {e}")
    );
}

/// No credentials: object_store asks the EC2 metadata endpoint, which is what its error names;
/// the error says credentials are missing and where they come from. A plain-http endpoint
/// without AWS_ALLOW_HTTP=true: the error says to set it.
#[test]
fn missing_credentials_and_a_refused_http_endpoint_say_what_to_set() {
    let key = ObjectPath::parse("stel/x.parquet").unwrap();
    let e = "Generic S3 error: Error performing PUT http://169.254.169.254/latest/api/token in \
             2ms - Server returned non-2xx status code: 403 Forbidden";
    let got = explain_store_error(&S3Facts::default(), &key, e);
    assert!(
        got.starts_with(
            "no AWS credentials found (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, \
             AWS_WEB_IDENTITY_TOKEN_FILE with AWS_ROLE_ARN, or an instance role; ~/.aws \
             profiles are not read): stel/x.parquet: Generic S3 error"
        ),
        "{got}"
    );
    let http = S3Facts {
        bucket: "lake".into(),
        http_refused: Some("http://127.0.0.1:9000".into()),
    };
    let e = "Generic S3 error: Error performing PUT http://127.0.0.1:9000/lake/stel/x.parquet in \
             65us - HTTP error: builder error";
    assert_eq!(
        explain_store_error(&http, &key, e),
        format!(
            "the endpoint http://127.0.0.1:9000 is plain http: set AWS_ALLOW_HTTP=true to use it: \
             stel/x.parquet: {e}"
        )
    );
}
