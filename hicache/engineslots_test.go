package hicache

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/cpcache/cpcache/hicache/kvtest"
	"github.com/cpcache/cpcache/parallel"
)

// engineAlloc is one rank's engine allocator in a test: it hands out slots and takes them
// back, failing the test on a slot handed back that it did not give out.
type engineAlloc struct {
	mu   sync.Mutex
	out  map[int32]bool
	free []int32
}

func newEngineAlloc(size int) *engineAlloc {
	a := &engineAlloc{out: map[int32]bool{}}
	for s := size - 1; s >= 0; s-- {
		a.free = append(a.free, int32(s))
	}
	return a
}

func (a *engineAlloc) take(n int) ([]int32, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if n > len(a.free) {
		return nil, fmt.Errorf("engine allocator: %d slots wanted, %d free", n, len(a.free))
	}
	out := slices.Clone(a.free[len(a.free)-n:])
	a.free = a.free[:len(a.free)-n]
	for _, s := range out {
		a.out[s] = true
	}
	return out, nil
}

func (a *engineAlloc) giveBack(what string, slots []int32) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, s := range slots {
		if !a.out[s] {
			return fmt.Errorf("%s hands back slot %d, which is not out (freed twice or never given)", what, s)
		}
		delete(a.out, s)
		a.free = append(a.free, s)
	}
	return nil
}

// TestEngineOwnedInsertEvictLoadBack: a CP4 group in L1 mode EngineOwned over host engines.
// Each rank computes a sequence's KV into slots from its own allocator and inserts it with
// them; an eviction returns every slot; a load-back from L2 lands in the slots the engine
// passes (the content is checked); Flush hands back the rest. Every slot comes back once.
func TestEngineOwnedInsertEvictLoadBack(t *testing.T) {
	const l1 = 8
	r := newRig(t, rigConfig{layout: parallel.LayoutConfig{World: 4, DP: 1, AttnCP: 4, DPAttention: true},
		opts: Options{PageSize: 4, L1Pages: l1, L1Mode: EngineOwned}, pagesPerSlab: 16, pageBytes: 64})
	allocs := make([]*engineAlloc, len(r.caches))
	for i := range allocs {
		allocs[i] = newEngineAlloc(l1)
	}
	tokens := make([]int32, 4*10) // 10 pages: 3, 3, 2, 2 per rank
	for i := range tokens {
		tokens[i] = int32(100 + i)
	}
	hashes := PrefixHashes(tokens, 4)
	err := r.each("insert", func(i int, c *Cache) error {
		var pages []int
		for p := range 10 {
			if c.Owns(p) {
				pages = append(pages, p)
			}
		}
		own, err := allocs[i].take(len(pages))
		if err != nil {
			return err
		}
		for k, p := range pages { // the forward pass writes the KV into the engine's slots
			b, err := c.L1Page(own[k])
			if err != nil {
				return err
			}
			kvtest.FillKV(b, hashes[p].Index(), p, r.shards[i])
		}
		res, err := c.InsertSlots(Request{Tokens: tokens}, own)
		if err != nil {
			return err
		}
		if res.Pages != 10 || len(res.Freed) != 0 {
			return fmt.Errorf("insert: %d pages, freed %v; want 10 and none", res.Pages, res.Freed)
		}
		if got := c.Stats().L1Used; got != len(pages) {
			return fmt.Errorf("rank %d holds %d L1 slots, owns %d pages", i, got, len(pages))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	r.drain() // the backups to L2
	if err := r.each("evict", func(i int, c *Cache) error {
		freed, _, slots, err := c.EvictL1Slots(10)
		if err != nil {
			return err
		}
		if freed != 10 {
			return fmt.Errorf("evicted %d pages, want 10", freed)
		}
		return allocs[i].giveBack("EvictL1Slots", slots)
	}); err != nil {
		t.Fatal(err)
	}
	for i, a := range allocs {
		if len(a.out) != 0 {
			t.Fatalf("rank %d: %d slots out after evicting everything", i, len(a.out))
		}
	}
	if err := r.each("load", func(i int, c *Cache) error {
		m, err := c.Match(Request{Tokens: tokens})
		if err != nil {
			return err
		}
		if m.HostPages != 10 {
			return fmt.Errorf("host hit %d pages, want 10", m.HostPages)
		}
		plan, err := c.LoadBackPlan(m.Last)
		if err != nil {
			return err
		}
		own, err := allocs[i].take(len(plan))
		if err != nil {
			return err
		}
		lr, err := c.LoadBackSlots(m.Last, own)
		if err != nil {
			return err
		}
		if err := allocs[i].giveBack("LoadBackSlots", lr.Freed); err != nil {
			return err
		}
		for c.LoadPending(m.Last) {
			if err := c.Step(context.Background()); err != nil {
				return err
			}
		}
		if m, err = c.Match(Request{Tokens: tokens}); err != nil {
			return err
		}
		if err := c.WaitL1(context.Background(), m.Last); err != nil {
			return err
		}
		if m.DevicePages != lr.Pages || lr.Pages == 0 {
			return fmt.Errorf("after loading %d pages: %d device pages", lr.Pages, m.DevicePages)
		}
		for p, s := range m.L1Slots {
			if c.Owns(p) != (s >= 0) || s >= 0 && !slices.Contains(own, s) {
				return fmt.Errorf("page %d: slot %d, the engine passed %v", p, s, own)
			}
		}
		return r.verify(i, m)
	}); err != nil {
		t.Fatal(err)
	}
	if err := r.each("flush", func(i int, c *Cache) error {
		if err := c.Flush(context.Background()); err != nil {
			return err
		}
		if err := allocs[i].giveBack("FreedL1", c.FreedL1()); err != nil {
			return err
		}
		if len(allocs[i].out) != 0 {
			return fmt.Errorf("%d slots never came back", len(allocs[i].out))
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}
