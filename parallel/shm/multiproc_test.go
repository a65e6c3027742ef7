package shm_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cpcache/cpcache/gloo"
	"github.com/cpcache/cpcache/internal/testenv/glootest"
	"github.com/cpcache/cpcache/internal/testenv/multiproc"
	"github.com/cpcache/cpcache/parallel"
	"github.com/cpcache/cpcache/parallel/grouptest"
	"github.com/cpcache/cpcache/parallel/shm"
)

// Environment of the rank processes.
const (
	envDir   = "SHM_TEST_DIR"   // segment directory
	envIters = "SHM_TEST_ITERS" // soak iterations / benchmark operations
	envWant  = "SHM_TEST_WANT"  // select role: the backend Consensus must pick, or "not-local"
)

func TestMain(m *testing.M) {
	multiproc.Register("conformance", shmRole(roleConformance))
	multiproc.Register("peer-death", shmRole(rolePeerDeath))
	multiproc.Register("stall", shmRole(roleStall))
	multiproc.Register("bench", shmRole(roleBench))
	multiproc.Register("select", glootest.Role(time.Minute, roleSelect))
	multiproc.Main(m)
}

// shmRole is a role on the shared-memory group built over the Gloo world of this rank
// process (store from CPCACHE_STORE, segments in envDir), one-minute timeouts; fn gets both.
func shmRole(fn func(ctx context.Context, g *shm.Group, boot parallel.Group) error) func() error {
	return glootest.Role(time.Minute, func(ctx context.Context, boot *gloo.Group) error {
		g, err := shm.New(ctx, boot, shm.Options{Dir: os.Getenv(envDir), Timeout: time.Minute})
		if err != nil {
			return err
		}
		defer g.Close()
		return fn(ctx, g, boot)
	})
}

func roleConformance(ctx context.Context, g *shm.Group, boot parallel.Group) error {
	if err := grouptest.Conformance(ctx, g); err != nil {
		return err
	}
	iters, _ := strconv.Atoi(os.Getenv(envIters))
	if err := grouptest.Soak(ctx, g, iters); err != nil {
		return err
	}
	entries, err := os.ReadDir(os.Getenv(envDir))
	if err != nil {
		return err
	}
	if len(entries) != 0 {
		return fmt.Errorf("segment directory holds %d entries after creation, want none: %s", len(entries), entries[0].Name())
	}
	return g.Barrier(ctx)
}

// rolePeerDeath: member 3 arrives at a barrier that member 2 joins late and is killed
// (SIGKILL) while it waits; the survivors' next collective must fail with ErrPeerLost
// naming it, long before the group's one-minute timeout.
func rolePeerDeath(ctx context.Context, g *shm.Group, boot parallel.Group) error {
	if err := g.Barrier(ctx); err != nil {
		return err
	}
	switch g.Rank() {
	case 3:
		time.AfterFunc(100*time.Millisecond, func() { syscall.Kill(os.Getpid(), syscall.SIGKILL) })
		g.Barrier(ctx)
		select {} // killed
	case 2:
		time.Sleep(time.Second)
	}
	err := g.Barrier(ctx)
	if err == nil {
		err = g.AllReduce(ctx, parallel.Sum, []int64{1})
	}
	if !errors.Is(err, parallel.ErrPeerLost) || !strings.Contains(err.Error(), "member 3") {
		return fmt.Errorf("want a peer-lost error naming member 3, got %v", err)
	}
	if err2 := g.Barrier(ctx); !errors.Is(err2, parallel.ErrPeerLost) {
		return fmt.Errorf("group not broken with the same error: %v", err2)
	}
	return nil
}

// roleStall: member 3 stalls; members 0 and 1 give up at their 1 s deadline, member 2
// (with a one-minute deadline) fails with them, and member 3, when it comes back, finds the
// group failed.
func roleStall(ctx context.Context, g *shm.Group, boot parallel.Group) error {
	if err := g.Barrier(ctx); err != nil {
		return err
	}
	switch g.Rank() {
	case 0, 1:
		ctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		err := g.AllReduce(ctx, parallel.Max, []int64{int64(g.Rank())})
		if !errors.Is(err, parallel.ErrTimeout) {
			return fmt.Errorf("want a timeout, got %v", err)
		}
	case 2:
		err := g.AllReduce(ctx, parallel.Max, []int64{int64(g.Rank())})
		if !errors.Is(err, parallel.ErrTimeout) || !strings.Contains(err.Error(), "waiting for member 3") {
			return fmt.Errorf("want a timeout caused by member 3, got %v", err)
		}
	case 3:
		time.Sleep(3 * time.Second)
		err := g.AllReduce(ctx, parallel.Max, []int64{int64(g.Rank())})
		if !errors.Is(err, parallel.ErrTimeout) {
			return fmt.Errorf("want the group's timeout after the stall, got %v", err)
		}
	}
	return nil
}

// roleSelect picks the consensus group with shm.Consensus (backend setting from
// CPCACHE_CONSENSUS_BACKEND) and checks the choice, then runs the conformance suite on it.
func roleSelect(ctx context.Context, world *gloo.Group) error {
	g, backend, err := shm.Consensus(ctx, world, shm.Options{Dir: os.Getenv(envDir), Timeout: time.Minute})
	want := os.Getenv(envWant)
	if want == "not-local" {
		if !errors.Is(err, shm.ErrNotLocal) || !strings.Contains(err.Error(), "netns") {
			return fmt.Errorf("want an error wrapping shm.ErrNotLocal naming netns, got %v", err)
		}
		return world.Barrier(ctx)
	}
	if err != nil {
		return err
	}
	defer g.Close()
	if backend != want {
		return fmt.Errorf("consensus backend %q, want %q", backend, want)
	}
	if err := grouptest.Conformance(ctx, g); err != nil {
		return err
	}
	return world.Barrier(ctx)
}

// benchTimes is one backend's timing in roleBench's report.
type benchTimes struct{ Median, P99, Total time.Duration }

// roleBench times AllReduce of 8 int64 MIN on the Gloo world group and on the
// shared-memory group built over it, in the same processes; rank 0 reports the median,
// p99 and total of each, by backend name, as JSON.
func roleBench(ctx context.Context, g *shm.Group, boot parallel.Group) error {
	n, _ := strconv.Atoi(os.Getenv(envIters))
	times := map[string]benchTimes{}
	for _, b := range []struct {
		name string
		g    parallel.Group
	}{{"gloo", boot}, {"shm", g}} {
		if err := boot.Barrier(ctx); err != nil {
			return err
		}
		lat, total, err := timeAllReduce8(ctx, b.g, n)
		if err != nil {
			return err
		}
		times[b.name] = benchTimes{Median: lat[n/2], P99: lat[n*99/100], Total: total}
	}
	if g.Rank() != 0 {
		return nil
	}
	rep, err := json.Marshal(times)
	if err != nil {
		return err
	}
	return multiproc.Report(rep)
}

// timeAllReduce8 warms up, then returns the sorted latencies of n operations and their
// total time.
func timeAllReduce8(ctx context.Context, g parallel.Group, n int) ([]time.Duration, time.Duration, error) {
	vals := make([]int64, 8)
	for range 50 {
		if err := g.AllReduce(ctx, parallel.Min, vals); err != nil {
			return nil, 0, err
		}
	}
	lat := make([]time.Duration, n)
	start := time.Now()
	for i := range n {
		t0 := time.Now()
		if err := g.AllReduce(ctx, parallel.Min, vals); err != nil {
			return nil, 0, err
		}
		lat[i] = time.Since(t0)
	}
	total := time.Since(start)
	slices.Sort(lat)
	return lat, total, nil
}

// segmentDir makes a private directory for this test's segments on the shared-memory
// filesystem (where segments normally live), removed at the end.
func segmentDir(t testing.TB) string {
	base := shm.DefaultDir
	if _, err := os.Stat(base); err != nil {
		base = ""
	}
	dir, err := os.MkdirTemp(base, "cpcache-shm-test-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func rankEnv(t testing.TB, iters int) []string {
	return []string{
		envDir + "=" + segmentDir(t),
		gloo.EnvStore + "=file://" + t.TempDir(),
		envIters + "=" + strconv.Itoa(iters),
	}
}

func TestMultiProcessConformanceAndSoak(t *testing.T) {
	for _, n := range []int{2, 8, 16} {
		t.Run(fmt.Sprintf("ranks=%d", n), func(t *testing.T) {
			multiproc.Run(t, multiproc.Spec{Role: "conformance", N: n, Env: rankEnv(t, 2000), Timeout: 3 * time.Minute})
		})
	}
}

func TestMultiProcessPeerDeath(t *testing.T) {
	res := multiproc.Start(t, multiproc.Spec{Role: "peer-death", N: 4, Env: rankEnv(t, 0), Timeout: 2 * time.Minute})()
	for _, r := range res[:3] {
		assert.NoError(t, r.Err, "survivor %d:\n%s", r.Rank, r.Output)
	}
	assert.True(t, res[3].KilledBy(syscall.SIGKILL), "member 3 should have been killed by SIGKILL: %v\n%s", res[3].Err, res[3].Output)
}

func TestMultiProcessStall(t *testing.T) {
	multiproc.Run(t, multiproc.Spec{Role: "stall", N: 4, Env: rankEnv(t, 0), Timeout: 2 * time.Minute})
}

func TestMultiProcessConsensusSelection(t *testing.T) {
	for _, tc := range []struct{ setting, want string }{
		{"", shm.BackendShm}, {"auto", shm.BackendShm}, {"shm", shm.BackendShm}, {"gloo", shm.BackendBootstrap},
	} {
		t.Run("backend="+tc.setting, func(t *testing.T) {
			env := append(rankEnv(t, 0), shm.EnvBackend+"="+tc.setting, envWant+"="+tc.want)
			multiproc.Run(t, multiproc.Spec{Role: "select", N: 3, Env: env, Timeout: 2 * time.Minute})
		})
	}
}
