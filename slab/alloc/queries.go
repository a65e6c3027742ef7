package alloc

import (
	"fmt"
	"maps"
	"slices"
)

// FreePages is the number of free pages in slab s (0 for s out of range).
func (a *Allocator) FreePages(s int) int {
	if s < 0 || s >= a.slabs {
		return 0
	}
	return a.freeCount[s]
}

// FreeCounts returns the number of free pages of every slab; the slice is the caller's.
func (a *Allocator) FreeCounts() []int { return slices.Clone(a.freeCount) }

// TotalFree is the number of free pages in all slabs.
func (a *Allocator) TotalFree() int {
	n := 0
	for _, c := range a.freeCount {
		n += c
	}
	return n
}

// ReservedPages is the number of pages in reserved, uncommitted ranges.
func (a *Allocator) ReservedPages() int { return a.reservedPages }

// CommittedPages is the number of pages in committed ranges.
func (a *Allocator) CommittedPages() int { return a.committedPages }

// NumRanges is the number of ranges, reserved or committed.
func (a *Allocator) NumRanges() int { return len(a.ranges) }

// Ranges returns the ids of all ranges in increasing order.
func (a *Allocator) Ranges() []RangeID { return slices.Sorted(maps.Keys(a.ranges)) }

// Range returns a copy of a range's pages and whether it is committed; ok is false when no
// such range exists.
func (a *Allocator) Range(id RangeID) (pages []Page, committed, ok bool) {
	r, ok := a.ranges[id]
	if !ok {
		return nil, false, false
	}
	return slices.Clone(r.pages), r.committed, true
}

// IsFree reports whether page p is free; an address outside the pool is an error.
func (a *Allocator) IsFree(p Page) (bool, error) {
	if p.Slab < 0 || p.Slab >= a.slabs || p.Index < 0 || p.Index >= a.perSlab {
		return false, fmt.Errorf("%w: page %v outside %d slabs × %d pages", ErrBadArgument, p, a.slabs, a.perSlab)
	}
	return a.free[p.Slab].isFree(p.Index), nil
}
