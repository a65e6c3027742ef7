package alloc

import (
	"errors"
	"fmt"
	"strings"
)

// Sentinel errors of the allocator (package slab re-exports them). Every error this package
// returns wraps one of them (use errors.Is).
var (
	// ErrBadArgument: an argument that can never be valid (zero or negative page count, a
	// pool shape with no pages, a page outside the pool, an unknown backend).
	ErrBadArgument = errors.New("slab: bad argument")
	// ErrTooLarge: a reservation that needs more pages in some slab than the slab has, so it
	// can never succeed, even on an empty pool.
	ErrTooLarge = errors.New("slab: reservation larger than the pool")
	// ErrNoSpace: not enough free pages right now. A normal result: evict and retry.
	ErrNoSpace = errors.New("slab: not enough free pages")
	// ErrUnknownRange: no range with this id is reserved or committed.
	ErrUnknownRange = errors.New("slab: unknown range")
	// ErrDoubleFree: Free or Abort of a range that holds no pages (already freed or aborted,
	// or never reserved). Errors wrapping it also wrap ErrUnknownRange.
	ErrDoubleFree = errors.New("slab: double free")
	// ErrRangeExists: Reserve or Split with an id that already holds pages.
	ErrRangeExists = errors.New("slab: range already exists")
	// ErrNotCommitted: Free of a range that is reserved but not committed (use Abort).
	ErrNotCommitted = errors.New("slab: range not committed")
	// ErrCommitted: Commit or Abort of a range that is already committed (use Free).
	ErrCommitted = errors.New("slab: range already committed")
)

// RangeError reports a failed allocator operation on one range.
type RangeError struct {
	Op     string  // "reserve", "commit", "abort", "free", "split"
	Range  RangeID // the range the operation named
	Detail string  // what was wrong, with the offending values
	Err    error   // a sentinel above (one or more, see errors.Is)
}

func (e *RangeError) Error() string {
	msg := fmt.Sprintf("slab: %s range %d: %s", e.Op, e.Range, strings.TrimPrefix(e.Err.Error(), "slab: "))
	if e.Detail != "" {
		msg += ": " + e.Detail
	}
	return msg
}

func (e *RangeError) Unwrap() error { return e.Err }

// Is makes a double free also match ErrUnknownRange.
func (e *RangeError) Is(target error) bool {
	return target == ErrUnknownRange && e.Err == ErrDoubleFree
}

func rangeErr(op string, id RangeID, err error, format string, args ...any) error {
	return &RangeError{Op: op, Range: id, Err: err, Detail: fmt.Sprintf(format, args...)}
}
