package hicache

import (
	"errors"
	"fmt"

	"github.com/cpcache/cpcache/hicache/core"
	"github.com/cpcache/cpcache/hicache/engine"
)

// Sentinel errors. Every error this package returns wraps one of them or a parallel/slab
// error. Most are defined where they arise (the core, the engine interface) and re-exported
// here, so callers need only this package.
var (
	// ErrScope: the consensus group does not cover the slab group (or is not the layout's
	// replica group). Returned by New; the message names both groups.
	ErrScope = errors.New("hicache: consensus group scope")
	// ErrLayoutMismatch: the ranks of the group were given different KV layouts
	// (Config.KVLayout). Returned by New on every rank as a *LayoutMismatchError.
	ErrLayoutMismatch = errors.New("hicache: KV layout differs across ranks")
	// The core's sentinels: see their documentation in package core.
	ErrPlacementDiverged = core.ErrPlacementDiverged
	ErrBusy              = core.ErrBusy
	ErrBadConfig         = core.ErrBadConfig
	ErrBadArgument       = core.ErrBadArgument
	ErrStaleHandle       = core.ErrStaleHandle
	ErrL1Full            = core.ErrL1Full
	// ErrPeerFailed: some rank of the group could not start (New's *StartError) or reported
	// a failure that the group agreed on.
	ErrPeerFailed = errors.New("hicache: a rank of the group failed")
	// ErrNotStarted: WaitL1 on a load-back that has not started yet; loads start at the Step
	// after LoadBack (after the Apply that checked the state they were chosen from).
	ErrNotStarted = errors.New("hicache: load not started")
	// ErrCanceled: a transfer was canceled before it ran (divergence, Close).
	ErrCanceled = engine.ErrCanceled
	// ErrClosed: the cache or the transfer engine was closed.
	ErrClosed = engine.ErrClosed
	// ErrUnsupported: the engine does not offer the call (WaitL1LayerOn on an engine that is
	// not a StreamWaiter).
	ErrUnsupported = engine.ErrUnsupported
)

// StartError is New's error on every rank of a group when some rank could not start: the
// lowest failing rank and its cause, identical on every rank (on the failing rank it also
// wraps that rank's own error). It wraps ErrPeerFailed.
type StartError struct {
	Rank  int    // the failing rank's global rank
	Group string // the consensus group's name
	Cause string // its error's text
	Err   error  // this rank's own error, when it is the failing rank
}

func (e *StartError) Error() string {
	return fmt.Sprintf("hicache: rank %d of group %s could not start: %s", e.Rank, e.Group, e.Cause)
}

func (e *StartError) Unwrap() []error { return []error{ErrPeerFailed, e.Err} }

// DivergedError is the error of the step that detected divergence (see core.DivergedError).
type DivergedError = core.DivergedError

// StaleHandleError is the error of a call given a handle that names no node (see
// core.StaleHandleError).
type StaleHandleError = core.StaleHandleError

// LayoutMismatchError is New's error on every rank of a group whose ranks were given
// different KV layouts (Config.KVLayout): the lowest rank whose layout differs from the
// group's first rank's, and the first difference (kvlayout.Layout.Diff, the first rank's
// value first). Identical on every rank; it wraps ErrLayoutMismatch.
type LayoutMismatchError struct {
	Rank  int    // the lowest differing rank's global rank
	First int    // the global rank of the group's first rank, whose layout it differs from
	Group string // the consensus group's name
	Diff  string // the first difference
}

func (e *LayoutMismatchError) Error() string {
	return fmt.Sprintf("hicache: KV layout of rank %d differs from rank %d's in group %s: %s", e.Rank, e.First, e.Group, e.Diff)
}

func (e *LayoutMismatchError) Unwrap() error { return ErrLayoutMismatch }

// SmallL2Warning is what New logs (Config.Log), once per job (on rank 0 of DP replica 0),
// when L2 holds no more pages than L1. The comparison is per slab against per rank: slab c holds the
// pages of CP rank c's L1 pool (page i of a sequence lives in pool and slab i mod C), so
// it equals the group's (C slabs against C pools); comparing one slab with the group's L1
// would mix a rank's share with the whole. Under write-through every L1 page has an L2
// copy, so such an L2 holds little beyond L1: with storage it is a staging area (a prefetch
// or a backup that finds it full frees the L2 copies of L1 pages storage holds, and the
// pages read from storage pass through it into L1), without storage it adds few hits.
// SGLang requires a host pool larger than the device pool.
type SmallL2Warning struct {
	L1Pages int  // L1 pages of each rank
	L2Pages int  // L2 pages of each slab
	Slabs   int  // slabs of the group (its CP size): the group holds Slabs times each
	Storage bool // an L3 tier is configured
}

func (w *SmallL2Warning) Error() string {
	what := "without storage it adds few hits beyond L1: give L2 more pages than L1"
	if w.Storage {
		what = "it is a staging area for storage: a prefetch or backup that finds it full frees the L2 copies of L1 pages storage holds, and pages read from storage pass through it into L1"
	}
	return fmt.Sprintf("hicache: warning: L2 holds no more pages than L1: %d pages per slab against %d L1 pages per rank "+
		"(slab c holds the pages of CP rank c's L1 pool; the group: %d against %d): every L1 page has an L2 copy under write-through, so L2 holds little beyond L1; %s",
		w.L2Pages, w.L1Pages, w.Slabs*w.L2Pages, w.Slabs*w.L1Pages, what)
}
