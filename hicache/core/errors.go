package core

import (
	"errors"
	"fmt"
)

// Sentinel errors of the core; package hicache re-exports them.
var (
	// ErrPlacementDiverged: the consensus step found that the replicas of the cache metadata
	// differ (placement digest, tree digest or configuration fingerprint). Every rank of the
	// group returns it at the same step, and the group is in quarantine until its recovery.
	ErrPlacementDiverged = errors.New("core: placement diverged")
	// ErrBusy: Flush while backups, loads or locks are outstanding. Nothing changed.
	ErrBusy = errors.New("core: busy")
	// ErrBadConfig: a configuration value that cannot work; the message names it.
	ErrBadConfig = errors.New("core: bad config")
	// ErrBadArgument: a call with an argument that cannot be valid (a handle that names no
	// node, an unlock without a lock).
	ErrBadArgument = errors.New("core: bad argument")
	// ErrStaleHandle: a Handle that names no node of the tree: 0, from before a reset (Flush,
	// a recovery) or another cache, or of a node evicted since. Errors wrapping it are
	// *StaleHandleError and wrap ErrBadArgument too.
	ErrStaleHandle = errors.New("core: stale node handle")
	// ErrL1Full: not enough L1 pages could be freed for an insert or a load-back (every
	// candidate is locked or has I/O in flight). Replicated: every rank sees it at once.
	ErrL1Full = errors.New("core: L1 full")
)

// DivergedError is the error of the step that detected divergence. It wraps
// ErrPlacementDiverged and is identical on every rank except for Local.
type DivergedError struct {
	Step  uint64 // the consensus step (0-based count of Step calls)
	What  string // "placement digest", "tree digest" or "config fingerprint"
	Min   int64  // smallest value contributed by any rank
	Max   int64  // largest value contributed by any rank
	Local int64  // this rank's value
	// Cause, when the driver knows it, is why the ranks differ: ranks that called Step a
	// different number of times, or made different numbers of calls between steps.
	Cause string
}

func (e *DivergedError) Error() string {
	s := fmt.Sprintf("core: placement diverged at step %d: %s differs across ranks (min %#x, max %#x, this rank %#x); quarantined (no hits) until every rank is idle",
		e.Step, e.What, e.Min, e.Max, e.Local)
	if e.Cause != "" {
		s += ": " + e.Cause
	}
	return s
}

func (e *DivergedError) Unwrap() error { return ErrPlacementDiverged }
