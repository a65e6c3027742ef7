package hostengine

import (
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/cpcache/cpcache/hicache/core"
	"github.com/cpcache/cpcache/hicache/engine"
)

// Options tune an Engine.
type Options struct {
	Workers int // copy goroutines (default 2)
	// Pool, when set, is the L1 pool (l1Pages × pageBytes bytes) owned by the caller, e.g. an
	// engine's KV buffer outside the Go heap; nil: the engine allocates it.
	Pool []byte
	// Delay, when set, is slept before each transfer's copies (tests: random per-rank copy
	// delays). Called from worker goroutines.
	Delay func(core.Transfer) time.Duration
	// Fail, when set, makes a transfer fail with the returned error instead of copying
	// (tests: injected copy failures).
	Fail func(core.Transfer) error
}

// Engine copies pages between a host L1 pool and host slabs with worker goroutines.
type Engine struct {
	slabs     engine.HostSlabs
	l1        []byte
	pageBytes int
	opts      Options

	mu      sync.Mutex       // protects queue, closed
	cond    *sync.Cond       // signals queue changes and close
	queue   []*engine.Ticket // submitted, not yet started
	closed  bool
	workers sync.WaitGroup
}

// New returns an engine over an L1 pool of l1Pages pages of pageBytes each (opts.Pool, or
// one it allocates) and the given slabs.
func New(slabs engine.HostSlabs, l1Pages, pageBytes int, opts Options) (*Engine, error) {
	if slabs == nil {
		return nil, fmt.Errorf("%w: host engine needs slabs", core.ErrBadConfig)
	}
	if l1Pages <= 0 || pageBytes <= 0 {
		return nil, fmt.Errorf("%w: host engine L1 pool of %d pages × %d bytes", core.ErrBadConfig, l1Pages, pageBytes)
	}
	if l1Pages > math.MaxInt32 || pageBytes > math.MaxInt/l1Pages { // slots are int32
		return nil, fmt.Errorf("%w: host engine L1 pool of %d pages × %d bytes overflows", core.ErrBadConfig, l1Pages, pageBytes)
	}
	if opts.Workers <= 0 {
		opts.Workers = 2
	}
	l1 := opts.Pool
	switch {
	case l1 == nil:
		l1 = make([]byte, l1Pages*pageBytes)
	case len(l1) != l1Pages*pageBytes:
		return nil, fmt.Errorf("%w: host engine pool of %d bytes for %d pages × %d bytes", core.ErrBadConfig, len(l1), l1Pages, pageBytes)
	}
	e := &Engine{slabs: slabs, l1: l1, pageBytes: pageBytes, opts: opts}
	e.cond = sync.NewCond(&e.mu)
	for range opts.Workers {
		e.workers.Add(1)
		go e.work()
	}
	return e, nil
}

// L1Page returns L1 slot s's bytes.
func (e *Engine) L1Page(s int32) ([]byte, error) {
	off := int(s) * e.pageBytes
	if s < 0 || off+e.pageBytes > len(e.l1) {
		return nil, fmt.Errorf("%w: L1 slot %d outside a pool of %d pages", core.ErrBadArgument, s, len(e.l1)/e.pageBytes)
	}
	return e.l1[off : off+e.pageBytes : off+e.pageBytes], nil
}

// Submit implements engine.Engine.
func (e *Engine) Submit(t core.Transfer) *engine.Ticket {
	tk := engine.NewTicket(t)
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		tk.Finish(engine.ErrClosed)
		return tk
	}
	e.queue = append(e.queue, tk)
	e.cond.Signal()
	return tk
}

// Cancel implements engine.Engine.
func (e *Engine) Cancel() {
	e.mu.Lock()
	q := e.queue
	e.queue = nil
	e.mu.Unlock()
	for _, tk := range q {
		tk.Finish(engine.ErrCanceled)
	}
}

// Close implements engine.Engine.
func (e *Engine) Close() error {
	if e == nil {
		return nil
	}
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil
	}
	e.closed = true
	e.cond.Broadcast()
	e.mu.Unlock()
	e.Cancel()
	e.workers.Wait()
	return nil
}

func (e *Engine) work() {
	defer e.workers.Done()
	for {
		e.mu.Lock()
		for len(e.queue) == 0 && !e.closed {
			e.cond.Wait()
		}
		if len(e.queue) == 0 {
			e.mu.Unlock()
			return
		}
		tk := e.queue[0]
		e.queue = e.queue[1:]
		e.mu.Unlock()
		tk.Finish(e.run(tk.Transfer))
	}
}

func (e *Engine) run(t core.Transfer) error {
	if e.opts.Delay != nil {
		time.Sleep(e.opts.Delay(t))
	}
	if e.opts.Fail != nil {
		if err := e.opts.Fail(t); err != nil {
			return err
		}
	}
	for _, c := range t.Copies {
		l1, err := e.L1Page(c.L1)
		if err != nil {
			return fmt.Errorf("hicache: %s of node %d: %w", t.Kind, t.Node, err)
		}
		l2, err := e.slabs.Page(c.L2)
		if err != nil {
			return fmt.Errorf("hicache: %s of node %d: %w", t.Kind, t.Node, err)
		}
		if len(l2) != len(l1) { // a partial copy would serve wrong bytes
			return fmt.Errorf("hicache: %s of node %d: %w: L2 page (%d,%d) has %d bytes, L1 pages %d", t.Kind, t.Node, core.ErrBadConfig, c.L2.Slab, c.L2.Index, len(l2), len(l1))
		}
		if t.Kind == core.Write {
			copy(l2, l1)
		} else {
			copy(l1, l2)
		}
	}
	return nil
}
