package core

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// slotAlloc is a model of one rank's engine allocator: slots out (given to the cache or to a
// call in progress) and free. Taking a free slot or giving back a slot that is not out fails
// the test: every slot must come back exactly once.
type slotAlloc struct {
	t    *testing.T
	rank int
	out  map[int32]bool
	free []int32
}

func newSlotAlloc(t *testing.T, rank, size int) *slotAlloc {
	a := &slotAlloc{t: t, rank: rank, out: map[int32]bool{}}
	for s := size - 1; s >= 0; s-- {
		a.free = append(a.free, int32(s))
	}
	return a
}

func (a *slotAlloc) take() int32 {
	s := a.free[len(a.free)-1]
	a.free = a.free[:len(a.free)-1]
	a.out[s] = true
	return s
}

func (a *slotAlloc) giveBack(what string, slots []int32) {
	a.t.Helper()
	for _, s := range slots {
		if !a.out[s] {
			a.t.Fatalf("rank %d: %s hands back slot %d, which the engine does not have out (freed twice, or never given)", a.rank, what, s)
		}
		delete(a.out, s)
		a.free = append(a.free, s)
	}
}

// checkHeld: at rest, the slots out are exactly the ones the cache holds.
func (a *slotAlloc) checkHeld(c *Core) {
	a.t.Helper()
	held := c.l1.engine.held
	if len(held) != len(a.out) || len(held) != c.L1Used() {
		a.t.Fatalf("rank %d: engine has %d slots out, the cache holds %d (L1Used %d)", a.rank, len(a.out), len(held), c.L1Used())
	}
	for s := range a.out {
		if !held[s] {
			a.t.Fatalf("rank %d: slot %d out but not held by the cache", a.rank, s)
		}
	}
}

// TestEngineOwnedSlotsAgainstAModelAllocator: in EngineOwned mode, C replicas driven by
// random inserts (with the slots each rank's allocator gives, and Match's slots for device
// pages), load-backs, evictions and steps with failing transfers: every slot comes back to
// its rank's allocator exactly once, none is held twice, the slots out always equal the
// cache's, and the replicas' digests stay equal (rig.step).
func TestEngineOwnedSlotsAgainstAModelAllocator(t *testing.T) {
	for _, C := range []int{1, 3, 4} {
		for _, policy := range []Policy{WriteThrough, WriteBack} {
			t.Run(fmt.Sprintf("cp%d/%s", C, policy), func(t *testing.T) {
				const l1 = 12
				r := newCoreRig(t, C, Options{PageSize: 2, L1Pages: l1, Policy: policy, L1Mode: EngineOwned, LoadQuotaPages: 6}, 24, uint64(C))
				r.fail = 0.1
				allocs := make([]*slotAlloc, C)
				for i := range allocs {
					allocs[i] = newSlotAlloc(t, i, l1)
				}
				drain := func() {
					for i, c := range r.cores {
						allocs[i].giveBack("TakeFreedL1", c.TakeFreedL1())
					}
				}
				rng := rand.New(rand.NewPCG(7, uint64(C)))
				var seqs [][]int32
				inserted, loaded := 0, 0
				for op := range 400 {
					k := rng.IntN(10)
					switch {
					case k < 5: // insert
						n := 1 + rng.IntN(9)
						toks := make([]int32, 2*n)
						for j := range toks {
							toks[j] = int32(rng.IntN(2)) // small alphabet: shared prefixes
						}
						ms := make([]MatchResult, C)
						own := make([][]int32, C)
						fresh := make([][]int32, C)
						ok := true
						for i, c := range r.cores {
							ms[i] = c.Match(Request{Tokens: toks})
							for p := 0; p < n; p++ {
								if !c.Owns(p) {
									continue
								}
								if p < ms[i].DevicePages {
									own[i] = append(own[i], ms[i].L1Slots[p])
								} else if len(allocs[i].free) == 0 {
									ok = false
								} else {
									s := allocs[i].take()
									own[i] = append(own[i], s)
									fresh[i] = append(fresh[i], s)
								}
							}
						}
						if !ok { // some rank's allocator is empty: evict on every rank, skip
							for i, c := range r.cores {
								allocs[i].giveBack("unused", fresh[i])
								_, _, slots, err := c.EvictL1Slots(4)
								if err != nil {
									t.Fatal(err)
								}
								allocs[i].giveBack("EvictL1Slots", slots)
							}
							continue
						}
						for i, c := range r.cores {
							res, err := c.InsertSlots(Request{Tokens: toks}, own[i])
							switch {
							case errors.Is(err, ErrL1Full):
								allocs[i].giveBack("a failed insert's caller", fresh[i])
							case err != nil:
								t.Fatalf("op %d rank %d: insert: %v", op, i, err)
							default:
								allocs[i].giveBack("InsertSlots", res.Freed)
								inserted++
							}
						}
						seqs = append(seqs, toks)
					case k < 7 && len(seqs) > 0: // load back
						toks := seqs[rng.IntN(len(seqs))]
						last := make([]Handle, C)
						plans := make([][]int, C)
						short := false
						for i, c := range r.cores {
							m := c.Match(Request{Tokens: toks})
							plan, err := c.LoadBackPlan(m.Last)
							if err != nil {
								t.Fatal(err)
							}
							last[i], plans[i] = m.Last, plan
							short = short || len(plan) > len(allocs[i].free)
						}
						if short { // some rank's engine has too few slots: no load (on every rank)
							continue
						}
						for i, c := range r.cores {
							var own []int32
							for range plans[i] {
								own = append(own, allocs[i].take())
							}
							res, err := c.LoadBackSlots(last[i], own)
							switch {
							case errors.Is(err, ErrL1Full):
								allocs[i].giveBack("a failed load's caller", own)
							case err != nil:
								t.Fatal(err)
							default:
								allocs[i].giveBack("LoadBackSlots", res.Freed)
								loaded += res.Pages
							}
						}
					case k < 8:
						want := 1 + rng.IntN(5) // replicated: the same on every rank
						for i, c := range r.cores {
							_, _, slots, err := c.EvictL1Slots(want)
							if err != nil {
								t.Fatal(err)
							}
							allocs[i].giveBack("EvictL1Slots", slots)
						}
					default:
						if err := r.step(); err != nil {
							t.Fatalf("op %d: step: %v", op, err)
						}
					}
					drain()
					if d0 := r.cores[0].StateDigest(); r.cores[C-1].StateDigest() != d0 {
						t.Fatalf("op %d (kind %d): digests differ", op, k)
					}
					for i, c := range r.cores {
						allocs[i].checkHeld(c)
					}
				}
				for range 20 {
					if err := r.step(); err != nil {
						t.Fatal(err)
					}
				}
				for i, c := range r.cores {
					if err := c.Reset(); err != nil {
						t.Fatal(err)
					}
					allocs[i].giveBack("Reset", c.TakeFreedL1())
					if len(allocs[i].out) != 0 {
						t.Fatalf("rank %d: %d slots never came back", i, len(allocs[i].out))
					}
				}
				if inserted == 0 || loaded == 0 {
					t.Fatalf("%d inserts, %d pages loaded: the test exercised nothing", inserted, loaded)
				}
			})
		}
	}
}

// TestEngineOwnedBadSlots: a wrong count, a slot out of range, twice in the list, or held by
// the cache for another page is an ErrBadArgument naming the slot, and changes nothing.
func TestEngineOwnedBadSlots(t *testing.T) {
	c, err := New(Config{Options: Options{PageSize: 2, L1Pages: 8, L1Mode: EngineOwned}, Slabs: 2, PagesPerSlab: 8, CPRank: 1})
	if err != nil {
		t.Fatal(err)
	}
	a := []int32{1, 1, 2, 2, 3, 3, 4, 4} // pages 0..3: rank 1 owns pages 1 and 3
	res, err := c.InsertSlots(Request{Tokens: a}, []int32{5, 6})
	if err != nil || len(res.Freed) != 0 {
		t.Fatalf("insert: %+v, %v", res, err)
	}
	if m := c.Match(Request{Tokens: a}); !slices.Equal(m.L1Slots, []int32{-1, 5, -1, 6}) {
		t.Fatalf("match slots %v, want [-1 5 -1 6]", m.L1Slots)
	}
	d := c.StateDigest()
	b := []int32{1, 1, 2, 2, 9, 9, 9, 9} // shares pages 0, 1
	for _, tc := range []struct {
		own  []int32
		want string
	}{
		{[]int32{5}, "1 slots for the 2 pages"},
		{[]int32{5, 8}, "slot 8 (entry 1 of the list) outside the L1 pool [0, 8)"},
		{[]int32{5, -2}, "slot -2"},
		{[]int32{7, 7}, "slot 7 (entry 1 of the list) also given for entry 0"},
		{[]int32{5, 6}, "slot 6 (entry 1 of the list) is held by the cache for another page"},
		{[]int32{6, 7}, "slot 6 (entry 0 of the list) is held by the cache for another page"},
	} {
		_, err := c.InsertSlots(Request{Tokens: b}, tc.own)
		if !errors.Is(err, ErrBadArgument) || !strings.Contains(err.Error(), tc.want) {
			t.Fatalf("InsertSlots(%v): %v; want ErrBadArgument with %q", tc.own, err, tc.want)
		}
		if c.StateDigest() != d {
			t.Fatalf("InsertSlots(%v) failed but changed the state", tc.own)
		}
	}
	// A duplicate computation of a cached page: the cache keeps its slot, the passed one is freed.
	res, err = c.InsertSlots(Request{Tokens: b}, []int32{7, 0})
	if err != nil || !slices.Equal(res.Freed, []int32{7}) {
		t.Fatalf("insert with a duplicate of page 1: %+v, %v; want slot 7 freed", res, err)
	}
	if m := c.Match(Request{Tokens: b}); !slices.Equal(m.L1Slots, []int32{-1, 5, -1, 0}) {
		t.Fatalf("match slots %v, want [-1 5 -1 0]", m.L1Slots)
	}
	if _, err := c.Insert(Request{Tokens: a}); !errors.Is(err, ErrBadArgument) {
		t.Fatalf("Insert in EngineOwned mode: %v", err)
	}
	if _, _, _, err := newTestCore(t, Options{PageSize: 2, L1Pages: 8}).EvictL1Slots(1); !errors.Is(err, ErrBadArgument) {
		t.Fatalf("EvictL1Slots in CacheOwned mode: %v", err)
	}
	if err := c.CheckInvariants(); err != nil {
		t.Fatal(err)
	}
}
