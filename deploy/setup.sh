#!/usr/bin/env bash
# Installs what stel needs on a fresh Debian machine (idempotent; run as root or with sudo).
#   deploy/setup.sh          build prerequisites + the eBPF toolchain (the kernel filter)
#   deploy/setup.sh --test   plus what the tests use: redis-server, pyarrow + duckdb (independent
#                            Parquet readers), moto (a local S3-compatible server), pysail (Sail,
#                            a Spark Connect server), grpcio + opentelemetry-proto (a real OTLP
#                            receiver), openssl (test certificates), prometheus (a real scraper)
#                            and systemd (systemd-analyze verify of the unit)
#
# The eBPF toolchain follows the recipe measured on these machines (shared/DESIGN.md): Debian's
# rustc-web + rust-web-src + llvm-22-dev, then bpf-linker 0.13.0 built against LLVM 22. When any
# step fails the build still works, but it warns loudly and the daemon filters in user space.
set -euo pipefail
want_test=0
[ "${1:-}" = "--test" ] && want_test=1
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"

# fonts-dejavu-core: the TrueType font stel-query --plot draws its text with.
pkgs=(build-essential pkg-config ca-certificates rustc-web rust-web-src llvm-22-dev fonts-dejavu-core)
[ "$want_test" = 1 ] && pkgs+=(redis-server python3 python3-pip openssl)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
# A real Prometheus server scrapes the daemon in the tests (ingest/tests/prometheus.rs), and
# systemd-analyze checks the unit, podman builds the runtime image; none needs its recommended
# extras.
if [ "$want_test" = 1 ]; then
  test_missing=()
  for p in prometheus systemd podman; do dpkg -s "$p" >/dev/null 2>&1 || test_missing+=("$p"); done
  if [ "${#test_missing[@]}" -gt 0 ]; then
    echo "setup: installing ${test_missing[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${test_missing[@]}" >/dev/null
  fi
fi
if ! command -v cargo >/dev/null 2>&1; then
  echo "setup: cargo not found; install a Rust toolchain (rustup or Debian's rustc/cargo) first" >&2
  exit 2
fi

# bpf-linker links the kernel program (ebpf/prog). Pinned: 0.13.0 is the newest that builds with
# these machines' toolchain against LLVM 22.
if ! command -v bpf-linker >/dev/null 2>&1 || ! bpf-linker --version 2>/dev/null | grep -q '0\.13\.0'; then
  echo "setup: building bpf-linker 0.13.0 against LLVM 22 (one-time, a few minutes)"
  PATH=/usr/lib/llvm-22/bin:$PATH cargo install bpf-linker --version 0.13.0 --locked \
    --no-default-features --features llvm-22 --quiet \
    || echo "setup: WARNING: bpf-linker did not build; the eBPF filter will be missing (user-space filtering)" >&2
fi

if [ "$want_test" = 1 ]; then
  py=${STEL_PYTHON:-python3}
  if ! "$py" -c 'import pyarrow, duckdb, moto' >/dev/null 2>&1; then
    echo "setup: installing pyarrow, duckdb, moto[server] for $py"
    "$py" -m pip install --quiet --disable-pip-version-check pyarrow duckdb 'moto[server]' 2>/dev/null \
      || "$py" -m pip install --quiet --disable-pip-version-check --break-system-packages pyarrow duckdb 'moto[server]'
  fi
  # Sail (pysail): the Spark Connect server the fleet tests and `stel-bench fleet` query the lake
  # with (a 63 MB wheel with the server built in; no JVM).
  if ! command -v sail >/dev/null 2>&1; then
    echo "setup: installing pysail (Sail, a Spark Connect server) for $py"
    "$py" -m pip install --quiet --disable-pip-version-check pysail 2>/dev/null \
      || "$py" -m pip install --quiet --disable-pip-version-check --break-system-packages pysail
  fi
  # The OTLP receiver the OTLP sink's tests run (deploy/otlp_receiver.py).
  if ! "$py" -c 'import grpc, opentelemetry.proto.collector.metrics.v1.metrics_service_pb2_grpc' >/dev/null 2>&1; then
    echo "setup: installing grpcio, opentelemetry-proto for $py"
    "$py" -m pip install --quiet --disable-pip-version-check grpcio opentelemetry-proto 2>/dev/null \
      || "$py" -m pip install --quiet --disable-pip-version-check --break-system-packages grpcio opentelemetry-proto
  fi
  # The Flight SQL clients `stel-query serve` is tested with (ADBC's driver and driver manager;
  # pyarrow.flight comes with pyarrow).
  if ! "$py" -c 'import adbc_driver_flightsql.dbapi, adbc_driver_manager, pyarrow.flight' >/dev/null 2>&1; then
    echo "setup: installing adbc-driver-flightsql, adbc-driver-manager for $py"
    "$py" -m pip install --quiet --disable-pip-version-check adbc-driver-flightsql adbc-driver-manager 2>/dev/null \
      || "$py" -m pip install --quiet --disable-pip-version-check --break-system-packages adbc-driver-flightsql adbc-driver-manager
  fi
fi
echo "setup: ok"
