package hicache

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/cpcache/cpcache/storage"
)

// ErrStorageCircuitOpen is returned (and not counted as a storage error) for storage work
// a rank skipped because its circuit breaker is open.
var ErrStorageCircuitOpen = errors.New("hicache: storage circuit open")

// breaker is one rank's storage circuit breaker (each rank has its own handle and calls).
// After threshold consecutive storage
// calls failed, or at once when a call ran past its deadline (a store that does not answer
// within CallTimeout is as good as down, and waiting for more such calls, which may come one
// after another, would stall prefetches for several deadlines), it opens: storage work fails at once (a miss, a
// failed backup) and the core is told, so that the group agrees the circuit open at the next
// step and queues no more prefetches or backups. While open, the driver probes the store
// (one cheap Exists, see l3Driver.poll) with exponential backoff; the first answer closes
// it. Local: only the agreed circuit (core.StorageCircuitOpen) is replicated.
type breaker struct {
	threshold           int
	probeBase, probeMax time.Duration
	now                 func() time.Time

	mu        sync.Mutex // protects everything below
	fails     int        // consecutive failed calls
	open      bool
	openedAt  time.Time
	openTotal time.Duration // time open before openedAt
	opens     int64
	probing   bool // a probe is running
	nextProbe time.Time
	backoff   time.Duration
}

func newBreaker(o *L3Options) *breaker {
	return &breaker{threshold: o.CircuitFailures, probeBase: o.CircuitProbeInterval, probeMax: 32 * o.CircuitProbeInterval, now: time.Now}
}

// record counts the result of one storage call; timedOut: it ran past its deadline.
func (b *breaker) record(err error, timedOut bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err == nil {
		b.fails = 0
		return
	}
	b.fails++
	if !b.open && (b.fails >= b.threshold || timedOut) {
		b.open, b.openedAt, b.opens = true, b.now(), b.opens+1
		b.backoff = b.probeBase
		b.nextProbe = b.openedAt.Add(b.backoff)
	}
}

func (b *breaker) isOpen() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.open
}

// probeDue reports whether a probe should start now, and if so marks it running.
func (b *breaker) probeDue() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.open || b.probing || b.now().Before(b.nextProbe) {
		return false
	}
	b.probing = true
	return true
}

// probed records a probe's result: an answer closes the circuit, a failure doubles the wait
// before the next probe. A canceled probe (drain) changes nothing but lets the next one run.
func (b *breaker) probed(err error, canceled bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.probing = false
	switch {
	case canceled:
	case err == nil:
		b.open, b.fails = false, 0
		b.openTotal += b.now().Sub(b.openedAt)
	default:
		b.backoff = min(2*b.backoff, b.probeMax)
		b.nextProbe = b.now().Add(b.backoff)
	}
}

// openSeconds is how long the circuit has been open in all, the current opening included.
func (b *breaker) openSeconds() float64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	d := b.openTotal
	if b.open {
		d += b.now().Sub(b.openedAt)
	}
	return d.Seconds()
}

// call runs one storage call bounded by the call deadline, unless the circuit is open, and
// records its result. A call the group stopped (ctx canceled) says nothing about the store.
func (d *l3Driver) call(ctx context.Context, f func(context.Context) error) error {
	if d.brk.isOpen() {
		return ErrStorageCircuitOpen
	}
	cctx, cancel := context.WithTimeout(ctx, d.opts.CallTimeout)
	defer cancel()
	err := f(cctx)
	if ctx.Err() == nil {
		// A call refused because earlier ones are stuck in the kernel (storage.ErrStuck) is
		// as good as one past its deadline.
		d.brk.record(err, errors.Is(cctx.Err(), context.DeadlineExceeded) || errors.Is(err, storage.ErrStuck))
	}
	return err
}

// startProbe runs one probe of the store in the background when the breaker wants one: an
// Exists of one key, bounded by the call deadline. Never blocks the caller. An answer does
// not count while operations abandoned at earlier deadlines are still stuck in the kernel
// (Stats.Stuck): a frozen file system still answers lookups from its caches, and its writes
// would time out again; a thawed one lets them all go.
func (d *l3Driver) startProbe() {
	if !d.brk.probeDue() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), d.opts.CallTimeout)
	d.mu.Lock()
	d.probeCancel = cancel
	d.mu.Unlock()
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		defer cancel()
		_, err := d.st.Exists(ctx, d.keys([]PageID{{}}), nil)
		if n := d.st.Stats().Stuck; err == nil && n > 0 {
			err = fmt.Errorf("%w: %d operations still in the kernel", storage.ErrStuck, n)
		}
		d.brk.probed(err, errors.Is(ctx.Err(), context.Canceled))
	}()
}
