package stores

import (
	"fmt"
	"sync/atomic"

	"github.com/cpcache/cpcache/storage"
)

// options are the Options of an open store with the MAC it resolved (Open: the key given,
// read from a key file, or the store's own).
type options struct {
	storage.Options
	auth *storage.MAC
}

func (o options) withDefaults() options {
	if o.Timeout <= 0 {
		o.Timeout = storage.DefaultTimeout
	}
	if o.Workers <= 0 {
		o.Workers = 4
	}
	if o.PoolSize <= 0 {
		o.PoolSize = 4
	}
	if o.MaxStuck <= 0 {
		o.MaxStuck = storage.DefaultMaxStuck
	}
	return o
}

// checkBatch validates the shapes shared by Exists, Get and Put.
func checkBatch(backend, where, op string, ns [storage.NamespaceSize]byte, keys []storage.Key, bufs [][]byte, flags []bool) error {
	if bufs != nil && len(bufs) != len(keys) {
		return badArg(backend, where, op, "%d buffers for %d keys", len(bufs), len(keys))
	}
	if flags != nil && len(flags) != len(keys) {
		return badArg(backend, where, op, "%d result flags for %d keys", len(flags), len(keys))
	}
	for i, b := range bufs {
		if len(b) > storage.MaxValueSize {
			return badArg(backend, where, op, "buffer %d has %d bytes, more than the limit %d", i, len(b), storage.MaxValueSize)
		}
	}
	return checkKeys(backend, where, op, ns, keys)
}

// leading counts the leading true entries of flags.
func leading(flags []bool) int {
	for i, f := range flags {
		if !f {
			return i
		}
	}
	return len(flags)
}

// checkKeys validates keys against the namespace id of a storage.
func checkKeys(backend, where, op string, ns [storage.NamespaceSize]byte, keys []storage.Key) error {
	for i := range keys {
		if keys[i].IsZero() {
			return badArg(backend, where, op, "key %d is the zero key", i)
		}
		if [storage.NamespaceSize]byte(keys[i][:storage.NamespaceSize]) != ns {
			return badArg(backend, where, op, "key %d (%s) belongs to namespace %x, storage is opened for namespace %x",
				i, keys[i], keys[i][:storage.NamespaceSize], ns[:])
		}
	}
	return nil
}

// counters is the live, atomically updated form of Stats.
type counters struct {
	hits, misses, corrupt, forged, mismatched, oldFormat, purged, puts, deletes, bytesRead, bytesWritten, errors, links atomic.Uint64
	evicted, expired                                                                                                    atomic.Uint64 // directory store: pages removed for its capacity, past its TTL (dircap.go)
}

func (c *counters) snapshot() storage.Stats {
	// Forged, Mismatched and OldFormat before Corrupt: a value adds to Corrupt first, so
	// each of them is at most Corrupt in every snapshot.
	forged, mismatched, oldFormat := c.forged.Load(), c.mismatched.Load(), c.oldFormat.Load()
	return storage.Stats{
		Hits:         c.hits.Load(),
		Misses:       c.misses.Load(),
		Corrupt:      c.corrupt.Load(),
		Forged:       forged,
		Mismatched:   mismatched,
		OldFormat:    oldFormat,
		Purged:       c.purged.Load(),
		Puts:         c.puts.Load(),
		Deletes:      c.deletes.Load(),
		BytesRead:    c.bytesRead.Load(),
		BytesWritten: c.bytesWritten.Load(),
		Errors:       c.errors.Load(),
		Links:        c.links.Load(),
		Evicted:      c.evicted.Load(),
		Expired:      c.expired.Load(),
	}
}

// fail counts err (if non-nil) and returns it.
func (c *counters) fail(err error) error {
	if err != nil {
		c.errors.Add(1)
	}
	return err
}

func badArg(backend, where, op, format string, args ...any) error {
	return &storage.OpError{Backend: backend, Where: where, Op: op, Kind: storage.ErrBadArgument, Err: fmt.Errorf(format, args...)}
}

func errLength(got, want int) error {
	return fmt.Errorf("stored value has %d bytes, want %d (header + page)", got, want)
}
