package core

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/cpcache/cpcache/hicache/kvtest"
)

// A perturbation of one rank's tree or placement puts every rank into quarantine at the same
// step; nothing is served or cached while locks are held; the first step at which every rank
// is idle recovers them all at once, and the cache then works again with equal digests.
func TestDivergenceQuarantinesThenRecovers(t *testing.T) {
	for _, what := range []string{"tree digest", "placement digest"} {
		t.Run(what, func(t *testing.T) {
			r := newCoreRig(t, 4, Options{PageSize: 4, L1Pages: 64}, 64, 7)
			seqs := kvtest.RandomSequences(rand.New(rand.NewPCG(3, 4)), 20, 4)
			for _, s := range seqs[:10] {
				if _, err := r.insert(s); err != nil && !errors.Is(err, ErrL1Full) {
					t.Fatal(err)
				}
				if err := r.step(); err != nil {
					t.Fatal(err)
				}
			}
			held := r.match(seqs[0])
			if err := r.each(func(i int, c *Core) error { return c.Lock(held[i].Last) }); err != nil {
				t.Fatal(err)
			}
			if what == "tree digest" {
				r.cores[2].PerturbTree()
			} else {
				r.cores[2].PerturbPlacement()
			}
			errs := r.stepAll()
			for i, err := range errs {
				var de *DivergedError
				if !errors.As(err, &de) || de.What != what || de.Step != errs[0].(*DivergedError).Step {
					t.Fatalf("rank %d: %v, want a %s divergence at the step of rank 0", i, err, what)
				}
			}
			for i, c := range r.cores {
				if !c.Quarantined() || c.Stats().Divergences != 1 {
					t.Fatalf("rank %d: quarantined %t, divergences %d", i, c.Quarantined(), c.Stats().Divergences)
				}
				if m := c.Match(Request{Tokens: seqs[0]}); m.DevicePages+m.HostPages != 0 {
					t.Fatalf("rank %d serves %d+%d pages in quarantine", i, m.DevicePages, m.HostPages)
				}
				if res, err := c.Insert(Request{Tokens: seqs[15]}); err != nil || res.Pages != 0 || len(res.Fill) != 0 {
					t.Fatalf("rank %d caches in quarantine: %+v, %v", i, res, err)
				}
				if rd := c.Ready(); len(rd.Transfers)+len(rd.Jobs) != 0 {
					t.Fatalf("rank %d starts I/O in quarantine: %+v", i, rd)
				}
			}
			// Busy (a lock held): no recovery, however long; digests are still checked.
			for range 3 {
				for i, err := range r.stepAll() {
					if err != nil || !r.cores[i].Quarantined() {
						t.Fatalf("rank %d while busy: %v, quarantined %t", i, err, r.cores[i].Quarantined())
					}
				}
			}
			if err := r.each(func(i int, c *Core) error { return c.Unlock(held[i].Last) }); err != nil {
				t.Fatal(err)
			}
			for i, err := range r.stepAll() {
				st := r.cores[i].Stats()
				if err != nil || r.cores[i].Quarantined() || st.Recoveries != 1 || st.QuarantinedSteps != 4 {
					t.Fatalf("rank %d after the idle step: %v, quarantined %t, stats %+v", i, err, r.cores[i].Quarantined(), st)
				}
			}
			r.checkSame()
			fresh, _ := New(r.cores[0].Config())
			if r.cores[0].Allocator().Digest() != fresh.Allocator().Digest() || r.cores[0].Nodes() != 0 {
				t.Fatal("the recovery did not reset to a fresh state")
			}
			for _, s := range seqs {
				if _, err := r.insert(s); err != nil && !errors.Is(err, ErrL1Full) {
					t.Fatal(err)
				}
				if err := r.step(); err != nil {
					t.Fatal(err)
				}
				r.match(s)
			}
			if st := r.cores[0].Stats(); st.DigestMismatches != 1 {
				t.Fatalf("mismatches after the recovery: %d, want the one", st.DigestMismatches)
			}
		})
	}
}

// The tree digest sees what the replicated decisions read, not only counts: LRU order, which
// nodes hold L1 pages, and which nodes are locked.
func TestTreeDigestCoversLRUResidencyAndLocks(t *testing.T) {
	build := func() (*Core, [][]int32) {
		c, err := New(Config{Options: Options{PageSize: 4, L1Pages: 16}, Slabs: 1, PagesPerSlab: 16})
		if err != nil {
			t.Fatal(err)
		}
		seqs := [][]int32{{1, 1, 1, 1, 2, 2, 2, 2}, {3, 3, 3, 3, 4, 4, 4, 4}}
		for _, s := range seqs {
			if _, err := c.Insert(Request{Tokens: s}); err != nil {
				t.Fatal(err)
			}
		}
		// Commit the backups (one rank: its completions are the group's).
		var done Done
		for _, tr := range c.Ready().Transfers {
			done.Transfers = append(done.Transfers, TransferDone{Kind: tr.Kind, Seq: tr.Seq})
		}
		c.Report(done)
		if err := c.Apply(readyVector(c)); err != nil || c.Queues().Writes != 0 {
			t.Fatalf("backups not committed: %v, %+v", err, c.Queues())
		}
		return c, seqs
	}
	digest := func(c *Core) int64 {
		if err := c.CheckInvariants(); err != nil {
			t.Fatal(err)
		}
		return c.treeDigest()
	}
	a, seqs := build()
	b, _ := build()
	if digest(a) != digest(b) {
		t.Fatal("equal histories, different digests")
	}
	// LRU order: the same two matches in a different order.
	a.Match(Request{Tokens: seqs[0]})
	a.Match(Request{Tokens: seqs[1]})
	b.Match(Request{Tokens: seqs[1]})
	b.Match(Request{Tokens: seqs[0]})
	if digest(a) == digest(b) {
		t.Fatal("the tree digest is blind to LRU order")
	}
	// Residency: the same number of L1 pages, held by different nodes (the others L2-only).
	a, _ = build()
	b, _ = build()
	a.clearL1(a.peek("", seqs[0]))
	b.clearL1(b.peek("", seqs[1]))
	if a.L1UsedAll() != b.L1UsedAll() || digest(a) == digest(b) {
		t.Fatal("the tree digest is blind to which nodes hold L1 pages")
	}
	// Locks: one lock each, on different nodes.
	a, _ = build()
	b, _ = build()
	if err := errors.Join(a.Lock(a.Peek(Request{Tokens: seqs[0]}).Handle), b.Lock(b.Peek(Request{Tokens: seqs[1]}).Handle)); err != nil {
		t.Fatal(err)
	}
	if digest(a) == digest(b) {
		t.Fatal("the tree digest is blind to which nodes are locked")
	}
}

// A tree perturbation of an empty tree (a salted digest) ends with the recovery like any
// other: the recovered group agrees again instead of diverging at every following step.
func TestRecoveryClearsEmptyTreePerturbation(t *testing.T) {
	r := newCoreRig(t, 2, Options{PageSize: 4, L1Pages: 16}, 16, 1)
	r.cores[1].PerturbTree() // empty tree: salts rank 1's tree digest
	for i, err := range r.stepAll() {
		if !errors.Is(err, ErrPlacementDiverged) {
			t.Fatalf("rank %d: %v, want a divergence", i, err)
		}
	}
	for step := range 4 {
		for i, err := range r.stepAll() { // the first is the recovery (every rank idle)
			if err != nil || r.cores[i].Quarantined() {
				t.Fatalf("step %d after the divergence, rank %d: %v, quarantined %t", step, i, err, r.cores[i].Quarantined())
			}
		}
	}
	for i, c := range r.cores {
		if st := c.Stats(); st.Divergences != 1 || st.Recoveries != 1 {
			t.Fatalf("rank %d: %d divergences, %d recoveries; want 1 and 1", i, st.Divergences, st.Recoveries)
		}
	}
}

// The divergence keeps the O(1) tree digest equal to its recomputation: nodes that lose
// their L2 copy (and keep L1 pages) are marked like every other state change.
func TestDivergenceKeepsIncrementalTreeDigest(t *testing.T) {
	r := newCoreRig(t, 2, Options{PageSize: 4, L1Pages: 32}, 16, 1)
	seqs := kvtest.RandomSequences(rand.New(rand.NewPCG(5, 6)), 6, 4)
	for _, s := range seqs {
		if _, err := r.insert(s); err != nil {
			t.Fatal(err)
		}
	}
	for r.cores[0].Queues().Writes > 0 { // commit the write-through backups: L1+L2 nodes
		if err := r.step(); err != nil {
			t.Fatal(err)
		}
	}
	r.cores[1].PerturbPlacement()
	r.stepAll()
	for i, c := range r.cores {
		if !c.Quarantined() {
			t.Fatalf("rank %d not quarantined", i)
		}
		if err := c.CheckInvariants(); err != nil {
			t.Fatalf("rank %d after the divergence: %v", i, err)
		}
	}
}

// PerturbPlacement diverges the group whatever L2 holds: with L2 full (the steady state of a
// busy cache) and when it fires again before the recovery, instead of panicking.
func TestPerturbPlacementWithL2Full(t *testing.T) {
	r := newCoreRig(t, 2, Options{PageSize: 1, L1Pages: 32}, 4, 1)
	for i := range 4 { // 4 two-page sequences fill the 2 × 4 L2 pages
		if _, err := r.insert([]int32{int32(i), 0}); err != nil {
			t.Fatal(err)
		}
	}
	for r.cores[0].Queues().Writes > 0 {
		if err := r.step(); err != nil {
			t.Fatal(err)
		}
	}
	if free := r.cores[0].Allocator().TotalFree(); free != 0 {
		t.Fatalf("%d L2 pages free, want L2 full", free)
	}
	held := r.match([]int32{0, 0})
	if err := r.each(func(i int, c *Core) error { return c.Lock(held[i].Last) }); err != nil {
		t.Fatal(err)
	}
	r.cores[1].PerturbPlacement()
	for i, err := range r.stepAll() {
		var de *DivergedError
		if !errors.As(err, &de) || de.What != "placement digest" {
			t.Fatalf("rank %d: %v, want a placement divergence", i, err)
		}
	}
	r.cores[0].PerturbPlacement() // again, in quarantine
	r.cores[0].PerturbPlacement()
	for range 2 {
		for i, err := range r.stepAll() {
			if err != nil || !r.cores[i].Quarantined() {
				t.Fatalf("rank %d in quarantine: %v, quarantined %t", i, err, r.cores[i].Quarantined())
			}
		}
	}
	if err := r.each(func(i int, c *Core) error { return c.Unlock(held[i].Last) }); err != nil {
		t.Fatal(err)
	}
	for range 3 { // the recovery, then agreement
		for i, err := range r.stepAll() {
			if err != nil || r.cores[i].Quarantined() {
				t.Fatalf("rank %d after the recovery: %v, quarantined %t", i, err, r.cores[i].Quarantined())
			}
		}
	}
	r.checkSame()
}

// A request that holds a lock on a prefix a divergence dropped still holds its handle after
// the recovery and a flush (neither waits for it: a dropped lock leaves the group idle); its
// one Unlock is accepted then, a second is refused and changes nothing. The replica sim
// counts such a lock as held across a flush (TestReplicasRandomOps, seed 174).
func TestDroppedLockOutlivesRecoveryAndFlush(t *testing.T) {
	for _, n := range []int{2, 4, 8} { // one rank has nobody to diverge from
		t.Run(fmt.Sprintf("CP%d", n), func(t *testing.T) {
			r := newCoreRig(t, n, Options{PageSize: 4, L1Pages: 64}, 16, 5)
			tokens := seqTokens(4, 4, 1)
			r.hostOnly(tokens)
			held := r.match(tokens)
			if err := r.each(func(i int, c *Core) error { return c.Lock(held[i].Last) }); err != nil {
				t.Fatal(err)
			}
			r.cores[n-1].PerturbPlacement()
			for i, err := range r.stepAll() {
				var de *DivergedError
				if !errors.As(err, &de) || de.What != "placement digest" {
					t.Fatalf("rank %d: %v, want a placement divergence", i, err)
				}
				if !r.cores[i].gone(held[i].Last) || !r.cores[i].Idle() {
					t.Fatalf("rank %d: held node removed %t, idle %t: want the lock dropped with L2", i, r.cores[i].gone(held[i].Last), r.cores[i].Idle())
				}
			}
			for k := 0; r.cores[0].Quarantined(); k++ {
				if k > 10 {
					t.Fatal("a dropped lock kept the group in quarantine")
				}
				for i, err := range r.stepAll() {
					if err != nil {
						t.Fatalf("rank %d in quarantine: %v", i, err)
					}
				}
			}
			if err := r.each(func(_ int, c *Core) error { return c.Reset() }); err != nil {
				t.Fatalf("flush with only a dropped lock held: %v", err)
			}
			if err := r.each(func(i int, c *Core) error { return c.Unlock(held[i].Last) }); err != nil {
				t.Fatalf("the request's unlock of its dropped lock after the flush: %v", err)
			}
			before := r.cores[0].StateDigest()
			if err := r.each(func(i int, c *Core) error { return c.Unlock(held[i].Last) }); !errors.Is(err, ErrBadArgument) {
				t.Fatalf("second unlock: %v, want ErrBadArgument", err)
			}
			if r.cores[0].StateDigest() != before {
				t.Fatal("the refused unlock changed the state")
			}
			r.checkSame()
		})
	}
}
