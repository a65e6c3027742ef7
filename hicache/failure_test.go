package hicache

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/cpcache/cpcache/hicache/kvtest"
	"github.com/cpcache/cpcache/parallel"
	"github.com/cpcache/cpcache/parallel/local"
)

// Copies that fail on one rank only: every rank aborts the same backups and marks the same
// loads stale, at the same step; the replicas never disagree and no bad page is served.
func TestTransferFailuresOnOneRankAreAgreed(t *testing.T) {
	const flaky = 2
	r := newRig(t, rigConfig{
		layout:       parallel.LayoutConfig{World: 8, AttnCP: 8},
		opts:         Options{PageSize: 4, L1Pages: 64, Policy: WriteThrough, MinLoadPages: 2, LoadQuotaPages: 64},
		pagesPerSlab: 24, pageBytes: 64, maxDelay: 100 * time.Microsecond, seed: 9,
		fail: func(rank int) func(Transfer) error {
			if rank != flaky {
				return nil
			}
			rng := rand.New(rand.NewPCG(9, 9))
			var mu sync.Mutex
			return func(Transfer) error {
				mu.Lock()
				defer mu.Unlock()
				if rng.IntN(8) == 0 {
					return errInjected
				}
				return nil
			}
		},
	})
	r.workload(600, 61, 300)
	st := r.caches[0].Stats()
	t.Logf("stats %+v; flaky rank: %d transfer errors", st.CoreStats, r.caches[flaky].Stats().TransferErrors)
	if st.AbortedWrites == 0 || st.FailedLoads == 0 || r.caches[flaky].Stats().TransferErrors == 0 || r.caches[0].Stats().TransferErrors != 0 {
		t.Fatalf("failures were not exercised: %+v", st.CoreStats)
	}
	r.checkCollectives()
}

// A scheduler call made on one rank only (a bug in the caller) changes that replica's tree;
// the next step detects it on every rank as a tree-digest divergence.
func TestSkippedCallDetectedAsTreeDivergence(t *testing.T) {
	r := cp8dp2Rig(t, WriteThrough, nil)
	r.workload(20, 71, 0)
	res, err := r.caches[5].Insert(Request{Tokens: tokensN(9000, 12)})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range res.Fill {
		if r.caches[5].Owns(f.Index) {
			b, _ := r.caches[5].L1Page(f.Slot)
			kvtest.FillKV(b, f.Hash.Index(), f.Index, 0)
		}
	}
	errs := r.all(func(i int) error { return r.caches[i].Step(context.Background()) })
	for i, err := range errs {
		var de *DivergedError
		if !errors.As(err, &de) || de.What != "tree digest" {
			t.Fatalf("rank %d: %v, want a tree-digest divergence", i, err)
		}
	}
	t.Log(errs[0])
}

// A rank that stops stepping makes the others' next step fail at the deadline; none hangs.
func TestStepFailsWhenPeerStops(t *testing.T) {
	l := mustLayout(t, parallel.LayoutConfig{World: 4, AttnCP: 4})
	members := local.New(l.ReplicaGroup(0), local.Options{Kind: "replica", Timeout: 5 * time.Second})
	slabs := kvtest.NewMemSlabs(l.SlabGroup(0), 8, 64)
	caches := make([]*Cache, 4)
	errs := make([]error, 4)
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			caches[i], errs[i] = New(context.Background(), Config{Options: Options{L1Pages: 16}, Layout: l, Rank: i, Group: members[i], Slabs: slabs, StepTimeout: 300 * time.Millisecond})
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, c := range caches {
			c.Close()
		}
	}()
	for i := range 3 { // rank 3 never steps
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = caches[i].Step(context.Background())
		}()
	}
	wg.Wait()
	for i := range 3 {
		if !errors.Is(errs[i], parallel.ErrTimeout) {
			t.Fatalf("rank %d: %v, want parallel.ErrTimeout", i, errs[i])
		}
	}
	t.Log(errs[0])
}
