package hicache

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cpcache/cpcache/hicache/kvtest"
	"github.com/cpcache/cpcache/parallel"
	"github.com/cpcache/cpcache/parallel/grouptest"
	"github.com/cpcache/cpcache/parallel/local"
)

// A rank that cannot start (here: no engine and slabs without host pages) does not leave its
// peers waiting for it until the deadline: New's first collective carries the failure, and
// every rank returns the same *StartError naming that rank and its cause.
func TestNewFailureOnOneRankIsAgreed(t *testing.T) {
	const n, bad = 4, 2
	start := time.Now()
	errs := newOnEveryRank(t, n, func(i int, cfg *Config) {
		if i == bad {
			cfg.Slabs = struct{ SlabSet }{cfg.Slabs} // no host pages, and no engine given
		}
	})
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("New took %v: the ranks waited for the failing one", d)
	}
	for i, err := range errs {
		var se *StartError
		if !errors.As(err, &se) || !errors.Is(err, ErrPeerFailed) || se.Rank != bad || err.Error() != errs[0].Error() {
			t.Fatalf("rank %d: %v; want the StartError of rank %d, identical on every rank", i, err, bad)
		}
		if (i == bad) != errors.Is(err, ErrBadConfig) {
			t.Fatalf("rank %d: wraps the failing rank's own error: %t", i, errors.Is(err, ErrBadConfig))
		}
	}
	t.Log(errs[0])
}

// Step does not hold the cache's mutex across its collective: while a peer stalls, local
// calls answer at once, and a replicated call from another goroutine is refused.
func TestLocalCallsAnswerWhileStepWaits(t *testing.T) {
	r := newTwoRanks(t)
	res, err := r.insert(tokensN(100, 8))
	if err != nil {
		t.Fatal(err)
	}
	c := r.caches[0]
	stepped := make(chan error, 1)
	go func() { stepped <- c.Step(context.Background()) }() // rank 1 stalls: it does not step
	time.Sleep(50 * time.Millisecond)                       // let the Step reach its collective
	for name, call := range map[string]func() error{
		"Stats":       func() error { c.Stats(); return nil },
		"HintEvict":   func() error { c.HintEvict(1, 0); return nil },
		"WaitL1":      func() error { return c.WaitL1(context.Background(), res[0].Last) },
		"WaitL1Layer": func() error { return c.WaitL1Layer(context.Background(), res[0].Last, 0) },
	} {
		start := time.Now()
		if err := call(); err != nil {
			t.Fatalf("%s during a stalled step: %v", name, err)
		}
		if d := time.Since(start); d > 100*time.Millisecond {
			t.Fatalf("%s took %v while a step waited for a peer", name, d)
		}
	}
	if _, err := c.Match(Request{Tokens: tokensN(100, 8)}); !errors.Is(err, ErrBusy) {
		t.Fatalf("a replicated call during the step's collective: %v, want ErrBusy", err)
	}
	select {
	case err := <-stepped:
		t.Fatalf("the step returned before its peer stepped: %v", err)
	default:
	}
	if err := r.caches[1].Step(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := <-stepped; err != nil {
		t.Fatal(err)
	}
	r.checkAgree()
}

// countingEngine is a nopEngine that counts submitted transfers.
type countingEngine struct {
	nopEngine
	submitted atomic.Int64
}

func (e *countingEngine) Submit(t Transfer) *Ticket {
	e.submitted.Add(1)
	return e.nopEngine.Submit(t)
}

// No transfer starts before the Apply that checked the state it was chosen from: backups of
// an Insert and loads of a LoadBack are submitted by the next Step, after its Apply; when that
// Apply finds a divergence, they are never submitted.
func TestTransfersStartOnlyAfterTheCheckingApply(t *testing.T) {
	for _, diverge := range []bool{false, true} {
		engines := []*countingEngine{{}, {}}
		r := newTwoRanks(t, engines[0], engines[1])
		onBoth(t, r, false, func(c *Cache) error { _, err := c.Insert(Request{Tokens: tokensN(100, 8)}); return err }) // write-through backups
		for i, e := range engines {
			if n := e.submitted.Load(); n != 0 {
				t.Fatalf("rank %d: %d transfers submitted before any step", i, n)
			}
		}
		if diverge {
			r.caches[1].core.PerturbTree()
		}
		// A divergence fails the step; it is checked below.
		onBoth(t, r, diverge, func(c *Cache) error { return c.Step(context.Background()) })
		for i, e := range engines {
			if n := e.submitted.Load(); (n == 0) != diverge {
				t.Fatalf("diverged %t: rank %d submitted %d transfers at the checking step", diverge, i, n)
			}
		}
	}
}

// stepEngine is a countingEngine that also takes a step's transfers at once; it records the
// size of each SubmitStep call.
type stepEngine struct {
	countingEngine
	mu    sync.Mutex
	steps []int // transfers per SubmitStep call
}

func (e *stepEngine) SubmitStep(ts []Transfer) []*Ticket {
	e.mu.Lock()
	e.steps = append(e.steps, len(ts))
	e.mu.Unlock()
	tks := make([]*Ticket, len(ts))
	for i, t := range ts {
		tks[i] = e.nopEngine.Submit(t) // not counted: the test checks Submit was not called
	}
	return tks
}

// TestStepSubmitterGetsTheWholeStep: an engine with SubmitStep receives all the transfers a
// step starts in one call (never through Submit), and their completions commit.
func TestStepSubmitterGetsTheWholeStep(t *testing.T) {
	engines := []*stepEngine{{}, {}}
	r := newTwoRanks(t, engines[0], engines[1])
	for s := range 3 { // three sequences, each backed up by a transfer of its own
		onBoth(t, r, false, func(c *Cache) error { _, err := c.Insert(Request{Tokens: tokensN(int32(100*(s+1)), 8)}); return err })
	}
	for range 2 {
		onBoth(t, r, false, func(c *Cache) error { return c.Step(context.Background()) })
	}
	for i, e := range engines {
		if n := e.submitted.Load(); n != 0 || len(e.steps) != 1 || e.steps[0] != 3 {
			t.Fatalf("rank %d: %d transfers through Submit, SubmitStep calls of %v transfers; want one call of 3", i, n, e.steps)
		}
		if st := r.caches[i].Stats(); st.WrittenPages != 6 {
			t.Errorf("rank %d: %d pages of committed backups, want 6", i, st.WrittenPages)
		}
	}
}

// newOnEveryRank runs New on the n ranks of a CP group at once, each with its Config changed
// by set, closes what New made and returns each rank's error.
func newOnEveryRank(t *testing.T, n int, set func(i int, cfg *Config)) []error {
	t.Helper()
	l, err := parallel.NewLayout(parallel.LayoutConfig{World: n, AttnCP: n})
	if err != nil {
		t.Fatal(err)
	}
	members := local.New(l.ReplicaGroup(0), local.Options{Kind: "replica", Timeout: 30 * time.Second})
	slabs := kvtest.NewMemSlabs(l.SlabGroup(0), 8, 64)
	return grouptest.Parallel(n, func(i int) error {
		cfg := Config{Options: Options{PageSize: 4, L1Pages: 8}, Layout: l, Rank: i, Group: members[i], Slabs: slabs}
		set(i, &cfg)
		c, err := New(context.Background(), cfg)
		return errors.Join(err, c.Close())
	})
}

// newTwoRanks is a rig of two CP ranks of 16 L1 pages and 16 L2 pages each, each with the
// engine given (none: host engines).
func newTwoRanks(t *testing.T, engines ...Engine) *rig {
	cfg := rigConfig{
		layout: parallel.LayoutConfig{World: 2, AttnCP: 2}, opts: Options{PageSize: 4, L1Pages: 16},
		pagesPerSlab: 16, pageBytes: 64,
	}
	if len(engines) > 0 {
		cfg.engine = func(i int) Engine { return engines[i] }
	}
	return newRig(t, cfg)
}

// onBoth runs f on both ranks of r at once; unless ignoreErrors, it fails the test on any
// error.
func onBoth(t *testing.T, r *rig, ignoreErrors bool, f func(c *Cache) error) {
	t.Helper()
	errs := r.all(func(i int) error { return f(r.caches[i]) })
	if err := errors.Join(errs...); err != nil && !ignoreErrors {
		t.Fatal(err)
	}
}

// TestStepSubmitterGetsApplysTransfersInTheSameCall: with write-back, an eviction the group
// agrees at Apply backs its pages up; those transfers go to the engine in the same
// SubmitStep call as the transfers chosen before the step (here a load-back).
func TestStepSubmitterGetsApplysTransfersInTheSameCall(t *testing.T) {
	engines := []*stepEngine{{}, {}}
	r := newRig(t, rigConfig{
		layout: parallel.LayoutConfig{World: 2, AttnCP: 2}, opts: Options{PageSize: 4, L1Pages: 16, Policy: WriteBack},
		pagesPerSlab: 16, pageBytes: 64, engine: func(i int) Engine { return engines[i] },
	})
	step := func() { onBoth(t, r, false, func(c *Cache) error { return c.Step(context.Background()) }) }
	a, b := tokensN(100, 8), tokensN(200, 8)
	// a is evicted from L1 through a write-back backup; it is then held in L2 only.
	onBoth(t, r, false, func(c *Cache) error { _, err := c.Insert(Request{Tokens: a}); return err })
	onBoth(t, r, false, func(c *Cache) error { c.HintEvict(2, 0); return nil })
	for range 3 {
		step()
	}
	// One step: a load-back of a (chosen before the step) and the write-back of b (evicted by
	// that step's Apply).
	onBoth(t, r, false, func(c *Cache) error { _, err := c.Insert(Request{Tokens: b}); return err })
	onBoth(t, r, false, func(c *Cache) error {
		m, err := c.Match(Request{Tokens: a})
		if err != nil || m.HostPages != 2 {
			return fmt.Errorf("match of a: %+v, %v; want 2 pages in L2 only", m, err)
		}
		if _, err := c.LoadBack(m.Last); err != nil {
			return err
		}
		c.HintEvict(2, 0)
		return nil
	})
	for i := range engines {
		engines[i].mu.Lock()
		engines[i].steps = nil
		engines[i].mu.Unlock()
	}
	step()
	for i, e := range engines {
		if n := e.submitted.Load(); n != 0 || len(e.steps) != 1 || e.steps[0] != 2 {
			t.Fatalf("rank %d: %d transfers through Submit, SubmitStep calls of %v transfers; want one call of 2", i, n, e.steps)
		}
	}
}

// deadlineGroup records the collectives that were called without a deadline.
type deadlineGroup struct {
	parallel.Group
	mu        sync.Mutex
	unbounded []string
}

func (g *deadlineGroup) note(op string, ctx context.Context) {
	if _, ok := ctx.Deadline(); !ok {
		g.mu.Lock()
		g.unbounded = append(g.unbounded, op)
		g.mu.Unlock()
	}
}

func (g *deadlineGroup) AllReduce(ctx context.Context, op parallel.ReduceOp, v []int64) error {
	g.note("AllReduce", ctx)
	return g.Group.AllReduce(ctx, op, v)
}

func (g *deadlineGroup) Broadcast(ctx context.Context, root int, data []byte) ([]byte, error) {
	g.note("Broadcast", ctx)
	return g.Group.Broadcast(ctx, root, data)
}

func (g *deadlineGroup) Barrier(ctx context.Context) error {
	g.note("Barrier", ctx)
	return g.Group.Barrier(ctx)
}

// TestStepTimeoutBoundsNewsCollectives: Config.StepTimeout bounds every collective of New,
// the broadcast of a failing rank's cause included (a peer that dies between New's
// all-reduce and that broadcast must not hold the others past StepTimeout).
func TestStepTimeoutBoundsNewsCollectives(t *testing.T) {
	groups := make([]*deadlineGroup, 4)
	errs := newOnEveryRank(t, 4, func(i int, cfg *Config) {
		groups[i] = &deadlineGroup{Group: cfg.Group}
		cfg.Group, cfg.StepTimeout = groups[i], time.Minute
		if i == 2 {
			cfg.Faults = &Faults{NewError: errors.New("no engine")}
		}
	})
	for i, g := range groups {
		if !errors.Is(errs[i], ErrPeerFailed) {
			t.Fatalf("rank %d: %v, want the StartError", i, errs[i])
		}
		if len(g.unbounded) > 0 {
			t.Errorf("rank %d: collectives without the StepTimeout deadline: %v", i, g.unbounded)
		}
	}
}

// A negative Config.StepTimeout or LatencySamples is refused on every rank with an error
// naming it; it must not silently mean "no step timeout" or "the default".
func TestNewRejectsNegativeDriverConfig(t *testing.T) {
	for _, set := range []func(*Config){
		func(cfg *Config) { cfg.StepTimeout = -time.Second },
		func(cfg *Config) { cfg.LatencySamples = -1 },
	} {
		for i, err := range newOnEveryRank(t, 2, func(_ int, cfg *Config) { set(cfg) }) {
			if !errors.Is(err, ErrBadConfig) || !strings.Contains(err.Error(), "must not be negative") {
				t.Fatalf("rank %d: %v, want ErrBadConfig naming the negative value", i, err)
			}
		}
	}
}

// A scope error on one rank only (its slab set is not the layout's slab group, while its
// consensus group is right) travels through New's first collective like a build error: every
// rank returns the same StartError at once instead of waiting for that rank until the
// deadline (docs/operating.md: "a rank cannot build its cache (engine, storage or scope check)").
func TestNewScopeFailureOnOneRankIsAgreed(t *testing.T) {
	const n, bad = 4, 2
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second) // bounds the test should a rank wait for the failed one
	defer cancel()
	l := mustLayout(t, parallel.LayoutConfig{World: n, AttnCP: n})
	members := local.New(l.ReplicaGroup(0), local.Options{Kind: "replica", Timeout: time.Minute})
	slabs := kvtest.NewMemSlabs(l.SlabGroup(0), 8, 64)
	errs := grouptest.Parallel(n, func(i int) error {
		cfg := Config{Options: Options{PageSize: 4, L1Pages: 8}, Layout: l, Rank: i, Group: members[i], Slabs: slabs}
		if i == bad {
			cfg.Slabs = kvtest.NewMemSlabs([]int{0, 1}, 8, 64)
		}
		c, err := New(ctx, cfg)
		return errors.Join(err, c.Close())
	})
	for i, err := range errs {
		var se *StartError
		if !errors.As(err, &se) || se.Rank != bad || err.Error() != errs[0].Error() {
			t.Fatalf("rank %d: %v; want the StartError of rank %d, identical on every rank", i, err, bad)
		}
		if (i == bad) != errors.Is(err, ErrScope) {
			t.Fatalf("rank %d: wraps ErrScope: %t", i, errors.Is(err, ErrScope))
		}
	}
	t.Log(errs[0])
}
