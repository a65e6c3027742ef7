package core

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// benchTree fills a core with about pages cached pages: sequences of 64 pages sharing
// prefixes, and returns sequences to look up (cached ones).
func benchTree(b *testing.B, pages int) (*Core, [][]int32) {
	const pageSize, seqPages = 16, 64
	c, err := New(Config{Options: Options{PageSize: pageSize, L1Pages: pages + seqPages}, Slabs: 1, PagesPerSlab: 64, CPRank: 0})
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
		if _, err := c.Insert(Request{Tokens: s}); err != nil {
			b.Fatal(err)
		}
		seqs = append(seqs, s)
	}
	return c, seqs
}

// BenchmarkMatchPerPage: Match of a cached 64-page sequence, per page, with 1e3..1e6 pages
// cached; "map-ns/page" is the baseline measured in the same benchmark: hashing each page and
// looking it up in a plain Go map keyed by its id; "hash-ns/page" is computing the page ids
// alone (SHA-256 of 16 tokens).
func BenchmarkMatchPerPage(b *testing.B) {
	for _, pages := range []int{1_000, 10_000, 100_000, 1_000_000} {
		b.Run(fmt.Sprintf("pages=%d", pages), func(b *testing.B) {
			c, seqs := benchTree(b, pages)
			flat := map[PageID]int32{}
			for _, s := range seqs {
				for i, h := range PrefixHashes(s, 16) {
					flat[h] = int32(i)
				}
			}
			b.ResetTimer()
			matched, iters := 0, 0
			start := time.Now()
			for ; b.Loop(); iters++ {
				matched += c.Match(Request{Tokens: seqs[iters%len(seqs)]}).DevicePages
			}
			perPage := float64(time.Since(start).Nanoseconds()) / float64(matched)
			base := mapBaseline(seqs, flat, iters)
			hash := hashBaseline(seqs, iters)
			b.ReportMetric(perPage, "ns/page")
			b.ReportMetric(base, "map-ns/page")
			b.ReportMetric(perPage/base, "x-map")
			b.ReportMetric(hash, "hash-ns/page")
			b.ReportMetric(perPage/hash, "x-hash")
		})
	}
}

// mapBaseline is the cost per page of the plain-map lookup of every page of the sequences,
// over the same iters sequences the benchmark matched (b.Loop has stopped the timer).
func mapBaseline(seqs [][]int32, flat map[PageID]int32, iters int) float64 {
	n, sink := 0, int32(0)
	var hs hasher
	start := time.Now()
	for rep := range iters {
		s := seqs[rep%len(seqs)]
		h := RootID
		for p := 0; p+16 <= len(s); p += 16 {
			h = hs.page(h, s[p:p+16])
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
				res, err := c.Insert(Request{Tokens: s})
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
			flat := map[PageID]int32{}
			n := 0
			var hs hasher
			start := time.Now()
			for i := range iters { // the same sequences the benchmark inserted
				s := news[i%len(news)]
				h := RootID
				for p := 0; p+16 <= len(s); p += 16 {
					h = hs.page(h, s[p:p+16])
					k := h
					k[0], k[1] = k[0]^byte(i), k[1]^byte(i>>8)
					flat[k] = int32(p)
					n++
				}
				if len(flat) > 1<<20 {
					clear(flat)
				}
			}
			base := float64(time.Since(start).Nanoseconds()) / float64(max(n, 1))
			hash := hashBaseline(news, iters)
			b.ReportMetric(perPage, "ns/page")
			b.ReportMetric(base, "map-ns/page")
			b.ReportMetric(perPage/base, "x-map")
			b.ReportMetric(hash, "hash-ns/page")
			b.ReportMetric(perPage/hash, "x-hash")
		})
	}
}

// hashBaseline is the cost per page of computing the page ids of every whole page of the
// same iters sequences, and nothing else (b.Loop has stopped the timer).
func hashBaseline(seqs [][]int32, iters int) float64 {
	n := 0
	var hs hasher
	var sink PageID
	start := time.Now()
	for rep := range iters {
		s := seqs[rep%len(seqs)]
		h := RootID
		for p := 0; p+16 <= len(s); p += 16 {
			h = hs.page(h, s[p:p+16])
			n++
		}
		sink = h
	}
	_ = sink
	return float64(time.Since(start).Nanoseconds()) / float64(max(n, 1))
}
