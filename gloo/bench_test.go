package gloo_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cpcache/cpcache/internal/testenv/multiproc"
	"github.com/cpcache/cpcache/parallel/grouptest"
	"github.com/cpcache/cpcache/parallel/local"
)

// BenchmarkCollectives times each collective on a Gloo world of 2 and 8 rank processes
// (rank 0's mean, reported as gloo-ns/op; the ns/op column includes process start-up)
// and, as the baseline of the same run, on an in-process
// parallel/local group of the same size; x-local is the ratio. The rank processes run
// max(b.N, 200) operations each, so the figure does not include process start-up.
func BenchmarkCollectives(b *testing.B) {
	for _, n := range []int{2, 8} {
		for _, op := range []string{"allreduce8", "broadcast4k", "allgather64", "barrier"} {
			b.Run(fmt.Sprintf("%s/ranks=%d", op, n), func(b *testing.B) {
				iters := max(b.N, 200)
				res := multiproc.Run(b, multiproc.Spec{Role: "bench", N: n, Timeout: 3 * time.Minute,
					Env: []string{"CPCACHE_STORE=" + fileStore(b), "CPCACHE_TEST_OP=" + op, fmt.Sprintf("CPCACHE_TEST_ITERS=%d", iters)}})
				if b.Failed() {
					return
				}
				ns := -1.0
				for _, line := range strings.Split(res[0].Output, "\n") {
					if v, ok := strings.CutPrefix(line, "ns/op "); ok {
						ns, _ = strconv.ParseFloat(v, 64)
					}
				}
				if ns <= 0 {
					b.Fatalf("rank 0 reported no time:\n%s", res[0].Output)
				}
				base := localBaseline(b, n, op, iters)
				b.ReportMetric(ns, "gloo-ns/op")
				b.ReportMetric(base, "local-ns/op")
				b.ReportMetric(ns/base, "x-local")
			})
		}
	}
}

// localBaseline times op on an in-process group of n members (mean ns of member 0).
func localBaseline(b *testing.B, n int, op string, iters int) float64 {
	members := local.World(n, local.Options{Timeout: time.Minute})
	ctx := context.Background()
	var ns int64
	errs := grouptest.Parallel(n, func(r int) error {
		v, err := timeOps(ctx, members[r], benchOps[op], iters)
		if r == 0 {
			ns = v
		}
		return err
	})
	for r, err := range errs {
		if err != nil {
			b.Fatalf("local baseline, member %d: %v", r, err)
		}
	}
	return float64(max(ns, 1))
}
