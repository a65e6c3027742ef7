package stores

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/cpcache/cpcache/storage"
)

// base holds what every backend shares: identity for errors, namespace, counters, options.
type base struct {
	backend string
	where   string
	ns      [storage.NamespaceSize]byte
	opts    options
	stats   counters
	closed  atomic.Bool
	// rejected holds keys of values that failed verification, for the purge (purge.go).
	rejected keyQueue
	// kernel runs the file system operations of backends that make them (detach.go).
	kernel kernel
}

func (b *base) err(op string, kind, cause error) error {
	return b.stats.fail(&storage.OpError{Backend: b.backend, Where: b.where, Op: op, Kind: kind, Err: cause})
}

// begin checks the storage is open and the batch is well formed.
func (b *base) begin(op string, keys []storage.Key, bufs [][]byte, flags []bool) error {
	if b.closed.Load() {
		return b.err(op, storage.ErrClosed, nil)
	}
	if err := checkBatch(b.backend, b.where, op, b.ns, keys, bufs, flags); err != nil {
		return b.stats.fail(err)
	}
	return nil
}

// beginCall starts a call of a backend that does I/O: it checks the call (begin) and
// returns its context, bounded by Options.Timeout or ctx's deadline, whichever comes first.
func (b *base) beginCall(ctx context.Context, op string, keys []storage.Key, bufs [][]byte, flags []bool) (context.Context, context.CancelFunc, error) {
	if err := b.begin(op, keys, bufs, flags); err != nil {
		return ctx, nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, b.opts.Timeout)
	return ctx, cancel, nil
}

// beginLookup is beginCall for Exists and Get: it also returns the flags to fill — out,
// cleared, or a scratch slice when the caller passed none (it wants the leading count only).
func (b *base) beginLookup(ctx context.Context, op string, keys []storage.Key, bufs [][]byte, out []bool) ([]bool, context.Context, context.CancelFunc, error) {
	ctx, cancel, err := b.beginCall(ctx, op, keys, bufs, out)
	if err != nil {
		return nil, ctx, nil, err
	}
	if out == nil {
		return make([]bool, len(keys)), ctx, cancel, nil
	}
	clear(out)
	return out, ctx, cancel, nil
}

// buffers makes a nil buffer list of Get or Put an empty one, so that begin checks its
// length against the keys.
func buffers(bufs [][]byte) [][]byte {
	if bufs == nil {
		return [][]byte{}
	}
	return bufs
}

// corrupt counts a value that failed verification during Get, reports it to OnCorrupt and
// queues it for deletion (purge.go).
func (b *base) corrupt(key storage.Key, reason error) { b.corruptIn("get", key, reason) }

// corruptIn is corrupt for a value found by operation op.
func (b *base) corruptIn(op string, key storage.Key, reason error) {
	b.stats.corrupt.Add(1)
	switch {
	case errors.Is(reason, storage.ErrForged):
		b.stats.forged.Add(1)
	case errors.Is(reason, storage.ErrMismatch):
		b.stats.mismatched.Add(1)
	case errors.Is(reason, storage.ErrOldFormat):
		b.stats.oldFormat.Add(1)
	}
	b.rejected.add(key)
	if b.opts.OnCorrupt != nil {
		b.opts.OnCorrupt(&storage.OpError{Backend: b.backend, Where: b.where, Op: op + " " + key.String(), Kind: storage.ErrCorrupt, Err: reason})
	}
}

// The value format of every backend, authenticated with the storage's MAC key.

func (b *base) checkHeader(hdr []byte, key storage.Key, bind *storage.Binding, wantLen int) error {
	return b.opts.auth.CheckHeader(hdr, key, bind, wantLen)
}

// checkBinds checks that binds of PutBound or GetBound (nil: none) has one entry per key.
func (b *base) checkBinds(op string, keys []storage.Key, binds []storage.Binding) error {
	if binds != nil && len(binds) != len(keys) {
		return b.err(op, storage.ErrBadArgument, fmt.Errorf("%d bindings for %d keys", len(binds), len(keys)))
	}
	return nil
}

// bindAt is binds[i], or nil when binds is nil (Put stores the zero Binding; Get checks none).
func bindAt(binds []storage.Binding, i int) *storage.Binding {
	if binds == nil {
		return nil
	}
	return &binds[i]
}

// copyBlock is how much of a payload encodeValue copies before it checksums it: small
// enough to be still in the core's L1/L2 cache.
const copyBlock = 32 << 10

// encodeValue writes the stored form of payload under key, header then payload, into v
// (storage.StoredLen(len(payload)) bytes). The payload is copied block by block, each
// checksummed right after it is copied, from cache; the MAC, which covers the checksum, is
// the second pass, over the copy.
func (b *base) encodeValue(v []byte, key storage.Key, bind *storage.Binding, payload []byte) {
	p := v[storage.HeaderSize:storage.StoredLen(len(payload))]
	var crc uint32
	for off := 0; off < len(payload); off += copyBlock {
		end := min(off+copyBlock, len(payload))
		copy(p[off:end], payload[off:end])
		crc = storage.UpdateChecksum(crc, p[off:end])
	}
	b.opts.auth.EncodeHeaderSum((*[storage.HeaderSize]byte)(v), key, bind, p, crc)
}

// decodeValue verifies v, a whole stored value read for key (with binding bind, nil: not
// checked), and copies its payload into dst (the page size). v's header is of any format
// version read (storage.HeaderLen). It returns why v is not genuine, or nil; dst's contents are then
// unspecified.
func (b *base) decodeValue(v []byte, key storage.Key, bind *storage.Binding, dst []byte) error {
	hs := storage.HeaderLen(v)
	if len(v) != hs+len(dst) {
		return errLength(len(v), storage.StoredLen(len(dst)))
	}
	if err := b.checkHeader(v[:hs], key, bind, len(dst)); err != nil {
		return err
	}
	return b.opts.auth.CheckPayloadCopy(v[:hs], v[hs:], dst)
}

func (b *base) Stats() storage.Stats {
	st := b.stats.snapshot()
	st.Abandoned, st.Stuck = b.kernel.abandoned.Load(), uint64(max(b.kernel.stuck.Load(), 0))
	return st
}

// forEach runs fn(i) for i in [0,n) on up to workers goroutines and returns the first error.
// If stopAfterMiss is set, fn returning ok=false at i tells the loop that indexes above i
// need not run (they may still run if already started). fn is never called after an error
// or after ctx is done; ctx's error is returned in that case.
func forEach(ctx context.Context, n, workers int, stopAfterMiss bool, fn func(i int) (ok bool, err error)) error {
	if n == 0 {
		return ctx.Err()
	}
	workers = min(workers, n)
	var (
		next  atomic.Int64 // next index to claim
		limit atomic.Int64 // indexes >= limit are skipped
		mu    sync.Mutex   // protects first
		first error
	)
	limit.Store(int64(n))
	fail := func(err error) {
		mu.Lock()
		if first == nil {
			first = err
		}
		mu.Unlock()
		limit.Store(-1)
	}
	work := func() {
		for {
			i := next.Add(1) - 1
			if i >= limit.Load() {
				return
			}
			if err := ctx.Err(); err != nil {
				fail(err)
				return
			}
			ok, err := fn(int(i))
			if err != nil {
				fail(err)
				return
			}
			if !ok && stopAfterMiss {
				for {
					l := limit.Load()
					if l <= i+1 || limit.CompareAndSwap(l, i+1) {
						break
					}
				}
			}
		}
	}
	if workers <= 1 {
		work()
	} else {
		var wg sync.WaitGroup
		for range workers {
			wg.Go(work)
		}
		wg.Wait()
	}
	return first
}
