package core

import (
	"fmt"
	"math"
)

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
	// Cost: a stored continuation is read only when reading it is faster than computing it
	// (zero value: every continuation at least MinPrefetchPages long is read).
	Cost PrefetchCost
}

// PrefetchCost is the cost rule of prefetches. Once the group agreed how many leading pages
// of a continuation are stored, it reads them only when the read is faster than their
// prefill; otherwise they are skipped for cost (RefusedCost, Stats.L3CostSkippedPages) and
// computed. The rule is a pure function of the configuration, the agreed answer and, with
// MeasuredReads, the agreed read bandwidth, so every rank decides alike.
type PrefetchCost struct {
	// The group's prefill of tokens [h, s) of a sequence takes ComputeNsPerToken × (s − h)
	// + AttentionNsPerTokenPair × (s² − h²)/2 ns (each token attends to every token before
	// it). Both 0: no cost rule.
	ComputeNsPerToken, AttentionNsPerTokenPair float64
	// A read of p pages takes StorageLatencyNs + ⌈p / IORanks⌉ × PageBytes / (read
	// bandwidth of one I/O rank, in bytes per ns = GB/s): each I/O rank reads the pages it
	// owns, all at once. StorageBytesPerNs is that bandwidth (with MeasuredReads: until the
	// I/O ranks measured one; 0 then reads, so that they do).
	StorageLatencyNs, StorageBytesPerNs float64
	// PageBytes: the bytes of one page on the rank that owns it.
	PageBytes int64
	// IORanks: the ranks that read a prefetch's pages at once (page i on rank i mod
	// IORanks; 0: the slab group's size, every CP rank reading the pages it owns).
	IORanks int
	// MeasuredReads: decide from the read bandwidth the I/O ranks measure at run time
	// (Core.StorageReadRate), agreed through the vector as the slowest rank's (a read is
	// over when every I/O rank's part is). One in probeEvery prefetches the rule skips is
	// read anyway, so that a store that got faster is measured again.
	MeasuredReads bool
}

// probeEvery: with PrefetchCost.MeasuredReads, every probeEvery-th prefetch skipped for cost
// is read anyway (a measurement of the store as it is now).
const probeEvery = 16

// on reports whether the rule decides anything.
func (pc *PrefetchCost) on() bool { return pc.ComputeNsPerToken > 0 || pc.AttentionNsPerTokenPair > 0 }

// MayPay reports whether a read of some leading part of pages pages from sequence page
// start may pay off: it is false when computing all of them takes no longer than reading
// them with every I/O rank's bandwidth used in full (latency + pages × PageBytes / (IORanks
// × bandwidth), a lower bound of any read of them). Since the prefill of the first j pages
// takes at most j/pages of the whole (each token costs more than the one before it), and a
// read of j pages at least latency + j × PageBytes / (IORanks × bandwidth), no j pays off
// then, and the continuation need not even be asked about.
func (pc *PrefetchCost) MayPay(start, pages, pageSize int, bytesPerNs float64) bool {
	if !pc.on() || !(bytesPerNs > 0) || pages <= 0 {
		return true
	}
	h, s := float64(start*pageSize), float64((start+pages)*pageSize)
	compute := float64(pc.ComputeNsPerToken*(s-h)) + float64(pc.AttentionNsPerTokenPair*float64(float64(s*s)-float64(h*h)))/2
	read := pc.StorageLatencyNs + float64(int64(pages)*pc.PageBytes)/float64(float64(max(pc.IORanks, 1))*bytesPerNs)
	return read < compute
}

// Pays reports whether reading pages stored pages of a sequence, from its page start on
// (pageSize tokens a page), at bytesPerNs per I/O rank, is faster than computing them. A
// rule that is off, or a bandwidth that is not known (0), always pays. Every product is
// rounded explicitly (float64(...)): no rank fuses a multiply-add that another rounds, so
// every rank of one binary gets the same answer from the same agreed inputs.
func (pc *PrefetchCost) Pays(start, pages, pageSize int, bytesPerNs float64) bool {
	if !pc.on() || !(bytesPerNs > 0) || pages <= 0 {
		return true
	}
	io := max(pc.IORanks, 1)
	h, s := float64(start*pageSize), float64((start+pages)*pageSize)
	compute := float64(pc.ComputeNsPerToken*(s-h)) + float64(pc.AttentionNsPerTokenPair*float64(float64(s*s)-float64(h*h)))/2
	read := pc.StorageLatencyNs + float64(int64((pages+io-1)/io)*pc.PageBytes)/bytesPerNs
	return read < compute
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
	pc := &o.Cost
	for _, f := range []struct {
		name string
		v    float64
	}{{"compute ns per token", pc.ComputeNsPerToken}, {"attention ns per token pair", pc.AttentionNsPerTokenPair},
		{"storage latency ns", pc.StorageLatencyNs}, {"storage bytes per ns", pc.StorageBytesPerNs},
		{"page bytes", float64(pc.PageBytes)}, {"I/O ranks", float64(pc.IORanks)}} {
		if !(f.v >= 0) || math.IsInf(f.v, 0) {
			return fmt.Errorf("%w: prefetch cost: %s %g must be a finite number ≥ 0", ErrBadConfig, f.name, f.v)
		}
	}
	if pc.on() && pc.PageBytes == 0 {
		return fmt.Errorf("%w: prefetch cost: a compute cost needs the page bytes (0)", ErrBadConfig)
	}
	if o.PrefetchPolicy < PrefetchBestEffort || o.PrefetchPolicy > PrefetchTimeout {
		return fmt.Errorf("%w: prefetch policy %d", ErrBadConfig, int(o.PrefetchPolicy))
	}
	return nil
}

func (o *L3Config) fingerprint() string {
	return fmt.Sprintf("%d|%d|%d|%t|%+v", o.PrefetchPolicy, o.MinPrefetchPages, o.PrefetchQuotaPages, o.NoBackup, o.Cost)
}
