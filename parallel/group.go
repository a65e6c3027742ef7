package parallel

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// ReduceOp is the reduction of an AllReduce.
type ReduceOp int

// Reductions over int64 vectors.
const (
	Min ReduceOp = iota
	Max
	Sum
)

func (op ReduceOp) String() string {
	switch op {
	case Min:
		return "min"
	case Max:
		return "max"
	case Sum:
		return "sum"
	}
	return fmt.Sprintf("ReduceOp(%d)", int(op))
}

// Valid reports whether op is one of Min, Max, Sum.
func (op ReduceOp) Valid() bool { return op == Min || op == Max || op == Sum }

// Apply folds src into dst element-wise. The slices must have equal length.
func (op ReduceOp) Apply(dst, src []int64) {
	switch op {
	case Min:
		for i, v := range src {
			dst[i] = min(dst[i], v)
		}
	case Max:
		for i, v := range src {
			dst[i] = max(dst[i], v)
		}
	case Sum:
		for i, v := range src {
			dst[i] += v
		}
	}
}

// Group is a process group: a fixed, ordered set of ranks that run collectives together.
//
// Every collective is blocking and context-aware: it returns when the operation completed on
// this rank, or with an error when the context's deadline (or the group's own timeout, when
// the context has none) passes, when a peer is lost, or when the group was closed. A backend
// never hangs past the deadline. After an error caused by a peer or a timeout, a group may be
// unusable (backends document this); callers treat such an error as fatal for the group.
//
// All members must call the same collectives, in the same order, with matching arguments
// (same op and length for AllReduce, same root for Broadcast). Implementations are not
// required to support concurrent collectives on one Group: one at a time per group.
type Group interface {
	// Rank is this member's index in the group, 0 <= Rank < Size.
	Rank() int
	// Size is the number of members.
	Size() int
	// Ranks are the global ranks of the members, in group-rank order.
	Ranks() []int
	// Name is a stable, human-readable name, identical on every member (e.g. "attn_cp[8..15]").
	Name() string

	// AllReduce reduces vals element-wise over all members, in place.
	AllReduce(ctx context.Context, op ReduceOp, vals []int64) error
	// Broadcast returns root's data on every member; non-roots' data is ignored
	// (it may be nil) and they learn the length from the root.
	Broadcast(ctx context.Context, root int, data []byte) ([]byte, error)
	// AllGather returns every member's data indexed by group rank; lengths may differ.
	AllGather(ctx context.Context, data []byte) ([][]byte, error)
	// Barrier returns once every member has entered it.
	Barrier(ctx context.Context) error
	// Close releases the group. It is nil-safe and idempotent.
	Close() error
}

// Sentinel errors, usable with errors.Is on any backend's errors.
var (
	// ErrPeerLost: a member exited, closed the group, or its connection broke.
	ErrPeerLost = errors.New("parallel: peer lost")
	// ErrTimeout: the deadline passed before every member arrived. Errors that wrap it also
	// wrap context.DeadlineExceeded when the context's own deadline was the one that passed.
	ErrTimeout = errors.New("parallel: collective timed out")
	// ErrMismatch: members called different collectives (or with different arguments) at
	// the same position in their sequence of operations.
	ErrMismatch = errors.New("parallel: collective mismatch")
	// ErrClosed: the group was closed by this member.
	ErrClosed = errors.New("parallel: group closed")
	// ErrBadArgument: an argument that cannot be valid (unknown op, root out of range).
	ErrBadArgument = errors.New("parallel: bad argument")
)

// OpError reports a failed collective: which group, which operation, and why.
type OpError struct {
	Group string // Group.Name()
	Rank  int    // this member's group rank
	Op    string // "allreduce", "broadcast", "allgather", "barrier", "new_group", ...
	Seq   uint64 // position of the operation in this member's sequence (0-based), when known
	Err   error
}

func (e *OpError) Error() string {
	return fmt.Sprintf("parallel: %s on group %s (rank %d, op #%d): %v", e.Op, e.Group, e.Rank, e.Seq, e.Err)
}

func (e *OpError) Unwrap() error { return e.Err }

// DefaultTimeout is the timeout a backend uses when neither its options nor the context give
// one. Consensus steps are far shorter; this only bounds a lost peer.
const DefaultTimeout = 60 * time.Second

// Deadline returns the earlier of ctx's deadline and now+timeout (timeout <= 0: ctx's only;
// neither: the zero time, meaning none).
func Deadline(ctx context.Context, timeout time.Duration) time.Time {
	d, ok := ctx.Deadline()
	if timeout > 0 {
		t := time.Now().Add(timeout)
		if !ok || t.Before(d) {
			return t
		}
	}
	if ok {
		return d
	}
	return time.Time{}
}

// GroupName builds the conventional name of a group from its kind and global ranks:
// "attn_cp[0,2,4,6]" or, for a contiguous run, "tp[0..15]".
func GroupName(kind string, ranks []int) string {
	if len(ranks) == 0 {
		return kind + "[]"
	}
	contiguous := len(ranks) > 2
	for i := 1; i < len(ranks) && contiguous; i++ {
		contiguous = ranks[i] == ranks[i-1]+1
	}
	if contiguous {
		return fmt.Sprintf("%s[%d..%d]", kind, ranks[0], ranks[len(ranks)-1])
	}
	s := kind + "["
	for i, r := range ranks {
		if i > 0 {
			s += ","
		}
		s += fmt.Sprint(r)
	}
	return s + "]"
}

// NotArrivedError is why a collective could not complete when the backend knows where the
// members that had not arrived were: how many operations each had entered. It wraps the
// failure (ErrTimeout, ErrPeerLost), whose message it keeps. A member that entered fewer
// operations than this one and stays there has usually made fewer calls of the collective
// (a scheduler that called a collective one time more on this rank than on its peers).
type NotArrivedError struct {
	Seq     uint64   // this member's operation (0-based: it had entered Seq before it)
	Missing []int    // the group ranks that had not arrived, ascending
	Entered []uint64 // Entered[i]: the operations Missing[i] had entered (at most Seq)
	Err     error
}

func (e *NotArrivedError) Error() string {
	var b strings.Builder
	b.WriteString(e.Err.Error())
	b.WriteString(" (")
	// Runs of members that had entered as many operations are named together.
	for i := 0; i < len(e.Missing); {
		j := i + 1
		for j < len(e.Missing) && e.Entered[j] == e.Entered[i] {
			j++
		}
		if i > 0 {
			b.WriteString(", ")
		}
		if j-i == 1 {
			fmt.Fprintf(&b, "member %d had entered %d operations", e.Missing[i], e.Entered[i])
		} else {
			fmt.Fprintf(&b, "members %v had entered %d operations", e.Missing[i:j], e.Entered[i])
		}
		i = j
	}
	fmt.Fprintf(&b, "; this member is in operation %d)", e.Seq+1)
	return b.String()
}

func (e *NotArrivedError) Unwrap() error { return e.Err }
