package slab

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/cpcache/cpcache/parallel/local"
)

// BenchmarkPageCopy copies pages into a host slab with WritePage (locked, bounds checked) and
// through the slice Page returns, and, as the baseline measured in the same run, with a plain
// copy into an ordinary heap buffer. Each op copies every one of 32 pages once per method,
// each method into its own 32-page destination, so caches treat them alike. It reports ns per
// page for each method and the ratios to the baseline.
func BenchmarkPageCopy(b *testing.B) {
	for _, pageSize := range []int{4 << 10, 64 << 10, 1 << 20} {
		b.Run(fmt.Sprintf("page=%dKiB", pageSize>>10), func(b *testing.B) {
			const pages = 32
			g := local.World(1, local.Options{})[0]
			defer g.Close()
			s, err := OpenSet(context.Background(), g, Spec{Backend: Host, PageSize: pageSize, Pages: 2 * pages, Tag: "bench"})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			src := make([]byte, pageSize)
			for i := range src {
				src[i] = byte(i)
			}
			plain := make([]byte, pageSize*pages)
			copyWrite := func(i int) {
				if err := s.WritePage(Page{Slab: 0, Index: i}, src); err != nil {
					b.Fatal(err)
				}
			}
			copySlice := func(i int) {
				dst, err := s.Page(Page{Slab: 0, Index: pages + i})
				if err != nil {
					b.Fatal(err)
				}
				copy(dst, src)
			}
			copyPlain := func(i int) { copy(plain[i*pageSize:(i+1)*pageSize], src) }
			methods := []func(int){copyWrite, copySlice, copyPlain}
			elapsed := make([]time.Duration, len(methods))
			for _, m := range methods { // fault every destination page in first
				for i := range pages {
					m(i)
				}
			}
			b.SetBytes(int64(pageSize) * pages * int64(len(methods)))
			b.ResetTimer()
			for range b.N {
				for k, m := range methods {
					t0 := time.Now()
					for i := range pages {
						m(i)
					}
					elapsed[k] += time.Since(t0)
				}
			}
			n := float64(b.N * pages)
			b.ReportMetric(float64(elapsed[0].Nanoseconds())/n, "ns/WritePage")
			b.ReportMetric(float64(elapsed[1].Nanoseconds())/n, "ns/Page+copy")
			b.ReportMetric(float64(elapsed[2].Nanoseconds())/n, "ns/memmove")
			b.ReportMetric(float64(elapsed[0])/float64(elapsed[2]), "WritePage/memmove")
			b.ReportMetric(float64(elapsed[1])/float64(elapsed[2]), "Page+copy/memmove")
		})
	}
}
