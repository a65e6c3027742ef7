package hicache

import (
	"context"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/cpcache/cpcache/hicache/core"
	"github.com/cpcache/cpcache/parallel"
	"github.com/cpcache/cpcache/storage"
	"github.com/cpcache/cpcache/storage/stores"
)

// l3Layout has two slab groups (TP shards) of two CP ranks in one replica group: four ranks,
// each reading and writing its own pages, whose reads finish at different times.
var l3Layout = parallel.LayoutConfig{World: 4, TP: 4, AttnCP: 2}

// l3Ranks is the number of ranks of l3Layout.
const l3Ranks = 4

func testNamespace(t testing.TB) storage.Namespace {
	ns, err := storage.NewNamespace("hicache-test;page_tokens=4;page_bytes=256")
	if err != nil {
		t.Fatal(err)
	}
	return ns
}

// openStores opens one handle on url per rank (as the ranks of a job would) and closes them
// at the end of the test.
func openStores(t testing.TB, url string, ns storage.Namespace) func(int) storage.Storage {
	var mu sync.Mutex
	return func(int) storage.Storage {
		mu.Lock()
		defer mu.Unlock()
		st, err := stores.Open(context.Background(), url, storage.Options{Namespace: ns, MACKey: []byte("hicache test storage MAC key....")})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		return st
	}
}

// randomDelays makes every storage call of a rank sleep up to max (per-rank generator).
func randomDelays(seed uint64, maxDelay time.Duration) func(int) func(context.Context, core.StorageKind, uint64, int) error {
	return func(rank int) func(context.Context, core.StorageKind, uint64, int) error {
		var mu sync.Mutex
		rng := rand.New(rand.NewPCG(seed, uint64(rank)))
		return func(ctx context.Context, _ core.StorageKind, _ uint64, _ int) error {
			mu.Lock()
			d := time.Duration(rng.Int64N(int64(maxDelay)))
			mu.Unlock()
			select {
			case <-time.After(d):
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
}

// gateHook holds the storage jobs that hold(rank, kind) selects until gate is closed (or
// the job's context ends); the others run at once.
func gateHook(gate <-chan struct{}, hold func(rank int, kind core.StorageKind) bool) func(int) func(context.Context, core.StorageKind, uint64, int) error {
	return func(rank int) func(context.Context, core.StorageKind, uint64, int) error {
		return func(ctx context.Context, kind core.StorageKind, _ uint64, _ int) error {
			if !hold(rank, kind) {
				return nil
			}
			select {
			case <-gate:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
}

// heldFlag is a switch a test flips while storage jobs read it.
type heldFlag struct {
	mu sync.Mutex // guards on
	on bool
}

func (f *heldFlag) set(on bool) {
	f.mu.Lock()
	f.on = on
	f.mu.Unlock()
}

func (f *heldFlag) get() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.on
}

// mustStep runs one step everywhere and fails the test on an error.
func (r *rig) mustStep() {
	r.t.Helper()
	if err := r.step(); err != nil {
		r.t.Fatal(err)
	}
}

// stepUntil steps until done() holds (checked before every step); what names the awaited
// event when it never comes.
func (r *rig) stepUntil(what string, done func() bool) {
	r.t.Helper()
	for k := 0; !done(); k++ {
		if k > 10000 {
			r.t.Fatalf("%s: not after %d steps", what, k)
		}
		r.mustStep()
	}
}

func l3RigConfig(layout parallel.LayoutConfig, store func(int) storage.Storage, ns storage.Namespace, l3 L3Options) rigConfig {
	return rigConfig{
		layout: layout, opts: Options{PageSize: 4, L1Pages: 96, MinLoadPages: 1, LoadQuotaPages: 64},
		pagesPerSlab: 96, pageBytes: 256, store: store, ns: ns, l3: l3,
	}
}

// prefetch starts a prefetch of tokens on every rank and steps until it is over; at step
// revokeAt (if >= 0) every rank revokes it.
func (r *rig) prefetch(tokens []int32, revokeAt int) PrefetchResult {
	r.t.Helper()
	res := make([]PrefetchResult, len(r.caches))
	if err := r.each("prefetch", func(i int, c *Cache) (err error) {
		res[i], err = c.Prefetch(Request{Tokens: tokens, Key: r.key})
		return err
	}); err != nil {
		r.t.Fatal(err)
	}
	for i := range res {
		if res[i] != res[0] {
			r.t.Fatalf("prefetch: rank %d got %+v, rank 0 %+v", i, res[i], res[0])
		}
	}
	for k := 0; r.caches[0].PrefetchPending(res[0].ID); k++ {
		if k > 20000 {
			r.t.Fatal("prefetch never finished")
		}
		if k == revokeAt {
			if err := r.each("revoke", func(_ int, c *Cache) error { return c.RevokePrefetch(res[0].ID) }); err != nil {
				r.t.Fatal(err)
			}
		}
		if err := r.step(); err != nil {
			r.t.Fatal(err)
		}
	}
	return res[0]
}

// evictAll drops everything from L1 and L2 (backups to storage finish first).
func (r *rig) evictAll() {
	r.t.Helper()
	r.drain()
	// Under write-back, parents become evictable once their children's backups committed.
	for k := 0; r.caches[0].Stats().L1Used > 0; k++ {
		if k > 100 {
			r.t.Fatalf("%d L1 pages left after evicting everything", r.caches[0].Stats().L1Used)
		}
		if err := r.each("evict", func(_ int, c *Cache) error {
			_, _, err := c.EvictL1(1 << 30)
			return err
		}); err != nil {
			r.t.Fatal(err)
		}
		r.drain()
	}
	if err := r.each("evict", func(_ int, c *Cache) error {
		_, err := c.EvictL2(1 << 30)
		return err
	}); err != nil {
		r.t.Fatal(err)
	}
	if err := r.step(); err != nil {
		r.t.Fatal(err)
	}
	if n := r.caches[0].Stats().Nodes; n != 0 {
		r.t.Fatalf("%d nodes left after evicting everything", n)
	}
}

func (r *rig) insertAll(seqs [][]int32) {
	r.t.Helper()
	for _, s := range seqs {
		if _, err := r.insert(s); err != nil {
			r.t.Fatal(err)
		}
		if err := r.step(); err != nil {
			r.t.Fatal(err)
		}
	}
	r.drain()
}

// sameStats checks that the agreed L3 counters are equal on every rank and returns rank 0's.
func (r *rig) sameStats() CoreStats {
	r.t.Helper()
	s0 := r.caches[0].Stats().CoreStats
	for i, c := range r.caches {
		if s := c.Stats().CoreStats; s.L3HitPages != s0.L3HitPages || s.L3PrefetchedPages != s0.L3PrefetchedPages ||
			s.L3BackedUpPages != s0.L3BackedUpPages || s.L3DiscardedPages != s0.L3DiscardedPages || s.L3FailedBackups != s0.L3FailedBackups {
			r.t.Fatalf("rank %d L3 stats %+v, rank 0 %+v", i, s, s0)
		}
	}
	return s0
}

// storedPages is how many leading pages of tokens every shard has in storage, as the ranks
// see it: each checks the pages it owns with its own handle, and the answer is the first
// page some rank lacks.
func (r *rig) storedPages(tokens []int32) int {
	r.t.Helper()
	hashes := KeyPrefixHashes(r.key, tokens, 4)
	n := len(hashes)
	for _, c := range r.caches {
		C := r.layout.AttnCP
		present := make([]bool, len(hashes))
		if _, err := c.l3.st.Exists(context.Background(), c.l3.keys(hashes), present); err != nil {
			r.t.Fatal(err)
		}
		for j := c.CPRank(); j < n; j += C {
			if !present[j] {
				n = j
			}
		}
	}
	return n
}
