package local_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cpcache/cpcache/parallel"
	"github.com/cpcache/cpcache/parallel/grouptest"
	"github.com/cpcache/cpcache/parallel/local"
)

// runAll runs fn on every member concurrently and returns the errors by rank.
func runAll(members []*local.Member, fn func(m *local.Member) error) []error {
	return grouptest.Parallel(len(members), func(r int) error { return fn(members[r]) })
}

func TestConformance(t *testing.T) {
	for _, n := range []int{1, 2, 8, 16} {
		members := local.World(n, local.Options{Timeout: 10 * time.Second})
		errs := runAll(members, func(m *local.Member) error {
			return grouptest.Conformance(context.Background(), m)
		})
		for r, err := range errs {
			assert.NoError(t, err, "n=%d rank %d", n, r)
		}
	}
}

func TestSoak(t *testing.T) {
	members := local.World(8, local.Options{Timeout: 10 * time.Second})
	errs := runAll(members, func(m *local.Member) error {
		return grouptest.Soak(context.Background(), m, 2000)
	})
	for r, err := range errs {
		assert.NoError(t, err, "rank %d", r)
	}
}

func TestSubGroupNameAndRanks(t *testing.T) {
	members := local.New([]int{8, 10, 12, 14}, local.Options{Kind: "attn_cp"})
	assert.Equal(t, "attn_cp[8,10,12,14]", members[2].Name())
	assert.Equal(t, []int{8, 10, 12, 14}, members[2].Ranks())
	assert.Equal(t, 2, members[2].Rank())
}

func TestMissingRankTimesOutOnEveryArrivedRank(t *testing.T) {
	members := local.World(4, local.Options{Timeout: time.Minute})
	errs := runAll(members[:3], func(m *local.Member) error {
		ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
		defer cancel()
		return m.AllReduce(ctx, parallel.Min, []int64{1})
	})
	// The contexts' deadline, not the group's minute, ended the wait: the error of the member
	// that gave up first wraps context.DeadlineExceeded.
	assert.True(t, slices.ContainsFunc(errs, func(err error) bool { return errors.Is(err, context.DeadlineExceeded) }),
		"no member's error wraps context.DeadlineExceeded: %v", errs)
	for r, err := range errs {
		require.Error(t, err, "rank %d", r)
		assert.ErrorIs(t, err, parallel.ErrTimeout)
		assert.Contains(t, err.Error(), "allreduce")
		assert.Contains(t, err.Error(), "world[0..3]")
	}
	// The group is now unusable with the same error.
	err := members[0].Barrier(context.Background())
	assert.ErrorIs(t, err, parallel.ErrTimeout)
}

func TestGroupTimeoutAppliesWithoutContextDeadline(t *testing.T) {
	members := local.World(2, local.Options{Timeout: 100 * time.Millisecond})
	err := members[0].Barrier(context.Background())
	assert.ErrorIs(t, err, parallel.ErrTimeout)
}

func TestClosedPeerFailsOthersWithPeerLost(t *testing.T) {
	members := local.World(3, local.Options{Timeout: time.Minute})
	gs := make([]parallel.Group, len(members))
	for i, m := range members {
		gs[i] = m
	}
	_, err := grouptest.ClosedPeer(gs, 5*time.Second)
	require.NoError(t, err)
	var nilMember *local.Member
	assert.NoError(t, nilMember.Close())
}

func TestDifferentCollectivesAreReportedAsMismatch(t *testing.T) {
	members := local.World(2, local.Options{Timeout: 5 * time.Second})
	errs := runAll(members, func(m *local.Member) error {
		if m.Rank() == 0 {
			return m.AllReduce(context.Background(), parallel.Min, []int64{1, 2})
		}
		return m.AllReduce(context.Background(), parallel.Max, []int64{1, 2})
	})
	for r, err := range errs {
		assert.ErrorIs(t, err, parallel.ErrMismatch, "rank %d", r)
	}
	members = local.World(2, local.Options{Timeout: 5 * time.Second})
	errs = runAll(members, func(m *local.Member) error {
		if m.Rank() == 0 {
			return m.Barrier(context.Background())
		}
		_, err := m.Broadcast(context.Background(), 0, []byte("x"))
		return err
	})
	for r, err := range errs {
		var opErr *parallel.OpError
		require.True(t, errors.As(err, &opErr), "rank %d: %v", r, err)
		assert.ErrorIs(t, err, parallel.ErrMismatch)
	}
}

func TestBadArguments(t *testing.T) {
	members := local.World(2, local.Options{})
	_, err := members[0].Broadcast(context.Background(), 5, nil)
	assert.ErrorIs(t, err, parallel.ErrBadArgument)
	assert.Contains(t, err.Error(), "root 5")
	assert.ErrorIs(t, members[0].AllReduce(context.Background(), parallel.ReduceOp(9), nil), parallel.ErrBadArgument)
}

func TestCountedRecordsSameSequence(t *testing.T) {
	members := local.World(4, local.Options{Timeout: 5 * time.Second})
	counted := make([]*parallel.Counted, len(members))
	for i, m := range members {
		counted[i] = parallel.Count(m)
	}
	errs := runAll(members, func(m *local.Member) error {
		c := counted[m.Rank()]
		for i := range 5 {
			if err := c.AllReduce(context.Background(), parallel.Sum, []int64{int64(i)}); err != nil {
				return err
			}
		}
		return c.Barrier(context.Background())
	})
	for _, err := range errs {
		require.NoError(t, err)
	}
	for _, c := range counted {
		assert.Equal(t, counted[0].Counts(), c.Counts())
		assert.Equal(t, 5, c.Counts().AllReduce)
		assert.Equal(t, 6, c.Counts().Total())
	}
	other := parallel.Count(local.World(1, local.Options{})[0])
	require.NoError(t, other.Barrier(context.Background()))
	assert.NotEqual(t, counted[0].Counts().SeqHash, other.Counts().SeqHash)
}

func BenchmarkAllReduce8(b *testing.B) {
	for _, n := range []int{2, 8} {
		b.Run(map[int]string{2: "ranks=2", 8: "ranks=8"}[n], func(b *testing.B) {
			members := local.World(n, local.Options{})
			b.ResetTimer()
			runAll(members, func(m *local.Member) error {
				v := make([]int64, 8)
				for range b.N {
					if err := m.AllReduce(context.Background(), parallel.Min, v); err != nil {
						return err
					}
				}
				return nil
			})
		})
	}
}

func TestCountedCloseIsNilSafeAndClosesItsGroup(t *testing.T) {
	var nilCounted *parallel.Counted
	assert.NoError(t, nilCounted.Close())
	assert.NoError(t, parallel.Count(nil).Close())
	m := local.World(1, local.Options{})[0]
	c := parallel.Count(m)
	require.NoError(t, c.Close())
	require.NoError(t, c.Close())
	assert.ErrorIs(t, m.Barrier(context.Background()), parallel.ErrClosed)
}
