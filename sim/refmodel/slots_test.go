package refmodel_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// slotPlace is where one L1 slot of an engine-owned rank is.
type slotPlace uint8

const (
	slotFree   slotPlace = iota // in the allocator's free list
	slotEngine                  // taken by the engine: it writes KV there, not yet passed to the cache
	slotCache                   // passed to the cache (InsertSlots, LoadBackSlots), not yet given back
)

func (p slotPlace) String() string {
	return [...]string{"free", "with the engine", "held by the cache"}[p]
}

// slotAllocator is one rank's engine allocator in hicache's EngineOwned mode: a free list
// over the slots of its L1 buffers, and where every slot is. Each move checks the slot is
// where it must come from, so a slot handed out twice, given back twice or given back without
// having been passed to the cache is an error naming the slot: every slot comes back exactly
// once and is never in two places. The oracle's ranks run in goroutines, so it returns
// errors rather than failing the test.
type slotAllocator struct {
	place []slotPlace
	free  []int32 // a stack: the lowest slot on top at the start
}

func newSlotAllocator(slots int) *slotAllocator {
	a := &slotAllocator{place: make([]slotPlace, slots)}
	for s := slots - 1; s >= 0; s-- {
		a.free = append(a.free, int32(s))
	}
	return a
}

// move moves slot s from place from to place to, failing if it is elsewhere; a slot moved
// to slotFree goes on the free list.
func (a *slotAllocator) move(what string, s int32, from, to slotPlace) error {
	if s < 0 || int(s) >= len(a.place) {
		return fmt.Errorf("slot allocator: %s: slot %d outside the pool [0, %d)", what, s, len(a.place))
	}
	if a.place[s] != from {
		return fmt.Errorf("slot allocator: %s: slot %d is %s, not %s", what, s, a.place[s], from)
	}
	a.place[s] = to
	if to == slotFree {
		a.free = append(a.free, s)
	}
	return nil
}

// moveAll moves every slot of slots from place from to place to.
func (a *slotAllocator) moveAll(what string, slots []int32, from, to slotPlace) error {
	for _, s := range slots {
		if err := a.move(what, s, from, to); err != nil {
			return err
		}
	}
	return nil
}

// take hands the engine n free slots.
func (a *slotAllocator) take(n int) ([]int32, error) {
	if n > len(a.free) {
		return nil, fmt.Errorf("slot allocator: %d slots wanted, %d free", n, len(a.free))
	}
	out := make([]int32, n)
	for i := range out {
		out[i] = a.free[len(a.free)-1]
		a.free = a.free[:len(a.free)-1]
		if err := a.move("take", out[i], slotFree, slotEngine); err != nil {
			return nil, err // the free list lists a slot that is not free
		}
	}
	return out, nil
}

// lend records that the engine passed slots to the cache.
func (a *slotAllocator) lend(what string, slots []int32) error {
	return a.moveAll(what, slots, slotEngine, slotCache)
}

// unlend records that a call the slots were passed to failed: the engine keeps them.
func (a *slotAllocator) unlend(what string, slots []int32) error {
	return a.moveAll(what, slots, slotCache, slotEngine)
}

// giveBack takes back slots the cache let go (InsertResult.Freed, LoadResult.Freed,
// EvictL1Slots, FreedL1).
func (a *slotAllocator) giveBack(what string, slots []int32) error {
	return a.moveAll(what+" gives back", slots, slotCache, slotFree)
}

// putBack returns slots the engine took and did not pass to the cache.
func (a *slotAllocator) putBack(what string, slots []int32) error {
	return a.moveAll(what, slots, slotEngine, slotFree)
}

// in counts the slots in place p.
func (a *slotAllocator) in(p slotPlace) int {
	n := 0
	for _, q := range a.place {
		if q == p {
			n++
		}
	}
	return n
}

// holds says whether the cache holds slot s (as far as the engine knows).
func (a *slotAllocator) holds(s int32) bool {
	return s >= 0 && int(s) < len(a.place) && a.place[s] == slotCache
}

// anyHeldBut is the lowest slot the cache holds that is not in but, or -1.
func (a *slotAllocator) anyHeldBut(but []int32) int32 {
	for s, p := range a.place {
		if p == slotCache && !slices.Contains(but, int32(s)) {
			return int32(s)
		}
	}
	return -1
}

// The allocator's checks fail on a slot given back twice, given back while still with the
// engine, lent twice, outside the pool, and on more slots than are free; a full round trip
// leaves every slot free.
func TestSlotAllocatorCatchesMisuse(t *testing.T) {
	a := newSlotAllocator(4)
	got, err := a.take(3)
	if err != nil || fmt.Sprint(got) != "[0 1 2]" {
		t.Fatalf("take(3) = %v, %v; want [0 1 2]", got, err)
	}
	if _, err := a.take(2); err == nil {
		t.Error("take(2) with 1 free: no error")
	}
	if err := a.giveBack("early", got[:1]); err == nil || !strings.Contains(err.Error(), "slot 0 is with the engine") {
		t.Errorf("giving back a slot never lent: %v", err)
	}
	if err := a.lend("insert", got); err != nil {
		t.Fatal(err)
	}
	if err := a.lend("insert again", got[1:2]); err == nil || !strings.Contains(err.Error(), "slot 1 is held by the cache") {
		t.Errorf("lending a slot the cache holds: %v", err)
	}
	if err := a.giveBack("evict", []int32{9}); err == nil || !strings.Contains(err.Error(), "slot 9 outside") {
		t.Errorf("giving back slot 9 of 4: %v", err)
	}
	if err := a.giveBack("evict", got[:1]); err != nil {
		t.Fatal(err)
	}
	if err := a.giveBack("evict twice", got[:1]); err == nil || !strings.Contains(err.Error(), "slot 0 is free") {
		t.Errorf("giving back slot 0 twice: %v", err)
	}
	if !a.holds(1) || a.holds(0) || a.anyHeldBut([]int32{1}) != 2 {
		t.Errorf("holds(1) %v, holds(0) %v, anyHeldBut(1) %d; want true, false, 2", a.holds(1), a.holds(0), a.anyHeldBut([]int32{1}))
	}
	if err := a.unlend("failed insert", got[1:]); err != nil {
		t.Fatal(err)
	}
	if err := a.putBack("unused", got[1:]); err != nil {
		t.Fatal(err)
	}
	if a.in(slotFree) != 4 || a.in(slotEngine) != 0 || a.in(slotCache) != 0 {
		t.Errorf("after the round trip: %d free, %d with the engine, %d with the cache; want 4, 0, 0", a.in(slotFree), a.in(slotEngine), a.in(slotCache))
	}
}
