package hicache

import (
	"errors"

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
	// ErrPlacementDiverged: the consensus step found that the replicas of the cache metadata
	// differ (placement digest, tree digest or configuration fingerprint).
	ErrPlacementDiverged = core.ErrPlacementDiverged
	// ErrBusy: Flush while backups, loads or locks are outstanding. Nothing changed.
	ErrBusy = core.ErrBusy
	// ErrBadConfig: a configuration value that cannot work; the message names it.
	ErrBadConfig = core.ErrBadConfig
	// ErrBadArgument: a call with an argument that cannot be valid.
	ErrBadArgument = core.ErrBadArgument
	// ErrL1Full: not enough L1 pages could be freed for an insert or a load-back.
	ErrL1Full = core.ErrL1Full
	// ErrCanceled: a transfer was canceled before it ran (divergence, Close).
	ErrCanceled = engine.ErrCanceled
	// ErrClosed: the cache or the transfer engine was closed.
	ErrClosed = engine.ErrClosed
)

// DivergedError is the error of the step that detected divergence (see core.DivergedError).
type DivergedError = core.DivergedError
