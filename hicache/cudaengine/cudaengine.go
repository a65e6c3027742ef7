package cudaengine

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/cpcache/cpcache/cuda"
	"github.com/cpcache/cpcache/hicache/core"
	"github.com/cpcache/cpcache/hicache/engine"
	"github.com/cpcache/cpcache/slab"
)

// L2Addr resolves an L2 page to an address the CUDA driver can copy to and from (a device
// pointer, or a host pointer in the unified address space).
type L2Addr func(p slab.Page) (cuda.DevicePtr, error)

// DevicePageAddr resolves pages by their device address: device slabs (slab.Set over CUDA
// IPC memory) or pinned host slabs (their registered memory's device pointer; no reliance on
// CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM).
func DevicePageAddr(s interface {
	DevicePtr(p slab.Page) (uintptr, error)
}) L2Addr {
	return func(p slab.Page) (cuda.DevicePtr, error) {
		a, err := s.DevicePtr(p)
		return cuda.DevicePtr(a), err
	}
}

// Options tune an Engine.
type Options struct {
	// Spin makes the completion waiters spin on their events (lowest latency, one busy CPU
	// thread per direction while transfers are in flight) instead of blocking in the driver
	// (cuda.EventBlockingSync, the default).
	Spin bool
	// Streams is the number of streams (lanes) per direction, default 1. With more, the
	// transfers of a direction go to them in turn, so page copies of several transfers can
	// overlap on the bus; their tickets then finish in stream order per lane only.
	Streams int
	// PerTransfer makes SubmitStep enqueue every transfer as a copy call of its own instead
	// of one call per lane and direction for a step (to compare the two).
	PerTransfer bool
}

// Engine copies pages between a device L1 (a flat KV pool, L1 slot s at L1 + s × pageBytes,
// from New; or the inference engine's per-(layer, part) buffers, from NewKV) and L2 pages with
// the CUDA driver. Backups and loads each have Options.Streams lanes, used in
// turn: a lane is a stream, on which a step's transfers (SubmitStep), or one transfer
// (Submit), are enqueued as one batch (cuMemcpyBatchAsync where the driver has it) followed
// by an event, and a waiter goroutine that waits for the lane's events in stream order and
// finishes the tickets. Transfers are enqueued at Submit, so Cancel has nothing left to
// cancel; the driver's drain waits for them. Submit waits for copies only when the driver
// fails a copy call (or its event) after part of it was enqueued: the tickets then fail once
// that part is done, since a failed transfer's pages are freed or reused at once.
//
// The streams are non-blocking: KV the model wrote into L1 must be complete (its compute
// stream synchronized, or an event waited on) before the Step that starts its backups.
type Engine struct {
	dev         *cuda.Device
	l1          cuda.DevicePtr // the flat pool (New); 0 with a KV L1 (NewKV)
	l1Pages     int
	pageBytes   int
	kv          *kvPlan // the KV L1 and L2 layout (NewKV), or nil
	l2          L2Addr
	evFlags     cuda.EventFlags
	lanes       [2][]*lane       // by Kind
	next        [2]atomic.Uint64 // by Kind: copy calls enqueued, which picks the lane
	perTransfer bool             // Options.PerTransfer
	copyCalls   atomic.Int64     // copy calls enqueued (CopyCalls)
	copies      atomic.Int64     // driver copies enqueued (Copies)

	mu       sync.Mutex                   // protects inflight
	inflight map[*engine.Ticket]*inflight // the tickets enqueued and not yet finished, for WaitLayerOn

	// beforeEventWait, when set (tests only, before the first Submit), runs in a lane's
	// waiter before it waits for each event.
	beforeEventWait func()
}

// lane is one direction's stream, its transfers in flight and their waiter.
type lane struct {
	e      *Engine
	stream *cuda.Stream
	done   chan struct{} // closed when the waiter exits

	mu      sync.Mutex // protects pending, events, closed, batched, every pending's done and the stream's use
	cond    *sync.Cond // signals pending and closed
	pending []*inflight
	events  []*cuda.Event // free events
	closed  bool
	batched bool // the last batch used the driver's batch call
}

// inflight is one group of transfers enqueued on a lane: evs[i] is recorded after the copies
// of layer i (one event for the whole group when its tickets have one layer). The tickets
// finish layer i when evs[i] completes, and finish when the last one does.
type inflight struct {
	ln   *lane
	tks  []*engine.Ticket
	evs  []*cuda.Event
	done bool // the waiter is through with evs (given back to the lane's pool); under ln.mu
}

// New returns an engine over the L1 pool at l1 (l1Pages pages of pageBytes on
// dev) and the L2 pages l2 resolves. The caller keeps ownership of the memory.
func New(dev *cuda.Device, l1 cuda.DevicePtr, l1Pages, pageBytes int, l2 L2Addr, opts Options) (*Engine, error) {
	if l1Pages <= 0 || pageBytes <= 0 || l1 == 0 {
		return nil, fmt.Errorf("%w: CUDA engine L1 pool of %d pages × %d bytes at %v", core.ErrBadConfig, l1Pages, pageBytes, l1)
	}
	if l1Pages > math.MaxInt32 || pageBytes > math.MaxInt/l1Pages || uint64(l1) > math.MaxUint64-uint64(l1Pages*pageBytes) { // slots are int32
		return nil, fmt.Errorf("%w: CUDA engine L1 pool of %d pages × %d bytes at %v overflows", core.ErrBadConfig, l1Pages, pageBytes, l1)
	}
	if dev == nil || l2 == nil {
		return nil, fmt.Errorf("%w: CUDA engine needs a device and an L2 address resolver (device %v, resolver %v)", core.ErrBadConfig, dev != nil, l2 != nil)
	}
	e := &Engine{dev: dev, l1: l1, l1Pages: l1Pages, pageBytes: pageBytes, l2: l2}
	return e.start(opts)
}

// start makes the lanes and their waiters.
func (e *Engine) start(opts Options) (*Engine, error) {
	e.evFlags = cuda.EventDisableTiming
	if !opts.Spin {
		e.evFlags |= cuda.EventBlockingSync
	}
	e.perTransfer = opts.PerTransfer
	e.inflight = make(map[*engine.Ticket]*inflight)
	for k := range e.lanes {
		for range max(opts.Streams, 1) {
			s, err := e.dev.NewStream()
			if err != nil {
				e.Close()
				return nil, fmt.Errorf("hicache: CUDA engine: %w", err)
			}
			ln := &lane{e: e, stream: s, done: make(chan struct{})}
			ln.cond = sync.NewCond(&ln.mu)
			e.lanes[k] = append(e.lanes[k], ln)
			go ln.wait()
		}
	}
	return e, nil
}

// Batched reports whether the last backup used the driver's batch copy call.
func (e *Engine) Batched() bool {
	lanes := e.lanes[core.Write]
	ln := lanes[(e.next[core.Write].Load()+uint64(len(lanes))-1)%uint64(len(lanes))]
	ln.mu.Lock()
	defer ln.mu.Unlock()
	return ln.batched
}

// Submit implements Engine: t is a batch of its own.
func (e *Engine) Submit(t core.Transfer) *engine.Ticket {
	return e.SubmitStep([]core.Transfer{t})[0]
}

// SubmitStep implements engine.StepSubmitter: the transfers of each direction are split into
// as many contiguous groups as that direction has lanes (fewer if there are fewer
// transfers), and each group goes to a lane as one copy call (cuMemcpyBatchAsync where the
// driver has it) and one completion event, whose tickets finish together. With
// Options.PerTransfer every transfer is a group. A transfer whose pages do not resolve
// fails alone.
//
// With a KV L1 (NewKV) a load group is one copy call and one event per layer, layer 0 of
// every page of the group first, and its tickets are layered (engine.NewLayeredTicket): layer
// i finishes when its event completes, in order. A backup group stays one copy call and one
// event for all its chunks.
func (e *Engine) SubmitStep(ts []core.Transfer) []*engine.Ticket {
	tks := make([]*engine.Ticket, len(ts))
	var copies [2][][][]cuda.Copy1 // by Kind: the copies of each transfer to enqueue, by layer
	var queued [2][]*engine.Ticket
	for i, t := range ts {
		tks[i] = engine.NewLayeredTicket(t, e.ticketLayers(t.Kind))
		cp, err := e.copiesOf(t)
		switch {
		case err != nil:
			tks[i].Finish(err)
		case len(t.Copies) == 0:
			tks[i].Finish(nil)
		default:
			copies[t.Kind] = append(copies[t.Kind], cp)
			queued[t.Kind] = append(queued[t.Kind], tks[i])
		}
	}
	for k, lanes := range e.lanes {
		n := len(queued[k])
		if n == 0 {
			continue
		}
		groups := min(n, len(lanes)) // New makes at least one lane per direction
		if e.perTransfer {
			groups = n
		}
		for g := range groups {
			lo, hi := g*n/groups, (g+1)*n/groups
			ln := lanes[(e.next[k].Add(1)-1)%uint64(len(lanes))]
			e.enqueue(ln, queued[k][lo:hi], byLayer(copies[k][lo:hi]))
		}
	}
	return tks
}

// ticketLayers is the number of layers a ticket of kind k reports: a KV engine's loads
// complete layer by layer, everything else as a whole.
func (e *Engine) ticketLayers(k core.Kind) int {
	if e.kv != nil && k == core.Load {
		return e.kv.layers
	}
	return 1
}

// byLayer joins the copies of a group's transfers layer by layer: layer i of every transfer,
// in transfer order, is the group's layer i.
func byLayer(ts [][][]cuda.Copy1) [][]cuda.Copy1 {
	out := make([][]cuda.Copy1, len(ts[0]))
	for i := range out {
		n := 0
		for _, t := range ts {
			n += len(t[i])
		}
		out[i] = make([]cuda.Copy1, 0, n)
		for _, t := range ts {
			out[i] = append(out[i], t[i]...)
		}
	}
	return out
}

// copiesOf resolves t's pages into driver copies, grouped by the layers of t's ticket (one
// group for a ticket of one layer).
func (e *Engine) copiesOf(t core.Transfer) ([][]cuda.Copy1, error) {
	if e.kv != nil {
		cp, err := e.kv.copies(t, e.l2)
		if err != nil || e.ticketLayers(t.Kind) == len(cp) {
			return cp, err
		}
		return [][]cuda.Copy1{slices.Concat(cp...)}, nil
	}
	copies := make([]cuda.Copy1, 0, len(t.Copies))
	for _, c := range t.Copies {
		if c.L1 < 0 || int(c.L1) >= e.l1Pages {
			return nil, fmt.Errorf("hicache: %s of node %d: %w: L1 slot %d outside a pool of %d pages", t.Kind, t.Node, core.ErrBadArgument, c.L1, e.l1Pages)
		}
		l1 := e.l1.Add(int(c.L1) * e.pageBytes)
		l2, err := e.l2(c.L2)
		if err != nil {
			return nil, fmt.Errorf("hicache: %s of node %d: %w", t.Kind, t.Node, err)
		}
		if t.Kind == core.Write {
			copies = append(copies, cuda.Copy1{Dst: l2, Src: l1, Size: e.pageBytes})
		} else {
			copies = append(copies, cuda.Copy1{Dst: l1, Src: l2, Size: e.pageBytes})
		}
	}
	return [][]cuda.Copy1{copies}, nil
}

// enqueue puts layers, the copies of the transfers of tks by layer, on ln's stream: each
// layer as one copy call followed by one event. On failure it fails every ticket.
func (e *Engine) enqueue(ln *lane, tks []*engine.Ticket, layers [][]cuda.Copy1) {
	fail := func(err error, what string) {
		for _, tk := range tks {
			tk.Finish(fmt.Errorf("hicache: %s of node %d: %s%w", tk.Transfer.Kind, tk.Transfer.Node, what, err))
		}
	}
	p := &inflight{ln: ln, tks: tks}
	// syncFail fails the tickets once the stream is done: copies enqueued before the error
	// may be running, and the pages are not free for reuse until they are done. The events
	// recorded so far go back to the pool.
	syncFail := func(err error, what string) {
		if serr := ln.stream.Synchronize(); serr != nil {
			err = errors.Join(err, serr)
		}
		ln.events = append(ln.events, p.evs...)
		fail(err, what)
	}
	ln.mu.Lock()
	defer ln.mu.Unlock()
	if ln.closed {
		fail(engine.ErrClosed, "")
		return
	}
	for i, copies := range layers {
		batched, err := ln.stream.CopyBatch(copies)
		if err != nil {
			if len(layers) > 1 {
				err = fmt.Errorf("layer %d: %w", i, err)
			}
			syncFail(err, "")
			return
		}
		ln.batched = batched
		e.copyCalls.Add(1)
		e.copies.Add(int64(len(copies)))
		var ev *cuda.Event
		if n := len(ln.events); n > 0 {
			ev, ln.events = ln.events[n-1], ln.events[:n-1]
		} else {
			ev, err = e.dev.NewEvent(e.evFlags)
		}
		if err == nil {
			err = ev.Record(ln.stream)
		}
		if err != nil {
			syncFail(err, "completion event: ") // without an event the completion is the stream's
			ev.Close()
			return
		}
		p.evs = append(p.evs, ev)
	}
	e.mu.Lock()
	for _, tk := range tks {
		e.inflight[tk] = p
	}
	e.mu.Unlock()
	ln.pending = append(ln.pending, p)
	ln.cond.Signal()
}

// CopyCalls returns the copy calls enqueued so far: one per batch of pages (a transfer, or
// with SubmitStep a group of a step's transfers), and with a KV L1 one per layer of a load.
func (e *Engine) CopyCalls() int64 { return e.copyCalls.Load() }

// Copies returns the driver copies enqueued so far (the entries of the copy calls).
func (e *Engine) Copies() int64 { return e.copies.Load() }

// wait finishes the lane's tickets as their events complete, in stream order: layer by layer
// for layered tickets.
func (ln *lane) wait() {
	defer close(ln.done)
	ln.mu.Lock()
	defer ln.mu.Unlock()
	for {
		for len(ln.pending) == 0 && !ln.closed {
			ln.cond.Wait()
		}
		if len(ln.pending) == 0 {
			return
		}
		p := ln.pending[0]
		ln.mu.Unlock()
		var err error
		for i, ev := range p.evs {
			if hook := ln.e.beforeEventWait; hook != nil {
				hook()
			}
			if err = ev.Synchronize(); err != nil {
				break
			}
			for _, tk := range p.tks {
				tk.FinishLayer(i)
			}
		}
		for _, tk := range p.tks {
			tk.Finish(err)
		}
		ln.mu.Lock()
		p.done = true
		ln.pending[0] = nil
		ln.pending = ln.pending[1:]
		ln.events = append(ln.events, p.evs...)
		ln.mu.Unlock()
		ln.e.mu.Lock()
		for _, tk := range p.tks {
			delete(ln.e.inflight, tk)
		}
		ln.e.mu.Unlock()
		ln.mu.Lock()
	}
}

// WaitLayerOn implements engine.StreamWaiter: it enqueues on stream a wait
// (cuStreamWaitEvent) for the event recorded after layer layer of tk's copies (its last event
// for a layer at or beyond tk.Layers(), and for a ticket of one layer), so the stream's later
// work runs once that layer has landed; the host thread does not wait. A ticket whose copies
// are done needs no wait: nil, or the transfer's error.
func (e *Engine) WaitLayerOn(tk *engine.Ticket, layer int, stream uintptr) error {
	if tk == nil || layer < 0 {
		return fmt.Errorf("hicache: CUDA engine: %w: wait for layer %d of ticket %p", core.ErrBadArgument, layer, tk)
	}
	e.mu.Lock()
	p := e.inflight[tk]
	e.mu.Unlock()
	if p != nil {
		p.ln.mu.Lock()
		defer p.ln.mu.Unlock()
		if !p.done { // the events are this group's until the waiter gives them back
			ev := p.evs[min(layer, len(p.evs)-1)]
			if err := ev.StreamWait(stream); err != nil {
				return fmt.Errorf("hicache: %s of node %d: wait for layer %d on stream 0x%x: %w", tk.Transfer.Kind, tk.Transfer.Node, layer, stream, err)
			}
			return nil
		}
	}
	if !tk.Finished() {
		return fmt.Errorf("hicache: CUDA engine: %w: the ticket of the %s of node %d is not in flight on this engine", core.ErrBadArgument, tk.Transfer.Kind, tk.Transfer.Node)
	}
	return tk.Err()
}

// Cancel implements Engine: transfers are enqueued on their stream at Submit, so there is
// nothing that has not started; the caller waits for the tickets.
func (e *Engine) Cancel() {}

// Close waits for every enqueued transfer, stops the waiters and releases streams and
// events. Nil-safe and idempotent.
func (e *Engine) Close() error {
	if e == nil {
		return nil
	}
	var errs []error
	for _, lanes := range e.lanes {
		for _, ln := range lanes {
			ln.mu.Lock()
			done := ln.closed
			ln.closed = true
			ln.cond.Broadcast()
			ln.mu.Unlock()
			<-ln.done // the waiter finishes every pending transfer before it exits
			if done {
				continue
			}
			for _, ev := range ln.events {
				errs = append(errs, ev.Close())
			}
			errs = append(errs, ln.stream.Close())
		}
	}
	return errors.Join(errs...)
}
