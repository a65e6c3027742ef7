package gloo

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/cpcache/cpcache/parallel"
)

// Group is a Gloo process group. It implements parallel.Group. One collective runs at a time:
// concurrent calls are serialised by a mutex, in the order they take it, so callers that
// need a fixed order across ranks must issue collectives from one goroutine.
type Group struct {
	name    string
	rank    int
	ranks   []int
	timeout time.Duration
	shared  *shared // the world's store and device; owned by the world group

	mu  sync.Mutex // protects everything below, and serialises collectives
	ctx *cCtx      // nil once closed
	seq uint64     // operations started on this member
	err error      // sticky: the failure that ended the group, returned by every later call
	// groupSeq counts NewGroup/NewLayoutGroups calls on a world group (their store prefix).
	groupSeq int
}

var _ parallel.Group = (*Group)(nil)

func (g *Group) Rank() int { return g.rank }

func (g *Group) Size() int { return len(g.ranks) }

// Ranks returns the members' global ranks, in group-rank order (a copy).
func (g *Group) Ranks() []int { return append([]int(nil), g.ranks...) }

func (g *Group) Name() string { return g.name }

// Timeout is the group's default deadline for one collective.
func (g *Group) Timeout() time.Duration { return g.timeout }

// Err returns the error that ended the group (nil while it is usable).
func (g *Group) Err() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.err
}

// run executes one collective under the lock with the deadline of ctx and the group's
// timeout, and maps failures to dist errors. A failure caused by the transport, the deadline
// or the context is sticky: Gloo contexts are unusable after an I/O error, and a member that
// skipped or abandoned an operation is out of step with its peers.
func (g *Group) run(ctx context.Context, op string, fn func(c *cCtx, timeout time.Duration) error) error {
	if g == nil {
		return &parallel.OpError{Group: "<nil>", Op: op, Err: fmt.Errorf("gloo: %w: nil group", parallel.ErrClosed)}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.runLocked(ctx, op, fn)
}

func (g *Group) runLocked(ctx context.Context, op string, fn func(c *cCtx, timeout time.Duration) error) error {
	seq := g.seq
	g.seq++
	fail := func(err error) error {
		return &parallel.OpError{Group: g.name, Rank: g.rank, Op: op, Seq: seq, Err: err}
	}
	if g.ctx == nil {
		return fail(fmt.Errorf("gloo: %w", parallel.ErrClosed))
	}
	if g.err != nil {
		return fail(g.err)
	}
	deadline := parallel.Deadline(ctx, g.timeout)
	ctxDeadline := false
	if d, ok := ctx.Deadline(); ok && d.Equal(deadline) {
		ctxDeadline = true
	}
	if err := ctx.Err(); err != nil {
		if err == context.DeadlineExceeded {
			g.err = fmt.Errorf("gloo: %w (%w): deadline passed before the operation started", parallel.ErrTimeout, err)
		} else {
			g.err = fmt.Errorf("gloo: operation abandoned: %w", err)
		}
		return fail(g.err)
	}
	timeout := time.Duration(1<<63 - 1)
	if !deadline.IsZero() {
		timeout = time.Until(deadline)
		if timeout <= 0 {
			g.err = fmt.Errorf("gloo: %w: deadline passed before the operation started", parallel.ErrTimeout)
			return fail(g.err)
		}
	}
	if err := fn(g.ctx, timeout); err != nil {
		g.err = classify(err, ctxDeadline)
		return fail(g.err)
	}
	return nil
}

func badArg(g *Group, op string, format string, args ...any) error {
	return &parallel.OpError{Group: g.name, Rank: g.rank, Op: op, Err: fmt.Errorf("gloo: %w: "+format, append([]any{parallel.ErrBadArgument}, args...)...)}
}

// AllReduce reduces vals element-wise over all members, in place.
func (g *Group) AllReduce(ctx context.Context, op parallel.ReduceOp, vals []int64) error {
	var code int
	switch op {
	case parallel.Min:
		code = opMin
	case parallel.Max:
		code = opMax
	case parallel.Sum:
		code = opSum
	default:
		if g == nil {
			return g.run(ctx, "allreduce", nil)
		}
		return badArg(g, "allreduce", "unknown reduce op %v", op)
	}
	return g.run(ctx, "allreduce", func(c *cCtx, timeout time.Duration) error {
		return c.allReduce(code, vals, timeout)
	})
}

// Broadcast returns root's data on every member (non-roots' data is ignored).
func (g *Group) Broadcast(ctx context.Context, root int, data []byte) ([]byte, error) {
	if g != nil && (root < 0 || root >= len(g.ranks)) {
		return nil, badArg(g, "broadcast", "root %d out of range for a group of %d", root, len(g.ranks))
	}
	var out []byte
	err := g.run(ctx, "broadcast", func(c *cCtx, timeout time.Duration) error {
		var err error
		out, err = c.broadcast(root, data, timeout)
		return err
	})
	return out, err
}

// AllGather returns every member's data indexed by group rank; lengths may differ.
func (g *Group) AllGather(ctx context.Context, data []byte) ([][]byte, error) {
	var out [][]byte
	err := g.run(ctx, "allgather", func(c *cCtx, timeout time.Duration) error {
		var err error
		out, err = c.allGather(data, len(g.ranks), timeout)
		return err
	})
	return out, err
}

// Barrier returns once every member has entered it.
func (g *Group) Barrier(ctx context.Context) error {
	return g.run(ctx, "barrier", func(c *cCtx, timeout time.Duration) error {
		return c.barrier(timeout)
	})
}

// Close closes the group's connections (peers' pending and later collectives fail with
// parallel.ErrPeerLost). Closing the world group also releases the store and the device; groups
// created from it stay usable. Close waits for a collective in progress to end. It is
// nil-safe and idempotent.
func (g *Group) Close() error {
	if g == nil {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ctx == nil {
		return nil
	}
	g.ctx.close()
	g.ctx = nil
	if g.shared != nil && g.shared.owner == g {
		g.shared.close()
	}
	return nil
}
