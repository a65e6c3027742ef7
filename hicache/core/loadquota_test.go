package core

import (
	"errors"
	"fmt"
	"testing"
)

// settle steps until nothing is in flight.
func (r *coreRig) settle() {
	r.t.Helper()
	for k := 0; r.cores[0].Pending() > 0; k++ {
		if k > 1000 {
			r.t.Fatal("copies never end")
		}
		if err := r.step(); err != nil {
			r.t.Fatal(err)
		}
	}
}

// seqTokens returns pages pages of PageSize 4 tokens, the first from 1 on and the rest
// from base on (base 1: one run 1, 2, 3, ...).
func seqTokens(pages, shared int, base int32) []int32 {
	tokens := make([]int32, pages*4)
	for i := range tokens {
		tokens[i] = int32(i + 1)
		if i >= shared*4 {
			tokens[i] = base + int32(i)
		}
	}
	return tokens
}

// hostOnly inserts tokens, lets the backups commit and evicts every L1 page, so that the
// sequence is held in L2 only (one node).
func (r *coreRig) hostOnly(tokens []int32) {
	r.t.Helper()
	if _, err := r.insert(tokens); err != nil {
		r.t.Fatal(err)
	}
	r.settle()
	pages := len(tokens) / 4
	r.each(func(_ int, c *Core) error { c.EvictL1(pages); return nil })
	if m := r.match(tokens)[0]; m.DevicePages != 0 || m.HostPages != pages {
		r.t.Fatalf("after the eviction: %d device and %d host pages, want 0 and %d", m.DevicePages, m.HostPages, pages)
	}
}

// loadBack matches tokens and loads its host hit back on every rank; it returns the
// match and the pages that load (equal on every rank, or the test fails).
func (r *coreRig) loadBack(tokens []int32) (MatchResult, LoadResult, error) {
	ms := r.match(tokens)
	var res0 LoadResult
	err := r.each(func(i int, c *Core) error {
		res, err := c.LoadBack(ms[i].Last)
		if i == 0 {
			res0 = res
		} else if res.Pages != res0.Pages || res.Tokens != res0.Tokens || res.Nodes != res0.Nodes {
			r.t.Fatalf("rank %d load-back %+v, rank 0 %+v", i, res, res0)
		}
		return err
	})
	return ms[0], res0, err
}

var cpSizes = []int{1, 2, 4, 8}

// TestLoadBackSplitsANodeLongerThanTheQuota: a host hit whose node is longer than the load
// quota (a long prefetch from storage is one node) must still load back: LoadBack must not
// stop before the node and load nothing (the scheduler would compute the whole hit). It
// loads the node's head, as much as the quota allows, and the rest at the next calls.
func TestLoadBackSplitsANodeLongerThanTheQuota(t *testing.T) {
	const n, pages, quota = 2, 20, 8
	r := newCoreRig(t, n, Options{PageSize: 4, L1Pages: 32, LoadQuotaPages: quota}, 32, 1)
	tokens := seqTokens(pages, pages, 0)
	r.hostOnly(tokens)
	for want := quota; ; want = min(want+quota, pages) {
		m, res, err := r.loadBack(tokens)
		if err != nil {
			t.Fatal(err)
		}
		if m.HostPages == 0 {
			break
		}
		if res.Pages != min(quota, m.HostPages) {
			t.Fatalf("load-back of %d host pages loaded %d, want %d (the quota)", m.HostPages, res.Pages, min(quota, m.HostPages))
		}
		r.settle()
		if m := r.match(tokens)[0]; m.DevicePages != want {
			t.Fatalf("%d device pages after the load, want %d", m.DevicePages, want)
		}
	}
}

// TestLoadBackOfALongHostHit is the long-host-hit scenario, on 1, 2, 4 and 8 ranks: a
// 20-page host hit in one node, L1 (32 pages per rank) empty, nothing else loading. LoadBack
// must not load 0 pages (as it would if the quota, 16, applied to the whole node). It loads
// the quota's worth, 16 (the other 4 at the next call, once those are in), or all 20 when
// the quota allows 20 or more (the default, half of the group's L1, is 16 × C); every replica splits the node alike (rig.step compares
// digests).
func TestLoadBackOfALongHostHit(t *testing.T) {
	for _, n := range cpSizes {
		for _, tc := range []struct{ quota, first int }{{0, 16}, {20, 20}, {32, 20}} {
			t.Run(fmt.Sprintf("cp%d/quota%d", n, tc.quota), func(t *testing.T) {
				if tc.quota == 0 {
					tc.first = min(20, 16*n)
				}
				r := newCoreRig(t, n, Options{PageSize: 4, L1Pages: 32, LoadQuotaPages: tc.quota}, 32, uint64(n))
				tokens := seqTokens(20, 20, 0)
				r.hostOnly(tokens)
				m, res, err := r.loadBack(tokens)
				if err != nil {
					t.Fatal(err)
				}
				if m.HostPages != 20 || res.Pages != tc.first || res.Tokens != tc.first*4 {
					t.Fatalf("host hit %d pages, load-back %+v; want 20 and %d pages", m.HostPages, res, tc.first)
				}
				r.settle()
				m, res, err = r.loadBack(tokens)
				if err != nil {
					t.Fatal(err)
				}
				if m.DevicePages != tc.first || res.Pages != 20-tc.first {
					t.Fatalf("second call: %d device pages, load-back %+v; want %d and %d pages", m.DevicePages, res, tc.first, 20-tc.first)
				}
				r.settle()
				if m := r.match(tokens)[0]; m.DevicePages != 20 || m.HostPages != 0 {
					t.Fatalf("after both loads: %d device and %d host pages, want 20 and 0", m.DevicePages, m.HostPages)
				}
				for i, c := range r.cores {
					if st := c.Stats(); st.LoadedPages != 20 || c.L1UsedAll() != 20 {
						t.Fatalf("rank %d: %d pages loaded, %d L1 pages used; want 20 and 20", i, st.LoadedPages, c.L1UsedAll())
					}
				}
			})
		}
	}
}

// TestLoadBackLoadsTheMatchedPagesOnly is the partial-hit scenario, on 1, 2, 4 and 8
// ranks: a request that shares 3 pages with an 8-page sequence held only in L2 hits 3 host
// pages. LoadBack must not load all 8 pages of the node into L1: Match ends the hit's
// node where the hit ends, so 3 pages load, the other 5 stay in L2 and L1 holds 3 pages.
func TestLoadBackLoadsTheMatchedPagesOnly(t *testing.T) {
	for _, n := range cpSizes {
		t.Run(fmt.Sprintf("cp%d", n), func(t *testing.T) {
			r := newCoreRig(t, n, Options{PageSize: 4, L1Pages: 32}, 32, uint64(n))
			long := seqTokens(8, 8, 0)
			r.hostOnly(long)
			other := seqTokens(6, 3, 1000) // 3 pages of long, then 3 of its own
			m, res, err := r.loadBack(other)
			if err != nil {
				t.Fatal(err)
			}
			if last := r.cores[0].at(m.Last); m.HostPages != 3 || len(last.hashes) != 3 || res.Pages != 3 || res.Nodes != 1 {
				t.Fatalf("host hit %d pages (last node %d pages), load-back %+v; want 3, 3, 3 pages in 1 node", m.HostPages, len(last.hashes), res)
			}
			r.settle()
			if m := r.match(long)[0]; m.DevicePages != 3 || m.HostPages != 5 {
				t.Fatalf("the long sequence: %d device and %d host pages, want 3 and 5", m.DevicePages, m.HostPages)
			}
			for i, c := range r.cores {
				if st := c.Stats(); st.LoadedPages != 3 || c.L1UsedAll() != 3 || c.Nodes() != 2 {
					t.Fatalf("rank %d: %d pages loaded, %d L1 pages used, %d nodes; want 3, 3, 2", i, st.LoadedPages, c.L1UsedAll(), c.Nodes())
				}
			}
		})
	}
}

// TestLoadBackFitsL1: a host hit that the quota allows but L1 cannot fully hold (most of it
// locked) loads as much as L1 can make room for, not ErrL1Full; below MinLoadPages it is
// ErrL1Full and changes nothing but evictions. L1 is per CP rank: with f free slots in each
// rank's pool, the first f×C pages of the hit fit (page i takes a slot of rank i mod C).
func TestLoadBackFitsL1(t *testing.T) {
	for _, n := range cpSizes {
		t.Run(fmt.Sprintf("cp%d", n), func(t *testing.T) {
			const l1 = 16
			free := max(1, 9/n) // free slots per pool: f×C below the hit's 10 pages
			if n == 1 {
				free = 5
			}
			fit := free * n
			r := newCoreRig(t, n, Options{PageSize: 4, L1Pages: l1, LoadQuotaPages: 16}, 64, uint64(n))
			host := seqTokens(10, 10, 0)
			r.hostOnly(host)
			lockedPages := n * (l1 - free) // l1-free slots of every pool, locked
			locked := seqTokens(lockedPages, 0, 5000)
			res, err := r.insert(locked)
			if err != nil {
				t.Fatal(err)
			}
			last := make([]Handle, n)
			r.each(func(i int, c *Core) error { last[i] = c.Peek(Request{Tokens: locked}).Handle; return c.Lock(last[i]) })
			r.settle()
			if res.Pages != lockedPages {
				t.Fatalf("inserted %d pages, want %d", res.Pages, lockedPages)
			}
			m, lr, err := r.loadBack(host)
			if err != nil {
				t.Fatal(err)
			}
			if m.HostPages != 10 || lr.Pages != fit {
				t.Fatalf("host hit %d pages with %d L1 slots free per rank: load-back %+v, want %d pages", m.HostPages, free, lr, fit)
			}
			r.settle()
			if m := r.match(host)[0]; m.DevicePages != fit || m.HostPages != 10-fit {
				t.Fatalf("after the load: %d device and %d host pages, want %d and %d", m.DevicePages, m.HostPages, fit, 10-fit)
			}
			// Nothing is free now and every L1 page is locked or on the path.
			if _, lr, err := r.loadBack(host); !errors.Is(err, ErrL1Full) || lr.Pages != 0 {
				t.Fatalf("load-back with L1 full of locked pages: %+v, %v; want ErrL1Full", lr, err)
			}
			r.each(func(i int, c *Core) error { return c.Unlock(last[i]) })
		})
	}
}

// TestMatchSplitsAHostNodeWithAStorageBackupInFlight: the node Match splits at a host hit's
// end may have its backup to storage in flight (it pins the node in L2). The split keeps the
// pins on both halves until the backup is acknowledged, then releases them on both, and
// the load-back of the hit loads its 2 pages while the other 2 stay pinned.
func TestMatchSplitsAHostNodeWithAStorageBackupInFlight(t *testing.T) {
	c, err := New(Config{Options: Options{PageSize: 2, L1Pages: 16}, Slabs: 1, PagesPerSlab: 16, L3: true})
	if err != nil {
		t.Fatal(err)
	}
	step := func(d Done) Ready { t.Helper(); return stepSolo(t, c, d) }
	seq := []int32{1, 1, 2, 2, 3, 3, 4, 4}
	if _, err := c.Insert(Request{Tokens: seq}); err != nil {
		t.Fatal(err)
	}
	rd := c.Ready() // the write-through backup
	rd = step(Done{Transfers: []TransferDone{{Kind: Write, Seq: rd.Transfers[0].Seq}}})
	if len(rd.Jobs) != 1 || rd.Jobs[0].Kind != StoragePut {
		t.Fatalf("jobs %+v, want a storage backup", rd.Jobs)
	}
	put := rd.Jobs[0]
	if freed, _ := c.EvictL1(4); freed != 4 {
		t.Fatalf("freed %d, want 4", freed)
	}
	m := c.Match(Request{Tokens: []int32{1, 1, 2, 2, 9, 9}})
	if m.HostPages != 2 || len(c.at(m.Last).hashes) != 2 || c.Nodes() != 2 {
		t.Fatalf("match: %d host pages, last node %d pages, %d nodes; want 2, 2, 2", m.HostPages, len(c.at(m.Last).hashes), c.Nodes())
	}
	tail := c.peek("", seq)
	if c.at(m.Last).l3Pins != 1 || tail.l3Pins != 1 || tail.l3Own != 1 {
		t.Fatalf("pins: head %d, tail %d (own %d); want 1, 1 (1)", c.at(m.Last).l3Pins, tail.l3Pins, tail.l3Own)
	}
	res, err := c.LoadBack(m.Last)
	if err != nil || res.Pages != 2 {
		t.Fatalf("load-back %+v, %v; want 2 pages", res, err)
	}
	rd = c.Ready()
	step(Done{Transfers: []TransferDone{{Kind: Load, Seq: rd.Transfers[0].Seq}}, Storage: []StorageDone{{Kind: StoragePut, Seq: put.Seq}}})
	if c.at(m.Last).l3Pins != 0 || tail.l3Pins != 0 || c.Stats().L3BackedUpPages != 4 {
		t.Fatalf("after the backup: pins %d and %d, %d pages backed up; want 0, 0, 4", c.at(m.Last).l3Pins, tail.l3Pins, c.Stats().L3BackedUpPages)
	}
	if m := c.Match(Request{Tokens: seq}); m.DevicePages != 2 || m.HostPages != 2 {
		t.Fatalf("%d device and %d host pages, want 2 and 2", m.DevicePages, m.HostPages)
	}
}

// TestDefaultLoadQuotaIsHalfTheGroupsL1: without LoadQuotaPages the quota is half of the CP
// group's L1 (C × L1Pages / 2: each CP rank's pool holds the pages it owns), the figure
// include/cpcache.h, the Python docstrings and docs/ give: with L1Pages 32 a 20-page host hit
// loads 16, then 4, at CP1, and an 80-page one loads 64, then 16, at CP4.
func TestDefaultLoadQuotaIsHalfTheGroupsL1(t *testing.T) {
	for _, tc := range []struct{ cp, pages, first int }{{1, 20, 16}, {4, 80, 64}} {
		t.Run(fmt.Sprintf("CP%d", tc.cp), func(t *testing.T) {
			r := newCoreRig(t, tc.cp, Options{PageSize: 4, L1Pages: 32}, 32, 1)
			if got := r.cores[0].Config().LoadQuotaPages; got != tc.first {
				t.Fatalf("default load quota %d, want %d", got, tc.first)
			}
			tokens := seqTokens(tc.pages, tc.pages, 0)
			r.hostOnly(tokens)
			for _, want := range []int{tc.first, tc.pages - tc.first} {
				_, res, err := r.loadBack(tokens)
				if err != nil {
					t.Fatal(err)
				}
				if res.Pages != want {
					t.Fatalf("load-back of the %d-page host hit loads %d pages, want %d", tc.pages, res.Pages, want)
				}
				r.settle()
			}
		})
	}
}
