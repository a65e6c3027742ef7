package grouptest

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cpcache/cpcache/parallel"
)

// ClosedPeer checks, on the members of one in-process group (at least 2), what happens when
// the last member closes while the others wait in a barrier: Close succeeds and is
// idempotent, every other member's pending barrier fails with parallel.ErrPeerLost (within
// wait, a bound against hanging, not a speed check), so does its next collective, and the
// closed member's own next collective fails with parallel.ErrClosed. It returns the pending
// barriers' errors by rank, for backend-specific checks of their text, and the first wrong
// result.
func ClosedPeer(members []parallel.Group, wait time.Duration) ([]error, error) {
	ctx := context.Background()
	n := len(members)
	if n < 2 {
		return nil, fmt.Errorf("grouptest: ClosedPeer needs at least 2 members, got %d", n)
	}
	type result struct {
		rank int
		err  error
	}
	done := make(chan result, n-1)
	for r, m := range members[:n-1] {
		go func() { done <- result{r, m.Barrier(ctx)} }()
	}
	time.Sleep(20 * time.Millisecond) // let the barriers start waiting; either order must work
	last := members[n-1]
	if err := last.Close(); err != nil {
		return nil, fmt.Errorf("grouptest: close member %d: %w", n-1, err)
	}
	if err := last.Close(); err != nil {
		return nil, fmt.Errorf("grouptest: second close of member %d (Close is idempotent): %w", n-1, err)
	}
	pending := make([]error, n-1)
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for range n - 1 {
		select {
		case d := <-done:
			pending[d.rank] = d.err
			if !errors.Is(d.err, parallel.ErrPeerLost) {
				return pending, fmt.Errorf("grouptest: rank %d's barrier after a peer closed: %v, want parallel.ErrPeerLost", d.rank, d.err)
			}
		case <-timer.C:
			return pending, fmt.Errorf("grouptest: a survivor did not fail within %v after a peer closed", wait)
		}
	}
	if err := members[0].Barrier(ctx); !errors.Is(err, parallel.ErrPeerLost) {
		return pending, fmt.Errorf("grouptest: rank 0's next barrier: %v, want parallel.ErrPeerLost", err)
	}
	if err := last.Barrier(ctx); !errors.Is(err, parallel.ErrClosed) {
		return pending, fmt.Errorf("grouptest: the closed member's barrier: %v, want parallel.ErrClosed", err)
	}
	return pending, nil
}
