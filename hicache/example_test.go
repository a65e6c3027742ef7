package hicache_test

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"github.com/cpcache/cpcache/hicache"
	"github.com/cpcache/cpcache/hicache/kvtest"
	"github.com/cpcache/cpcache/parallel"
	"github.com/cpcache/cpcache/parallel/local"
)

// Two CP ranks share one L2 (here in-process memory; in production slab.OpenSet over the
// layout's slab group) and run the same scheduler. Each runs this loop in its own goroutine
// (in production: its own process); only rank 0's log is printed.
func Example() {
	layout, err := parallel.NewLayout(parallel.LayoutConfig{World: 2, AttnCP: 2})
	if err != nil {
		panic(err)
	}
	group := local.New(layout.ReplicaGroup(0), local.Options{Kind: "replica"})
	slabs := kvtest.NewMemSlabs(layout.SlabGroup(0), 64, 256)
	logs := make([]string, 2)
	var wg sync.WaitGroup
	for rank := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			log, err := scheduler(rank, layout, group[rank], slabs)
			if err != nil {
				log = err.Error()
			}
			logs[rank] = log
		}()
	}
	wg.Wait()
	fmt.Print(logs[0])
	// Output:
	// step 1: match 0 device + 0 host pages; inserted 3 pages, this rank fills pages [0 2]
	// backups committed: 3 pages in L2
	// step 2: evicted 3 L1 pages
	// step 3: match 0 device + 3 host pages; loading 3 pages; KV verified
	// flushed: 0 nodes, L2 digest fresh: true
}

// scheduler is one rank's scheduler. Every call on cache except WaitL1 and the KV writes is
// a replicated decision, made identically on both ranks.
func scheduler(rank int, layout *parallel.Layout, g parallel.Group, slabs *kvtest.MemSlabs) (string, error) {
	ctx := context.Background()
	var log strings.Builder
	cache, err := hicache.New(ctx, hicache.Config{
		Options: hicache.Options{PageSize: 4, L1Pages: 32},
		Layout:  layout, Rank: rank, Group: g, Slabs: slabs,
	})
	if err != nil {
		return "", err
	}
	defer cache.Close()
	fresh := cache.Stats().PlacementDigest
	prompt := []int32{11, 12, 13, 14, 21, 22, 23, 24, 31, 32, 33, 34, 40} // 3 whole pages + 1 token
	req := hicache.Request{Tokens: prompt}                                // under the empty isolation key

	// Step 1: a new request. Match (a miss), run the prefill, insert the prompt, and write
	// the KV of the pages this rank owns (page i belongs to CP rank i mod 2).
	m, _ := cache.Match(req)
	ins, err := cache.Insert(req)
	if err != nil {
		return "", err
	}
	var own []int
	for _, f := range ins.Fill {
		if cache.Owns(f.Index) {
			b, _ := cache.L1Page(f.Slot)
			kvtest.FillKV(b, f.Hash.Index(), f.Index, 0) // an engine writes computed KV here
			own = append(own, f.Index)
		}
	}
	fmt.Fprintf(&log, "step 1: match %d device + %d host pages; inserted %d pages, this rank fills pages %v\n",
		m.DevicePages, m.HostPages, ins.Pages, own)
	// The consensus step: one AllReduce per step, always. Write-through backups start here
	// and commit at a later step, once every rank has written its pages.
	if err := cache.Step(ctx); err != nil {
		return "", err
	}
	for cache.Pending() > 0 {
		if err := cache.Step(ctx); err != nil {
			return "", err
		}
	}
	fmt.Fprintf(&log, "backups committed: %d pages in L2\n", cache.Stats().WrittenPages)

	// Step 2: memory pressure. The backed-up prefix leaves L1 and stays in L2.
	freed, _, _ := cache.EvictL1(3)
	if err := cache.Step(ctx); err != nil {
		return "", err
	}
	fmt.Fprintf(&log, "step 2: evicted %d L1 pages\n", freed)

	// Step 3: the prompt comes back. Lock the prefix for the request and load the host part
	// back: the copies start at the next Step (once the state they were chosen from is
	// checked), and the group agrees they are over a step or two later. Then match again
	// (every rank sees the same hit, even if a copy failed somewhere) and wait for this
	// rank's copies before a layer reads L1.
	m, _ = cache.Match(req)
	fmt.Fprintf(&log, "step 3: match %d device + %d host pages; ", m.DevicePages, m.HostPages)
	if err := cache.Lock(m.Last); err != nil {
		return "", err
	}
	lr, err := cache.LoadBack(m.Last)
	if err != nil {
		return "", err
	}
	for cache.LoadPending(m.Last) {
		if err := cache.Step(ctx); err != nil {
			return "", err
		}
	}
	m, _ = cache.Match(req)
	if err := cache.WaitL1(ctx, m.Last); err != nil {
		return "", err
	}
	for i, slot := range m.L1Slots {
		if cache.Owns(i) {
			b, _ := cache.L1Page(slot)
			if err := kvtest.CheckKV(b, hicache.PrefixHashes(prompt, 4)[i].Index(), i, 0); err != nil {
				return "", err
			}
		}
	}
	fmt.Fprintf(&log, "loading %d pages; KV verified\n", lr.Pages)
	if err := cache.Step(ctx); err != nil {
		return "", err
	}
	// The request finishes: unlock, let the loads commit, and flush (idle only).
	if err := cache.Unlock(m.Last); err != nil {
		return "", err
	}
	for cache.Pending() > 0 {
		if err := cache.Step(ctx); err != nil {
			return "", err
		}
	}
	if err := cache.Flush(ctx); err != nil {
		return "", err
	}
	st := cache.Stats()
	fmt.Fprintf(&log, "flushed: %d nodes, L2 digest fresh: %t\n", st.Nodes, st.PlacementDigest == fresh)
	return log.String(), nil
}
