package core

import (
	"fmt"
	"slices"

	"github.com/cpcache/cpcache/slab/alloc"
)

func (c *Core) resetTree() {
	c.gen++
	c.root = &treeNode{gen: c.gen}
	c.index = map[uint64]*treeNode{}
	if c.indexMask == 0 {
		c.indexMask = ^uint64(0)
	}
	c.byID = map[uint64]*treeNode{0: c.root}
	c.nextID = 1
	c.nodes = 0
	c.treeSum = 0
	c.lruL1.init()
	c.lruL2.init()
	c.locks = 0
	c.stateSum, c.dirty, c.lruClock = 0, nil, 0
	c.treeSalt = 0
}

// mark records that n's state changed: its term is recomputed at the next vector.
func (c *Core) mark(n *treeNode) {
	if n == nil || n.isRoot() {
		return
	}
	c.evMark(n)
	if n.dirty {
		return
	}
	n.dirty = true
	c.dirty = append(c.dirty, n)
}

// flushDirty brings stateSum up to date with the nodes marked since the last call.
func (c *Core) flushDirty() {
	for _, n := range c.dirty {
		n.dirty = false
		if n.removed {
			continue // its term left the sum when it was removed
		}
		c.stateSum -= n.term
		n.term = stateTerm(n)
		c.stateSum += n.term
	}
	clear(c.dirty)
	c.dirty = c.dirty[:0]
}

// Peek returns a copy of the deepest node under r's isolation key whose pages all match a
// prefix of r's tokens, without touching LRU order or counters (the zero NodeInfo, Handle 0,
// when nothing matches). Read-only: a rank may call it alone.
func (c *Core) Peek(r Request) NodeInfo {
	if n := c.peek(r.Key, r.Tokens); n != nil {
		return n.info()
	}
	return NodeInfo{}
}

func (c *Core) peek(key string, tokens []int32) *treeNode {
	var buf [walkBuf]pathMatch
	path := c.walk(buf[:0], key, tokens)
	for i := len(path) - 1; i >= 0; i-- {
		if path[i].pages == len(path[i].n.hashes) {
			return path[i].n
		}
	}
	return nil
}

// pathMatch is one node of a walk and how many of its pages matched.
type pathMatch struct {
	n     *treeNode
	pages int
}

// walkBuf is the path length that walk's callers hold on the stack.
const walkBuf = 16

// walk matches whole pages of tokens under isolation key key from the root and appends the
// path to path (callers pass a stack buffer: var buf [walkBuf]pathMatch; c.walk(buf[:0],
// key, tokens)); every node but the last is matched fully. The key seeds the page ids
// (KeyRoot), so a walk under one key never reaches another key's nodes.
func (c *Core) walk(path []pathMatch, key string, tokens []int32) []pathMatch {
	P := c.cfg.PageSize
	np := len(tokens) / P
	n, h, pos := c.root, c.hs.root(key), 0
	for pos < np {
		ph := c.hs.page(h, tokens[pos*P:(pos+1)*P])
		child := c.indexGet(ph)
		if child == nil || child.parent != n || child.key != key || !slices.Equal(child.tokens[:P], tokens[pos*P:(pos+1)*P]) {
			break
		}
		// Inside the node, equal tokens are equal ids: the node's id of page j was computed
		// from the same chain (the walk matched every page before it) and the same tokens,
		// so only the tokens are compared, and the next child is looked up by the id of the
		// node's last matched page. One page id is hashed per node, not per page.
		j := 1
		for j < len(child.hashes) && pos+j < np && slices.Equal(child.tokens[j*P:(j+1)*P], tokens[(pos+j)*P:(pos+j+1)*P]) {
			j++
		}
		h = child.hashes[j-1]
		path = append(path, pathMatch{child, j})
		pos += j
		if j < len(child.hashes) {
			break
		}
		n = child
	}
	return path
}

// The index maps the id of a node's first page to the node. It is keyed by a 64-bit index
// of the id (PageID.Index, masked by indexMask, which tests narrow to force collisions) and
// chains the nodes that share one (treeNode.indexNext); a lookup compares the full id. So a
// collision of the 64-bit index, chosen or not, never makes one prefix another, nor makes a
// prefix uncacheable. Chain order is not replicated state: nothing but lookups depends on it.

func (c *Core) indexKey(id PageID) uint64 { return id.Index() & c.indexMask }

// indexGet returns the node whose first page has id id, or nil.
func (c *Core) indexGet(id PageID) *treeNode {
	for n := c.index[c.indexKey(id)]; n != nil; n = n.indexNext {
		if n.hashes[0] == id {
			return n
		}
	}
	return nil
}

// indexAdd adds n under the id of its first page.
func (c *Core) indexAdd(n *treeNode) {
	k := c.indexKey(n.hashes[0])
	n.indexNext = c.index[k]
	c.index[k] = n
}

// indexDel removes n, indexed under the id of its first page.
func (c *Core) indexDel(n *treeNode) {
	k := c.indexKey(n.hashes[0])
	if c.index[k] == n {
		if n.indexNext == nil {
			delete(c.index, k)
		} else {
			c.index[k] = n.indexNext
		}
		n.indexNext = nil
		return
	}
	for p := c.index[k]; p != nil; p = p.indexNext {
		if p.indexNext == n {
			p.indexNext = n.indexNext
			n.indexNext = nil
			return
		}
	}
}

// touch moves n and its ancestors to the back of their LRU lists, deepest first.
func (c *Core) touch(n *treeNode) {
	for ; n != nil && !n.isRoot(); n = n.parent {
		c.relist(n, true)
	}
}

// relist puts n in the list its tiers call for; toBack moves it to the back even when it
// stays in the same list.
func (c *Core) relist(n *treeNode, toBack bool) {
	want := int8(inNoList)
	switch {
	case n.removed:
	case n.l1 != nil:
		want = inL1List
	case n.l2 != nil:
		want = inL2List
	}
	if want == n.list && !toBack {
		return
	}
	c.mark(n)
	n.lruSeq = c.lruClock
	c.lruClock++
	switch n.list {
	case inL1List:
		c.lruL1.remove(n)
	case inL2List:
		c.lruL2.remove(n)
	}
	n.list = want
	switch want {
	case inL1List:
		c.lruL1.pushBack(n)
	case inL2List:
		c.lruL2.pushBack(n)
	}
}

func (c *Core) setL1(n *treeNode, slots []int32) {
	if n.l1 == nil && n.parent != nil {
		n.parent.l1Kids++
	}
	n.l1 = slots
	n.stale = false
	c.mark(n)
	c.mark(n.parent)
	c.relist(n, false)
}

func (c *Core) clearL1(n *treeNode) {
	if n.l1 == nil {
		return
	}
	c.l1.release(n.depth, n.l1)
	n.l1 = nil
	n.stale = false
	n.parent.l1Kids--
	c.mark(n)
	c.mark(n.parent)
	c.relist(n, false)
}

// newNode creates a child of parent holding pages of tokens (whole pages) with their
// ids under isolation key key (a child of a node has its parent's key). It returns nil when
// a node with the first page's id exists already (the same prefix, which the caller's walk
// should have matched): the caller stops inserting there.
func (c *Core) newNode(parent *treeNode, key string, tokens []int32, hashes []PageID) *treeNode {
	n := c.newNodeID(parent, key, tokens, hashes, c.nextID)
	if n != nil {
		c.nextID++
	}
	return n
}

// newNodeID is newNode with a given id (not taken from nextID).
func (c *Core) newNodeID(parent *treeNode, key string, tokens []int32, hashes []PageID, id uint64) *treeNode {
	if c.indexGet(hashes[0]) != nil {
		return nil
	}
	n := &treeNode{id: id, gen: c.gen, parent: parent, key: key, tokens: tokens, hashes: hashes}
	if !parent.isRoot() {
		n.depth = parent.depth + len(parent.hashes)
	}
	parent.children = append(parent.children, n)
	c.indexAdd(n)
	c.byID[id] = n
	c.nodes++
	c.treeSum += nodeTerm(n)
	c.mark(n)
	c.mark(parent)
	return n
}

// split divides n after its first at pages: a new node (the head) takes them and becomes
// n's parent. A node with I/O in flight is split too: its allocator range (committed, or
// reserved by a backup in flight) is split at the same page, and the head joins n's backup
// and load-back ops (splitIO), so both halves commit, abort or finish together at the step
// the group agrees on; no page changes place. Returns the head.
func (c *Core) split(n *treeNode, at int) *treeNode {
	P := c.cfg.PageSize
	c.treeSum -= nodeTerm(n)
	head := &treeNode{
		id: c.nextID, gen: c.gen, parent: n.parent, key: n.key, depth: n.depth,
		tokens: n.tokens[: at*P : at*P], hashes: n.hashes[:at:at],
		// A storage backup of n in flight covers the head's pages too: the head is stored
		// once it is acknowledged (l3Apply), not before.
		stored: n.stored && n.l3Own == 0,
		stale:  n.stale, lockRef: n.lockRef, l3Pins: n.l3Pins, hits: n.hits, children: []*treeNode{n},
		pubL1: n.pubL1, pubL2: n.pubL2, // the head's pages were published with n's
	}
	c.nextID++
	if n.l1 != nil {
		head.l1 = n.l1[:at:at]
		n.l1 = n.l1[at:]
		head.l1Kids = 1
	}
	if (n.l2 != nil || n.write != nil) && !c.quarantined {
		if err := c.alloc.Split(alloc.RangeID(n.id), at, alloc.RangeID(head.id)); err != nil {
			panic(fmt.Sprintf("core: allocator split of node %d: %v (replica invariant broken)", n.id, err))
		}
	}
	if n.l2 != nil {
		head.l2 = n.l2[:at:at]
		n.l2 = n.l2[at:]
	}
	splitIO(n, head, at)
	c.indexDel(n) // its first page becomes the head's
	p := n.parent
	p.children[slices.Index(p.children, n)] = head
	n.parent = head
	n.tokens, n.hashes = n.tokens[at*P:], n.hashes[at:]
	n.depth += at
	c.indexAdd(head)
	c.byID[head.id] = head
	c.indexAdd(n)
	c.nodes++
	c.treeSum += nodeTerm(n) + nodeTerm(head)
	// The head goes right behind n in n's list: behind its descendant, ahead of the rest.
	c.mark(head)
	c.mark(n)
	c.mark(head.parent)
	if n.list != inNoList {
		head.list, head.lruSeq = n.list, n.lruSeq
		head.prev, head.next = n, n.next
		n.next.prev = head
		n.next = head
		if n.list == inL1List {
			c.lruL1.n++
		} else {
			c.lruL2.n++
		}
	}
	return head
}

// removeSubtree drops n and its descendants from every tier. Callers guarantee that no node
// of the subtree holds L1 pages other than n itself and that none has I/O in flight.
func (c *Core) removeSubtree(n *treeNode) {
	for len(n.children) > 0 {
		c.removeSubtree(n.children[len(n.children)-1])
	}
	if n.l2 != nil {
		if !c.quarantined {
			if err := c.alloc.Free(alloc.RangeID(n.id)); err != nil {
				panic(fmt.Sprintf("core: allocator free of node %d: %v (replica invariant broken)", n.id, err))
			}
		}
		n.l2 = nil
	}
	c.clearL1(n)
	n.parent.unlinkChild(n)
	c.indexDel(n)
	delete(c.byID, n.id)
	c.treeSum -= nodeTerm(n)
	c.stateSum -= n.term
	n.term = 0
	c.nodes--
	n.removed = true
	c.evMark(n)
	c.relist(n, false)
	c.stats.DroppedNodes++
}

// pathTo returns the nodes from the root's child down to n.
func pathTo(n *treeNode) []*treeNode {
	var p []*treeNode
	for ; n != nil && !n.isRoot(); n = n.parent {
		p = append(p, n)
	}
	slices.Reverse(p)
	return p
}

func (c *Core) lockPath(n *treeNode, d int) {
	for ; n != nil && !n.isRoot(); n = n.parent {
		n.lockRef += d
		c.mark(n)
	}
}

// Lock pins the node h names and its ancestors: none of them is evicted from any tier until
// Unlock. A running request holds a lock on its matched prefix.
func (c *Core) Lock(h Handle) error {
	n, err := c.node(h)
	if err != nil || n.isRoot() {
		return err
	}
	c.lockPath(n, 1)
	n.ownLocks++
	c.locks++
	return nil
}

// Unlock releases one Lock of the node h names. The locks of a node a divergence removed
// are released by as many Unlocks of its handle, which change nothing.
func (c *Core) Unlock(h Handle) error {
	if k := c.dropped[h]; k > 0 {
		if k == 1 {
			delete(c.dropped, h)
		} else {
			c.dropped[h] = k - 1
		}
		return nil
	}
	n, err := c.node(h)
	if err != nil || n.isRoot() {
		return err
	}
	if n.ownLocks <= 0 {
		return fmt.Errorf("%w: unlock of node %d, which is not locked", ErrBadArgument, n.id)
	}
	c.lockPath(n, -1)
	n.ownLocks--
	c.locks--
	return nil
}

func nodeName(n *treeNode) string {
	if n == nil {
		return "<nil>"
	}
	return fmt.Sprintf("#%d", n.id)
}
