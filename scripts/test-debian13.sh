#!/usr/bin/env bash
# The interpreter tier on Debian 13 (trixie): its own python3 (3.13), its own userland, the
# host's kernel. A trixie root is debootstrapped from the Debian registry (as the v2 guest
# is) and cached in $CORRAL_D13_CACHE (default ~/.cache/corral-debian13), rebuilt only when
# this script changes. The test dependencies are fetched on the host as cp313 wheels (pip
# download, from the same package index the host uses) and installed in the root with no
# network; a copy of the checkout goes in on each run. The tests run chrooted in a private
# mount namespace (proc, sys, dev and the checkout mounted there; every mount goes with the
# namespace when the run ends), as root, with CORRAL_REQUIRE_STRICT as the caller sets it.
#
# Usage: scripts/test-debian13.sh [pytest args...]  (default: the tier's tests, not slow, not the one
#        debootstrapped test image (its own root has no debootstrap: marked image_build),
#        as scripts/test-tiers.sh runs them)
# Env: CORRAL_D13_BUILD_ONLY=1: build (or find) the cached root, then stop (.ci/run does
#      this in the background while the interpreter tiers run)
# Exit: pytest's, or 2 when the root could not be built.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/lib/checkout-copy.sh
. "$ROOT/scripts/lib/checkout-copy.sh"
CACHE=${CORRAL_D13_CACHE:-$HOME/.cache/corral-debian13}
T0=$(date +%s)
say() { printf '[debian13 %4ss] %s\n' "$(( $(date +%s) - T0 ))" "$*"; }
die() { say "ERROR: $*"; exit 2; }
[ "$(id -u)" = 0 ] || die "needs root (debootstrap, chroot, mounts)"
[ $# -gt 0 ] || set -- -m "not slow and not image_build and not env_build" tests/linux tests/snippets tests/runner tests/cli \
  tests/test_main_job.py
command -v debootstrap >/dev/null || {
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null; }
PY=$ROOT/.venv/bin/python
[ -x "$PY" ] || PY=python3

MIRROR=$(sed -n 's/^URIs: *\(\S*debian\)$/\1/p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -1)
MIRROR=${MIRROR:-http://deb.debian.org/debian}
KEY=$( { echo "$MIRROR d13 v1"; sed -n '/^# --- the cached root/,/^# --- end cached root/p' "$0"; } \
       | sha256sum | cut -c1-16)
mkdir -p "$CACHE"
# --- the cached root
if [ "$(cat "$CACHE/key" 2>/dev/null)" != "$KEY" ]; then
  say "debootstrap trixie from $MIRROR into $CACHE"
  rm -rf "$CACHE/rootfs" "$CACHE/key" "$CACHE/build"
  B=$CACHE/build
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates,busybox-static,iproute2,util-linux,passwd \
    trixie "$B" "$MIRROR" > "$CACHE/debootstrap.log" 2>&1 \
    || { tail -20 "$CACHE/debootstrap.log"; rm -rf "$B"; die "debootstrap failed"; }
  chroot "$B" /usr/bin/python3 -m venv /opt/venv
  mv "$B" "$CACHE/rootfs"
  echo "$KEY" > "$CACHE/key"
  say "root built"
else
  say "root cached in $CACHE (key $KEY)"
fi
# --- end cached root
if [ -n "${CORRAL_D13_BUILD_ONLY:-}" ]; then say "build only: done"; exit 0; fi
R=$CACHE/rootfs
GVER=$(chroot "$R" /usr/bin/python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
say "Debian $(cat "$R/etc/debian_version"), python $GVER"

# the checkout (a copy: the editable install writes its metadata there) and the wheels
JOB=$(mktemp -d "$CACHE/job.XXXXXX")
trap 'rm -rf "$JOB"' EXIT
mkdir -p "$JOB/src" "$JOB/wheels"
checkout_copy "$ROOT" "$JOB/src"
"$PY" - "$ROOT/pyproject.toml" > "$JOB/requirements.txt" <<'EOF'
import sys, tomllib
doc = tomllib.load(open(sys.argv[1], "rb"))
project = doc["project"]
extras = project["optional-dependencies"]
reqs = list(project.get("dependencies", []))
todo, seen = ["tier"], set()  # the tier's tools (pyproject.toml says what it leaves out)
while todo:  # "corral[serve,mcp]" inside an extra: that extra's requirements
    name = todo.pop()
    if name in seen:
        continue
    seen.add(name)
    for req in extras[name]:
        if req.startswith(project["name"] + "["):
            todo += req.split("[", 1)[1].rstrip("]").split(",")
        else:
            reqs.append(req)
reqs += doc["build-system"]["requires"] + ["wheel", "pip"]
print("\n".join(reqs))
EOF
say "fetching cp${GVER/./} wheels"
"$PY" -m pip download -q --only-binary=:all: --python-version "$GVER" \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux_2_28_x86_64 --platform linux_x86_64 --platform any \
  -d "$JOB/wheels" -r "$JOB/requirements.txt" 2>&1 | grep -v '^WARNING: Location' || true

# a private mount namespace: everything mounted here goes with it
say "running pytest $*"
set +e
unshare --mount --propagation private -- bash -euo pipefail -s -- "$R" "$JOB" "$@" <<'EOF'
R=$1 JOB=$2; shift 2
# pivot_root, not chroot: a chrooted process may not create user namespaces (the kernel
# refuses CLONE_NEWUSER where the root is not its mount namespace's), the strict level needs them
mount --bind "$R" "$R"
mount -t proc proc "$R/proc"
mount --rbind /sys "$R/sys"
mount --rbind /dev "$R/dev"
mount -t tmpfs -o mode=1777 tmpfs "$R/tmp"
mkdir -p "$R/job" "$R/.oldroot"
mount --bind "$JOB" "$R/job"
cp /etc/resolv.conf "$R/etc/resolv.conf" 2>/dev/null || true
cd "$R"
pivot_root . .oldroot
exec /usr/sbin/chroot . /usr/bin/env -i PATH=/opt/venv/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  HOME=/root LANG=C.UTF-8 TMPDIR=/tmp CORRAL_REQUIRE_STRICT="${CORRAL_REQUIRE_STRICT:-}" \
  /bin/sh -euc '
umount -l /.oldroot && rmdir /.oldroot
# pip itself upgraded as scripts/test.sh does (Debian'"'"'s pip reads /etc/ssl, not in a sandbox)
python -m pip install -q --no-index --find-links /job/wheels --upgrade pip
python -m pip install -q --no-index --find-links /job/wheels -r /job/requirements.txt
python -m pip install -q --no-index --find-links /job/wheels --no-deps --no-build-isolation \
  -e /job/src
cd /job/src
exec python -m pytest -q -p no:cacheprovider "$@"' sh "$@"
EOF
rc=$?
say "pytest rc=$rc"
exit $rc
