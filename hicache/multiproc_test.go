package hicache

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cpcache/cpcache/gloo"
	"github.com/cpcache/cpcache/internal/testenv/glootest"
	"github.com/cpcache/cpcache/internal/testenv/multiproc"
	"github.com/cpcache/cpcache/parallel"
	"github.com/cpcache/cpcache/slab"
)

// Multi-process tests: 8 rank processes (re-executions of this test binary) joined by Gloo
// over a file store, sharing host shared-memory slabs (slab.OpenSet), each running the same
// random scheduler as the in-process replicas. Parameters travel in CPCACHE_TEST_* variables.

func TestMain(m *testing.M) { multiproc.Main(m) }

func init() {
	multiproc.Register("hicache-workload", glootest.Role(mpTimeout, roleWorkload))
	multiproc.Register("hicache-step-bench", glootest.Role(mpTimeout, roleStepBench))
	multiproc.Register("hicache-l3", glootest.Role(mpTimeout, roleL3))
}

const (
	mpRanks   = 8
	mpTimeout = 60 * time.Second // each collective of a rank process
)

// mpCache sets up one rank process on its Gloo world: layout groups, the slab set of the
// slab group, and a cache on the counted replica group.
func mpCache(ctx context.Context, world *gloo.Group, opts Options, delay time.Duration) (c *Cache, counted *parallel.Counted, cleanup func(), err error) {
	return mpSetup(ctx, world, 0, 24, opts, delay, nil)
}

// mpSetup is mpCache with attnCP slab-group size (0: the whole world), slab pages, and a
// hook that may change the Config (after the layout exists). cleanup closes what it opened
// (not the world).
func mpSetup(ctx context.Context, world *gloo.Group, attnCP, slabPages int, opts Options, delay time.Duration, mod func(*Config, *parallel.Layout) error) (c *Cache, counted *parallel.Counted, cleanup func(), err error) {
	var closers []func() error
	cleanup = func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	defer func() {
		if err != nil {
			cleanup()
		}
	}()
	if attnCP == 0 {
		attnCP = world.Size()
	}
	layout, err := parallel.NewLayout(parallel.LayoutConfig{World: world.Size(), AttnCP: attnCP})
	if err != nil {
		return nil, nil, cleanup, err
	}
	groups, err := gloo.NewLayoutGroups(world, layout)
	if err != nil {
		return nil, nil, cleanup, err
	}
	closers = append(closers, groups.Close)
	set, err := slab.OpenSet(ctx, groups.Group(parallel.KindSlab), slab.Spec{
		Backend: slab.Host, PageSize: 64, Pages: slabPages, Layout: "hicache-test", Tag: os.Getenv("CPCACHE_TEST_TAG"),
	})
	if err != nil {
		return nil, nil, cleanup, err
	}
	closers = append(closers, set.Close)
	counted = parallel.Count(groups.Group(parallel.KindReplica))
	var he HostEngineOptions
	if delay > 0 {
		rng := rand.New(rand.NewPCG(7, uint64(world.Rank())))
		var mu sync.Mutex
		he.Delay = func(Transfer) time.Duration {
			mu.Lock()
			defer mu.Unlock()
			return time.Duration(rng.Int64N(int64(delay)))
		}
	}
	cfg := Config{Options: opts, Layout: layout, Rank: world.Rank(), Group: counted, Slabs: set, HostEngine: he}
	if mod != nil {
		if err := mod(&cfg, layout); err != nil {
			return nil, nil, cleanup, err
		}
		if cfg.Storage != nil {
			closers = append(closers, cfg.Storage.Close)
		}
	}
	c, err = New(ctx, cfg)
	if err != nil {
		return nil, nil, cleanup, err
	}
	closers = append(closers, c.Close)
	return c, counted, cleanup, nil
}

func roleWorkload(ctx context.Context, world *gloo.Group) error {
	c, counted, cleanup, err := mpCache(ctx, world, Options{PageSize: 4, L1Pages: 64, Policy: WriteThrough, MinLoadPages: 2, LoadQuotaPages: 64}, 300*time.Microsecond)
	if err != nil {
		return err
	}
	defer cleanup()
	recs, counts, err := rankWorkload(ctx, c, nil, 0, 300, 41, 100)
	if err != nil {
		return err
	}
	var b strings.Builder
	for s, r := range recs {
		fmt.Fprintf(&b, "step %d state %#x placement %#x l2 %t\n", s, r.state, r.placement, r.l2)
	}
	st := c.Stats()
	fmt.Fprintf(&b, "collectives %+v\n", counted.Counts())
	fmt.Fprintf(&b, "flushes %d steps %d written %d loaded %d\n", counts["flush"], st.Steps, st.WrittenPages, st.LoadedPages)
	return multiproc.Report([]byte(b.String()))
}

func mpEnv(t testing.TB, extra ...string) []string {
	return append([]string{
		"CPCACHE_STORE=file://" + t.TempDir(),
		fmt.Sprintf("CPCACHE_TEST_TAG=hc%d", os.Getpid()%1000000),
	}, extra...)
}

// sameReports fails t unless every rank reported the same lines as rank 0, apart from the
// last skipLast lines (per-rank counts); it returns rank 0's lines.
func sameReports(t *testing.T, res []multiproc.Result, skipLast int) []string {
	t.Helper()
	var first []string
	for r, rr := range res {
		if len(rr.Report) == 0 {
			t.Fatalf("rank %d reported nothing", r)
		}
		lines := strings.Split(strings.TrimSpace(string(rr.Report)), "\n")
		if r == 0 {
			first = lines
			continue
		}
		if len(lines) != len(first) {
			t.Fatalf("rank %d's record has %d lines, rank 0's %d", r, len(lines), len(first))
		}
		for i := range len(lines) - skipLast {
			if lines[i] != first[i] {
				t.Fatalf("rank %d differs from rank 0 at line %d:\n%s\n%s", r, i, lines[i], first[i])
			}
		}
	}
	return first
}

func TestMultiprocGlooReplicasAgree(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test skipped in -short mode")
	}
	res := multiproc.Run(t, multiproc.Spec{Role: "hicache-workload", N: mpRanks, Timeout: 3 * time.Minute, Env: mpEnv(t)})
	if t.Failed() {
		return
	}
	lines := sameReports(t, res, 0)
	summary := lines[len(lines)-1]
	t.Logf("%d steps on every rank; %s; %s", len(lines)-2, lines[len(lines)-2], summary)
	var flushes, steps, written, loaded int
	if _, err := fmt.Sscanf(summary, "flushes %d steps %d written %d loaded %d", &flushes, &steps, &written, &loaded); err != nil {
		t.Fatal(err)
	}
	if flushes != 2 || written == 0 {
		t.Fatalf("workload summary %q: want 2 flushes and backups", summary)
	}
}
