package alloc

import (
	"testing"
	"time"
)

// prefill fills half of the pool with committed ranges of up to 4096 pages (so the range
// table stays small whatever the pool size) and returns the next free range id.
func prefill(b *testing.B, a *Allocator, id RangeID) RangeID {
	b.Helper()
	for a.TotalFree() > a.Slabs()*a.PagesPerSlab()/2 {
		k := min(4096, a.TotalFree()-a.Slabs()*a.PagesPerSlab()/2)
		if _, err := a.Reserve(id, 0, k); err != nil {
			b.Fatal(err)
		}
		if err := a.Commit(id); err != nil {
			b.Fatal(err)
		}
		id++
	}
	return id
}

// BenchmarkReserveCommitFreePerPage: one 16-page range reserved, committed and freed per op,
// on a half-full 8 × 4096-page pool; ns/page is the cost per page.
func BenchmarkReserveCommitFreePerPage(b *testing.B) {
	a, _ := New(8, 4096)
	id := prefill(b, a, 1)
	const k = 16
	b.ResetTimer()
	for i := range b.N {
		if _, err := a.Reserve(id, i%8, k); err != nil {
			b.Fatal(err)
		}
		if err := a.Commit(id); err != nil {
			b.Fatal(err)
		}
		if err := a.Free(id); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*k), "ns/page")
}

// BenchmarkDigestUpdateVsPoolSize times one page change (a 1-page Reserve, Commit, Free: three
// digest updates plus the free-structure work) on half-full pools of 1e3 and 1e6 pages, in the
// same run, and reports both and their ratio (1.0 = independent of pool size).
func BenchmarkDigestUpdateVsPoolSize(b *testing.B) {
	small, _ := New(8, 125)
	large, _ := New(8, 125000)
	idSmall, idLarge := prefill(b, small, 1), prefill(b, large, 1)
	cycle := func(a *Allocator, id RangeID, n int) time.Duration {
		t0 := time.Now()
		for i := range n {
			if _, err := a.Reserve(id, i%8, 1); err != nil {
				b.Fatal(err)
			}
			if err := a.Commit(id); err != nil {
				b.Fatal(err)
			}
			if err := a.Free(id); err != nil {
				b.Fatal(err)
			}
		}
		return time.Since(t0)
	}
	const inner = 256
	var tSmall, tLarge time.Duration
	b.ResetTimer()
	for range b.N {
		tSmall += cycle(small, idSmall, inner)
		tLarge += cycle(large, idLarge, inner)
	}
	n := float64(b.N * inner)
	b.ReportMetric(float64(tSmall.Nanoseconds())/n, "ns/change@1e3")
	b.ReportMetric(float64(tLarge.Nanoseconds())/n, "ns/change@1e6")
	b.ReportMetric(float64(tLarge)/float64(tSmall), "ratio_1e6/1e3")
}

// BenchmarkPageTerm is the digest term alone (one hash of a page change).
func BenchmarkPageTerm(b *testing.B) {
	var d uint64
	for i := range b.N {
		d += pageTerm(Page{i & 7, i}, RangeID(i), i&1 == 0)
	}
	sinkDigest = d
}

var sinkDigest uint64
