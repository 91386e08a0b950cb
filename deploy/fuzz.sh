#!/usr/bin/env bash
# Builds stel's fuzz targets (ingest/fuzz) with libFuzzer's coverage instrumentation on the
# stable toolchain (no cargo-fuzz, no nightly) and runs each for a while: a crash, a failed
# assertion, an arithmetic overflow or an input that runs past --timeout fails the run and keeps
# the input.
#
#   bash deploy/fuzz.sh                      # every target, 10 s each (what deploy/test.sh runs)
#   bash deploy/fuzz.sh --seconds 600 int_decode
#   bash deploy/fuzz.sh --release --seconds 3600 --corpus ~/stel-corpus decode capture_framing
#
# --release: optimised build (far more inputs per second) keeping debug assertions and overflow
# checks. --corpus DIR: keep each target's corpus in DIR/<target> across runs (default: a temp
# dir); ingest/fuzz/seeds/<target> is read as well. Crashing inputs go to DIR/crashes (or the
# temp dir), printed on failure; replay one with `<target binary> <input>`. --timeout N: an
# input running longer than N seconds (default 30) is a failure (a loop).
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=10
release=0
corpus=""
timeout=30
targets=()
while [ $# -gt 0 ]; do
    case "$1" in
    --seconds) seconds="$2"; shift 2 ;;
    --release) release=1; shift ;;
    --corpus) corpus="$2"; shift 2 ;;
    --timeout) timeout="$2"; shift 2 ;;
    -h | --help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
    esac
done
all=()
for f in ingest/fuzz/fuzz_targets/*.rs; do all+=("$(basename "$f" .rs)"); done
if [ ${#targets[@]} -eq 0 ]; then targets=("${all[@]}"); fi
for t in "${targets[@]}"; do
    if [ ! -f "ingest/fuzz/fuzz_targets/$t.rs" ]; then
        echo "fuzz.sh: no target $t (targets: ${all[*]})" >&2
        exit 2
    fi
done

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/stel/target}"
export CARGO_TERM_COLOR=never
host="$(rustc -vV | sed -n 's/^host: //p')"
# What cargo-fuzz passes (SanitizerCoverage: edge counters, PC table, compare tracing) and the
# `fuzzing` cfg. With --target the flags reach only the targets' code and their dependencies,
# not build scripts or proc macros.
flags="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4"
flags+=" -Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table"
flags+=" -Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing"
profile=debug
build=(cargo build --manifest-path ingest/fuzz/Cargo.toml --target "$host" --bins)
if [ "$release" = 1 ]; then
    flags+=" -Cdebug-assertions -Coverflow-checks"
    profile=release
    build+=(--release)
fi
echo "fuzz.sh: building ${#all[@]} targets ($profile, coverage-instrumented)"
RUSTFLAGS="$flags" "${build[@]}"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
crashes="${corpus:-$work}/crashes"
mkdir -p "$crashes"
failed=()
for t in "${targets[@]}"; do
    dir="${corpus:-$work/corpus}/$t"
    mkdir -p "$dir"
    log="$work/$t.log"
    # Committed seeds (valid inputs from stel-emu: reports of every INT format, captures, an
    # IPFIX stream) are read, never written: new inputs go to the first dir.
    seeds=()
    if [ -d "ingest/fuzz/seeds/$t" ]; then seeds=("ingest/fuzz/seeds/$t"); fi
    if "$CARGO_TARGET_DIR/$host/$profile/$t" -max_total_time="$seconds" -timeout="$timeout" \
        -seed=1 -artifact_prefix="$crashes/$t-" "$dir" "${seeds[@]}" >"$log" 2>&1; then
        echo "fuzz.sh: $t: $(grep -E '^Done [0-9]+ runs' "$log" | tail -1), corpus $(find "$dir" -type f | wc -l) inputs"
    else
        echo "fuzz.sh: $t FAILED; the end of its log:" >&2
        tail -40 "$log" >&2
        failed+=("$t")
    fi
done
if [ ${#failed[@]} -gt 0 ]; then
    # Keep the crashing inputs: the temp dir would go with the trap.
    if [ -z "$corpus" ]; then
        keep="$(mktemp -d /tmp/stel-fuzz-crashes.XXXXXX)"
        cp -a "$crashes/." "$keep/"
        crashes="$keep"
    fi
    echo "fuzz.sh: ${failed[*]} failed; inputs in $crashes" >&2
    exit 1
fi
