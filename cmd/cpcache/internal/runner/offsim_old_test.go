package runner

import (
	"cmp"
	"slices"

	"github.com/cpcache/cpcache/sim/vtime"
	"github.com/cpcache/cpcache/workload"
)

// simulateNoCache replays one replica's requests with the cache off under the
// scheduler's own rules (arrival order, token budget, running limit, L1 reservation, one
// turn of a conversation at a time) and the same cost model: every prompt token is
// computed and nothing is loaded or backed up. It needs no ranks, so the cache-off figures
// come from the same run instead of a second one. It returns the clock (timings, makespan,
// computed tokens).
func simulateNoCacheOld(cfg *Config, reqs []workload.Request) *vtime.Clock {
	v := newClock(cfg)
	sc := cfg.sched()
	queue := slices.Clone(reqs)
	if v.Virtual() {
		slices.SortStableFunc(queue, func(a, b workload.Request) int { return cmp.Compare(a.ArrivalMs, b.ArrivalMs) })
	}
	type running struct {
		req       workload.Request
		generated int
		pages     int
	}
	var run []*running
	reserved := 0
	blocked := map[int]bool{}
	for len(queue) > 0 || len(run) > 0 {
		if len(run) == 0 {
			v.AdvanceTo(v.Arrival(queue[0]))
		}
		v.BeginStep()
		keepRun := run[:0]
		for _, a := range run {
			if a.generated < a.req.OutputLen {
				a.generated++
				v.Decoded()
			}
			if a.generated < a.req.OutputLen {
				keepRun = append(keepRun, a)
			} else {
				reserved -= a.pages
			}
		}
		clear(run[len(keepRun):])
		run = keepRun
		clear(blocked)
		for _, a := range run {
			if a.req.Client >= 0 {
				blocked[a.req.Client] = true
			}
		}
		budget, admitted, stop := cfg.BatchTokens, 0, false
		keep := queue[:0]
		for _, r := range queue {
			if !stop && r.Client >= 0 && blocked[r.Client] {
				keep = append(keep, r)
				continue
			}
			if !stop && !v.Arrived(r) {
				stop = true
			}
			need := sc.PagesOf(r)
			if stop || !sc.Fits(r, need, admitted, budget, len(run), reserved) {
				stop = true
				keep = append(keep, r)
				continue
			}
			admitted++
			budget -= len(r.Tokens)
			if r.Client >= 0 {
				blocked[r.Client] = true
			}
			reserved += need
			a := &running{req: r, pages: need}
			if r.OutputLen > 0 {
				a.generated = 1
			}
			run = append(run, a)
			v.Prefilled(r, 0, 0, 0)
		}
		clear(queue[len(keep):])
		queue = keep
		v.EndStep()
	}
	return v
}
