package core

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func newTestCore(t *testing.T, opts Options) *Core {
	t.Helper()
	c, err := New(Config{Options: opts, Slabs: 2, PagesPerSlab: 16, CPRank: 0})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestTreeInsertSplitMatch(t *testing.T) {
	c := newTestCore(t, Options{PageSize: 2, L1Pages: 32, Policy: WriteBack})
	a := []int32{1, 2, 3, 4, 5, 6, 7} // 3 whole pages + 1 token
	b := []int32{1, 2, 3, 4, 9, 9}    // shares 2 pages, then diverges
	ra, err := c.Insert(Request{Tokens: a})
	if err != nil {
		t.Fatal(err)
	}
	if ra.Pages != 3 || len(ra.Fill) != 3 || c.Nodes() != 1 {
		t.Fatalf("insert a: %+v, nodes %d", ra, c.Nodes())
	}
	for i, f := range ra.Fill {
		// page i takes the next slot of its owner's pool (pool i mod 2): slots 0, 0, 1
		if f.Slot != int32(i/2) || f.Index != i || f.Owner != i%2 || f.Hash != PrefixHashes(a, 2)[i] {
			t.Fatalf("fill %d: %+v", i, f)
		}
	}
	rb, err := c.Insert(Request{Tokens: b})
	if err != nil {
		t.Fatal(err)
	}
	// a's node is split after 2 pages; b adds one page under the head (page 2: slot 2 of
	// pool 0, whose slots 0 and 1 hold a's pages 0 and 2).
	if rb.Pages != 3 || len(rb.Fill) != 1 || c.Nodes() != 3 || rb.Fill[0].Index != 2 || rb.Fill[0].Slot != 2 {
		t.Fatalf("insert b: %+v, nodes %d", rb, c.Nodes())
	}
	na, nb := c.at(ra.Last), c.at(rb.Last)
	head := nb.parent
	if len(head.hashes) != 2 || head.depth != 0 || na.parent != head || na.depth != 2 || nb.depth != 2 {
		t.Fatalf("split: head %d pages at %d; a's tail at %d under %d; b at %d", len(head.hashes), head.depth, na.depth, na.parent.id, nb.depth)
	}
	if !slices.Equal(head.hashes, PrefixHashes(a, 2)[:2]) || !slices.Equal(na.hashes, PrefixHashes(a, 2)[2:]) {
		t.Fatal("page hashes do not chain over the prefix")
	}
	for _, tc := range []struct {
		tokens []int32
		pages  int
		last   Handle
	}{
		{a, 3, ra.Last},
		{b, 3, rb.Last},
		{[]int32{1, 2, 3}, 1, head.handle()}, // partial match inside the head
		{[]int32{1, 2, 3, 4, 5, 6, 0, 0}, 3, ra.Last},
		{[]int32{2, 2}, 0, c.root.handle()},
		{[]int32{1}, 0, c.root.handle()}, // less than a page
	} {
		m := c.Match(Request{Tokens: tc.tokens})
		if m.DevicePages != tc.pages || m.HostPages != 0 || m.Last != tc.last || m.DeviceTokens != 2*tc.pages || len(m.L1Slots) != tc.pages {
			t.Fatalf("match %v: %+v, want %d pages at node %#x", tc.tokens, m, tc.pages, uint64(tc.last))
		}
	}
	if err := c.CheckInvariants(); err != nil {
		t.Fatal(err)
	}
	// Re-inserting a cached sequence allocates nothing.
	if r, err := c.Insert(Request{Tokens: a}); err != nil || len(r.Fill) != 0 || r.Pages != 3 {
		t.Fatalf("re-insert: %+v %v", r, err)
	}
}

func TestLRUEvictsLeavesFirstAndSkipsLocked(t *testing.T) {
	c := newTestCore(t, Options{PageSize: 1, L1Pages: 8, Policy: WriteThroughSelective, WriteThreshold: 100})
	x, _ := c.Insert(Request{Tokens: []int32{1, 2}})    // node X: pages 1,2
	y, _ := c.Insert(Request{Tokens: []int32{1, 2, 3}}) // node Y under X
	z, _ := c.Insert(Request{Tokens: []int32{5}})       // node Z
	c.Match(Request{Tokens: []int32{1, 2, 3}})          // Y, X recently used; Z least
	if err := c.Lock(z.Last); err != nil {
		t.Fatal(err)
	}
	// Z is locked; Y (a leaf) goes before X.
	if freed, _ := c.EvictL1(1); freed != 1 || !c.gone(y.Last) || c.gone(x.Last) {
		t.Fatalf("first eviction: freed %d, Y removed %t, X removed %t", freed, c.gone(y.Last), c.gone(x.Last))
	}
	if freed, _ := c.EvictL1(10); freed != 2 || !c.gone(x.Last) || c.gone(z.Last) {
		t.Fatalf("second eviction: freed %d, X removed %t, Z removed %t", freed, c.gone(x.Last), c.gone(z.Last))
	}
	if err := c.Unlock(z.Last); err != nil {
		t.Fatal(err)
	}
	if err := c.Unlock(z.Last); err == nil {
		t.Fatal("unlock without lock accepted")
	}
	// Freed slots are reused lowest first, in each owner's pool: Z holds slot 2 of pool 0
	// (X took slot 0 of pools 0 and 1, Y slot 1 of pool 0), so pages 0 and 1 get slot 0 of
	// pools 0 and 1.
	r, _ := c.Insert(Request{Tokens: []int32{7, 7}})
	if r.Fill[0].Slot != 0 || r.Fill[1].Slot != 0 || r.Fill[0].Owner != 0 || r.Fill[1].Owner != 1 {
		t.Fatalf("slots after eviction: %+v", r.Fill)
	}
	if err := c.CheckInvariants(); err != nil {
		t.Fatal(err)
	}
}

func TestConfigErrorsNameTheValue(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{Options: Options{L1Pages: 0}, Slabs: 1, PagesPerSlab: 1}, "L1 pages 0"},
		{Config{Options: Options{L1Pages: 4, PageSize: -1}, Slabs: 1, PagesPerSlab: 1}, "page size -1"},
		{Config{Options: Options{L1Pages: 4}, Slabs: 2, PagesPerSlab: 1, CPRank: 2}, "CP rank 2"},
		{Config{Options: Options{L1Pages: 4, Policy: 7}, Slabs: 1, PagesPerSlab: 1}, "write policy 7"},
		{Config{Options: Options{L1Pages: 4}, Slabs: 1, PagesPerSlab: 1 << 31}, "2147483648"},
		{Config{Options: Options{L1Pages: 4}, Slabs: 1, PagesPerSlab: 1, L3: true, L3Config: L3Config{MinPrefetchPages: -1}}, "min prefetch pages -1"},
	} {
		_, err := New(tc.cfg)
		if err == nil || !containsAll(err.Error(), tc.want, "core:") || !errors.Is(err, ErrBadConfig) {
			t.Fatalf("New(%+v): %v, want an ErrBadConfig naming %q", tc.cfg, err, tc.want)
		}
	}
	if _, err := ParsePolicy("write_around"); err == nil || !containsAll(err.Error(), "write_around") {
		t.Fatalf("ParsePolicy: %v", err)
	}
	for _, p := range []Policy{WriteThrough, WriteThroughSelective, WriteBack} {
		if q, err := ParsePolicy(p.String()); err != nil || q != p {
			t.Fatalf("ParsePolicy(%q) = %v, %v", p, q, err)
		}
	}
}

func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

// TestMatchCountsPromptAndMissedTokens: every Match adds its tokens to PromptTokens and
// those found in no memory tier (a partial page never is) to MissedTokens; in quarantine
// every token is missed.
func TestMatchCountsPromptAndMissedTokens(t *testing.T) {
	c := newTestCore(t, Options{PageSize: 2, L1Pages: 32, Policy: WriteBack})
	if _, err := c.Insert(Request{Tokens: []int32{1, 2, 3, 4}}); err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		tokens         []int32
		prompt, missed int64
	}{
		{[]int32{1, 2, 3, 4, 5}, 5, 1},     // two pages in L1, one token of a partial page
		{[]int32{1, 2, 9, 9, 9, 9}, 11, 5}, // one page in L1, two pages not cached
		{[]int32{7}, 12, 6},                // nothing
	}
	for i, s := range steps {
		c.Match(Request{Tokens: s.tokens})
		if st := c.Stats(); st.PromptTokens != s.prompt || st.MissedTokens != s.missed {
			t.Fatalf("after match %d: prompt %d missed %d, want %d and %d", i, st.PromptTokens, st.MissedTokens, s.prompt, s.missed)
		}
	}
	c.quarantined = true
	c.Match(Request{Tokens: []int32{1, 2, 3, 4}})
	if st := c.Stats(); st.PromptTokens != 16 || st.MissedTokens != 10 {
		t.Fatalf("in quarantine: prompt %d missed %d, want 16 and 10", st.PromptTokens, st.MissedTokens)
	}
}
