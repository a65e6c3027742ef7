package hicache

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/cpcache/cpcache/hicache/kvtest"
	"github.com/cpcache/cpcache/parallel"
)

// TestFaultsAgreedOnEveryRank injects, each on one rank of a CP4 group, a copy failure at
// step 2, a tree perturbation at step 8 and a placement perturbation at step 20: every rank
// gets the same Step result at every step (the divergences at exactly steps 8 and 20), the
// failed copy aborts its backup on every rank, each divergence is followed by an agreed
// recovery, and afterwards the replicas agree and serve verified pages from L2.
func TestFaultsAgreedOnEveryRank(t *testing.T) {
	faults := map[int]*Faults{
		2: {CopyFail: StepFault{On: true, Step: 2}},
		1: {DivergeTree: StepFault{On: true, Step: 8}},
		3: {DivergePlacement: StepFault{On: true, Step: 20}},
	}
	r := newRig(t, rigConfig{
		layout: parallel.LayoutConfig{World: 4, AttnCP: 4}, opts: Options{PageSize: 4, L1Pages: 96, MinLoadPages: 1, LoadQuotaPages: 64},
		pagesPerSlab: 64, pageBytes: 64, faults: func(i int) *Faults { return faults[i] },
	})
	seqs := kvtest.RandomSequences(rand.New(rand.NewPCG(31, 31)), 12, 4)
	var diverged []uint64
	for k := range 30 {
		step := r.caches[0].core.NextStep()
		if _, err := r.insert(seqs[k%len(seqs)]); err != nil {
			t.Fatal(err)
		}
		errs := r.all(func(i int) error { return r.caches[i].Step(context.Background()) })
		for i, err := range errs {
			var de *DivergedError
			if err != nil && (!errors.As(err, &de) || de.Step != step) || (err == nil) != (errs[0] == nil) {
				t.Fatalf("step %d: rank %d: %v; rank 0: %v", step, i, err, errs[0])
			}
		}
		if errs[0] != nil {
			diverged = append(diverged, step)
		}
	}
	if !slices.Equal(diverged, []uint64{8, 20}) {
		t.Fatalf("divergences at steps %v, want [8 20]", diverged)
	}
	r.drain()
	r.checkAgree()
	for i, c := range r.caches {
		st := c.Stats()
		if st.Divergences != 2 || st.Recoveries != 2 || st.Quarantined || st.AbortedWrites+st.FailedLoads != 1 {
			t.Fatalf("rank %d: %d divergences, %d recoveries, quarantined %t, %d aborted backups + %d failed loads; want 2, 2, false, 1",
				i, st.Divergences, st.Recoveries, st.Quarantined, st.AbortedWrites, st.FailedLoads)
		}
	}
	if err := r.each("evict", func(_ int, c *Cache) error { _, _, err := c.EvictL1(1 << 20); return err }); err != nil {
		t.Fatal(err)
	}
	r.drain()
	hosted := 0
	for _, s := range seqs {
		ms, err := r.matchLoad(s, true)
		if err != nil {
			t.Fatal(err)
		}
		hosted += ms[0].DevicePages
	}
	if hosted == 0 {
		t.Fatal("nothing served from L2 after the recoveries")
	}
}

// TestNewFaultIsAgreed: Faults.NewError on one rank makes every rank's New return the same
// *StartError naming it; only that rank's error wraps ErrInjected.
func TestNewFaultIsAgreed(t *testing.T) {
	const n, bad = 4, 3
	errs := newOnEveryRank(t, n, func(i int, cfg *Config) {
		if i == bad {
			cfg.Faults = &Faults{NewError: errors.New("engine check failed")}
		}
	})
	for i, err := range errs {
		var se *StartError
		if !errors.As(err, &se) || se.Rank != bad || err.Error() != errs[0].Error() || errors.Is(err, ErrInjected) != (i == bad) {
			t.Fatalf("rank %d: %v; want the StartError of rank %d, identical on every rank", i, err, bad)
		}
	}
}
