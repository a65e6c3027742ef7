package main

/*
#include "../../csrc/cpcache_capi.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"unsafe"

	"github.com/cpcache/cpcache/hicache"
	"github.com/cpcache/cpcache/parallel"
	"github.com/cpcache/cpcache/slab"
	"github.com/cpcache/cpcache/storage"
)

// Sentinels of the C ABI's own checks; each maps to one status code.
var (
	errInvalid     = errors.New("cpcache: invalid argument")
	errSize        = errors.New("cpcache: wrong size")
	errRange       = errors.New("cpcache: out of range")
	errClosed      = errors.New("cpcache: closed")
	errAlreadyOpen = errors.New("cpcache: already open")
	errNode        = errors.New("cpcache: unknown node")
	errInternal    = errors.New("cpcache: internal error")
)

// statusOf maps an error to its CPCACHE_ERR_* code: the ABI's own sentinels first, then the
// packages' typed errors.
func statusOf(err error) C.int {
	switch {
	case err == nil:
		return C.CPCACHE_OK
	case errors.Is(err, errInvalid):
		return C.CPCACHE_ERR_INVALID
	case errors.Is(err, errSize):
		return C.CPCACHE_ERR_SIZE
	case errors.Is(err, errRange):
		return C.CPCACHE_ERR_RANGE
	case errors.Is(err, errClosed), errors.Is(err, hicache.ErrClosed):
		return C.CPCACHE_ERR_CLOSED
	case errors.Is(err, errAlreadyOpen):
		return C.CPCACHE_ERR_ALREADY_OPEN
	case errors.Is(err, errNode):
		return C.CPCACHE_ERR_NODE
	case errors.Is(err, hicache.ErrL1Full):
		return C.CPCACHE_ERR_L1_FULL
	case errors.Is(err, hicache.ErrNotStarted):
		return C.CPCACHE_ERR_NOT_STARTED
	case errors.Is(err, hicache.ErrBusy):
		return C.CPCACHE_ERR_BUSY
	case errors.Is(err, hicache.ErrPlacementDiverged):
		return C.CPCACHE_ERR_DIVERGED
	case errors.Is(err, parallel.ErrPeerLost):
		return C.CPCACHE_ERR_PEER_LOST
	case errors.Is(err, parallel.ErrTimeout), errors.Is(err, context.DeadlineExceeded):
		return C.CPCACHE_ERR_TIMEOUT
	case errors.Is(err, hicache.ErrBadConfig), errors.Is(err, hicache.ErrScope),
		errors.Is(err, parallel.ErrBadLayout), errors.Is(err, parallel.ErrBadEnv),
		errors.Is(err, parallel.ErrBadArgument), errors.Is(err, parallel.ErrMismatch),
		errors.Is(err, slab.ErrBadArgument), errors.Is(err, slab.ErrSpecMismatch),
		errors.Is(err, slab.ErrUnsupported), errors.Is(err, storage.ErrBadArgument):
		return C.CPCACHE_ERR_CONFIG
	case errors.Is(err, hicache.ErrPeerFailed):
		return C.CPCACHE_ERR_PEER_LOST
	case errors.Is(err, hicache.ErrBadArgument):
		return C.CPCACHE_ERR_INVALID
	case errors.Is(err, errInternal):
		return C.CPCACHE_ERR_INTERNAL
	default:
		return C.CPCACHE_ERR_IO
	}
}

// fail records err as the calling thread's last error and returns its status. An exported
// function runs on the C caller's thread for its whole duration, so the thread-local buffer
// is the caller's.
func fail(err error) C.int {
	code := statusOf(err)
	msg := err.Error()
	return C.cpcapi_set_error(code, (*C.char)(unsafe.Pointer(unsafe.StringData(msg))), C.size_t(len(msg)))
}

// result turns an error into a status (CPCACHE_OK for nil).
func result(err error) C.int {
	if err == nil {
		return C.CPCACHE_OK
	}
	return fail(err)
}

// guard turns a panic in an exported function into CPCACHE_ERR_INTERNAL: a bug in the
// library must not take the engine's process down. Use as `defer guard(&status)`.
func guard(status *C.int) {
	if r := recover(); r != nil {
		*status = fail(fmt.Errorf("%w: panic: %v\n%s", errInternal, r, debug.Stack()))
	}
}
