package core

import (
	"errors"
	"strings"
	"testing"
)

// TestL1HoldsOnlyOwnPages: every CP rank's L1 pool holds only the pages it owns, so at CP8
// an L1 of k slots per rank caches 8k pages of the tree (k at CP1), and a node of n pages
// takes ⌊n/C⌋ or ⌈n/C⌉ slots of each rank's pool. With n a multiple of C every pool fills
// evenly; otherwise the n mod C ranks that own a node's first extra pages fill first (every
// sequence starts at rank 0), and L1 holds k/⌈n/C⌉ nodes: at n = 13, 6.5× CP1's pages.
func TestL1HoldsOnlyOwnPages(t *testing.T) {
	const k = 40
	for _, nodePages := range []int{16, 13} {
		resident := map[int]int{}
		for _, C := range []int{1, 8} {
			c, err := New(Config{Options: Options{PageSize: 4, L1Pages: k, Policy: WriteThroughSelective, WriteThreshold: 1000},
				Slabs: C, PagesPerSlab: 64, CPRank: C - 1})
			if err != nil {
				t.Fatal(err)
			}
			for s := range 3 * C * k / nodePages { // enough to fill every pool and evict
				res, err := c.Insert(Request{Tokens: seqTokens(nodePages, 0, int32(1000*(s+1)))})
				if err != nil {
					t.Fatalf("CP%d insert %d: %v", C, s, err)
				}
				inf, err := c.Node(res.Last)
				if err != nil {
					t.Fatal(err)
				}
				per := make([]int, C)
				for j := range inf.L1 {
					per[(inf.Depth+j)%C]++
				}
				for r, got := range per {
					if got != nodePages/C && got != (nodePages+C-1)/C {
						t.Fatalf("CP%d insert %d: node of %d pages takes %d slots of CP rank %d's pool, want %d or %d", C, s, nodePages, got, r, nodePages/C, (nodePages+C-1)/C)
					}
				}
			}
			fullest := 0
			for r := range C {
				if used := c.L1UsedBy(r); used > k {
					t.Fatalf("CP%d: rank %d uses %d L1 slots of %d", C, r, used, k)
				}
				fullest = max(fullest, c.L1UsedBy(r))
			}
			if fullest != k {
				t.Fatalf("CP%d: fullest pool holds %d of %d slots after filling", C, fullest, k)
			}
			if c.L1Used() != c.L1UsedBy(C-1) {
				t.Fatalf("CP%d: L1Used %d, this rank's pool (CP rank %d) %d", C, c.L1Used(), C-1, c.L1UsedBy(C-1))
			}
			if err := c.CheckInvariants(); err != nil {
				t.Fatal(err)
			}
			resident[C] = c.L1UsedAll()
		}
		want8 := k / ((nodePages + 7) / 8) * nodePages // nodes the fullest pool holds × n
		if nodePages%8 == 0 {
			want8 = 8 * k
		}
		if resident[1] != k || resident[8] < want8 {
			t.Fatalf("%d-page nodes: resident pages at CP8 %d (want >= %d), CP1 %d (want %d)", nodePages, resident[8], want8, resident[1], k)
		}
		t.Logf("%d-page nodes in L1 of %d slots per rank: CP1 %d pages, CP8 %d pages (%.1f×)", nodePages, k, resident[1], resident[8], float64(resident[8])/float64(resident[1]))
	}
}

// TestMatchSlotsAreOwnOnly: a match gives the slots of the pages this rank owns, -1 for the
// others, on every rank the pages' owners' slots as the Insert gave them.
func TestMatchSlotsAreOwnOnly(t *testing.T) {
	const C = 4
	var fill []FillPage
	for r := range C {
		c, err := New(Config{Options: Options{PageSize: 4, L1Pages: 8}, Slabs: C, PagesPerSlab: 16, CPRank: r})
		if err != nil {
			t.Fatal(err)
		}
		toks := seqTokens(10, 0, 0)
		ins, err := c.Insert(Request{Tokens: toks})
		if err != nil {
			t.Fatal(err)
		}
		if r == 0 {
			fill = ins.Fill
		}
		m := c.Match(Request{Tokens: toks})
		if m.DevicePages != 10 || len(m.L1Slots) != 10 {
			t.Fatalf("rank %d: match %+v", r, m)
		}
		for i, s := range m.L1Slots {
			want := int32(-1)
			if i%C == r {
				want = fill[i].Slot
			}
			if s != want || fill[i].Owner != i%C || ins.Fill[i] != fill[i] {
				t.Fatalf("rank %d page %d: slot %d, want %d (fill %+v)", r, i, s, want, ins.Fill[i])
			}
		}
	}
}

// TestInsertL1FullNamesThePool: an insert that cannot get slots of some rank's pool (the
// rest locked) fails with ErrL1Full naming that rank, having cached nothing.
func TestInsertL1FullNamesThePool(t *testing.T) {
	c, err := New(Config{Options: Options{PageSize: 4, L1Pages: 2}, Slabs: 2, PagesPerSlab: 16})
	if err != nil {
		t.Fatal(err)
	}
	a, err := c.Insert(Request{Tokens: seqTokens(3, 0, 0)}) // pool 0: 2 slots, pool 1: 1
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Lock(a.Last); err != nil {
		t.Fatal(err)
	}
	nodes := c.Nodes()
	_, err = c.Insert(Request{Tokens: seqTokens(1, 0, 500)}) // one page of pool 0
	if !errors.Is(err, ErrL1Full) || !strings.Contains(err.Error(), "CP rank 0's L1 pool") {
		t.Fatalf("insert into a full pool 0: %v", err)
	}
	if c.Nodes() != nodes {
		t.Fatalf("failed insert left %d nodes, want %d", c.Nodes(), nodes)
	}
	if _, err := c.Insert(Request{Tokens: seqTokens(3, 0, 0)[:8]}); err != nil { // a cached prefix: no room needed
		t.Fatal(err)
	}
}
