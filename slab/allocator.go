package slab

import "github.com/cpcache/cpcache/slab/alloc"

// The allocator's types, defined in slab/alloc (pure: no I/O, no goroutines, no sync), so that
// the hicache core can depend on it without depending on shared memory.
type (
	// Allocator is the replicated L2 page allocator (see alloc.Allocator).
	Allocator = alloc.Allocator
	// Page is a page of the slab set: slab index and page index in that slab.
	Page = alloc.Page
	// RangeID names an allocator range (hicache uses node ids).
	RangeID = alloc.RangeID
	// RangeError reports a failed allocator operation on one range.
	RangeError = alloc.RangeError
)

// NewAllocator returns an all-free allocator over slabs × pagesPerSlab pages (see alloc.New).
func NewAllocator(slabs, pagesPerSlab int) (*Allocator, error) { return alloc.New(slabs, pagesPerSlab) }
