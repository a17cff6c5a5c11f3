#!/usr/bin/env bash
# Interpreter tiers: the strict, snippet, runner and serve tests (not the slow ones)
# on each pyenv CPython of this machine image (3.11.7, 3.12.1, 3.13.0: builds with a shared
# libpython, under /root/.pyenv), each in a fresh venv of its own. scripts/test.sh runs the
# whole suite on Debian's /usr/bin/python3; this runs the parts that touch the interpreter
# (the sandbox binds it, the snippet worker runs on it, the runner execs it).
#
# An interpreter that is absent is skipped with the reason printed; a tier that fails fails
# the script (after every tier has run). Each tier's wall time is printed.
#   PYENV_ROOT   where the builds are (default ~/.pyenv)
#   TIERS        which versions (default "3.11.7 3.12.1 3.13.0"; a prefix such as 3.12
#                takes the newest build of it)
#   TIER_VENVS   where the venvs go (default a temp dir, removed at the end)
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=${PYENV_ROOT:-$HOME/.pyenv}
TIERS=${TIERS:-"3.11.7 3.12.1 3.13.0"}
VENVS=${TIER_VENVS:-$(mktemp -d /tmp/corral-tiers-XXXXXX)}
[ -n "${TIER_VENVS:-}" ] || trap 'rm -rf "$VENVS"' EXIT
# mktemp makes it 0700: the non-root tests run uid 65534 on the venv's site-packages
chmod 755 "$VENVS"
# the tier's tests: the strict provider (it binds the interpreter and its libraries into
# the sandbox), the snippet worker (it runs on the interpreter, with its guards), the bounded
# runner (it execs it under rlimits), the CLI and the service (asyncio, uvicorn), and the
# main job. TIER_TESTS overrides them. About 4 min a tier on 2 cores (README, "Set up").
TESTS=(tests/linux tests/snippets tests/runner tests/cli tests/serve tests/test_main_job.py)
# What another CI stage already runs on the same minor version is left out here, to keep
# CI near its 45 minutes: on 3.11 the CLI and the service (scripts/test.sh runs the whole
# suite on Debian's 3.11), on 3.13 the CLI (scripts/test-debian13.sh runs it on Debian
# 13's 3.13; the service is not in that root, so it stays here). 3.12 has no other
# stage: it runs all of them. About 2.5 and 1 min saved; each tier prints what it left.
tier_tests() {
  case "$1" in
    3.11.*) echo tests/linux tests/snippets tests/runner tests/test_main_job.py ;;
    3.13.*) echo tests/linux tests/snippets tests/runner tests/serve tests/test_main_job.py ;;
    *) echo "${TESTS[*]}" ;;
  esac
}
# Known failures outside this issue, left out by name with the reason (every tier):
# none now. The egress proxy's tests were, until issue 25 gave every task of the network
# code an owner (asyncio logged "Exception in callback" on 3.11.7 and 3.12.1 when the
# proxy cancelled tasks asyncio.start_server owned); they pass on each tier.
IGNORE=()
failed=()
for want in $TIERS; do
  py=""
  for d in $(ls -d "$ROOT/versions/$want"* 2>/dev/null | sort -V -r); do
    [ -x "$d/bin/python3" ] && { py="$d/bin/python3"; break; }
  done
  if [ -z "$py" ]; then
    echo "=== tier $want: SKIPPED: no CPython $want under $ROOT/versions (pyenv build absent)"
    continue
  fi
  ver=$("$py" -c 'import platform; print(platform.python_version())')
  venv="$VENVS/py$ver"
  t0=$(date +%s)
  echo "=== tier $ver ($py)"
  if ! { [ -x "$venv/bin/python" ] || "$py" -m venv "$venv"; } ||
     ! "$venv/bin/python" -m pip install -q -e '.[tier]' >"$VENVS/pip-$ver.log" 2>&1; then
    tail -20 "$VENVS/pip-$ver.log" 2>/dev/null
    echo "=== tier $ver: FAILED to install"
    failed+=("$ver")
    continue
  fi
  read -r -a tests <<<"${TIER_TESTS:-$(tier_tests "$ver")}"
  skip=("${IGNORE[@]}")
  echo "    runs: ${tests[*]}"
  echo "    left out: ${skip[*]:-nothing}"
  "$venv/bin/python" -m pytest -q -p no:cacheprovider -m "not slow and not env_build" "${skip[@]}" "${tests[@]}"
  rc=$?
  echo "=== tier $ver: rc=$rc in $(( $(date +%s) - t0 )) s (install included)"
  [ $rc = 0 ] || failed+=("$ver")
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "interpreter tiers failed: ${failed[*]}"
  exit 1
fi
