package hicache

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/cpcache/cpcache/parallel"
)

// Messages of AgreeStart: a rank's payload, or its failure.
const (
	startOK     = "ok "
	startFailed = "error "
)

// AgreeStart is the start agreement for a step of a job's construction outside New that can
// fail on one rank (opening a storage, a host-memory check): every rank of g calls it with
// the outcome of its own step, local or a payload to compare, and every rank returns the same
// verdict: each rank's payload, in g's rank order, or a *StartError naming the lowest rank
// whose step failed and its cause, prefixed by what (on that rank it also wraps local). An
// error of the collective itself is returned joined with local. Without it, a rank that fails
// alone leaves its peers waiting for it until their deadline, with no cause.
func AgreeStart(ctx context.Context, g parallel.Group, what string, local error, payload string) ([]string, error) {
	msg := startOK + payload
	if local != nil {
		msg = startFailed + local.Error()
		msg = msg[:min(len(msg), StartCauseLen)]
	}
	all, err := g.AllGather(ctx, []byte(msg))
	if err != nil {
		return nil, errors.Join(local, fmt.Errorf("hicache: agreeing on %s: %w", what, err))
	}
	payloads := make([]string, len(all))
	for r, m := range all {
		if cause, failed := strings.CutPrefix(string(m), startFailed); failed {
			se := &StartError{Rank: g.Ranks()[r], Group: g.Name(), Cause: what + ": " + cause}
			if r == g.Rank() {
				se.Err = local
			}
			return nil, se
		}
		payloads[r] = strings.TrimPrefix(string(m), startOK)
	}
	return payloads, nil
}
