package runner

import "github.com/cpcache/cpcache/workload"

// Reference are the hit counts a run's measured hits are read against, computed from the
// workload alone (see workload.ReuseBound and workload.LRUBlockHits), summed over the
// replicas (each over the requests routed to it).
type Reference struct {
	// ReuseBound: prompt tokens an unlimited cache of the run's page size serves when the
	// requests run one at a time.
	ReuseBoundTokens  int64   `json:"reuse_bound_tokens"`
	ReuseBoundHitRate float64 `json:"reuse_bound_hit_rate"`
	// LRUBlock: prompt tokens an LRU of 512-token blocks with the capacity of one replica's
	// cache (CapacityTokens: its L2, or its L1 when larger) serves.
	LRUBlockTokens  int64   `json:"lru_block_tokens"`
	LRUBlockHitRate float64 `json:"lru_block_hit_rate"`
	CapacityTokens  int64   `json:"capacity_tokens"`
}

// CapacityTokens is the cache capacity of one replica in tokens: its CP group's L2 (the
// sum of its slabs), or its L1 when that is larger.
func (p *Plan) CapacityTokens() int64 {
	c := &p.Config
	return int64(max(c.L1Pages, c.L2Pages*p.Layout.AttnCP)) * int64(c.PageSize)
}

func referenceOf(p *Plan) Reference {
	ref := Reference{CapacityTokens: p.CapacityTokens()}
	var input int64
	for dp := range p.Layout.AttnDP {
		reqs := p.ReplicaRequests(dp)
		for _, r := range reqs {
			input += int64(len(r.Tokens))
		}
		ref.ReuseBoundTokens += workload.ReuseBound(reqs, p.Config.PageSize)
		ref.LRUBlockTokens += workload.LRUBlockHits(reqs, int(ref.CapacityTokens/workload.BlockTokens))
	}
	if input > 0 {
		ref.ReuseBoundHitRate = float64(ref.ReuseBoundTokens) / float64(input)
		ref.LRUBlockHitRate = float64(ref.LRUBlockTokens) / float64(input)
	}
	return ref
}
