package core

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/cpcache/cpcache/hicache/kvtest"
	"github.com/cpcache/cpcache/parallel"
)

// coreRig runs N cores of one slab group in lockstep with synchronous, randomly delayed
// transfers: the deterministic core tested without goroutines.
type coreRig struct {
	t       testing.TB
	cores   []*Core
	slabs   *kvtest.MemSlabs
	l1      [][]byte
	pending [][]Transfer
	jobs    [][]StorageJob // storage jobs not yet finished (stepL3)
	rngs    []*rand.Rand
	fail    float64 // probability that a transfer fails on a rank
	pb      int
}

func newCoreRig(t testing.TB, n int, opts Options, pagesPerSlab int, seed uint64) *coreRig {
	r := &coreRig{t: t, pb: 64, slabs: kvtest.NewMemSlabs(make([]int, n), pagesPerSlab, 64)}
	for i := 0; i < n; i++ {
		c, err := New(Config{Options: opts, Slabs: n, PagesPerSlab: pagesPerSlab, CPRank: i})
		if err != nil {
			t.Fatal(err)
		}
		r.cores = append(r.cores, c)
		r.l1 = append(r.l1, make([]byte, c.cfg.L1Pages*r.pb))
		r.pending = append(r.pending, nil)
		r.rngs = append(r.rngs, rand.New(rand.NewPCG(seed, uint64(i))))
	}
	return r
}

func (r *coreRig) slot(rank int, s int32) []byte { return r.l1[rank][int(s)*r.pb : int(s+1)*r.pb] }

// run executes a transfer's copies on rank.
func (r *coreRig) run(rank int, t Transfer) error {
	if r.fail > 0 && r.rngs[rank].Float64() < r.fail {
		return fmt.Errorf("injected failure of %s %d", t.Kind, t.Seq)
	}
	for _, cp := range t.Copies {
		b, err := r.slabs.Page(cp.L2)
		if err != nil {
			return err
		}
		if cp.L2.Slab != rank {
			r.t.Fatalf("rank %d copies page %v of another rank's slab", rank, cp.L2)
		}
		if t.Kind == Write {
			copy(b, r.slot(rank, cp.L1))
		} else {
			copy(r.slot(rank, cp.L1), b)
		}
	}
	return nil
}

// step: every rank completes a random subset of its transfers, then one consensus step.
func (r *coreRig) step() error {
	for i, c := range r.cores {
		r.pending[i] = append(r.pending[i], c.Ready().Transfers...)
		keep := r.pending[i][:0]
		var done Done
		for _, t := range r.pending[i] {
			if r.rngs[i].IntN(3) == 0 {
				keep = append(keep, t)
				continue
			}
			done.Transfers = append(done.Transfers, TransferDone{Kind: t.Kind, Seq: t.Seq, Err: r.run(i, t)})
		}
		c.Report(done)
		r.pending[i] = keep
	}
	errs := r.stepAll()
	for i := 1; i < len(errs); i++ {
		if (errs[i] == nil) != (errs[0] == nil) {
			r.t.Fatalf("rank 0 error %v, rank %d error %v", errs[0], i, errs[i])
		}
	}
	r.checkSame()
	return errs[0]
}

// stepAll makes one consensus step on every core without checking that they agree (the
// digests may differ on purpose) and returns each core's Apply error.
func (r *coreRig) stepAll() []error {
	agreed := readyVector(r.cores[0])
	for _, c := range r.cores[1:] {
		parallel.Min.Apply(agreed, readyVector(c))
	}
	var errs []error
	for _, c := range r.cores {
		errs = append(errs, c.Apply(slices.Clone(agreed)))
	}
	return errs
}

func (r *coreRig) checkSame() {
	r.t.Helper()
	d := r.cores[0].StateDigest()
	for i, c := range r.cores {
		if err := c.CheckInvariants(); err != nil {
			r.t.Fatalf("rank %d: %v", i, err)
		}
		if c.StateDigest() != d {
			r.t.Fatalf("rank %d state digest %#x, rank 0 %#x", i, c.StateDigest(), d)
		}
	}
}

// insert inserts on every rank and fills the owned pages.
func (r *coreRig) insert(tokens []int32) (InsertResult, error) {
	var res0 InsertResult
	var err0 error
	for i, c := range r.cores {
		res, err := c.Insert(Request{Tokens: tokens})
		if i == 0 {
			res0, err0 = res, err
		} else if (err == nil) != (err0 == nil) || res.Pages != res0.Pages || len(res.Fill) != len(res0.Fill) {
			r.t.Fatalf("rank %d insert (%d pages, %v), rank 0 (%d pages, %v)", i, res.Pages, err, res0.Pages, err0)
		}
		for _, f := range res.Fill {
			if f.Owner == i {
				kvtest.FillKV(r.slot(i, f.Slot), f.Hash.Index(), f.Index, 0)
			}
		}
	}
	return res0, err0
}

// match matches on every rank, checks agreement and verifies the ready device pages. It
// returns each rank's result.
func (r *coreRig) match(tokens []int32) []MatchResult {
	var res0 MatchResult
	var all []MatchResult
	for i, c := range r.cores {
		res := c.Match(Request{Tokens: tokens})
		all = append(all, res)
		if i == 0 {
			res0 = res
		} else if res.DevicePages != res0.DevicePages || res.HostPages != res0.HostPages || !ownSlotsOnly(c, res) {
			r.t.Fatalf("rank %d match %d+%d, rank 0 %d+%d", i, res.DevicePages, res.HostPages, res0.DevicePages, res0.HostPages)
		}
		r.verify(i, c.at(res.Last), res.DevicePages)
	}
	return all
}

// verify checks rank's owned pages among the first pages of the path to last that are in
// L1 and not loading.
func (r *coreRig) verify(rank int, last *treeNode, pages int) {
	r.t.Helper()
	for _, n := range pathTo(last) {
		for j := 0; j < len(n.hashes) && pages > 0; j++ {
			pages--
			idx := n.depth + j
			if n.load != nil || n.stale || n.l1 == nil || idx%len(r.cores) != rank {
				continue
			}
			if err := kvtest.CheckKV(r.slot(rank, n.l1[j]), n.hashes[j].Index(), idx, 0); err != nil {
				r.t.Fatalf("rank %d node %d: %v", rank, n.id, err)
			}
		}
	}
}

// each calls f on every rank (with the rank's index) and checks they agree on failure.
func (r *coreRig) each(f func(i int, c *Core) error) error {
	var first error
	for i, c := range r.cores {
		err := f(i, c)
		if i == 0 {
			first = err
		} else if (err == nil) != (first == nil) {
			r.t.Fatalf("rank %d: %v, rank 0: %v", i, err, first)
		}
	}
	return first
}

func TestCoreRandomWorkload(t *testing.T) {
	for _, pol := range []Policy{WriteThrough, WriteThroughSelective, WriteBack} {
		t.Run(pol.String(), func(t *testing.T) {
			const n = 4
			opts := Options{PageSize: 4, L1Pages: 96, Policy: pol, MinLoadPages: 2, LoadQuotaPages: 40}
			r := newCoreRig(t, n, opts, 24, 7)
			r.fail = 0.03
			rng := rand.New(rand.NewPCG(1, uint64(pol)))
			seqs := kvtest.RandomSequences(rng, 60, 4)
			var locked [][]Handle // per lock: each rank's node
			stats := map[string]int{}
			for it := 0; it < 1500; it++ {
				s := seqs[rng.IntN(len(seqs))]
				switch op := rng.IntN(10); {
				case op < 4:
					if _, err := r.insert(s); err != nil {
						if !errors.Is(err, ErrL1Full) {
							t.Fatal(err)
						}
						stats["l1full"]++
					}
				case op < 7:
					ms := r.match(s)
					var last []Handle
					for _, m := range ms {
						last = append(last, m.Last)
					}
					if ms[0].HostPages > 0 {
						stats["hosthit"]++
						if err := r.each(func(i int, c *Core) error { _, err := c.LoadBack(last[i]); return err }); err != nil && !errors.Is(err, ErrL1Full) {
							t.Fatal(err)
						}
					}
					if ms[0].DevicePages > 0 && rng.IntN(3) == 0 && len(locked) < 4 {
						if err := r.each(func(i int, c *Core) error { return c.Lock(last[i]) }); err != nil {
							t.Fatal(err)
						}
						locked = append(locked, last)
					}
				case op < 8 && len(locked) > 0:
					k := rng.IntN(len(locked))
					nd := locked[k]
					locked = slices.Delete(locked, k, k+1)
					if err := r.each(func(i int, c *Core) error { return c.Unlock(nd[i]) }); err != nil {
						t.Fatal(err)
					}
				case op < 9:
					k := rng.IntN(20)
					r.each(func(_ int, c *Core) error { c.EvictL1(k); return nil })
					if rng.IntN(2) == 0 {
						r.each(func(_ int, c *Core) error { c.EvictL2(k); return nil })
					}
				default:
					// local pressure on one rank only
					r.cores[rng.IntN(n)].HintEvict(rng.IntN(8), rng.IntN(8))
				}
				if err := r.step(); err != nil {
					t.Fatal(err)
				}
				if it%500 == 499 {
					for _, nd := range locked {
						if err := r.each(func(i int, c *Core) error { return c.Unlock(nd[i]) }); err != nil {
							t.Fatal(err)
						}
					}
					locked = nil
					for k := 0; !r.cores[0].Idle(); k++ {
						if k > 1000 {
							t.Fatal("never idle")
						}
						if err := r.step(); err != nil {
							t.Fatal(err)
						}
					}
					if err := r.each(func(_ int, c *Core) error { return c.Reset() }); err != nil {
						t.Fatal(err)
					}
					fresh, _ := New(r.cores[0].cfg)
					for i, c := range r.cores {
						if c.alloc.Digest() != fresh.alloc.Digest() || c.L1Used() != 0 || c.Nodes() != 0 {
							t.Fatalf("rank %d after reset: digest %#x (fresh %#x), L1 used %d, nodes %d", i, c.alloc.Digest(), fresh.alloc.Digest(), c.L1Used(), c.Nodes())
						}
					}
					stats["flush"]++
				}
			}
			st := r.cores[0].Stats()
			t.Logf("%v stats=%+v", stats, st)
			if st.WrittenPages == 0 || st.LoadedPages == 0 || st.L2HitPages == 0 || st.EvictedL1Pages == 0 {
				t.Fatalf("workload did not exercise the tiers: %+v", st)
			}
		})
	}
}

// readyVector takes c's work (dropping it, as a step whose work the test does not run) and
// returns its consensus vector.
func readyVector(c *Core) []int64 {
	c.Ready()
	return c.Vector(make([]int64, VectorLen))
}

// at resolves h, failing the test's goroutine by a panic when it names no node.
func (c *Core) at(h Handle) *treeNode {
	n, err := c.node(h)
	if err != nil {
		panic(err)
	}
	return n
}

// isRootHandle reports whether h is the root's handle (of any generation).
func isRootHandle(h Handle) bool { return h != 0 && uint64(h)&(1<<HandleIDBits-1) == 0 }

// gone reports whether h names no node of c's tree (the node was removed, or is from before
// a reset).
func (c *Core) gone(h Handle) bool {
	_, err := c.node(h)
	return err != nil
}

// ownSlotsOnly reports whether m's L1 slots are this rank's: a slot in its pool for every
// device page c owns, -1 for every other page.
func ownSlotsOnly(c *Core, m MatchResult) bool {
	if len(m.L1Slots) != m.DevicePages {
		return false
	}
	for i, s := range m.L1Slots {
		if c.Owns(i) != (s >= 0) || int(s) >= c.Config().L1Pages {
			return false
		}
	}
	return true
}
