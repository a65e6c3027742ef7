package runner

import (
	"github.com/cpcache/cpcache/sim/report"
	"github.com/cpcache/cpcache/workload"
)

// CapacityTokens is the cache capacity of one replica in tokens: its CP group's L2 (the
// sum of its slabs), or its L1 when that is larger (the sum of its ranks' pools: each holds
// the pages its rank owns).
func (p *Plan) CapacityTokens() int64 {
	c := &p.Config
	return int64(max(c.L1Pages, c.L2Pages)*p.Layout.AttnCP) * int64(c.PageSize)
}

// referenceOf is the reference hit counts of p's workload (see report.Reference).
func referenceOf(p *Plan) report.Reference {
	reps := make([][]workload.Request, p.Layout.AttnDP)
	for dp := range reps {
		reps[dp] = p.ReplicaRequests(dp)
	}
	return report.ReferenceOf(reps, p.Config.PageSize, p.traceBlockTokens(), p.CapacityTokens())
}
