package hicache

import (
	"errors"
	"fmt"

	"github.com/cpcache/cpcache/hicache/core"
)

// ErrInjected is wrapped by every failure a Faults failpoint injects.
var ErrInjected = errors.New("hicache: injected fault")

// Faults are failpoints on one rank, for tests and for rehearsing a deployment's failure
// handling (cpcache run --fault). Config.Faults nil, the default, injects nothing; each
// failpoint then costs one nil check. Local: each rank may get its own (or none).
type Faults struct {
	// NewError makes New fail on this rank with an error wrapping it (and ErrInjected), as a
	// failed engine or storage check would, after the rank built its cache and before the
	// group's first collective: every rank of the group returns the same *StartError.
	NewError error
	// CopyFail reports the first transfer this rank sees finished at or after the step as
	// failed (a copy that failed at completion): the group aborts the backup, or makes the
	// loaded node stale, on every rank at the same step.
	CopyFail StepFault
	// DivergeTree and DivergePlacement perturb this rank's tree (LRU order) or L2 placement
	// before its vector of the step (core.Core.PerturbTree, PerturbPlacement): every rank
	// detects the divergence at that step and the group quarantines, then recovers.
	DivergeTree, DivergePlacement StepFault
}

// StepFault is a failpoint that fires once, at the first consensus step numbered Step or
// later (steps count from 0, one per Cache.Step), when On.
type StepFault struct {
	On   bool
	Step uint64
}

// faultState tracks which failpoints fired (protected by Cache.mu).
type faultState struct {
	f                                *Faults
	copyFired, treeFired, placeFired bool
}

// due reports whether sf fires at step, and marks it fired.
func due(sf StepFault, fired *bool, step uint64) bool {
	if !sf.On || *fired || step < sf.Step {
		return false
	}
	*fired = true
	return true
}

// newError is the error New must fail with on this rank (nil: none).
func (s *faultState) newError() error {
	if s.f == nil || s.f.NewError == nil {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrInjected, s.f.NewError)
}

// copyError is the error to report for a transfer that finished without one at step (nil:
// report it as it is).
func (s *faultState) copyError(t Transfer, step uint64) error {
	if s.f == nil || !due(s.f.CopyFail, &s.copyFired, step) {
		return nil
	}
	return fmt.Errorf("%w: %s of node %d failed at step %d", ErrInjected, t.Kind, t.Node, step)
}

// beforeVector perturbs the core before it fills its vector of step.
func (s *faultState) beforeVector(cr *core.Core, step uint64) {
	if s.f == nil {
		return
	}
	if due(s.f.DivergeTree, &s.treeFired, step) {
		cr.PerturbTree()
	}
	if due(s.f.DivergePlacement, &s.placeFired, step) {
		cr.PerturbPlacement()
	}
}
