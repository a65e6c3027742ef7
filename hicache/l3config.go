package hicache

import (
	"context"
	"fmt"
	"time"

	"github.com/cpcache/cpcache/hicache/core"
	"github.com/cpcache/cpcache/hicache/kvlayout"
	"github.com/cpcache/cpcache/parallel"
	"github.com/cpcache/cpcache/storage"
)

// L3Options tune the L3 (storage) tier. Every field but Log must be identical on every rank
// of the group (the consensus step checks a fingerprint of the replicated ones).
type L3Options struct {
	// PrefetchPolicy: when a prefetch stops (default PrefetchBestEffort).
	PrefetchPolicy PrefetchPolicy
	// PrefetchTimeoutBase and PrefetchTimeoutPerPage bound a PrefetchTimeout read on each
	// rank: base + per page × the pages that rank reads (its own; defaults 50ms and 2ms).
	PrefetchTimeoutBase, PrefetchTimeoutPerPage time.Duration
	// MinPrefetchPages: a storage hit shorter than this is not prefetched (default 1).
	MinPrefetchPages int
	// PrefetchCost: read a stored continuation only when reading it is faster than
	// computing it (from the figures given, or with MeasuredReads from the read bandwidth the
	// I/O ranks measure, an EWMA of their completed reads agreed as the slowest rank's; see
	// core.PrefetchCost). The zero value reads every stored continuation.
	PrefetchCost PrefetchCost
	// PrefetchQuotaPages: at most this many L2 pages reserved for prefetches at once
	// (default a quarter of L2).
	PrefetchQuotaPages int
	// ReadChunkPages: pages per storage Get of a prefetch; progress is reported per chunk
	// (default 8).
	ReadChunkPages int
	// Workers: storage calls in flight at once on each rank (default 4).
	Workers int
	// CallTimeout bounds each storage call of a rank (default 2s; a storage's own,
	// shorter timeout, such as a redis:// URL's timeout=, still holds). A call past it fails.
	CallTimeout time.Duration
	// CircuitFailures: after this many consecutive storage calls failed, or at the first one
	// past CallTimeout, a rank opens its circuit breaker and the group agrees to stop
	// prefetching from and backing up to storage, serving from L1 and L2, until that rank's
	// probe of the store answers (default 3). Local to each rank, like CallTimeout and
	// CircuitProbeInterval (not part of the configuration fingerprint).
	CircuitFailures int
	// CircuitProbeInterval: the first probe of an open circuit's store comes this long after
	// it opened; each failed probe doubles the wait, up to 32 times it (default 250ms).
	CircuitProbeInterval time.Duration
	// ClearOnFlush makes Flush also clear the storage's namespace (default: storage contents
	// survive a flush).
	ClearOnFlush bool
	// NoBackup disables backups to storage (prefetch only: a read-only shared store).
	NoBackup bool
	// Log receives storage errors (rate-limited); nil logs them with the standard logger.
	// Local: may differ across ranks.
	Log func(error)

	// hook, when set, runs before each storage call of a job (tests: delays, gates); an
	// error ends the job as if the group had stopped it.
	hook func(ctx context.Context, kind core.StorageKind, seq uint64, chunk int) error
}

func (o *L3Options) normalize() error {
	if o.PrefetchTimeoutBase == 0 {
		o.PrefetchTimeoutBase = 50 * time.Millisecond
	}
	if o.PrefetchTimeoutPerPage == 0 {
		o.PrefetchTimeoutPerPage = 2 * time.Millisecond
	}
	if o.ReadChunkPages == 0 {
		o.ReadChunkPages = 8
	}
	if o.Workers == 0 {
		o.Workers = 4
	}
	if o.CallTimeout == 0 {
		o.CallTimeout = 2 * time.Second
	}
	if o.CircuitFailures == 0 {
		o.CircuitFailures = 3
	}
	if o.CircuitProbeInterval == 0 {
		o.CircuitProbeInterval = 250 * time.Millisecond
	}
	for _, v := range []struct {
		name string
		v    int
	}{{"read chunk pages", o.ReadChunkPages}, {"storage workers", o.Workers}, {"circuit failures", o.CircuitFailures}} {
		if v.v <= 0 {
			return fmt.Errorf("%w: %s %d must be positive", ErrBadConfig, v.name, v.v)
		}
	}
	if o.CallTimeout < 0 || o.CircuitProbeInterval < 0 {
		return fmt.Errorf("%w: storage call timeout %v and circuit probe interval %v must not be negative", ErrBadConfig, o.CallTimeout, o.CircuitProbeInterval)
	}
	if o.PrefetchTimeoutBase < 0 || o.PrefetchTimeoutPerPage < 0 {
		return fmt.Errorf("%w: prefetch timeout %v + %v per page must not be negative", ErrBadConfig, o.PrefetchTimeoutBase, o.PrefetchTimeoutPerPage)
	}
	return nil
}

// coreConfig is the part of the options that replicated decisions read (the core normalizes
// it: prefetch minimum, quota and policy).
func (o *L3Options) coreConfig() core.L3Config {
	return core.L3Config{PrefetchPolicy: o.PrefetchPolicy, MinPrefetchPages: o.MinPrefetchPages,
		PrefetchQuotaPages: o.PrefetchQuotaPages, NoBackup: o.NoBackup, Cost: o.PrefetchCost}
}

// fingerprint covers the driver's options that every rank must share (the core adds its own).
func (o *L3Options) fingerprint() string {
	return fmt.Sprintf("%d|%d|%d|%t", o.PrefetchTimeoutBase, o.PrefetchTimeoutPerPage, o.ReadChunkPages, o.ClearOnFlush)
}

// NewStorageNamespace returns the storage namespace of a model's KV pages as this layout
// shards them: model must name the model and everything else that changes a page's bytes
// (dtype, KV layout); the page size in tokens and bytes and the attention-TP size (pages of
// different TP shards differ; keys add the shard index) are added here. The attention-CP
// size is not part of it: a page's bytes do not depend on which CP rank holds it, so jobs
// with different CP sizes share pages. kv is the KV layout (Config.KVLayout): when set, its
// Fingerprint joins the namespace, so pages of another model's layout never load, and a page
// of pageTokens tokens at the attention-TP size must take pageBytes; nil (opaque pages) adds
// nothing.
func NewStorageNamespace(model string, layout *parallel.Layout, pageTokens, pageBytes int, kv *kvlayout.Layout) (storage.Namespace, error) {
	if model == "" || layout == nil || pageTokens <= 0 || pageBytes <= 0 {
		return storage.Namespace{}, fmt.Errorf("%w: storage namespace needs a model name, a layout and page sizes (model %q, %d tokens, %d bytes)",
			ErrBadConfig, model, pageTokens, pageBytes)
	}
	id := fmt.Sprintf("cpcache/hicache;model=%s;page_tokens=%d;page_bytes=%d;attn_tp=%d", model, pageTokens, pageBytes, layout.AttnTP)
	if kv != nil {
		if err := checkKVLayout(kv, pageTokens, layout.AttnTP, pageBytes); err != nil {
			return storage.Namespace{}, err
		}
		id += ";kv_layout=" + kv.Fingerprint()
	}
	return storage.NewNamespace(id)
}
