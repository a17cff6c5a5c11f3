#!/usr/bin/env bash
# Install corral with its test tools into .venv and run every check:
# ruff, mypy --strict, then the test suite. This is the README's test command.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-/usr/bin/python3}
# Debian packages the tests need, installed (as root) with one apt-get update for all
need=()
if ! "$PY" -m venv --help >/dev/null 2>&1 || ! "$PY" -c 'import ensurepip' 2>/dev/null; then
  need+=(python3-venv)
fi
# the playground's browser test drives Debian's chromium (headless, over the DevTools protocol)
command -v chromium >/dev/null || need+=(chromium fonts-dejavu-core)
# the image tests run a registry on loopback (Debian's docker-registry, htpasswd for its
# Basic auth) and push busybox-static images; skopeo and umoci are there for interop
if ! { command -v docker-registry && command -v htpasswd && command -v busybox \
        && command -v skopeo && command -v umoci; } >/dev/null; then
  need+=(docker-registry apache2-utils busybox-static skopeo umoci)
fi
# the image-root tests build one Debian root with python3-numpy (debootstrap, cached under
# /var/cache/corral-images-test: tests/linux/test_image_root_python.py, marked image_build)
command -v debootstrap >/dev/null || need+=(debootstrap)
# the oci provider drives Debian's crun, with catatonit as each container's init
{ command -v crun && command -v catatonit; } >/dev/null || need+=(crun catatonit)
if [ ${#need[@]} -gt 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${need[@]}" >/dev/null
fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q -e '.[test]'
.venv/bin/ruff check src tests benchmarks
.venv/bin/mypy
.venv/bin/python -m pytest -q "$@"
