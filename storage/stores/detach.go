package stores

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/cpcache/cpcache/storage"
)

// A file system can stop answering inside the kernel (a frozen ext4, a hung NFS or FUSE
// mount): the open, read, write or rename under a call then never returns, whatever the
// call's context says. The directory backend therefore makes each file system operation
// on a goroutine of its own (detach) and waits for it only until the call's context is
// done; past that the operation is abandoned: the call returns its deadline error at once,
// and the goroutine finishes whenever the kernel lets it, its result dropped.
//
// An abandoned operation owns only memory of its own: a Get that must wait for the disk
// reads into a private buffer, copied into the caller's buffer in the caller's goroutine
// once the read is delivered (a cached page is read straight into the caller's buffer by
// the call itself, with a read that cannot wait: dirStore.getOne), and a Put writes a
// private copy of the caller's page, made in the same pass as its checksum. So no byte of
// a caller's buffer is read or written after its call returned (the L3 driver frees and
// reuses slab pages as soon as their job is over).
//
// Abandoned operations still stuck are counted (Stats.Abandoned, Stats.Stuck) and bounded:
// with Options.MaxStuck of them still running, a call fails at once (ErrStuck with
// ErrUnavailable) instead of starting another goroutine that would pile up behind them.
// An abandoned Put or Delete may still take effect when the kernel resumes, as a call of
// a server that received it before the deadline does (see the package doc).

// kernel holds a backend's detached operations: the counters, the bound, and the gates
// that faults install (Faults.Freeze).
type kernel struct {
	abandoned atomic.Uint64 // operations abandoned at their call's deadline, in all
	stuck     atomic.Int64  // of them, still running now

	mu    sync.Mutex // protects gates
	gates []func(op string)
}

// States of a detached operation, changed once from running.
const (
	opRunning int32 = iota
	opDelivered
	opAbandoned
)

// detach runs fn, one file system operation of call op, on its own goroutine and waits
// for it until ctx is done. It returns nil once fn returned (its results, which fn leaves
// in variables the caller owns, may then be read), or ctx's error when the operation was
// abandoned: fn may still be running and then writes only what fn's own goroutine owns;
// late, if not nil, runs on that goroutine after such an fn returns (to release what it
// owned). It fails at once with ErrStuck when too many abandoned operations are stuck.
// late runs exactly when the operation is not delivered: after an abandoned fn returns,
// or at once when fn never started (ctx already done, ErrStuck).
func (b *base) detach(ctx context.Context, op string, fn func(), late func()) error {
	if err := ctx.Err(); err != nil {
		if late != nil {
			late()
		}
		return err
	}
	k := &b.kernel
	if n, limit := k.stuck.Load(), int64(b.opts.MaxStuck); n >= limit {
		if late != nil {
			late()
		}
		return fmt.Errorf("%w: %d operations abandoned at their deadline are still in the kernel (limit %d)", storage.ErrStuck, n, limit)
	}
	var state atomic.Int32
	done := make(chan struct{})
	go func() {
		k.wait(op)
		fn()
		if state.CompareAndSwap(opRunning, opDelivered) {
			close(done)
			return
		}
		k.stuck.Add(-1)
		if late != nil {
			late()
		}
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
	}
	k.stuck.Add(1) // before the abandonment is visible, so the gauge never goes below 0
	if state.CompareAndSwap(opRunning, opAbandoned) {
		k.abandoned.Add(1)
		return ctx.Err()
	}
	k.stuck.Add(-1) // delivered just now
	<-done
	return nil
}

// wait runs the gates of op (Faults.Freeze): they block where a frozen file system would.
func (k *kernel) wait(op string) {
	k.mu.Lock()
	gates := k.gates
	k.mu.Unlock()
	for _, g := range gates {
		g(op)
	}
}

func (k *kernel) addGate(g func(op string)) {
	k.mu.Lock()
	k.gates = append(k.gates[:len(k.gates):len(k.gates)], g)
	k.mu.Unlock()
}

// pageBuffers are the private buffers of detached reads and writes, reused across calls
// (an abandoned operation's buffer comes back only when the operation returns).
var pageBuffers sync.Pool

func getBuffer(n int) *[]byte {
	if p, ok := pageBuffers.Get().(*[]byte); ok && cap(*p) >= n {
		*p = (*p)[:n]
		return p
	}
	b := make([]byte, n)
	return &b
}

func putBuffer(p *[]byte) { pageBuffers.Put(p) }
