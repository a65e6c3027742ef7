package hicache

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/cpcache/cpcache/hicache/kvlayout"
	"github.com/cpcache/cpcache/hicache/kvtest"
	"github.com/cpcache/cpcache/parallel"
	"github.com/cpcache/cpcache/parallel/local"
)

// mlaLayout is a small MLA-like KV layout: one replicated latent per layer, 256 bytes per
// page of 4 tokens (l3RigConfig's page) at any attention-TP size.
var mlaLayout = &kvlayout.Layout{NumLayers: 2, Parts: []kvlayout.Part{{Name: "latent", BytesPerToken: 32, Sharding: kvlayout.Replicated}}}

// shareLayout is attention-TP 4 × attention-CP 2: one replica group of 8 ranks.
var shareLayout = parallel.LayoutConfig{World: 8, TP: 8, AttnCP: 2}

// scrubL1 zeroes every L1 slot of every rank, so a page that loads back right came from L2.
func (r *rig) scrubL1() {
	r.t.Helper()
	for i, c := range r.caches {
		for s := range int32(c.core.Config().L1Pages) {
			b, err := c.L1Page(s)
			if err != nil {
				r.t.Fatalf("rank %d: %v", i, err)
			}
			clear(b)
		}
	}
}

// evictL1 drops every L1 page (backups finished first) and zeroes L1.
func (r *rig) evictL1() {
	r.t.Helper()
	r.drain()
	if err := r.each("evict", func(_ int, c *Cache) error { _, _, err := c.EvictL1(1 << 30); return err }); err != nil {
		r.t.Fatal(err)
	}
	r.drain()
	if n := r.caches[0].Stats().L1UsedAll; n != 0 {
		r.t.Fatalf("%d L1 pages left", n)
	}
	r.scrubL1()
}

// TestSharedSlabsMLA: at attention-TP 4 × CP 2 with a replicated layout, the 4 TP ranks of a
// CP index share one slab (2 slabs for 8 ranks): only the TP-0 ranks copy backups into L2
// and store pages in L3, each page is stored once (under the TP-0 key, none under another
// TP index), and every TP rank loads every page it owns back right, from L2 and from L3.
func TestSharedSlabsMLA(t *testing.T) {
	ns := testNamespace(t)
	rc := l3RigConfig(shareLayout, openStores(t, "mem://"+t.Name(), ns), ns, L3Options{})
	rc.opts.Policy = WriteThrough
	rc.shareSlabs, rc.kvLayout = true, mlaLayout
	r := newRig(t, rc)
	distinct := map[*kvtest.MemSlabs]bool{}
	for _, s := range r.slabs {
		distinct[s] = true
	}
	if len(distinct) != 1 || len(r.slabs[0].Ranks()) != 2 {
		t.Fatalf("%d slab sets of %v for 8 ranks, want one set of 2 slabs made by ranks 0 and 4", len(distinct), r.slabs[0].Ranks())
	}
	seqs := kvtest.RandomSequences(rand.New(rand.NewPCG(27, 8)), 6, 4)
	unique := map[PageID]bool{}
	for _, s := range seqs {
		for _, h := range PrefixHashes(s, 4) {
			unique[h] = true
		}
	}
	pages := len(unique)
	r.insertAll(seqs)
	r.drain()
	st := r.sameStats()
	if st.L3BackedUpPages != int64(pages) {
		t.Fatalf("%d pages backed up to storage, want %d", st.L3BackedUpPages, pages)
	}
	var l2Writes, l3Writes int64
	for i, c := range r.caches {
		s := c.Stats()
		writer := r.layout.SharedSlabWriter(i)
		if !writer && (s.PagesWritten != 0 || s.StoragePagesWritten != 0) {
			t.Errorf("rank %d (TP %d, a reader) copied %d pages into L2 and %d into storage, want none", i, i%4, s.PagesWritten, s.StoragePagesWritten)
		}
		if writer && (s.PagesWritten == 0 || s.StoragePagesWritten == 0) {
			t.Errorf("rank %d (a writer) copied %d pages into L2 and %d into storage", i, s.PagesWritten, s.StoragePagesWritten)
		}
		l2Writes += s.PagesWritten
		l3Writes += s.StoragePagesWritten
	}
	if l2Writes != int64(pages) || l3Writes != int64(pages) {
		t.Errorf("%d L2 copies and %d storage values for %d pages, want one of each per page", l2Writes, l3Writes, pages)
	}
	// One value per page: every page under the TP-0 key, none under TP index 1's.
	other := newL3Driver(r.caches[0].l3.st, ns, 1, nil, r.caches[0].l3.opts)
	for _, s := range seqs {
		hashes := PrefixHashes(s, 4)
		if n, err := r.caches[1].l3.st.Exists(context.Background(), r.caches[1].l3.keys(hashes), nil); err != nil || n != len(hashes) {
			t.Fatalf("rank 1 finds %d of %d pages in storage (err %v)", n, len(hashes), err)
		}
		present := make([]bool, len(hashes))
		if _, err := other.st.Exists(context.Background(), other.keys(hashes), present); err != nil {
			t.Fatal(err)
		}
		for j, p := range present {
			if p {
				t.Fatalf("page %d stored under TP index 1's key too", j)
			}
		}
	}
	// Load-back from the shared L2 into every TP rank's own L1.
	r.evictL1()
	for _, s := range seqs {
		m, err := r.matchLoad(s, true)
		if err != nil {
			t.Fatal(err)
		}
		if m[0].DevicePages != len(s)/4 {
			t.Fatalf("loaded %d of %d pages back from L2", m[0].DevicePages, len(s)/4)
		}
	}
	// Prefetch from storage into the shared L2 (by the writers), then load back everywhere.
	r.evictAll()
	r.scrubL1()
	for _, s := range seqs {
		if res := r.prefetch(s, -1); res.Pages == 0 && len(s) >= 4 {
			t.Fatalf("prefetch of %d pages found none in storage", len(s)/4)
		}
		m, err := r.matchLoad(s, true)
		if err != nil {
			t.Fatal(err)
		}
		if m[0].DevicePages != len(s)/4 {
			t.Fatalf("loaded %d of %d pages back after the prefetch", m[0].DevicePages, len(s)/4)
		}
	}
	for i, c := range r.caches {
		if s := c.Stats(); !r.layout.SharedSlabWriter(i) && s.StoragePagesRead != 0 {
			t.Errorf("rank %d (a reader) read %d pages from storage", i, s.StoragePagesRead)
		}
	}
	r.checkCollectives()
}

// TestSharedSlabsConfigErrors: shared slabs need an all-replicated layout, and the shared
// slab group; today's per-TP slab group with ShareSlabs is a scope error.
func TestSharedSlabsConfigErrors(t *testing.T) {
	l, err := parallel.NewLayout(shareLayout)
	if err != nil {
		t.Fatal(err)
	}
	g := local.New(l.ReplicaGroup(1), local.Options{Kind: "replica"})[1]
	shared := kvtest.NewMemSlabs(l.SharedSlabGroup(1), 8, 256)
	// The slab makers alone as the consensus group: their TP peers map the slabs too.
	makers := local.New(l.SharedSlabGroup(0), local.Options{Kind: "slab"})[0]
	if err := checkScope(l, 0, makers, shared, true); !errors.Is(err, ErrScope) || !strings.Contains(err.Error(), "rank 1, which shares slab group") {
		t.Fatalf("consensus on the makers only: %v, want ErrScope naming rank 1", err)
	}
	if err := checkScope(l, 1, g, shared, true); err != nil {
		t.Fatalf("shared slab group of rank 1: %v", err)
	}
	perTP := kvtest.NewMemSlabs(l.SlabGroup(1), 8, 256)
	if err := checkScope(l, 1, g, perTP, true); !errors.Is(err, ErrScope) {
		t.Fatalf("per-TP slab group with shared slabs: %v, want ErrScope", err)
	}
	if err := checkScope(l, 1, g, shared, false); !errors.Is(err, ErrScope) {
		t.Fatalf("shared slab group without sharing: %v, want ErrScope", err)
	}
	sharded := &kvlayout.Layout{NumLayers: 2, Parts: []kvlayout.Part{{Name: "k", BytesPerToken: 64, Sharding: kvlayout.Sharded}}}
	_, err = build(Config{Options: Options{PageSize: 4, L1Pages: 8}, Layout: l, Rank: 1, Group: g,
		Slabs: shared, ShareSlabs: true, KVLayout: sharded})
	if !errors.Is(err, ErrBadConfig) {
		t.Fatalf("shared slabs with a sharded layout: %v, want ErrBadConfig", err)
	}
}

// TestSharedSlabsRandomWorkload: the random workload on attention-TP 4 × CP 2 with shared
// slabs and random per-rank copy delays (a writer often finishes after its readers): every
// rank verifies every page it loads back (shard 0 content on every TP rank), the replicas
// agree after every step, and the readers never copy into L2.
func TestSharedSlabsRandomWorkload(t *testing.T) {
	// 64-byte pages of 4 tokens: one replicated latent of 16 bytes per token.
	mla := &kvlayout.Layout{NumLayers: 1, Parts: []kvlayout.Part{{Name: "latent", BytesPerToken: 16, Sharding: kvlayout.Replicated}}}
	for _, policy := range []Policy{WriteThrough, WriteBack} {
		t.Run(policy.String(), func(t *testing.T) {
			steps := 800
			if testing.Short() {
				steps /= 4
			}
			r := newRig(t, rigConfig{
				layout:       shareLayout,
				opts:         Options{PageSize: 4, L1Pages: 64, Policy: policy, MinLoadPages: 2, LoadQuotaPages: 64},
				pagesPerSlab: 24, pageBytes: 64, maxDelay: 300 * time.Microsecond, seed: 27,
				shareSlabs: true, kvLayout: mla,
			})
			counts := r.workload(steps, 13, 300)
			r.drain()
			r.checkCollectives()
			st := r.caches[0].Stats()
			t.Logf("%v stats=%+v", counts, st.CoreStats)
			if st.WrittenPages == 0 || st.LoadedPages == 0 || st.EvictedL2Pages == 0 {
				t.Fatalf("workload did not exercise every tier: %+v", st.CoreStats)
			}
			var written int64
			for i, c := range r.caches {
				s := c.Stats()
				if !r.layout.SharedSlabWriter(i) && s.PagesWritten != 0 {
					t.Errorf("rank %d (a reader) copied %d pages into L2", i, s.PagesWritten)
				}
				if s.PagesLoaded == 0 {
					t.Errorf("rank %d loaded nothing back", i)
				}
				written += s.PagesWritten
			}
			if written != st.WrittenPages {
				t.Errorf("%d pages copied into L2 by the writers, the group backed up %d: want one copy each", written, st.WrittenPages)
			}
		})
	}
}
