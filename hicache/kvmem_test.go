package hicache

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/cpcache/cpcache/hicache/kvlayout"
	"github.com/cpcache/cpcache/hicache/kvmem"
	"github.com/cpcache/cpcache/hicache/kvtest"
	"github.com/cpcache/cpcache/parallel"
	"github.com/cpcache/cpcache/parallel/local"
)

// verifyOwnKVPages checks every chunk of rank c's own device pages of a match in its
// per-layer L1 (kvtest's layered content: a page whose layer or part landed elsewhere fails).
func verifyOwnKVPages(c *Cache, m MatchResult, shard int, l1 *kvmem.L1) error {
	pages := m.DevicePages
	path, err := pathTo(c, m.Last)
	if err != nil {
		return err
	}
	for _, n := range path {
		for j := 0; j < n.Pages() && pages > 0; j++ {
			pages--
			idx := n.Depth + j
			if !c.Owns(idx) {
				continue
			}
			if err := kvtest.CheckL1Page(l1, n.L1[j], n.Hashes[j].Index(), idx, shard); err != nil {
				return fmt.Errorf("CP rank %d node %d: %w", c.CPRank(), n.ID, err)
			}
		}
	}
	return nil
}

// Four in-process ranks (two CP ranks × two attention-TP shards) at a Llama-3-8B-like shape
// (K and V of 2048 bytes per token, sharded; 4 layers) with per-layer L1 buffers and both L2
// layouts: sequences inserted, backed up to a file store, evicted from L1 and L2, prefetched
// from storage and loaded back land with every chunk of every layer where it belongs.
func TestKVMemRanksBackUpEvictLoadBack(t *testing.T) {
	kv, err := kvlayout.Parse("layers=4;k=2048:sharded;v=2048:sharded")
	if err != nil {
		t.Fatal(err)
	}
	for _, l2 := range []kvmem.L2Layout{kvmem.PageFirst, kvmem.LayerFirst} {
		t.Run(l2.String(), func(t *testing.T) {
			ns := testNamespace(t)
			rc := l3RigConfig(l3Layout, openStores(t, "file://"+t.TempDir(), ns), ns, L3Options{})
			rc.opts.L1Pages, rc.pagesPerSlab = 48, 48
			rc.pageBytes = 4 * 2 * 4 * 1024 // layers × parts × P × bytes per token on attention-TP 2
			rc.kvLayout, rc.kvL1, rc.l2Layout = &kv, true, l2
			r := newRig(t, rc)
			rng := rand.New(rand.NewPCG(7, uint64(l2)))
			seqs := kvtest.RandomSequences(rng, 8, 4)
			r.insertAll(seqs)
			for _, s := range seqs {
				if _, err := r.matchLoad(s, false); err != nil {
					t.Fatal(err)
				}
			}
			if st := r.sameStats(); st.L3BackedUpPages == 0 || st.L3FailedBackups != 0 {
				t.Fatalf("%d pages backed up, %d failed backups", st.L3BackedUpPages, st.L3FailedBackups)
			}
			r.evictAll()
			loaded := 0
			for _, s := range seqs {
				r.prefetch(s, -1)
				ms, err := r.matchLoad(s, true)
				if err != nil {
					t.Fatal(err)
				}
				loaded += ms[0].DevicePages
				r.drain()
			}
			if loaded == 0 {
				t.Fatal("nothing came back from storage to L1")
			}
		})
	}
}

// A per-layer L1 that does not fit the cache is refused before any rank talks to another.
func TestKVMemConfigErrors(t *testing.T) {
	l, err := parallel.NewLayout(parallel.LayoutConfig{World: 1, TP: 1, AttnCP: 1})
	if err != nil {
		t.Fatal(err)
	}
	kv, _ := kvlayout.Parse("layers=2;k=8:sharded;v=8:sharded")
	other, _ := kvlayout.Parse("layers=3;k=8:sharded;v=8:sharded")
	opts := Options{PageSize: 4, L1Pages: 4}
	mk := func(lay kvlayout.Layout, p, slots int) *kvmem.L1 {
		s, err := kvmem.NewShape(lay, 1, p)
		if err != nil {
			t.Fatal(err)
		}
		l1, err := kvmem.NewL1(s, slots, kvmem.AllocTokenSlotBuffers(s, slots))
		if err != nil {
			t.Fatal(err)
		}
		return l1
	}
	for _, c := range []struct {
		name string
		kv   *kvlayout.Layout
		l1   *kvmem.L1
		l2   kvmem.L2Layout
		want string
	}{
		{"no layout", nil, mk(kv, 4, 4), 0, "needs Config.KVLayout"},
		{"layer_first without layout", nil, nil, kvmem.LayerFirst, "needs Config.KVLayout"},
		{"other layout", &kv, mk(other, 4, 4), 0, "layer count 3 vs 2"},
		{"other page", &kv, mk(kv, 2, 4), 0, "2-token pages"},
		{"few slots", &kv, mk(kv, 4, 3), 0, "3 page slots"},
		{"bad l2", &kv, mk(kv, 4, 4), 9, "l2layout(9)"},
	} {
		g := local.New([]int{0}, local.Options{Kind: "replica", Timeout: 10 * time.Second})[0]
		slabs := kvtest.NewMemSlabs([]int{0}, 4, 2*2*4*8)
		_, err := New(context.Background(), Config{Options: opts, Layout: l, Group: g, Slabs: slabs, KVLayout: c.kv, L1: c.l1, L2Layout: c.l2})
		if !errors.Is(err, ErrBadConfig) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want ErrBadConfig with %q", c.name, err, c.want)
		}
	}
}
