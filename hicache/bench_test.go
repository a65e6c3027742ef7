package hicache

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/cpcache/cpcache/gloo"
	"github.com/cpcache/cpcache/hicache/core"
	"github.com/cpcache/cpcache/hicache/kvtest"
	"github.com/cpcache/cpcache/internal/testenv/multiproc"
	"github.com/cpcache/cpcache/parallel"
	"github.com/cpcache/cpcache/parallel/local"
)

// BenchmarkConsensusStep8InProcess: one Step on 8 in-process ranks (parallel/local), against a
// bare AllReduce of the same vector on the same kind of group measured in the same run.
func BenchmarkConsensusStep8InProcess(b *testing.B) {
	const n = 8
	l, err := parallel.NewLayout(parallel.LayoutConfig{World: n, AttnCP: n})
	if err != nil {
		b.Fatal(err)
	}
	members := local.New(l.ReplicaGroup(0), local.Options{Kind: "replica"})
	raw := local.New(l.ReplicaGroup(0), local.Options{Kind: "raw"})
	caches := make([]*Cache, n)
	slabs := kvtest.NewMemSlabs(l.SlabGroup(0), 16, 64)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			caches[i], errs[i] = New(context.Background(), Config{Options: Options{L1Pages: 64}, Layout: l, Rank: i, Group: members[i], Slabs: slabs})
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		b.Fatal(err)
	}
	defer func() {
		for _, c := range caches {
			c.Close()
		}
	}()
	iters := b.N
	run := func(f func(i int) error) time.Duration {
		start := time.Now()
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range iters {
					if err := f(i); err != nil {
						b.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
		return time.Since(start)
	}
	b.ResetTimer()
	step := run(func(i int) error { return caches[i].Step(context.Background()) })
	b.StopTimer()
	bare := run(func(i int) error {
		v := make([]int64, core.VectorLen)
		return raw[i].AllReduce(context.Background(), parallel.Min, v)
	})
	b.ReportMetric(float64(step.Nanoseconds())/float64(iters), "ns/step")
	b.ReportMetric(float64(bare.Nanoseconds())/float64(iters), "allreduce-ns")
	b.ReportMetric(float64(step)/float64(bare), "x-allreduce")
}

// BenchmarkConsensusStep8Gloo: one Step on 8 rank processes over Gloo (TCP on loopback),
// against a bare AllReduce of the same vector on the same group, measured in the same
// processes.
func BenchmarkConsensusStep8Gloo(b *testing.B) {
	iters := max(b.N, 200)
	res := multiproc.Run(b, multiproc.Spec{Role: "hicache-step-bench", N: mpRanks, Timeout: 3 * time.Minute,
		Env: mpEnv(b, "CPCACHE_TEST_ITERS="+strconv.Itoa(iters))})
	if b.Failed() {
		b.FailNow()
	}
	var step, bare float64
	if _, err := fmt.Sscanf(string(res[0].Report), "%g %g", &step, &bare); err != nil {
		b.Fatalf("rank 0 report %q: %v", res[0].Report, err)
	}
	b.ReportMetric(step, "ns/step")
	b.ReportMetric(bare, "allreduce-ns")
	b.ReportMetric(step/bare, "x-allreduce")
}

func roleStepBench(ctx context.Context, world *gloo.Group) error {
	c, counted, cleanup, err := mpCache(ctx, world, Options{L1Pages: 64}, 0)
	if err != nil {
		return err
	}
	defer cleanup()
	iters, _ := strconv.Atoi(os.Getenv("CPCACHE_TEST_ITERS"))
	for range 20 { // warm up
		if err := c.Step(ctx); err != nil {
			return err
		}
	}
	// Alternate blocks of steps and bare all-reduces so that drift (CPU contention between
	// the rank processes) affects both alike.
	const block = 25
	var step, bare time.Duration
	v := make([]int64, core.VectorLen)
	for done := 0; done < iters; done += block {
		start := time.Now()
		for range block {
			if err := c.Step(ctx); err != nil {
				return err
			}
		}
		step += time.Since(start)
		start = time.Now()
		for range block {
			if err := counted.AllReduce(ctx, parallel.Min, v); err != nil {
				return err
			}
		}
		bare += time.Since(start)
	}
	iters = (iters + block - 1) / block * block
	return multiproc.Report(fmt.Appendf(nil, "%g %g\n", float64(step.Nanoseconds())/float64(iters), float64(bare.Nanoseconds())/float64(iters)))
}
