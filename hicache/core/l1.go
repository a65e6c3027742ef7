package core

import "slices"

// l1Pools is the replicated accounting of the group's device KV pools: one pool per CP rank,
// each of L1Pages page slots. Sequence page i is held by CP rank i mod C (its owner), so
// page i of the tree takes a slot of pool i mod C, and a node of n pages takes about n/C
// slots of each rank's pool. Every rank keeps every pool (the same state on every rank);
// a slot of pool r only names memory on rank r, which stores there the page it owns.
//
// In EngineOwned mode (engine != nil) the pools only count slots in use (the replicated
// part); the slot values are the engine's, local to each rank: a node holds -1 for the pages
// of other ranks, and this rank's slots come from the caller (InsertSlots, LoadBackSlots).
type l1Pools struct {
	pools  []*l1Pool // pools[r]: CP rank r's pool
	engine *engineSlots
}

// engineSlots is this rank's local record of the engine's slots the cache holds, and of
// those it released and has not handed back yet.
type engineSlots struct {
	rank  int
	held  map[int32]bool
	freed []int32
}

func newL1Pools(ranks, size int, mode L1Mode, rank int) l1Pools {
	p := l1Pools{pools: make([]*l1Pool, ranks)}
	for r := range p.pools {
		p.pools[r] = newL1Pool(size)
		p.pools[r].countOnly = mode == EngineOwned
	}
	if mode == EngineOwned {
		p.engine = &engineSlots{rank: rank, held: map[int32]bool{}}
	}
	return p
}

// reset frees every slot; in EngineOwned mode this rank's held slots queue as freed
// (in increasing order).
func (p l1Pools) reset() {
	for _, q := range p.pools {
		q.reset()
	}
	if e := p.engine; e != nil {
		start := len(e.freed)
		for s := range e.held {
			e.freed = append(e.freed, s)
		}
		slices.Sort(e.freed[start:])
		clear(e.held)
	}
}

// ranks is C, the number of pools.
func (p l1Pools) ranks() int { return len(p.pools) }

// alloc returns one slot for each of the n pages of a node at depth depth: page j (sequence
// page depth+j) from pool (depth+j) mod C. The caller checked every pool has room
// (pageCounts.fits).
func (p l1Pools) alloc(depth, n int) []int32 {
	out := make([]int32, n)
	C := len(p.pools)
	for j := range out {
		out[j] = p.pools[(depth+j)%C].pop()
	}
	return out
}

// release gives back the slots of a node at depth depth; in EngineOwned mode this rank's
// slots among them queue as freed.
func (p l1Pools) release(depth int, slots []int32) {
	C := len(p.pools)
	for j, s := range slots {
		r := (depth + j) % C
		p.pools[r].push(s)
		if e := p.engine; e != nil && r == e.rank && s >= 0 {
			delete(e.held, s)
			e.freed = append(e.freed, s)
		}
	}
}

// pageCounts counts pages per owner pool (index: CP rank).
type pageCounts []int

// add counts the n pages of a node at depth depth: n/C for every pool, one more for the
// n mod C pools starting at depth's.
func (pc pageCounts) add(depth, n int, sign int) {
	C := len(pc)
	full, rem := n/C, n%C
	for r := range pc {
		pc[r] += sign * full
	}
	for j := range rem {
		pc[(depth+j)%C] += sign
	}
}

// deficit returns, per pool, how many more free slots pc needs than p has (0 when it
// fits), and whether any pool is short.
func (p l1Pools) deficit(pc pageCounts) (pageCounts, bool) {
	def := make(pageCounts, len(pc))
	short := false
	for r, n := range pc {
		if d := n - p.pools[r].available(); d > 0 {
			def[r], short = d, true
		}
	}
	return def, short
}

// l1Pool is the replicated accounting of one rank's device KV pool: which of the L1Pages
// page slots hold cache data. Slot choice is a pure function of the set of free slots
// (lowest free slot first), so two replicas with equal used sets choose the same slots
// whatever their history.
type l1Pool struct {
	size int
	free []int32 // min-heap of free slots
	// countOnly (EngineOwned mode): the engine picks the slots; the pool counts them only
	// (inUse), and pop returns -1.
	countOnly bool
	inUse     int
}

func newL1Pool(size int) *l1Pool {
	p := &l1Pool{size: size}
	p.reset()
	return p
}

// reset frees every slot (a sorted slice is a valid min-heap).
func (p *l1Pool) reset() {
	p.inUse = 0
	p.free = p.free[:0]
	if p.countOnly {
		return
	}
	for i := 0; i < p.size; i++ {
		p.free = append(p.free, int32(i))
	}
}

func (p *l1Pool) available() int { return p.size - p.used() }

func (p *l1Pool) used() int {
	if p.countOnly {
		return p.inUse
	}
	return p.size - len(p.free)
}

func (p *l1Pool) push(s int32) {
	if p.countOnly {
		p.inUse--
		return
	}
	p.free = append(p.free, s)
	i := len(p.free) - 1
	for i > 0 {
		parent := (i - 1) / 2
		if p.free[parent] <= p.free[i] {
			break
		}
		p.free[parent], p.free[i] = p.free[i], p.free[parent]
		i = parent
	}
}

func (p *l1Pool) pop() int32 {
	if p.countOnly {
		p.inUse++
		return -1
	}
	h := p.free
	top := h[0]
	last := len(h) - 1
	h[0] = h[last]
	h = h[:last]
	i := 0
	for {
		l, r, m := 2*i+1, 2*i+2, i
		if l < len(h) && h[l] < h[m] {
			m = l
		}
		if r < len(h) && h[r] < h[m] {
			m = r
		}
		if m == i {
			break
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
	p.free = h
	return top
}
