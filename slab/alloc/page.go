package alloc

import "fmt"

// Page is the L2 address of one page: the slab (the CP rank that created it) and the page's
// index inside that slab.
type Page struct {
	Slab  int
	Index int
}

func (p Page) String() string { return fmt.Sprintf("(%d,%d)", p.Slab, p.Index) }

// RangeID names the pages of one reservation; hicache uses the radix-tree node id.
type RangeID uint64
