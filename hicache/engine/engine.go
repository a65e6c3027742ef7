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

// Ticket is the completion of one submitted transfer.
type Ticket struct {
	Transfer Transfer
	once     sync.Once
	done     chan struct{}
	err      error // written once, before done is closed
}

// NewTicket returns an unfinished ticket for t (for Engine implementations).
func NewTicket(t Transfer) *Ticket { return &Ticket{Transfer: t, done: make(chan struct{})} }

// Finish completes the ticket; later calls are ignored.
func (t *Ticket) Finish(err error) {
	t.once.Do(func() {
		t.err = err
		close(t.done)
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
