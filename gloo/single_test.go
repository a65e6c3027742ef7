package gloo_test

import (
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cpcache/cpcache/gloo"
	"github.com/cpcache/cpcache/parallel"
	"github.com/cpcache/cpcache/parallel/grouptest"
)

// A world of one rank needs no other process: the API's local behaviour is tested here.
func newSingle(t *testing.T) *gloo.Group {
	t.Helper()
	w, err := gloo.NewWorld(context.Background(), gloo.Options{Store: fileStore(t), Rank: 0, Size: 1, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	return w
}

func TestSingleRankWorld(t *testing.T) {
	ctx := context.Background()
	w := newSingle(t)
	if w.Rank() != 0 || w.Size() != 1 || w.Name() != "world[0]" {
		t.Fatalf("world: rank %d size %d name %q", w.Rank(), w.Size(), w.Name())
	}
	if err := grouptest.Conformance(ctx, w); err != nil {
		t.Fatal(err)
	}
	g, err := gloo.NewGroup(w, []int{0})
	if err != nil || g == nil {
		t.Fatalf("NewGroup([0]) = %v, %v", g, err)
	}
	defer g.Close()
	if err := grouptest.Soak(ctx, g, 8); err != nil {
		t.Fatal(err)
	}
	l, err := parallel.NewLayout(parallel.LayoutConfig{World: 1})
	if err != nil {
		t.Fatal(err)
	}
	lg, err := gloo.NewLayoutGroups(w, l)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range parallel.AllKinds {
		if got := lg.Group(k); got == nil || got.Name() != k.String()+"[0]" {
			t.Errorf("layout group %s = %v", k, got)
		}
	}
	if err := lg.Close(); err != nil {
		t.Fatal(err)
	}
	if err := lg.Close(); err != nil {
		t.Fatal("second Close:", err)
	}
}

func TestBadArguments(t *testing.T) {
	ctx := context.Background()
	w := newSingle(t)
	for _, ranks := range [][]int{nil, {1}, {-1}, {0, 0}} {
		if _, err := gloo.NewGroup(w, ranks); !errors.Is(err, parallel.ErrBadArgument) {
			t.Errorf("NewGroup(%v): %v, want parallel.ErrBadArgument", ranks, err)
		}
	}
	if _, err := gloo.NewGroup(nil, []int{0}); !errors.Is(err, parallel.ErrBadArgument) {
		t.Errorf("NewGroup(nil world): %v", err)
	}
	l2, _ := parallel.NewLayout(parallel.LayoutConfig{World: 2})
	if _, err := gloo.NewLayoutGroups(w, l2); !errors.Is(err, parallel.ErrBadArgument) || !strings.Contains(err.Error(), "2 ranks") {
		t.Errorf("NewLayoutGroups with a 2-rank layout on a 1-rank world: %v", err)
	}
	if _, err := w.Broadcast(ctx, 1, nil); !errors.Is(err, parallel.ErrBadArgument) || !strings.Contains(err.Error(), "root 1") {
		t.Errorf("Broadcast root 1: %v", err)
	}
	if err := w.AllReduce(ctx, parallel.ReduceOp(9), []int64{1}); !errors.Is(err, parallel.ErrBadArgument) {
		t.Errorf("AllReduce op 9: %v", err)
	}
	// Bad arguments are local mistakes, not failures of the group.
	if err := w.Barrier(ctx); err != nil {
		t.Errorf("barrier after bad arguments: %v", err)
	}
	for _, o := range []gloo.Options{
		{Store: "file:///tmp/x", Rank: 1, Size: 1},
		{Store: "file:///tmp/x", Rank: -1, Size: 2},
		{Store: "nope://", Rank: 0, Size: 1},
	} {
		if _, err := gloo.NewWorld(ctx, o); err == nil || !strings.HasPrefix(err.Error(), "gloo: ") {
			t.Errorf("NewWorld(%+v): %v", o, err)
		}
	}
}

func TestRedisUnreachable(t *testing.T) {
	port := freePort(t, "127.0.0.1")
	_, err := gloo.NewWorld(context.Background(), gloo.Options{Store: "redis://127.0.0.1:" + itoa(port), Rank: 0, Size: 1})
	if err == nil || !strings.Contains(err.Error(), "127.0.0.1:"+itoa(port)) {
		t.Fatalf("NewWorld with no redis server: %v, want an error naming the address", err)
	}
}

func TestClosedAndExpired(t *testing.T) {
	ctx := context.Background()
	w := newSingle(t)
	// A context whose deadline already passed ends the group: the member skipped an
	// operation its peers may have made.
	dead, cancel := context.WithDeadline(ctx, time.Now().Add(-time.Second))
	defer cancel()
	err := w.Barrier(dead)
	if !errors.Is(err, parallel.ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("barrier past the deadline: %v", err)
	}
	if err2 := w.AllReduce(ctx, parallel.Sum, []int64{1}); !errors.Is(err2, parallel.ErrTimeout) {
		t.Errorf("allreduce after the timeout: %v, want the sticky parallel.ErrTimeout", err2)
	}
	if w.Err() == nil {
		t.Error("Err() is nil after a failure")
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal("second Close:", err)
	}
	if _, err := w.AllGather(ctx, nil); !errors.Is(err, parallel.ErrClosed) {
		t.Errorf("allgather after Close: %v, want parallel.ErrClosed", err)
	}
	if _, err := gloo.NewGroup(w, []int{0}); !errors.Is(err, parallel.ErrClosed) {
		t.Errorf("NewGroup on a closed world: %v, want parallel.ErrClosed", err)
	}
	var nilGroup *gloo.Group
	if err := nilGroup.Close(); err != nil {
		t.Errorf("nil Close: %v", err)
	}
	if err := nilGroup.Barrier(ctx); !errors.Is(err, parallel.ErrClosed) {
		t.Errorf("nil Barrier: %v", err)
	}
	var nilLG *gloo.LayoutGroups
	if nilLG.Close() != nil || nilLG.Group(parallel.KindTP) != nil {
		t.Error("nil LayoutGroups is not inert")
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

// TestBadDirectMaxIsNamed checks that CPCACHE_GLOO_DIRECT_MAX values that are not a
// non-negative int, out-of-range ones included, fail NewWorld with an error naming them
// instead of silently wrapping into another limit.
func TestBadDirectMaxIsNamed(t *testing.T) {
	for _, v := range []string{"x", "-1", "4294967295", "99999999999999999999"} {
		t.Setenv("CPCACHE_GLOO_DIRECT_MAX", v)
		w, err := gloo.NewWorld(context.Background(), gloo.Options{Store: fileStore(t), Rank: 0, Size: 1, Timeout: 10 * time.Second})
		if err == nil {
			w.Close()
			t.Errorf("CPCACHE_GLOO_DIRECT_MAX=%s: NewWorld succeeded, want an error naming the value", v)
			continue
		}
		if !strings.Contains(err.Error(), `CPCACHE_GLOO_DIRECT_MAX="`+v+`"`) || !errors.Is(err, parallel.ErrBadArgument) {
			t.Errorf("CPCACHE_GLOO_DIRECT_MAX=%s: %v, want ErrBadArgument naming the value", v, err)
		}
	}
}

// TestWorldOfOneNeedsNoStore: a world of one given no store (none in the environment either)
// meets in a private directory, which goes with the group; a larger world without a store
// fails at once, saying how to run it, with one "gloo:" prefix.
func TestWorldOfOneNeedsNoStore(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	t.Setenv(gloo.EnvStore, "")
	ctx := context.Background()
	w, err := gloo.NewWorld(ctx, gloo.Options{Rank: 0, Size: 1, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatalf("a world of one without a store: %v", err)
	}
	if err := grouptest.Conformance(ctx, w); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(tmp); len(ents) != 1 || !strings.HasPrefix(ents[0].Name(), "cpcache-run-"+strconv.Itoa(os.Getpid())+"-") {
		t.Errorf("while open, %s holds %v; want one cpcache-run-%d-* store directory", tmp, ents, os.Getpid())
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(tmp); len(ents) != 0 {
		t.Errorf("after Close, %s still holds %v", tmp, ents)
	}

	_, err = gloo.NewWorld(ctx, gloo.Options{Rank: 0, Size: 2, Timeout: 10 * time.Second})
	if !errors.Is(err, parallel.ErrBadArgument) {
		t.Fatalf("a world of two without a store: %v, want ErrBadArgument", err)
	}
	msg := err.Error()
	for _, want := range []string{"rank 0 of 2", "cpcache launch -n N", "--store", "CPCACHE_STORE", "mpirun"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q does not say %q", msg, want)
		}
	}
	if strings.Count(msg, "gloo:") != 1 || strings.Contains(msg, "Options.") {
		t.Errorf("error %q: want one gloo: prefix and no Go field name", msg)
	}
}
