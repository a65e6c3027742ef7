package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/cpcache/cpcache/hicache"
)

// lib is the process's registry: at most one open session (a cache joins one job; its
// rendezvous and shared-memory names are per process).
var lib struct {
	mu   sync.Mutex              // protects next and serialises open and close
	next uint64                  // the next cache handle (handles are never reused)
	cur  atomic.Pointer[session] // the open session, nil when none
}

// openHandle opens the process's session and returns its handle.
func openHandle(c *openConfig) (uint64, error) {
	lib.mu.Lock()
	defer lib.mu.Unlock()
	if s := lib.cur.Load(); s != nil {
		return 0, fmt.Errorf("%w: this process has cache %d open; close it first (one cache per process)", errAlreadyOpen, s.handle)
	}
	s, err := openSession(context.Background(), c)
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

// tokenSlice views n C tokens; NULL is accepted only with n == 0.
func tokenSlice(p unsafe.Pointer, n uint64, what string) ([]int32, error) {
	switch {
	case n == 0:
		return nil, nil
	case p == nil:
		return nil, fmt.Errorf("%w: %s is NULL with n = %d", errInvalid, what, n)
	case n > 1<<40:
		return nil, fmt.Errorf("%w: %s length %d", errInvalid, what, n)
	}
	return unsafe.Slice((*int32)(p), n), nil
}

// needCap checks a caller's buffer for up to pages entries: NULL with capacity 0 means "not
// wanted" when allowNull; otherwise it must hold them all, so that a replicated call never
// stops half-way on one rank.
func needCap(p unsafe.Pointer, capacity uint64, pages int, what string, allowNull bool) error {
	if p == nil {
		if allowNull && capacity == 0 {
			return nil
		}
		return fmt.Errorf("%w: %s is NULL (capacity %d)", errInvalid, what, capacity)
	}
	if capacity < uint64(pages) {
		return fmt.Errorf("%w: %s holds %d entries, the call may return %d (n / page_tokens)", errSize, what, capacity, pages)
	}
	return nil
}

// latencyQuantiles returns the median and p99 of the consensus latencies.
func latencyQuantiles(lat []time.Duration) (median, p99 time.Duration) {
	if len(lat) == 0 {
		return 0, 0
	}
	slices.Sort(lat)
	return lat[len(lat)/2], lat[min(len(lat)-1, len(lat)*99/100)]
}

// stepped is called, under s.mu, after every Step that returned err. A divergence puts the
// group into quarantine, which ends at the first all-idle step with a reset of the tree on
// every rank (Stats.Recoveries): node handles from before it are then stale, as after a
// flush. Only a quarantined session pays for reading the stats.
func (s *session) stepped(err error) {
	if errors.Is(err, hicache.ErrPlacementDiverged) {
		s.quarantined = true
	}
	if s.quarantined && err == nil {
		if r := s.cache.Stats().Recoveries; r != s.recoveries {
			s.recoveries, s.quarantined = r, false
			s.nodes.init()
		}
	}
	s.nodes.sweep()
}

// flushed is called after a successful Flush: every handle from before it is stale.
func (s *session) flushed() { s.nodes.init() }
