package shm_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/cpcache/cpcache/internal/testenv/multiproc"
	"github.com/cpcache/cpcache/parallel"
	"github.com/cpcache/cpcache/parallel/grouptest"
	"github.com/cpcache/cpcache/parallel/local"
	"github.com/cpcache/cpcache/parallel/shm"
)

// BenchmarkAllReduce8 times AllReduce of 8 int64 MIN with members as goroutines: the
// shared-memory group next to the in-process channel group (parallel/local) as the baseline of
// the same run.
func BenchmarkAllReduce8(b *testing.B) {
	for _, n := range []int{2, 8} {
		b.Run(fmt.Sprintf("backend=shm/ranks=%d", n), func(b *testing.B) {
			gs, _ := newGroups(b, n, shm.Options{})
			gsIface := make([]parallel.Group, n)
			for i, g := range gs {
				gsIface[i] = g
			}
			benchAllReduce8(b, gsIface)
		})
		b.Run(fmt.Sprintf("backend=local/ranks=%d", n), func(b *testing.B) {
			benchAllReduce8(b, local.Groups(local.World(n, local.Options{})))
		})
	}
}

func benchAllReduce8(b *testing.B, gs []parallel.Group) {
	b.ResetTimer()
	errs := grouptest.Parallel(len(gs), func(r int) error {
		v := make([]int64, 8)
		for range b.N {
			if err := gs[r].AllReduce(context.Background(), parallel.Min, v); err != nil {
				return err
			}
		}
		return nil
	})
	for _, err := range errs {
		if err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAllReduce8MultiProcess times AllReduce of 8 int64 MIN between rank processes on
// the Gloo world group and on the shared-memory group built over it, side by side in the
// same processes: rank 0 measures every operation and reports each backend's median and
// p99 latency and the ratio of the medians (gloo/shm). ns/op is the shared-memory mean.
func BenchmarkAllReduce8MultiProcess(b *testing.B) {
	for _, n := range []int{2, 8, 16} {
		b.Run(fmt.Sprintf("ranks=%d", n), func(b *testing.B) {
			res := multiproc.Run(b, multiproc.Spec{Role: "bench", N: n, Env: rankEnv(b, b.N), Timeout: 5 * time.Minute})
			var times map[string]benchTimes
			if err := json.Unmarshal(res[0].Report, &times); err != nil {
				b.Fatalf("rank 0's report %q: %v\n%s", res[0].Report, err, res[0].Output)
			}
			for name, tm := range times {
				b.ReportMetric(us(tm.Median), name+"-median-µs")
				b.ReportMetric(us(tm.P99), name+"-p99-µs")
			}
			gloo, shm := times["gloo"], times["shm"]
			if shm.Median == 0 || gloo.Median == 0 {
				b.Fatalf("rank 0 reported no result for both backends: %q\n%s", res[0].Report, res[0].Output)
			}
			b.ReportMetric(float64(shm.Total)/float64(b.N), "ns/op")
			b.ReportMetric(float64(gloo.Median)/float64(shm.Median), "gloo/shm")
		})
	}
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
