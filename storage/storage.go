package storage

import (
	"context"
	"time"
)

// Storage is one namespace of a page store (the L3 tier). Every method is safe for
// concurrent use. Keys must belong to the namespace the storage was opened with. A value is
// at most MaxValueSize bytes; within one namespace all pages have the same size.
//
// Every call returns by its deadline (Options.Timeout or its context's), even when the
// server or the kernel under it never answers, and no call reads or writes a caller's
// buffer after it returned: a caller may free or reuse its buffers (slab pages) at once,
// whatever the call returned.
type Storage interface {
	// Exists reports which keys are stored. If present is non-nil it must have len(keys)
	// entries and every entry is set. It returns the number of leading keys present; with
	// present == nil a backend may stop at the first missing key, which makes the common
	// "how much of this prefix is stored" query cheap. Presence is not always verification:
	// a present value can still turn out corrupt on Get, and no backend reads a payload to
	// answer. The directory backend authenticates headers (and the file's size against the
	// header's length); a value that fails is absent, counted and deleted, as on Get. Redis
	// checks nothing.
	Exists(ctx context.Context, keys []Key, present []bool) (int, error)

	// Get reads the value of keys[i] into dst[i], which must have the stored length (the page
	// size). found, if non-nil, must have len(keys) entries and is set to whether dst[i] holds
	// a verified copy. It returns the number of leading keys found; with found == nil a
	// backend may stop at the first miss. A missing, torn, foreign, corrupt or forged value is
	// a miss, not an error (rejected ones are counted in Stats.Corrupt and deleted). The
	// contents of dst[i] for a miss are unspecified: a value may be read into dst[i] before
	// its checksum or MAC fails. On error, the count and found still describe only verified
	// hits.
	Get(ctx context.Context, keys []Key, dst [][]byte, found []bool) (int, error)

	// Put stores src[i] under keys[i], replacing any previous value. Each value is written
	// atomically (a reader sees the old value, the new one, or a miss; never a mix). On error
	// some values may have been stored. Put does not retain src.
	Put(ctx context.Context, keys []Key, src [][]byte) error

	// GetBound is Get that also checks each value's binding (format.go) against binds[i]
	// (binds has len(keys) entries): a value stored for other tokens or under another
	// parent page is a miss, counted in Stats.Corrupt and Stats.Mismatched and deleted.
	GetBound(ctx context.Context, keys []Key, binds []Binding, dst [][]byte, found []bool) (int, error)

	// PutBound is Put that binds each value to binds[i] (binds has len(keys) entries); Put
	// stores the zero Binding.
	PutBound(ctx context.Context, keys []Key, binds []Binding, src [][]byte) error

	// Delete removes keys; missing keys are not an error.
	Delete(ctx context.Context, keys []Key) error

	// Clear removes every value of this storage's namespace, and nothing else (on the
	// directory backend also leftover temporary files of crashed writers, and links planted
	// in the namespace, never what they point to). Values put concurrently with Clear may
	// survive it.
	Clear(ctx context.Context) error

	// Stats returns a snapshot of the counters.
	Stats() Stats

	// Close releases the storage. It is nil-safe and idempotent; other methods called after
	// it return an error wrapping ErrClosed.
	Close() error
}

// Options configure Open. Namespace is required; the rest have defaults.
type Options struct {
	// Namespace scopes every key and Clear. Required.
	Namespace Namespace
	// Timeout bounds each call (default DefaultTimeout); a context deadline that comes
	// earlier wins.
	Timeout time.Duration
	// Fsync makes the directory backend fsync each file and its directory before Put returns
	// (URL query "fsync=true"). Without it a crash may lose recent pages, never tear them.
	Fsync bool
	// Workers is how many files the directory backend reads or writes at once per batch
	// (default 4).
	Workers int
	// MaxStuck is how many file system operations of the directory backend, abandoned at
	// their call's deadline because the kernel did not return (a frozen or hung file
	// system), may still be running before further calls fail at once with ErrStuck
	// (default DefaultMaxStuck).
	MaxStuck int
	// PoolSize is how many connections the Redis backend opens at most (default 4, URL
	// "pool_size=" or "pool=").
	PoolSize int
	// TTL, if positive, makes Redis expire each page this long after it was written (URL
	// "ttl=1h"); shared Redis instances then evict old pages by themselves. On the
	// directory backend a page not used (written or read by a hit) for longer than TTL is a
	// miss and is removed by the next eviction sweep (stores/dircap.go).
	TTL time.Duration
	// MaxBytes, if positive, is the capacity of the directory backend (URL "max_bytes=2GiB"):
	// the bytes of page files under its root, shared by every store that opens the root with
	// a capacity, in this process or others. Past it, least recently used pages are removed,
	// a chain's later pages before its earlier ones (stores/dircap.go).
	MaxBytes int64
	// OnCorrupt, if set, is called for each value that failed verification (during Get, and
	// during Exists on the directory backend), with an error wrapping ErrCorrupt (and
	// ErrForged for a forged or replayed value) that names the key and the reason. The
	// directory backend may call it from several goroutines at once, and from an operation
	// abandoned at its deadline after its call returned.
	OnCorrupt func(error)
	// OnWarning, if set, is called with what a storage reports without failing: on the
	// directory backend a root that group or others can write (ErrWritableStore, once at
	// open) and the first symbolic links found under it (ErrLink, naming each; the rest are
	// only counted in Stats.Links). Without it they are written to stderr. It may be called
	// from several goroutines at once.
	OnWarning func(error)

	// MACKey authenticates every stored value (a keyed BLAKE3 MAC over the header, and an
	// AES-GMAC or keyed BLAKE3 MAC over the payload; see format.go and doc.go): a value written without it is never loaded. At least 16
	// bytes; every user of one store needs the same key. If empty, Open reads the key from
	// MACKeyFile, else from the file named by $CPCACHE_STORAGE_KEY_FILE (stores.ReadKeyFile), else
	// a file store uses its own key file, <dir>/.cpcache-storage-key, created on first use
	// (stores.LoadOrCreateKeyFile); a mem store uses a random key of its table; a Redis store
	// refuses to open (ErrNoKey) unless Insecure is set.
	MACKey []byte
	// MACKeyFile names a file holding the MAC key (stores.ReadKeyFile), used when MACKey is empty.
	MACKeyFile string
	// Insecure lets a Redis store open without a MAC key: its values are then checksummed,
	// not authenticated (no MAC is computed; a keyed store does not load them), and whoever
	// can write to the server can inject pages.
	Insecure bool
}

// DefaultTimeout bounds a call when Options.Timeout is not set.
const DefaultTimeout = 10 * time.Second

// DefaultMaxStuck is Options.MaxStuck when it is not set.
const DefaultMaxStuck = 64
