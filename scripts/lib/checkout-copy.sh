# Sourced by scripts/test-debian13.sh and scripts/test-v2.sh: copy a checkout's files into
# a directory, as git sees them (tracked, and untracked but not ignored; files deleted
# from the work tree but not from the index are left out), with no .git and no venv.
#
#   checkout_copy ROOT DEST    (DEST exists)
#
# File names go to sh and tar as NUL-separated data only, never into a command line
# that is parsed: a name with quotes, `$(...)` or newlines is copied, not run.
checkout_copy() {
  local root=$1 dest=$2
  (cd "$root" && git ls-files -z --cached --others --exclude-standard \
     | xargs -0 sh -c 'for f do [ -e "$f" ] && printf "%s\0" "$f"; done; exit 0' sh \
     | tar --null -T - -cf -) | tar -xf - -C "$dest"
}
