package core

import (
	"fmt"
	"slices"

	"github.com/cpcache/cpcache/slab/alloc"
)

// l1Evictable: holds L1 pages, no child holds L1 pages, not locked, no I/O in flight, and
// not dropping a subtree with a storage backup in flight (a node with an L2 copy only
// loses its L1 pages).
func l1Evictable(n *treeNode) bool {
	return n.l1 != nil && n.l1Kids == 0 && n.lockRef == 0 && !n.busy() && (n.l2 != nil || n.l3Pins == 0)
}

// l2Evictable: held only in L2, a leaf, not locked, no storage backup reading its pages
// (other I/O in flight implies L1 pages).
func l2Evictable(n *treeNode) bool {
	return n.l1 == nil && n.l2 != nil && len(n.children) == 0 && n.lockRef == 0 && n.l3Pins == 0
}

// evictL1 frees L1 pages, least recently used leaves first, until want pages were freed or
// are pending, or no candidate is left; it never takes more than want: a leaf longer than
// what is still wanted is split and only its tail (the deepest pages) is evicted. See
// evictLeaf for what happens to an evicted leaf. Never in quarantine: every caller
// returns before it then.
func (c *Core) evictL1(want int) (freed, pending int) {
	for n := c.lruL1.front(); n != nil && freed+pending < want; {
		next := c.lruL1.after(n)
		if l1Evictable(n) {
			if keep := freed + pending + len(n.hashes) - want; keep > 0 {
				c.split(n, keep) // the head (first keep pages) stays; n is the tail
			}
			k := len(n.hashes)
			if c.evictLeaf(n) {
				freed += k
			} else {
				pending += k
			}
		}
		n = next
	}
	c.stats.EvictedL1Pages += int64(freed)
	return freed, pending
}

// evictLeaf evicts the L1 pages of an evictable node and reports whether they are free now.
// A backed-up node becomes L2-only; under write-back a node without a backup starts one and
// frees its pages once the group agreed it committed (false: pending); any other node is
// dropped with its L2-only descendants.
func (c *Core) evictLeaf(n *treeNode) bool {
	switch {
	case n.l2 != nil:
		c.clearL1(n)
	case c.cfg.Policy == WriteBack && !n.stale && c.backup(n):
		n.evictAfterWrite = true
		c.mark(n)
		return false
	default:
		c.removeSubtree(n)
	}
	return true
}

// evictL1Pools frees L1 pages until every CP rank's pool r has def[r] more free slots (freed
// now or pending a write-back), or no candidate is left. It lowers def by what it frees and
// leaves it holding what is still short. Least recently used leaves go first: in a first
// pass only those holding pages of a short pool, each giving the shortest tail that covers
// what is still short (or all its pages); a second pass, when pools are still short, also
// takes leaves of no short pool, whose eviction may make a parent that holds some evictable.
func (c *Core) evictL1Pools(def pageCounts) {
	C := len(def)
	left := 0
	for _, d := range def {
		left += d
	}
	trial := make(pageCounts, C)
	for pass := 0; pass < 2 && left > 0; pass++ {
		for n := c.lruL1.front(); n != nil && left > 0; {
			next := c.lruL1.after(n)
			if !l1Evictable(n) {
				n = next
				continue
			}
			// The shortest tail covering what is short, or all k pages.
			k := len(n.hashes)
			copy(trial, def)
			tail, helps, still := k, false, left
			for j := k - 1; j >= 0 && still > 0; j-- {
				if r := (n.depth + j) % C; trial[r] > 0 {
					trial[r]--
					helps = true
					if still--; still == 0 {
						tail = k - j
					}
				}
			}
			if !helps && pass == 0 {
				n = next
				continue
			}
			if tail < k {
				c.split(n, k-tail) // the head (first pages) stays; n is the tail
			}
			depth, pages := n.depth, len(n.hashes)
			if c.evictLeaf(n) {
				c.stats.EvictedL1Pages += int64(pages)
			}
			for j := range pages {
				if r := (depth + j) % C; def[r] > 0 {
					def[r]--
					left--
				}
			}
			n = next
		}
	}
}

// evictingL1 is the number of L1 pages whose write-back eviction is scheduled and not yet
// over: their backups are in flight, and their slots free at the step that commits them.
func (c *Core) evictingL1() int {
	pages := 0
	for _, op := range c.writes {
		for _, part := range op.parts {
			if part.node.evictAfterWrite {
				pages += len(part.pages)
			}
		}
	}
	return pages
}

// evictL1Request is EvictL1 and an agreed eviction hint: pages whose write-back eviction an
// earlier request scheduled count toward this one, so a request repeated while those
// backups run starts no more. It returns the pages freed now and the pages of the request
// still pending (scheduled earlier or now).
func (c *Core) evictL1Request(want int) (freed, pending int) {
	already := min(c.evictingL1(), want)
	freed, pending = c.evictL1(want - already)
	return freed, already + pending
}

// evictL2 frees L2-only leaves, least recently used first, until want pages were freed,
// done() holds (when not nil), or no candidate is left. A parent that becomes an evictable
// leaf stands later in the list, so one pass reaches it.
func (c *Core) evictL2(want int, done func() bool) int {
	freed := 0
	for n := c.lruL2.front(); n != nil && freed < want && (done == nil || !done()); {
		next := c.lruL2.after(n)
		if l2Evictable(n) {
			freed += len(n.hashes)
			c.removeSubtree(n)
		}
		n = next
	}
	c.stats.EvictedL2Pages += int64(freed)
	return freed
}

// l2CopyDroppable: an L1 node whose L2 copy is a spare: storage holds its pages (stored),
// its L1 pages are valid (not stale), and no I/O reads or writes either copy (no backup to
// L2 or load-back in flight, no storage backup reading its L2 pages).
func l2CopyDroppable(n *treeNode) bool {
	return n.l1 != nil && n.l2 != nil && n.stored && !n.stale && !n.busy() && n.l3Own == 0
}

// dropL2Copies frees the L2 copies of stored L1 nodes (l2CopyDroppable), least recently used
// first and only of nodes holding a page in a slab still short, until k pages from sequence
// page start fit in L2 or no candidate is left. A node keeps its L1 pages, so no hit is
// lost: only the L2 backup of pages that storage also holds, which an L1 eviction then
// drops (evictLeaf) and a later prefetch reads again. It is how L2 stays a staging area
// when it holds no more than L1: under write-through every L1 page has an L2 copy, so
// without it a full L2 holds nothing evictable (evictL2 takes L2-only nodes) and every
// prefetch and backup would be refused for want of room. Replicated: the order and the
// flags are replicated state.
func (c *Core) dropL2Copies(start, k int) int {
	if c.quarantined || !c.cfg.L3 {
		return 0
	}
	C := c.cfg.Slabs
	dropped := 0
	short := c.alloc.Shortfall(start, k)
	for n := c.lruL1.front(); n != nil && slices.ContainsFunc(short, func(x int) bool { return x > 0 }); n = c.lruL1.after(n) {
		if !l2CopyDroppable(n) {
			continue
		}
		helps := false
		for j := range n.hashes {
			if short[(n.depth+j)%C] > 0 {
				helps = true
				break
			}
		}
		if !helps {
			continue
		}
		if err := c.alloc.Free(alloc.RangeID(n.id)); err != nil {
			panic(fmt.Sprintf("core: allocator free of node %d's L2 copy: %v (replica invariant broken)", n.id, err))
		}
		n.l2 = nil
		c.mark(n)
		dropped += len(n.hashes)
		short = c.alloc.Shortfall(start, k)
	}
	c.stats.DroppedL2CopyPages += int64(dropped)
	return dropped
}

// EvictL1 evicts up to pages L1 pages, least recently used unlocked leaves first, never
// more than pages (a longer leaf gives its tail). It returns the pages freed now and, under
// write-back, the pages pending: their backups are in flight and their L1 slots free at
// the step that commits them (freed + pending = pages unless no candidate is left). Pages
// already pending from earlier calls count toward pages: a caller that repeats a request
// while its write-backs run is answered with them and starts no more.
// Replicated: call it identically on every rank.
func (c *Core) EvictL1(pages int) (freed, pending int) {
	if pages <= 0 || c.quarantined { // a diverged tree's choices would differ across ranks
		return 0, 0
	}
	return c.evictL1Request(pages)
}

// EvictL2 frees at least pages L2 pages of L2-only nodes if it can, and returns the number
// freed. Replicated: call it identically on every rank.
func (c *Core) EvictL2(pages int) int {
	if pages <= 0 || c.quarantined {
		return 0
	}
	return c.evictL2(pages, nil)
}

// commitWrite applies an agreed, completed backup: every piece of the node (see writeOp)
// gets its L2 copy. Write-back evictions then free L1 pages deepest piece first, so that a
// head whose only L1 child was its own tail becomes evictable too.
func (c *Core) commitWrite(op *writeOp) {
	for _, part := range op.parts {
		n := part.node
		if err := c.alloc.Commit(alloc.RangeID(n.id)); err != nil {
			panic(fmt.Sprintf("core: commit of node %d: %v (replica invariant broken)", n.id, err))
		}
		n.write = nil
		n.l2 = part.pages
		c.mark(n)
		c.stats.WrittenPages += int64(len(part.pages))
		if c.cfg.L3 && !c.cfg.L3Config.NoBackup {
			c.l3Backup(n)
		}
		c.relist(n, false)
	}
	for i := len(op.parts) - 1; i >= 0; i-- {
		n := op.parts[i].node
		if n.evictAfterWrite {
			n.evictAfterWrite = false
			c.mark(n)
			if l1Evictable(n) {
				c.clearL1(n)
				c.stats.EvictedL1Pages += int64(len(n.hashes))
			}
		}
	}
}

// abortWrite applies an agreed, failed backup: the ranges are released, the nodes keep
// their L1 pages.
func (c *Core) abortWrite(op *writeOp) {
	for _, part := range op.parts {
		n := part.node
		if err := c.alloc.Abort(alloc.RangeID(n.id)); err != nil {
			panic(fmt.Sprintf("core: abort of node %d: %v (replica invariant broken)", n.id, err))
		}
		n.write = nil
		n.evictAfterWrite = false
		c.mark(n)
	}
	c.stats.AbortedWrites++
}

// finishLoad applies an agreed load-back: on success the node's L1 pages are valid; on
// failure on any rank they are stale (never served; refilled by an Insert or evicted).
func (c *Core) finishLoad(op *loadOp, ok bool) {
	for _, n := range op.nodes {
		n.load = nil
		c.mark(n)
		c.loadingPgs -= len(n.hashes)
		if ok {
			c.stats.LoadedPages += int64(len(n.hashes))
		} else {
			n.stale = true
		}
	}
	if !ok {
		c.stats.FailedLoads++
	}
}
