package hicache

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/cpcache/cpcache/hicache/kvtest"
	"github.com/cpcache/cpcache/parallel"
	"github.com/cpcache/cpcache/parallel/local"
)

func mustLayout(t *testing.T, cfg parallel.LayoutConfig) *parallel.Layout {
	t.Helper()
	l, err := parallel.NewLayout(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// The misconfiguration this guards against: CP8 DP2 EP16 with DP attention, and the
// attention-TP group (size 1 under DP attention) handed to the cache as its consensus
// group. Accepted, every "size > 1" collective would silently do nothing and the ranks
// sharing a slab would diverge. Construction fails and names both groups.
func TestScopeRejectsAttnTPGroupAsConsensusCP8DP2(t *testing.T) {
	l := mustLayout(t, parallel.LayoutConfig{World: 16, TP: 16, DP: 2, AttnCP: 8, EP: 16, DPAttention: true})
	for _, rank := range []int{0, 5, 13} {
		attnTP := l.GroupOf(parallel.KindAttnTP, rank)
		if len(attnTP) != 1 {
			t.Fatalf("attention-TP group of rank %d is %v, want size 1", rank, attnTP)
		}
		g := local.New(attnTP, local.Options{Kind: "attn_tp"})[0]
		slabs := kvtest.NewMemSlabs(l.SlabGroup(rank), 8, 64)
		c, err := New(context.Background(), Config{Options: Options{L1Pages: 16}, Layout: l, Rank: rank, Group: g, Slabs: slabs})
		if err == nil {
			c.Close()
			t.Fatalf("rank %d: New accepted consensus group %s for slab group %v", rank, g.Name(), l.SlabGroup(rank))
		}
		if !errors.Is(err, ErrScope) {
			t.Fatalf("rank %d: error %v does not wrap ErrScope", rank, err)
		}
		slabName := parallel.GroupName("slab", l.SlabGroup(rank))
		for _, want := range []string{g.Name(), slabName} {
			if !strings.Contains(err.Error(), want) {
				t.Fatalf("rank %d: error %q does not name group %s", rank, err, want)
			}
		}
		t.Logf("rank %d: %v", rank, err)
	}
}

func TestScopeOtherMistakes(t *testing.T) {
	cp8dp2 := mustLayout(t, parallel.LayoutConfig{World: 16, DP: 2, AttnCP: 8, EP: 16, DPAttention: true})
	tp8 := mustLayout(t, parallel.LayoutConfig{World: 8})
	cases := []struct {
		name   string
		layout *parallel.Layout
		rank   int
		group  []int
		slabs  []int
		want   error
	}{
		// The whole TP world as consensus group: it contains the slab group, but the other
		// DP block runs a different scheduler.
		{"tp world as consensus", cp8dp2, 0, seqRanks(0, 16), seqRanks(0, 8), ErrScope},
		{"other dp block's slabs", cp8dp2, 0, seqRanks(0, 8), seqRanks(8, 8), ErrScope},
		{"rank not in group", cp8dp2, 9, seqRanks(0, 8), seqRanks(8, 8), ErrScope},
		// TP8 without CP: each slab group is one rank, but all 8 TP ranks are replicas, so a
		// size-1 consensus group is still wrong.
		{"tp8 size-1 consensus", tp8, 3, []int{3}, []int{3}, ErrScope},
		{"rank outside world", tp8, 9, seqRanks(0, 8), []int{9}, ErrBadConfig},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// Only this rank calls New: where the group is right (another DP block's slabs)
			// the scope error goes to New's first collective, which then times out.
			members := local.New(tc.group, local.Options{Kind: "g", Timeout: time.Second})
			var g parallel.Group = members[0]
			for i, r := range tc.group {
				if r == tc.rank {
					g = members[i]
				}
			}
			_, err := New(context.Background(), Config{Options: Options{L1Pages: 16}, Layout: tc.layout, Rank: tc.rank, Group: g, Slabs: kvtest.NewMemSlabs(tc.slabs, 8, 64)})
			if !errors.Is(err, tc.want) {
				t.Fatalf("New: %v, want %v", err, tc.want)
			}
			t.Log(err)
		})
	}
}

// A size-1 consensus group is legal when the layout replicates nothing: DP attention with
// one rank per DP replica (attn_tp = attn_cp = 1).
func TestScopeSizeOneLegalWhenNothingShared(t *testing.T) {
	l := mustLayout(t, parallel.LayoutConfig{World: 2, DP: 2, DPAttention: true})
	if len(l.ReplicaGroup(1)) != 1 {
		t.Fatalf("replica group %v", l.ReplicaGroup(1))
	}
	g := local.New([]int{1}, local.Options{Kind: "replica"})[0]
	c, err := New(context.Background(), Config{Options: Options{L1Pages: 16, PageSize: 2}, Layout: l, Rank: 1, Group: g, Slabs: kvtest.NewMemSlabs([]int{1}, 8, 64)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Insert(Request{Tokens: []int32{1, 2, 3, 4}}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	steps := 0
	for ; steps == 0 || c.core.Pending() > 0; steps++ {
		if err := c.Step(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if st := c.Stats(); st.WrittenPages != 2 || st.Collectives != int64(steps)+1 {
		t.Fatalf("stats %+v: want 2 pages written and %d collectives", st, steps+1)
	}
}

// Ranks configured differently fail together at New.
func TestNewRejectsConfigMismatch(t *testing.T) {
	l := mustLayout(t, parallel.LayoutConfig{World: 2, AttnCP: 2})
	members := local.World(2, local.Options{Kind: "replica"})
	slabs := kvtest.NewMemSlabs([]int{0, 1}, 8, 64)
	errs := make([]error, 2)
	done := make(chan int)
	for i := range 2 {
		go func() {
			c, err := New(context.Background(), Config{Options: Options{L1Pages: 16 + i}, Layout: l, Rank: i, Group: members[i], Slabs: slabs})
			c.Close()
			errs[i] = err
			done <- i
		}()
	}
	<-done
	<-done
	for i, err := range errs {
		if !errors.Is(err, ErrBadConfig) || !strings.Contains(err.Error(), "configuration differs") {
			t.Fatalf("rank %d: %v", i, err)
		}
	}
}

func seqRanks(start, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = start + i
	}
	return out
}
