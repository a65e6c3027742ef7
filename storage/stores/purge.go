package stores

import (
	"context"
	"sync"

	"github.com/cpcache/cpcache/storage"
)

// A value that fails verification is deleted, so that the next backup of its page (which
// asks Exists first) writes a genuine copy: the store repairs itself instead of answering a
// miss for that key forever. Backends queue such keys (base.corrupt); purging deletes them
// after the Get or Exists that found them, on every backend alike. A concurrent Put of the
// same key may be deleted with it: that costs one miss, never a wrong page.
type purging struct {
	backend
}

// backend is a Storage built on base.
type backend interface {
	storage.Storage
	common() *base
}

func (b *base) common() *base { return b }

// KeyFingerprint is the fingerprint of the store's MAC key (storage.KeyFingerprint).
func (p *purging) KeyFingerprint() string {
	if a := p.common().opts.auth; a != nil {
		return a.Fingerprint()
	}
	return ""
}

func (p *purging) Exists(ctx context.Context, keys []storage.Key, present []bool) (int, error) {
	n, err := p.backend.Exists(ctx, keys, present)
	p.purge(ctx)
	return n, err
}

func (p *purging) Get(ctx context.Context, keys []storage.Key, dst [][]byte, found []bool) (int, error) {
	n, err := p.backend.Get(ctx, keys, dst, found)
	p.purge(ctx)
	return n, err
}

func (p *purging) GetBound(ctx context.Context, keys []storage.Key, binds []storage.Binding, dst [][]byte, found []bool) (int, error) {
	n, err := p.backend.GetBound(ctx, keys, binds, dst, found)
	p.purge(ctx)
	return n, err
}

// Close is nil-safe, as every backend's.
func (p *purging) Close() error {
	if p == nil {
		return nil
	}
	return p.backend.Close()
}

// purge deletes the queued keys, as part of the call that found them: bounded by its context
// (and Options.Timeout) like the rest of it. When that context is done the keys stay queued
// for the next call's purge; a failed Delete is counted in Stats.Errors and the keys stay
// bad until their next read.
func (p *purging) purge(ctx context.Context) {
	b := p.common()
	if ctx.Err() != nil {
		return
	}
	bad := b.rejected.take()
	if len(bad) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, b.opts.Timeout)
	defer cancel()
	if p.backend.Delete(ctx, bad) == nil {
		b.stats.purged.Add(uint64(len(bad)))
	}
}

// keyQueue collects keys to purge. It keeps at most maxQueuedKeys (more are forgotten: they
// are found again on their next read).
type keyQueue struct {
	mu   sync.Mutex // protects keys
	keys []storage.Key
}

const maxQueuedKeys = 4096

func (q *keyQueue) add(k storage.Key) {
	q.mu.Lock()
	if len(q.keys) < maxQueuedKeys {
		q.keys = append(q.keys, k)
	}
	q.mu.Unlock()
}

func (q *keyQueue) take() []storage.Key {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.keys) == 0 {
		return nil
	}
	out := q.keys
	q.keys = nil
	return out
}
