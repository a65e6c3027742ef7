package gloo_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cpcache/cpcache/gloo"
	"github.com/cpcache/cpcache/parallel"
)

// The ranks of these tests are goroutines of this process meeting through one in-memory
// parallel.Store (Options.Rendezvous), as an engine's workers meet through its TCPStore.

// joinAll runs NewWorld for ranks 0..n-1 of one job on st and returns each rank's group
// and error.
func joinAll(st parallel.Store, n int, jobID string, timeout time.Duration) ([]*gloo.Group, []error) {
	groups, errs := make([]*gloo.Group, n), make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() {
			groups[r], errs[r] = gloo.NewWorld(context.Background(), gloo.Options{
				Rendezvous: st, Rank: r, Size: n, LocalSize: n, JobID: jobID, Timeout: timeout})
		})
	}
	wg.Wait()
	return groups, errs
}

// sumRanks all-reduces the ranks on every group and checks the sum, then closes them.
func sumRanks(t *testing.T, groups []*gloo.Group) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make([]error, len(groups))
	for r, g := range groups {
		wg.Go(func() {
			v := []int64{int64(g.Rank())}
			if err := g.AllReduce(context.Background(), parallel.Sum, v); err != nil {
				errs[r] = err
			} else if n := int64(len(groups)); v[0] != n*(n-1)/2 {
				errs[r] = fmt.Errorf("rank %d: sum %d, want %d", r, v[0], n*(n-1)/2)
			}
		})
	}
	wg.Wait()
	for _, g := range groups {
		g.Close()
	}
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
}

func mustJoin(t *testing.T, st parallel.Store, n int, jobID string) []*gloo.Group {
	t.Helper()
	groups, errs := joinAll(st, n, jobID, 20*time.Second)
	if err := errors.Join(errs...); err != nil {
		for _, g := range groups {
			if g != nil {
				g.Close()
			}
		}
		t.Fatal(err)
	}
	return groups
}

// foreignKeys returns the keys of st outside the "cpcache/" prefix other than keep.
func foreignKeys(st *parallel.MemStore, keep string) []string {
	var out []string
	for _, k := range st.Keys() {
		if !strings.HasPrefix(k, "cpcache/") && k != keep {
			out = append(out, k)
		}
	}
	return out
}

func TestCallerStoreWorld(t *testing.T) {
	st := parallel.NewMemStore()
	ctx := context.Background()
	if err := st.Set(ctx, "engine/own", []byte("mine")); err != nil {
		t.Fatal(err)
	}
	sumRanks(t, mustJoin(t, st, 8, "job-a"))
	if v, ok, _ := st.Get(ctx, "engine/own", 0); !ok || string(v) != "mine" {
		t.Fatalf("the engine's key is %q (present %v), want \"mine\"", v, ok)
	}
	if k := foreignKeys(st, "engine/own"); len(k) > 0 {
		t.Fatalf("keys written outside cpcache/: %q", k)
	}
}

func TestCallerStoreTwoJobs(t *testing.T) {
	st := parallel.NewMemStore()
	var wg sync.WaitGroup
	var a, b []*gloo.Group
	var errA, errB []error
	wg.Go(func() { a, errA = joinAll(st, 4, "job-a", 20*time.Second) })
	wg.Go(func() { b, errB = joinAll(st, 4, "job-b", 20*time.Second) })
	wg.Wait()
	if err := errors.Join(append(errA, errB...)...); err != nil {
		t.Fatal(err)
	}
	sumRanks(t, a)
	sumRanks(t, b)
}

// Two jobs with one job id on one store: each rank of the second is refused at once, naming
// the rank two processes claim (or the world forms from one job's ranks and the other's
// time out: never a world of both).
func TestCallerStoreSameJobIDRefused(t *testing.T) {
	st := parallel.NewMemStore()
	var wg sync.WaitGroup
	var a, b []*gloo.Group
	var errA, errB []error
	start := time.Now()
	wg.Go(func() { a, errA = joinAll(st, 4, "job-x", 5*time.Second) })
	wg.Go(func() { b, errB = joinAll(st, 4, "job-x", 5*time.Second) })
	wg.Wait()
	dup := 0
	for _, err := range append(errA, errB...) {
		if errors.Is(err, gloo.ErrDuplicateRank) {
			dup++
			if !strings.Contains(err.Error(), "two processes claim rank") || !strings.Contains(err.Error(), "of job job-x") {
				t.Errorf("duplicate rank error does not name it: %v", err)
			}
		}
	}
	if dup == 0 {
		t.Fatalf("no rank refused as a duplicate (after %v): %v / %v", time.Since(start), errA, errB)
	}
	for _, gs := range [][]*gloo.Group{a, b} {
		for _, g := range gs {
			if g != nil {
				g.Close()
			}
		}
	}
}

func TestCallerStoreDuplicateRankZero(t *testing.T) {
	st := parallel.NewMemStore()
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Go(func() {
			g, err := gloo.NewWorld(context.Background(), gloo.Options{Rendezvous: st, Rank: 0, Size: 2, JobID: "job-d", Timeout: 3 * time.Second})
			if g != nil {
				g.Close()
			}
			errs[i] = err
		})
	}
	wg.Wait()
	var dup error
	for _, err := range errs {
		if errors.Is(err, gloo.ErrDuplicateRank) {
			dup = err
		}
	}
	if dup == nil || !strings.Contains(dup.Error(), "two processes claim rank 0 of job job-d on the caller's rendezvous store") {
		t.Fatalf("want one process refused naming the duplicate rank 0, got %v", errs)
	}
	if !errors.Is(dup, gloo.ErrStoreInUse) || strings.Contains(dup.Error(), "another job") {
		t.Fatalf("a duplicate rank is a taken store (ErrStoreInUse) whose message speaks of the rank only: %v", dup)
	}
}

func TestCallerStoreReopen200(t *testing.T) {
	st := parallel.NewMemStore()
	n := 200
	if testing.Short() {
		n = 20
	}
	for i := range n {
		groups, errs := joinAll(st, 2, "", 20*time.Second)
		if err := errors.Join(errs...); err != nil {
			t.Fatalf("cycle %d: %v", i, err)
		}
		for _, g := range groups {
			g.Close()
		}
	}
	// What is left is the claim's last generation and hint, not one key per cycle.
	if k := st.Keys(); len(k) > 20 {
		t.Fatalf("%d keys left after %d cycles: %q", len(k), n, k)
	}
}

// hangingStore never answers Get.
type hangingStore struct {
	*parallel.MemStore
	block chan struct{}
}

func (h hangingStore) Get(ctx context.Context, key string, wait time.Duration) ([]byte, bool, error) {
	<-h.block
	return nil, false, nil
}

func TestCallerStoreHungGetEndsAtDeadline(t *testing.T) {
	st := hangingStore{parallel.NewMemStore(), make(chan struct{})}
	defer close(st.block)
	start := time.Now()
	_, err := gloo.NewWorld(context.Background(), gloo.Options{Rendezvous: st, Rank: 1, Size: 2, Timeout: time.Second})
	if !errors.Is(err, parallel.ErrTimeout) {
		t.Fatalf("want a timeout, got %v", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("a hung store held the rendezvous %v past its 1 s deadline", d)
	}
}

func TestCallerStoreAndURLRefused(t *testing.T) {
	_, err := gloo.NewWorld(context.Background(), gloo.Options{Store: "file:///tmp/x", Rendezvous: parallel.NewMemStore(), Rank: 0, Size: 2})
	if !errors.Is(err, parallel.ErrBadArgument) || !strings.Contains(err.Error(), "Store") || !strings.Contains(err.Error(), "Rendezvous") {
		t.Fatalf("want a bad argument naming Store and Rendezvous, got %v", err)
	}
}

func TestNoStoreNamesTheArgument(t *testing.T) {
	t.Setenv("CPCACHE_STORE", "")
	_, err := gloo.NewWorld(context.Background(), gloo.Options{Rank: 0, Size: 2, StoreArg: "store="})
	var ns *gloo.NoStoreError
	if !errors.As(err, &ns) || !strings.Contains(err.Error(), "with store=") || strings.Contains(err.Error(), "--store") {
		t.Fatalf("want a NoStoreError naming store=, got %v", err)
	}
}
