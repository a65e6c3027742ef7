package refmodel_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/cpcache/cpcache/hicache"
	"github.com/cpcache/cpcache/hicache/kvmem"
	"github.com/cpcache/cpcache/hicache/kvtest"
	"github.com/cpcache/cpcache/parallel"
	"github.com/cpcache/cpcache/sim/refmodel"
)

// The oracle in hicache's EngineOwned L1 mode: each rank's slot allocator (slotAllocator)
// picks every L1 slot. Per request, identically on every rank:
//   - Match the prompt and Lock its Last; make room: every rank's allocator must have a slot
//     for each page from the L1 prefix on that it owns (load-backs and new pages), decided
//     from the replicated L1UsedBy of every rank, evicting (EvictL1Slots) until it does.
//   - If it has host pages: LoadBackPlan, a slot from the allocator for each, LoadBackSlots
//     (the slots it did not use come back in Freed), Match again (the loaded pages must be in
//     the slots the engine passed), Step (the loads start); the prefill waits layer by layer.
//   - Take a slot for each new page this rank owns; the forward pass writes their KV there
//     (L1KV.Slots); InsertSlots with them (and Match's slots for the cached pages).
//   - Every slot the cache lets go goes back to the allocator: InsertResult.Freed,
//     LoadResult.Freed, EvictL1Slots' slots, and FreedL1 after every Step.
//
// Between requests the slots the allocator has lent to the cache are as many as the cache
// counts (L1Used) and none is left with the engine; at the end a Flush gives back the rest
// and every slot is free.
func serveRankEngineOwned(t testing.TB, m *refmodel.Model, seed uint64, cfg oracleConfig, layout *parallel.Layout, rank int,
	shape *kvmem.Shape, l1Pages int, g, cpg parallel.Group, slabs *kvtest.MemSlabs) ([]result, stats, error) {
	ctx := context.Background()
	l1, cache, err := openOracleCache(ctx, m, cfg, hicache.EngineOwned, layout, rank, shape, l1Pages, g, slabs)
	if err != nil {
		return nil, stats{}, err
	}
	defer cache.Close()
	C := cfg.cp
	alloc := newSlotAllocator(l1Pages)
	// owned counts the pages in [lo, hi) CP rank r owns (page i is rank i mod C's).
	owned := func(r, lo, hi int) int {
		n := 0
		for i := lo; i < hi; i++ {
			if i%C == r {
				n++
			}
		}
		return n
	}
	step := func() error {
		if err := cache.Step(ctx); err != nil {
			return err
		}
		return alloc.giveBack("FreedL1", cache.FreedL1())
	}
	drain := func() error {
		for cache.Pending() > 0 {
			if err := step(); err != nil {
				return err
			}
		}
		return step()
	}
	// atRest checks the allocator agrees with the cache while the engine holds no slot.
	atRest := func(when string) error {
		used := cache.Stats().L1Used
		if alloc.in(slotCache) != used || alloc.in(slotEngine) != 0 {
			return fmt.Errorf("%s: the allocator has %d slots lent to the cache and %d with the engine; the cache counts %d", when, alloc.in(slotCache), alloc.in(slotEngine), used)
		}
		return nil
	}
	// makeRoom evicts until every rank r has need(r) free slots. The decision is the same on
	// every rank: it reads the replicated per-rank counts.
	makeRoom := func(need func(r int) int) error {
		for {
			if err := atRest("making room"); err != nil {
				return err
			}
			short := 0
			for r := range C {
				used, err := cache.L1UsedBy(r)
				if err != nil {
					return err
				}
				short = max(short, need(r)-(l1Pages-used))
			}
			if short <= 0 {
				return nil
			}
			freed, pending, slots, err := cache.EvictL1Slots(short * C)
			if err != nil {
				return err
			}
			if err := alloc.giveBack("EvictL1Slots", slots); err != nil {
				return err
			}
			if freed == 0 && pending == 0 {
				return fmt.Errorf("a rank is %d L1 slots short and nothing is left to evict (%d slots per rank)", short, l1Pages)
			}
			if err := drain(); err != nil { // write-back: the evicted pages' backups
				return err
			}
		}
	}
	var st stats
	faulted := false
	req := 0
	res, err := conversations(seed, m.Config().Vocab, func(prompt []int32) (result, error) {
		req++
		if err := atRest(fmt.Sprintf("before request %d", req)); err != nil {
			return result{}, err
		}
		mr, err := cache.Match(hicache.Request{Tokens: prompt})
		if err != nil {
			return result{}, err
		}
		if err := cache.Lock(mr.Last); err != nil { // the prefix stays while room is made
			return result{}, err
		}
		seqLen := len(prompt) + genTokens - 1 // the sequence whose KV will exist
		np := seqLen / pageTokens
		dev := mr.DevicePages
		copies := 1
		if cfg.reinsert {
			copies = 2
		}
		if err := makeRoom(func(r int) int { return copies * owned(r, dev, np) }); err != nil {
			return result{}, err
		}
		loading := false
		loadedAt := map[int]int32{} // sequence page -> the slot this engine told the load to use
		if mr.HostPages > 0 {
			plan, err := cache.LoadBackPlan(mr.Last)
			if err != nil {
				return result{}, err
			}
			own, err := alloc.take(len(plan))
			if err != nil {
				return result{}, err
			}
			if err := alloc.lend("LoadBackSlots", own); err != nil {
				return result{}, err
			}
			lr, err := cache.LoadBackSlots(mr.Last, own)
			if err != nil {
				return result{}, err
			}
			if err := alloc.giveBack("LoadBackSlots", lr.Freed); err != nil {
				return result{}, err
			}
			for k, i := range plan {
				if slices.Contains(lr.Freed, own[k]) {
					st.loadSlotsBack++
				} else {
					loadedAt[i] = own[k]
				}
			}
			mr2, err := cache.Match(hicache.Request{Tokens: prompt})
			if err != nil {
				return result{}, err
			}
			if err := cache.Lock(mr2.Last); err != nil {
				return result{}, err
			}
			if err := cache.Unlock(mr.Last); err != nil {
				return result{}, err
			}
			mr = mr2
			for i, s := range loadedAt {
				if i >= mr.DevicePages || mr.L1Slots[i] != s {
					return result{}, fmt.Errorf("load-back of page %d into slot %d: Match says %d device pages, slots %v", i, s, mr.DevicePages, mr.L1Slots)
				}
			}
			if lr.Pages > 0 {
				loading = true
				st.loadedPages += lr.Pages
				if cfg.skipWait {
					for _, s := range loadedAt {
						clearSlot(l1, s)
					}
				} else if err := step(); err != nil { // starts the loads
					return result{}, err
				}
			}
		}
		if cfg.slotFault == loadsSwapped && len(loadedAt) >= 2 {
			var pages []int
			for i := range loadedAt {
				pages = append(pages, i)
			}
			slices.Sort(pages)
			a, b := pages[0], pages[1]
			loadedAt[a], loadedAt[b] = loadedAt[b], loadedAt[a]
		}
		// At least the last prompt token is computed: it gives the first logits. A cached page
		// the prefill recomputes (a whole-page prompt fully cached) keeps its L1 slot; its
		// recomputed KV goes to Scratch.
		usable := min(mr.DevicePages, (len(prompt)-1)/pageTokens)
		st.l1HitPages += usable
		slots := make([]int32, np)
		freshFrom := mr.DevicePages                          // the new pages: from the end of the L1 prefix on
		fresh, err := alloc.take(owned(rank, freshFrom, np)) // this rank's, in page order
		if err != nil {
			return result{}, err
		}
		// heldSlotHandedOut: on the first request where every rank has a new page and the
		// cache holds a slot outside the request's prefix on every rank, the allocator hands
		// out that slot for the last new page.
		fault := int32(-1)
		if cfg.slotFault == heldSlotHandedOut && !faulted {
			every := true
			for r := range C {
				used, err := cache.L1UsedBy(r)
				if err != nil {
					return result{}, err
				}
				every = every && owned(r, freshFrom, np) > 0 && used > owned(r, 0, mr.DevicePages)
			}
			if every {
				faulted = true
				fault = alloc.anyHeldBut(mr.L1Slots)
				if err := alloc.putBack("the faulty allocator", fresh[len(fresh)-1:]); err != nil {
					return result{}, err
				}
				fresh[len(fresh)-1] = fault
			}
		}
		var own []int32 // InsertSlots' list: a slot for every page of seq this rank owns
		k := 0
		for i := range np {
			slots[i] = -1
			if !cache.Owns(i) {
				continue
			}
			switch {
			case i < usable:
				slots[i] = mr.L1Slots[i]
				if s, ok := loadedAt[i]; ok {
					slots[i] = s // the engine reads a loaded page where it told the load to go
				}
			case i >= freshFrom:
				if k == len(fresh) {
					return result{}, fmt.Errorf("request %d: the cache says CP rank %d owns page %d; page i mod %d says it owns %d new pages", req, rank, i, C, len(fresh))
				}
				slots[i] = fresh[k]
				k++
			}
			if i < freshFrom {
				own = append(own, mr.L1Slots[i])
				if !alloc.holds(mr.L1Slots[i]) {
					return result{}, fmt.Errorf("request %d: Match serves page %d from slot %d, which the allocator did not lend to the cache", req, i, mr.L1Slots[i])
				}
			} else {
				own = append(own, slots[i])
			}
		}
		rkv := &refmodel.L1KV{L1: l1, Slots: slots, Scratch: refmodel.NewMemKV(m)}
		before := beforeLayer(ctx, t, cache, cfg, l1, mr.Last, loading, slots[:usable])
		toks, logits, err := m.Generate(ctx, refmodel.Pass{KV: rkv, PageTokens: pageTokens, Group: cpg, BeforeLayer: before}, prompt, usable*pageTokens, genTokens)
		if err != nil {
			return result{}, err
		}
		st.computed += len(prompt) - usable*pageTokens + genTokens - 1
		if loading && cfg.skipWait { // the loads start only now; let them land before the insert
			if err := step(); err != nil {
				return result{}, err
			}
			if err := cache.WaitL1(ctx, mr.Last); err != nil {
				return result{}, err
			}
		}
		seq := append(slices.Clone(prompt), toks[:len(toks)-1]...)
		lent := fresh
		if fault >= 0 {
			lent = fresh[:len(fresh)-1] // the faulty slot is lent already
		}
		if err := alloc.lend("InsertSlots", lent); err != nil {
			return result{}, err
		}
		ins, err := cache.InsertSlots(hicache.Request{Tokens: seq}, own)
		if err != nil {
			return result{}, fmt.Errorf("request %d: InsertSlots with slots %v: %w", req, own, err)
		}
		if err := alloc.giveBack("InsertSlots", ins.Freed); err != nil {
			return result{}, err
		}
		if cfg.reinsert {
			if err := insertCopy(cache, l1, alloc, seq, own, fresh, &st); err != nil {
				return result{}, fmt.Errorf("request %d: %w", req, err)
			}
		}
		if err := cache.Unlock(mr.Last); err != nil {
			return result{}, err
		}
		if err := drain(); err != nil { // backups
			return result{}, err
		}
		if cfg.evict {
			_, _, slots, err := cache.EvictL1Slots(l1Pages * C)
			if err != nil {
				return result{}, err
			}
			if err := alloc.giveBack("EvictL1Slots", slots); err != nil {
				return result{}, err
			}
			if err := drain(); err != nil {
				return result{}, err
			}
		}
		return result{toks, refmodel.LogitsHash(logits)}, nil
	})
	if err != nil {
		return nil, st, err
	}
	if err := atRest("after the workload"); err != nil {
		return nil, st, err
	}
	if err := cache.Flush(ctx); err != nil {
		return nil, st, err
	}
	if err := alloc.giveBack("FreedL1 after Flush", cache.FreedL1()); err != nil {
		return nil, st, err
	}
	if alloc.in(slotFree) != l1Pages {
		return nil, st, fmt.Errorf("after Flush %d of %d slots came back", alloc.in(slotFree), l1Pages)
	}
	return res, st, nil
}

// insertCopy inserts seq again with copies of the pages in slots fresh (this rank's new
// pages, in order in own) in other slots: the pages are in L1 already, so the cache must give
// every copy's slot back in InsertResult.Freed and adopt none.
func insertCopy(cache *hicache.Cache, l1 *kvmem.L1, alloc *slotAllocator, seq, own, fresh []int32, st *stats) error {
	copies, err := alloc.take(len(fresh))
	if err != nil {
		return err
	}
	own2 := slices.Clone(own)
	page := make([]byte, l1.Shape().PageBytes())
	for k, s := range fresh {
		if err := l1.Gather(s, kvmem.PageFirst, page, 1, 0); err != nil {
			return err
		}
		if err := l1.Scatter(copies[k], kvmem.PageFirst, page, 1, 0); err != nil {
			return err
		}
		own2[slices.Index(own2, s)] = copies[k]
	}
	if err := alloc.lend("InsertSlots of a second copy", copies); err != nil {
		return err
	}
	ins, err := cache.InsertSlots(hicache.Request{Tokens: seq}, own2)
	if err != nil {
		return fmt.Errorf("InsertSlots of a second copy with slots %v: %w", own2, err)
	}
	for _, s := range copies {
		if !slices.Contains(ins.Freed, s) {
			return fmt.Errorf("InsertSlots of a second copy kept slot %d (freed %v): the page is in L1 already", s, ins.Freed)
		}
	}
	st.insertSlotsBack += len(copies)
	return alloc.giveBack("InsertSlots of a second copy", ins.Freed)
}

// CP 1, 2 and 4, every variant, write-through and write-back, in EngineOwned mode over an
// L1 smaller than the workload (the cache evicts to make room, later turns load their
// prefix back from L2 into slots the allocator gives), and with every page evicted after
// each request under write-back (each hit loaded back, page-first L2) with every sequence
// inserted twice and host hits under 3 pages not loaded (both give slots straight back in
// Freed): 0 outputs differ from the cache-off run, pages were loaded back, and every slot
// came back to its allocator exactly once.
func TestOracleEngineOwnedSlots(t *testing.T) {
	const seed = 9
	// Per CP size, an L1 that holds a request's longest sequence (11 pages) spread over the
	// ranks but not the whole workload.
	small := map[int]int{1: 12, 2: 7, 4: 4}
	models := map[refmodel.Variant]*refmodel.Model{}
	refs := map[refmodel.Variant][]result{}
	for _, v := range []refmodel.Variant{refmodel.GQA, refmodel.MLA, refmodel.Side} {
		m, err := refmodel.New(refmodel.DefaultConfig(v))
		if err != nil {
			t.Fatal(err)
		}
		if refs[v], err = cacheOff(m, seed); err != nil {
			t.Fatal(err)
		}
		models[v] = m
	}
	for _, cp := range []int{1, 2, 4} {
		for _, v := range []refmodel.Variant{refmodel.GQA, refmodel.MLA, refmodel.Side} {
			for _, c := range []struct {
				name             string
				policy           hicache.Policy
				evict, slotsBack bool
			}{
				{"small-L1/" + hicache.WriteThrough.String(), hicache.WriteThrough, false, false},
				{"small-L1/" + hicache.WriteBack.String(), hicache.WriteBack, false, false},
				{"evict-all/slots-back/" + hicache.WriteBack.String(), hicache.WriteBack, true, true},
			} {
				t.Run(fmt.Sprintf("cp%d/%s/%s", cp, v, c.name), func(t *testing.T) {
					cfg := oracleConfig{variant: v, cp: cp, l2Layout: kvmem.LayerFirst, l1Pages: small[cp], policy: c.policy, l1Mode: hicache.EngineOwned}
					if c.evict {
						cfg.l2Layout, cfg.l1Pages, cfg.evict = kvmem.PageFirst, 0, true
					}
					if c.slotsBack {
						cfg.reinsert, cfg.minLoadPages = true, 3
					}
					got, st := cacheOn(t, models[v], seed, cfg)
					if d := differing(refs[v], got); d != 0 {
						t.Errorf("outputs checked %d, differing %d", len(refs[v]), d)
					}
					if st.loadedPages == 0 {
						t.Errorf("no page came back from L2 (%+v)", st)
					}
					if c.slotsBack && (st.loadSlotsBack == 0 || st.insertSlotsBack == 0) {
						t.Errorf("slots given back unused: %d by LoadBackSlots, %d by InsertSlots; want some of each (%+v)", st.loadSlotsBack, st.insertSlotsBack, st)
					}
					t.Logf("outputs checked %d, differing %d; %+v", len(refs[v]), differing(refs[v], got), st)
				})
			}
		}
	}
}

// Engine-owned slot bookkeeping bugs, at CP 2: an allocator that hands out a slot the cache
// holds is refused by InsertSlots on every rank (ErrBadArgument naming the slot), and an
// engine that reads loaded pages from each other's destination slots, or whose loads are
// damaged after landing, gets differing outputs.
func TestOracleEngineOwnedCatchesBrokenSlots(t *testing.T) {
	const seed = 5
	m, err := refmodel.New(refmodel.DefaultConfig(refmodel.GQA))
	if err != nil {
		t.Fatal(err)
	}
	ref, err := cacheOff(m, seed)
	if err != nil {
		t.Fatal(err)
	}
	t.Run("allocator hands out a held slot", func(t *testing.T) {
		_, _, errs := cacheOnErrs(t, m, seed, oracleConfig{variant: refmodel.GQA, cp: 2, l2Layout: kvmem.PageFirst,
			l1Mode: hicache.EngineOwned, slotFault: heldSlotHandedOut})
		for r, err := range errs {
			if !errors.Is(err, hicache.ErrBadArgument) || !strings.Contains(fmt.Sprint(err), "is held by the cache for another page") {
				t.Errorf("CP rank %d: %v; want an error wrapping ErrBadArgument: a slot held by the cache for another page", r, err)
			}
			t.Logf("CP rank %d: %v", r, err)
		}
	})
	for _, b := range []struct {
		name     string
		fault    slotFault
		damage   breakage
		skipWait bool
	}{
		{name: "loads read from each other's slots", fault: loadsSwapped},
		{name: "page in the neighbour's slot", damage: breakageNamed(t, "page in the neighbour's slot")},
		{name: "layer wait skipped", skipWait: true},
	} {
		t.Run(b.name, func(t *testing.T) {
			got, st := cacheOn(t, m, seed, oracleConfig{variant: refmodel.GQA, cp: 2, evict: true, l2Layout: kvmem.PageFirst,
				l1Mode: hicache.EngineOwned, slotFault: b.fault, damage: b.damage, skipWait: b.skipWait})
			d := differing(ref, got)
			if d == 0 {
				t.Errorf("outputs checked %d, differing 0 with %q (%+v): the oracle missed it", len(ref), b.name, st)
			}
			t.Logf("outputs checked %d, differing %d", len(ref), d)
		})
	}
	t.Run("unbroken", func(t *testing.T) { // the same run without a fault: 0 differ
		got, st := cacheOn(t, m, seed, oracleConfig{variant: refmodel.GQA, cp: 2, evict: true, l2Layout: kvmem.PageFirst, l1Mode: hicache.EngineOwned})
		if d := differing(ref, got); d != 0 || st.loadedPages == 0 {
			t.Errorf("outputs checked %d, differing %d, loaded pages %d; want 0 differing and loads", len(ref), d, st.loadedPages)
		}
	})
}
