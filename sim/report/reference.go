package report

import "github.com/cpcache/cpcache/workload"

// Reference are the hit counts a run's measured hits are read against, computed from the
// workload alone (see workload.ReuseBound and workload.LRUBlockHits), summed over the
// replicas (each over the requests routed to it).
type Reference struct {
	// ReuseBound: prompt tokens an unlimited cache of the run's page size serves when the
	// requests run one at a time.
	ReuseBoundTokens  int64   `json:"reuse_bound_tokens"`
	ReuseBoundHitRate float64 `json:"reuse_bound_hit_rate"`
	// LRUBlock: prompt tokens an LRU of blocks of a trace's hash-id size (BlockSize) with
	// the capacity of one replica's cache (CapacityTokens: its L2, or its L1 when larger)
	// serves.
	LRUBlockTokens  int64   `json:"lru_block_tokens"`
	LRUBlockHitRate float64 `json:"lru_block_hit_rate"`
	CapacityTokens  int64   `json:"capacity_tokens"`
	// LRUBlockSize is the tokens of one block of the LRU when they are not
	// workload.BlockTokens (512/N at --trace-scale N); 0, and absent from the JSON, for
	// 512-token blocks, so that an unscaled report reads as it did before the field, and a
	// report written then reads as 512. BlockSize is the size either way.
	LRUBlockSize int `json:"lru_block_size,omitempty"`
}

// BlockSize is the tokens of one block of the LRU reference (see LRUBlockSize).
func (r Reference) BlockSize() int {
	if r.LRUBlockSize > 0 {
		return r.LRUBlockSize
	}
	return workload.BlockTokens
}

// ReferenceOf computes the reference hit counts of a run whose replicas serve the requests
// of replicas (one list per replica), with pages of pageSize tokens, trace blocks (hash
// ids) of blockTokens tokens (workload.BlockTokens, or 512/N for a trace read at 1/N) and a
// cache of capacityTokens per replica.
func ReferenceOf(replicas [][]workload.Request, pageSize, blockTokens int, capacityTokens int64) Reference {
	ref := Reference{CapacityTokens: capacityTokens}
	if blockTokens != workload.BlockTokens {
		ref.LRUBlockSize = blockTokens
	}
	var input int64
	for _, reqs := range replicas {
		for _, r := range reqs {
			input += int64(len(r.Tokens))
		}
		ref.ReuseBoundTokens += workload.ReuseBound(reqs, pageSize)
		if blockTokens > 0 {
			ref.LRUBlockTokens += workload.LRUBlockHits(reqs, blockTokens, int(capacityTokens/int64(blockTokens)))
		}
	}
	if input > 0 {
		ref.ReuseBoundHitRate = float64(ref.ReuseBoundTokens) / float64(input)
		ref.LRUBlockHitRate = float64(ref.LRUBlockTokens) / float64(input)
	}
	return ref
}
