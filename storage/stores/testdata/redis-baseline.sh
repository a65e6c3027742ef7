#!/usr/bin/env bash
# Side-by-side throughput of the Redis backend against the hand-written RESP client it
# replaced: BenchmarkRedisPages of this tree and of BASE (default: the last commit with that
# client), built from the same benchmark file and run alternately RUNS times on one
# redis-server per run, compared with benchstat. The old client wrote checksummed values
# without MACs, so its one mode is "nomac"; the second table sets this tree's "mac" mode
# (the default, authenticated values) against it.
#   usage: storage/stores/testdata/redis-baseline.sh [BASE]     env: RUNS (10), BENCHTIME (100x)
set -euo pipefail
base=${1:-1bc4e1e^}
runs=${RUNS:-10}
benchtime=${BENCHTIME:-100x}
root=$(git rev-parse --show-toplevel)
tmp=$(mktemp -d)
trap 'git -C "$root" worktree remove --force "$tmp/base" >/dev/null 2>&1 || true; rm -rf "$tmp"' EXIT
benchstat=(go run golang.org/x/perf/cmd/benchstat@v0.0.0-20260908200009-22c9c6c9d4da)

git -C "$root" worktree add --detach "$tmp/base" "$base" >/dev/null 2>&1
# BASE has the backends in package storage itself: the benchmark is rewritten for it.
sed -e 's/^package stores_test$/package storage_test/' -e '\#"github.com/cpcache/cpcache/storage/stores"#d' \
	-e 's/\bstores\./storage./g' "$root/storage/stores/redis_bench_test.go" >"$tmp/base/storage/redis_bench_test.go"
cat >"$tmp/base/storage/redis_bench_modes_test.go" <<'GO'
package storage_test

import (
	"testing"

	"github.com/cpcache/cpcache/storage"
)

// The old client knows no MAC key: its values are checksummed only.
func redisBenchModes() []redisBenchMode {
	return []redisBenchMode{{"nomac", func(_ *testing.B, ns storage.Namespace) storage.Options {
		return storage.Options{Namespace: ns}
	}}}
}
GO
(cd "$tmp/base" && go test -c -o "$tmp/old.test" ./storage)
(cd "$root" && go test -c -o "$tmp/new.test" ./storage/stores)
for i in $(seq "$runs"); do
	for v in old new; do
		(cd "$root/storage" && "$tmp/$v.test" -test.run '^$' -test.bench '^BenchmarkRedisPages$' \
			-test.benchtime "$benchtime") | grep '^Benchmark' >>"$tmp/$v.txt"
	done
	echo "run $i of $runs done" >&2
done
echo "== same work (checksums, no MACs): hand-written client vs go-redis"
grep '/nomac/' "$tmp/new.txt" >"$tmp/new-nomac.txt"
"${benchstat[@]}" "old=$tmp/old.txt" "new=$tmp/new-nomac.txt"
echo "== authenticated values (default) vs the hand-written client without MACs"
grep '/mac/' "$tmp/new.txt" | sed 's|/mac/|/nomac/|' >"$tmp/new-mac.txt"
"${benchstat[@]}" "old=$tmp/old.txt" "new-mac=$tmp/new-mac.txt"
