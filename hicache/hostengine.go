package hicache

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cpcache/cpcache/slab"
)

// HostSlabs is the L2 side of a HostEngine: host-mapped slab pages (slab.Set and
// kvtest.MemSlabs implement it).
type HostSlabs interface {
	Page(p slab.Page) ([]byte, error)
}

// HostEngineOptions tune a HostEngine.
type HostEngineOptions struct {
	Workers int // copy goroutines (default 2)
	// Delay, when set, is slept before each transfer's copies (tests: random per-rank copy
	// delays). Called from worker goroutines.
	Delay func(Transfer) time.Duration
	// Fail, when set, makes a transfer fail with the returned error instead of copying
	// (tests: injected copy failures).
	Fail func(Transfer) error
}

// HostEngine copies pages between a host L1 pool and host slabs with worker goroutines.
type HostEngine struct {
	slabs     HostSlabs
	l1        []byte
	pageBytes int
	opts      HostEngineOptions

	mu      sync.Mutex // protects queue, closed
	cond    *sync.Cond // signals queue changes and close
	queue   []*Ticket  // submitted, not yet started
	closed  bool
	workers sync.WaitGroup
	pages   [2]atomic.Int64 // pages copied by kind (Write, Load)
}

// NewHostEngine returns an engine over an L1 pool of l1Pages pages of pageBytes each (it
// allocates the pool) and the given slabs.
func NewHostEngine(slabs HostSlabs, l1Pages, pageBytes int, opts HostEngineOptions) (*HostEngine, error) {
	if slabs == nil {
		return nil, fmt.Errorf("%w: host engine needs slabs", ErrBadConfig)
	}
	if l1Pages <= 0 || pageBytes <= 0 {
		return nil, fmt.Errorf("%w: host engine L1 pool of %d pages × %d bytes", ErrBadConfig, l1Pages, pageBytes)
	}
	if opts.Workers <= 0 {
		opts.Workers = 2
	}
	e := &HostEngine{slabs: slabs, l1: make([]byte, l1Pages*pageBytes), pageBytes: pageBytes, opts: opts}
	e.cond = sync.NewCond(&e.mu)
	for range opts.Workers {
		e.workers.Add(1)
		go e.work()
	}
	return e, nil
}

// L1Page returns L1 slot s's bytes.
func (e *HostEngine) L1Page(s int32) ([]byte, error) {
	off := int(s) * e.pageBytes
	if s < 0 || off+e.pageBytes > len(e.l1) {
		return nil, fmt.Errorf("%w: L1 slot %d outside a pool of %d pages", ErrBadArgument, s, len(e.l1)/e.pageBytes)
	}
	return e.l1[off : off+e.pageBytes : off+e.pageBytes], nil
}

// PagesCopied returns the pages this engine copied, by kind.
func (e *HostEngine) PagesCopied(k Kind) int64 { return e.pages[k].Load() }

// Submit implements Engine.
func (e *HostEngine) Submit(t Transfer) *Ticket {
	tk := NewTicket(t)
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		tk.Finish(ErrClosed)
		return tk
	}
	e.queue = append(e.queue, tk)
	e.cond.Signal()
	return tk
}

// Cancel implements Engine.
func (e *HostEngine) Cancel() {
	e.mu.Lock()
	q := e.queue
	e.queue = nil
	e.mu.Unlock()
	for _, tk := range q {
		tk.Finish(ErrCanceled)
	}
}

// Close implements Engine.
func (e *HostEngine) Close() error {
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

func (e *HostEngine) work() {
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

func (e *HostEngine) run(t Transfer) error {
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
		if t.Kind == Write {
			copy(l2, l1)
		} else {
			copy(l1, l2)
		}
	}
	e.pages[t.Kind].Add(int64(len(t.Copies)))
	return nil
}
