package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
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
}

// openHandle opens the process's session and returns its handle.
func openHandle(c *openConfig) (uint64, error) {
	lib.mu.Lock()
	defer lib.mu.Unlock()
	if s := lib.cur.Load(); s != nil {
		return 0, fmt.Errorf("%w: this process has cache %d open; close it first (one cache per process)", errAlreadyOpen, s.handle)
	}
	s, err := openSession(context.Background(), c, lib.nodeGen)
	if err != nil {
		return 0, err
	}
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
