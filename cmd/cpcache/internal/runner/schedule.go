package runner

import (
	"context"
	"slices"

	"github.com/cpcache/cpcache/hicache"
	"github.com/cpcache/cpcache/sim/sched"
	"github.com/cpcache/cpcache/sim/vtime"
	"github.com/cpcache/cpcache/workload"
)

// sched is the scheduler's configuration of the run.
func (c *Config) sched() sched.Config {
	return sched.Config{PageSize: c.PageSize, L1Pages: c.L1Pages, CPRanks: max(c.Layout.AttnCP, 1), BatchTokens: c.BatchTokens, MaxRunning: c.MaxRunning,
		Storage: c.Storage != "", PrefetchSync: c.Time.PrefetchSync, Policy: c.Policy, Strict: c.Strict,
		Time: c.Time.Mode, Speed: c.Time.Speed, Cost: c.Time.Model}
}

// newScheduler is the scheduler of one rank's replica requests over its cache; l, if set,
// observes it (the live counters of the status and metrics).
func newScheduler(cache *hicache.Cache, cfg *Config, shard int, reqs []workload.Request, l *live) *sched.Scheduler {
	s := sched.New(cache, cfg.sched(), shard, reqs)
	if l != nil {
		l.total.Store(int64(len(reqs)))
		s.Observe(l)
	}
	return s
}

// simulateNoCache replays one replica's requests with the cache off: the scheduler of the
// run over a cache that holds nothing (sched.CacheOff), so every prompt token is computed
// and nothing is loaded or backed up. It returns the clock (timings, makespan, computed
// tokens).
func simulateNoCache(cfg *Config, reqs []workload.Request) *vtime.Clock {
	v, err := sched.CacheOff(context.Background(), cfg.sched(), slices.Clone(reqs))
	if err != nil {
		// Over the null cache every step moves a request on (Prepare made sure L1 holds the
		// largest), nothing fails and nothing is cancelled.
		panic("runner: the cache-off simulation failed: " + err.Error())
	}
	return v
}

// newMissTracker is the miss attribution of a replica leader's scheduler.
func newMissTracker(cfg *Config) *sched.MissTracker { return sched.NewMissTracker(cfg.sched()) }
