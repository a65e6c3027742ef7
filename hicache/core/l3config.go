package core

import "fmt"

// PrefetchPolicy says when the group stops waiting for a prefetch from L3 storage.
type PrefetchPolicy int

// Prefetch policies.
const (
	// PrefetchBestEffort reads until done or until the scheduler revokes the prefetch
	// (Cache.RevokePrefetch, typically when the request is scheduled): then the prefix every
	// rank has completed of its own pages is inserted and the rest released.
	PrefetchBestEffort PrefetchPolicy = iota
	// PrefetchWaitComplete always waits until every rank finished reading its pages (a revoke
	// takes effect only then).
	PrefetchWaitComplete
	// PrefetchTimeout stops at completion, at a revoke, or when any rank's timer
	// (PrefetchTimeoutBase + PrefetchTimeoutPerPage × the pages it reads: its own) expired;
	// a rank's storage query that takes longer than that is a miss of its pages.
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

// L3Config is the part of the storage protocol's configuration that replicated decisions
// read (the driver's L3 options add deadlines, chunking and workers, which each rank applies
// to its own storage calls). Normalized by Config.
type L3Config struct {
	// PrefetchPolicy: when a prefetch stops (default PrefetchBestEffort).
	PrefetchPolicy PrefetchPolicy
	// MinPrefetchPages: a storage hit shorter than this is not prefetched (default 1).
	MinPrefetchPages int
	// PrefetchQuotaPages: at most this many L2 pages reserved for prefetches at once
	// (default a quarter of L2).
	PrefetchQuotaPages int
	// NoBackup disables backups to storage (prefetch only: a read-only shared store).
	NoBackup bool
}

func (o *L3Config) normalize(l2Pages int) error {
	if o.MinPrefetchPages == 0 {
		o.MinPrefetchPages = 1
	}
	if o.PrefetchQuotaPages == 0 {
		o.PrefetchQuotaPages = max(1, l2Pages/4)
	}
	for _, v := range []struct {
		name string
		v    int
	}{{"min prefetch pages", o.MinPrefetchPages}, {"prefetch quota pages", o.PrefetchQuotaPages}} {
		if v.v <= 0 {
			return fmt.Errorf("%w: %s %d must be positive", ErrBadConfig, v.name, v.v)
		}
	}
	if o.PrefetchPolicy < PrefetchBestEffort || o.PrefetchPolicy > PrefetchTimeout {
		return fmt.Errorf("%w: prefetch policy %d", ErrBadConfig, int(o.PrefetchPolicy))
	}
	return nil
}

func (o *L3Config) fingerprint() string {
	return fmt.Sprintf("%d|%d|%d|%t", o.PrefetchPolicy, o.MinPrefetchPages, o.PrefetchQuotaPages, o.NoBackup)
}
