package core

// l1Pool is the replicated accounting of one rank's device KV pool: which of the L1Pages
// page slots hold cache data. Slot choice is a pure function of the set of free slots
// (lowest free slot first), so two replicas with equal used sets choose the same slots
// whatever their history. Every rank allocates the same slots for the same node; rank r
// stores in a slot only the pages it owns under the CP layout (sequence page i with
// i mod C == r).
type l1Pool struct {
	size int
	free []int32 // min-heap of free slots
}

func newL1Pool(size int) *l1Pool {
	p := &l1Pool{size: size}
	p.reset()
	return p
}

// reset frees every slot (a sorted slice is a valid min-heap).
func (p *l1Pool) reset() {
	p.free = p.free[:0]
	for i := 0; i < p.size; i++ {
		p.free = append(p.free, int32(i))
	}
}

func (p *l1Pool) available() int { return len(p.free) }
func (p *l1Pool) used() int      { return p.size - len(p.free) }

// alloc returns the n lowest free slots in increasing order; the caller checked
// available() >= n.
func (p *l1Pool) alloc(n int) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = p.pop()
	}
	return out
}

func (p *l1Pool) release(slots []int32) {
	for _, s := range slots {
		p.push(s)
	}
}

func (p *l1Pool) push(s int32) {
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
