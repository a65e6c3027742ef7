package hicache

import (
	"testing"
	"time"

	"github.com/cpcache/cpcache/parallel"
)

func TestReplicasRandomWorkload(t *testing.T) {
	cases := []struct {
		name   string
		layout parallel.LayoutConfig
		policy Policy
		steps  int
	}{
		// CP8 DP2: the replica group is one DP block of 8, which is also the slab group.
		{"cp8dp2/write_through", parallel.LayoutConfig{World: 16, DP: 2, AttnCP: 8, EP: 16, DPAttention: true}, WriteThrough, 1500},
		{"cp8dp2/write_back", parallel.LayoutConfig{World: 16, DP: 2, AttnCP: 8, EP: 16, DPAttention: true}, WriteBack, 1500},
		{"cp8dp2/write_through_selective", parallel.LayoutConfig{World: 16, DP: 2, AttnCP: 8, EP: 16, DPAttention: true}, WriteThroughSelective, 1000},
		// CP8 TP2: 16 replicas, two slab groups of 8 (one per tensor-parallel shard).
		{"cp8tp2/write_through", parallel.LayoutConfig{World: 16, AttnCP: 8}, WriteThrough, 1200},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if testing.Short() {
				tc.steps /= 4
			}
			r := newRig(t, rigConfig{
				layout:       tc.layout,
				opts:         Options{PageSize: 4, L1Pages: 64, Policy: tc.policy, MinLoadPages: 2, LoadQuotaPages: 64},
				pagesPerSlab: 24, pageBytes: 64, maxDelay: 300 * time.Microsecond, seed: 3,
			})
			counts := r.workload(tc.steps, 11, 400)
			r.drain()
			cc := r.checkCollectives()
			st := r.caches[0].Stats()
			t.Logf("ranks=%d %v collectives=%+v stats=%+v", len(r.caches), counts, cc, st.CoreStats)
			if cc.AllReduce != int(st.Steps)+1 || cc.Barrier != counts["flush"] {
				t.Fatalf("collectives %+v: want %d all-reduces (one per step plus New's) and %d barriers", cc, st.Steps+1, counts["flush"])
			}
			// Selective write-through backs up few nodes, so loads are rare there (the core
			// test covers them).
			if st.WrittenPages == 0 || st.LoadedPages == 0 && tc.policy != WriteThroughSelective || st.EvictedL1Pages == 0 || st.EvictedL2Pages == 0 {
				t.Fatalf("workload did not exercise every tier: %+v", st.CoreStats)
			}
		})
	}
}
