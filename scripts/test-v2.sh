#!/usr/bin/env bash
# Run the strict (linux) provider's tests in a real cgroup v2 kernel: a Debian 12
# guest under qemu (TCG: KVM does not run stock guests on our PVM machines), once
# per host shape (scenarios, see scripts/v2/guest.sh):
#   a root at the root cgroup   b root in a systemd-service leaf that holds processes
#   c uid 1000 in a delegated cgroup (Delegate=yes)   d root in a private cgroup namespace
#   e uid 1000 with nothing delegated (what cannot run there skips with its reason: the
#     tests that ask for cgroup limits carry strict_tier.needs_cgroup_limits)
# b and d leave out what depends on the uid only, not on root's cgroup (the quota tests,
# the doors as uid 65534 dropped from root): a runs it (scripts/v2/guest.sh says which)
# The guest (kernel, busybox initramfs, debootstrap root with a venv holding h11 (corral's runtime dependency), pytest and
# hypothesis) is cached in $CORRAL_V2_CACHE (default ~/.cache/corral-v2) and rebuilt only
# when its inputs change; the checkout goes in on a second ext4 image each run.
# Each boot runs under a timeout, with one retry (a TCG boot hangs now and then).
#
# Usage: scripts/test-v2.sh [pytest args...]   (default: the cgroup/host-detection files
#        of tests/linux, see below; `scripts/test-v2.sh tests/linux -m 'not slow'` for all)
# Env: CORRAL_V2_SCENARIOS="a b c d e" (a subset to run fewer), CORRAL_V2_TIMEOUT=600 (s per boot), CORRAL_V2_SMP=2
#      CORRAL_V2_BUILD_ONLY=1: install the host packages and build (or find) the cached guest,
#      then stop (.ci/run runs this script, build and boots, in the background beside the tiers)
# Exit: 0 when every scenario passed, 1 when one failed, 2 when the guest could not run.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/lib/checkout-copy.sh
. "$ROOT/scripts/lib/checkout-copy.sh"
CACHE=${CORRAL_V2_CACHE:-$HOME/.cache/corral-v2}
SCENARIOS=${CORRAL_V2_SCENARIOS:-a b c d e}
TIMEOUT=${CORRAL_V2_TIMEOUT:-600}
BOOT_WAIT=${CORRAL_V2_BOOT_WAIT:-120}
SMP=${CORRAL_V2_SMP:-2}
T0=$(date +%s)
say() { printf '[test-v2 %4ss] %s\n' "$(( $(date +%s) - T0 ))" "$*"; }
die() { say "ERROR: $*"; exit 2; }
# The default is the tests that exercise the cgroup and host-detection paths (they fit
# the budget: TCG is ~10x slower than the host, and tests/linux takes ~13 min a scenario)
[ $# -gt 0 ] || set -- tests/linux/test_cgroups.py tests/linux/test_hostinfo.py \
  tests/linux/test_strict_outcomes.py tests/linux/test_quotas.py tests/linux/test_cpu_cap.py \
  tests/linux/test_orphans.py tests/linux/test_provider.py tests/linux/test_nonroot_doors.py \
  -m 'not slow and not env_build'

# The guest's Python packages are the checkout's .venv's, pinned (scripts/test.sh makes it:
# in CI it runs first). Without them the guest would have no h11 and every scenario would
# fail on the import, minutes later: say so now instead.
PY=${CORRAL_V2_PYTHON:-$ROOT/.venv/bin/python}
[ -x "$PY" ] || die "no $PY: the guest's packages (h11, pytest, hypothesis) are pinned from \
the checkout's .venv; run 'bash scripts/test.sh' first (it makes .venv), or set CORRAL_V2_PYTHON"
PINS=$("$PY" -m pip freeze 2>/dev/null | grep -iE '^(pytest|hypothesis|pluggy|iniconfig|packaging|sortedcontainers|h11)==' | sort | tr '\n' ' ' || true)
missing=()
for p in h11 pytest hypothesis; do
  grep -qiE "(^| )$p==" <<<"$PINS" || missing+=("$p")
done
[ ${#missing[@]} = 0 ] || die "$PY has no ${missing[*]} (pip freeze): the guest needs them; \
'bash scripts/test.sh' installs them into .venv"

# --- host packages --------------------------------------------------------------
need=()
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
command -v debootstrap >/dev/null || need+=(debootstrap)
[ -x /bin/busybox ] && /bin/busybox --list 2>/dev/null | grep -qx switch_root || need+=(busybox-static)
command -v cpio >/dev/null || need+=(cpio)
command -v mkfs.ext4 >/dev/null || need+=(e2fsprogs)
ls /boot/vmlinuz-*-cloud-amd64 >/dev/null 2>&1 || need+=(linux-image-cloud-amd64)
if [ ${#need[@]} -gt 0 ]; then
  [ "$(id -u)" = 0 ] || die "missing packages ${need[*]} (apt-get install them, as root)"
  say "installing ${need[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
    --no-install-recommends "${need[@]}" >/dev/null
fi
[ "$(id -u)" = 0 ] || die "building the guest needs root (debootstrap, chroot)"
KERNEL=$(ls /boot/vmlinuz-*-cloud-amd64 | sort -V | tail -1)
KVER=${KERNEL#/boot/vmlinuz-}

# --- the cached guest -------------------------------------------------------------
MIRROR=$(sed -n 's/^URIs: *\(\S*debian\)$/\1/p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -1)
MIRROR=${MIRROR:-http://deb.debian.org/debian}
KEY=$( { echo "$KVER $PINS $MIRROR v1"; cat "$ROOT/scripts/v2/initramfs-init"; \
         sed -n '/^# --- the cached guest/,/^# --- end cached guest/p' "$0"; } | sha256sum | cut -c1-16)
mkdir -p "$CACHE"
if [ "$(cat "$CACHE/key" 2>/dev/null)" != "$KEY" ]; then
  say "building the guest in $CACHE (kernel $KVER; cache key $KEY)"
  rm -rf "$CACHE/build" "$CACHE/key"
  B=$CACHE/build && mkdir -p "$B/initramfs"/{bin,lib/modules,proc,sys,dev,newroot,probe}
  cp /bin/busybox "$B/initramfs/bin/busybox"
  cp "$ROOT/scripts/v2/initramfs-init" "$B/initramfs/init" && chmod 755 "$B/initramfs/init"
  for m in virtio/virtio_ring virtio/virtio virtio/virtio_mmio block/virtio_blk; do
    f=$(ls /lib/modules/"$KVER"/kernel/drivers/$m.ko* | head -1)
    case $f in *.xz) xz -dc "$f" ;; *.zst) zstd -dcq "$f" ;; *) cat "$f" ;; esac \
      > "$B/initramfs/lib/modules/$(basename "$m").ko"
  done
  (cd "$B/initramfs" && find . | cpio -o -H newc --quiet | gzip -1) > "$B/initramfs.cpio.gz"
  say "debootstrap bookworm from $MIRROR"
  debootstrap --variant=minbase --include=python3,python3-venv,iproute2,kmod,util-linux,passwd \
    bookworm "$B/rootfs" "$MIRROR" > "$B/debootstrap.log" 2>&1 \
    || { tail -20 "$B/debootstrap.log"; die "debootstrap failed"; }
  mkdir -p "$B/rootfs/lib/modules" && cp -a /lib/modules/"$KVER" "$B/rootfs/lib/modules/"
  chroot "$B/rootfs" /sbin/depmod "$KVER"
  chroot "$B/rootfs" /usr/sbin/useradd -m -u 1000 -s /bin/bash user
  chroot "$B/rootfs" /usr/bin/python3 -m venv --without-pip /opt/venv
  SITE=$(ls -d "$B"/rootfs/opt/venv/lib/python3*/site-packages)
  GPY=$(basename "$(dirname "$SITE")")
  [ "$GPY" = "python$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')" ] \
    || die "guest $GPY differs from the host's python: pure-python wheels only, but check"
  # pytest and hypothesis are pure Python: install them from the host into the guest venv,
  # compiled here (the host's python has the guest's minor version, checked above): the
  # guest's disks are snapshots, so whatever it compiled itself would be lost at power-off
  # and compiled again, under TCG, by every boot and every sandboxed python
  # shellcheck disable=SC2086
  "$PY" -m pip install -q --target "$SITE" $PINS > "$CACHE/pip-guest.log" 2>&1 \
    || { grep -v '^WARNING: Location' "$CACHE/pip-guest.log" | tail -20
         die "pip could not install $PINS into the guest's venv (log $CACHE/pip-guest.log)"; }
  for p in h11 pytest hypothesis; do
    [ -e "$SITE/$p" ] || die "the guest's venv has no $p after pip install (log $CACHE/pip-guest.log)"
  done
  # the checkout is on the job disk at /job/src: the venv imports corral from there
  echo /job/src/src > "$SITE/corral-checkout.pth"
  chmod -R a+rX "$B/rootfs/opt/venv"
  SIZE=$(( $(du -sm "$B/rootfs" | cut -f1) + 300 ))
  mkfs.ext4 -q -F -L corralroot -d "$B/rootfs" "$B/root.ext4" "${SIZE}M" >/dev/null
  cp "$KERNEL" "$B/vmlinuz"
  mv "$B/root.ext4" "$B/initramfs.cpio.gz" "$B/vmlinuz" "$CACHE/"
  rm -rf "$B"
  echo "$KEY" > "$CACHE/key"
  say "guest built"
else
  say "guest cached in $CACHE (key $KEY)"
fi
# --- end cached guest
if [ -n "${CORRAL_V2_BUILD_ONLY:-}" ]; then say "build only: done"; exit 0; fi

# --- the job disk: this checkout, the guest script, the pytest args ----------------
JOB=$(mktemp -d "$CACHE/job.XXXXXX")
trap 'rm -rf "$JOB"' EXIT
mkdir -p "$JOB/disk/src" "$JOB/disk/v2"
checkout_copy "$ROOT" "$JOB/disk/src"
# compiled on the host, once for every boot (mkfs.ext4 -d keeps the mtimes the .pyc files
# are checked against); the guest's python would compile corral under TCG again in each
# boot and in each sandbox it starts (it runs with PYTHONDONTWRITEBYTECODE, and its disks
# are snapshots); the snippet corpus is data, some of it not Python on purpose
"$PY" -m compileall -q -j 0 -x /corpus/ "$JOB/disk/src/src" "$JOB/disk/src/tests" >/dev/null \
  || die "compileall of the checkout copy failed"
cp "$ROOT/scripts/v2/guest.sh" "$JOB/disk/guest.sh"
cp "$ROOT/scripts/v2/v2_hypothesis.py" "$ROOT/scripts/v2/times.py" "$JOB/disk/v2/"
printf '%s\n' "$@" > "$JOB/disk/pytest-args"  # one argument a line
chmod -R a+rX "$JOB/disk"
mkfs.ext4 -q -F -L corraljob -d "$JOB/disk" "$JOB/job.ext4" \
  "$(( $(du -sm "$JOB/disk" | cut -f1) + 64 ))M" >/dev/null

# --- boot once per scenario ---------------------------------------------------------
mkdir -p "$CACHE/logs"
# The guest's TSC is the host's (TCG): giving its rate skips the PIT calibration, where
# boots hung now and then ("tsc: Unable to calibrate against PIT", then nothing).
KHZ=$(awk '/^cpu MHz/ { printf "%d", $4 * 1000; exit }' /proc/cpuinfo)
KARGS="console=ttyS0 quiet loglevel=2 panic=-1 tsc=reliable${KHZ:+ tsc_early_khz=$KHZ}"
boot() {  # boot SCENARIO LOG: 0 ran (result in LOG), 3 hung before stage 2
  timeout "$TIMEOUT" qemu-system-x86_64 -accel tcg,thread=multi -cpu max \
    -smp "$SMP" -m 2048 -nographic -no-reboot -M microvm \
    -kernel "$CACHE/vmlinuz" -initrd "$CACHE/initramfs.cpio.gz" \
    -append "$KARGS corral.scenario=$1" \
    -drive id=root,file="$CACHE/root.ext4",format=raw,if=none,snapshot=on \
    -device virtio-blk-device,drive=root \
    -drive id=job,file="$JOB/job.ext4",format=raw,if=none,snapshot=on \
    -device virtio-blk-device,drive=job </dev/null >"$2" 2>&1 &
  local q=$! i
  for ((i = 0; i < BOOT_WAIT; i++)); do  # stage 1 within a third of it, stage 2 in all
    grep -q V2READY "$2" && break
    ((i < BOOT_WAIT / 3)) || grep -q V2BOOT "$2" || break
    kill -0 $q 2>/dev/null || break
    sleep 1
  done
  if ! grep -q V2READY "$2"; then  # TERM to timeout: it passes the signal on to qemu
    kill -TERM $q 2>/dev/null; wait $q 2>/dev/null; return 3
  fi
  wait $q || true
}
declare -A RESULT
fail=0
for s in $SCENARIOS; do
  log=$CACHE/logs/scenario-$s.log
  for try in 1 2; do
    say "scenario $s: booting (try $try)"
    if boot "$s" "$log" && grep -q "^V2RESULT $s " <(tr -d '\r' < "$log"); then break; fi
    say "scenario $s: no result (hung or crashed); last lines:"; tail -5 "$log" | tr -d '\r'
    [ $try = 2 ] && RESULT[$s]="NO RESULT (guest hung twice; log $log)"
  done
  line=$(tr -d '\r' < "$log" | grep "^V2RESULT $s " | tail -1 || true)
  if [ -n "$line" ]; then RESULT[$s]=${line#V2RESULT }; fi
  case ${RESULT[$s]} in *" rc=0 "*) say "scenario $s: ${RESULT[$s]}" ;;
    *) fail=1; say "scenario $s FAILED: ${RESULT[$s]}"
       tr -d '\r' < "$log" | grep -E '^(FAILED|ERROR)|Error' | head -40 ;;
  esac
done

echo "== cgroup v2 guest summary (kernel $KVER; $(( $(date +%s) - T0 ))s; logs in $CACHE/logs) =="
for s in $SCENARIOS; do
  case $s in a) d="root, root cgroup" ;; b) d="root, leaf with processes" ;;
    c) d="uid 1000, delegated" ;; d) d="root, cgroup namespace" ;;
    e) d="uid 1000, nothing delegated" ;; *) d="?" ;; esac
  printf '  %s %-30s %s\n' "$s" "($d)" "${RESULT[$s]}"
  cg=$(tr -d '\r' < "$CACHE/logs/scenario-$s.log" 2>/dev/null | sed -n 's/^V2CGROUPS //p' | tail -1)
  [ -z "$cg" ] || printf '    %-30s %s\n' "corral's cgroups:" "$cg"
done
exit $fail
