package main

import (
	"fmt"
	"sync"

	"github.com/cpcache/cpcache/hicache"
	"github.com/cpcache/cpcache/hicache/engine"
)

// poolEngine is a hicache.Engine that copies pages between an L1 pool in host memory the
// Go runtime does not own — the engine's own KV buffer, or an anonymous mapping the library
// made — and host slabs, with worker goroutines. hostengine.Engine allocates its pool on
// the Go heap, whose addresses must not be handed to C.
type poolEngine struct {
	slabs     hicache.HostSlabs
	pool      []byte // l1Pages × pageBytes, outside the Go heap
	pageBytes int

	mu      sync.Mutex // protects queue, closed
	cond    *sync.Cond // signals queue changes and close
	queue   []*hicache.Ticket
	closed  bool
	workers sync.WaitGroup
}

const poolWorkers = 2

func newPoolEngine(slabs hicache.HostSlabs, pool []byte, pageBytes int) *poolEngine {
	e := &poolEngine{slabs: slabs, pool: pool, pageBytes: pageBytes}
	e.cond = sync.NewCond(&e.mu)
	for range poolWorkers {
		e.workers.Add(1)
		go e.work()
	}
	return e
}

// page returns L1 slot s of the pool.
func (e *poolEngine) page(s int32) ([]byte, error) {
	off := int(s) * e.pageBytes
	if s < 0 || off+e.pageBytes > len(e.pool) {
		return nil, fmt.Errorf("%w: L1 slot %d outside a pool of %d pages", errRange, s, len(e.pool)/e.pageBytes)
	}
	return e.pool[off : off+e.pageBytes : off+e.pageBytes], nil
}

// Submit implements hicache.Engine.
func (e *poolEngine) Submit(t hicache.Transfer) *hicache.Ticket {
	tk := engine.NewTicket(t)
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		tk.Finish(hicache.ErrClosed)
		return tk
	}
	e.queue = append(e.queue, tk)
	e.cond.Signal()
	return tk
}

// Cancel implements hicache.Engine.
func (e *poolEngine) Cancel() {
	e.mu.Lock()
	q := e.queue
	e.queue = nil
	e.mu.Unlock()
	for _, tk := range q {
		tk.Finish(hicache.ErrCanceled)
	}
}

// Close implements hicache.Engine: it cancels what has not started and waits for the rest.
func (e *poolEngine) Close() error {
	if e == nil {
		return nil
	}
	e.Cancel()
	e.mu.Lock()
	e.closed = true
	e.cond.Broadcast()
	e.mu.Unlock()
	e.workers.Wait()
	return nil
}

func (e *poolEngine) work() {
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

func (e *poolEngine) run(t hicache.Transfer) error {
	for _, c := range t.Copies {
		l1, err := e.page(c.L1)
		if err != nil {
			return fmt.Errorf("cpcache: %s of node %d: %w", t.Kind, t.Node, err)
		}
		l2, err := e.slabs.Page(c.L2)
		if err != nil {
			return fmt.Errorf("cpcache: %s of node %d: %w", t.Kind, t.Node, err)
		}
		if t.Kind == hicache.Write {
			copy(l2, l1)
		} else {
			copy(l1, l2)
		}
	}
	return nil
}
