package shm_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cpcache/cpcache/parallel"
	"github.com/cpcache/cpcache/parallel/grouptest"
	"github.com/cpcache/cpcache/parallel/local"
	"github.com/cpcache/cpcache/parallel/shm"
)

// newGroups creates an in-process shared-memory group of n members bootstrapped over a
// parallel/local group: each member maps the segment itself, as a process would.
func newGroups(t testing.TB, n int, opts shm.Options) ([]*shm.Group, []*parallel.Counted) {
	t.Helper()
	boots := local.World(n, local.Options{Timeout: 20 * time.Second})
	counted := make([]*parallel.Counted, n)
	for r, b := range boots {
		counted[r] = parallel.Count(b)
	}
	gs := make([]*shm.Group, n)
	errs := grouptest.Parallel(n, func(r int) error {
		var err error
		gs[r], err = shm.New(context.Background(), counted[r], opts)
		return err
	})
	for r, err := range errs {
		require.NoError(t, err, "rank %d", r)
	}
	t.Cleanup(func() {
		for _, g := range gs {
			assert.NoError(t, g.Close())
		}
	})
	return gs, counted
}

func TestConformanceInProcess(t *testing.T) {
	for _, n := range []int{1, 2, 8, 16} {
		gs, counted := newGroups(t, n, shm.Options{Timeout: 20 * time.Second})
		before := counted[0].Counts().Total()
		errs := grouptest.Parallel(n, func(r int) error { return grouptest.Conformance(context.Background(), gs[r]) })
		for r, err := range errs {
			assert.NoError(t, err, "n=%d rank %d", n, r)
		}
		// Every payload of the suite fits in the default slot: nothing went over the bootstrap.
		assert.Equal(t, before, counted[0].Counts().Total(), "n=%d: bootstrap used after creation", n)
		assert.Zero(t, gs[0].Fallbacks())
	}
}

func TestConformanceWithSmallSlotsFallsBackToBootstrap(t *testing.T) {
	// 64-byte slots: AllReduce of 64 elements, Broadcast of 100 and 4096 bytes and the larger
	// AllGathers must go through the bootstrap group, decided alike on every member.
	gs, counted := newGroups(t, 4, shm.Options{SlotBytes: 64, Timeout: 20 * time.Second})
	before := counted[0].Counts()
	errs := grouptest.Parallel(4, func(r int) error { return grouptest.Conformance(context.Background(), gs[r]) })
	for r, err := range errs {
		assert.NoError(t, err, "rank %d", r)
	}
	after := counted[0].Counts()
	assert.Equal(t, uint64(after.Total()-before.Total()), gs[0].Fallbacks())
	assert.Equal(t, 3, after.AllReduce-before.AllReduce, "the three 64-element allreduces")
	assert.Equal(t, 4*2, after.Broadcast-before.Broadcast, "100 and 4096 bytes from each root")
	assert.Equal(t, 1, after.AllGather-before.AllGather, "scale 64 (up to 256 bytes)")
	for _, c := range counted {
		assert.Equal(t, after, c.Counts(), "all members fell back on the same operations")
	}
}

func TestSoakInProcess(t *testing.T) {
	for _, tc := range []struct{ n, iters int }{{2, 4000}, {8, 2000}, {16, 1000}} {
		gs, _ := newGroups(t, tc.n, shm.Options{Timeout: 20 * time.Second})
		errs := grouptest.Parallel(tc.n, func(r int) error { return grouptest.Soak(context.Background(), gs[r], tc.iters) })
		for r, err := range errs {
			assert.NoError(t, err, "n=%d rank %d", tc.n, r)
		}
	}
}

func TestNameRanksFromBootstrap(t *testing.T) {
	boots := local.New([]int{8, 10, 12, 14}, local.Options{Kind: "attn_cp"})
	gs := make([]*shm.Group, 4)
	errs := grouptest.Parallel(4, func(r int) error {
		var err error
		gs[r], err = shm.New(context.Background(), boots[r], shm.Options{})
		return err
	})
	for r, err := range errs {
		require.NoError(t, err, "rank %d", r)
		defer gs[r].Close()
	}
	assert.Equal(t, "attn_cp[8,10,12,14]", gs[2].Name())
	assert.Equal(t, []int{8, 10, 12, 14}, gs[2].Ranks())
	assert.Equal(t, 2, gs[2].Rank())
	assert.Equal(t, 4, gs[2].Size())
}

func TestSegmentIsUnlinkedAfterCreation(t *testing.T) {
	dir := t.TempDir()
	newGroups(t, 3, shm.Options{Dir: dir})
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Empty(t, entries, "segment left in %s", dir)
}

func TestMembersOnDifferentFilesystemsAreNotLocal(t *testing.T) {
	// Two directories stand for two hosts: members that cannot see one segment directory
	// cannot share memory.
	dirs := []string{t.TempDir(), t.TempDir()}
	boots := local.World(2, local.Options{Timeout: 10 * time.Second})
	errs := grouptest.Parallel(2, func(r int) error {
		g, err := shm.New(context.Background(), boots[r], shm.Options{Dir: dirs[r]})
		assert.Nil(t, g)
		return err
	})
	for r, err := range errs {
		require.Error(t, err, "rank %d", r)
		assert.ErrorIs(t, err, shm.ErrNotLocal)
		assert.Contains(t, err.Error(), "shmdir")
	}
}

func TestMismatchedSlotBytesFailsEverywhere(t *testing.T) {
	boots := local.World(3, local.Options{Timeout: 10 * time.Second})
	errs := grouptest.Parallel(3, func(r int) error {
		sb := 4096
		if r == 2 {
			sb = 8192
		}
		g, err := shm.New(context.Background(), boots[r], shm.Options{SlotBytes: sb})
		g.Close()
		return err
	})
	for r, err := range errs {
		require.Error(t, err, "rank %d", r)
		assert.Contains(t, err.Error(), "member 2")
	}
}

func TestBadSlotBytesNamesValueOnEveryMember(t *testing.T) {
	boots := local.World(2, local.Options{Timeout: 10 * time.Second})
	errs := grouptest.Parallel(2, func(r int) error {
		opts := shm.Options{}
		if r == 1 {
			opts.SlotBytes = 100
		}
		_, err := shm.New(context.Background(), boots[r], opts)
		return err
	})
	for r, err := range errs {
		require.Error(t, err, "rank %d", r)
		assert.Contains(t, err.Error(), "SlotBytes 100")
	}
}

func TestConsensusSelection(t *testing.T) {
	pick := func(t *testing.T, n int, opts func(r int) shm.Options) ([]parallel.Group, []string, []error) {
		boots := local.World(n, local.Options{Timeout: 10 * time.Second})
		gs := make([]parallel.Group, n)
		backends := make([]string, n)
		errs := grouptest.Parallel(n, func(r int) error {
			var err error
			gs[r], backends[r], err = shm.Consensus(context.Background(), boots[r], opts(r))
			return err
		})
		t.Cleanup(func() {
			for r, g := range gs {
				if g != nil {
					assert.NoError(t, g.Close())
				}
				assert.NoError(t, boots[r].Close())
			}
		})
		return gs, backends, errs
	}
	t.Run("auto local picks shm", func(t *testing.T) {
		gs, backends, errs := pick(t, 3, func(int) shm.Options { return shm.Options{Backend: "auto"} })
		for r := range 3 {
			require.NoError(t, errs[r])
			assert.Equal(t, shm.BackendShm, backends[r])
			assert.IsType(t, &shm.Group{}, gs[r])
		}
	})
	t.Run("gloo forces bootstrap", func(t *testing.T) {
		gs, backends, errs := pick(t, 3, func(int) shm.Options { return shm.Options{Backend: "gloo"} })
		for r := range 3 {
			require.NoError(t, errs[r])
			assert.Equal(t, shm.BackendBootstrap, backends[r])
		}
		errs = grouptest.Parallel(3, func(r int) error { return grouptest.Conformance(context.Background(), gs[r]) })
		for r := range 3 {
			assert.NoError(t, errs[r])
		}
	})
	t.Run("auto not local picks bootstrap", func(t *testing.T) {
		dirs := []string{t.TempDir(), t.TempDir()}
		_, backends, errs := pick(t, 2, func(r int) shm.Options { return shm.Options{Dir: dirs[r]} })
		for r := range 2 {
			require.NoError(t, errs[r])
			assert.Equal(t, shm.BackendBootstrap, backends[r])
		}
	})
	t.Run("shm not local fails", func(t *testing.T) {
		dirs := []string{t.TempDir(), t.TempDir()}
		_, _, errs := pick(t, 2, func(r int) shm.Options { return shm.Options{Backend: "shm", Dir: dirs[r]} })
		for r := range 2 {
			assert.ErrorIs(t, errs[r], shm.ErrNotLocal)
		}
	})
	// A member that cannot tell its host identity (here: its shared-memory directory does not
	// exist) cannot share a segment, but the bootstrap group still serves: forced "gloo" and
	// "auto" use it, only "shm" fails, naming the member and why.
	t.Run("unknown identity: gloo and auto pick bootstrap, shm fails", func(t *testing.T) {
		missing := filepath.Join(t.TempDir(), "no-such-dir")
		dirs := []string{shm.DefaultDir, missing}
		for _, mode := range []string{"gloo", "auto"} {
			_, backends, errs := pick(t, 2, func(r int) shm.Options { return shm.Options{Backend: mode, Dir: dirs[r]} })
			for r := range 2 {
				require.NoError(t, errs[r], "%s: rank %d", mode, r)
				assert.Equal(t, shm.BackendBootstrap, backends[r], "%s: rank %d", mode, r)
			}
		}
		_, _, errs := pick(t, 2, func(r int) shm.Options { return shm.Options{Backend: "shm", Dir: dirs[r]} })
		for r := range 2 {
			assert.ErrorIs(t, errs[r], shm.ErrNotLocal, "rank %d", r)
			assert.ErrorContains(t, errs[r], "member 1", "rank %d", r)
			assert.ErrorContains(t, errs[r], missing, "rank %d", r)
		}
	})
	t.Run("disagreement fails everywhere", func(t *testing.T) {
		_, _, errs := pick(t, 2, func(r int) shm.Options { return shm.Options{Backend: []string{"auto", "gloo"}[r]} })
		for r := range 2 {
			require.Error(t, errs[r])
			assert.Contains(t, errs[r].Error(), `member 1 for "gloo"`)
		}
	})
	t.Run("unknown backend named everywhere", func(t *testing.T) {
		_, _, errs := pick(t, 2, func(r int) shm.Options { return shm.Options{Backend: []string{"auto", "tcp"}[r]} })
		for r := range 2 {
			require.Error(t, errs[r])
			assert.Contains(t, errs[r].Error(), `"tcp"`)
			assert.ErrorIs(t, errs[r], shm.ErrUnknownBackend, "member %d", r)
		}
	})
}

func TestConsensusBackendFromEnvironment(t *testing.T) {
	t.Setenv(shm.EnvBackend, "gloo")
	boots := local.World(2, local.Options{Timeout: 10 * time.Second})
	backends := make([]string, 2)
	errs := grouptest.Parallel(2, func(r int) error {
		g, b, err := shm.Consensus(context.Background(), boots[r], shm.Options{})
		backends[r] = b
		g.Close()
		return err
	})
	for r := range 2 {
		require.NoError(t, errs[r])
		assert.Equal(t, shm.BackendBootstrap, backends[r])
	}
}

func TestMissingMemberTimesOutOnEveryArrivedMember(t *testing.T) {
	gs, _ := newGroups(t, 4, shm.Options{Timeout: time.Minute})
	errs := grouptest.Parallel(3, func(r int) error {
		ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
		defer cancel()
		return gs[r].AllReduce(ctx, parallel.Min, []int64{1})
	})
	// The contexts' deadline, not the group's minute, ended the wait: the error of the member
	// that gave up first wraps context.DeadlineExceeded.
	assert.True(t, slices.ContainsFunc(errs, func(err error) bool { return errors.Is(err, context.DeadlineExceeded) }),
		"no member's error wraps context.DeadlineExceeded: %v", errs)
	for r, err := range errs {
		require.Error(t, err, "rank %d", r)
		assert.ErrorIs(t, err, parallel.ErrTimeout)
		var opErr *parallel.OpError
		require.True(t, errors.As(err, &opErr))
		assert.Equal(t, "allreduce", opErr.Op)
		assert.Equal(t, "world[0..3]", opErr.Group)
	}
	// The group is now unusable with the same error, on the late member too.
	assert.ErrorIs(t, gs[0].Barrier(context.Background()), parallel.ErrTimeout)
	assert.ErrorIs(t, gs[3].AllReduce(context.Background(), parallel.Min, []int64{1}), parallel.ErrTimeout)
}

func TestOneDeadlineFailsEveryWaiter(t *testing.T) {
	// Member 0 has a short deadline, member 1 a long one, member 2 never comes: member 1
	// fails when member 0 does, not at its own deadline.
	gs, _ := newGroups(t, 3, shm.Options{Timeout: time.Hour})
	errs := grouptest.Parallel(2, func(r int) error {
		d := []time.Duration{100 * time.Millisecond, time.Hour}[r]
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		return gs[r].Barrier(ctx)
	})
	for r, err := range errs {
		assert.ErrorIs(t, err, parallel.ErrTimeout, "rank %d", r)
	}
	assert.ErrorIs(t, errs[0], context.DeadlineExceeded)
	assert.Contains(t, errs[1].Error(), "member 0 (global rank 0) timed out waiting for member")
}

func TestGroupTimeoutAppliesWithoutContextDeadline(t *testing.T) {
	gs, _ := newGroups(t, 2, shm.Options{Timeout: 100 * time.Millisecond})
	err := gs[0].Barrier(context.Background())
	assert.ErrorIs(t, err, parallel.ErrTimeout)
	assert.NotErrorIs(t, err, context.DeadlineExceeded)
}

func TestClosedPeerFailsOthersWithPeerLost(t *testing.T) {
	gs, _ := newGroups(t, 3, shm.Options{Timeout: time.Minute})
	members := make([]parallel.Group, len(gs))
	for i, g := range gs {
		members[i] = g
	}
	pending, err := grouptest.ClosedPeer(members, 20*time.Second)
	require.NoError(t, err)
	for r, err := range pending {
		assert.Contains(t, err.Error(), "member 2", "rank %d", r)
	}
	var nilGroup *shm.Group
	assert.NoError(t, nilGroup.Close())
}

func TestPeerClosedBeforeOperationFailsIt(t *testing.T) {
	gs, _ := newGroups(t, 2, shm.Options{Timeout: time.Minute})
	require.NoError(t, gs[1].Close())
	err := gs[0].AllReduce(context.Background(), parallel.Sum, []int64{1})
	assert.ErrorIs(t, err, parallel.ErrPeerLost)
}

func TestCloseDuringOwnWaitFailsWithClosed(t *testing.T) {
	gs, _ := newGroups(t, 2, shm.Options{Timeout: time.Minute})
	done := make(chan error, 1)
	go func() { done <- gs[0].Barrier(context.Background()) }()
	time.Sleep(20 * time.Millisecond)
	require.NoError(t, gs[0].Close())
	select {
	case err := <-done:
		assert.ErrorIs(t, err, parallel.ErrClosed)
	case <-time.After(20 * time.Second):
		t.Fatal("Close did not end the member's own wait")
	}
}

func TestCanceledContextFailsEveryone(t *testing.T) {
	gs, _ := newGroups(t, 3, shm.Options{Timeout: time.Minute})
	ctx, cancel := context.WithCancel(context.Background())
	errs := grouptest.Parallel(2, func(r int) error {
		if r == 0 {
			time.AfterFunc(50*time.Millisecond, cancel)
			return gs[r].Barrier(ctx)
		}
		return gs[r].Barrier(context.Background())
	})
	assert.ErrorIs(t, errs[0], context.Canceled)
	assert.ErrorIs(t, errs[1], parallel.ErrPeerLost)
}

func TestDifferentCollectivesAreReportedAsMismatch(t *testing.T) {
	cases := map[string]func(g *shm.Group) error{
		"reduce op": func(g *shm.Group) error {
			return g.AllReduce(context.Background(), parallel.ReduceOp(g.Rank()%2), []int64{1, 2})
		},
		"length": func(g *shm.Group) error {
			return g.AllReduce(context.Background(), parallel.Sum, make([]int64, 1+g.Rank()))
		},
		"root": func(g *shm.Group) error {
			_, err := g.Broadcast(context.Background(), g.Rank(), []byte("x"))
			return err
		},
		"kind": func(g *shm.Group) error {
			if g.Rank() == 0 {
				return g.Barrier(context.Background())
			}
			_, err := g.AllGather(context.Background(), []byte("x"))
			return err
		},
	}
	for name, call := range cases {
		t.Run(name, func(t *testing.T) {
			gs, _ := newGroups(t, 2, shm.Options{Timeout: 10 * time.Second})
			errs := grouptest.Parallel(2, func(r int) error { return call(gs[r]) })
			for r, err := range errs {
				var opErr *parallel.OpError
				require.True(t, errors.As(err, &opErr), "rank %d: %v", r, err)
				assert.ErrorIs(t, err, parallel.ErrMismatch, "rank %d", r)
			}
			assert.ErrorIs(t, gs[0].Barrier(context.Background()), parallel.ErrMismatch, "sticky")
		})
	}
}

func TestBadArguments(t *testing.T) {
	gs, _ := newGroups(t, 2, shm.Options{})
	_, err := gs[0].Broadcast(context.Background(), 5, nil)
	assert.ErrorIs(t, err, parallel.ErrBadArgument)
	assert.Contains(t, err.Error(), "root 5")
	assert.ErrorIs(t, gs[0].AllReduce(context.Background(), parallel.ReduceOp(9), nil), parallel.ErrBadArgument)
	// Argument errors do not break the group.
	errs := grouptest.Parallel(2, func(r int) error { return gs[r].Barrier(context.Background()) })
	for _, err := range errs {
		assert.NoError(t, err)
	}
}

func TestNilBootstrap(t *testing.T) {
	_, err := shm.New(context.Background(), nil, shm.Options{})
	assert.ErrorContains(t, err, "nil bootstrap")
}

func TestSoakMixingSharedMemoryAndFallbackOperations(t *testing.T) {
	// With 64-byte slots, 8-element reductions go through shared memory and 9-element ones
	// through the bootstrap group; interleaving them must never mix results.
	gs, counted := newGroups(t, 4, shm.Options{SlotBytes: 64, Timeout: 20 * time.Second})
	before := counted[0].Counts().AllReduce
	const iters = 400
	errs := grouptest.Parallel(4, func(r int) error {
		for it := range iters {
			n := 8 + it%2
			op := parallel.ReduceOp(it % 3)
			vals := make([]int64, n)
			for i := range vals {
				vals[i] = grouptest.ReduceInput(r, i, it)
			}
			if err := gs[r].AllReduce(context.Background(), op, vals); err != nil {
				return err
			}
			for i, v := range vals {
				if want := grouptest.Reduced(op, 4, i, it); v != want {
					return fmt.Errorf("iteration %d (%s, n=%d): element %d = %d, want %d", it, op, n, i, v, want)
				}
			}
		}
		return nil
	})
	for r, err := range errs {
		assert.NoError(t, err, "rank %d", r)
	}
	assert.Equal(t, iters/2, counted[0].Counts().AllReduce-before, "odd iterations fell back")
}

func TestWaitingSleepsInsteadOfSpinning(t *testing.T) {
	// Member 0 waits about 400 ms for member 1 in a barrier. A waiter that spun would use
	// that much CPU time; one that sleeps on the futex uses a small fraction of it.
	gs, _ := newGroups(t, 2, shm.Options{})
	cpu := func() time.Duration {
		var ru syscall.Rusage
		require.NoError(t, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	const wait = 400 * time.Millisecond
	before := cpu()
	errs := grouptest.Parallel(2, func(r int) error {
		if r == 1 {
			time.Sleep(wait)
		}
		return gs[r].Barrier(context.Background())
	})
	used := cpu() - before
	for _, err := range errs {
		require.NoError(t, err)
	}
	assert.Less(t, used, wait/4, "CPU time used while one member waited %v", wait)
}

// A member that makes one collective more than its peers and waits for them learns how many
// each had entered: at its deadline, or at once when they close the group.
func TestWaiterNamesHowFarMissingMembersGot(t *testing.T) {
	for _, leave := range []bool{false, true} {
		gs, _ := newGroups(t, 3, shm.Options{Timeout: time.Minute})
		for _, err := range grouptest.Parallel(3, func(r int) error {
			for range 2 {
				if err := gs[r].Barrier(context.Background()); err != nil {
					return err
				}
			}
			return nil
		}) {
			require.NoError(t, err)
		}
		d := 200 * time.Millisecond
		if leave {
			d = time.Minute
			time.AfterFunc(50*time.Millisecond, func() { gs[1].Close(); gs[2].Close() })
		}
		ctx, cancel := context.WithTimeout(context.Background(), d)
		start := time.Now()
		err := gs[0].Barrier(ctx)
		cancel()
		var na *parallel.NotArrivedError
		require.True(t, errors.As(err, &na), "leave=%v: %v", leave, err)
		assert.Equal(t, uint64(2), na.Seq)
		assert.Equal(t, []int{1, 2}, na.Missing)
		assert.Equal(t, []uint64{2, 2}, na.Entered)
		assert.Contains(t, err.Error(), "members [1 2] had entered 2 operations; this member is in operation 3")
		if leave {
			assert.ErrorIs(t, err, parallel.ErrPeerLost)
			assert.Less(t, time.Since(start), 5*time.Second)
		} else {
			assert.ErrorIs(t, err, parallel.ErrTimeout)
		}
	}
}
