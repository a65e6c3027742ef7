// Package alloc is the replicated L2 page allocator of a slab set: C slabs of P pages, page
// j of a range that starts at sequence page s placed in slab (s+j) mod C at that slab's
// lowest free index (a multi-level bitmap), so placement is a pure function of which pages
// are used. Ranges are reserved (all or nothing), then committed or aborted, freed, and split;
// a bad call returns a typed *RangeError and changes nothing. The placement digest is kept
// in O(1) per page change (a wrapping sum of fixed per-page hashes, no per-process seed);
// DigestPair gives d and -d so one MIN all-reduce yields both min and max.
//
// It is pure — no I/O, goroutines, sync or clocks — so hicache's deterministic core can
// depend on it; package slab re-exports its types (slab.Allocator, slab.Page, slab.RangeID)
// beside the shared-memory slabs. One Allocator per rank replica, not safe for concurrent
// use: its owner serializes calls.
//
// Usage:
//
//	a, _ := alloc.New(slabs, pagesPerSlab)
//	pages, err := a.Reserve(id, startPage, n) // ErrNoSpace: evict and retry
//	a.Commit(id)                              // or a.Abort(id) when a copy failed
//	a.Free(id)
package alloc
