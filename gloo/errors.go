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
