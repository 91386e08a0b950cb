//! `stel-ingestd --check-config FILE`: every problem of a broken file at once (exit 2), "ok" for
//! the documented example (exit 0). Nothing is opened: no root, no sockets.

use std::process::Command;

fn check(text: &str) -> (i32, String) {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("stel-ingestd.toml");
    std::fs::write(&f, text).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_stel-ingestd"))
        .arg("--check-config")
        .arg(&f)
        .output()
        .unwrap();
    (
        out.status.code().unwrap(),
        String::from_utf8(out.stdout).unwrap(),
    )
}

#[test]
fn a_broken_file_lists_every_problem_and_exits_2() {
    let (rc, out) = check(
        r#"
[source]
kind = "usersock"
usersock_group = 40
rcvbuff_bytes = 5

[reader]
slots = "many"

[status]
file = "/tmp/stel-check/status.json"

[inspect]
socket = "/tmp/stel-check/status.json"

[parquet]
dir = "/tmp/stel-check/h"
queue_batches = 0
compression = "brotli"

[upload]
to = "/tmp/stel-check/h"

[int]
listen = ["127.0.0.1:5900", "127.0.0.1:5900"]
threads = 0

[int.decode]
max_hops = 99

[metricz]
listen = "x"
"#,
    );
    assert_eq!(rc, 2, "{out}");
    let want = [
        "metricz: unknown field `metricz`",
        "source.rcvbuff_bytes: unknown field",
        "reader.slots: invalid type",
        "parquet.compression: unknown variant `brotli`",
        "source.usersock_group = 40: must be 1..=32",
        "parquet.queue_batches must be at least 1",
        "upload.to = \"/tmp/stel-check/h\" is the history's own directory",
        "inspect.socket = \"/tmp/stel-check/status.json\" is also status.file",
        "int.listen: 127.0.0.1:5900 is listed twice",
        "int.threads = 0 must be 1..=64",
        "int.decode.max_hops = 99 must be 1..=64",
    ];
    for w in want {
        assert!(out.contains(w), "missing {w:?} in:\n{out}");
    }
    assert_eq!(out.lines().count(), want.len(), "{out}");
}

#[test]
fn the_documented_example_is_ok_and_bad_toml_is_one_problem() {
    let example = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/stel-ingestd.toml"),
    )
    .unwrap();
    assert_eq!(check(&example), (0, "ok\n".to_string()));
    let (rc, out) = check("[reader\nslots = 3\n");
    assert_eq!(rc, 2);
    assert!(out.contains("not valid TOML"), "{out}");
}
