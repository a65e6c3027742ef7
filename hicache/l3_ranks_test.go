package hicache

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cpcache/cpcache/parallel"
	"github.com/cpcache/cpcache/storage"
)

var memStores atomic.Int64

// memURL names a mem:// store of this test alone (mem:// tables live as long as the process:
// a test run again with -count must not find the pages of its last run).
func memURL(t testing.TB) string {
	return fmt.Sprintf("mem://%s-%d", t.Name(), memStores.Add(1))
}

// cpLayout is one CP group of cp ranks (one slab group, one replica group).
func cpLayout(cp int) parallel.LayoutConfig {
	return parallel.LayoutConfig{World: cp, AttnCP: cp}
}

// ownedPages is how many of sequence pages [0, pages) CP rank r of cp owns.
func ownedPages(pages, cp, r int) int64 {
	if r >= pages {
		return 0
	}
	return int64((pages - r + cp - 1) / cp)
}

// TestL3EveryRankItsPages: with CP2, CP4 and CP8, every rank writes to storage exactly the
// pages it owns (sequence page i mod C == its CP rank), and reads back exactly those; the
// group's counts are the sums, every prefetched page loaded into L1 has the right bytes,
// and every rank agrees at every step.
func TestL3EveryRankItsPages(t *testing.T) {
	for _, cp := range []int{2, 4, 8} {
		t.Run(fmt.Sprintf("cp%d", cp), func(t *testing.T) {
			ns := testNamespace(t)
			rc := l3RigConfig(cpLayout(cp), openStores(t, memURL(t), ns), ns,
				L3Options{PrefetchPolicy: PrefetchWaitComplete, ReadChunkPages: 2, PrefetchQuotaPages: 64})
			r := newRig(t, rc)
			// Distinct sequences (no shared page), of lengths that are not all multiples of C.
			var seqs [][]int32
			total := 0
			for k := range 4 {
				pages := 2*cp + k + 1
				seqs = append(seqs, tokensN(int32(10000*(k+1)), pages*4))
				total += pages
			}
			r.insertAll(seqs)
			if st := r.sameStats(); st.L3BackedUpPages != int64(total) || st.L3FailedBackups != 0 {
				t.Fatalf("%d pages backed up, %d failed backups; want %d and 0", st.L3BackedUpPages, st.L3FailedBackups, total)
			}
			for i, c := range r.caches {
				var want int64
				for _, s := range seqs {
					want += ownedPages(len(s)/4, cp, c.CPRank())
				}
				if got := c.Stats().StoragePagesWritten; got != want {
					t.Fatalf("rank %d (CP rank %d) wrote %d pages to storage, want its own %d", i, c.CPRank(), got, want)
				}
			}
			r.evictAll()
			for _, s := range seqs {
				if pf := r.prefetch(s, -1); pf.Start != 0 || pf.Pages != len(s)/4 {
					t.Fatalf("prefetch %+v of %d pages", pf, len(s)/4)
				}
				if ms, err := r.matchLoad(s, true); err != nil || ms[0].DevicePages != len(s)/4 {
					t.Fatalf("after the prefetch: %d device pages of %d (%v)", ms[0].DevicePages, len(s)/4, err)
				}
			}
			st := r.sameStats()
			if st.L3PrefetchedPages != int64(total) || st.L3HitPages != int64(total) {
				t.Fatalf("%d pages hit, %d prefetched; want %d", st.L3HitPages, st.L3PrefetchedPages, total)
			}
			var read int64
			for i, c := range r.caches {
				var want int64
				for _, s := range seqs {
					want += ownedPages(len(s)/4, cp, c.CPRank())
				}
				cs := c.Stats()
				if cs.StoragePagesRead != want || cs.StorageErrors != 0 {
					t.Fatalf("rank %d (CP rank %d) read %d pages from storage (%d errors), want its own %d", i, c.CPRank(), cs.StoragePagesRead, cs.StorageErrors, want)
				}
				read += cs.StoragePagesRead
			}
			if read != int64(total) {
				t.Fatalf("the ranks read %d pages in all, want %d", read, total)
			}
			r.checkCollectives()
		})
	}
}

// failSecondGet fails this rank's second Get (and every later one) after reading nothing:
// with ReadChunkPages 1, its read of its second own page fails.
type failSecondGet struct {
	storage.Storage
	gets atomic.Int64
}

func (s *failSecondGet) GetBound(ctx context.Context, keys []storage.Key, binds []storage.Binding, dst [][]byte, found []bool) (int, error) {
	if s.gets.Add(1) >= 2 {
		return 0, errors.New("injected read failure")
	}
	return s.Storage.GetBound(ctx, keys, binds, dst, found)
}

// TestL3OneRankReadFails: in a CP4 group, CP rank 2's read of its second page (sequence
// page 6) fails: every rank inserts the same 6 pages, the prefix every rank verified, with
// equal digests at every step, and the bytes of every loaded page are right; the error is
// rank 2's alone.
func TestL3OneRankReadFails(t *testing.T) {
	const cp, pages, bad = 4, 12, 2
	ns := testNamespace(t)
	open := openStores(t, memURL(t), ns)
	var failing *failSecondGet
	store := func(i int) storage.Storage {
		if i == bad { // rank i is CP rank i in this layout
			failing = &failSecondGet{Storage: open(i)}
			return failing
		}
		return open(i)
	}
	r := newRig(t, l3RigConfig(cpLayout(cp), store, ns, L3Options{PrefetchPolicy: PrefetchWaitComplete, ReadChunkPages: 1}))
	seq := tokensN(700, pages*4)
	r.insertAll([][]int32{seq})
	r.evictAll()
	res := r.prefetch(seq, -1)
	want := PrefetchOutcome{Stored: pages, Inserted: bad + cp, Refused: RefusedShort}
	for i, c := range r.caches {
		if got, ok := c.PrefetchOutcome(res.ID); !ok || got != want {
			t.Fatalf("rank %d: outcome %+v (%t), want %+v", i, got, ok, want)
		}
	}
	ms, err := r.matchLoad(seq, true)
	if err != nil || ms[0].DevicePages != bad+cp {
		t.Fatalf("after the failed read: %d device pages (%v), want the %d every rank verified", ms[0].DevicePages, err, bad+cp)
	}
	for i, c := range r.caches {
		if errs := c.Stats().StorageErrors; (errs > 0) != (i == bad) {
			t.Fatalf("rank %d: %d storage errors (the failing rank is %d)", i, errs, bad)
		}
	}
	if st := r.sameStats(); st.L3PrefetchedPages != bad+cp || st.L3DiscardedPages != pages-bad-cp {
		t.Fatalf("%d pages prefetched, %d discarded; want %d and %d", st.L3PrefetchedPages, st.L3DiscardedPages, bad+cp, pages-bad-cp)
	}
}

// TestL3OneRankBreakerOpens: in a CP4 group only CP rank 3's store hangs: its query times
// out and its breaker opens, and the whole group agrees the circuit open at one step (no
// prefetch starts anywhere); the other ranks' breakers stay closed. Once rank 3's probe
// answers, the group agrees the circuit closed and a prefetch brings every page back.
func TestL3OneRankBreakerOpens(t *testing.T) {
	const cp, pages, bad = 4, 8, 3
	ns := testNamespace(t)
	open := openStores(t, memURL(t), ns)
	var hang atomic.Bool
	var calls, probes atomic.Int64
	store := func(i int) storage.Storage {
		if i == bad {
			return hangingStore{Storage: open(i), hang: &hang, calls: &calls, probes: &probes}
		}
		return open(i)
	}
	r := newRig(t, l3RigConfig(cpLayout(cp), store, ns, L3Options{CallTimeout: 30 * time.Millisecond, CircuitFailures: 2,
		CircuitProbeInterval: 5 * time.Millisecond, PrefetchPolicy: PrefetchWaitComplete}))
	seq := tokensN(900, pages*4)
	r.insertAll([][]int32{seq})
	r.evictAll()
	hang.Store(true)
	if pf := r.prefetch(seq, -1); pf.Pages != pages {
		t.Fatalf("prefetch %+v", pf)
	}
	r.waitCircuit(true)
	for i, c := range r.caches {
		if secs := c.Stats().StorageCircuitOpenSeconds; (secs > 0) != (i == bad) {
			t.Fatalf("rank %d: breaker open for %.3fs (the hanging rank is %d)", i, secs, bad)
		}
		if res, err := c.Prefetch(Request{Tokens: seq}); err != nil || res.ID != 0 {
			t.Fatalf("rank %d: prefetch %+v (%v) with the circuit agreed open", i, res, err)
		}
	}
	hang.Store(false)
	r.waitCircuit(false)
	r.prefetch(seq, -1)
	if ms, err := r.matchLoad(seq, true); err != nil || ms[0].DevicePages != pages {
		t.Fatalf("after the circuit closed: %d device pages of %d (%v)", ms[0].DevicePages, pages, err)
	}
}

// TestL3StoreServesOtherCPSizes: storage keys are the page hash and the TP index, not the
// CP rank or size, so a store filled by a CP1 job serves a CP4 job whole (each of its ranks
// reads its own pages), and one filled by a CP4 job serves a CP1 job; every loaded page has
// the right bytes.
func TestL3StoreServesOtherCPSizes(t *testing.T) {
	for _, c := range []struct{ fill, serve int }{{1, 4}, {4, 1}} {
		t.Run(fmt.Sprintf("cp%d_to_cp%d", c.fill, c.serve), func(t *testing.T) {
			ns := testNamespace(t)
			url := memURL(t)
			l3 := L3Options{PrefetchPolicy: PrefetchWaitComplete, PrefetchQuotaPages: 64}
			seqs := [][]int32{tokensN(100, 4*9), tokensN(2000, 4*14)}
			filler := newRig(t, l3RigConfig(cpLayout(c.fill), openStores(t, url, ns), ns, l3))
			filler.insertAll(seqs)
			if st := filler.sameStats(); st.L3BackedUpPages != 9+14 {
				t.Fatalf("CP%d filled %d pages, want %d", c.fill, st.L3BackedUpPages, 9+14)
			}
			server := newRig(t, l3RigConfig(cpLayout(c.serve), openStores(t, url, ns), ns, l3))
			for _, s := range seqs {
				server.prefetch(s, -1)
				if ms, err := server.matchLoad(s, true); err != nil || ms[0].DevicePages != len(s)/4 {
					t.Fatalf("CP%d from a CP%d store: %d device pages of %d (%v)", c.serve, c.fill, ms[0].DevicePages, len(s)/4, err)
				}
			}
			if st := server.sameStats(); st.L3PrefetchedPages != 9+14 {
				t.Fatalf("CP%d prefetched %d pages, want %d", c.serve, st.L3PrefetchedPages, 9+14)
			}
		})
	}
}
