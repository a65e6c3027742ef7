package gloo_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cpcache/cpcache/gloo"
	"github.com/cpcache/cpcache/internal/testenv/glootest"
	"github.com/cpcache/cpcache/internal/testenv/multiproc"
	"github.com/cpcache/cpcache/parallel"
	"github.com/cpcache/cpcache/parallel/grouptest"
)

// Roles run in rank processes started by multiproc (or mpirun). Their parameters come from
// CPCACHE_TEST_* variables set by the test.

func TestMain(m *testing.M) { multiproc.Main(m) }

func init() {
	multiproc.Register("conformance", glootest.Role(time.Minute, roleConformance))
	multiproc.Register("layout", glootest.Role(time.Minute, roleLayout))
	multiproc.Register("peer-exit", rolePeerExit)
	multiproc.Register("peer-stall", rolePeerStall)
	multiproc.Register("bench", glootest.Role(time.Minute, roleBench))
	multiproc.Register("new-group-mismatch", glootest.Role(time.Minute, roleNewGroupMismatch))
	multiproc.Register("op-mismatch", glootest.Role(time.Minute, roleOpMismatch))
	multiproc.Register("empty-allreduce", glootest.Role(time.Minute, roleEmptyAllReduce))
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil {
		return v
	}
	return def
}

func envDur(name string, def time.Duration) time.Duration {
	if v, err := time.ParseDuration(os.Getenv(name)); err == nil {
		return v
	}
	return def
}

func joinWorld(ctx context.Context, timeout time.Duration) (*gloo.Group, error) {
	return gloo.NewWorld(ctx, gloo.Options{Timeout: timeout})
}

// roleConformance runs the conformance suite and a soak on the world group.
func roleConformance(ctx context.Context, w *gloo.Group) error {
	if want := envInt("CPCACHE_TEST_WORLD", 0); want != 0 && w.Size() != want {
		return fmt.Errorf("world has %d ranks, want %d (launcher variables not read?)", w.Size(), want)
	}
	if err := grouptest.Conformance(ctx, w); err != nil {
		return fmt.Errorf("%s: %w", w.Name(), err)
	}
	if err := grouptest.Soak(ctx, w, envInt("CPCACHE_TEST_SOAK", 40)); err != nil {
		return fmt.Errorf("%s soak: %w", w.Name(), err)
	}
	return w.Barrier(ctx)
}

// roleLayout creates every group of a layout and runs the suite on each, then a custom
// sub-group over the even ranks.
func roleLayout(ctx context.Context, w *gloo.Group) error {
	l, err := parallel.NewLayout(parallel.LayoutConfig{
		World: w.Size(), TP: w.Size(), DP: envInt("CPCACHE_TEST_DP", 2),
		AttnCP: envInt("CPCACHE_TEST_CP", 8), EP: envInt("CPCACHE_TEST_EP", w.Size()), DPAttention: true,
	})
	if err != nil {
		return err
	}
	lg, err := gloo.NewLayoutGroups(w, l)
	if err != nil {
		return err
	}
	defer lg.Close()
	for _, kind := range parallel.AllKinds {
		g := lg.Group(kind)
		want := l.GroupOf(kind, w.Rank())
		if fmt.Sprint(g.Ranks()) != fmt.Sprint(want) || g.Ranks()[g.Rank()] != w.Rank() {
			return fmt.Errorf("%s group: ranks %v (me %d), want %v", kind, g.Ranks(), g.Rank(), want)
		}
		if g.Name() != parallel.GroupName(kind.String(), want) {
			return fmt.Errorf("%s group named %q, want %q", kind, g.Name(), parallel.GroupName(kind.String(), want))
		}
		if err := grouptest.Conformance(ctx, g); err != nil {
			return fmt.Errorf("%s: %w", g.Name(), err)
		}
	}
	// The CP groups and the world interleave: values must not leak between them.
	cp := lg.Group(parallel.KindAttnCP)
	for i := 0; i < 4; i++ {
		if err := grouptest.Soak(ctx, cp, 4); err != nil {
			return fmt.Errorf("%s: %w", cp.Name(), err)
		}
		if err := grouptest.Soak(ctx, w, 4); err != nil {
			return fmt.Errorf("%s: %w", w.Name(), err)
		}
	}
	var evens []int
	for r := 0; r < w.Size(); r += 2 {
		evens = append(evens, r)
	}
	g, err := gloo.NewGroup(w, evens)
	if err != nil {
		return err
	}
	if (w.Rank()%2 == 0) != (g != nil) {
		return fmt.Errorf("NewGroup(%v) on rank %d returned %v", evens, w.Rank(), g)
	}
	if g != nil {
		defer g.Close()
		if err := grouptest.Conformance(ctx, g); err != nil {
			return fmt.Errorf("%s: %w", g.Name(), err)
		}
	}
	return w.Barrier(ctx)
}

// rolePeerExit: the last rank leaves after a barrier (by Close or by exiting); every other
// rank's next collective must fail with parallel.ErrPeerLost, and so must every later one.
func rolePeerExit() error {
	ctx := context.Background()
	w, err := joinWorld(ctx, envDur("CPCACHE_TEST_TIMEOUT", 60*time.Second))
	if err != nil {
		return err
	}
	defer w.Close()
	if err := w.Barrier(ctx); err != nil {
		return err
	}
	if w.Rank() == w.Size()-1 {
		if os.Getenv("CPCACHE_TEST_EXIT") == "close" {
			return w.Close()
		}
		os.Exit(0) // no Close: the kernel closes the sockets
	}
	vals := []int64{int64(w.Rank())}
	err = w.AllReduce(ctx, parallel.Sum, vals)
	if !errors.Is(err, parallel.ErrPeerLost) {
		return fmt.Errorf("allreduce after a peer left: got %v, want an error wrapping parallel.ErrPeerLost", err)
	}
	var oe *parallel.OpError
	if !errors.As(err, &oe) || oe.Op != "allreduce" || oe.Group != w.Name() {
		return fmt.Errorf("error %v is not an OpError naming allreduce on %s", err, w.Name())
	}
	if err2 := w.Barrier(ctx); !errors.Is(err2, parallel.ErrPeerLost) {
		return fmt.Errorf("barrier after the failure: got %v, want the sticky parallel.ErrPeerLost", err2)
	}
	fmt.Printf("rank %d: %v\n", w.Rank(), err)
	return nil
}

// rolePeerStall: the last rank stops calling collectives; the others' next collective must
// fail with parallel.ErrTimeout at the deadline: the context's (CPCACHE_TEST_MODE=ctx, group
// timeout long) or the group's (mode=group).
func rolePeerStall() error {
	ctx := context.Background()
	short := envDur("CPCACHE_TEST_TIMEOUT", 2*time.Second)
	mode := os.Getenv("CPCACHE_TEST_MODE")
	groupTimeout := 60 * time.Second
	if mode == "group" {
		groupTimeout = short
	}
	w, err := joinWorld(ctx, groupTimeout)
	if err != nil {
		return err
	}
	defer w.Close()
	if err := w.Barrier(ctx); err != nil {
		return err
	}
	if w.Rank() == w.Size()-1 {
		time.Sleep(short + time.Second) // stalled past everyone's deadline, then gone
		return nil
	}
	opCtx := ctx
	if mode == "ctx" {
		var cancel context.CancelFunc
		opCtx, cancel = context.WithTimeout(ctx, short)
		defer cancel()
	}
	err = w.AllReduce(opCtx, parallel.Min, []int64{1, 2, 3})
	if !errors.Is(err, parallel.ErrTimeout) {
		return fmt.Errorf("allreduce with a stalled peer: got %v, want parallel.ErrTimeout", err)
	}
	if mode == "ctx" && !errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("allreduce past the context's deadline: %v does not wrap context.DeadlineExceeded", err)
	}
	if _, err2 := w.Broadcast(ctx, 0, []byte("x")); !errors.Is(err2, parallel.ErrTimeout) {
		return fmt.Errorf("broadcast after the timeout: got %v, want the sticky parallel.ErrTimeout", err2)
	}
	fmt.Printf("rank %d: %v\n", w.Rank(), err)
	return nil
}

// benchOps are the collectives the benchmarks time, at the sizes consensus uses.
var benchOps = map[string]func(ctx context.Context, g parallel.Group) error{
	"allreduce8": func(ctx context.Context, g parallel.Group) error {
		return g.AllReduce(ctx, parallel.Min, []int64{1, 2, 3, 4, 5, 6, 7, int64(g.Rank())})
	},
	"broadcast4k": func(ctx context.Context, g parallel.Group) error {
		_, err := g.Broadcast(ctx, 0, make([]byte, 4096))
		return err
	},
	"allgather64": func(ctx context.Context, g parallel.Group) error {
		_, err := g.AllGather(ctx, make([]byte, 64))
		return err
	},
	"barrier": func(ctx context.Context, g parallel.Group) error { return g.Barrier(ctx) },
}

// roleBench times CPCACHE_TEST_ITERS back-to-back runs of CPCACHE_TEST_OP; rank 0 prints
// "ns/op N".
func roleBench(ctx context.Context, w *gloo.Group) error {
	op := benchOps[os.Getenv("CPCACHE_TEST_OP")]
	iters := envInt("CPCACHE_TEST_ITERS", 100)
	ns, err := timeOps(ctx, w, op, iters)
	if err != nil {
		return err
	}
	if w.Rank() == 0 {
		fmt.Printf("ns/op %d\n", ns)
	}
	return w.Barrier(ctx)
}

// timeOps runs op a few times untimed, then iters times; it returns the mean ns per op.
func timeOps(ctx context.Context, g parallel.Group, op func(context.Context, parallel.Group) error, iters int) (int64, error) {
	for i := 0; i < 10; i++ {
		if err := op(ctx, g); err != nil {
			return 0, err
		}
	}
	if err := g.Barrier(ctx); err != nil {
		return 0, err
	}
	t0 := time.Now()
	for i := 0; i < iters; i++ {
		if err := op(ctx, g); err != nil {
			return 0, err
		}
	}
	return int64(time.Since(t0)) / int64(iters), nil
}

// roleNewGroupMismatch: ranks ask for different sub-groups; every rank must get
// parallel.ErrMismatch naming both requests, and the world stays usable.
func roleNewGroupMismatch(ctx context.Context, w *gloo.Group) error {
	ranks := []int{0, 1}
	if w.Rank() == 1 {
		ranks = []int{1, 0}
	}
	g, err := gloo.NewGroup(w, ranks)
	if !errors.Is(err, parallel.ErrMismatch) || g != nil {
		return fmt.Errorf("NewGroup(%v) with a peer asking for another order: %v, %v; want parallel.ErrMismatch", ranks, g, err)
	}
	if !strings.Contains(err.Error(), "[0 1]") || !strings.Contains(err.Error(), "[1 0]") {
		return fmt.Errorf("mismatch error does not name both requests: %v", err)
	}
	g, err = gloo.NewGroup(w, []int{1, 0})
	if err != nil || g == nil {
		return fmt.Errorf("NewGroup([1 0]) after a mismatch: %v, %v", g, err)
	}
	defer g.Close()
	if g.Rank() != 1-w.Rank() {
		return fmt.Errorf("world rank %d is rank %d of %s, want %d", w.Rank(), g.Rank(), g.Name(), 1-w.Rank())
	}
	return grouptest.Conformance(ctx, g)
}

// roleOpMismatch: rank 0 calls AllReduce MIN, rank 1 AllReduce SUM, the others Barrier;
// every rank must fail with parallel.ErrMismatch (and keep failing) instead of mixing data.
func roleOpMismatch(ctx context.Context, w *gloo.Group) error {
	if err := w.Barrier(ctx); err != nil {
		return err
	}
	var err error
	switch w.Rank() {
	case 0:
		err = w.AllReduce(ctx, parallel.Min, []int64{1, 2})
	case 1:
		err = w.AllReduce(ctx, parallel.Sum, []int64{1, 2})
	default:
		err = w.Barrier(ctx)
	}
	if !errors.Is(err, parallel.ErrMismatch) {
		return fmt.Errorf("mismatched collectives: got %v, want parallel.ErrMismatch", err)
	}
	if err2 := w.Barrier(ctx); !errors.Is(err2, parallel.ErrMismatch) {
		return fmt.Errorf("barrier after a mismatch: got %v, want the sticky parallel.ErrMismatch", err2)
	}
	fmt.Printf("rank %d: %v\n", w.Rank(), err)
	return nil
}

// roleEmptyAllReduce checks that an AllReduce of no elements is a collective like any other:
// it succeeds when every member calls it, and a member that calls it while the others reduce
// two elements fails with parallel.ErrMismatch like them, instead of returning alone.
func roleEmptyAllReduce(ctx context.Context, w *gloo.Group) error {
	if err := w.AllReduce(ctx, parallel.Sum, nil); err != nil {
		return fmt.Errorf("empty allreduce on every member: %w", err)
	}
	if err := w.Barrier(ctx); err != nil {
		return fmt.Errorf("barrier after an empty allreduce: %w", err)
	}
	vals := []int64{1, 2}
	if w.Rank() == 0 {
		vals = nil
	}
	if err := w.AllReduce(ctx, parallel.Min, vals); !errors.Is(err, parallel.ErrMismatch) {
		return fmt.Errorf("allreduce of %d elements against 2 on the others: got %v, want parallel.ErrMismatch", len(vals), err)
	}
	return nil
}
