#!/usr/bin/env bash
# Sets up and runs stel's main job on its embedded demo: the switch emulator in-process at the
# design rate (64 ports × 30 stats every 10 µs), decoded live, with port rates printed each
# second. Ctrl-C stops it. Extra arguments go to stel-ingestd (e.g. --duration 10s).
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/setup.sh
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/stel/target}"
cargo build --release -p stel-ingest --bins
exec "$CARGO_TARGET_DIR/release/stel-ingestd" --demo "$@"
