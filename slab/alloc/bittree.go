package alloc

import "math/bits"

// bitTree is a set of free indices 0..n-1 with O(log64 n) insert, remove and lowest-member
// queries. Level 0 holds one bit per index (1 = free); a bit of level l+1 is set iff the
// corresponding word of level l is non-zero. The top level is a single word.
type bitTree struct {
	n      int
	levels [][]uint64 // levels[0] are the leaves
}

func newBitTree(n int) bitTree {
	var t bitTree
	t.n = n
	words := n
	for {
		words = (words + 63) / 64
		t.levels = append(t.levels, make([]uint64, words))
		if words == 1 {
			break
		}
	}
	t.fill()
	return t
}

// fill marks every index free.
func (t *bitTree) fill() {
	count := t.n // bits in the current level
	for _, lv := range t.levels {
		for i := range lv {
			lv[i] = ^uint64(0)
		}
		if r := count % 64; r != 0 {
			lv[len(lv)-1] = 1<<uint(r) - 1
		}
		count = len(lv)
	}
}

// lowest returns the smallest free index, or -1 when none is free.
func (t *bitTree) lowest() int {
	top := len(t.levels) - 1
	if t.levels[top][0] == 0 {
		return -1
	}
	idx := 0
	for l := top; l >= 0; l-- {
		idx = idx*64 + bits.TrailingZeros64(t.levels[l][idx])
	}
	return idx
}

// isFree reports whether index i is free.
func (t *bitTree) isFree(i int) bool { return t.levels[0][i/64]&(1<<uint(i%64)) != 0 }

// take marks index i used. It must be free.
func (t *bitTree) take(i int) {
	for _, lv := range t.levels {
		w := i / 64
		lv[w] &^= 1 << uint(i%64)
		if lv[w] != 0 {
			return
		}
		i = w
	}
}

// put marks index i free. It must be used.
func (t *bitTree) put(i int) {
	for _, lv := range t.levels {
		w := i / 64
		was := lv[w]
		lv[w] |= 1 << uint(i%64)
		if was != 0 {
			return
		}
		i = w
	}
}
