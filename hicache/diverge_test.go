package hicache

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cpcache/cpcache/hicache/core"
	"github.com/cpcache/cpcache/hicache/kvtest"
	"github.com/cpcache/cpcache/parallel"
)

func cp8dp2Rig(t *testing.T, policy Policy, delay func(int) func(Transfer) time.Duration) *rig {
	return newRig(t, rigConfig{
		layout:       parallel.LayoutConfig{World: 16, DP: 2, AttnCP: 8, EP: 16, DPAttention: true},
		opts:         Options{PageSize: 4, L1Pages: 64, Policy: policy, MinLoadPages: 2, LoadQuotaPages: 64},
		pagesPerSlab: 24, pageBytes: 64, maxDelay: 200 * time.Microsecond, seed: 5, delay: delay,
	})
}

func snapshot(slabs []*kvtest.MemSlabs) [][]byte {
	var out [][]byte
	for _, s := range slabs[:1] { // one slab group: every rank shares it
		out = append(out, s.Snapshot()...)
	}
	return out
}

// A replica whose allocator state differs (injected on one rank) is detected at the next
// step on every rank; from then on no slab byte is written and the cache serves from L1.
func TestDivergenceDetectedEverywhereAndL2Stops(t *testing.T) {
	r := cp8dp2Rig(t, WriteThrough, nil)
	r.workload(60, 21, 0)
	// A request holds a lock on a prefix that is only in L2 when the divergence hits.
	held := tokensN(500, 16)
	if _, err := r.insert(held); err != nil {
		t.Fatal(err)
	}
	if err := r.step(); err != nil { // starts the backup
		t.Fatal(err)
	}
	// Every L1 page goes, not a fixed count: how many the workload left in L1 depends on
	// which steps its backups committed at, and EvictL1 takes least recently used pages
	// first, so the prefix just inserted is the last to go.
	r.evictL1()
	ms, err := r.matchLoad(held, false)
	if err != nil {
		t.Fatal(err)
	}
	if ms[0].HostPages != 4 {
		t.Fatalf("held prefix: %d device + %d host pages, want 0 + 4", ms[0].DevicePages, ms[0].HostPages)
	}
	heldNodes := make([]Handle, len(ms))
	for i, m := range ms {
		heldNodes[i] = m.Last
	}
	if err := r.each("lock", func(i int, c *Cache) error { return c.Lock(heldNodes[i]) }); err != nil {
		t.Fatal(err)
	}
	// Backups in flight at detection: made by this insert, deferred to the next step.
	if _, err := r.insert(tokensN(1000, 40)); err != nil {
		t.Fatal(err)
	}
	const odd = 3
	r.caches[odd].core.PerturbPlacement()
	step := r.caches[0].core.NextStep()
	errs := r.all(func(i int) error { return r.caches[i].Step(context.Background()) })
	for i, err := range errs {
		var de *DivergedError
		if !errors.Is(err, ErrPlacementDiverged) || !errors.As(err, &de) {
			t.Fatalf("rank %d: step error %v, want ErrPlacementDiverged", i, err)
		}
		if de.Step != step || de.What != "placement digest" || de.Min == de.Max {
			t.Fatalf("rank %d: %+v, want step %d, placement digest, min != max", i, de, step)
		}
		if i == 0 {
			t.Log(err)
		}
	}
	before := snapshot(r.slabs)
	for i, c := range r.caches {
		st := c.Stats()
		if !st.Quarantined || st.DigestMismatches != 1 || st.Divergences != 1 || !errors.Is(st.Diverged, ErrPlacementDiverged) {
			t.Fatalf("rank %d after divergence: %+v", i, st)
		}
	}
	// The held prefix was dropped with L2; its request's Unlock is accepted.
	if err := r.each("unlock dropped", func(i int, c *Cache) error { return c.Unlock(heldNodes[i]) }); err != nil {
		t.Fatal(err)
	}
	if err := r.each("unlock twice", func(i int, c *Cache) error { return c.Unlock(heldNodes[i]) }); !errors.Is(err, ErrBadArgument) {
		t.Fatalf("second unlock of a dropped node: %v, want ErrBadArgument", err)
	}
	// In quarantine nothing is served or cached.
	if err := r.each("quarantined match", func(i int, c *Cache) error {
		m, err := c.Match(Request{Tokens: tokensN(1000, 40)})
		if err == nil && m.DevicePages+m.HostPages != 0 {
			err = fmt.Errorf("%d+%d pages served in quarantine", m.DevicePages, m.HostPages)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if err := r.each("quarantined insert", func(i int, c *Cache) error {
		res, err := c.Insert(Request{Tokens: tokensN(3000, 20)})
		if err == nil && (res.Pages != 0 || len(res.Fill) != 0) {
			err = fmt.Errorf("insert cached %d pages in quarantine", res.Pages)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	// Every rank is idle now (the dropped lock is gone): the next step is the agreed recovery,
	// and it writes no slab byte.
	if err := r.step(); err != nil {
		t.Fatal(err)
	}
	if after := snapshot(r.slabs); !slices.EqualFunc(before, after, bytes.Equal) {
		t.Fatal("a slab changed between the divergence and the recovery")
	}
	for i, c := range r.caches {
		st := c.Stats()
		if st.Quarantined || st.Recoveries != 1 || st.QuarantinedSteps != 1 || st.Diverged != nil || st.Nodes != 0 {
			t.Fatalf("rank %d after the recovery step: %+v", i, st)
		}
	}
	// Caching resumes with agreeing digests (checked at every step), and no new mismatch.
	r.workload(60, 22, 0)
	if _, err := r.insert(tokensN(2000, 20)); err != nil {
		t.Fatal(err)
	}
	r.evictL1()
	ms, err = r.matchLoad(tokensN(2000, 20), true)
	if err != nil {
		t.Fatal(err)
	}
	if ms[0].DevicePages != 5 {
		t.Fatalf("after the recovery: match %d device + %d host pages, want 5 loaded back from L2", ms[0].DevicePages, ms[0].HostPages)
	}
	if st := r.caches[0].Stats(); st.DigestMismatches != 1 || st.L2HitPages == 0 {
		t.Fatalf("after the recovery: %+v", st.CoreStats)
	}
	r.drain()
	r.flushAndCheckFresh()
	r.workload(30, 23, 0)
	r.checkCollectives()
}

// Flush while a backup is in flight (or a lock is held) is refused on every rank, makes no
// collective and changes nothing; once idle it restores the freshly constructed state.
func TestFlushRefusedWhileBusyThenRestoresFresh(t *testing.T) {
	gate := make(chan struct{})
	var once sync.Once
	open := func() { once.Do(func() { close(gate) }) }
	defer open()
	r := cp8dp2Rig(t, WriteThrough, func(int) func(Transfer) time.Duration {
		return func(Transfer) time.Duration { <-gate; return 0 }
	})
	res, err := r.insert(tokensN(7, 32))
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Backups != 1 {
		t.Fatalf("insert started %d backups, want 1", res[0].Backups)
	}
	if err := r.step(); err != nil { // starts the backup, which waits at the gate
		t.Fatal(err)
	}
	if st := nodeOf(r.caches[0].core, res[0].Last).State; st != StateL1|StateWriting {
		t.Fatalf("node state during the backup: %v, want l1+writing", st)
	}
	busy := func(what string) {
		t.Helper()
		d := r.caches[0].StateDigest()
		cc := r.checkCollectives()
		errs := r.all(func(i int) error { return r.caches[i].Flush(context.Background()) })
		for i, err := range errs {
			if !errors.Is(err, ErrBusy) {
				t.Fatalf("%s: rank %d flush: %v, want ErrBusy", what, i, err)
			}
		}
		t.Logf("%s: %v", what, errs[0])
		if got := r.checkCollectives(); got != cc {
			t.Fatalf("%s: a refused flush made collectives: %+v, before %+v", what, got, cc)
		}
		if r.caches[0].StateDigest() != d {
			t.Fatalf("%s: a refused flush changed the state", what)
		}
		r.checkAgree()
	}
	busy("backup in flight")
	open()
	r.drain()
	if st := nodeOf(r.caches[0].core, res[0].Last).State; st != StateL1|StateL2 {
		t.Fatalf("node state after the backup: %v, want l1+l2", st)
	}
	ms, err := r.matchLoad(tokensN(7, 32), false)
	if err != nil {
		t.Fatal(err)
	}
	nodes := make([]Handle, len(ms))
	for i, m := range ms {
		nodes[i] = m.Last
	}
	if err := r.each("lock", func(i int, c *Cache) error { return c.Lock(nodes[i]) }); err != nil {
		t.Fatal(err)
	}
	busy("lock held")
	if err := r.each("unlock", func(i int, c *Cache) error { return c.Unlock(nodes[i]) }); err != nil {
		t.Fatal(err)
	}
	if r.caches[0].core.Allocator().Digest() == mustFresh(t, r).Allocator().Digest() {
		t.Fatal("the allocator is fresh before the flush; the test proves nothing")
	}
	r.flushAndCheckFresh()
	if err := r.each("lock stale node", func(i int, c *Cache) error { return c.Lock(nodes[i]) }); !errors.Is(err, ErrBadArgument) {
		t.Fatalf("lock of a node from before the flush: %v, want ErrBadArgument", err)
	}
	cc := r.checkCollectives()
	if cc.Barrier != 1 {
		t.Fatalf("collectives %+v: want exactly one barrier (the accepted flush)", cc)
	}
	// The cache works after the flush.
	r.workload(40, 31, 0)
}

func mustFresh(t *testing.T, r *rig) *core.Core {
	c, err := core.New(r.caches[0].core.Config())
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func tokensN(base int32, n int) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = base + int32(i)
	}
	return out
}

// TestFlushInQuarantineAgreesIdleness: in quarantine the replicas differ, idleness included
// (here a Lock made on one rank only), so a Flush must not let one rank refuse alone while
// the others wait in its barrier (which broke the group): every rank refuses with ErrBusy
// and nothing changes; once every rank is idle, every rank flushes and caching resumes.
func TestFlushInQuarantineAgreesIdleness(t *testing.T) {
	r := newTwoRanks(t)
	res, err := r.insert(tokensN(100, 8))
	if err != nil {
		t.Fatal(err)
	}
	r.drain()
	if err := r.caches[1].Lock(res[1].Last); err != nil { // a replicated call made on one rank only
		t.Fatal(err)
	}
	for i, err := range r.all(func(i int) error { return r.caches[i].Step(context.Background()) }) {
		if !errors.Is(err, ErrPlacementDiverged) {
			t.Fatalf("rank %d: %v, want the divergence", i, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second) // bounds a split flush
	defer cancel()
	before := []uint64{r.caches[0].StateDigest(), r.caches[1].StateDigest()}
	for i, err := range r.all(func(i int) error { return r.caches[i].Flush(ctx) }) {
		if !errors.Is(err, ErrBusy) {
			t.Fatalf("rank %d: flush in quarantine with a lock held on rank 1: %v, want ErrBusy on every rank", i, err)
		}
		if d := r.caches[i].StateDigest(); d != before[i] || !r.caches[i].Quarantined() {
			t.Fatalf("rank %d: a refused flush changed the state (digest %#x, was %#x; quarantined %t)", i, d, before[i], r.caches[i].Quarantined())
		}
	}
	if err := r.same("step", r.all(func(i int) error { return r.caches[i].Step(ctx) })); err != nil {
		t.Fatalf("step after the refused flush: %v", err)
	}
	if err := r.caches[1].Unlock(res[1].Last); err != nil {
		t.Fatal(err)
	}
	r.flushAndCheckFresh()
	for i, c := range r.caches {
		if st := c.Stats(); st.Recoveries != st.Divergences || st.Divergences != 1 {
			t.Fatalf("rank %d: %d divergences, %d recoveries: the flush that ended the quarantine is its recovery", i, st.Divergences, st.Recoveries)
		}
	}
	if err := r.step(); err != nil {
		t.Fatal(err)
	}
}
