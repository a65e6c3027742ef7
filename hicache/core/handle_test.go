package core

import (
	"errors"
	"testing"
)

// Handles are checked at every call: 0, a handle of an evicted node, one from before a reset
// and one of another generation are *StaleHandleErrors (ErrStaleHandle, ErrBadArgument);
// the root's handle stays the empty prefix across a reset; generations start above
// Options.Generation.
func TestHandlesAreChecked(t *testing.T) {
	c := newTestCore(t, Options{PageSize: 1, L1Pages: 8, Generation: 7, Policy: WriteThroughSelective, WriteThreshold: 100})
	if c.Generation() != 8 {
		t.Fatalf("generation %d, want Options.Generation+1 = 8", c.Generation())
	}
	res, err := c.Insert(Request{Tokens: []int32{1, 2}})
	if err != nil {
		t.Fatal(err)
	}
	if uint64(res.Last)>>HandleIDBits != 8 {
		t.Fatalf("handle %#x, want generation 8", uint64(res.Last))
	}
	info, err := c.Node(res.Last)
	if err != nil || info.Handle != res.Last || info.Pages() != 2 || info.State != StateL1 || len(info.L1) != 2 {
		t.Fatalf("node %+v, %v", info, err)
	}
	info.L1[0] = -1 // a copy: the tree keeps its slots
	if again, _ := c.Node(res.Last); again.L1[0] == -1 {
		t.Fatal("NodeInfo shares the tree's slots")
	}
	root := c.Match(Request{}).Last
	stale := func(what string, h Handle) {
		t.Helper()
		var se *StaleHandleError
		if err := c.Lock(h); !errors.As(err, &se) || !errors.Is(err, ErrStaleHandle) || !errors.Is(err, ErrBadArgument) || se.Handle != h {
			t.Fatalf("%s: Lock(%#x) = %v, want a *StaleHandleError", what, uint64(h), err)
		}
		if _, err := c.Node(h); !errors.Is(err, ErrStaleHandle) {
			t.Fatalf("%s: Node(%#x) = %v, want ErrStaleHandle", what, uint64(h), err)
		}
	}
	stale("handle 0", 0)
	stale("another generation", Handle(9<<HandleIDBits)|res.Last&(1<<HandleIDBits-1))
	stale("an older cache's root", Handle(7<<HandleIDBits))
	if freed, _ := c.EvictL1(2); freed != 2 {
		t.Fatalf("freed %d, want 2", freed)
	}
	stale("evicted", res.Last)
	if err := c.Lock(root); err != nil {
		t.Fatal(err)
	}
	if err := c.Reset(); err != nil {
		t.Fatal(err)
	}
	if c.Generation() != 9 {
		t.Fatalf("generation %d after a reset, want 9", c.Generation())
	}
	res2, err := c.Insert(Request{Tokens: []int32{1, 2}})
	if err != nil {
		t.Fatal(err)
	}
	if res2.Last&(1<<HandleIDBits-1) != res.Last&(1<<HandleIDBits-1) || res2.Last == res.Last {
		t.Fatalf("handles %#x and %#x: want the same id in another generation", uint64(res.Last), uint64(res2.Last))
	}
	stale("before a reset", res.Last)
	if err := c.Unlock(root); err != nil { // the empty prefix's lock outlives the reset
		t.Fatal(err)
	}
}
