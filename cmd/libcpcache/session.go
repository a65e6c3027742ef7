package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cpcache/cpcache/parallel"
)

// lib is the process's registry: at most one open session — a process is one rank of one
// job, and the slab backends a session registers (cudaslab) are process-wide.
var lib struct {
	mu   sync.Mutex              // protects next and nodeGen, and serialises open and close
	next uint64                  // the next cache handle (handles are never reused)
	cur  atomic.Pointer[session] // the open session, nil when none
	// nodeGen is the last node-handle generation of a closed session: a later session's
	// generations start above it (agreed across the job: see openSession), so that a node
	// handle of a closed cache never names a node of the next one.
	nodeGen uint64
	// opening cancels the open in flight (nil when none): cpcache_abort(0). Its own lock,
	// since lib.mu is held through the open.
	openingMu sync.Mutex
	opening   context.CancelFunc
}

// openHandle opens the process's session and returns its handle.
func openHandle(c *openConfig) (uint64, error) {
	lib.mu.Lock()
	defer lib.mu.Unlock()
	if s := lib.cur.Load(); s != nil {
		return 0, fmt.Errorf("%w: this process has cache %d open; close it first (one cache per process)", errAlreadyOpen, s.handle)
	}
	ctx, cancel := context.WithCancel(context.Background())
	lib.openingMu.Lock()
	lib.opening = cancel
	lib.openingMu.Unlock()
	s, err := openSession(ctx, c, lib.nodeGen)
	lib.openingMu.Lock()
	lib.opening = nil
	lib.openingMu.Unlock()
	if err != nil {
		if ctx.Err() != nil { // cancelled by cpcache_abort(0), not below
			err = fmt.Errorf("%w: the open was aborted (cpcache_abort) while it waited for the other ranks: %w", parallel.ErrPeerLost, err)
		}
		cancel()
		return 0, err
	}
	// The session's collectives run under a context of their own, which cpcache_abort
	// cancels (the open's ended with the open).
	cancel()
	s.ctx, s.cancel = context.WithCancel(context.Background())
	lib.next++
	s.handle = lib.next
	lib.cur.Store(s)
	return s.handle, nil
}

// closeHandle closes session h; closing a closed handle does nothing.
func closeHandle(h uint64) error {
	lib.mu.Lock()
	defer lib.mu.Unlock()
	s := lib.cur.Load()
	if s == nil || s.handle != h {
		if h == 0 || h > lib.next {
			return fmt.Errorf("%w: cache handle %d was never opened", errClosed, h)
		}
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	lib.cur.Store(nil)
	lib.nodeGen = max(lib.nodeGen, s.cache.Generation())
	return s.close()
}

// abortHandle cancels the collective that session h (0: the open in flight) waits in, so
// that it returns at once, and closes the session for this rank: its peers see it leave as
// when it closes. Bounded: with shared-memory consensus the waiting collective sees the
// cancellation within its poll interval; a Gloo collective already inside Gloo cannot be
// cancelled, and the close waits for it to end (its peers, or its deadline). Aborting a closed
// handle, or 0 with no open in flight, does nothing.
func abortHandle(h uint64) error {
	if h == 0 {
		lib.openingMu.Lock()
		cancel := lib.opening
		lib.openingMu.Unlock()
		if cancel != nil {
			cancel()
		}
		return nil
	}
	if s := lib.cur.Load(); s != nil && s.handle == h && s.cancel != nil {
		s.cancel()
		// Let the collective in flight see the cancellation before the close: it then tells
		// its peers that this rank gave up on the round (a round this rank had arrived at
		// would otherwise complete for them as if it took part). A shared-memory waiter sees
		// it within its poll interval; a Gloo collective does not, and the close waits for it.
		for end := time.Now().Add(abortGrace); s.collectives.Load() > 0 && time.Now().Before(end); {
			time.Sleep(time.Millisecond)
		}
	}
	return closeHandle(h)
}

// abortGrace bounds how long cpcache_abort waits for the collective in flight to return
// after its cancellation, before it closes the session anyway.
const abortGrace = time.Second

// use returns the open session named h, locked; the caller unlocks s.mu.
func use(h uint64) (*session, error) {
	s := lib.cur.Load()
	if s == nil || s.handle != h {
		return nil, fmt.Errorf("%w: cache handle %d is not open", errClosed, h)
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, fmt.Errorf("%w: cache handle %d is not open", errClosed, h)
	}
	return s, nil
}
