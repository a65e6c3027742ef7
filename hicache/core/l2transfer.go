package core

import (
	"errors"
	"fmt"
	"slices"

	"github.com/cpcache/cpcache/slab/alloc"
)

// writeOp is a backup in flight: the node's L2 range is reserved, every owner copies its
// pages, and the consensus step commits the range once every rank finished (or aborts it if
// any rank failed). An Insert may split the node while the copies run: the op then covers
// every piece (parts, in sequence order, each with its own allocator range), and one agreed
// completion of the op's seq commits or aborts all of them.
type writeOp struct {
	seq   uint64
	parts []writePart // replicated
	// local completion on this rank (not replicated)
	done bool
	err  error
}

// writePart is one node of a backup in flight and the L2 pages reserved for it.
type writePart struct {
	node  *treeNode
	pages []alloc.Page
}

// loadOp is a load-back in flight: the node's L1 slots are allocated and every owner reads
// its pages from its alloc. Like a backup, it covers every piece (nodes, in sequence order)
// when the node is split while it loads.
type loadOp struct {
	seq   uint64
	nodes []*treeNode // replicated
	done  bool
	err   error
}

// pagesOf returns the pages the op reserved for node n (nil if n is not one of its parts).
func (op *writeOp) pagesOf(n *treeNode) []alloc.Page {
	for _, p := range op.parts {
		if p.node == n {
			return p.pages
		}
	}
	return nil
}

// splitIO hands the transfers in flight on n to the head split off its first at pages:
// the head joins n's backup and load-back ops (right in front of n, keeping sequence
// order), with the first at reserved pages of a backup. The ops' seqs are unchanged, so the
// copies already started, and every rank's completion of them, cover both halves.
func splitIO(n, head *treeNode, at int) {
	if op := n.write; op != nil {
		i := slices.IndexFunc(op.parts, func(p writePart) bool { return p.node == n })
		pages := op.parts[i].pages
		op.parts = slices.Insert(op.parts, i, writePart{node: head, pages: pages[:at:at]})
		op.parts[i+1].pages = pages[at:]
		head.write = op
		head.evictAfterWrite = n.evictAfterWrite
	}
	if op := n.load; op != nil {
		i := slices.Index(op.nodes, n)
		op.nodes = slices.Insert(op.nodes, i, head)
		head.load = op
	}
}

// backup reserves L2 for n (evicting L2-only nodes when the pool is full, then dropping the
// L2 copies of stored L1 nodes: dropL2Copies) and queues its
// write. It returns false, changing nothing else, when no room could be made.
func (c *Core) backup(n *treeNode) bool {
	id, k := alloc.RangeID(n.id), len(n.hashes)
	pages, err := c.alloc.Reserve(id, n.depth, k)
	if errors.Is(err, alloc.ErrNoSpace) {
		c.evictL2(1<<62, func() bool { return c.alloc.Fits(n.depth, k) })
		c.dropL2Copies(n.depth, k)
		pages, err = c.alloc.Reserve(id, n.depth, k)
	}
	if err != nil {
		if !errors.Is(err, alloc.ErrNoSpace) && !errors.Is(err, alloc.ErrTooLarge) {
			panic(fmt.Sprintf("core: reserve for node %d: %v (replica invariant broken)", n.id, err))
		}
		c.stats.SkippedBackups++
		return false
	}
	op := &writeOp{seq: c.writeSeq, parts: []writePart{{node: n, pages: pages}}}
	c.writeSeq++
	n.write = op
	c.mark(n)
	c.writes = append(c.writes, op)
	t := Transfer{Kind: Write, Seq: op.seq, Node: n.id}
	for j, p := range pages {
		if p.Slab == c.cfg.CPRank {
			t.Copies = append(t.Copies, Copy{L1: n.l1[j], L2: p})
		}
	}
	c.out = append(c.out, t)
	return true
}

// LoadResult says what a LoadBack started.
type LoadResult struct {
	Pages, Tokens int // pages (tokens) now loading into L1
	Nodes         int // nodes loading
	// Freed (EngineOwned mode, LoadBackSlots): this rank's slots the load let go: the
	// caller's slots for pages that did not load, and slots its evictions freed.
	Freed []int32
}

// LoadBack brings the L2-only pages of the path to node h (n) into L1: it allocates L1 slots
// (evicting if needed) and starts the loads; the pages count as device pages at once, and a
// layer must WaitL1 before reading them. n is what Match returned as Last: the path ends
// exactly where the match did (Match splits a host node the tokens leave in its middle), so
// the pages that load are the leading HostPages of that match, at most:
//   - the load quota left: LoadQuotaPages minus the pages already loading;
//   - the L1 pages free once unlocked leaves off the path were evicted for them.
//
// When that cuts the hit inside a node, the node is split there and its head loads; the
// rest stays in L2 for a later LoadBack (after the loads in flight finish, when the quota
// was the bound). So a hit longer than the quota loads the quota's worth. Nothing loads
// when fewer than MinLoadPages pages (and at least one) would, or when L2 is disabled
// (quarantine); ErrL1Full, changing nothing but evictions, when the quota allows them but
// L1 cannot make room for MinLoadPages. Replicated: call it identically on every rank.
func (c *Core) LoadBack(h Handle) (LoadResult, error) {
	if c.l1.engine != nil {
		return LoadResult{}, fmt.Errorf("%w: LoadBack in L1 mode %s: the engine passes its destination slots (LoadBackSlots)", ErrBadArgument, c.cfg.L1Mode)
	}
	return c.loadBack(h)
}

// loadBack is LoadBack; in EngineOwned mode the destination slots of this rank's pages come
// from c.adopt (see LoadBackSlots).
func (c *Core) loadBack(h Handle) (LoadResult, error) {
	if c.quarantined {
		return LoadResult{}, nil
	}
	n, err := c.node(h)
	if err != nil || n.isRoot() {
		return LoadResult{}, err
	}
	var todo []*treeNode
	host := 0
	for _, x := range pathTo(n) {
		if x.l1 == nil {
			todo = append(todo, x)
			host += len(x.hashes)
		}
	}
	pages := min(host, max(c.cfg.LoadQuotaPages-c.loadingPgs, 0))
	if pages == 0 || pages < c.cfg.MinLoadPages {
		return LoadResult{}, nil
	}
	if fit := c.l1Prefix(todo, pages); fit < pages {
		need := make(pageCounts, c.cfg.Slabs)
		c.countPrefix(need, todo, pages)
		def, _ := c.l1.deficit(need)
		c.lockPath(n, 1)
		c.evictL1Pools(def)
		c.lockPath(n, -1)
		if fit = c.l1Prefix(todo, pages); fit < pages {
			if fit == 0 || fit < c.cfg.MinLoadPages {
				return LoadResult{}, fmt.Errorf("%w: load-back of %d pages, L1 pools could be freed for the first %d (min load pages %d)%s", ErrL1Full, pages, fit, c.cfg.MinLoadPages, c.pendingHint())
			}
			pages = fit
		}
	}
	// The first pages host pages: whole nodes, then the head of the node where they end.
	left := pages
	for i, x := range todo {
		if k := len(x.hashes); k >= left {
			if k > left {
				todo[i] = c.split(x, left)
			}
			todo = todo[:i+1]
			break
		}
		left -= len(x.hashes)
	}
	for _, x := range todo {
		slots := c.allocL1(x.depth, len(x.hashes))
		c.setL1(x, slots)
		op := &loadOp{seq: c.loadSeq, nodes: []*treeNode{x}}
		c.loadSeq++
		x.load = op
		c.mark(x)
		c.loads = append(c.loads, op)
		c.loadingPgs += len(x.hashes)
		t := Transfer{Kind: Load, Seq: op.seq, Node: x.id}
		for j, p := range x.l2 {
			if p.Slab == c.cfg.CPRank {
				t.Copies = append(t.Copies, Copy{L1: slots[j], L2: p})
			}
		}
		c.out = append(c.out, t)
	}
	c.touch(n)
	return LoadResult{Pages: pages, Tokens: pages * c.cfg.PageSize, Nodes: len(todo)}, nil
}

// countPrefix adds to pc the owner pools of the first pages pages of the nodes todo.
func (c *Core) countPrefix(pc pageCounts, todo []*treeNode, pages int) {
	for _, x := range todo {
		k := min(len(x.hashes), pages)
		pc.add(x.depth, k, 1)
		if pages -= k; pages == 0 {
			return
		}
	}
}

// l1Prefix is how many of the first pages pages of the nodes todo (in order) get a slot
// of their owner's pool: it stops at the first page whose pool is full.
func (c *Core) l1Prefix(todo []*treeNode, pages int) int {
	C := c.cfg.Slabs
	took := make([]int, C)
	fit := 0
	for _, x := range todo {
		for j := range x.hashes {
			if fit == pages {
				return fit
			}
			r := (x.depth + j) % C
			if took[r] == c.l1.pools[r].available() {
				return fit
			}
			took[r]++
			fit++
		}
	}
	return fit
}

// Writing returns the seqs of the backups in flight on the path to node h (pieces of a
// split node share one).
func (c *Core) Writing(h Handle) ([]uint64, error) {
	n, err := c.node(h)
	if err != nil {
		return nil, err
	}
	var seqs []uint64
	for ; n != nil && !n.isRoot(); n = n.parent {
		if n.write != nil && !slices.Contains(seqs, n.write.seq) {
			seqs = append(seqs, n.write.seq)
		}
	}
	return seqs, nil
}

// Loading returns the seqs of the loads in flight on the path to node h (what a layer must
// wait for before reading its prefix from L1).
func (c *Core) Loading(h Handle) ([]uint64, error) {
	n, err := c.node(h)
	if err != nil {
		return nil, err
	}
	var seqs []uint64
	for ; n != nil && !n.isRoot(); n = n.parent {
		if n.load != nil && !slices.Contains(seqs, n.load.seq) { // pieces of a split share one
			seqs = append(seqs, n.load.seq)
		}
	}
	return seqs, nil
}

// completed records that this rank finished a transfer (err != nil: it failed).
func (c *Core) completed(kind Kind, seq uint64, err error) {
	switch kind {
	case Write:
		if len(c.writes) == 0 || seq < c.writes[0].seq {
			return
		}
		if i := int(seq - c.writes[0].seq); i < len(c.writes) {
			c.writes[i].done, c.writes[i].err = true, err
		}
	case Load:
		if len(c.loads) == 0 || seq < c.loads[0].seq {
			return
		}
		if i := int(seq - c.loads[0].seq); i < len(c.loads) {
			c.loads[i].done, c.loads[i].err = true, err
		}
	}
}

// HintEvict asks, from this rank only (e.g. local memory pressure), that the group evict
// l1 L1 pages and l2 L2 pages. A local event: at the next consensus step every rank evicts
// the largest amount any rank asked for, as EvictL1 and EvictL2 do (write-back evictions
// still pending count toward l1).
func (c *Core) HintEvict(l1, l2 int) {
	c.hintL1 = max(c.hintL1, l1)
	c.hintL2 = max(c.hintL2, l2)
}
