package hicache

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/cpcache/cpcache/hicache/core"
	"github.com/cpcache/cpcache/parallel"
)

// splitRig is a CP4 group whose ranks 1 and 2 copy slowly, so backups and load-backs are
// still in flight on them when the scheduler inserts the next request.
func splitRig(t *testing.T, policy Policy) *rig {
	return newRig(t, rigConfig{
		layout:       parallel.LayoutConfig{World: 4, AttnCP: 4},
		opts:         Options{PageSize: 4, L1Pages: 64, Policy: policy, WriteThreshold: 1, MinLoadPages: 1, LoadQuotaPages: 64},
		pagesPerSlab: 24, pageBytes: 64,
		delay: func(rank int) func(Transfer) time.Duration {
			if rank != 1 && rank != 2 {
				return nil
			}
			return func(Transfer) time.Duration { return 3 * time.Millisecond }
		},
	})
}

// sharedPair returns two 8-page sequences (page size 4) sharing their first 5 pages.
func sharedPair(base int32) (a, b []int32) {
	a = tokensN(base, 32)
	b = append(slices.Clone(a[:20]), tokensN(base+10000, 12)...)
	return a, b
}

// requireWholeInsert inserts tokens everywhere and requires every page to be cached.
func requireWholeInsert(t *testing.T, r *rig, tokens []int32) {
	t.Helper()
	res, err := r.insert(tokens)
	if err != nil {
		t.Fatal(err)
	}
	if want := len(tokens) / 4; res[0].Pages != want {
		t.Fatalf("insert cached %d of %d pages", res[0].Pages, want)
	}
	r.checkAgree()
}

// evictL1All evicts every L1 page (write-back: once the eviction's backups committed).
func evictL1All(t *testing.T, r *rig) {
	t.Helper()
	r.drain()
	for k := 0; r.caches[0].Stats().L1Used > 0; k++ {
		if k > 100 {
			t.Fatalf("%d L1 pages left after evicting everything", r.caches[0].Stats().L1Used)
		}
		if err := r.each("evict", func(_ int, c *Cache) error { _, _, err := c.EvictL1(1 << 30); return err }); err != nil {
			t.Fatal(err)
		}
		r.drain()
	}
}

// requireServedFromL2 evicts everything from L1 and requires each sequence to match fully
// as host pages, load back and verify (content checked on every rank).
func requireServedFromL2(t *testing.T, r *rig, seqs ...[]int32) {
	t.Helper()
	for _, s := range seqs {
		evictL1All(t, r)
		m, err := r.matchLoad(s, false)
		if err != nil {
			t.Fatal(err)
		}
		if want := len(s) / 4; m[0].HostPages != want || m[0].DevicePages != 0 {
			t.Fatalf("after L1 eviction: %d device + %d host pages, want 0 + %d", m[0].DevicePages, m[0].HostPages, want)
		}
		if m, err = r.matchLoad(s, true); err != nil {
			t.Fatal(err)
		}
		if want := len(s) / 4; m[0].DevicePages != want {
			t.Fatalf("after load-back: %d device pages, want %d", m[0].DevicePages, want)
		}
		r.drain()
	}
}

// Two requests sharing a prefix inserted in the same scheduler step — the second splits
// the first one's node while its backup is queued or in flight (write-back: while the
// eviction's backup runs) — are both cached whole; every rank agrees at every step, the
// backups of both halves commit together, and both sequences come back from L2.
func TestInsertSplitsNodeWithBackupInFlight(t *testing.T) {
	for _, pol := range []Policy{WriteThrough, WriteThroughSelective, WriteBack} {
		t.Run(pol.String(), func(t *testing.T) {
			r := splitRig(t, pol)
			a, b := sharedPair(100)
			requireWholeInsert(t, r, a)
			if pol == WriteBack { // the backup starts when the node is evicted from L1
				if err := r.step(); err != nil {
					t.Fatal(err)
				}
				if err := r.each("evict", func(_ int, c *Cache) error { _, _, err := c.EvictL1(8); return err }); err != nil {
					t.Fatal(err)
				}
			}
			cr := r.caches[0].core
			n := cr.Peek(Request{Tokens: a})
			if n.State&StateWriting == 0 {
				t.Fatalf("node %d has no backup in flight (state %v)", n.ID, n.State)
			}
			requireWholeInsert(t, r, b) // same step: splits n
			n = nodeOf(cr, n.Handle)
			head, ok := parentOf(cr, n)
			writing, _ := cr.Writing(n.Handle)
			if !ok || head.State&StateWriting == 0 || len(writing) != 1 || head.Pages() != 5 || n.Pages() != 3 {
				t.Fatalf("split: head %v (%d pages), tail %d pages; backups in flight on the tail's path %v, want the one shared backup",
					head, head.Pages(), n.Pages(), writing)
			}
			// Another request on the same prefix while the copies run on ranks 1 and 2.
			if err := r.step(); err != nil {
				t.Fatal(err)
			}
			c3 := append(slices.Clone(a[:8]), tokensN(30000, 8)...)
			requireWholeInsert(t, r, c3)
			r.drain()
			st := r.caches[0].Stats()
			if st.AbortedWrites != 0 || st.SkippedBackups != 0 {
				t.Fatalf("aborted %d, skipped %d backups", st.AbortedWrites, st.SkippedBackups)
			}
			requireServedFromL2(t, r, a, b, c3)
			r.checkCollectives()
		})
	}
}

// A request inserted while a load-back of its prefix is in flight splits the loading node:
// both halves finish loading at the same agreed step and serve verified content.
func TestInsertSplitsNodeWithLoadInFlight(t *testing.T) {
	r := splitRig(t, WriteThrough)
	a, b := sharedPair(500)
	requireWholeInsert(t, r, a)
	evictL1All(t, r)
	if err := r.each("load", func(_ int, c *Cache) error {
		m, err := c.Match(Request{Tokens: a})
		if err != nil {
			return err
		}
		_, err = c.LoadBack(m.Last)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if err := r.step(); err != nil { // the loads start
		t.Fatal(err)
	}
	cr := r.caches[0].core
	n := cr.Peek(Request{Tokens: a})
	if n.State&StateLoading == 0 {
		t.Fatalf("node %d is not loading (state %v)", n.ID, n.State)
	}
	requireWholeInsert(t, r, b)
	if head, ok := parentOf(cr, nodeOf(cr, n.Handle)); !ok || head.State&StateLoading == 0 || head.Pages() != 5 {
		t.Fatalf("split: head %v does not share the load", head)
	}
	if got, _ := cr.Loading(n.Handle); len(got) != 1 {
		t.Fatalf("Loading(tail) = %v, want the one shared load", got)
	}
	for _, s := range [][]int32{a, b} {
		m, err := r.matchLoad(s, false) // waits for this rank's copies, verifies its pages
		if err != nil {
			t.Fatal(err)
		}
		if m[0].DevicePages != len(s)/4 {
			t.Fatalf("%d device pages, want %d", m[0].DevicePages, len(s)/4)
		}
	}
	r.drain()
	if st := r.caches[0].Stats(); st.FailedLoads != 0 || st.LoadedPages != 8 {
		t.Fatalf("loaded %d pages, %d failed loads; want 8, 0", st.LoadedPages, st.FailedLoads)
	}
	requireServedFromL2(t, r, a, b)
	for _, c := range r.caches {
		if err := c.WaitL1(context.Background(), n.Handle); err != nil {
			t.Fatal(err)
		}
	}
}

// nodeOf returns the state of the node h names now (the zero NodeInfo when it names none).
func nodeOf(cr *core.Core, h Handle) NodeInfo {
	n, _ := cr.Node(h)
	return n
}

// parentOf returns the node above n; ok is false when n hangs from the root (or is none).
func parentOf(cr *core.Core, n NodeInfo) (p NodeInfo, ok bool) {
	p = nodeOf(cr, n.Parent)
	return p, p.Parent != 0
}
