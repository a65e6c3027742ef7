package core

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/cpcache/cpcache/internal/mix"
	"github.com/cpcache/cpcache/slab/alloc"
)

// StateDigest hashes the whole replicated state, walking the tree: every node's id, place,
// pages, tiers (L1 slots, L2 pages), flags, locks and hits, plus the L1 pool, the queues and
// the allocator digest (while L2 is enabled). Equal on every rank of a healthy group after every step. O(nodes);
// meant for tests and debugging (the consensus step uses O(1) digests).
func (c *Core) StateDigest() uint64 {
	h := mix.Mix64(uint64(c.l1.ranks()) << 1)
	for _, p := range c.l1.pools {
		h = mix.Mix64(h ^ uint64(p.used()))
	}
	if !c.quarantined { // after a divergence the allocator is abandoned (and may differ)
		h = mix.Mix64(h ^ c.alloc.Digest())
	}
	h = mix.Mix64(h ^ c.writeSeq ^ c.loadSeq<<32 ^ uint64(len(c.writes))<<48 ^ uint64(len(c.loads))<<56)
	for _, op := range c.writes {
		for _, part := range op.parts {
			h = mix.Mix64(h ^ op.seq ^ part.node.id<<20 ^ uint64(len(part.pages))<<52)
		}
	}
	for _, op := range c.loads {
		for _, n := range op.nodes {
			h = mix.Mix64(h ^ op.seq ^ n.id<<20)
		}
	}
	h = c.l3Digest(h)
	for _, op := range c.l3.puts {
		h = mix.Mix64(h ^ op.seq ^ op.node.id<<20)
	}
	for _, r := range c.l3.reads {
		h = mix.Mix64(h ^ r.seq ^ uint64(r.rid)<<20 ^ uint64(len(r.pages))<<48)
	}
	for _, rel := range c.l3.releases {
		h = mix.Mix64(h ^ rel.seq ^ uint64(rel.rid)<<20)
	}
	flag := func(b bool, bit uint) uint64 {
		if b {
			return 1 << bit
		}
		return 0
	}
	var visit func(n *treeNode)
	visit = func(n *treeNode) {
		if !n.isRoot() {
			h = mix.Mix64(h ^ n.id ^ uint64(n.depth)<<32)
			h = mix.Mix64(h ^ n.hashes[len(n.hashes)-1].Index())
			h = mix.Mix64(h ^ uint64(n.l3Pins)<<40 ^ uint64(n.l3Own)<<50)
			h = mix.Mix64(h ^ uint64(n.lockRef) ^ uint64(n.ownLocks)<<12 ^ uint64(n.hits)<<24 ^ flag(n.stale, 60) ^ flag(n.evictAfterWrite, 61) ^
				flag(n.write != nil, 62) ^ flag(n.load != nil, 63) ^ uint64(n.list)<<56)
			if c.l1.engine == nil { // EngineOwned: the slots are the engine's, local to each rank
				for _, s := range n.l1 {
					h = mix.Mix64(h ^ uint64(s))
				}
			}
			for _, p := range n.l2 {
				h = mix.Mix64(h ^ uint64(p.Slab)<<32 ^ uint64(p.Index))
			}
		}
		kids := slices.Clone(n.children)
		slices.SortFunc(kids, func(a, b *treeNode) int { return cmp.Compare(a.id, b.id) })
		h = mix.Mix64(h ^ uint64(len(kids)))
		for _, k := range kids {
			visit(k)
		}
	}
	visit(c.root)
	// LRU order matters for future evictions.
	for n := c.lruL1.front(); n != nil; n = c.lruL1.after(n) {
		h = mix.Mix64(h ^ n.id)
	}
	for n := c.lruL2.front(); n != nil; n = c.lruL2.after(n) {
		h = mix.Mix64(h ^ n.id ^ 1<<63)
	}
	return h
}

// CheckInvariants verifies the structural invariants (tests, diagnostics): L1 is closed under parents,
// l1Kids counts are right, lists hold exactly the nodes their tiers say, I/O implies L1,
// every L1 slot is held once in its owner's pool, L2 pages live in their owners' slabs, and the allocator agrees with the tree.
func (c *Core) CheckInvariants() error {
	var err error
	fail := func(format string, args ...any) {
		if err == nil {
			err = fmt.Errorf("core: "+format, args...)
		}
	}
	nodes, ownLocks := 0, 0
	l1Pages := make([]int, c.cfg.Slabs)           // per CP rank's pool: slots the nodes hold
	l1Held := make([]map[int32]bool, c.cfg.Slabs) // per pool: the slots the nodes hold
	for r := range l1Held {
		l1Held[r] = map[int32]bool{}
	}
	var stateSum uint64 // what the incremental tree digest should hold once up to date
	var visit func(n *treeNode)
	visit = func(n *treeNode) {
		kids := 0
		for _, ch := range n.children {
			if ch.parent != n {
				fail("node %d: child %d has parent %v", n.id, ch.id, nodeName(ch.parent))
			}
			if ch.l1 != nil {
				kids++
			}
			visit(ch)
		}
		if n.isRoot() {
			return
		}
		locks := n.ownLocks
		for _, ch := range n.children {
			locks += ch.lockRef
		}
		if locks != n.lockRef {
			fail("node %d: lockRef %d, own %d + children's = %d", n.id, n.lockRef, n.ownLocks, locks)
		}
		pins := n.l3Own
		for _, ch := range n.children {
			pins += ch.l3Pins
		}
		if pins != n.l3Pins || (n.l3Own > 0 && n.l2 == nil) {
			fail("node %d: l3Pins %d, own %d + children's = %d, L2 copy %t", n.id, n.l3Pins, n.l3Own, pins, n.l2 != nil)
		}
		ownLocks += n.ownLocks
		nodes++
		stateSum += stateTerm(n)
		if !n.dirty && n.term != stateTerm(n) {
			fail("node %d: state changed without a mark (term %#x, state %#x)", n.id, n.term, stateTerm(n))
		}
		if kids != n.l1Kids {
			fail("node %d: l1Kids %d, counted %d", n.id, n.l1Kids, kids)
		}
		if kids > 0 && n.l1 == nil {
			fail("node %d: not in L1 but %d children are", n.id, kids)
		}
		if n.l1 == nil && n.l2 == nil {
			fail("node %d: in no tier", n.id)
		}
		if (n.write != nil || n.load != nil) && n.l1 == nil {
			fail("node %d: I/O in flight without L1 pages", n.id)
		}
		if n.l1 != nil {
			for j, s := range n.l1 {
				r := (n.depth + j) % c.cfg.Slabs
				l1Pages[r]++
				if e := c.l1.engine; e != nil && r != e.rank {
					if s != -1 {
						fail("node %d page %d (sequence page %d): slot %d of CP rank %d's engine-owned pool on rank %d, want -1", n.id, j, n.depth+j, s, r, e.rank)
					}
					continue
				}
				if e := c.l1.engine; e != nil && !e.held[s] {
					fail("node %d page %d: engine slot %d not recorded as held", n.id, j, s)
				}
				if s < 0 || int(s) >= c.cfg.L1Pages || l1Held[r][s] {
					fail("node %d page %d (sequence page %d): slot %d of CP rank %d's pool out of range or held twice", n.id, j, n.depth+j, s, r)
				} else {
					l1Held[r][s] = true
				}
			}
			if n.list != inL1List {
				fail("node %d: in L1 but list %d", n.id, n.list)
			}
		} else if n.list != inL2List {
			fail("node %d: L2-only but list %d", n.id, n.list)
		}
		for j, p := range n.l2 {
			if p.Slab != (n.depth+j)%c.cfg.Slabs {
				fail("node %d page %d (sequence page %d) in slab %d", n.id, j, n.depth+j, p.Slab)
			}
		}
		if !c.quarantined {
			pages, committed, ok := c.alloc.Range(alloc.RangeID(n.id))
			switch {
			case n.l2 != nil && (!ok || !committed || !slices.Equal(pages, n.l2)):
				fail("node %d: L2 pages %v, allocator has %v committed=%t ok=%t", n.id, n.l2, pages, committed, ok)
			case n.write != nil && (!ok || committed || !slices.Equal(pages, n.write.pagesOf(n))):
				fail("node %d: write in flight of pages %v, allocator has %v committed=%t ok=%t", n.id, n.write.pagesOf(n), pages, committed, ok)
			case n.l2 == nil && n.write == nil && ok:
				fail("node %d: no L2 copy but the allocator holds range", n.id)
			}
		}
	}
	visit(c.root)
	pending := c.stateSum // stateSum with the marked nodes' new terms, as flushDirty would make it
	for _, n := range c.dirty {
		if !n.removed {
			pending += stateTerm(n) - n.term
		}
	}
	if pending != stateSum {
		fail("incremental node-state sum %#x, recomputed %#x", pending, stateSum)
	}
	if ownLocks != c.locks {
		fail("%d locks outstanding, nodes hold %d", c.locks, ownLocks)
	}
	if nodes != c.nodes {
		fail("nodes %d, counted %d", c.nodes, nodes)
	}
	if e := c.l1.engine; e != nil && len(e.held) != l1Pages[e.rank] {
		fail("%d engine slots recorded as held, nodes hold %d", len(e.held), l1Pages[e.rank])
	}
	for r, p := range c.l1.pools {
		if p.used() != l1Pages[r] {
			fail("CP rank %d's L1 pool uses %d slots, nodes hold %d of its pages", r, p.used(), l1Pages[r])
		}
	}
	if c.lruL1.n+c.lruL2.n != nodes {
		fail("lists hold %d+%d nodes, tree %d", c.lruL1.n, c.lruL2.n, nodes)
	}
	if !c.quarantined && c.alloc.NumRanges() != c.countRanges() {
		fail("allocator has %d ranges, tree %d", c.alloc.NumRanges(), c.countRanges())
	}
	return err
}

func (c *Core) countRanges() int {
	n := 0
	var visit func(x *treeNode)
	visit = func(x *treeNode) {
		if x.l2 != nil || x.write != nil {
			n++
		}
		for _, ch := range x.children {
			visit(ch)
		}
	}
	visit(c.root)
	return n + len(c.l3.reads) + len(c.l3.releases)
}
