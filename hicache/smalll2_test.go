package hicache

import (
	"errors"
	"strings"
	"testing"

	"github.com/cpcache/cpcache/parallel"
)

// TestSmallL2Warns: a cache whose slabs hold no more pages than each rank's L1 is told so
// once, by the group's rank 0, naming both sizes (per slab and per rank, and the group's)
// and what it means; one page more and nothing is logged.
func TestSmallL2Warns(t *testing.T) {
	for _, perSlab := range []int{4, 8, 9} {
		w := &warnings{msgs: map[int][]string{}}
		var got []*SmallL2Warning
		log := func(rank int) func(error) {
			return func(err error) {
				w.log(rank)(err)
				var sw *SmallL2Warning
				if errors.As(err, &sw) {
					w.mu.Lock()
					got = append(got, sw)
					w.mu.Unlock()
				}
			}
		}
		newRig(t, rigConfig{layout: parallel.LayoutConfig{World: 2, AttnCP: 2}, log: log,
			opts:         Options{PageSize: 4, L1Pages: 8, Policy: WriteThrough, MinLoadPages: 1, LoadQuotaPages: 16},
			pagesPerSlab: perSlab, pageBytes: 64})
		if perSlab > 8 {
			if len(w.of(0))+len(w.of(1)) != 0 {
				t.Fatalf("L2 %d > L1 8: warnings %q %q", perSlab, w.of(0), w.of(1))
			}
			continue
		}
		if msgs := w.of(0); len(msgs) != 1 || len(w.of(1)) != 0 || len(got) != 1 {
			t.Fatalf("L2 %d ≤ L1 8: rank 0 warnings %q, rank 1 %q; want one on rank 0", perSlab, msgs, w.of(1))
		}
		if sw := got[0]; sw.L1Pages != 8 || sw.L2Pages != perSlab || sw.Slabs != 2 || sw.Storage {
			t.Fatalf("warning %+v", sw)
		}
		msg := w.of(0)[0]
		for _, want := range []string{"L2 holds no more pages than L1", "per slab against 8 L1 pages per rank", "the group: ", "adds few hits"} {
			if !strings.Contains(msg, want) {
				t.Fatalf("warning %q lacks %q", msg, want)
			}
		}
	}
}
