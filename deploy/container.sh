#!/usr/bin/env bash
# Builds the stel runtime image (deploy/Containerfile, FROM scratch) from binaries already built
# in BIN_DIR: stel-ingestd and stel-emu (required), stel-query (when present). Their shared
# libraries come from ldd; a passwd/group entry for the non-root user stel (10001) and its data
# directory are added. Usage: deploy/container.sh BIN_DIR [IMAGE]   (default image: localhost/stel)
set -euo pipefail
bin_dir=${1:?usage: deploy/container.sh BIN_DIR [IMAGE]}
image=${2:-localhost/stel}
here=$(cd "$(dirname "$0")" && pwd)
command -v podman >/dev/null || { echo "container.sh: podman is not installed (apt-get install podman)" >&2; exit 2; }
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
root="$ctx/rootfs"
mkdir -p "$root/usr/local/bin" "$root/etc" "$root/var/lib/stel" "$root/run/stel" "$root/tmp"
chmod 1777 "$root/tmp"
bins=(stel-ingestd stel-emu)
[ -x "$bin_dir/stel-query" ] && bins+=(stel-query)
for b in "${bins[@]}"; do
  [ -x "$bin_dir/$b" ] || { echo "container.sh: $bin_dir/$b not built" >&2; exit 2; }
  cp "$bin_dir/$b" "$root/usr/local/bin/"
  # Every library the dynamic linker resolves, at the same path (the loader itself included).
  ldd "$bin_dir/$b" | awk '/=> \//{print $3} /^\t\//{print $1}' | while read -r lib; do
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
  done
done
printf 'root:x:0:0:root:/:/nonexistent\nstel:x:10001:10001:stel:/var/lib/stel:/nonexistent\n' > "$root/etc/passwd"
printf 'root:x:0:\nstel:x:10001:\n' > "$root/etc/group"
chown -R 10001:10001 "$root/var/lib/stel" "$root/run/stel"
cp "$here/Containerfile" "$ctx/Containerfile"
podman build -q -t "$image" "$ctx" >/dev/null
echo "container.sh: built $image with ${bins[*]} ($(du -sh "$root" | cut -f1) root file system)"
