package hicache

import (
	"context"
	"fmt"
	"time"

	"github.com/cpcache/cpcache/parallel"
	"github.com/cpcache/cpcache/storage"
)

// PrefetchPolicy says when the group stops waiting for a prefetch from L3 storage.
type PrefetchPolicy int

// Prefetch policies.
const (
	// PrefetchBestEffort reads until done or until the scheduler revokes the prefetch
	// (Cache.RevokePrefetch, typically when the request is scheduled): then the pages every
	// I/O rank has completed are inserted and the rest released.
	PrefetchBestEffort PrefetchPolicy = iota
	// PrefetchWaitComplete always waits until every I/O rank finished reading (a revoke takes
	// effect only then).
	PrefetchWaitComplete
	// PrefetchTimeout stops at completion, at a revoke, or when any I/O rank's timer
	// (PrefetchTimeoutBase + PrefetchTimeoutPerPage × pages) expired; a storage query that
	// takes longer than that is a miss.
	PrefetchTimeout
)

func (p PrefetchPolicy) String() string {
	switch p {
	case PrefetchBestEffort:
		return "best_effort"
	case PrefetchWaitComplete:
		return "wait_complete"
	case PrefetchTimeout:
		return "timeout"
	}
	return fmt.Sprintf("PrefetchPolicy(%d)", int(p))
}

// ParsePrefetchPolicy parses the names String returns.
func ParsePrefetchPolicy(s string) (PrefetchPolicy, error) {
	for _, p := range []PrefetchPolicy{PrefetchBestEffort, PrefetchWaitComplete, PrefetchTimeout} {
		if p.String() == s {
			return p, nil
		}
	}
	return 0, fmt.Errorf("%w: unknown prefetch policy %q (want best_effort, wait_complete or timeout)", ErrBadConfig, s)
}

// L3Options tune the L3 (storage) tier. Every field but Log must be identical on every rank
// of the group (the consensus step checks a fingerprint of the replicated ones).
type L3Options struct {
	// PrefetchPolicy: when a prefetch stops (default PrefetchBestEffort).
	PrefetchPolicy PrefetchPolicy
	// PrefetchTimeoutBase and PrefetchTimeoutPerPage bound a PrefetchTimeout read (defaults
	// 50ms and 2ms).
	PrefetchTimeoutBase, PrefetchTimeoutPerPage time.Duration
	// MinPrefetchPages: a storage hit shorter than this is not prefetched (default 1).
	MinPrefetchPages int
	// PrefetchQuotaPages: at most this many L2 pages reserved for prefetches at once
	// (default a quarter of L2).
	PrefetchQuotaPages int
	// ReadChunkPages: pages per storage Get of a prefetch; progress is reported per chunk
	// (default 8).
	ReadChunkPages int
	// Workers: storage calls in flight at once on the I/O rank (default 4).
	Workers int
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
	hook func(ctx context.Context, kind l3Kind, seq uint64, chunk int) error
}

func (o *L3Options) normalize(l2Pages int) error {
	if o.PrefetchTimeoutBase == 0 {
		o.PrefetchTimeoutBase = 50 * time.Millisecond
	}
	if o.PrefetchTimeoutPerPage == 0 {
		o.PrefetchTimeoutPerPage = 2 * time.Millisecond
	}
	if o.MinPrefetchPages == 0 {
		o.MinPrefetchPages = 1
	}
	if o.PrefetchQuotaPages == 0 {
		o.PrefetchQuotaPages = max(1, l2Pages/4)
	}
	if o.ReadChunkPages == 0 {
		o.ReadChunkPages = 8
	}
	if o.Workers == 0 {
		o.Workers = 4
	}
	for _, v := range []struct {
		name string
		v    int
	}{{"min prefetch pages", o.MinPrefetchPages}, {"prefetch quota pages", o.PrefetchQuotaPages},
		{"read chunk pages", o.ReadChunkPages}, {"storage workers", o.Workers}} {
		if v.v <= 0 {
			return fmt.Errorf("%w: %s %d must be positive", ErrBadConfig, v.name, v.v)
		}
	}
	if o.PrefetchTimeoutBase < 0 || o.PrefetchTimeoutPerPage < 0 {
		return fmt.Errorf("%w: prefetch timeout %v + %v per page must not be negative", ErrBadConfig, o.PrefetchTimeoutBase, o.PrefetchTimeoutPerPage)
	}
	if o.PrefetchPolicy < PrefetchBestEffort || o.PrefetchPolicy > PrefetchTimeout {
		return fmt.Errorf("%w: prefetch policy %d", ErrBadConfig, int(o.PrefetchPolicy))
	}
	return nil
}

func (o *L3Options) fingerprint() string {
	return fmt.Sprintf("%d|%d|%d|%d|%d|%d|%t|%t", o.PrefetchPolicy, o.PrefetchTimeoutBase, o.PrefetchTimeoutPerPage,
		o.MinPrefetchPages, o.PrefetchQuotaPages, o.ReadChunkPages, o.ClearOnFlush, o.NoBackup)
}

// NewStorageNamespace returns the storage namespace of a model's KV pages as this layout
// shards them: model must name the model and everything else that changes a page's bytes
// (dtype, KV layout); the page size in tokens and bytes and the attention-TP size (pages of
// different TP shards differ; keys add the shard index) are added here. The attention-CP
// size is not part of it: a page's bytes do not depend on which CP rank holds it, so jobs
// with different CP sizes share pages.
func NewStorageNamespace(model string, layout *parallel.Layout, pageTokens, pageBytes int) (storage.Namespace, error) {
	if model == "" || layout == nil || pageTokens <= 0 || pageBytes <= 0 {
		return storage.Namespace{}, fmt.Errorf("%w: storage namespace needs a model name, a layout and page sizes (model %q, %d tokens, %d bytes)",
			ErrBadConfig, model, pageTokens, pageBytes)
	}
	return storage.NewNamespace(fmt.Sprintf("cpcache/hicache;model=%s;page_tokens=%d;page_bytes=%d;attn_tp=%d", model, pageTokens, pageBytes, layout.AttnTP))
}
