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

// Engine copies pages between a device KV pool (L1 slot s at L1 + s × pageBytes) and
// L2 pages with the CUDA driver. Backups and loads each have Options.Streams lanes, used in
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
	l1          cuda.DevicePtr
	l1Pages     int
	pageBytes   int
	l2          L2Addr
	evFlags     cuda.EventFlags
	lanes       [2][]*lane       // by Kind
	next        [2]atomic.Uint64 // by Kind: copy calls enqueued, which picks the lane
	perTransfer bool             // Options.PerTransfer
	copyCalls   atomic.Int64     // copy calls enqueued (CopyCalls)
}

// lane is one direction's stream, its transfers in flight and their waiter.
type lane struct {
	stream *cuda.Stream
	done   chan struct{} // closed when the waiter exits

	mu      sync.Mutex // protects pending, events, closed, batched and the stream's use
	cond    *sync.Cond // signals pending and closed
	pending []cudaPending
	events  []*cuda.Event // free events
	closed  bool
	batched bool // the last batch used the driver's batch call
}

// cudaPending is one copy call in flight: its transfers finish when ev completes.
type cudaPending struct {
	tks []*engine.Ticket
	ev  *cuda.Event
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
	e := &Engine{dev: dev, l1: l1, l1Pages: l1Pages, pageBytes: pageBytes, l2: l2, evFlags: cuda.EventDisableTiming, perTransfer: opts.PerTransfer}
	if !opts.Spin {
		e.evFlags |= cuda.EventBlockingSync
	}
	for k := range e.lanes {
		for range max(opts.Streams, 1) {
			s, err := dev.NewStream()
			if err != nil {
				e.Close()
				return nil, fmt.Errorf("hicache: CUDA engine: %w", err)
			}
			ln := &lane{stream: s, done: make(chan struct{})}
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
func (e *Engine) SubmitStep(ts []core.Transfer) []*engine.Ticket {
	tks := make([]*engine.Ticket, len(ts))
	var copies [2][][]cuda.Copy1 // by Kind: the copies of each transfer to enqueue
	var queued [2][]*engine.Ticket
	for i, t := range ts {
		tks[i] = engine.NewTicket(t)
		cp, err := e.copiesOf(t)
		switch {
		case err != nil:
			tks[i].Finish(err)
		case len(cp) == 0:
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
			e.enqueue(ln, queued[k][lo:hi], slices.Concat(copies[k][lo:hi]...))
		}
	}
	return tks
}

// copiesOf resolves t's pages into driver copies.
func (e *Engine) copiesOf(t core.Transfer) ([]cuda.Copy1, error) {
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
	return copies, nil
}

// enqueue puts copies, the pages of the transfers of tks, on ln's stream as one copy call
// followed by one event, or fails every ticket.
func (e *Engine) enqueue(ln *lane, tks []*engine.Ticket, copies []cuda.Copy1) {
	fail := func(err error, what string) {
		for _, tk := range tks {
			tk.Finish(fmt.Errorf("hicache: %s of node %d: %s%w", tk.Transfer.Kind, tk.Transfer.Node, what, err))
		}
	}
	// syncFail fails the tickets once the stream is done: copies enqueued before the error
	// may be running, and the pages are not free for reuse until they are done.
	syncFail := func(err error, what string) {
		if serr := ln.stream.Synchronize(); serr != nil {
			err = errors.Join(err, serr)
		}
		fail(err, what)
	}
	ln.mu.Lock()
	defer ln.mu.Unlock()
	if ln.closed {
		fail(engine.ErrClosed, "")
		return
	}
	batched, err := ln.stream.CopyBatch(copies)
	if err != nil {
		syncFail(err, "")
		return
	}
	ln.batched = batched
	e.copyCalls.Add(1)
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
	ln.pending = append(ln.pending, cudaPending{tks, ev})
	ln.cond.Signal()
}

// CopyCalls returns the copy calls enqueued so far: one per batch of pages (a transfer, or
// with SubmitStep a group of a step's transfers).
func (e *Engine) CopyCalls() int64 { return e.copyCalls.Load() }

// wait finishes the lane's tickets as their events complete, in stream order.
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
		err := p.ev.Synchronize()
		for _, tk := range p.tks {
			tk.Finish(err)
		}
		ln.mu.Lock()
		ln.pending[0] = cudaPending{}
		ln.pending = ln.pending[1:]
		ln.events = append(ln.events, p.ev)
	}
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
