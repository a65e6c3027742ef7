package storage

import (
	"errors"
	"fmt"
	"strings"
)

// Sentinel errors, usable with errors.Is on every backend's errors. A miss is not an error.
var (
	// ErrUnavailable: the backend could not be reached or did not answer in time (Redis down,
	// connection reset, deadline passed). Errors wrapping it also wrap the cause (a net error,
	// context.DeadlineExceeded or context.Canceled). The operation may be retried later.
	ErrUnavailable = errors.New("storage: unavailable")
	// ErrCorrupt: a stored value failed verification (torn write, foreign file, checksum
	// mismatch, wrong key or length). Get never returns it: a corrupt value is a miss, counted
	// in Stats.Corrupt and reported to Options.OnCorrupt with an error wrapping ErrCorrupt.
	ErrCorrupt = errors.New("storage: corrupt value")
	// ErrBadArgument: an argument that cannot be valid (a bad URL, a zero key, a key from
	// another namespace, mismatched slice lengths).
	ErrBadArgument = errors.New("storage: bad argument")
	// ErrClosed: the storage was closed.
	ErrClosed = errors.New("storage: closed")
)

// OpError reports a failed operation: which backend, which operation, and why. It wraps
// both a sentinel (Kind, may be nil for an error with no category, e.g. a full disk) and
// the underlying cause (Err).
type OpError struct {
	Backend string // "file", "redis" or "mem"
	Where   string // the directory, address or name; may be empty
	Op      string // "open", "exists", "get", "put", "delete", "clear"
	Kind    error  // ErrUnavailable, ErrCorrupt, ErrBadArgument, ErrClosed, or nil
	Err     error  // the cause; may be nil when Kind says it all
}

func (e *OpError) Error() string {
	where := e.Backend
	if e.Where != "" {
		where += " " + e.Where
	}
	switch {
	case e.Kind != nil && e.Err != nil:
		return fmt.Sprintf("storage: %s %s: %s: %v", where, e.Op, kindText(e.Kind), e.Err)
	case e.Kind != nil:
		return fmt.Sprintf("storage: %s %s: %s", where, e.Op, kindText(e.Kind))
	default:
		return fmt.Sprintf("storage: %s %s: %v", where, e.Op, e.Err)
	}
}

// Unwrap returns the sentinel and the cause, so errors.Is matches either.
func (e *OpError) Unwrap() []error {
	var out []error
	if e.Kind != nil {
		out = append(out, e.Kind)
	}
	if e.Err != nil {
		out = append(out, e.Err)
	}
	return out
}

// kindText is a sentinel's text without the package prefix the whole message already has.
func kindText(k error) string { return strings.TrimPrefix(k.Error(), "storage: ") }

func badArg(backend, where, op, format string, args ...any) error {
	return &OpError{Backend: backend, Where: where, Op: op, Kind: ErrBadArgument, Err: fmt.Errorf(format, args...)}
}
