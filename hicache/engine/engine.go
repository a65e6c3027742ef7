package engine

import (
	"errors"
	"sync"

	"github.com/cpcache/cpcache/hicache/core"
	"github.com/cpcache/cpcache/slab"
)

// Errors of transfers; package hicache re-exports them.
var (
	// ErrCanceled: a transfer was canceled before it ran (divergence, Close).
	ErrCanceled = errors.New("hicache: transfer canceled")
	// ErrClosed: the cache or the transfer engine was closed.
	ErrClosed = errors.New("hicache: closed")
)

// Transfer is one copy job of the core (see core.Transfer).
type Transfer = core.Transfer

// HostSlabs is the L2 as host memory: slab pages by address (slab.Set and kvtest.MemSlabs
// implement it). The host engine copies into them; the storage driver reads and writes them.
type HostSlabs interface {
	Page(p slab.Page) ([]byte, error)
}

// HostSlabMemory is implemented by host slabs that also hand out a slab's whole memory
// (slab.Set, kvtest.MemSlabs): an L2 in kvmem.LayerFirst layout spreads each page over its
// slab, so engines and the storage driver address it by slab, not by page.
type HostSlabMemory interface {
	HostSlabs
	SlabMemory(slab int) ([]byte, error)
	PagesPerSlab() int
}

// Engine moves pages between this rank's L1 (device KV pool) and the L2 slabs. The driver
// submits transfers in the order the core made them and polls their tickets at each step;
// completion is a local event that the next consensus step turns into a commit everywhere.
//
// Implementations: hostengine.Engine (worker goroutines copying host memory) and
// cudaengine.Engine (streams and events). An Engine is used by one Cache.
type Engine interface {
	// Submit starts t and returns its ticket at once; it never waits for copies. Errors
	// (a page out of range, a failed copy) finish the ticket with the error.
	Submit(t Transfer) *Ticket
	// Cancel finishes every submitted transfer that has not started copying with
	// ErrCanceled; running ones complete normally. It returns at once.
	Cancel()
	// Close cancels what has not started, waits for what runs, and releases the engine.
	// Nil-safe and idempotent; Submit after Close finishes tickets with ErrClosed.
	Close() error
}

// StepSubmitter is implemented by engines that start the transfers of a step together
// (cudaengine: one copy call per direction and stream instead of one per transfer). The
// driver calls SubmitStep, when the engine has it, with all the transfers a step hands out,
// in the order the core made them; it returns their tickets in that order, at once.
type StepSubmitter interface {
	SubmitStep(ts []Transfer) []*Ticket
}

// L1Memory is implemented by engines whose L1 pool is host memory: the scheduler (or a
// test) writes computed KV into a slot and reads loaded KV from it.
type L1Memory interface {
	L1Page(slot int32) ([]byte, error)
}

// Ticket is the completion of one submitted transfer. A layered ticket (NewLayeredTicket)
// also reports the transfer's progress layer by layer: an engine that copies layer 0 of every
// page first, then layer 1, ... calls FinishLayer as each layer lands, so that a reader of
// layer i (WaitL1Layer) need not wait for the layers after it.
type Ticket struct {
	Transfer Transfer
	once     sync.Once
	done     chan struct{}
	err      error // written once, before done is closed

	mu        sync.Mutex      // protects nextLayer
	layerDone []chan struct{} // closed in order: layerDone[i] once layers 0..i are copied
	nextLayer int             // layers closed so far
}

// NewTicket returns an unfinished ticket for t (for Engine implementations). It reports one
// layer: the whole transfer.
func NewTicket(t Transfer) *Ticket { return NewLayeredTicket(t, 1) }

// NewLayeredTicket returns an unfinished ticket for t that completes in layers steps
// (layers < 1 counts as 1): the engine calls FinishLayer(i) once layer i of every page of t
// is copied, and Finish once all are (or the transfer failed).
func NewLayeredTicket(t Transfer, layers int) *Ticket {
	tk := &Ticket{Transfer: t, done: make(chan struct{}), layerDone: make([]chan struct{}, max(layers, 1))}
	for i := range tk.layerDone {
		tk.layerDone[i] = make(chan struct{})
	}
	return tk
}

// Layers is the number of layers the ticket reports (1 for NewTicket's).
func (t *Ticket) Layers() int { return len(t.layerDone) }

// FinishLayer records that layers 0..i of every page of the transfer are copied. Layers are
// finished in order; a call for a layer already finished, or out of range, changes nothing
// beyond the last layer. It does not finish the ticket: Finish does, and finishes every layer.
func (t *Ticket) FinishLayer(i int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for ; t.nextLayer <= min(i, len(t.layerDone)-1); t.nextLayer++ {
		close(t.layerDone[t.nextLayer])
	}
}

// LayerDone is closed once layer i of every page is copied, or the transfer finished (Err then
// says how). A layer at or beyond Layers is the whole transfer: Done.
func (t *Ticket) LayerDone(i int) <-chan struct{} {
	if i < 0 {
		i = 0
	}
	if i >= len(t.layerDone) {
		return t.done
	}
	return t.layerDone[i]
}

// LayerErr waits for LayerDone(i) and returns nil if layer i landed and the transfer has not
// failed; once the transfer finished with an error it returns that error for every layer (a
// failed load serves none of its layers: the core marks its node stale).
func (t *Ticket) LayerErr(i int) error {
	<-t.LayerDone(i)
	select {
	case <-t.done:
		return t.err
	default:
		return nil
	}
}

// Finish completes the ticket, and every layer not finished yet; later calls are ignored.
func (t *Ticket) Finish(err error) {
	t.once.Do(func() {
		t.err = err
		if err == nil {
			t.FinishLayer(len(t.layerDone) - 1)
		}
		close(t.done)
		t.mu.Lock()
		for ; t.nextLayer < len(t.layerDone); t.nextLayer++ {
			close(t.layerDone[t.nextLayer])
		}
		t.mu.Unlock()
	})
}

// Done is closed when the transfer finished.
func (t *Ticket) Done() <-chan struct{} { return t.done }

// Err is the transfer's outcome; valid once Done is closed.
func (t *Ticket) Err() error {
	<-t.done
	return t.err
}

// Finished reports completion without blocking.
func (t *Ticket) Finished() bool {
	select {
	case <-t.done:
		return true
	default:
		return false
	}
}
