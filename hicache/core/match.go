package core

import "fmt"

// Request is one token sequence as the cache sees it: its tokens and the isolation key its
// pages live under. Match, Insert, InsertSlots, Prefetch, PrefetchSkipsForCost and Peek take
// one.
type Request struct {
	// Tokens are the sequence's token ids; only its whole pages are looked up or cached.
	Tokens []int32
	// Key is the isolation key: only pages inserted (or prefetched) under the same key
	// match, and the key seeds the pages' ids (KeyRoot), so equal tokens under another key
	// are other pages in every tier. "" is the empty key, an ordinary key like any other.
	Key string
}

// MatchResult is the longest cached prefix of a token sequence.
type MatchResult struct {
	// DevicePages are the leading pages held in L1 (some may still be loading: call WaitL1
	// on Last before a layer reads them). DeviceTokens = DevicePages × PageSize.
	DevicePages, DeviceTokens int
	// HostPages follow the device pages and are held only in L2: LoadBack(Last) brings
	// them into L1 (as many as its quota and L1 allow; see LoadBack). Zero once L2 is
	// disabled.
	HostPages, HostTokens int
	// Last is the deepest node of the hit (the root's handle when nothing matched). A hit
	// that ends inside a host node ends at Last's end (Match split the node there); one that
	// ends inside a device node may end inside Last. Lock it while a request uses the prefix.
	Last Handle
	// L1Slots are the L1 slots of the device pages, in sequence order, on this rank: a
	// page's slot is one of its owner's L1 pool (page i is owned by CP rank i mod C), so
	// only the owner's memory holds it; for the pages this rank does not own the slot is -1.
	L1Slots []int32
}

// Match returns the longest cached prefix of r's tokens (whole pages only) under r's
// isolation key and marks it recently used; in quarantine it returns no hit. When the hit
// ends inside a node held only in L2, that node is split at the hit's end (also with a
// storage backup of it in flight), so that a load-back of the hit brings its pages and no
// others. Replicated: call it identically on every rank.
func (c *Core) Match(r Request) MatchResult {
	key, tokens := r.Key, r.Tokens
	c.stats.Matches++
	c.stats.PromptTokens += int64(len(tokens))
	res := MatchResult{Last: c.root.handle()}
	if c.quarantined {
		c.stats.MissedTokens += int64(len(tokens))
		return res // the trees may differ: serve nothing
	}
	device, last := true, c.root
	var buf [walkBuf]pathMatch
	for _, m := range c.walk(buf[:0], key, tokens) {
		n := m.n
		if device && n.l1 != nil && !n.stale {
			res.DevicePages += m.pages
			for j, s := range n.l1[:m.pages] {
				if !c.Owns(n.depth + j) {
					s = -1 // a slot of another rank's pool: no memory of this rank
				}
				res.L1Slots = append(res.L1Slots, s)
			}
		} else if n.l1 == nil && n.l2 != nil {
			device = false
			if m.pages < len(n.hashes) {
				// Last ends where the match does, so that LoadBack(Last) loads the
				// matched pages only, not the node's unmatched tail.
				n = c.split(n, m.pages)
			}
			res.HostPages += m.pages
		} else {
			break
		}
		last = n
	}
	res.Last = last.handle()
	c.touch(last)
	P := c.cfg.PageSize
	res.DeviceTokens, res.HostTokens = res.DevicePages*P, res.HostPages*P
	c.stats.L1HitPages += int64(res.DevicePages)
	c.stats.L2HitPages += int64(res.HostPages)
	c.stats.MissedTokens += int64(len(tokens) - res.DeviceTokens - res.HostTokens)
	return res
}

// FillPage is an L1 page an Insert allocated: the caller writes the page's KV into Slot on
// the rank that owns it (Owner == this rank's CP rank; Core.Owns(Index)). Slot is a slot
// of the owner's L1 pool: on any other rank it names no memory of that rank.
type FillPage struct {
	Slot  int32  // L1 slot
	Index int    // sequence page index
	Owner int    // CP rank that holds the page: Index mod C
	Hash  PageID // page id
}

// InsertResult says what an Insert cached.
type InsertResult struct {
	// Pages is the number of leading whole pages of the sequence now in the tree: all of
	// them (none while the cache is quarantined).
	Pages int
	// Last is the deepest node of the inserted prefix (the root's handle if Pages is 0).
	Last Handle
	// Fill lists the pages that got L1 slots and need their KV written by their owner.
	Fill []FillPage
	// Backups is the number of backups this insert started.
	Backups int
	// Freed (EngineOwned mode, InsertSlots) are this rank's slots the insert let go: the
	// caller's slots the cache did not adopt, stale slots it replaced, and slots its
	// evictions freed. The engine's allocator takes them back.
	Freed []int32
}

// Insert caches the whole pages of tokens: existing nodes are reused (split at page
// boundaries where the sequence leaves them, also while they have I/O in flight), missing pages become a new node with fresh L1
// slots, and nodes of the path held only in L2 get L1 slots again (the caller has their
// KV). It counts a hit on every node of the path and starts backups the write policy asks
// for. It fails with ErrL1Full when L1 cannot make room, having changed nothing but
// evictions and a split at the sequence's divergence point.
// The pages are cached under r's isolation key: their ids (and so their L3 keys) are seeded
// with the key (KeyRoot), and they match only under the same key. Replicated: call it
// identically on every rank.
func (c *Core) Insert(r Request) (InsertResult, error) {
	if c.l1.engine != nil {
		return InsertResult{}, fmt.Errorf("%w: Insert in L1 mode %s: the engine passes its slots (InsertSlots)", ErrBadArgument, c.cfg.L1Mode)
	}
	return c.insertKey(r.Key, r.Tokens)
}

// insertKey is Insert of tokens under isolation key key; in EngineOwned mode the slots of
// this rank's new pages come from c.adopt (see InsertSlots).
func (c *Core) insertKey(key string, tokens []int32) (InsertResult, error) {
	c.stats.Inserts++
	if c.quarantined {
		return InsertResult{Last: c.root.handle()}, nil // cache nothing until the recovery
	}
	P := c.cfg.PageSize
	np := len(tokens) / P
	var buf [walkBuf]pathMatch
	path := c.walk(buf[:0], key, tokens)
	// Split a partly matched last node, even with I/O in flight (see split): two requests
	// sharing a prefix are often inserted in the same step, before the first one's backup
	// or load-back is over.
	var nbuf [walkBuf]*treeNode
	nodes := nbuf[:0]
	pages := 0
	for _, m := range path {
		n := m.n
		if m.pages < len(n.hashes) {
			n = c.split(n, m.pages)
		}
		nodes = append(nodes, n)
		pages += len(n.hashes)
	}
	parent := c.root
	if len(nodes) > 0 {
		parent = nodes[len(nodes)-1]
	}
	// L1 room, per owner's pool: pages of path nodes not (validly) in L1, plus the new pages.
	need := make(pageCounts, c.cfg.Slabs)
	need.add(pages, np-pages, 1)
	for _, n := range nodes {
		if n.l1 == nil {
			need.add(n.depth, len(n.hashes), 1)
		}
	}
	if err := c.makeL1Room(parent, need, fmt.Sprintf("insert of %d pages", np)); err != nil {
		return InsertResult{}, err
	}
	res := InsertResult{}
	for _, n := range nodes {
		switch {
		case n.l1 == nil:
			c.setL1(n, c.allocL1(n.depth, len(n.hashes)))
			res.Fill = c.appendFill(res.Fill, n)
		case n.stale && n.load == nil:
			c.readoptL1(n)
			n.stale = false
			c.mark(n)
			res.Fill = c.appendFill(res.Fill, n)
		}
	}
	if np > pages {
		hashes := make([]PageID, np-pages)
		h := c.hs.root(key)
		if pages > 0 {
			h = parent.hashes[len(parent.hashes)-1]
		}
		for i := range hashes {
			h = c.hs.page(h, tokens[(pages+i)*P:(pages+i+1)*P])
			hashes[i] = h
		}
		toks := append([]int32(nil), tokens[pages*P:np*P]...)
		if n := c.newNode(parent, key, toks, hashes); n != nil {
			c.setL1(n, c.allocL1(n.depth, len(hashes)))
			res.Fill = c.appendFill(res.Fill, n)
			nodes = append(nodes, n)
			pages = np
		}
	}
	for _, n := range nodes {
		n.hits++
		c.mark(n)
	}
	if c.cfg.Policy != WriteBack {
		threshold := 1
		if c.cfg.Policy == WriteThroughSelective {
			threshold = c.cfg.WriteThreshold
		}
		for _, n := range nodes {
			if n.hits >= threshold && n.l2 == nil && n.write == nil && n.l1 != nil && !n.stale && n.load == nil {
				if c.backup(n) {
					res.Backups++
				}
			}
		}
	}
	res.Pages = pages
	last := c.root
	if len(nodes) > 0 {
		last = nodes[len(nodes)-1]
	}
	res.Last = last.handle()
	c.touch(last)
	c.stats.InsertedPages += int64(len(res.Fill))
	return res, nil
}

// makeL1Room evicts (the path to keep locked meanwhile) until every CP rank's pool has the
// free slots need asks of it, or fails with ErrL1Full naming the first pool short, having
// changed nothing but evictions. what names the operation for the error.
func (c *Core) makeL1Room(keep *treeNode, need pageCounts, what string) error {
	def, short := c.l1.deficit(need)
	if !short {
		return nil
	}
	c.lockPath(keep, 1)
	c.evictL1Pools(def)
	c.lockPath(keep, -1)
	for r, n := range need {
		if avail := c.l1.pools[r].available(); n > avail {
			return fmt.Errorf("%w: %s needs %d free slots of CP rank %d's L1 pool, %d could be freed (the rest are locked or have I/O in flight)%s",
				ErrL1Full, what, n, r, avail, c.pendingHint())
		}
	}
	return nil
}

func (c *Core) appendFill(fill []FillPage, n *treeNode) []FillPage {
	for j, s := range n.l1 {
		i := n.depth + j
		fill = append(fill, FillPage{Slot: s, Index: i, Owner: i % c.cfg.Slabs, Hash: n.hashes[j]})
	}
	return fill
}

// pendingHint is what an L1-full error adds while transfers are pending: their copies start
// only at the next step, and their slots are freed only after it.
func (c *Core) pendingHint() string {
	if n := len(c.writes) + len(c.loads); n > 0 {
		return fmt.Sprintf("; %d backups and loads are pending: their copies start only at the next step(), and their slots can be freed only after the step that finishes them", n)
	}
	return ""
}
