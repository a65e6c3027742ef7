package hicache

import "sync"

// Engine moves pages between this rank's L1 (device KV pool) and the L2 slabs. The driver
// submits transfers in the order the core made them and polls their tickets at each step;
// completion is a local event that the next consensus step turns into a commit everywhere.
//
// Implementations: HostEngine (worker goroutines copying host memory) and CUDAEngine
// (streams and events). An Engine is used by one Cache.
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

// finished reports completion without blocking.
func (t *Ticket) finished() bool {
	select {
	case <-t.done:
		return true
	default:
		return false
	}
}
