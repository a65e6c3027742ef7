package parallel_test

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cpcache/cpcache/parallel"
)

func rng(a, b int) []int { // a..b inclusive
	var s []int
	for i := a; i <= b; i++ {
		s = append(s, i)
	}
	return s
}

func singletons(n int) [][]int {
	var out [][]int
	for i := range n {
		out = append(out, []int{i})
	}
	return out
}

func TestLayoutTable(t *testing.T) {
	cases := []struct {
		name          string
		cfg           parallel.LayoutConfig
		attnTP        int
		tp, attnTPGrp [][]int
		attnCP, ep    [][]int
		replica       [][]int
	}{
		{
			name:      "CP8DP2EP16 with DP attention",
			cfg:       parallel.LayoutConfig{World: 16, TP: 16, DP: 2, AttnCP: 8, EP: 16, DPAttention: true},
			attnTP:    1,
			tp:        [][]int{rng(0, 15)},
			attnTPGrp: singletons(16),
			attnCP:    [][]int{rng(0, 7), rng(8, 15)},
			ep:        [][]int{rng(0, 15)},
			replica:   [][]int{rng(0, 7), rng(8, 15)},
		},
		{
			name:      "TP8",
			cfg:       parallel.LayoutConfig{World: 8, TP: 8},
			attnTP:    8,
			tp:        [][]int{rng(0, 7)},
			attnTPGrp: [][]int{rng(0, 7)},
			attnCP:    singletons(8),
			ep:        singletons(8),
			replica:   [][]int{rng(0, 7)},
		},
		{
			name:      "TP8 DP8 with DP attention",
			cfg:       parallel.LayoutConfig{World: 8, TP: 8, DP: 8, EP: 8, DPAttention: true},
			attnTP:    1,
			tp:        [][]int{rng(0, 7)},
			attnTPGrp: singletons(8),
			attnCP:    singletons(8),
			ep:        [][]int{rng(0, 7)},
			replica:   singletons(8),
		},
		{
			name:      "CP4 TP2 on 8 ranks",
			cfg:       parallel.LayoutConfig{World: 8, TP: 8, AttnCP: 4, EP: 2},
			attnTP:    2,
			tp:        [][]int{rng(0, 7)},
			attnTPGrp: [][]int{{0, 1}, {2, 3}, {4, 5}, {6, 7}},
			attnCP:    [][]int{{0, 2, 4, 6}, {1, 3, 5, 7}},
			ep:        [][]int{{0, 1}, {2, 3}, {4, 5}, {6, 7}},
			replica:   [][]int{rng(0, 7)},
		},
		{
			name:      "CP8 DP1 (CP group equals TP group)",
			cfg:       parallel.LayoutConfig{World: 8, TP: 8, AttnCP: 8},
			attnTP:    1,
			tp:        [][]int{rng(0, 7)},
			attnTPGrp: singletons(8),
			attnCP:    [][]int{rng(0, 7)},
			ep:        singletons(8),
			replica:   [][]int{rng(0, 7)},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l, err := parallel.NewLayout(c.cfg)
			require.NoError(t, err)
			assert.Equal(t, c.attnTP, l.AttnTP)
			assert.Equal(t, c.tp, l.Groups(parallel.KindTP))
			assert.Equal(t, c.attnTPGrp, l.Groups(parallel.KindAttnTP))
			assert.Equal(t, c.attnCP, l.Groups(parallel.KindAttnCP))
			assert.Equal(t, c.attnCP, l.Groups(parallel.KindSlab))
			assert.Equal(t, c.ep, l.Groups(parallel.KindEP))
			assert.Equal(t, c.replica, l.Groups(parallel.KindReplica))
			checkLayoutProperties(t, l)
		})
	}
}

// checkLayoutProperties: each kind partitions the world, each rank is in exactly one group
// of each kind, the slab group is inside the replica group, and Coord/Rank agree with the
// rank-order rule.
func checkLayoutProperties(t *testing.T, l *parallel.Layout) {
	t.Helper()
	w := l.Config.World
	for _, kind := range parallel.AllKinds {
		seen := make([]int, w)
		for _, g := range l.Groups(kind) {
			require.True(t, slices.IsSorted(g), "%s group %v not sorted", kind, g)
			for _, r := range g {
				require.True(t, r >= 0 && r < w, "%s rank %d out of range", kind, r)
				seen[r]++
			}
		}
		for r, n := range seen {
			require.Equal(t, 1, n, "%s: rank %d in %d groups", kind, r, n)
			require.Contains(t, l.GroupOf(kind, r), r)
		}
	}
	for r := range w {
		for _, s := range l.SlabGroup(r) {
			require.Contains(t, l.ReplicaGroup(r), s, "slab group of %d not inside replica group", r)
		}
		c := l.Coord(r)
		require.Equal(t, r, l.Rank(c))
		require.Equal(t, r, c.DP*l.AttnCP*l.AttnTP+c.CP*l.AttnTP+c.TP)
		// Same-CP-group members share dp and tp coordinates.
		for _, s := range l.SlabGroup(r) {
			require.Equal(t, c.DP, l.Coord(s).DP)
			require.Equal(t, c.TP, l.Coord(s).TP)
		}
		require.Len(t, l.ReplicaGroup(r), l.AttnCP*l.AttnTP)
	}
}

func TestLayoutPropertiesOverManyConfigs(t *testing.T) {
	valid := 0
	for world := 1; world <= 32; world++ {
		for dp := 1; dp <= world; dp++ {
			for cp := 1; cp <= world; cp++ {
				for _, ep := range []int{1, 2, world} {
					for _, dpa := range []bool{false, true} {
						l, err := parallel.NewLayout(parallel.LayoutConfig{World: world, DP: dp, AttnCP: cp, EP: ep, DPAttention: dpa})
						if err != nil {
							require.ErrorIs(t, err, parallel.ErrBadLayout)
							continue
						}
						valid++
						checkLayoutProperties(t, l)
					}
				}
			}
		}
	}
	assert.Greater(t, valid, 500)
}

func TestLayoutErrorsNameTheValue(t *testing.T) {
	cases := []struct {
		cfg  parallel.LayoutConfig
		want string
	}{
		{parallel.LayoutConfig{World: 0}, "world size 0"},
		{parallel.LayoutConfig{World: 8, AttnCP: -2}, "attn-cp size -2"},
		{parallel.LayoutConfig{World: 8, TP: 4}, "tp 4 must equal world 8"},
		{parallel.LayoutConfig{World: 8, DP: 3, DPAttention: true}, "tp 8 is not divisible by dp 3"},
		{parallel.LayoutConfig{World: 8, DP: 2}, "dp 2 needs DP attention"},
		{parallel.LayoutConfig{World: 8, DP: 2, AttnCP: 8, DPAttention: true}, "attn-cp 8 needs 8 ranks per DP replica"},
		{parallel.LayoutConfig{World: 12, AttnCP: 5}, "not divisible by attn-cp 5"},
		{parallel.LayoutConfig{World: 16, EP: 3}, "ep 3 does not divide world 16"},
		{parallel.LayoutConfig{World: 1 << 40, DP: 1 << 40, DPAttention: true}, "world size 1099511627776 is more than"},
		{parallel.LayoutConfig{World: 1<<20 + 1}, "world size 1048577 is more than"},
	}
	for _, c := range cases {
		_, err := parallel.NewLayout(c.cfg)
		require.Error(t, err, "%+v", c.cfg)
		assert.ErrorIs(t, err, parallel.ErrBadLayout)
		assert.Contains(t, err.Error(), c.want)
	}
}

func TestGroupName(t *testing.T) {
	assert.Equal(t, "tp[0..15]", parallel.GroupName("tp", rng(0, 15)))
	assert.Equal(t, "attn_cp[1,3]", parallel.GroupName("attn_cp", []int{1, 3}))
	assert.Equal(t, "x[4]", parallel.GroupName("x", []int{4}))
}

// TestSharedSlabGroup: at DP 2 × attn-CP 2 × attn-TP 4 the shared slab group of a rank is the
// TP-0 rank of each CP index of its DP block; only those write; every rank of the block maps.
func TestSharedSlabGroup(t *testing.T) {
	l, err := parallel.NewLayout(parallel.LayoutConfig{World: 16, TP: 16, DP: 2, AttnCP: 2, DPAttention: true})
	require.NoError(t, err)
	require.Equal(t, 4, l.AttnTP)
	for r := range 16 {
		block := r / 8 * 8
		assert.Equal(t, []int{block, block + 4}, l.SharedSlabGroup(r), "rank %d", r)
		assert.Equal(t, rng(block, block+7), l.SlabSharers(r), "rank %d", r)
		assert.Equal(t, r%4 == 0, l.SharedSlabWriter(r), "rank %d", r)
	}
	assert.Nil(t, l.SharedSlabGroup(16))
	assert.False(t, l.SharedSlabWriter(-1))
	one, err := parallel.NewLayout(parallel.LayoutConfig{World: 4, AttnCP: 4})
	require.NoError(t, err)
	for r := range 4 {
		assert.Equal(t, one.SlabGroup(r), one.SharedSlabGroup(r), "attn-TP 1: the shared group is the slab group")
	}
}
