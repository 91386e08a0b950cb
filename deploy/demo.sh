#!/usr/bin/env bash
# Sets up and runs stel's main job on its embedded demo: the switch emulator in-process at the
# design rate (64 ports × 30 stats every 10 µs), decoded live, port rates printed each second,
# history written to ./stel-data. Ctrl-C stops it; then it prints the stel-query commands that
# ask the history it wrote. Extra arguments go to stel-ingestd (e.g. --duration 10s,
# --pattern microburst, --data-dir DIR).
#
# stel-query (DataFusion) is built in the background at idle priority while the demo runs, so
# the demo keeps the CPU; whatever is left of that build finishes after the demo stops.
set -euo pipefail
cd "$(dirname "$0")/.."
for a in "$@"; do
    case "$a" in
        -h | --help)
            cat <<'EOF'
Usage: bash deploy/demo.sh [STEL-INGESTD OPTIONS]

Installs what it needs (deploy/setup.sh), builds stel-ingestd and runs it on its embedded demo:
the switch emulator in-process at the design rate (64 ports x 30 stats every 10 us), port rates
printed each second, history written to ./stel-data. Ctrl-C (or --duration) stops it; then it
prints the stel-query commands that ask the history it wrote (stel-query is built meanwhile at
idle priority). Safe to run again.

The options go to `stel-ingestd --demo`, for example:
  bash deploy/demo.sh --duration 10s
  bash deploy/demo.sh --pattern microburst --data-dir /tmp/burst
  bash deploy/demo.sh --interval 1ms --metrics 127.0.0.1:9464

Every option: stel-ingestd --help (after a first run, ~/.cache/stel/target/release/stel-ingestd).
EOF
            exit 0
            ;;
    esac
done
bash deploy/setup.sh
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/stel/target}"
cargo build --release -p stel-ingest --bins

# Where the demo writes (what stel-ingestd will use): --data-dir from the arguments, else ./stel-data.
data="$PWD/stel-data"
prev=""
for a in "$@"; do
    case "$a" in
        --data-dir=*) data="${a#--data-dir=}" ;;
        *) [ "$prev" = "--data-dir" ] && data="$a" ;;
    esac
    prev="$a"
done
data="$(realpath -m "$data")"

# stel-query in the background, in its own session (Ctrl-C is the demo's, not the build's) and
# at idle priority (the demo's threads win every contended moment).
qlog="$CARGO_TARGET_DIR/stel-query-build.log"
mkdir -p "$CARGO_TARGET_DIR"
setsid nice -n 19 cargo build --profile release-query -p stel-query --bin stel-query >"$qlog" 2>&1 &
qpid=$!
started=$(date +%s)

# Ctrl-C stops the daemon (same process group); this script carries on to the next steps.
trap 'true' INT
rc=0
"$CARGO_TARGET_DIR/release/stel-ingestd" --demo "$@" || rc=$?
trap - INT
if [ "$rc" -ne 0 ] && [ "$rc" -ne 130 ]; then
    echo "demo: stel-ingestd exited with status $rc; not waiting for stel-query" >&2
    kill -- "-$qpid" 2>/dev/null || true
    exit "$rc"
fi

if kill -0 "$qpid" 2>/dev/null; then
    renice -n 0 -g "$qpid" >/dev/null 2>&1 || true
    echo "demo: finishing the stel-query build (running for $(( $(date +%s) - started )) s; log: $qlog)" >&2
fi
if ! wait "$qpid"; then
    echo "demo: building stel-query failed; the last lines of $qlog:" >&2
    tail -n 20 "$qlog" >&2
    exit 2
fi

q="$CARGO_TARGET_DIR/release-query/stel-query"
cat <<EOF

The demo's history is in $data. Ask it (stel-query is $q):

  export PATH="$CARGO_TARGET_DIR/release-query:\$PATH"
  stel-query rates -d $data                         # port rates and utilisation, last minute of data
  stel-query rates -d $data --last 1s -r 100ms      # the last second, in 100 ms steps
  stel-query bursts -d $data --threshold 90         # microbursts above 90 % of line rate
  stel-query top -d $data --by bursts               # ports that spent longest in microbursts
  stel-query history -d $data -o Ethernet0 -s IF_IN_OCTETS,IF_OUT_DISCARDS --last 1s -r 100ms
  stel-query sql -d $data "SELECT count(*) AS snapshots FROM stel_demo_port"

DuckDB and pyarrow read the same files: the raw snapshots are
$data/profile=*/group=*/**/*.parquet, the rollup tiers $data/tier=*/**/*.parquet.
EOF
