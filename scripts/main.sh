#!/usr/bin/env bash
# The main job: install corral into .venv, show what this host can enforce, then run a
# program inside the strict sandbox (namespaces, seccomp, cgroups) that tries to look and
# reach outside, with a 128 MiB memory cap, 64 processes and a 10 s wall clock.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-/usr/bin/python3}
if ! "$PY" -c 'import ensurepip' 2>/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
  fi
fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv
# CORRAL_MAIN_NO_INSTALL=1: use the .venv as it is (tests/test_main_job.py runs this script)
# with the extras the README's first screen uses: serve (corral serve, the playground) and
# mcp (the official MCP SDK, for `corral mcp` and examples/mcp_client.py)
[ "${CORRAL_MAIN_NO_INSTALL:-}" = 1 ] || .venv/bin/python -m pip install -q -e '.[serve,mcp]'
# the command is .venv/bin/corral, which a fresh shell does not have on its PATH
echo "corral is installed as .venv/bin/corral; '. .venv/bin/activate' puts it on this shell's PATH" >&2
# the host's primitives, then the strict provider's verdict (`corral doctor` shows every
# provider's rows)
.venv/bin/corral doctor | awk '/^Providers/ {p = 1; next} !p {print}
  p && /^  linux \(level strict\)/ {print "Strict level:" substr($0, 24); exit}'
echo "--- corral run --level strict -- python examples/inside.py"
# the interpreter by absolute path: at strict a relative path names a file inside the
# sandbox's /work; corral binds the interpreter the venv's python links to
exec .venv/bin/corral run --level strict --mem-mb 128 --max-processes 64 --timeout 10000 \
  --stdin examples/inside.py -- "$PWD/.venv/bin/python" -I -S -
