package kvtest

import (
	"fmt"
	"slices"

	"github.com/cpcache/cpcache/slab"
)

// MemSlabs is an in-process slab set: one byte slice per slab, shared by every in-process
// rank of a slab group. Snapshot copies the slabs, so tests can prove that nothing was
// written after some point.
type MemSlabs struct {
	ranks     []int
	perSlab   int
	pageBytes int
	mem       [][]byte
}

// NewMemSlabs returns the shared memory of a slab group with the given global ranks.
func NewMemSlabs(ranks []int, pagesPerSlab, pageBytes int) *MemSlabs {
	m := &MemSlabs{ranks: slices.Clone(ranks), perSlab: pagesPerSlab, pageBytes: pageBytes}
	for range ranks {
		m.mem = append(m.mem, make([]byte, pagesPerSlab*pageBytes))
	}
	return m
}

// Ranks are the global ranks of the slab group; slab s belongs to Ranks()[s].
func (m *MemSlabs) Ranks() []int { return slices.Clone(m.ranks) }

// PageSize is the size of one page in bytes.
func (m *MemSlabs) PageSize() int { return m.pageBytes }

// PagesPerSlab is the number of pages in each slab.
func (m *MemSlabs) PagesPerSlab() int { return m.perSlab }

// Page returns page p's bytes (bounds-checked).
func (m *MemSlabs) Page(p slab.Page) ([]byte, error) {
	if p.Slab < 0 || p.Slab >= len(m.mem) || p.Index < 0 || p.Index >= m.perSlab {
		return nil, fmt.Errorf("kvtest: page %v outside %d slabs × %d pages", p, len(m.mem), m.perSlab)
	}
	off := p.Index * m.pageBytes
	return m.mem[p.Slab][off : off+m.pageBytes : off+m.pageBytes], nil
}

// SlabMemory returns slab i's whole memory (PagesPerSlab × PageSize bytes), for L2 layouts
// that spread a page over its slab (kvmem.LayerFirst).
func (m *MemSlabs) SlabMemory(i int) ([]byte, error) {
	if i < 0 || i >= len(m.mem) {
		return nil, fmt.Errorf("kvtest: slab %d outside %d slabs", i, len(m.mem))
	}
	return m.mem[i][:len(m.mem[i]):len(m.mem[i])], nil
}

// Snapshot copies every slab (to compare later).
func (m *MemSlabs) Snapshot() [][]byte {
	out := make([][]byte, len(m.mem))
	for i, b := range m.mem {
		out[i] = slices.Clone(b)
	}
	return out
}

// Close is a no-op (nil-safe, idempotent).
func (m *MemSlabs) Close() error { return nil }
