package sched

import (
	"context"
	"errors"
	"slices"

	"github.com/cpcache/cpcache/hicache"
	"github.com/cpcache/cpcache/sim/vtime"
	"github.com/cpcache/cpcache/workload"
)

// NullCache is a Cache that holds nothing: every match is empty, every insert succeeds
// without a page to compute on this rank, nothing is loaded, backed up or prefetched, and a
// step does nothing. The scheduler over it serves a workload with the cache off, under the
// same admission and decode rules and the same cost model: every prompt token is computed.
type NullCache struct{}

var errNoPages = errors.New("sched: the null cache has no L1 pages")

func (NullCache) Match(hicache.Request) (hicache.MatchResult, error) {
	return hicache.MatchResult{}, nil
}
func (NullCache) Insert(hicache.Request) (hicache.InsertResult, error) {
	return hicache.InsertResult{}, nil
}
func (NullCache) Lock(hicache.Handle) error   { return nil }
func (NullCache) Unlock(hicache.Handle) error { return nil }
func (NullCache) LoadBack(hicache.Handle) (hicache.LoadResult, error) {
	return hicache.LoadResult{}, nil
}
func (NullCache) LoadPending(hicache.Handle) bool                        { return false }
func (NullCache) WaitL1(context.Context, hicache.Handle) error           { return nil }
func (NullCache) WaitL1Layer(context.Context, hicache.Handle, int) error { return nil }
func (NullCache) Node(hicache.Handle) (hicache.NodeInfo, error) {
	return hicache.NodeInfo{}, errNoPages
}
func (NullCache) Owns(int) bool                { return false }
func (NullCache) L1Page(int32) ([]byte, error) { return nil, errNoPages }
func (NullCache) Prefetch(hicache.Request) (hicache.PrefetchResult, error) {
	return hicache.PrefetchResult{}, nil
}
func (NullCache) PrefetchPending(uint64) bool { return false }
func (NullCache) PrefetchOutcome(uint64) (hicache.PrefetchOutcome, bool) {
	return hicache.PrefetchOutcome{}, false
}
func (NullCache) PrefetchQuotaPages() int                   { return 0 }
func (NullCache) PrefetchSkipsForCost(hicache.Request) bool { return false }
func (NullCache) Pending() int                              { return 0 }
func (NullCache) Quarantined() bool                         { return false }
func (NullCache) Step(context.Context) error                { return nil }

// CacheOff replays reqs with the cache off (NullCache) under cfg's rules and cost model, and
// returns the clock (timings, makespan, computed tokens). It needs no ranks, so the
// cache-off figures come from the same run instead of a second one. reqs is not modified.
func CacheOff(ctx context.Context, cfg Config, reqs []workload.Request) (*vtime.Clock, error) {
	cfg.Storage = false
	s := New(NullCache{}, cfg, 0, slices.Clone(reqs))
	if err := s.Run(ctx); err != nil {
		return nil, err
	}
	return s.clock, nil
}
