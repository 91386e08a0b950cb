//! The runtime image (deploy/Containerfile via deploy/container.sh): built with podman from the
//! binaries this build made, FROM scratch plus their libraries; its root file system runs the
//! demo as the image's non-root user (chroot into the image's own mount, so every library the
//! binaries need must be in the image). `podman run` is tried too: this machine's sandbox
//! refuses crun's setrlimit (EPERM), which the test reports instead of failing on — the
//! closing note and README say so.

use std::process::Command;

fn podman(args: &[&str]) -> std::process::Output {
    Command::new("podman")
        .args(args)
        .output()
        .expect("podman (Debian package podman; deploy/setup.sh --test installs it)")
}

#[test]
fn the_image_builds_and_its_root_file_system_runs_the_demo() {
    let exe = std::path::PathBuf::from(env!("CARGO_BIN_EXE_stel-ingestd"));
    let bins = tempfile::tempdir().unwrap();
    for b in ["stel-ingestd", "stel-emu"] {
        std::fs::copy(exe.with_file_name(b), bins.path().join(b)).unwrap();
    }
    let image = format!("localhost/stel-test-{}", std::process::id());
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/container.sh");
    let out = Command::new("bash")
        .arg(&script)
        .arg(bins.path())
        .arg(&image)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "container.sh: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    let c = podman(&["create", &image, "--version"]);
    assert!(c.status.success(), "{}", String::from_utf8_lossy(&c.stderr));
    let id = String::from_utf8(c.stdout).unwrap().trim().to_string();
    let m = podman(&["mount", &id]);
    assert!(m.status.success(), "{}", String::from_utf8_lossy(&m.stderr));
    let root = String::from_utf8(m.stdout).unwrap().trim().to_string();
    // The image's user (stel, 10001) runs the in-process demo from the image's files only.
    let demo = Command::new("chroot")
        .args([
            "--userspec=10001:10001",
            &root,
            "/usr/local/bin/stel-ingestd",
        ])
        .args([
            "--demo",
            "--duration",
            "1s",
            "--no-inspect",
            "--data-dir",
            "/tmp/d",
        ])
        .args(["--status-file", "/tmp/status.json"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&demo.stderr);
    assert!(
        demo.status.success() && err.contains("stopped cleanly"),
        "{err}"
    );
    let emu = Command::new("chroot")
        .args([&root, "/usr/local/bin/stel-emu", "--help"])
        .output()
        .unwrap();
    assert!(
        emu.status.success(),
        "{}",
        String::from_utf8_lossy(&emu.stderr)
    );
    let passwd = std::fs::read_to_string(format!("{root}/etc/passwd")).unwrap();
    assert!(passwd.contains("stel:x:10001:10001"), "{passwd}");

    let run = podman(&["run", "--rm", &image, "--version"]);
    let run_err = String::from_utf8_lossy(&run.stderr);
    if run.status.success() {
        assert!(String::from_utf8_lossy(&run.stdout).contains("stel-ingest"));
    } else {
        assert!(
            run_err.contains("setrlimit"),
            "podman run failed for another reason than this sandbox's rlimits: {run_err}"
        );
        eprintln!("NOTE: podman cannot start containers on this machine ({}); the image was checked by running its root file system under chroot", run_err.trim());
    }
    podman(&["umount", &id]);
    podman(&["rm", "-f", &id]);
    podman(&["rmi", "-f", &image]);
}
