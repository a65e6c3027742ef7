package hostengine

import (
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/cpcache/cpcache/hicache/core"
	"github.com/cpcache/cpcache/hicache/engine"
	"github.com/cpcache/cpcache/hicache/kvmem"
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

	// The layered mode (NewKV): the engine's L1 as per-(layer, part) buffers and the L2
	// layout; nil kv is the flat-pool mode (l1, pageBytes).
	kv       *kvmem.L1
	l2Layout kvmem.L2Layout
	slabMem  engine.HostSlabMemory // LayerFirst: the slabs' whole memory

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

// NewKV returns an engine over an engine-lent host L1 (per-(layer, part) buffers) and slabs
// whose pages are in layout lay. Its tickets are layered (one layer per layout layer): a
// transfer copies layer 0 of every page, then layer 1, ..., and finishes each layer of the
// ticket as it lands, so a reader of layer 0 of a load waits for one layer's copies. A
// LayerFirst L2 needs slabs that hand out a slab's whole memory (engine.HostSlabMemory). The
// slabs' page size must be the shape's page bytes. Errors wrap core.ErrBadConfig.
func NewKV(slabs engine.HostSlabs, l1 *kvmem.L1, lay kvmem.L2Layout, opts Options) (*Engine, error) {
	switch {
	case slabs == nil:
		return nil, fmt.Errorf("%w: host engine needs slabs", core.ErrBadConfig)
	case l1 == nil:
		return nil, fmt.Errorf("%w: host engine needs an L1", core.ErrBadConfig)
	case l1.Device():
		return nil, fmt.Errorf("%w: host engine over a device L1", core.ErrBadConfig)
	case !lay.Valid():
		return nil, fmt.Errorf("%w: host engine L2 layout %s", core.ErrBadConfig, lay)
	case opts.Pool != nil:
		return nil, fmt.Errorf("%w: host engine with both an L1 and a flat pool", core.ErrBadConfig)
	}
	if ps, ok := slabs.(interface{ PageSize() int }); ok && int64(ps.PageSize()) != l1.Shape().PageBytes() {
		return nil, fmt.Errorf("%w: L2 pages of %d bytes, the L1's shape has pages of %d (%s)", core.ErrBadConfig, ps.PageSize(), l1.Shape().PageBytes(), l1.Shape())
	}
	e := &Engine{slabs: slabs, kv: l1, l2Layout: lay, pageBytes: int(l1.Shape().PageBytes())}
	if lay == kvmem.LayerFirst {
		m, ok := slabs.(engine.HostSlabMemory)
		if !ok {
			return nil, fmt.Errorf("%w: a layer_first L2 needs slabs with SlabMemory (%T has none)", core.ErrBadConfig, slabs)
		}
		e.slabMem = m
	}
	if opts.Workers <= 0 {
		opts.Workers = 2
	}
	e.opts = opts
	e.cond = sync.NewCond(&e.mu)
	for range opts.Workers {
		e.workers.Add(1)
		go e.work()
	}
	return e, nil
}

// KV returns the engine's layered L1 (nil in the flat-pool mode).
func (e *Engine) KV() *kvmem.L1 { return e.kv }

// L2Layout is the L2 layout of the layered mode (0 in the flat-pool mode).
func (e *Engine) L2Layout() kvmem.L2Layout { return e.l2Layout }

// L1Page returns L1 slot s's bytes (the flat-pool mode; a layered L1 has no page of
// contiguous bytes: use KV).
func (e *Engine) L1Page(s int32) ([]byte, error) {
	if e.kv != nil {
		return nil, fmt.Errorf("%w: L1 slot %d: a layered L1 has no contiguous page (use KV)", core.ErrBadArgument, s)
	}
	off := int(s) * e.pageBytes
	if s < 0 || off+e.pageBytes > len(e.l1) {
		return nil, fmt.Errorf("%w: L1 slot %d outside a pool of %d pages", core.ErrBadArgument, s, len(e.l1)/e.pageBytes)
	}
	return e.l1[off : off+e.pageBytes : off+e.pageBytes], nil
}

// Submit implements engine.Engine.
func (e *Engine) Submit(t core.Transfer) *engine.Ticket {
	tk := engine.NewTicket(t)
	if e.kv != nil {
		tk = engine.NewLayeredTicket(t, e.kv.Shape().Layers())
	}
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
		tk.Finish(e.run(tk))
	}
}

func (e *Engine) run(tk *engine.Ticket) error {
	t := tk.Transfer
	if e.opts.Delay != nil {
		time.Sleep(e.opts.Delay(t))
	}
	if e.opts.Fail != nil {
		if err := e.opts.Fail(t); err != nil {
			return err
		}
	}
	if e.kv != nil {
		return e.runLayered(tk)
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

// l2Page is where copy c's L2 page lives for kvmem's gather/scatter: the slab's memory,
// pages per slab and index (LayerFirst), or the page alone (PageFirst).
func (e *Engine) l2Page(c core.Copy) ([]byte, int, int, error) {
	if e.slabMem == nil {
		b, err := e.slabs.Page(c.L2)
		if err == nil && int64(len(b)) != e.kv.Shape().PageBytes() {
			err = fmt.Errorf("%w: L2 page (%d,%d) has %d bytes, the L1's pages %d", core.ErrBadConfig, c.L2.Slab, c.L2.Index, len(b), e.kv.Shape().PageBytes())
		}
		return b, 1, 0, err
	}
	if _, err := e.slabs.Page(c.L2); err != nil { // bounds, closed
		return nil, 0, 0, err
	}
	m, err := e.slabMem.SlabMemory(c.L2.Slab)
	return m, e.slabMem.PagesPerSlab(), c.L2.Index, err
}

// runLayered copies t layer by layer: layer 0 of every page, then layer 1, ..., finishing
// each layer of the ticket once it landed.
func (e *Engine) runLayered(tk *engine.Ticket) error {
	t := tk.Transfer
	type page struct {
		mem      []byte
		n, index int
	}
	pages := make([]page, len(t.Copies))
	for i, c := range t.Copies {
		m, n, idx, err := e.l2Page(c)
		if err != nil {
			return fmt.Errorf("hicache: %s of node %d: %w", t.Kind, t.Node, err)
		}
		pages[i] = page{m, n, idx}
	}
	for layer := range e.kv.Shape().Layers() {
		for i, c := range t.Copies {
			p := pages[i]
			var err error
			if t.Kind == core.Write {
				err = e.kv.GatherLayer(c.L1, layer, e.l2Layout, p.mem, p.n, p.index)
			} else {
				err = e.kv.ScatterLayer(c.L1, layer, e.l2Layout, p.mem, p.n, p.index)
			}
			if err != nil {
				return fmt.Errorf("hicache: %s of node %d: %w: %w", t.Kind, t.Node, core.ErrBadArgument, err)
			}
		}
		tk.FinishLayer(layer)
	}
	return nil
}
