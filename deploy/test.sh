#!/usr/bin/env bash
# Sets up and runs stel's tests: formatting, clippy (warnings are errors), the whole test suite
# (as root: real netlink sockets, io_uring, the eBPF filter, a private redis-server), a short run
# of every fuzz target, and smoke runs of the benchmarks and the demo.
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/setup.sh --test
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/stel/target}"
export CARGO_TERM_COLOR=never
# A persistent target dir grows with every dependency or compiler change (old artifacts are never
# removed) and a full disk shows up as a linker "Bus error" halfway through. Below 8 GiB free,
# drop the incremental caches, then the whole dir if that was not enough; a cold build follows.
free_gib() { mkdir -p "$CARGO_TARGET_DIR"; df -Pk "$CARGO_TARGET_DIR" | awk 'NR==2 {print int($4 / 1048576)}'; }
if [ "$(free_gib)" -lt 8 ]; then
    echo "test.sh: $(free_gib) GiB free under $CARGO_TARGET_DIR; removing incremental build caches"
    rm -rf "$CARGO_TARGET_DIR"/debug/incremental "$CARGO_TARGET_DIR"/release/incremental
    if [ "$(free_gib)" -lt 8 ]; then
        echo "test.sh: still $(free_gib) GiB free; cargo clean (this run builds from scratch)"
        cargo clean
    fi
fi
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace
# Every fuzz target built with coverage instrumentation and fuzzed 10 s from its seeds (debug:
# assertions and overflow checks on): ~4-5 min cold (the instrumented build), ~1.5 min warm.
bash deploy/fuzz.sh --seconds 10
cargo run --release -p stel-benches --bin stel-bench -- decode --quick
cargo run --release -p stel-benches --bin stel-bench -- parquet --quick
cargo run --release -p stel-benches --bin stel-bench -- netlink --quick
cargo run --release -p stel-benches --bin stel-bench -- e2e --quick
cargo run --release -p stel-benches --bin stel-bench -- otlp --quick
cargo run --release -p stel-benches --bin stel-bench -- int --quick
cargo run --release -p stel-ingest --bin stel-ingestd -- --demo --duration 3s --data-dir "$(mktemp -d)"
# 100 switches (release daemons, uploading to moto) and 100 switches x 24 h of the 1 min tier,
# queried on Sail and locally (debug stel-query, built by the tests above): ~2 min.
cargo run --release -p stel-benches --bin stel-bench -- fleet --quick
# Not here: `stel-bench query --quick` needs a release build of DataFusion (~18 min cold on 2
# cores, on top of the debug one the tests use), which would put a cold CI run past its 90 min.
# Run it by hand: cargo run --release -p stel-benches --bin stel-bench -- query --quick
# (it builds stel-query-bench in the release-query profile: no cross-crate LTO, see Cargo.toml).
