package hicache

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/cpcache/cpcache/gloo"
	"github.com/cpcache/cpcache/hicache/kvtest"
	"github.com/cpcache/cpcache/internal/testenv/multiproc"
	"github.com/cpcache/cpcache/parallel"
	"github.com/cpcache/cpcache/parallel/local"
)

// benchTree fills a core with about pages cached pages: sequences of 64 pages sharing
// prefixes, and returns sequences to look up (cached ones).
func benchTree(b *testing.B, pages int) (*Core, [][]int32) {
	const pageSize, seqPages = 16, 64
	c, err := NewCore(CoreConfig{Options: Options{PageSize: pageSize, L1Pages: pages + seqPages}, Slabs: 1, PagesPerSlab: 64, CPRank: 0})
	if err != nil {
		b.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	var seqs [][]int32
	for c.L1Used()+seqPages <= pages {
		var s []int32
		if len(seqs) > 0 && rng.IntN(2) == 0 { // share a prefix with an earlier sequence
			base := seqs[rng.IntN(len(seqs))]
			s = append(s, base[:rng.IntN(seqPages)*pageSize]...)
		}
		for len(s) < seqPages*pageSize {
			s = append(s, rng.Int32())
		}
		if _, err := c.Insert(s); err != nil {
			b.Fatal(err)
		}
		seqs = append(seqs, s)
	}
	return c, seqs
}

// BenchmarkMatchPerPage: Match of a cached 64-page sequence, per page, with 1e3..1e6 pages
// cached; "map-ns/page" is the baseline measured in the same benchmark: hashing each page and
// looking it up in a plain Go map keyed by the chained page hash.
func BenchmarkMatchPerPage(b *testing.B) {
	for _, pages := range []int{1_000, 10_000, 100_000, 1_000_000} {
		b.Run(fmt.Sprintf("pages=%d", pages), func(b *testing.B) {
			c, seqs := benchTree(b, pages)
			flat := map[uint64]int32{}
			for _, s := range seqs {
				for i, h := range PrefixHashes(s, 16) {
					flat[h] = int32(i)
				}
			}
			b.ResetTimer()
			matched, iters := 0, 0
			start := time.Now()
			for ; b.Loop(); iters++ {
				matched += c.Match(seqs[iters%len(seqs)]).DevicePages
			}
			perPage := float64(time.Since(start).Nanoseconds()) / float64(matched)
			base := mapBaseline(seqs, flat, iters)
			b.ReportMetric(perPage, "ns/page")
			b.ReportMetric(base, "map-ns/page")
			b.ReportMetric(perPage/base, "x-map")
		})
	}
}

// mapBaseline is the cost per page of the plain-map lookup of every page of the sequences,
// over the same iters sequences the benchmark matched (b.Loop has stopped the timer).
func mapBaseline(seqs [][]int32, flat map[uint64]int32, iters int) float64 {
	n, sink := 0, int32(0)
	start := time.Now()
	for rep := range iters {
		s := seqs[rep%len(seqs)]
		h := RootHash
		for p := 0; p+16 <= len(s); p += 16 {
			h = PageHash(h, s[p:p+16])
			v, ok := flat[h]
			if !ok {
				break
			}
			sink += v
			n++
		}
	}
	_ = sink
	return float64(time.Since(start).Nanoseconds()) / float64(max(n, 1))
}

// BenchmarkInsertPerPage: Insert of a new 64-page sequence that shares half its pages with
// a cached one (so it walks, splits and creates), per page, with the baseline of inserting
// the new pages' hashes into a plain Go map.
func BenchmarkInsertPerPage(b *testing.B) {
	for _, pages := range []int{1_000, 10_000, 100_000, 1_000_000} {
		b.Run(fmt.Sprintf("pages=%d", pages), func(b *testing.B) {
			c, seqs := benchTree(b, pages)
			rng := rand.New(rand.NewPCG(3, 4))
			news := make([][]int32, 256)
			for i := range news {
				base := seqs[rng.IntN(len(seqs))]
				s := append([]int32(nil), base[:32*16]...)
				for len(s) < 64*16 {
					s = append(s, rng.Int32())
				}
				news[i] = s
			}
			b.ResetTimer()
			var inserted, iters int
			var elapsed time.Duration
			for ; b.Loop(); iters++ {
				s := news[iters%len(news)]
				start := time.Now()
				res, err := c.Insert(s)
				elapsed += time.Since(start)
				if err != nil {
					b.Fatal(err)
				}
				inserted += res.Pages
				// Undo, untimed, so the tree keeps its size: evict the new leaf.
				b.StopTimer()
				c.EvictL1(32)
				b.StartTimer()
			}
			b.StopTimer()
			perPage := float64(elapsed.Nanoseconds()) / float64(inserted)
			flat := map[uint64]int32{}
			n := 0
			start := time.Now()
			for i := range iters { // the same sequences the benchmark inserted
				s := news[i%len(news)]
				h := RootHash
				for p := 0; p+16 <= len(s); p += 16 {
					h = PageHash(h, s[p:p+16])
					flat[h^uint64(i)] = int32(p)
					n++
				}
				if len(flat) > 1<<20 {
					clear(flat)
				}
			}
			base := float64(time.Since(start).Nanoseconds()) / float64(max(n, 1))
			b.ReportMetric(perPage, "ns/page")
			b.ReportMetric(base, "map-ns/page")
			b.ReportMetric(perPage/base, "x-map")
		})
	}
}

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
		v := make([]int64, VectorLen)
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
	v := make([]int64, VectorLen)
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
