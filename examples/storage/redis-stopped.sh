#!/bin/bash
# redis-stopped.sh [CPCACHE-RUN-FLAGS...]: the circuit breaker's figure of docs/operating.md's failure
# model. A CP4 `cpcache run` against a private Redis (port $PORT, default 6399) that is
# stopped by SIGSTOP once it holds 200 keys, as a hung server would be; prints the run's wall
# time and its storage lines. $URL_OPTIONS is appended to the redis:// URL (e.g.
# '?timeout=300ms'). Needs redis-server and redis-cli; cpcache from $CPCACHE or PATH.
set -euo pipefail
cpcache=${CPCACHE:-cpcache}
port=${PORT:-6399}
dir=$(mktemp -d)
trap 'kill -CONT $(cat $dir/redis.pid) 2>/dev/null; redis-cli -p $port shutdown nosave >/dev/null 2>&1 || true; rm -rf $dir' EXIT
head -c 32 /dev/urandom >$dir/key
chmod 600 $dir/key
redis-server --port $port --save "" --appendonly no --daemonize yes --pidfile $dir/redis.pid >/dev/null
until redis-cli -p $port ping >/dev/null 2>&1; do sleep 0.05; done
start=$(date +%s.%N)
"$cpcache" run --world 4 --dp 1 --attn-cp 4 --storage "redis://127.0.0.1:$port/stopped${URL_OPTIONS:-}" \
  --storage-key-file $dir/key "$@" >$dir/report.txt 2>&1 &
run=$!
while kill -0 $run 2>/dev/null && [ "$(redis-cli -p $port dbsize)" -lt 200 ]; do sleep 0.02; done
kill -STOP "$(cat $dir/redis.pid)"
rc=0
wait $run || rc=$?
echo "exit $rc, wall $(echo "$(date +%s.%N) - $start" | bc) s"
grep -E "storage (pages|circuit)" $dir/report.txt
exit $rc
