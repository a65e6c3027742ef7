package refmodel_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cpcache/cpcache/hicache"
	"github.com/cpcache/cpcache/hicache/kvmem"
	"github.com/cpcache/cpcache/hicache/kvtest"
	"github.com/cpcache/cpcache/parallel"
	"github.com/cpcache/cpcache/parallel/local"
	"github.com/cpcache/cpcache/sim/refmodel"
)

// The oracle: C in-process CP ranks, each lending the model's per-layer KV buffers (host
// token-slot buffers) to a hicache.Cache, serve multi-turn conversations (each turn's prompt
// holds the previous turn's generated answer). Prefill computes only the tokens the cache
// missed and reads the cached prefix from L1 after the layer-wise wait; every request's
// generated tokens and final-logits hash must equal a cache-off run's.

const (
	pageTokens = 4
	genTokens  = 4
)

// result is one request's output.
type result struct {
	tokens []int32
	hash   uint64
}

// conversations is the workload: nConv conversations of nTurns turns over a shared system
// prompt, served turn-major (turn 0 of every conversation, then turn 1, ...). serve answers
// one prompt; the next turn's prompt is the previous prompt, its answer, and new user tokens.
func conversations(seed uint64, vocab int, serve func(prompt []int32) (result, error)) ([]result, error) {
	const nConv, nTurns = 3, 3
	rng := rand.New(rand.NewPCG(seed, 11))
	user := func(n int) []int32 {
		out := make([]int32, n)
		for i := range out {
			out[i] = int32(rng.IntN(vocab))
		}
		return out
	}
	system := user(9)
	hist := make([][]int32, nConv)
	for c := range hist {
		hist[c] = slices.Clone(system)
	}
	var out []result
	for range nTurns {
		for c := range nConv {
			prompt := append(hist[c], user(3+rng.IntN(7))...)
			r, err := serve(prompt)
			if err != nil {
				return nil, err
			}
			out = append(out, r)
			hist[c] = append(slices.Clone(prompt), r.tokens...)
		}
	}
	return out, nil
}

// cacheOff is the reference: every request computed from scratch on one rank.
func cacheOff(m *refmodel.Model, seed uint64) ([]result, error) {
	return conversations(seed, m.Config().Vocab, func(prompt []int32) (result, error) {
		toks, logits, err := m.Generate(context.Background(), refmodel.Pass{KV: refmodel.NewMemKV(m), PageTokens: pageTokens}, prompt, 0, genTokens)
		return result{toks, refmodel.LogitsHash(logits)}, err
	})
}

// breakage damages the data path on one rank after a load-back landed (all layers waited),
// before the model reads it: the oracle must see it. loaded are the L1 slots of the pages
// loaded on this rank's own pages.
type breakage func(t testing.TB, l1 *kvmem.L1, loaded []int32)

// beforeLayer is a request's Pass.BeforeLayer when its prefix pages sit in L1 at prefix (a
// slot per page, -1 where another CP rank owns it): with a load-back of h in flight it waits
// for layer l's copies (unless cfg skips the wait) and, before layer 0, once the whole load
// has landed, lets cfg.damage break the pages this rank loaded.
func beforeLayer(ctx context.Context, t testing.TB, cache *hicache.Cache, cfg oracleConfig, l1 *kvmem.L1,
	h hicache.Handle, loading bool, prefix []int32) func(layer int) error {
	return func(layer int) error {
		if !loading || cfg.skipWait {
			return nil
		}
		if err := cache.WaitL1Layer(ctx, h, layer); err != nil {
			return err
		}
		if layer == 0 && cfg.damage != nil {
			if err := cache.WaitL1(ctx, h); err != nil {
				return err
			}
			var loaded []int32
			for i, s := range prefix {
				if cache.Owns(i) {
					loaded = append(loaded, s)
				}
			}
			cfg.damage(t, l1, loaded)
		}
		return nil
	}
}

// oracleConfig is one oracle run.
type oracleConfig struct {
	variant  refmodel.Variant
	cp       int
	evict    bool // evict every L1 page after each request: the next hits come back from L2
	l2Layout kvmem.L2Layout
	damage   breakage
	l1Pages  int            // page slots of each rank's L1 (0: 64)
	policy   hicache.Policy // write policy (0: write-through)
	// skipWait breaks the layer-wise wait: the prefill reads the loading pages before the
	// Step that starts their copies, from slots cleared as memory the load has not written yet.
	skipWait bool
	// l1Mode is who picks the L1 slots (0: the cache). EngineOwned: each rank's slot
	// allocator does (serveRankEngineOwned).
	l1Mode hicache.L1Mode
	// slotFault breaks the engine's slot bookkeeping (EngineOwned only).
	slotFault slotFault
	// reinsert (EngineOwned only): each request's sequence is inserted a second time with
	// copies of its new pages in other slots, as a batch of two equal prompts computed
	// before either is inserted would: the cache keeps the first copies and gives every
	// second one back in InsertResult.Freed.
	reinsert bool
	// minLoadPages is the cache's MinLoadPages (0: 1). EngineOwned: a host hit shorter than
	// it is not loaded and the destination slots come back in LoadResult.Freed.
	minLoadPages int
}

// slotFault is a bug of an engine-owned rank's slot bookkeeping (0: none).
type slotFault uint8

const (
	// heldSlotHandedOut: once, the allocator gives a request's last new page a slot the
	// cache still holds for another page (the forward writes its KV over that page's).
	heldSlotHandedOut slotFault = iota + 1
	// loadsSwapped: the engine's record of where it told a load-back to put its pages swaps
	// the first two, so the prefill reads each from its neighbour's destination slot.
	loadsSwapped
)

// stats says what the cache served.
type stats struct {
	l1HitPages, loadedPages int
	// EngineOwned: slots passed to LoadBackSlots and InsertSlots that came straight back
	// in their Freed (not loaded, or a second copy of a page in L1).
	loadSlotsBack, insertSlotsBack int
	computed                       int           // tokens the model computed (prefill misses and decodes)
	total, model                   time.Duration // wall time serving, and of it in the model (layer waits included)
}

// cacheOn serves the workload on cfg.cp ranks over the cache; it returns rank 0's results
// (every rank's must be equal) and what rank 0 served from the cache.
func cacheOn(t testing.TB, m *refmodel.Model, seed uint64, cfg oracleConfig) ([]result, stats) {
	t.Helper()
	res, st, errs := cacheOnErrs(t, m, seed, cfg)
	for r, err := range errs {
		if err != nil {
			t.Fatalf("CP rank %d: %v", r, err)
		}
	}
	return res, st
}

// cacheOnErrs is cacheOn returning each rank's error; the outputs are checked equal across
// ranks only when no rank failed.
func cacheOnErrs(t testing.TB, m *refmodel.Model, seed uint64, cfg oracleConfig) ([]result, stats, []error) {
	t.Helper()
	C := cfg.cp
	layout, err := parallel.NewLayout(parallel.LayoutConfig{World: C, AttnCP: C})
	if err != nil {
		t.Fatal(err)
	}
	kv := m.Layout()
	shape, err := kvmem.NewShape(kv, 1, pageTokens)
	if err != nil {
		t.Fatal(err)
	}
	l1Pages := cfg.l1Pages
	if l1Pages == 0 {
		l1Pages = 64
	}
	replica := local.New(layout.ReplicaGroup(0), local.Options{Kind: "replica", Timeout: 30 * time.Second})
	cpGroups := local.New(layout.ReplicaGroup(0), local.Options{Kind: "attn_cp", Timeout: 30 * time.Second})
	slabs := kvtest.NewMemSlabs(layout.SlabGroup(0), 128, int(shape.PageBytes()))
	results := make([][]result, C)
	st := make([]stats, C)
	errs := make([]error, C)
	var wg sync.WaitGroup
	for rank := range C {
		wg.Add(1)
		go func() {
			defer wg.Done()
			serve := serveRank
			if cfg.l1Mode == hicache.EngineOwned {
				serve = serveRankEngineOwned
			}
			results[rank], st[rank], errs[rank] = serve(t, m, seed, cfg, layout, rank, shape, l1Pages, replica[rank], cpGroups[rank], slabs)
		}()
	}
	wg.Wait()
	for r := range C {
		if errs[r] != nil {
			return nil, stats{}, errs
		}
	}
	for r := range C {
		if fmt.Sprint(results[r]) != fmt.Sprint(results[0]) {
			t.Fatalf("CP rank %d's outputs differ from rank 0's", r)
		}
	}
	return results[0], st[0], errs
}

// openOracleCache builds one rank's cache over per-layer token-slot L1 buffers of l1Pages
// slots, in L1 mode mode, with cfg's policy, load threshold and L2 layout.
func openOracleCache(ctx context.Context, m *refmodel.Model, cfg oracleConfig, mode hicache.L1Mode, layout *parallel.Layout, rank int,
	shape *kvmem.Shape, l1Pages int, g parallel.Group, slabs *kvtest.MemSlabs) (*kvmem.L1, *hicache.Cache, error) {
	l1, err := kvmem.NewL1(shape, l1Pages, kvmem.AllocTokenSlotBuffers(shape, l1Pages))
	if err != nil {
		return nil, nil, err
	}
	kv := m.Layout()
	cache, err := hicache.New(ctx, hicache.Config{
		Options: hicache.Options{PageSize: pageTokens, L1Pages: l1Pages, Policy: cfg.policy, MinLoadPages: cfg.minLoadPages,
			L1Mode: mode},
		Layout: layout, Rank: rank, Group: g, Slabs: slabs,
		KVLayout: &kv, L1: l1, L2Layout: cfg.l2Layout,
	})
	return l1, cache, err
}

func serveRank(t testing.TB, m *refmodel.Model, seed uint64, cfg oracleConfig, layout *parallel.Layout, rank int,
	shape *kvmem.Shape, l1Pages int, g, cpg parallel.Group, slabs *kvtest.MemSlabs) ([]result, stats, error) {
	ctx := context.Background()
	l1, cache, err := openOracleCache(ctx, m, cfg, hicache.CacheOwned, layout, rank, shape, l1Pages, g, slabs)
	if err != nil {
		return nil, stats{}, err
	}
	defer cache.Close()
	var st stats
	drain := func() error {
		for cache.Pending() > 0 {
			if err := cache.Step(ctx); err != nil {
				return err
			}
		}
		return cache.Step(ctx)
	}
	// makeRoom evicts all it can from L1 (write-back: starting the backups first) and lets the
	// backups finish.
	makeRoom := func() error {
		if _, _, err := cache.EvictL1(l1Pages); err != nil {
			return err
		}
		return drain()
	}
	res, err := conversations(seed, m.Config().Vocab, func(prompt []int32) (result, error) {
		t0 := time.Now()
		defer func() { st.total += time.Since(t0) }()
		mr, err := cache.Match(hicache.Request{Tokens: prompt})
		if err != nil {
			return result{}, err
		}
		loading := false
		if mr.HostPages > 0 {
			lr, err := cache.LoadBack(mr.Last)
			if errors.Is(err, hicache.ErrL1Full) { // write-back: make room as for an insert
				if err := makeRoom(); err != nil {
					return result{}, err
				}
				if mr, err = cache.Match(hicache.Request{Tokens: prompt}); err != nil {
					return result{}, err
				}
				lr, err = cache.LoadBack(mr.Last)
			}
			if err != nil {
				return result{}, err
			}
			if mr, err = cache.Match(hicache.Request{Tokens: prompt}); err != nil {
				return result{}, err
			}
			if lr.Pages > 0 {
				loading = true
				st.loadedPages += lr.Pages
				if cfg.skipWait {
					for i, s := range mr.L1Slots {
						if cache.Owns(i) {
							clearSlot(l1, s)
						}
					}
				} else if err := cache.Step(ctx); err != nil { // starts the loads
					return result{}, err
				}
			}
		}
		if err := cache.Lock(mr.Last); err != nil {
			return result{}, err
		}
		// At least the last prompt token is computed: it gives the first logits.
		usable := min(mr.DevicePages, (len(prompt)-1)/pageTokens)
		st.l1HitPages += usable
		rkv := &refmodel.L1KV{L1: l1, Slots: mr.L1Slots[:usable], Scratch: refmodel.NewMemKV(m)}
		before := beforeLayer(ctx, t, cache, cfg, l1, mr.Last, loading, rkv.Slots)
		tm := time.Now()
		toks, logits, err := m.Generate(ctx, refmodel.Pass{KV: rkv, PageTokens: pageTokens, Group: cpg, BeforeLayer: before}, prompt, usable*pageTokens, genTokens)
		if err != nil {
			return result{}, err
		}
		st.model += time.Since(tm)
		st.computed += len(prompt) - usable*pageTokens + genTokens - 1
		if loading && cfg.skipWait { // the loads start only now; let them land before the insert
			if err := cache.Step(ctx); err != nil {
				return result{}, err
			}
			if err := cache.WaitL1(ctx, mr.Last); err != nil {
				return result{}, err
			}
		}
		// The sequence whose KV exists: the prompt and all but the last generated token.
		seq := append(slices.Clone(prompt), toks[:len(toks)-1]...)
		ins, err := cache.Insert(hicache.Request{Tokens: seq})
		if errors.Is(err, hicache.ErrL1Full) {
			// Write-back: what L1 could evict is still being backed up. Evict (start the
			// backups), let them finish, and try once more, as an engine's scheduler would.
			if err := makeRoom(); err != nil {
				return result{}, err
			}
			ins, err = cache.Insert(hicache.Request{Tokens: seq})
		}
		if err != nil {
			return result{}, err
		}
		for _, f := range ins.Fill {
			if !cache.Owns(f.Index) {
				continue
			}
			if err := rkv.StorePage(f.Slot, f.Index); err != nil {
				return result{}, err
			}
		}
		if err := cache.Unlock(mr.Last); err != nil {
			return result{}, err
		}
		if err := drain(); err != nil { // backups
			return result{}, err
		}
		if cfg.evict {
			if _, _, err := cache.EvictL1(l1Pages); err != nil {
				return result{}, err
			}
			if err := drain(); err != nil {
				return result{}, err
			}
		}
		return result{toks, refmodel.LogitsHash(logits)}, nil
	})
	return res, st, err
}

// clearSlot zeroes every chunk of an L1 slot.
func clearSlot(l1 *kvmem.L1, slot int32) {
	for layer := range l1.Shape().Layers() {
		for part := range l1.Shape().Parts() {
			b, _ := l1.HostChunk(slot, layer, part)
			clear(b)
		}
	}
}

// differing counts the requests whose outputs differ.
func differing(a, b []result) int {
	n := 0
	for i := range a {
		if i >= len(b) || !slices.Equal(a[i].tokens, b[i].tokens) || a[i].hash != b[i].hash {
			n++
		}
	}
	return n + max(0, len(b)-len(a))
}

// CP 1, 2 and 4, GQA, MLA and side-buffer models, L1 hits and L2 hits (every page evicted from
// L1 after each request, so hits load back from L2 layer by layer), both L2 layouts: 0 outputs
// differ from the cache-off run.
func TestOracleCacheOnEqualsCacheOff(t *testing.T) {
	const seed = 5
	for _, v := range []refmodel.Variant{refmodel.GQA, refmodel.MLA, refmodel.Side} {
		m, err := refmodel.New(refmodel.DefaultConfig(v))
		if err != nil {
			t.Fatal(err)
		}
		ref, err := cacheOff(m, seed)
		if err != nil {
			t.Fatal(err)
		}
		for _, cp := range []int{1, 2, 4} {
			for _, evict := range []bool{false, true} {
				for _, l2 := range []kvmem.L2Layout{kvmem.PageFirst, kvmem.LayerFirst} {
					if !evict && l2 == kvmem.LayerFirst {
						continue // L1 hits never read L2
					}
					name := fmt.Sprintf("%s/cp%d/evict=%v/%s", v, cp, evict, l2)
					t.Run(name, func(t *testing.T) {
						got, st := cacheOn(t, m, seed, oracleConfig{variant: v, cp: cp, evict: evict, l2Layout: l2})
						if d := differing(ref, got); d != 0 {
							t.Errorf("outputs checked %d, differing %d", len(ref), d)
						}
						if evict && st.loadedPages == 0 {
							t.Errorf("no page came back from L2 (%+v)", st)
						}
						if st.l1HitPages == 0 {
							t.Errorf("no prefix page was served from L1 (%+v)", st)
						}
					})
				}
			}
		}
	}
}

// A small L1 (16 page slots per rank, less than the workload's pages) at CP 4 under every
// write policy: the cache evicts on its own to make room (write-back: backing up what it
// evicts), later turns load their prefix back from L2, and 0 outputs differ.
func TestOracleSmallL1(t *testing.T) {
	const seed = 9
	for _, c := range []struct {
		v      refmodel.Variant
		policy hicache.Policy
	}{
		{refmodel.GQA, hicache.WriteThrough}, {refmodel.MLA, hicache.WriteThrough}, {refmodel.Side, hicache.WriteThrough},
		{refmodel.GQA, hicache.WriteThroughSelective}, {refmodel.Side, hicache.WriteBack}, {refmodel.MLA, hicache.WriteBack},
	} {
		v := c.v
		t.Run(fmt.Sprintf("%s/%s", v, c.policy), func(t *testing.T) {
			m, err := refmodel.New(refmodel.DefaultConfig(v))
			if err != nil {
				t.Fatal(err)
			}
			ref, err := cacheOff(m, seed)
			if err != nil {
				t.Fatal(err)
			}
			got, st := cacheOn(t, m, seed, oracleConfig{variant: v, cp: 4, l2Layout: kvmem.LayerFirst, l1Pages: 4, policy: c.policy})
			if d := differing(ref, got); d != 0 {
				t.Errorf("outputs checked %d, differing %d", len(ref), d)
			}
			if st.loadedPages == 0 {
				t.Errorf("no page came back from L2 (%+v)", st)
			}
			t.Logf("outputs checked %d, differing 0; %+v", len(ref), st)
		})
	}
}
