package hicache

import (
	"context"
	"testing"
	"time"

	"github.com/cpcache/cpcache/parallel"
)

// BenchmarkL3Prefetch measures a prefetch through the whole protocol (query, agreed
// reserve, verified reads by the I/O rank, agreed insert; 2 ranks, one slab group, 32 pages
// of 64 KiB read in one chunk, directory storage) against reading the same pages with the
// storage's Get alone, in the same run. The ranks step with a short sleep in between, as a
// scheduler does (stepping back to back, in-process ranks starve the storage goroutines of
// CPU). Reported: MB/s of each and the ratio.
func BenchmarkL3Prefetch(b *testing.B) {
	const pages, pageBytes, pace = 32, 64 << 10, 20 * time.Microsecond
	ns := testNamespace(b)
	rc := l3RigConfig(parallel.LayoutConfig{World: 2, AttnCP: 2}, openStores(b, "file://"+b.TempDir(), ns), ns,
		L3Options{PrefetchPolicy: PrefetchWaitComplete, PrefetchQuotaPages: pages, ReadChunkPages: pages})
	rc.pageBytes, rc.pagesPerSlab = pageBytes, pages
	rc.opts.L1Pages = pages + 4
	r := newRig(b, rc)
	seq := tokensN(7, pages*4)
	r.insertAll([][]int32{seq})
	d := r.caches[0].l3
	keys := d.keys(PrefixHashes(seq, 4))
	bufs := make([][]byte, pages)
	for i := range bufs {
		bufs[i] = make([]byte, pageBytes)
	}
	var proto, plain time.Duration
	b.ResetTimer()
	for range b.N {
		r.evictAll()
		start := time.Now()
		if err := r.each("prefetch", func(_ int, c *Cache) error {
			res, err := c.Prefetch(seq)
			for err == nil && c.PrefetchPending(res.ID) {
				time.Sleep(pace) // the model's forward pass between two scheduler steps
				err = c.Step(context.Background())
			}
			return err
		}); err != nil {
			b.Fatal(err)
		}
		proto += time.Since(start)
		start = time.Now()
		if n, err := d.st.Get(context.Background(), keys, bufs, nil); err != nil || n != pages {
			b.Fatalf("get: %d of %d pages, %v", n, pages, err)
		}
		plain += time.Since(start)
	}
	if st := r.sameStats(); st.L3PrefetchedPages != int64(pages*b.N) {
		b.Fatalf("prefetched %d pages, want %d", st.L3PrefetchedPages, pages*b.N)
	}
	mb := float64(pages*pageBytes*b.N) / 1e6
	b.ReportMetric(mb/proto.Seconds(), "MB/s")
	b.ReportMetric(mb/plain.Seconds(), "get-MB/s")
	b.ReportMetric(plain.Seconds()/proto.Seconds(), "x-get")
}
