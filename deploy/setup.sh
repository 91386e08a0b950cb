#!/usr/bin/env bash
# Installs what stel needs on a fresh Debian machine (idempotent; run as root or with sudo).
#   deploy/setup.sh          build prerequisites
#   deploy/setup.sh --test   plus what the tests use (today the same; Redis and pyarrow join with their tests)
set -euo pipefail
want_test=0
[ "${1:-}" = "--test" ] && want_test=1
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
pkgs=(build-essential pkg-config ca-certificates)
# (--test adds redis-server and pyarrow once the Redis and Parquet tests land.)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
if ! command -v cargo >/dev/null 2>&1; then
  echo "setup: cargo not found; install a Rust toolchain (rustup or Debian's rustc/cargo) first" >&2
  exit 2
fi
echo "setup: ok"
