#!/usr/bin/env bash
# run.sh — the GPU bundle's entry point (built by `make gpu-check`). The bundle's binaries are
# packed in bundle.tar.gz beside this script, so that the folder fits a device machine's
# carry limit (64 MiB with the working tree); this unpacks them into a fresh directory under
# $TMPDIR (else /tmp), runs their run.sh (cuda/testdata/gpu-run.sh) with the same arguments
# and environment, passes SIGTERM and SIGINT on to it (it still prints its summary line), and
# removes the directory. Logs go to $OUT when it is set, else beside this script.
# Usage: run.sh
set -u
here="$(cd "$(dirname "$0")" && pwd)"
export OUT="${OUT:-$here}"
dir="" child=""
trap '[ -n "$dir" ] && rm -rf "$dir"' EXIT
forward() { # forward SIGNAL STATUS: stop the checks with SIGNAL, let them summarise, exit STATUS
  [ -n "$child" ] && kill -"$1" "$child" 2>/dev/null && wait "$child"
  exit "$2"
}
trap 'forward TERM 143' TERM
trap 'forward INT 130' INT
dir=$(mktemp -d "${TMPDIR:-/tmp}/cpcache-gpu-bundle.XXXXXX") &&
  tar -xzf "$here/bundle.tar.gz" -C "$dir" && [ -x "$dir/run.sh" ] || {
  # The summary line gpu-run.sh ends with, so a caller reading it sees why nothing ran.
  echo "== gpu checks: FAILED: 0 passed, 0 failed, 0 skipped in 0s of a 0s deadline; problems: cannot unpack $here/bundle.tar.gz into ${dir:-a temporary directory} (logs in $OUT)"
  exit 1
}
"$dir/run.sh" "$@" &
child=$!
wait "$child"
