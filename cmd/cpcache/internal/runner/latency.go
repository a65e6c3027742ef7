package runner

import (
	"time"

	"github.com/cpcache/cpcache/sim/report"
)

// addTiming adds what virtual time and the miss attribution measured to r: the replica
// leaders' timings with the cache on, each replica's requests simulated with the cache off,
// the consensus latencies lat and the reference hit counts of the workload.
func addTiming(r *report.Report, p *Plan, results []rankResult, lat []time.Duration) {
	var on, off []report.ReplicaTiming
	for _, x := range results {
		if x.Leader && x.Timing != nil {
			on = append(on, *x.Timing)
			off = append(off, report.TimingOf(simulateNoCache(&p.Config, p.ReplicaRequests(x.DP))))
		}
	}
	t := p.Config.Time
	r.AddTiming(report.Time{Mode: t.Mode, Speed: t.Speed, Cost: t.Cost, Model: t.Model, PrefetchSync: t.PrefetchSync, Storage: p.Config.Storage != ""},
		on, off, lat, referenceOf(p))
}
