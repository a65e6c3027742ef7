package gloo

import (
	"context"
	"errors"
	"fmt"

	"github.com/cpcache/cpcache/parallel"
)

// classify turns a shim failure into an error wrapping the matching dist sentinel.
// ctxDeadline reports that the context's deadline (not the group's timeout) bounded the
// operation, in which case a timeout also wraps context.DeadlineExceeded.
func classify(err error, ctxDeadline bool) error {
	var se *shimError
	if !errors.As(err, &se) {
		return err
	}
	switch se.code {
	case codeTimeout:
		if ctxDeadline {
			return fmt.Errorf("gloo: %w (%w): %s", parallel.ErrTimeout, context.DeadlineExceeded, se.msg)
		}
		return fmt.Errorf("gloo: %w: %s", parallel.ErrTimeout, se.msg)
	case codeIO:
		return fmt.Errorf("gloo: %w: %s", parallel.ErrPeerLost, se.msg)
	case codeMismatch:
		return fmt.Errorf("gloo: %w: %s", parallel.ErrMismatch, se.msg)
	case codeInvalid:
		return fmt.Errorf("gloo: %w: %s", parallel.ErrBadArgument, se.msg)
	}
	return fmt.Errorf("gloo: %s", se.msg)
}

// NoStoreError is the error of a rank of a world of more than one given no rendezvous store
// (neither Options.Store, Options.Rendezvous nor CPCACHE_STORE). A bad argument
// (errors.Is parallel.ErrBadArgument).
type NoStoreError struct {
	Rank, Size int
	// Arg names the store argument of the API in use ("": the cpcache commands' --store or
	// CPCACHE_STORE).
	Arg string
}

func (e *NoStoreError) Error() string {
	arg := e.Arg
	if arg == "" {
		arg = "--store or CPCACHE_STORE (under mpirun: -x CPCACHE_STORE=...)"
	}
	return fmt.Sprintf("gloo: no rendezvous store for rank %d of %d: run every rank under `cpcache launch -n N` (which makes one) "+
		"or give them all the same one, file:///dir or redis://host:port, with %s", e.Rank, e.Size, arg)
}

func (e *NoStoreError) Unwrap() error { return parallel.ErrBadArgument }
