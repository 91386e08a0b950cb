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
cargo run --release -p stel-benches --bin stel-bench -- query --quick
cargo run --release -p stel-benches --bin stel-bench -- netlink --quick
cargo run --release -p stel-benches --bin stel-bench -- e2e --quick
cargo run --release -p stel-ingest --bin stel-ingestd -- --demo --duration 3s
