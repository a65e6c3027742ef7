package hicache

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/cpcache/cpcache/hicache/core"
	"github.com/cpcache/cpcache/hicache/kvlayout"
	"github.com/cpcache/cpcache/hicache/kvmem"
	"github.com/cpcache/cpcache/hicache/kvtest"
	"github.com/cpcache/cpcache/parallel"
	"github.com/cpcache/cpcache/parallel/grouptest"
	"github.com/cpcache/cpcache/parallel/local"
	"github.com/cpcache/cpcache/parallel/shm"
	"github.com/cpcache/cpcache/storage"
)

// rig is N in-process replicas of one replica group over parallel/local, each with a host
// engine that sleeps a random per-rank delay before every transfer. Slab groups share
// kvtest.MemSlabs. Scheduler calls run on every rank in lockstep (one goroutine per rank
// per call, so collectives can meet).
type rig struct {
	t       testing.TB
	layout  *parallel.Layout
	caches  []*Cache
	counted []*parallel.Counted
	slabs   []*kvtest.MemSlabs // by rank
	shards  []int              // tensor-parallel index of each rank (part of the KV content)
	key     string             // isolation key of insert, matchLoad and prefetch ("" by default)
	kv      []*kvmem.L1        // by rank: the engine-lent per-layer L1 (nil: flat pools)
}

type rigConfig struct {
	layout       parallel.LayoutConfig
	opts         Options
	pagesPerSlab int
	pageBytes    int
	maxDelay     time.Duration
	seed         uint64
	delay        func(rank int) func(Transfer) time.Duration // overrides maxDelay
	fail         func(rank int) func(Transfer) error         // injected transfer failures
	faults       func(rank int) *Faults                      // failpoints (nil: none)
	engine       func(rank int) Engine                       // the rank's engine (nil: a host engine)
	// L3: store(i) is rank i's handle on the shared storage (nil: no L3), opened for ns.
	store  func(rank int) storage.Storage
	ns     storage.Namespace
	l3     L3Options
	l3Hook func(rank int) func(ctx context.Context, kind core.StorageKind, seq uint64, chunk int) error
	events EventOptions
	// kvLayout, when set, is every rank's KV layout; with kvL1 each rank lends its host engine
	// a per-(layer, part) L1 of opts.L1Pages slots (token-slot buffers), pages in l2Layout.
	kvLayout *kvlayout.Layout
	kvL1     bool
	l2Layout kvmem.L2Layout
	// shareSlabs: the attention-TP ranks of a CP index share one slab (Config.ShareSlabs,
	// with kvLayout, whose parts must all be replicated); every rank's KV content is shard 0's.
	shareSlabs bool
	// shm: the replica group is a shared-memory group (parallel/shm) bootstrapped over the
	// in-process one, with this collective timeout (0: 20 s).
	shm     bool
	timeout time.Duration
	// stepWarnAfter and log: Config.StepWarnAfter and Config.Log of rank i.
	stepWarnAfter time.Duration
	log           func(rank int) func(error)
}

func newRig(t testing.TB, rc rigConfig) *rig {
	t.Helper()
	l, err := parallel.NewLayout(rc.layout)
	if err != nil {
		t.Fatal(err)
	}
	replica := l.ReplicaGroup(0)
	n := len(replica)
	r := &rig{t: t, layout: l, caches: make([]*Cache, n), slabs: make([]*kvtest.MemSlabs, n), shards: make([]int, n)}
	if rc.kvL1 {
		r.kv = make([]*kvmem.L1, n)
	}
	timeout := rc.timeout
	if timeout == 0 {
		timeout = 20 * time.Second
	}
	var members []parallel.Group
	for _, m := range local.New(replica, local.Options{Kind: "replica", Timeout: timeout}) {
		members = append(members, m)
	}
	if rc.shm {
		boots := members
		members = make([]parallel.Group, n)
		errs := grouptest.Parallel(n, func(i int) (err error) {
			members[i], err = shm.New(context.Background(), boots[i], shm.Options{Timeout: timeout})
			return err
		})
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			for _, m := range members {
				m.Close()
			}
		})
	}
	for _, m := range members {
		r.counted = append(r.counted, parallel.Count(m))
	}
	bySlabGroup := map[int]*kvtest.MemSlabs{}
	for i, rank := range replica {
		sg := l.SlabGroup(rank)
		if rc.shareSlabs {
			sg = l.SharedSlabGroup(rank)
		}
		ms := bySlabGroup[sg[0]]
		if ms == nil {
			ms = kvtest.NewMemSlabs(sg, rc.pagesPerSlab, rc.pageBytes)
			bySlabGroup[sg[0]] = ms
		}
		r.slabs[i] = ms
		r.shards[i] = l.Coord(rank).TP
		if rc.shareSlabs {
			r.shards[i] = 0 // replicated parts: the same bytes on every TP rank
		}
	}
	errs := r.all(func(i int) error {
		var delay func(Transfer) time.Duration
		if rc.maxDelay > 0 {
			rng := rand.New(rand.NewPCG(rc.seed, uint64(i)))
			var mu sync.Mutex
			delay = func(Transfer) time.Duration {
				mu.Lock()
				defer mu.Unlock()
				return time.Duration(rng.Int64N(int64(rc.maxDelay)))
			}
		}
		if rc.delay != nil {
			delay = rc.delay(i)
		}
		var fail func(Transfer) error
		if rc.fail != nil {
			fail = rc.fail(i)
		}
		cfg := Config{
			Options: rc.opts, Layout: l, Rank: replica[i], Group: r.counted[i], Slabs: r.slabs[i],
			HostEngine: HostEngineOptions{Workers: 2, Delay: delay, Fail: fail}, Events: rc.events,
			ShareSlabs: rc.shareSlabs, KVLayout: rc.kvLayout, StepWarnAfter: rc.stepWarnAfter,
		}
		if rc.log != nil {
			cfg.Log = rc.log(i)
		}
		if rc.faults != nil {
			cfg.Faults = rc.faults(i)
		}
		cfg.KVLayout, cfg.L2Layout = rc.kvLayout, rc.l2Layout
		if rc.kvL1 {
			shape, err := kvmem.NewShape(*rc.kvLayout, l.AttnTP, rc.opts.PageSize)
			if err != nil {
				return err
			}
			if cfg.L1, err = kvmem.NewL1(shape, rc.opts.L1Pages, kvmem.AllocTokenSlotBuffers(shape, rc.opts.L1Pages)); err != nil {
				return err
			}
			r.kv[i] = cfg.L1
		}
		if rc.engine != nil {
			cfg.Engine = rc.engine(i)
		}
		if rc.store != nil {
			cfg.Storage, cfg.StorageNamespace, cfg.L3 = rc.store(i), rc.ns, rc.l3
			cfg.L3.Log = func(err error) { t.Logf("rank %d: %v", i, err) }
			if rc.l3Hook != nil {
				cfg.L3.hook = rc.l3Hook(i)
			}
		}
		c, err := New(context.Background(), cfg)
		r.caches[i] = c
		return err
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, c := range r.caches {
			c.Close()
		}
	})
	return r
}

// all runs f on every rank concurrently and returns each rank's error.
func (r *rig) all(f func(i int) error) []error { return grouptest.Parallel(len(r.caches), f) }

// same checks that every rank got the same outcome and returns rank 0's error.
func (r *rig) same(op string, errs []error) error {
	r.t.Helper()
	for i, err := range errs {
		if (err == nil) != (errs[0] == nil) {
			r.t.Fatalf("%s: rank %d error %v, rank 0 error %v", op, i, err, errs[0])
		}
	}
	return errs[0]
}

// step runs one consensus step everywhere and checks that the replicas agree afterwards.
func (r *rig) step() error {
	r.t.Helper()
	err := r.same("step", r.all(func(i int) error { return r.caches[i].Step(context.Background()) }))
	r.checkAgree()
	return err
}

func (r *rig) checkAgree() {
	r.t.Helper()
	d0, p0 := r.caches[0].StateDigest(), r.caches[0].core.Allocator().Digest()
	for i, c := range r.caches {
		if err := c.core.CheckInvariants(); err != nil {
			r.t.Fatalf("rank %d: %v", i, err)
		}
		if d, p := c.StateDigest(), c.core.Allocator().Digest(); d != d0 || p != p0 && !c.core.Quarantined() {
			r.t.Fatalf("rank %d: state digest %#x placement %#x; rank 0: %#x %#x", i, d, p, d0, p0)
		}
	}
}

// insert inserts tokens everywhere; each rank fills the pages it owns.
func (r *rig) insert(tokens []int32) ([]InsertResult, error) {
	res := make([]InsertResult, len(r.caches))
	err := r.same("insert", r.all(func(i int) error {
		c := r.caches[i]
		ir, err := c.Insert(Request{Tokens: tokens, Key: r.key})
		res[i] = ir
		for _, f := range ir.Fill {
			if c.Owns(f.Index) && r.kv != nil {
				if err := kvtest.FillL1Page(r.kv[i], f.Slot, f.Hash.Index(), f.Index, r.shards[i]); err != nil {
					return err
				}
			} else if c.Owns(f.Index) {
				b, err := c.L1Page(f.Slot)
				if err != nil {
					return err
				}
				kvtest.FillKV(b, f.Hash.Index(), f.Index, r.shards[i])
			}
		}
		return err
	}))
	return res, err
}

// matchLoad matches tokens everywhere, loads the host part back when asked, waits for L1
// and verifies every device page each rank owns.
func (r *rig) matchLoad(tokens []int32, load bool) ([]MatchResult, error) {
	res := make([]MatchResult, len(r.caches))
	err := r.same("match", r.all(func(i int) error {
		c := r.caches[i]
		m, err := c.Match(Request{Tokens: tokens, Key: r.key})
		if err != nil {
			return err
		}
		if load && m.HostPages > 0 {
			if m, err = loadBackAndWait(c, tokens, m, func() error { return c.Step(context.Background()) }); err != nil {
				return err
			}
		}
		res[i] = m
		if err := c.WaitL1(context.Background(), m.Last); err != nil {
			return err
		}
		return r.verify(i, m)
	}))
	for i := range res {
		if res[i].DevicePages != res[0].DevicePages || res[i].HostPages != res[0].HostPages {
			r.t.Fatalf("match: rank %d got %d+%d pages, rank 0 %d+%d", i, res[i].DevicePages, res[i].HostPages, res[0].DevicePages, res[0].HostPages)
		}
	}
	return res, err
}

// verify checks the content of rank i's own device pages of a match.
func (r *rig) verify(i int, m MatchResult) error {
	if r.kv != nil {
		return verifyOwnKVPages(r.caches[i], m, r.shards[i], r.kv[i])
	}
	return verifyOwnPages(r.caches[i], m, r.shards[i], r.caches[i].L1Page)
}

func (r *rig) each(op string, f func(i int, c *Cache) error) error {
	return r.same(op, r.all(func(i int) error { return f(i, r.caches[i]) }))
}

// drain steps until no transfer is in flight (replicated, so every rank stops at the same
// step).
func (r *rig) drain() {
	r.t.Helper()
	for k := 0; r.caches[0].core.Pending() > 0; k++ {
		if k > 10000 {
			r.t.Fatal("cache never became idle")
		}
		if err := r.step(); err != nil {
			r.t.Fatal(err)
		}
	}
}

// checkCollectives asserts that every rank made the same collectives in the same order.
func (r *rig) checkCollectives() parallel.Counts {
	r.t.Helper()
	c0 := r.counted[0].Counts()
	for i, c := range r.counted {
		if got := c.Counts(); got != c0 {
			r.t.Fatalf("rank %d made collectives %+v, rank 0 %+v", i, got, c0)
		}
	}
	return c0
}

// workload runs rankWorkload on every rank concurrently (the collectives keep them in
// step) and checks that all ranks recorded the same digests after every step.
func (r *rig) workload(steps int, seed uint64, flushEvery int) map[string]int {
	r.t.Helper()
	recs := make([][]stepRecord, len(r.caches))
	counts := make([]map[string]int, len(r.caches))
	errs := r.all(func(i int) error {
		var err error
		recs[i], counts[i], err = rankWorkload(context.Background(), r.caches[i], nil, r.shards[i], steps, seed, flushEvery)
		return err
	})
	if err := errors.Join(errs...); err != nil {
		r.t.Fatal(err)
	}
	if err := compareRecords(recs); err != nil {
		r.t.Fatal(err)
	}
	return counts[0]
}

// flushAndCheckFresh flushes an idle cache and checks the fresh state on every rank.
func (r *rig) flushAndCheckFresh() {
	r.t.Helper()
	if err := r.each("flush", func(_ int, c *Cache) error { return c.Flush(context.Background()) }); err != nil {
		r.t.Fatal(err)
	}
	fresh, err := core.New(r.caches[0].core.Config())
	if err != nil {
		r.t.Fatal(err)
	}
	for i, c := range r.caches {
		st := c.Stats()
		if st.PlacementDigest != fresh.Allocator().Digest() || st.L1Used != 0 || st.Nodes != 0 ||
			st.L2FreePages != fresh.Allocator().TotalFree() || c.core.Allocator().NumRanges() != 0 || st.Quarantined {
			r.t.Fatalf("rank %d after flush: digest %#x (fresh %#x), L1 used %d, nodes %d, L2 free %d of %d, ranges %d, L2 enabled %t",
				i, st.PlacementDigest, fresh.Allocator().Digest(), st.L1Used, st.Nodes, st.L2FreePages, fresh.Allocator().TotalFree(), c.core.Allocator().NumRanges(), !st.Quarantined)
		}
		if c.StateDigest() != fresh.StateDigest() {
			r.t.Fatalf("rank %d after flush: state digest %#x, fresh core %#x", i, c.StateDigest(), fresh.StateDigest())
		}
	}
}
