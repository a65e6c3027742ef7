package slab

import (
	"errors"

	"github.com/cpcache/cpcache/slab/alloc"
)

// Sentinel errors. Every error this package returns wraps one of them (use errors.Is). The
// allocator's are defined in slab/alloc and re-exported here.
var (
	ErrBadArgument  = alloc.ErrBadArgument
	ErrTooLarge     = alloc.ErrTooLarge
	ErrNoSpace      = alloc.ErrNoSpace
	ErrUnknownRange = alloc.ErrUnknownRange
	ErrDoubleFree   = alloc.ErrDoubleFree
	ErrRangeExists  = alloc.ErrRangeExists
	ErrNotCommitted = alloc.ErrNotCommitted
	ErrCommitted    = alloc.ErrCommitted
	// ErrSpecMismatch: ranks of a group asked for slabs with different specs. Errors that wrap
	// it name the odd ranks and are identical on every rank.
	ErrSpecMismatch = errors.New("slab: spec mismatch")
	// ErrSetup: some rank could not create or map a slab; the error names the ranks and is
	// identical on every rank.
	ErrSetup = errors.New("slab: set setup failed")
	// ErrClosed: the set was closed.
	ErrClosed = errors.New("slab: closed")
	// ErrUnsupported: the backend is not available here (no CUDA driver, no device backend
	// linked in, wrong access kind for the backend).
	ErrUnsupported = errors.New("slab: unsupported")
)
