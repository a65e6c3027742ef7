package core

import (
	"fmt"
	"slices"
)

// Engine-owned L1 slots (L1Mode EngineOwned): the engine's allocator picks every slot, the
// core adopts them. See L1Mode.

// allocL1 takes the slots of the k pages of a node at depth depth from their owners'
// pools. In EngineOwned mode this rank's pages get the slots the caller passed (c.adopt,
// indexed by sequence page), which the core now holds.
func (c *Core) allocL1(depth, k int) []int32 {
	slots := c.l1.alloc(depth, k)
	e := c.l1.engine
	if e == nil {
		return slots
	}
	for j := range slots {
		if i := depth + j; c.Owns(i) {
			if i >= len(c.adopt) || c.adopt[i] < 0 {
				panic(fmt.Sprintf("core: no engine slot for sequence page %d (caller's slots checked)", i))
			}
			slots[j] = c.adopt[i]
			e.held[slots[j]] = true
			c.adopt[i] = -1
		}
	}
	return slots
}

// readoptL1 gives a stale node being refilled by an InsertSlots the caller's slots for this
// rank's pages: the engine computed their KV there. The stale slots are freed.
func (c *Core) readoptL1(n *treeNode) {
	e := c.l1.engine
	if e == nil {
		return
	}
	for j, cur := range n.l1 {
		i := n.depth + j
		if !c.Owns(i) || i >= len(c.adopt) || c.adopt[i] < 0 {
			continue
		}
		delete(e.held, cur)
		e.freed = append(e.freed, cur)
		n.l1[j] = c.adopt[i]
		e.held[n.l1[j]] = true
		c.adopt[i] = -1
	}
}

// badSlot is an error wrapping ErrBadArgument about slot s of the caller's list.
func badSlot(what string, k int, s int32, why string) error {
	return fmt.Errorf("%w: %s: slot %d (entry %d of the list) %s", ErrBadArgument, what, s, k, why)
}

// setAdopt checks the caller's slots own for this rank's pages pages (sequence indices, in
// order; cur[k] >= 0: the slot the cache already holds that page under) and records them
// in c.adopt: a slot in [0, L1Pages), not twice in the list, and not held by the cache
// unless for that very page. A slot equal to the page's held one is not adopted again.
func (c *Core) setAdopt(what string, own []int32, pages []int, cur []int32) error {
	if len(own) != len(pages) {
		return fmt.Errorf("%w: %s: %d slots for the %d pages this rank (CP rank %d) owns", ErrBadArgument, what, len(own), len(pages), c.cfg.CPRank)
	}
	e := c.l1.engine
	seen := make(map[int32]int, len(own))
	for k, s := range own {
		if s < 0 || int(s) >= c.cfg.L1Pages {
			return badSlot(what, k, s, fmt.Sprintf("outside the L1 pool [0, %d)", c.cfg.L1Pages))
		}
		if k2, dup := seen[s]; dup {
			return badSlot(what, k, s, fmt.Sprintf("also given for entry %d", k2))
		}
		seen[s] = k
		if e.held[s] && cur[k] != s {
			return badSlot(what, k, s, fmt.Sprintf("is held by the cache for another page (sequence page %d's)", pages[k]))
		}
	}
	end := 0
	if len(pages) > 0 {
		end = pages[len(pages)-1] + 1
	}
	c.adopt = slices.Grow(c.adopt[:0], end)[:end]
	for i := range c.adopt {
		c.adopt[i] = -1
	}
	for k, i := range pages {
		if own[k] != cur[k] {
			c.adopt[i] = own[k]
		}
	}
	return nil
}

// takeAdopt ends an engine-slot call: the slots of the list the core did not adopt, then
// those freed since mark (evictions of the call), are what the call hands back; they leave
// the drain queue.
func (c *Core) takeAdopt(mark int) []int32 {
	e := c.l1.engine
	var out []int32
	for _, s := range c.adopt {
		if s >= 0 {
			out = append(out, s)
		}
	}
	c.adopt = c.adopt[:0]
	out = append(out, e.freed[mark:]...)
	e.freed = e.freed[:mark]
	return out
}

func (c *Core) engineMode(call string) error {
	if c.l1.engine == nil {
		return fmt.Errorf("%w: %s needs L1 mode %s (this core is %s)", ErrBadArgument, call, EngineOwned, c.cfg.L1Mode)
	}
	return nil
}

// InsertSlots is Insert in EngineOwned mode: own are this rank's slots for every
// whole page of r's tokens it owns (pages i with i mod C == CP rank), in order; for the pages
// Match served from L1, the slots Match gave. The core adopts them for the pages it caches
// that were not in L1 (and for stale pages, whose old slots it frees); a slot for a page
// already in L1 under another slot, or for a page it does not cache (while
// quarantined), comes back in InsertResult.Freed, with the slots the insert's evictions freed.
// A wrong count, a slot outside [0, L1Pages), twice in own, or held by the cache for another
// page is an error wrapping ErrBadArgument naming the slot, before any change. On another
// error (ErrL1Full) the caller keeps its slots; slots the failed insert's evictions freed
// wait in TakeFreedL1. Replicated (the slot values are local: each rank passes its own).
func (c *Core) InsertSlots(r Request, own []int32) (InsertResult, error) {
	key, tokens := r.Key, r.Tokens
	if err := c.engineMode("InsertSlots"); err != nil {
		return InsertResult{}, err
	}
	what := fmt.Sprintf("InsertSlots of %d pages", len(tokens)/c.cfg.PageSize)
	np := len(tokens) / c.cfg.PageSize
	var pages []int
	for i := 0; i < np; i++ {
		if c.Owns(i) {
			pages = append(pages, i)
		}
	}
	cur := make([]int32, len(pages))
	for k := range cur {
		cur[k] = -1
	}
	if !c.quarantined {
		var buf [walkBuf]pathMatch
		for _, m := range c.walk(buf[:0], key, tokens) {
			if m.n.l1 == nil {
				continue
			}
			for j := range m.pages {
				i := m.n.depth + j
				if c.Owns(i) {
					cur[slices.Index(pages, i)] = m.n.l1[j]
				}
			}
		}
	}
	if err := c.setAdopt(what, own, pages, cur); err != nil {
		return InsertResult{}, err
	}
	mark := len(c.l1.engine.freed)
	res, err := c.insertKey(key, tokens)
	if err != nil {
		c.adopt = c.adopt[:0]
		return res, err
	}
	res.Freed = c.takeAdopt(mark)
	return res, nil
}

// LoadBackPlan says which pages a LoadBackSlots of node h would load at most: the leading
// host pages of its path within the load quota left (eviction or L1 room may load fewer),
// as sequence page indices this rank owns among them, in order. Their count is the number
// of slots LoadBackSlots wants. Read-only.
func (c *Core) LoadBackPlan(h Handle) ([]int, error) {
	n, err := c.node(h)
	if err != nil || n.isRoot() || c.quarantined {
		return nil, err
	}
	left := max(c.cfg.LoadQuotaPages-c.loadingPgs, 0)
	var pages []int
	for _, x := range pathTo(n) {
		if x.l1 != nil {
			continue
		}
		for j := range x.hashes {
			if left == 0 {
				return pages, nil
			}
			left--
			if c.Owns(x.depth + j) {
				pages = append(pages, x.depth+j)
			}
		}
	}
	return pages, nil
}

// LoadBackSlots is LoadBack in EngineOwned mode: own are this rank's destination slots for
// the pages LoadBackPlan(h) lists, in order. The pages that load take them; the slots of
// pages that do not (L1 room, MinLoadPages) come back in LoadResult.Freed, with the slots
// the load's evictions freed. Bad slots (see InsertSlots) are an error wrapping
// ErrBadArgument naming the slot, before any change; on another error the caller keeps its
// slots. Replicated.
func (c *Core) LoadBackSlots(h Handle, own []int32) (LoadResult, error) {
	if err := c.engineMode("LoadBackSlots"); err != nil {
		return LoadResult{}, err
	}
	pages, err := c.LoadBackPlan(h)
	if err != nil {
		return LoadResult{}, err
	}
	cur := make([]int32, len(pages))
	for k := range cur {
		cur[k] = -1
	}
	if err := c.setAdopt(fmt.Sprintf("LoadBackSlots of node %v", h), own, pages, cur); err != nil {
		return LoadResult{}, err
	}
	mark := len(c.l1.engine.freed)
	res, err := c.loadBack(h)
	if err != nil {
		c.adopt = c.adopt[:0]
		return res, err
	}
	res.Freed = c.takeAdopt(mark)
	return res, nil
}

// EvictL1Slots is EvictL1 in EngineOwned mode: it also returns this rank's slots the
// eviction freed now (pending write-back evictions free theirs later, through TakeFreedL1).
// Replicated.
func (c *Core) EvictL1Slots(pages int) (freed, pending int, slots []int32, err error) {
	if err := c.engineMode("EvictL1Slots"); err != nil {
		return 0, 0, nil, err
	}
	e := c.l1.engine
	mark := len(e.freed)
	freed, pending = c.EvictL1(pages)
	slots = slices.Clone(e.freed[mark:])
	e.freed = e.freed[:mark]
	return freed, pending, slots, nil
}

// TakeFreedL1 returns (and forgets) this rank's slots the cache released outside a call that
// returns them: write-back evictions that committed, quarantine, recovery, Reset, and
// evictions of a call that failed. Nil in CacheOwned mode. Local.
func (c *Core) TakeFreedL1() []int32 {
	e := c.l1.engine
	if e == nil || len(e.freed) == 0 {
		return nil
	}
	out := e.freed
	e.freed = nil
	return out
}
