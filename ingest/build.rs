//! Builds the stel socket filter (`ebpf/prog`, target `bpfel-unknown-none`) and hands the object
//! to `stel_ingest::filter` through `OUT_DIR/stel-ebpf.o` and `cfg(stel_ebpf)`.
//!
//! The recipe is the one measured on these machines (shared/DESIGN.md): Debian's `rustc-web`
//! (`/usr/bin/rustc`, with `rust-web-src` for `-Z build-std=core`, so `RUSTC_BOOTSTRAP=1`) and
//! `bpf-linker` 0.13.0 built against LLVM 22 (`deploy/setup.sh` installs both). The inner build has
//! its own target dir (`<target>/stel-ebpf`, shared by every profile of one target dir, so a
//! warm rebuild is a no-op) and runs with the outer build's compiler flags and wrappers removed.
//!
//! Without the toolchain the crate still builds: a loud `cargo::warning` says the filter is
//! missing and why, the reason is compiled in (`STEL_EBPF_MISSING`), and the daemon logs it at
//! start and filters in user space. `STEL_SKIP_EBPF=1` skips the inner build on purpose.
//!
//! Overrides: `STEL_EBPF_RUSTC` (default `/usr/bin/rustc`), `STEL_EBPF_CARGO` (default
//! `/usr/bin/cargo`, else the outer cargo), `STEL_EBPF_TARGET_DIR`.

use std::{
    env,
    ffi::OsString,
    fs,
    path::{Path, PathBuf},
    process::Command,
};

const TARGET: &str = "bpfel-unknown-none";

fn main() {
    println!("cargo::rustc-check-cfg=cfg(stel_ebpf)");
    println!("cargo::rerun-if-env-changed=STEL_SKIP_EBPF");
    println!("cargo::rerun-if-env-changed=STEL_EBPF_RUSTC");
    println!("cargo::rerun-if-env-changed=STEL_EBPF_CARGO");
    println!("cargo::rerun-if-env-changed=STEL_EBPF_TARGET_DIR");
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let root = manifest.parent().expect("workspace root").to_path_buf();
    let prog = root.join("ebpf/prog");
    let common = root.join("ebpf/common");
    for p in [
        prog.join("src"),
        prog.join("Cargo.toml"),
        prog.join("Cargo.lock"),
        prog.join(".cargo/config.toml"),
        common.join("src"),
        common.join("Cargo.toml"),
    ] {
        println!("cargo::rerun-if-changed={}", p.display());
    }
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR"));
    match build(&prog, &out) {
        Ok(obj) => {
            println!("cargo::rustc-cfg=stel_ebpf");
            println!("cargo::rustc-env=STEL_EBPF_OBJECT={}", obj.display());
        }
        Err(why) => {
            let why = why.replace('\n', " ");
            println!(
                "cargo::warning=eBPF SOCKET FILTER NOT BUILT: {why}. stel-ingestd will filter \
                 in user space (every message is copied to the daemon first). Install the \
                 toolchain with deploy/setup.sh."
            );
            println!("cargo::rustc-env=STEL_EBPF_MISSING={why}");
        }
    }
}

/// Builds the program; returns the object's path in `out`, or why it could not.
fn build(prog: &Path, out: &Path) -> Result<PathBuf, String> {
    if env::var_os("STEL_SKIP_EBPF").is_some_and(|v| v == "1") {
        return Err("skipped (STEL_SKIP_EBPF=1)".into());
    }
    let home = env::var_os("HOME").map(PathBuf::from);
    let cargo_home = env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| home.map(|h| h.join(".cargo")));
    let cargo_bin = cargo_home.map(|c| c.join("bin"));
    // A missing tool is looked for again when something is installed into ~/.cargo/bin.
    if let Some(b) = cargo_bin.as_ref().filter(|b| b.is_dir()) {
        println!("cargo::rerun-if-changed={}", b.display());
    }
    let linker = find_on_path("bpf-linker", cargo_bin.as_deref()).ok_or(
        "bpf-linker not found on PATH or in $CARGO_HOME/bin (cargo install bpf-linker \
         --version 0.13.0 --no-default-features --features llvm-22)",
    )?;
    println!("cargo::rerun-if-changed={}", linker.display());
    let rustc = env::var_os("STEL_EBPF_RUSTC")
        .map(PathBuf::from)
        .unwrap_or_else(|| "/usr/bin/rustc".into());
    if !rustc.is_file() {
        return Err(format!(
            "{} not found (apt-get install rustc-web rust-web-src)",
            rustc.display()
        ));
    }
    let sysroot = Command::new(&rustc)
        .args(["--print", "sysroot"])
        .output()
        .map_err(|e| format!("{} --print sysroot: {e}", rustc.display()))?;
    let sysroot = PathBuf::from(String::from_utf8_lossy(&sysroot.stdout).trim());
    let core_src = sysroot.join("lib/rustlib/src/rust/library/core");
    if !core_src.is_dir() {
        return Err(format!(
            "no Rust library source at {} for -Z build-std=core (apt-get install rust-web-src)",
            core_src.display()
        ));
    }
    let cargo = env::var_os("STEL_EBPF_CARGO")
        .map(PathBuf::from)
        .or_else(|| Some(PathBuf::from("/usr/bin/cargo")).filter(|p| p.is_file()))
        .or_else(|| env::var_os("CARGO").map(PathBuf::from))
        .ok_or("no cargo for the inner build")?;
    let target_dir = env::var_os("STEL_EBPF_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            outer_target_dir(out).map_or_else(|| out.join("ebpf-target"), |t| t.join("stel-ebpf"))
        });

    let mut path = OsString::from(linker.parent().expect("linker dir"));
    if let Some(p) = env::var_os("PATH") {
        path.push(":");
        path.push(p);
    }
    let mut cmd = Command::new(&cargo);
    cmd.current_dir(prog)
        .args(["build", "--release", "--locked", "--target", TARGET])
        .args(["-Z", "build-std=core"])
        .arg("--target-dir")
        .arg(&target_dir);
    // The inner build must not inherit the outer one's compiler, flags, wrappers (clippy-driver,
    // sccache), target or profile settings.
    for (k, _) in env::vars_os() {
        let k = k.to_string_lossy();
        let keep = matches!(k.as_ref(), "CARGO_HOME" | "CARGO_MAKEFLAGS")
            || k.starts_with("CARGO_NET_")
            || k.starts_with("CARGO_HTTP_")
            || k.starts_with("CARGO_REGISTRIES_")
            || k.starts_with("CARGO_REGISTRY_");
        let drop = (k.starts_with("CARGO") && !keep)
            || k.starts_with("RUSTC")
            || k.starts_with("RUSTFLAGS")
            || k.starts_with("RUSTDOC")
            || matches!(
                k.as_ref(),
                "TARGET" | "HOST" | "OUT_DIR" | "PROFILE" | "OPT_LEVEL" | "DEBUG" | "NUM_JOBS"
            );
        if drop {
            cmd.env_remove(k.as_ref());
        }
    }
    cmd.env("RUSTC", &rustc)
        .env("RUSTC_BOOTSTRAP", "1")
        .env("PATH", path);
    let log = out.join("stel-ebpf-build.log");
    let output = cmd
        .output()
        .map_err(|e| format!("running {}: {e}", cargo.display()))?;
    let _ = fs::write(&log, [&output.stdout[..], &output.stderr[..]].concat());
    if !output.status.success() {
        let err = String::from_utf8_lossy(&output.stderr);
        let tail: Vec<&str> = err
            .lines()
            .filter(|l| l.contains("error"))
            .take(3)
            .collect();
        return Err(format!(
            "the inner eBPF build failed ({}; full log: {}): {}",
            output.status,
            log.display(),
            tail.join(" | ")
        ));
    }
    let built = target_dir.join(TARGET).join("release/stel-ebpf");
    let obj = out.join("stel-ebpf.o");
    fs::copy(&built, &obj).map_err(|e| format!("copying {}: {e}", built.display()))?;
    Ok(obj)
}

/// The outer target dir (the ancestor of OUT_DIR that cargo marked with CACHEDIR.TAG).
fn outer_target_dir(out: &Path) -> Option<PathBuf> {
    out.ancestors()
        .find(|a| a.join("CACHEDIR.TAG").is_file())
        .map(Path::to_path_buf)
}

fn find_on_path(name: &str, extra: Option<&Path>) -> Option<PathBuf> {
    let path = env::var_os("PATH").unwrap_or_default();
    env::split_paths(&path)
        .chain(extra.map(Path::to_path_buf))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}
