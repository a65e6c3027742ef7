#!/usr/bin/env bash
# run.sh — cpcache's GPU checks (built by `make gpu-check`; no Go toolchain needed here).
#
# Runs the test binaries beside this script with CPCACHE_REQUIRE_GPU=1, so a missing GPU,
# driver or NCCL fails instead of skipping, then prints the device report, the bandwidth
# lines and a summary. Full logs go to $OUT when it is set, else beside this script.
# Usage: run.sh            (all of cuda.test, nccl.test and cudaslab.test, the TestGPU* tests of hicache.test)
set -u
here="$(cd "$(dirname "$0")" && pwd)"
logs="${OUT:-$here}"
mkdir -p "$logs"
export CPCACHE_REQUIRE_GPU=1

# run [SECONDS] BIN ARGS... runs a bundled binary (under `timeout SECONDS` when given),
# pointing the dynamic linker at gpu-bundle/lib only when the binary needs a library this
# machine lacks (Gloo and its deps), so the system's own libraries (libibverbs for NCCL, say)
# are never shadowed otherwise.
run() {
  local pre=()
  case "$1" in [0-9]*) pre=(timeout "$1"); shift ;; esac
  if ldd "$1" 2>/dev/null | grep -q 'not found'; then
    LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ${pre[@]+"${pre[@]}"} "$@"
  else
    ${pre[@]+"${pre[@]}"} "$@"
  fi
}

# NCCL is often only inside a Python wheel or an unusual prefix: look for it when the
# default search does not find it (CPCACHE_NCCL_LIBRARY set by the caller wins).
if [ -z "${CPCACHE_NCCL_LIBRARY:-}" ] && ! run "$here/cpcache" gpu-info 2>/dev/null | grep -q '^nccl: [0-9]'; then
  cand=$(find / -xdev \( -path /proc -o -path /sys -o -path /dev \) -prune -o \
    \( -name 'libnccl.so.2' -o -name 'libnccl.so.2.*' \) -print 2>/dev/null | head -n 1)
  if [ -n "$cand" ]; then
    export CPCACHE_NCCL_LIBRARY="$cand"
    echo "run.sh: default search found no NCCL; using $cand"
  fi
fi

echo "== gpu-info"
run "$here/cpcache" gpu-info 2>&1 | tee "$logs/gpu-info.txt"

status=0
total_pass=0 total_fail=0 total_skip=0
for pkg in cuda nccl cudaslab hicache; do
  bin="$here/$pkg.test"
  [ -x "$bin" ] || continue
  pattern='.'
  [ "$pkg" = hicache ] && pattern='^TestGPU'
  echo "== $pkg.test -test.run '$pattern'"
  start=$(date +%s)
  # ShimDigest checks the source tree, which need not be here.
  run 280 "$bin" -test.v -test.count=1 -test.timeout=270s -test.run "$pattern" \
    -test.skip 'ShimDigest' >"$logs/$pkg.log" 2>&1
  rc=$?
  grep -E '^(info|bandwidth|run\.sh):' "$logs/$pkg.log"
  pass=$(grep -cE '^--- PASS' "$logs/$pkg.log")
  fail=$(grep -cE '^--- FAIL' "$logs/$pkg.log")
  skip=$(grep -cE '^--- SKIP' "$logs/$pkg.log")
  total_pass=$((total_pass + pass)) total_fail=$((total_fail + fail)) total_skip=$((total_skip + skip))
  grep -E '^--- (FAIL|SKIP)' "$logs/$pkg.log" | sed 's/^/  /'
  if [ "$rc" -ne 0 ]; then
    status=1
    echo "  $pkg: FAILED (exit $rc); log tail:"
    grep -vE '^(=== (RUN|PAUSE|CONT)|info:|bandwidth:)' "$logs/$pkg.log" | tail -n 60 | sed 's/^/    /'
  fi
  echo "  $pkg: $pass passed, $fail failed, $skip skipped; exit $rc; $(( $(date +%s) - start ))s"
done
echo "== gpu checks: $total_pass passed, $total_fail failed, $total_skip skipped (logs in $logs)"
exit $status
