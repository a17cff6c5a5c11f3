#!/usr/bin/env bash
# The install paths: build corral's wheel, install it NON-editable (with the serve extra)
# into a fresh venv, then run the main job (scripts/main.sh's strict run) and the smoke
# tests of strict, snippet, handler and serve (scripts/smoke_installed.py) from that venv,
# with a cwd outside the checkout so nothing can come from the source tree. Then the same
# wheel through pipx, when pipx is there (or pip can install it): the app's own venv must
# find corral's files the same way.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
PY=${PYTHON:-/usr/bin/python3}
WORK=$(mktemp -d /tmp/corral-wheel-XXXXXX)
trap 'rm -rf "$WORK"' EXIT
chmod 755 "$WORK"
t0=$(date +%s)
"$PY" -m pip wheel -q --no-deps . -w "$WORK/dist"
WHEEL=$(ls "$WORK"/dist/corral-*.whl)
echo "--- built $(basename "$WHEEL")"
"$PY" -m venv "$WORK/venv"
"$WORK/venv/bin/python" -m pip install -q "$WHEEL[serve]"
if "$WORK/venv/bin/python" -m pip show -f corral | grep -q 'Editable project location'; then
  echo "the wheel was installed editable" >&2; exit 1
fi
cp examples/inside.py examples/serve.toml "$WORK/"
cd "$WORK"  # outside the checkout from here on
echo "--- main job from the installed wheel: corral run --level strict -- python inside.py"
"$WORK/venv/bin/corral" run --level strict --mem-mb 128 --max-processes 64 --timeout 10000 \
  --stdin inside.py -- "$WORK/venv/bin/python" -I -S -
echo "--- smoke tests from the installed wheel"
"$WORK/venv/bin/python" -I "$REPO/scripts/smoke_installed.py" "$WORK/serve.toml"
# pipx: an app venv of its own; corral inside it must find its files the same way
PIPX=$(command -v pipx || true)
if [ -z "$PIPX" ]; then
  "$PY" -m venv "$WORK/pipx-tool" &&
    "$WORK/pipx-tool/bin/python" -m pip install -q pipx && PIPX="$WORK/pipx-tool/bin/pipx" ||
    echo "--- pipx: SKIPPED: pipx is not installed and pip could not install it"
fi
if [ -n "$PIPX" ]; then
  echo "--- pipx install of the same wheel"
  export PIPX_HOME="$WORK/pipx-home" PIPX_BIN_DIR="$WORK/pipx-bin"
  "$PIPX" install -q --python "$PY" "$WHEEL[serve]" >/dev/null
  "$WORK/pipx-bin/corral" run --level strict --mem-mb 128 --timeout 10000 --stdin inside.py \
    -- "$PIPX_HOME/venvs/corral/bin/python" -I -S - >/dev/null
  echo "ok   pipx's corral runs the main job at strict"
  "$PIPX_HOME/venvs/corral/bin/python" -I "$REPO/scripts/smoke_installed.py" \
    "$WORK/serve.toml"
fi
echo "--- install paths: passed in $(( $(date +%s) - t0 )) s"
