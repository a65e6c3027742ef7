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
	// ErrForged: a stored value whose checksums hold failed authentication: its MAC does
	// not verify with this storage's key (forged, or written by a store user with another
	// key), or a genuine value of another key was copied under this one. Such values are
	// also ErrCorrupt: a miss, counted in Stats.Corrupt and Stats.Forged.
	ErrForged = errors.New("storage: forged value")

	// ErrMismatch: a stored value whose MACs and key hold was stored for other tokens or
	// under another parent page than the reader asked for (Binding): a miss, counted in
	// Stats.Corrupt and Stats.Mismatched, never served.
	ErrMismatch = errors.New("storage: value bound to other tokens")

	// ErrOldFormat: a stored value of an older format version (format.go): a miss, counted
	// in Stats.Corrupt and Stats.OldFormat, never served.
	ErrOldFormat = errors.New("storage: value of an old format version")
	// ErrNoKey: a shared store (Redis) was opened without a MAC key and without
	// Options.Insecure. It comes with ErrBadArgument.
	ErrNoKey = errors.New("storage: no MAC key")
	// ErrLink: the directory store found a symbolic link where it keeps a namespace,
	// fan-out, trash or page entry, and did not follow it. Reported to Options.OnWarning
	// with the link's path and counted in Stats.Links; what it stood for is skipped (a miss,
	// a put not made, an entry removed as a link).
	ErrLink = errors.New("storage: symbolic link under the store")
	// ErrWritableStore: the directory store's root can be written by group or others, who
	// can then delete its pages. Reported to Options.OnWarning at open, with the mode.
	ErrWritableStore = errors.New("storage: store directory writable by others")
	// ErrStuck is wrapped (with ErrUnavailable) by the error of a call refused because
	// Options.MaxStuck file system operations abandoned at earlier deadlines have still not
	// returned: the store is as good as down until they do.
	ErrStuck = errors.New("storage: file system calls stuck")
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

// kindError is a cause of a sentinel's kind (ErrForged, ErrNoKey) inside an OpError, whose
// text already has the package prefix.
type kindError struct {
	kind error
	err  error
}

func (e *kindError) Error() string   { return kindText(e.kind) + ": " + e.err.Error() }
func (e *kindError) Unwrap() []error { return []error{e.kind, e.err} }

// KindCause is err as a cause of sentinel kind's kind (ErrForged, ErrNoKey) inside an
// OpError: errors.Is finds both, and its text has kind's without the package prefix the
// OpError already gives (backends use it for the causes they report).
func KindCause(kind, err error) error { return &kindError{kind: kind, err: err} }

func forged(format string, args ...any) error {
	return KindCause(ErrForged, fmt.Errorf(format, args...))
}
