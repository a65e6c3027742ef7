#!/usr/bin/env bash
# run.sh — cpcache's GPU checks (built by `make gpu-check`; no Go toolchain needed here).
#
# Runs the test binaries beside this script (cuda, cudaslab, the TestGPU* tests of hicache,
# hicache/cudaengine and cmd/libcpcache, nccl last) with CPCACHE_REQUIRE_GPU=1, so a missing
# GPU, driver or NCCL fails instead of skipping, then `cpcache run --device cuda` on 8 ranks
# (device and pinned host L2; opaque pages, and the per-layer KV of two --model presets) and
# the C example over device buffers (pinned host and CUDA IPC slabs) on 4, and prints the device report, the bandwidth lines and one summary line. Full logs go to $OUT
# when it is set, else beside this script.
#
# Budget: the whole run ends within CPCACHE_GPU_DEADLINE_S seconds (default and maximum 360),
# each step within CPCACHE_GPU_STEP_S (default and maximum 120) or what is left of the
# deadline; nccl.test runs last. A step the deadline leaves no time for, and a missing test
# binary, count as failures. The summary line ("== gpu checks: ...") is printed however the
# run ends: finished, out of time, or killed with SIGTERM/SIGINT.
# Usage: run.sh
set -u
here="$(cd "$(dirname "$0")" && pwd)"
logs="${OUT:-$here}"
mkdir -p "$logs"
export CPCACHE_REQUIRE_GPU=1
# fd 3 is the script's stdout: the summary goes there even from a trap that fires while a
# step's output is redirected to its log.
exec 3>&1

clamp() { # clamp VALUE MAX: VALUE when it is a positive integer not above MAX, else MAX
  case "$1" in '' | *[!0-9]*) echo "$2" ;; *) if [ "$1" -gt 0 ] && [ "$1" -le "$2" ]; then echo "$1"; else echo "$2"; fi ;; esac
}
deadline_s=$(clamp "${CPCACHE_GPU_DEADLINE_S:-}" 360)
step_s=$(clamp "${CPCACHE_GPU_STEP_S:-}" 120)
t0=$(date +%s)
deadline=$((t0 + deadline_s))
min_step=10 # a step with less time left than this is not started

total_pass=0 total_fail=0 total_skip=0
problems=()
child=""
summarized=""

summary() {
  [ -n "$summarized" ] && return
  summarized=1
  local verdict=ok
  if [ "$total_fail" -gt 0 ] || [ "${#problems[@]}" -gt 0 ]; then verdict=FAILED; fi
  local why=""
  if [ "${#problems[@]}" -gt 0 ]; then
    why=$(printf '%s; ' "${problems[@]}")
    why="; problems: ${why%; }"
  fi
  echo "== gpu checks: $verdict: $total_pass passed, $total_fail failed, $total_skip skipped in $(( $(date +%s) - t0 ))s of a ${deadline_s}s deadline$why (logs in $logs)" >&3
}
interrupted() {
  problems+=("interrupted by SIG$1")
  [ -n "$child" ] && kill -TERM "$child" 2>/dev/null
  exit 1
}
trap 'summary' EXIT
trap 'interrupted TERM' TERM
trap 'interrupted INT' INT

# run SECONDS BIN ARGS... runs a bundled binary under `timeout SECONDS` in the background (so
# a signal to this script is handled at once), pointing the dynamic linker at gpu-bundle/lib
# only when the binary needs a library this machine lacks (Gloo and its deps), so the
# system's own libraries (libibverbs for NCCL, say) are never shadowed otherwise.
run() {
  local secs="$1"
  shift
  if ldd "$1" 2>/dev/null | grep -q '=> not found'; then
    LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" timeout -k 5 "$secs" "$@" 3>&- &
  else
    timeout -k 5 "$secs" "$@" 3>&- &
  fi
  child=$!
  wait "$child"
  local rc=$?
  child=""
  return $rc
}

# upto N: N seconds, or what is left of the deadline when that is less (at least 1).
upto() {
  local left=$((deadline - $(date +%s)))
  [ "$left" -lt "$1" ] && { echo $((left > 1 ? left : 1)); return; }
  echo "$1"
}

# budget NAME sets secs to the seconds step NAME may take (at most step_s, at most what is
# left of the deadline), or records a problem and fails when that is under min_step.
secs=0
budget() {
  local left=$((deadline - $(date +%s) - 5))
  if [ "$left" -lt "$min_step" ]; then
    problems+=("$1 not run: the ${deadline_s}s deadline was reached")
    echo "  $1: NOT RUN: the ${deadline_s}s deadline was reached"
    return 1
  fi
  secs=$step_s
  [ "$left" -lt "$secs" ] && secs=$left
  return 0
}

# ---- preflight: can this image run the bundle at all?
echo "== preflight"
glibc=$(getconf GNU_LIBC_VERSION 2>/dev/null || ldd --version 2>/dev/null | head -n 1)
echo "preflight: glibc: ${glibc:-unknown}"
stdcxx=$( (ldconfig -p 2>/dev/null || true) | awk '/libstdc\+\+\.so\.6 /{print $NF; exit}')
if [ -n "$stdcxx" ] && [ -r "$stdcxx" ]; then
  echo "preflight: libstdc++: $(readlink -f "$stdcxx") (newest symbol version $(grep -ao 'GLIBCXX_[0-9][0-9.]*' "$stdcxx" | sort -uV | tail -n 1))"
else
  echo "preflight: libstdc++: not found (only binaries that need Gloo use it)"
fi
[ -r "$here/built-on.txt" ] && sed 's/^/preflight: bundle /' "$here/built-on.txt"
unrunnable=""
for bin in "$here"/*.test "$here/cpcache" "$here/engine"; do
  [ -x "$bin" ] || continue
  bad=$(LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ldd "$bin" 2>&1 | grep -E "version .* not found|=> not found" | sed 's/^[[:space:]]*//')
  if [ -n "$bad" ]; then
    unrunnable="$unrunnable $(basename "$bin")"
    echo "preflight: $(basename "$bin") cannot run here:"
    echo "$bad" | sed 's/^/    /'
  fi
done
if [ -n "$unrunnable" ]; then
  echo "preflight: THIS BUNDLE CANNOT RUN ON THIS IMAGE (${glibc:-unknown glibc}):$unrunnable need newer system libraries; build the bundle on an image with an older or equal glibc/libstdc++"
  problems+=("the bundle cannot run on this image:$unrunnable")
  exit 1
fi
echo "preflight: every bundled binary links on this image"

# ---- NCCL: often only inside a Python wheel or an unusual prefix (CPCACHE_NCCL_LIBRARY set by
# the caller wins). Ask Python where its nvidia.nccl package is before walking the filesystem.
if [ -z "${CPCACHE_NCCL_LIBRARY:-}" ] && ! run "$(upto 30)" "$here/cpcache" gpu-info 2>/dev/null | grep -q '^nccl: [0-9]'; then
  cand=""
  for py in python3 python; do
    command -v "$py" >/dev/null 2>&1 || continue
    dir=$(timeout "$(upto 20)" "$py" -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null)
    if [ -n "$dir" ] && [ -e "$dir/lib/libnccl.so.2" ]; then
      cand="$dir/lib/libnccl.so.2"
      echo "run.sh: NCCL from the Python package nvidia.nccl: $cand"
      break
    fi
  done
  if [ -z "$cand" ]; then
    cand=$(timeout "$(upto 30)" find / -xdev \( -path /proc -o -path /sys -o -path /dev \) -prune -o \
      \( -name 'libnccl.so.2' -o -name 'libnccl.so.2.*' \) -print 2>/dev/null | head -n 1)
    [ -n "$cand" ] && echo "run.sh: default search found no NCCL; a filesystem walk found $cand"
  fi
  [ -n "$cand" ] && export CPCACHE_NCCL_LIBRARY="$cand"
fi

echo "== gpu-info"
run "$(upto 30)" "$here/cpcache" gpu-info 2>&1 | tee "$logs/gpu-info.txt"

# test_pkg NAME PATTERN: one test binary; a missing one is a failure.
test_pkg() {
  local pkg="$1" pattern="$2" bin="$here/$1.test" start rc pass fail skip
  echo "== $pkg.test -test.run '$pattern'"
  if ! [ -x "$bin" ]; then
    problems+=("$pkg.test missing")
    echo "  $pkg: FAILED: $bin is missing"
    return
  fi
  budget "$pkg" || return
  start=$(date +%s)
  # ShimDigest checks the source tree, which need not be here.
  run "$secs" "$bin" -test.v -test.count=1 -test.timeout="$((secs - 5))s" -test.run "$pattern" \
    -test.skip 'ShimDigest' >"$logs/$pkg.log" 2>&1
  rc=$?
  grep -E '^(info|bandwidth|run\.sh):' "$logs/$pkg.log"
  pass=$(grep -cE '^--- PASS' "$logs/$pkg.log")
  fail=$(grep -cE '^--- FAIL' "$logs/$pkg.log")
  skip=$(grep -cE '^--- SKIP' "$logs/$pkg.log")
  total_pass=$((total_pass + pass)) total_fail=$((total_fail + fail)) total_skip=$((total_skip + skip))
  # Each failed or skipped test with the line before it (-v prints a test's last log line,
  # its reason, just before its verdict).
  grep -E -B1 '^\s*--- (FAIL|SKIP)' "$logs/$pkg.log" | grep -vE '^(--|\s*=== (RUN|PAUSE|CONT|NAME) .*)$' | sed 's/^/  /'
  if [ "$rc" -ne 0 ]; then
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
      problems+=("$pkg.test timed out after ${secs}s")
    else
      problems+=("$pkg.test exit $rc")
    fi
    echo "  $pkg: FAILED (exit $rc); log tail:"
    grep -vE '^(=== (RUN|PAUSE|CONT)|info:|bandwidth:)' "$logs/$pkg.log" | tail -n 60 | sed 's/^/    /'
  fi
  echo "  $pkg: $pass passed, $fail failed, $skip skipped; exit $rc; $(($(date +%s) - start))s"
}

# run_failed NAME RC counts run NAME (exit status RC) as failed and shows its log's tail.
run_failed() {
  total_fail=$((total_fail + 1))
  problems+=("$1 exit $2")
  echo "  $1: FAILED (exit $2); log tail:"
  tail -n 30 "$logs/$1.log" | sed 's/^/    /'
}

# device_run L2 [MODEL LAYOUT]: `cpcache run --device cuda --l2 L2` on 8 ranks sharing this
# machine's devices; without MODEL a small workload of opaque 64 KiB pages, with MODEL (a
# --model preset) per-layer device L1 buffers, the L2 in LAYOUT and layer-wise waits. It
# passes with exit 0, 0 bad pages and 1.00 collectives per step.
device_run() {
  local l2="$1" model="${2:-}" layout="${3:-page_first}" name="cpcache-run-$1" rc shape
  shape=(--clients 8 --rounds 4 --l1-pages 160 --l2-pages 512 --kv-bytes-per-token 4096)
  if [ -n "$model" ]; then
    name="$name-$model"
    shape=(--clients 8 --rounds 4 --l1-pages 48 --l2-pages 160 --model "$model" --l2-layout "$layout")
  fi
  echo "== cpcache run --device cuda --l2 $l2${model:+ --model $model --l2-layout $layout} (8 ranks)"
  budget "$name" || return
  run "$secs" "$here/cpcache" run --device cuda --l2 "$l2" --world 8 --dp 1 --attn-cp 8 \
    "${shape[@]}" --timeout "$((secs - 5))s" >"$logs/$name.log" 2>&1
  rc=$?
  sed -n '/^cpcache run report/,$p' "$logs/$name.log"
  if [ "$rc" -eq 0 ] && grep -qE 'bad pages 0$' "$logs/$name.log" &&
    grep -qE '\(1\.00 consensus collectives per step\)' "$logs/$name.log"; then
    total_pass=$((total_pass + 1))
  else
    run_failed "$name" "$rc"
  fi
}

# c_example [SLABS]: the C example (examples/c/engine.c, linked to the bundled libcpcache.so)
# on 4 ranks under `cpcache launch`, lending per-layer K/V buffers in device 0's memory through
# the C ABI over pinned host slabs (or SLABS, --cuda-ipc): it passes with exit 0 and, on every
# rank, L2 hits, bad_pages=0 and layers read after both kinds of layer wait.
c_example() {
  local slabs="${1:-}" name="c-example${1:+-cuda-ipc}" rc
  echo "== engine --attn-cp 4 --device 0 ${slabs:+$slabs }(4 ranks, the C ABI)"
  budget "$name" || return
  run "$secs" "$here/cpcache" launch -n 4 -- "$here/engine" --attn-cp 4 --device 0 $slabs --l1-pages 16 \
    >"$logs/$name.log" 2>&1
  rc=$?
  grep -E '^\[[0-9]+\] rank [0-9]+/' "$logs/$name.log"
  if [ "$rc" -eq 0 ] && [ "$(grep -cE 'tokens_hit_l2=[1-9].* bad_pages=0 l1=device0 .*layer_waits=[1-9][0-9]* layer_waits_on=[1-9]' "$logs/$name.log")" -eq 4 ]; then
    total_pass=$((total_pass + 1))
  else
    run_failed "$name" "$rc"
  fi
}

test_pkg cuda .
test_pkg cudaslab .
test_pkg hicache '^TestGPU'
test_pkg cudaengine '^TestGPU' # the page-copy and per-layer copy efficiency ratios
test_pkg libcpcache '^TestGPU' # the C ABI over per-layer device L1 buffers
device_run device
device_run host
device_run device llama-3-8b page_first
device_run host deepseek-v3 layer_first
c_example
c_example --cuda-ipc
test_pkg nccl . # last: an NCCL hang must not eat the others' time
[ "$total_fail" -eq 0 ] && [ "${#problems[@]}" -eq 0 ]
