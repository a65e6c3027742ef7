package shm_test

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/cpcache/cpcache/dist"
	"github.com/cpcache/cpcache/dist/grouptest"
	"github.com/cpcache/cpcache/dist/local"
	"github.com/cpcache/cpcache/dist/shm"
	"github.com/cpcache/cpcache/internal/multiproc"
)

// BenchmarkAllReduce8 times AllReduce of 8 int64 MIN with members as goroutines: the
// shared-memory group next to the in-process channel group (dist/local) as the baseline of
// the same run.
func BenchmarkAllReduce8(b *testing.B) {
	for _, n := range []int{2, 8} {
		b.Run(fmt.Sprintf("backend=shm/ranks=%d", n), func(b *testing.B) {
			gs, _ := newGroups(b, n, shm.Options{})
			gsIface := make([]dist.Group, n)
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

func benchAllReduce8(b *testing.B, gs []dist.Group) {
	b.ResetTimer()
	errs := grouptest.Parallel(len(gs), func(r int) error {
		v := make([]int64, 8)
		for range b.N {
			if err := gs[r].AllReduce(context.Background(), dist.Min, v); err != nil {
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

var benchLine = regexp.MustCompile(`BENCH (\w+) median_ns=(\d+) p99_ns=(\d+) total_ns=(\d+)`)

// BenchmarkAllReduce8MultiProcess times AllReduce of 8 int64 MIN between rank processes on
// the Gloo world group and on the shared-memory group built over it, side by side in the
// same processes: rank 0 measures every operation and reports each backend's median and
// p99 latency and the ratio of the medians (gloo/shm). ns/op is the shared-memory mean.
func BenchmarkAllReduce8MultiProcess(b *testing.B) {
	for _, n := range []int{2, 8, 16} {
		b.Run(fmt.Sprintf("ranks=%d", n), func(b *testing.B) {
			res := multiproc.Run(b, multiproc.Spec{Role: "bench", N: n, Env: rankEnv(b, b.N), Timeout: 5 * time.Minute})
			median := map[string]float64{}
			for _, m := range benchLine.FindAllStringSubmatch(res[0].Output, -1) {
				med, _ := strconv.ParseFloat(m[2], 64)
				p99, _ := strconv.ParseFloat(m[3], 64)
				total, _ := strconv.ParseFloat(m[4], 64)
				median[m[1]] = med
				b.ReportMetric(med/1e3, m[1]+"-median-µs")
				b.ReportMetric(p99/1e3, m[1]+"-p99-µs")
				if m[1] == "shm" {
					b.ReportMetric(total/float64(b.N), "ns/op")
				}
			}
			if median["shm"] == 0 || median["gloo"] == 0 {
				b.Fatalf("rank 0 printed no result for both backends:\n%s", res[0].Output)
			}
			b.ReportMetric(median["gloo"]/median["shm"], "gloo/shm")
		})
	}
}
