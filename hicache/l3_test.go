package hicache

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cpcache/cpcache/hicache/core"
	"github.com/cpcache/cpcache/hicache/engine"
	"github.com/cpcache/cpcache/hicache/kvtest"
	"github.com/cpcache/cpcache/parallel"
	"github.com/cpcache/cpcache/parallel/local"
	"github.com/cpcache/cpcache/slab"
	"github.com/cpcache/cpcache/storage"
)

// TestL3PrefetchAgreement backs random sequences up to storage, evicts everything, and
// prefetches them back under random per-rank storage delays (each of the four ranks reads
// its own pages): every rank
// inserts the same pages (the digests agree at every step), and every page loaded into L1
// afterwards has the right content. With wait_complete every stored page comes back.
func TestL3PrefetchAgreement(t *testing.T) {
	for _, pol := range []PrefetchPolicy{PrefetchWaitComplete, PrefetchTimeout, PrefetchBestEffort} {
		t.Run(pol.String(), func(t *testing.T) {
			ns := testNamespace(t)
			l3 := L3Options{PrefetchPolicy: pol, ReadChunkPages: 2, PrefetchQuotaPages: 64, MinPrefetchPages: 2,
				PrefetchTimeoutBase: time.Millisecond, PrefetchTimeoutPerPage: time.Microsecond}
			rc := l3RigConfig(l3Layout, openStores(t, "mem://"+t.Name(), ns), ns, l3)
			rc.l3Hook = randomDelays(uint64(pol), 2*time.Millisecond)
			r := newRig(t, rc)
			rng := rand.New(rand.NewPCG(3, uint64(pol)))
			seqs := kvtest.RandomSequences(rng, 12, 4)
			r.insertAll(seqs)
			st := r.sameStats()
			if st.L3BackedUpPages == 0 || st.L3FailedBackups != 0 {
				t.Fatalf("after inserting: %d pages backed up, %d failed backups", st.L3BackedUpPages, st.L3FailedBackups)
			}
			for round := range 2 {
				r.evictAll()
				if round == 1 {
					// Part of the tree is back: prefetches continue from inside nodes.
					r.insertAll(seqs[:3])
				}
				for k, s := range rng.Perm(len(seqs)) {
					revoke := -1
					if pol == PrefetchBestEffort && k%2 == 0 {
						revoke = rng.IntN(3)
					}
					stored := r.storedPages(seqs[s])
					pf := r.prefetch(seqs[s], revoke)
					ms, err := r.matchLoad(seqs[s], true)
					if err != nil {
						t.Fatal(err)
					}
					if want := max(pf.Start+min(stored-pf.Start, pf.Pages), pf.Start); pol == PrefetchWaitComplete && pf.Pages > 0 && stored-pf.Start >= 2 &&
						ms[0].DevicePages+ms[0].HostPages != want {
						t.Fatalf("seq %d: %d+%d pages after a wait_complete prefetch %+v, %d leading pages stored", s, ms[0].DevicePages, ms[0].HostPages, pf, stored)
					}
					if rng.IntN(3) == 0 {
						if _, err := r.insert(seqs[s]); err != nil && !errors.Is(err, ErrL1Full) {
							t.Fatal(err)
						}
					}
					r.mustStep()
				}
			}
			r.drain()
			st = r.sameStats()
			t.Logf("%s: %d pages hit in storage, %d prefetched, %d discarded, %d skipped prefetches; %d pages backed up",
				pol, st.L3HitPages, st.L3PrefetchedPages, st.L3DiscardedPages, st.L3SkippedPrefetches, st.L3BackedUpPages)
			if st.L3PrefetchedPages == 0 && pol != PrefetchTimeout {
				t.Fatal("nothing was prefetched")
			}
			for i, c := range r.caches {
				if s := c.Stats(); s.StorageErrors != 0 {
					t.Fatalf("rank %d: %d storage errors", i, s.StorageErrors)
				}
			}
			// One AllReduce per step (plus New's configuration check), nothing else.
			if cc, steps := r.checkCollectives(), r.caches[0].Stats().Steps; cc.AllReduce != int(steps)+1 || cc.Total() != cc.AllReduce {
				t.Fatalf("collectives %+v for %d steps", cc, steps)
			}
		})
	}
}

// TestL3BackupAcknowledged holds every backup to storage at a gate: the node's L2 pages
// stay pinned (not evictable, Flush busy) through any number of steps, and are released
// only at the step after every rank stored its part.
func TestL3BackupAcknowledged(t *testing.T) {
	ns := testNamespace(t)
	gate := make(chan struct{})
	rc := l3RigConfig(l3Layout, openStores(t, "mem://"+t.Name(), ns), ns, L3Options{})
	// Rank 0 stores its part of each backup at once, the other ranks at the gate.
	rc.l3Hook = gateHook(gate, func(rank int, kind core.StorageKind) bool { return kind == core.StoragePut && rank != 0 })
	r := newRig(t, rc)
	seq := kvtest.RandomSequences(rand.New(rand.NewPCG(5, 5)), 1, 4)[0]
	pages := len(seq) / 4
	if _, err := r.insert(seq); err != nil {
		t.Fatal(err)
	}
	r.stepUntil("backups to L2 committed", func() bool { return r.caches[0].core.Queues().Writes == 0 })
	if err := r.each("evict", func(_ int, c *Cache) error { _, _, err := c.EvictL1(1 << 30); return err }); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		r.mustStep()
	}
	for i, c := range r.caches {
		if freed, err := c.EvictL2(1 << 30); err != nil || freed != 0 {
			t.Fatalf("rank %d: evicted %d L2 pages (err %v) while their backup to storage is unacknowledged", i, freed, err)
		}
		if c.Pending() == 0 {
			t.Fatalf("rank %d: nothing pending while a backup to storage waits", i)
		}
		if st := c.Stats(); st.L3BackedUpPages != 0 {
			t.Fatalf("rank %d: %d pages acknowledged before ranks 1-3 stored their parts", i, st.L3BackedUpPages)
		}
	}
	if err := r.each("flush", func(_ int, c *Cache) error { return c.Flush(context.Background()) }); !errors.Is(err, ErrBusy) {
		t.Fatalf("flush during a backup: %v, want ErrBusy", err)
	}
	close(gate)
	r.drain()
	if st := r.sameStats(); st.L3BackedUpPages != int64(pages) {
		t.Fatalf("%d pages backed up, want %d", st.L3BackedUpPages, pages)
	}
	if err := r.each("evict", func(_ int, c *Cache) error {
		if freed, err := c.EvictL2(1 << 30); err != nil || freed != pages {
			return errors.Join(err, errors.New("L2 pages not freed after the acknowledgement"))
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	r.mustStep()
	// Both shards are in storage.
	for i := range 2 {
		d := r.caches[i].l3
		n, err := d.st.Exists(context.Background(), d.keys(PrefixHashes(seq, 4)), nil)
		if err != nil || n != pages {
			t.Fatalf("shard %d: %d of %d pages stored (err %v)", i, n, pages, err)
		}
	}
}

// TestL3FlushKeepsOrClearsStorage: a flush empties the cache and its L3 queues; the
// storage keeps its pages (a later prefetch hits) unless ClearOnFlush.
func TestL3FlushKeepsOrClearsStorage(t *testing.T) {
	for _, clearIt := range []bool{false, true} {
		name := "keep"
		if clearIt {
			name = "clear"
		}
		t.Run(name, func(t *testing.T) {
			ns := testNamespace(t)
			rc := l3RigConfig(l3Layout, openStores(t, "mem://"+t.Name(), ns), ns, L3Options{ClearOnFlush: clearIt, PrefetchPolicy: PrefetchWaitComplete})
			r := newRig(t, rc)
			seqs := kvtest.RandomSequences(rand.New(rand.NewPCG(7, 7)), 4, 4)
			r.insertAll(seqs)
			r.flushAndCheckFresh()
			for i, c := range r.caches {
				if q := c.core.Queues(); q.Puts+q.Queries+q.Reads+q.Releases != 0 || q.ReservedPages != 0 || q.PutSeq != 0 {
					t.Fatalf("rank %d: L3 queues after flush %+v", i, q)
				}
			}
			before := r.sameStats()
			total := 0
			for _, s := range seqs {
				r.prefetch(s, -1)
				ms, err := r.matchLoad(s, true)
				if err != nil {
					t.Fatal(err)
				}
				total += ms[0].DevicePages
			}
			got := r.sameStats().L3PrefetchedPages - before.L3PrefetchedPages
			if clearIt && got != 0 {
				t.Fatalf("prefetched %d pages from a storage cleared by the flush", got)
			}
			if !clearIt && (got == 0 || total == 0) {
				t.Fatalf("prefetched %d pages (%d in L1) after a flush that keeps storage", got, total)
			}
		})
	}
}

// TestL3TwoInstancesShareStorage runs two caches one after the other (two runner
// invocations) on one storage directory: the second hits storage for the first's prefixes.
func TestL3TwoInstancesShareStorage(t *testing.T) {
	ns := testNamespace(t)
	url := "file://" + t.TempDir()
	seqs := kvtest.RandomSequences(rand.New(rand.NewPCG(9, 9)), 10, 4)
	tokens := 0
	for _, s := range seqs {
		tokens += len(s) / 4 * 4
	}
	run := func(second bool) CoreStats {
		r := newRig(t, l3RigConfig(l3Layout, openStores(t, url, ns), ns, L3Options{PrefetchPolicy: PrefetchWaitComplete}))
		defer func() {
			for _, c := range r.caches {
				c.Close()
			}
		}()
		for _, s := range seqs {
			ms, err := r.matchLoad(s, true)
			if err != nil {
				t.Fatal(err)
			}
			if ms[0].DevicePages*4 < len(s)/4*4 {
				if err := r.each("prefetch", func(_ int, c *Cache) error {
					_, err := c.PrefetchWait(context.Background(), Request{Tokens: s})
					return err
				}); err != nil {
					t.Fatal(err)
				}
				r.checkAgree()
				if _, err := r.matchLoad(s, true); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := r.insert(s); err != nil {
				t.Fatal(err)
			}
			r.mustStep()
		}
		r.drain()
		return r.sameStats()
	}
	first := run(false)
	second := run(true)
	t.Logf("first run: %d of %d tokens hit in storage, %d pages backed up; second run: %d tokens hit, %d pages prefetched, %d backed up",
		first.L3HitPages*4, tokens, first.L3BackedUpPages, second.L3HitPages*4, second.L3PrefetchedPages, second.L3BackedUpPages)
	if first.L3HitPages != 0 {
		t.Fatalf("first run hit %d pages in an empty storage", first.L3HitPages)
	}
	// Every page the first run stored comes back once (wait_complete, L2 large enough).
	if second.L3PrefetchedPages != first.L3BackedUpPages || second.L3HitPages != first.L3BackedUpPages {
		t.Fatalf("second run prefetched %d pages (hit %d), first backed up %d", second.L3PrefetchedPages, second.L3HitPages, first.L3BackedUpPages)
	}
}

// TestL3ConfigErrors: storage without its namespace, or bad L3 options, are rejected with
// errors naming the value.
func TestL3ConfigErrors(t *testing.T) {
	ns := testNamespace(t)
	l, err := parallel.NewLayout(parallel.LayoutConfig{World: 1})
	if err != nil {
		t.Fatal(err)
	}
	g := local.New([]int{0}, local.Options{Kind: "replica"})[0]
	defer g.Close()
	_, err = New(context.Background(), Config{
		Options: Options{PageSize: 4, L1Pages: 8}, Layout: l, Rank: 0, Group: g, Slabs: kvtest.NewMemSlabs([]int{0}, 8, 64),
		Storage: openStores(t, "mem://"+t.Name(), ns)(0),
	})
	if !errors.Is(err, ErrBadConfig) || !strings.Contains(err.Error(), "namespace") {
		t.Fatalf("storage without namespace: %v", err)
	}
	_, err = New(context.Background(), Config{
		Options: Options{PageSize: 4, L1Pages: 8}, Layout: l, Rank: 0, Group: g, Slabs: deviceSlabs{kvtest.NewMemSlabs([]int{0}, 8, 64)},
		Storage: openStores(t, "mem://"+t.Name(), ns)(0), StorageNamespace: ns, Engine: nopEngine{},
	})
	if !errors.Is(err, ErrBadConfig) || !strings.Contains(err.Error(), "device memory") {
		t.Fatalf("storage over device slabs: %v", err)
	}
	bad := core.Config{Options: Options{PageSize: 4, L1Pages: 8}, Slabs: 1, PagesPerSlab: 10, L3: true, L3Config: core.L3Config{MinPrefetchPages: -1}}
	if _, err := core.New(bad); !errors.Is(err, ErrBadConfig) || !strings.Contains(err.Error(), "-1") {
		t.Fatalf("normalize: %v", err)
	}
	if _, err := ParsePrefetchPolicy("soon"); !errors.Is(err, ErrBadConfig) || !strings.Contains(err.Error(), "soon") {
		t.Fatalf("parse: %v", err)
	}
	for _, p := range []PrefetchPolicy{PrefetchBestEffort, PrefetchWaitComplete, PrefetchTimeout} {
		if q, err := ParsePrefetchPolicy(p.String()); err != nil || q != p {
			t.Fatalf("round trip of %v: %v %v", p, q, err)
		}
	}
}

// TestL3PrefetchSplitsAndTreeChanges: a continuation that starts inside a node splits it
// and hangs below the head; a continuation inserted by the scheduler while its prefetch
// reads makes the group discard the read pages (released once every read stopped).
func TestL3PrefetchSplitsAndTreeChanges(t *testing.T) {
	ns := testNamespace(t)
	gate := make(chan struct{})
	var hold heldFlag
	rc := l3RigConfig(l3Layout, openStores(t, "mem://"+t.Name(), ns), ns, L3Options{PrefetchPolicy: PrefetchBestEffort})
	rc.l3Hook = gateHook(gate, func(_ int, kind core.StorageKind) bool { return kind == core.StorageRead && hold.get() })
	r := newRig(t, rc)
	a := tokensN(0, 40)                                    // 10 pages
	b := append(slices.Clone(a[:16]), tokensN(500, 24)...) // shares 4 pages, then 6 of its own
	r.insertAll([][]int32{a})
	r.insertAll([][]int32{b}) // a's backup finished: its node can be split
	r.evictAll()
	r.insertAll([][]int32{a})
	pf := r.prefetch(b, -1)
	if pf.Start != 4 || pf.Pages != 6 {
		t.Fatalf("prefetch %+v, want start 4, 6 pages", pf)
	}
	ms, err := r.matchLoad(b, true)
	if err != nil {
		t.Fatal(err)
	}
	if st := r.sameStats(); ms[0].DevicePages != 10 || st.L3PrefetchedPages != 6 || r.caches[0].Stats().Nodes != 3 {
		t.Fatalf("after the prefetch: %d device pages, %d prefetched, %d nodes; want 10, 6, 3", ms[0].DevicePages, st.L3PrefetchedPages, r.caches[0].Stats().Nodes)
	}

	// The scheduler inserts b while its prefetch waits at the gate.
	r.evictAll()
	r.insertAll([][]int32{a})
	hold.set(true)
	res := make([]PrefetchResult, len(r.caches))
	if err := r.each("prefetch", func(i int, c *Cache) (err error) { res[i], err = c.Prefetch(Request{Tokens: b}); return err }); err != nil {
		t.Fatal(err)
	}
	r.stepUntil("a read started", func() bool { return r.caches[0].core.Queues().Reads > 0 })
	if _, err := r.insert(b); err != nil {
		t.Fatal(err)
	}
	before := r.sameStats()
	if err := r.each("revoke", func(_ int, c *Cache) error { return c.RevokePrefetch(res[0].ID) }); err != nil {
		t.Fatal(err)
	}
	r.mustStep()
	if r.caches[0].PrefetchPending(res[0].ID) || r.caches[0].core.Queues().Releases != 1 {
		t.Fatalf("revoked read: pending %t, %d releases waiting for the reads to stop", r.caches[0].PrefetchPending(res[0].ID), r.caches[0].core.Queues().Releases)
	}
	close(gate)
	r.drain()
	st := r.sameStats()
	if st.L3PrefetchedPages != before.L3PrefetchedPages || st.L3DiscardedPages != before.L3DiscardedPages+6 {
		t.Fatalf("prefetch into a changed tree: %d pages inserted, %d discarded; want 0 and 6",
			st.L3PrefetchedPages-before.L3PrefetchedPages, st.L3DiscardedPages-before.L3DiscardedPages)
	}
	if _, err := r.matchLoad(b, true); err != nil {
		t.Fatal(err)
	}
	if free := r.caches[0].Stats().L2FreePages; free+r.caches[0].core.Allocator().ReservedPages() != 2*rc.pagesPerSlab-r.caches[0].core.TreeL2Pages() {
		t.Fatalf("L2: %d free pages, %d in the tree", free, r.caches[0].core.TreeL2Pages())
	}
}

// TestL3RandomWorkload interleaves inserts, prefetches left in flight (some revoked),
// matches with load-backs (content-checked), evictions, local eviction hints and flushes
// under random per-rank storage delays and the timeout policy; the digests agree at every
// step. At the end a divergence is injected while reads are in flight: every rank reports
// it at the same step and no slab byte changes afterwards.
func TestL3RandomWorkload(t *testing.T) {
	for _, pol := range []Policy{WriteThrough, WriteBack} {
		t.Run(pol.String(), func(t *testing.T) { testL3RandomWorkload(t, pol) })
	}
}

func testL3RandomWorkload(t *testing.T, pol Policy) {
	ns := testNamespace(t)
	rc := l3RigConfig(l3Layout, openStores(t, "mem://"+t.Name(), ns), ns, L3Options{PrefetchPolicy: PrefetchTimeout,
		ReadChunkPages: 2, PrefetchQuotaPages: 24, PrefetchTimeoutBase: 20 * time.Millisecond, PrefetchTimeoutPerPage: 100 * time.Microsecond})
	// Storage calls take up to 1ms, far less than the timer: most reads complete, or are cut
	// with chunks done, however fast the steps run (the scheduler does not wait for them).
	rc.l3Hook = randomDelays(17, time.Millisecond)
	rc.pagesPerSlab = 40
	rc.opts.Policy = pol
	r := newRig(t, rc)
	rng := rand.New(rand.NewPCG(17, uint64(pol)))
	seqs := kvtest.RandomSequences(rng, 30, 4)
	var ids []uint64
	for it := range 240 {
		s := seqs[rng.IntN(len(seqs))]
		switch x := rng.IntN(12); {
		case x < 3:
			if _, err := r.insert(s); err != nil && !errors.Is(err, ErrL1Full) {
				t.Fatal(err)
			}
		case x < 6:
			res := make([]PrefetchResult, len(r.caches))
			if err := r.each("prefetch", func(i int, c *Cache) (err error) { res[i], err = c.Prefetch(Request{Tokens: s}); return err }); err != nil {
				t.Fatal(err)
			}
			if res[0].ID != 0 {
				ids = append(ids, res[0].ID)
			}
			if len(ids) > 0 && rng.IntN(3) == 0 {
				id := ids[rng.IntN(len(ids))]
				if err := r.each("revoke", func(_ int, c *Cache) error { return c.RevokePrefetch(id) }); err != nil {
					t.Fatal(err)
				}
			}
		case x < 8:
			if _, err := r.matchLoad(s, true); err != nil {
				t.Fatal(err)
			}
		case x < 9:
			n := rng.IntN(24)
			if err := r.each("evict", func(_ int, c *Cache) error { _, _, err := c.EvictL1(n); return err }); err != nil {
				t.Fatal(err)
			}
		case x < 10:
			n := rng.IntN(24)
			if err := r.each("evict", func(_ int, c *Cache) error { _, err := c.EvictL2(n); return err }); err != nil {
				t.Fatal(err)
			}
		default:
			r.caches[rng.IntN(len(r.caches))].HintEvict(rng.IntN(8), rng.IntN(8))
		}
		r.mustStep()
		if it%80 == 79 {
			r.drain()
			r.flushAndCheckFresh()
			ids = nil
		}
	}
	st := r.sameStats()
	t.Logf("%d queries, %d pages hit, %d prefetched, %d discarded, %d skipped; %d backed up, %d failed",
		st.L3Queries, st.L3HitPages, st.L3PrefetchedPages, st.L3DiscardedPages, st.L3SkippedPrefetches, st.L3BackedUpPages, st.L3FailedBackups)
	if st.L3PrefetchedPages == 0 || st.L3BackedUpPages == 0 {
		t.Fatalf("workload prefetched %d and backed up %d pages", st.L3PrefetchedPages, st.L3BackedUpPages)
	}

	// Divergence with reads in flight.
	for _, s := range seqs {
		r.insert(s)
	}
	r.drain()
	r.evictAll()
	for k := 0; r.caches[0].core.Queues().Reads == 0; k++ {
		if k > 10000 {
			t.Fatal("no prefetch read started")
		}
		if r.caches[0].core.Queues().Queries == 0 { // (again, if every query timed out)
			for _, s := range seqs[:6] {
				if err := r.each("prefetch", func(_ int, c *Cache) error { _, err := c.Prefetch(Request{Tokens: s}); return err }); err != nil {
					t.Fatal(err)
				}
			}
		}
		r.mustStep()
	}
	r.caches[3].core.PerturbPlacement()
	for i, err := range r.all(func(i int) error { return r.caches[i].Step(context.Background()) }) {
		if !errors.Is(err, ErrPlacementDiverged) {
			t.Fatalf("rank %d: step error %v, want ErrPlacementDiverged", i, err)
		}
	}
	var before [][]byte
	for _, s := range r.slabs {
		before = append(before, s.Snapshot()...)
	}
	for range 5 {
		r.mustStep()
	}
	var after [][]byte
	for _, s := range r.slabs {
		after = append(after, s.Snapshot()...)
	}
	for i := range before {
		if !slices.Equal(before[i], after[i]) {
			t.Fatalf("slab %d changed after the divergence", i)
		}
	}
	for i, c := range r.caches {
		if c.Pending() != 0 {
			t.Fatalf("rank %d: %d operations pending after the divergence", i, c.Pending())
		}
	}
	r.flushAndCheckFresh()
	r.checkCollectives()
}

// TestL3DuplicatePrefetch: two prefetches of one continuation read it once; both finish.
func TestL3DuplicatePrefetch(t *testing.T) {
	ns := testNamespace(t)
	r := newRig(t, l3RigConfig(l3Layout, openStores(t, "mem://"+t.Name(), ns), ns, L3Options{PrefetchPolicy: PrefetchWaitComplete}))
	s := tokensN(100, 32)
	r.insertAll([][]int32{s})
	r.evictAll()
	var ids [2]uint64
	for k := range ids {
		res := make([]PrefetchResult, len(r.caches))
		if err := r.each("prefetch", func(i int, c *Cache) (err error) {
			res[i], err = c.Prefetch(Request{Tokens: s})
			return err
		}); err != nil {
			t.Fatal(err)
		}
		ids[k] = res[0].ID
	}
	r.stepUntil("both prefetches over", func() bool {
		return !r.caches[0].PrefetchPending(ids[0]) && !r.caches[0].PrefetchPending(ids[1])
	})
	st := r.sameStats()
	if st.L3PrefetchedPages != 8 || st.L3SkippedPrefetches != 1 || st.L3DiscardedPages != 0 {
		t.Fatalf("two prefetches of 8 stored pages: %d prefetched, %d skipped, %d discarded; want 8, 1, 0",
			st.L3PrefetchedPages, st.L3SkippedPrefetches, st.L3DiscardedPages)
	}
	if ms, err := r.matchLoad(s, true); err != nil || ms[0].DevicePages != 8 {
		t.Fatalf("after the prefetches: %d device pages (%v), want 8", ms[0].DevicePages, err)
	}
}

// TestStorageNamespace: the namespace depends on the model, page sizes and TP size, not on
// the CP size; bad input is rejected naming it.
func TestStorageNamespace(t *testing.T) {
	mk := func(model string, lc parallel.LayoutConfig, tokens, bytes int) storage.Namespace {
		l, err := parallel.NewLayout(lc)
		if err != nil {
			t.Fatal(err)
		}
		ns, err := NewStorageNamespace(model, l, tokens, bytes, nil)
		if err != nil {
			t.Fatal(err)
		}
		return ns
	}
	base := mk("m", parallel.LayoutConfig{World: 4, AttnCP: 4}, 16, 4096)
	if mk("m", parallel.LayoutConfig{World: 2, AttnCP: 2}, 16, 4096) != base {
		t.Fatal("CP size changed the namespace")
	}
	for i, other := range []storage.Namespace{
		mk("n", parallel.LayoutConfig{World: 4, AttnCP: 4}, 16, 4096),
		mk("m", parallel.LayoutConfig{World: 4, AttnCP: 2}, 16, 4096),
		mk("m", parallel.LayoutConfig{World: 4, AttnCP: 4}, 32, 4096),
		mk("m", parallel.LayoutConfig{World: 4, AttnCP: 4}, 16, 8192),
	} {
		if other.ID() == base.ID() {
			t.Fatalf("variant %d has the base namespace %s", i, base)
		}
	}
	if _, err := NewStorageNamespace("", nil, 16, 0, nil); !errors.Is(err, ErrBadConfig) || !strings.Contains(err.Error(), "0 bytes") {
		t.Fatalf("bad input: %v", err)
	}
}

// TestL3StuckQueries: a storage query that does not return holds its prefetch only until
// the scheduler revokes it (best effort) or the timeout policy's timer expires: both end as
// misses while the query is still stuck.
func TestL3StuckQueries(t *testing.T) {
	for _, pol := range []PrefetchPolicy{PrefetchBestEffort, PrefetchTimeout} {
		t.Run(pol.String(), func(t *testing.T) {
			ns := testNamespace(t)
			gate := make(chan struct{})
			defer close(gate)
			rc := l3RigConfig(l3Layout, openStores(t, "mem://"+t.Name(), ns), ns,
				L3Options{PrefetchPolicy: pol, PrefetchTimeoutBase: time.Millisecond, PrefetchTimeoutPerPage: time.Microsecond})
			var stuck heldFlag
			rc.l3Hook = gateHook(gate, func(_ int, kind core.StorageKind) bool { return kind == core.StorageQuery && stuck.get() })
			r := newRig(t, rc)
			s := tokensN(300, 32)
			r.insertAll([][]int32{s})
			r.evictAll()
			steps0 := r.caches[0].Stats().Steps
			stuck.set(true)
			revokeAt := -1
			if pol == PrefetchBestEffort {
				revokeAt = 5 // until then the query is stuck and nothing moves
			}
			pf := r.prefetch(s, revokeAt)
			if steps := r.caches[0].Stats().Steps - steps0; pol == PrefetchBestEffort && steps < 6 {
				t.Fatalf("the prefetch ended before it was revoked")
			}
			if pf.Pages != 8 {
				t.Fatalf("prefetch %+v, want 8 pages asked", pf)
			}
			if st := r.sameStats(); st.L3HitPages != 0 || st.L3PrefetchedPages != 0 {
				t.Fatalf("stuck query: %d pages hit, %d prefetched; want misses", st.L3HitPages, st.L3PrefetchedPages)
			}
		})
	}
}

// deviceSlabs is a slab set whose pages are not host memory (like a CUDA IPC slab.Set).
type deviceSlabs struct{ *kvtest.MemSlabs }

func (deviceSlabs) Page(p slab.Page) ([]byte, error) {
	return nil, fmt.Errorf("page %v is device memory", p)
}

// nopEngine finishes every transfer at once without copying.
type nopEngine struct{}

func (nopEngine) Submit(t Transfer) *Ticket { tk := engine.NewTicket(t); tk.Finish(nil); return tk }
func (nopEngine) Cancel()                   {}
func (nopEngine) Close() error              { return nil }

// clearDeadlineStore records whether Clear was called with a deadline.
type clearDeadlineStore struct {
	storage.Storage
	clears, unbounded *atomic.Int64
}

func (s clearDeadlineStore) Clear(ctx context.Context) error {
	s.clears.Add(1)
	if _, ok := ctx.Deadline(); !ok {
		s.unbounded.Add(1)
	}
	return s.Storage.Clear(ctx)
}

// TestL3FlushClearHasCallDeadline: the Clear at a ClearOnFlush flush (CP rank 0's of each
// slab group) is a storage
// call like the others, bounded by L3Options.CallTimeout, even when Flush's context has no
// deadline (a store that stops answering must not hold Flush, which holds the cache's
// mutex, forever).
func TestL3FlushClearHasCallDeadline(t *testing.T) {
	ns := testNamespace(t)
	var clears, unbounded atomic.Int64
	open := openStores(t, "mem://"+t.Name(), ns)
	store := func(i int) storage.Storage { return clearDeadlineStore{open(i), &clears, &unbounded} }
	r := newRig(t, l3RigConfig(l3Layout, store, ns, L3Options{ClearOnFlush: true}))
	r.flushAndCheckFresh()
	if clears.Load() == 0 || unbounded.Load() != 0 {
		t.Fatalf("%d clears, %d of them without a deadline", clears.Load(), unbounded.Load())
	}
}

// TestL3PrefetchTimerSaturates: a PrefetchTimeout timer too long to add up (a per-page time
// near the largest Duration, meaning "never mind the time") is as good as no timer. The sum
// base + pages × per-page overflowed to a negative duration, so the timer of every read had
// expired when it started, and each prefetch was cut at its first step.
func TestL3PrefetchTimerSaturates(t *testing.T) {
	ns := testNamespace(t)
	l3 := L3Options{PrefetchPolicy: PrefetchTimeout, PrefetchTimeoutBase: time.Hour, PrefetchTimeoutPerPage: math.MaxInt64 / 5}
	gate := make(chan struct{})
	var held heldFlag
	rc := l3RigConfig(l3Layout, openStores(t, "mem://"+t.Name(), ns), ns, l3)
	rc.l3Hook = gateHook(gate, func(_ int, kind core.StorageKind) bool { return kind == core.StorageRead && held.get() })
	r := newRig(t, rc)
	s := tokensN(500, 32)
	r.insertAll([][]int32{s})
	r.evictAll()
	held.set(true)
	res := make([]PrefetchResult, len(r.caches))
	if err := r.each("prefetch", func(i int, c *Cache) (err error) { res[i], err = c.Prefetch(Request{Tokens: s}); return err }); err != nil {
		t.Fatal(err)
	}
	r.stepUntil("the read starts", func() bool { return r.caches[0].core.Queues().Reads > 0 })
	for range 5 {
		r.mustStep()
	}
	close(gate)
	r.stepUntil("the prefetch ends", func() bool { return !r.caches[0].PrefetchPending(res[0].ID) })
	if st := r.sameStats(); st.L3PrefetchedPages != 8 || st.L3DiscardedPages != 0 {
		t.Fatalf("%d pages prefetched, %d discarded; want all 8 read (the timer never expires)", st.L3PrefetchedPages, st.L3DiscardedPages)
	}
}

// TestL3TimedOutQueryStops: a storage query that outlived its PrefetchTimeout timer is a
// miss, and its job stops there. It must not run on, holding a storage worker (or, queued
// behind the workers, waiting to run a call nobody awaits): with a store slower than the
// timer, such queries would pile up and backups and reads would wait behind them.
func TestL3TimedOutQueryStops(t *testing.T) {
	ns := testNamespace(t)
	gate := make(chan struct{})
	defer close(gate)
	l3 := L3Options{PrefetchPolicy: PrefetchTimeout, PrefetchTimeoutBase: time.Millisecond, PrefetchTimeoutPerPage: time.Microsecond, Workers: 1}
	rc := l3RigConfig(l3Layout, openStores(t, "mem://"+t.Name(), ns), ns, l3)
	var stuck heldFlag
	rc.l3Hook = gateHook(gate, func(_ int, kind core.StorageKind) bool { return kind == core.StorageQuery && stuck.get() })
	r := newRig(t, rc)
	seqs := [][]int32{tokensN(600, 32), tokensN(700, 32)}
	r.insertAll(seqs[:1])
	r.evictAll()
	stuck.set(true)
	if pf := r.prefetch(seqs[0], -1); pf.Pages != 8 {
		t.Fatalf("prefetch %+v, want 8 pages asked", pf)
	}
	// The query timed out (a miss); the one storage worker must be free for a backup.
	if _, err := r.insert(seqs[1]); err != nil {
		t.Fatal(err)
	}
	for k := 0; r.caches[0].Pending() > 0; k++ {
		if k > 2000 {
			t.Fatalf("the backup never ran: queues %+v (the timed-out query holds the worker)", r.caches[0].core.Queues())
		}
		time.Sleep(100 * time.Microsecond)
		r.mustStep()
	}
	for i, c := range r.caches {
		if n := c.Stats().StorageErrors; n != 0 {
			t.Fatalf("rank %d: %d storage errors; a query stopped by its timer is a miss, not an error", i, n)
		}
	}
}
