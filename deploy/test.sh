#!/usr/bin/env bash
# Sets up and runs stel's tests: formatting, clippy (warnings are errors), the whole test suite
# (as root: real netlink sockets, io_uring, the eBPF filter, a private redis-server), and smoke
# runs of the benchmarks and the demo.
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/setup.sh --test
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/stel/target}"
export CARGO_TERM_COLOR=never
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace
cargo run --release -p stel-benches --bin stel-bench -- decode --quick
cargo run --release -p stel-benches --bin stel-bench -- parquet --quick
cargo run --release -p stel-benches --bin stel-bench -- netlink --quick
cargo run --release -p stel-benches --bin stel-bench -- e2e --quick
cargo run --release -p stel-ingest --bin stel-ingestd -- --demo --duration 3s --data-dir "$(mktemp -d)"
# Not here: `stel-bench query --quick` needs a release build of DataFusion (~18 min cold on 2
# cores, on top of the debug one the tests use), which would put a cold CI run past its 90 min.
# Run it by hand: cargo run --release -p stel-benches --bin stel-bench -- query --quick
