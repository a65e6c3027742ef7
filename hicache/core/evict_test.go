package core

import (
	"fmt"
	"testing"
)

// evictL1 runs EvictL1(pages) on every rank and returns what rank 0 reported (the ranks
// must agree).
func (r *coreRig) evictL1(pages int) (freed, pending int) {
	r.t.Helper()
	r.each(func(i int, c *Core) error {
		f, p := c.EvictL1(pages)
		if i == 0 {
			freed, pending = f, p
		} else if f != freed || p != pending {
			r.t.Fatalf("rank %d EvictL1(%d) = %d, %d; rank 0 %d, %d", i, pages, f, p, freed, pending)
		}
		return nil
	})
	return freed, pending
}

// TestEvictL1WriteBackReportsPending is the write-back case of eviction, on 1, 2, 4 and 8
// ranks. Under write_back an evicted page without a backup frees its slot only once its
// backup commits. EvictL1(2) on an 8-page node must not back up all 8 pages (more than
// asked) nor report 0 freed (so that a caller asks again and starts more): it reports 2
// pending, backs up exactly the node's last 2 pages, and asking again while they are
// written starts nothing: the pages pending count toward the request.
func TestEvictL1WriteBackReportsPending(t *testing.T) {
	for _, n := range cpSizes {
		t.Run(fmt.Sprintf("cp%d", n), func(t *testing.T) {
			r := newCoreRig(t, n, Options{PageSize: 4, L1Pages: 32, Policy: WriteBack}, 32, uint64(n))
			tokens := seqTokens(8, 8, 0)
			other := seqTokens(4, 0, 500) // inserted later: evicted after tokens' pages
			for _, s := range [][]int32{tokens, other} {
				if _, err := r.insert(s); err != nil {
					t.Fatal(err)
				}
			}
			r.settle()
			if freed, pending := r.evictL1(2); freed != 0 || pending != 2 {
				t.Fatalf("EvictL1(2) = %d freed, %d pending; want 0 and 2", freed, pending)
			}
			if q := r.cores[0].Queues(); q.Writes != 1 || r.cores[0].evictingL1() != 2 {
				t.Fatalf("%d backups in flight for %d pages, want 1 for 2", q.Writes, r.cores[0].evictingL1())
			}
			if freed, pending := r.evictL1(2); freed != 0 || pending != 2 || r.cores[0].evictingL1() != 2 {
				t.Fatalf("EvictL1(2) again = %d freed, %d pending, %d pages being written back; want 0, 2, 2", freed, pending, r.cores[0].evictingL1())
			}
			// One more page: tokens' head is no candidate while its tail is written back
			// (it is not a leaf of L1), so other's last page goes.
			if freed, pending := r.evictL1(3); freed != 0 || pending != 3 || r.cores[0].evictingL1() != 3 {
				t.Fatalf("EvictL1(3) = %d freed, %d pending, %d pages being written back; want 0, 3, 3", freed, pending, r.cores[0].evictingL1())
			}
			r.settle()
			for i, c := range r.cores {
				if st := c.Stats(); c.L1UsedAll() != 9 || st.EvictedL1Pages != 3 || st.WrittenPages != 3 {
					t.Fatalf("rank %d: %d L1 pages used, %d evicted, %d written back; want 9, 3, 3", i, c.L1UsedAll(), st.EvictedL1Pages, st.WrittenPages)
				}
			}
			if m := r.match(tokens)[0]; m.DevicePages != 6 || m.HostPages != 2 {
				t.Fatalf("%d device and %d host pages, want 6 and 2", m.DevicePages, m.HostPages)
			}
			if m := r.match(other)[0]; m.DevicePages != 3 || m.HostPages != 1 {
				t.Fatalf("other: %d device and %d host pages, want 3 and 1", m.DevicePages, m.HostPages)
			}
			// Once those are over, a new request schedules new pages.
			if freed, pending := r.evictL1(2); freed != 0 || pending != 2 {
				t.Fatalf("EvictL1(2) after the commits = %d freed, %d pending; want 0 and 2", freed, pending)
			}
		})
	}
}

// TestEvictL1NeverTakesMoreThanAsked: a leaf longer than the request gives its tail only;
// the head keeps its L1 pages (write-through: the tail becomes L2-only; no L2: it is
// dropped).
func TestEvictL1NeverTakesMoreThanAsked(t *testing.T) {
	for _, pol := range []Policy{WriteThrough, WriteThroughSelective} {
		for _, n := range cpSizes {
			t.Run(fmt.Sprintf("%v/cp%d", pol, n), func(t *testing.T) {
				r := newCoreRig(t, n, Options{PageSize: 4, L1Pages: 32, Policy: pol, WriteThreshold: 100}, 32, uint64(n))
				tokens := seqTokens(8, 8, 0)
				if _, err := r.insert(tokens); err != nil {
					t.Fatal(err)
				}
				r.settle()
				if freed, pending := r.evictL1(3); freed != 3 || pending != 0 {
					t.Fatalf("EvictL1(3) = %d freed, %d pending; want 3 and 0", freed, pending)
				}
				wantHost := 3
				if pol == WriteThroughSelective { // never backed up: the tail is gone
					wantHost = 0
				}
				m := r.match(tokens)[0]
				if m.DevicePages != 5 || m.HostPages != wantHost {
					t.Fatalf("%d device and %d host pages, want 5 and %d", m.DevicePages, m.HostPages, wantHost)
				}
				for i, c := range r.cores {
					if c.L1UsedAll() != 5 || c.Stats().EvictedL1Pages != 3 {
						t.Fatalf("rank %d: %d L1 pages used, %d evicted; want 5 and 3", i, c.L1UsedAll(), c.Stats().EvictedL1Pages)
					}
				}
			})
		}
	}
}
