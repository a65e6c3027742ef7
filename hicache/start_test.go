package hicache

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/cpcache/cpcache/parallel/grouptest"
	"github.com/cpcache/cpcache/parallel/local"
)

// AgreeStart: every rank returns the same verdict, the payloads of all in rank order, or
// the StartError of the lowest failing rank (wrapping its own error there only).
func TestAgreeStart(t *testing.T) {
	const n = 4
	own := errors.New("no room for the pools")
	for _, failing := range [][]int{nil, {2}, {3, 1}} {
		t.Run(fmt.Sprint(failing), func(t *testing.T) {
			members := local.World(n, local.Options{Timeout: 10 * time.Second, Kind: "world"})
			payloads := make([][]string, n)
			errs := make([]error, n)
			grouptest.Parallel(n, func(r int) error {
				defer members[r].Close()
				var local error
				if slices.Contains(failing, r) {
					local = fmt.Errorf("rank %d: %w", r, own)
				}
				payloads[r], errs[r] = AgreeStart(context.Background(), members[r], "checking", local, fmt.Sprint("p", r))
				return nil
			})
			for r := range n {
				if len(failing) == 0 {
					if errs[r] != nil || !slices.Equal(payloads[r], []string{"p0", "p1", "p2", "p3"}) {
						t.Fatalf("rank %d: %v, %v; want every payload", r, payloads[r], errs[r])
					}
					continue
				}
				lowest := slices.Min(failing)
				var se *StartError
				if !errors.As(errs[r], &se) || se.Rank != lowest || errs[r].Error() != errs[0].Error() || !errors.Is(errs[r], ErrPeerFailed) {
					t.Fatalf("rank %d: %v; want the StartError of rank %d, the same on every rank", r, errs[r], lowest)
				}
				if want := fmt.Sprintf("checking: rank %d: no room", lowest); se.Cause[:len(want)] != want {
					t.Fatalf("rank %d: cause %q, want it to start with %q", r, se.Cause, want)
				}
				if errors.Is(errs[r], own) != (r == lowest) {
					t.Fatalf("rank %d: wraps its own error: %t, want %t", r, errors.Is(errs[r], own), r == lowest)
				}
			}
		})
	}
}
