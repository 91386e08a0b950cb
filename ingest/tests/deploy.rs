//! The shipped systemd unit: `systemd-analyze verify` accepts it with no warning (unknown keys
//! are only warnings there, so any stderr output fails the test), pointed at the binary built
//! here, and it keeps the dedicated user, the capabilities and the hardening the README promises
//! (`tests/hostile.rs` runs the binary with exactly the unit's user and ambient capabilities).

#[test]
fn systemd_unit_verifies_clean_with_capabilities_and_hardening() {
    let unit = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/stel-ingestd.service"),
    )
    .unwrap();
    for key in [
        "User=stel",
        "Group=stel",
        "UMask=0027",
        "AmbientCapabilities=CAP_NET_ADMIN CAP_BPF CAP_PERFMON",
        "CapabilityBoundingSet=CAP_NET_ADMIN CAP_BPF CAP_PERFMON",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "ReadWritePaths=/var/lib/stel /run/stel",
        "Restart=on-failure",
        "LimitMEMLOCK=infinity",
    ] {
        assert!(unit.lines().any(|l| l == key), "the unit lost {key:?}");
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("stel-ingestd.service");
    std::fs::write(
        &path,
        unit.replace(
            "/usr/local/bin/stel-ingestd",
            env!("CARGO_BIN_EXE_stel-ingestd"),
        ),
    )
    .unwrap();
    let out = std::process::Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(&path)
        .output()
        .expect("systemd-analyze (Debian package systemd) is needed to check the unit");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && err.trim().is_empty(), "{err}");
}
