package nccl

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"

	"github.com/cpcache/cpcache/cuda"
	"github.com/cpcache/cpcache/parallel"
)

// Group is a parallel.Group whose collectives run on an NCCL communicator, so the cache's
// consensus can use NCCL when a user asks for it. Small host vectors are staged through
// pinned host memory and a device buffer on the Group's own stream; every collective waits
// for its stream with the deadline of its context (or the communicator's timeout) and aborts
// the communicator when it passes, so no call hangs. After such an error the group is
// unusable. NCCL cannot detect mismatched collectives: a member that calls a different
// operation makes the others time out (parallel.ErrTimeout) rather than fail with ErrMismatch.
type Group struct {
	comm  *Comm
	name  string
	ranks []int

	mu     sync.Mutex // protects everything below; one collective at a time
	stream *cuda.Stream
	dbuf   *cuda.DeviceBuffer
	hbuf   *cuda.HostBuffer
	seq    uint64
	closed bool
}

var _ parallel.Group = (*Group)(nil)

// NewGroup creates a communicator over base's members on dev (NewComm) and wraps it as a
// parallel.Group with base's name (prefixed "nccl:") and global ranks. Close closes the
// communicator; base stays open and owned by the caller.
func NewGroup(ctx context.Context, base parallel.Group, dev *cuda.Device, opts Options) (*Group, error) {
	c, err := NewComm(ctx, base, dev, opts)
	if err != nil {
		return nil, err
	}
	g, err := WrapComm(c, "nccl:"+base.Name(), base.Ranks())
	if err != nil {
		c.Close()
		return nil, err
	}
	return g, nil
}

// WrapComm makes a parallel.Group of an existing communicator; it takes ownership of c.
// ranks are the members' global ranks in communicator-rank order.
func WrapComm(c *Comm, name string, ranks []int) (*Group, error) {
	if len(ranks) != c.Size() {
		return nil, fmt.Errorf("nccl: group %s: %d global ranks for a communicator of %d", name, len(ranks), c.Size())
	}
	s, err := c.Device().NewStream()
	if err != nil {
		return nil, err
	}
	return &Group{comm: c, name: name, ranks: append([]int(nil), ranks...), stream: s}, nil
}

// Comm is the underlying communicator.
func (g *Group) Comm() *Comm { return g.comm }

// Rank implements parallel.Group.
func (g *Group) Rank() int { return g.comm.Rank() }

// Size implements parallel.Group.
func (g *Group) Size() int { return g.comm.Size() }

// Ranks implements parallel.Group.
func (g *Group) Ranks() []int { return append([]int(nil), g.ranks...) }

// Name implements parallel.Group.
func (g *Group) Name() string { return g.name }

// Close destroys the stream, the staging buffers and the communicator. Nil-safe, idempotent.
func (g *Group) Close() error {
	if g == nil {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return nil
	}
	g.closed = true
	return errors.Join(g.comm.Close(), g.stream.Close(), g.dbuf.Close(), g.hbuf.Close())
}

// beginLocked starts operation op: it checks the group is open and returns a function that
// wraps an error into a *parallel.OpError and advances the sequence number.
func (g *Group) beginLocked(op string) (func(error) error, error) {
	seq := g.seq
	g.seq++
	wrap := func(err error) error {
		if err == nil {
			return nil
		}
		if errors.Is(err, ErrClosed) && !errors.Is(err, parallel.ErrClosed) {
			err = fmt.Errorf("%w: %w", parallel.ErrClosed, err)
		}
		return &parallel.OpError{Group: g.name, Rank: g.Rank(), Op: op, Seq: seq, Err: err}
	}
	if g.closed {
		return wrap, wrap(parallel.ErrClosed)
	}
	return wrap, nil
}

// stageLocked makes the staging buffers at least n bytes.
func (g *Group) stageLocked(n int) error {
	if g.dbuf != nil && g.dbuf.Size() >= n {
		return nil
	}
	size := max(n, 4096)
	if g.dbuf != nil {
		size = max(size, 2*g.dbuf.Size())
	}
	d, err := g.comm.Device().Alloc(size)
	if err != nil {
		return err
	}
	h, err := g.comm.Device().AllocHost(size)
	if err != nil {
		d.Close()
		return err
	}
	if err := errors.Join(g.dbuf.Close(), g.hbuf.Close()); err != nil {
		d.Close()
		h.Close()
		return err
	}
	g.dbuf, g.hbuf = d, h
	return nil
}

// redOp is NCCL's reduction for op (false for an op NCCL has no match for).
func redOp(op parallel.ReduceOp) (RedOp, bool) {
	switch op {
	case parallel.Min:
		return Min, true
	case parallel.Max:
		return Max, true
	case parallel.Sum:
		return Sum, true
	}
	return 0, false
}

// AllReduce implements parallel.Group (int64 elements, reduced on the device).
func (g *Group) AllReduce(ctx context.Context, op parallel.ReduceOp, vals []int64) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	wrap, err := g.beginLocked("allreduce")
	if err != nil {
		return err
	}
	nop, ok := redOp(op)
	if !ok {
		return wrap(fmt.Errorf("%w: reduce op %v", parallel.ErrBadArgument, op))
	}
	if len(vals) == 0 {
		return nil
	}
	n := 8 * len(vals)
	if err := g.stageLocked(n); err != nil {
		return wrap(err)
	}
	h := g.hbuf.Bytes()
	for i, v := range vals {
		binary.LittleEndian.PutUint64(h[8*i:], uint64(v))
	}
	d := g.dbuf.Ptr()
	err = g.roundTripLocked(ctx, h[:n], n, func() error {
		return g.comm.AllReduce(ctx, d, d, len(vals), Int64, nop, g.stream)
	})
	if err != nil {
		return wrap(err)
	}
	for i := range vals {
		vals[i] = int64(binary.LittleEndian.Uint64(h[8*i:]))
	}
	return nil
}

// roundTripLocked copies in (host staging -> device), runs the collective, copies out
// bytes of result back to host staging, and waits with the deadline.
func (g *Group) roundTripLocked(ctx context.Context, in []byte, out int, collective func() error) error {
	if err := g.stream.CopyHtoD(g.dbuf.Ptr(), in); err != nil {
		return err
	}
	if err := collective(); err != nil {
		return err
	}
	if err := g.stream.CopyDtoH(g.hbuf.Bytes()[:out], g.dbuf.Ptr()); err != nil {
		return err
	}
	return g.comm.Wait(ctx, g.stream)
}

// Broadcast implements parallel.Group: the length goes first, then the bytes.
func (g *Group) Broadcast(ctx context.Context, root int, data []byte) ([]byte, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	wrap, err := g.beginLocked("broadcast")
	if err != nil {
		return nil, err
	}
	if root < 0 || root >= g.Size() {
		return nil, wrap(fmt.Errorf("%w: broadcast root %d out of range [0, %d)", parallel.ErrBadArgument, root, g.Size()))
	}
	if err := g.stageLocked(8); err != nil {
		return nil, wrap(err)
	}
	h := g.hbuf.Bytes()
	binary.LittleEndian.PutUint64(h, uint64(len(data)))
	d := g.dbuf.Ptr()
	if err := g.roundTripLocked(ctx, h[:8], 8, func() error {
		return g.comm.Broadcast(ctx, d, d, 1, Int64, root, g.stream)
	}); err != nil {
		return nil, wrap(err)
	}
	n := int(binary.LittleEndian.Uint64(h))
	if n < 0 || n > 1<<40 {
		return nil, wrap(fmt.Errorf("nccl: broadcast length %d from root %d is not plausible", n, root))
	}
	if n == 0 {
		return []byte{}, nil
	}
	if err := g.stageLocked(n); err != nil {
		return nil, wrap(err)
	}
	h, d = g.hbuf.Bytes(), g.dbuf.Ptr()
	in := h[:0]
	if g.Rank() == root {
		in = h[:n]
		copy(in, data)
	}
	if err := g.roundTripLocked(ctx, in, n, func() error {
		return g.comm.Broadcast(ctx, d, d, n, Uint8, root, g.stream)
	}); err != nil {
		return nil, wrap(err)
	}
	return append([]byte(nil), h[:n]...), nil
}

// AllGather implements parallel.Group: lengths are gathered first, then data padded to the
// longest.
func (g *Group) AllGather(ctx context.Context, data []byte) ([][]byte, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	wrap, err := g.beginLocked("allgather")
	if err != nil {
		return nil, err
	}
	size, rank := g.Size(), g.Rank()
	if err := g.stageLocked(8 * (size + 1)); err != nil {
		return nil, wrap(err)
	}
	h, d := g.hbuf.Bytes(), g.dbuf.Ptr()
	// Lengths: send from slot 0 (element 0), receive into slots 1..size.
	binary.LittleEndian.PutUint64(h, uint64(len(data)))
	if err := g.roundTripLocked(ctx, h[:8], 8*(size+1), func() error {
		return g.comm.AllGather(ctx, d, d.Add(8), 1, Int64, g.stream)
	}); err != nil {
		return nil, wrap(err)
	}
	lens := make([]int, size)
	longest := 0
	for r := range lens {
		lens[r] = int(binary.LittleEndian.Uint64(h[8*(r+1):]))
		longest = max(longest, lens[r])
	}
	if lens[rank] != len(data) {
		return nil, wrap(fmt.Errorf("nccl: allgather: own length came back as %d, sent %d", lens[rank], len(data)))
	}
	out := make([][]byte, size)
	if longest == 0 {
		for r := range out {
			out[r] = []byte{}
		}
		return out, nil
	}
	// Data: own padded block at [0, longest), gathered blocks at [longest, longest*(size+1)).
	if err := g.stageLocked(longest * (size + 1)); err != nil {
		return nil, wrap(err)
	}
	h, d = g.hbuf.Bytes(), g.dbuf.Ptr()
	copy(h, data)
	clear(h[len(data):longest])
	if err := g.roundTripLocked(ctx, h[:longest], longest*(size+1), func() error {
		return g.comm.AllGather(ctx, d, d.Add(longest), longest, Uint8, g.stream)
	}); err != nil {
		return nil, wrap(err)
	}
	for r := range out {
		off := longest * (r + 1)
		out[r] = append([]byte(nil), h[off:off+lens[r]]...)
	}
	return out, nil
}

// Barrier implements parallel.Group with a one-element sum.
func (g *Group) Barrier(ctx context.Context) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	wrap, err := g.beginLocked("barrier")
	if err != nil {
		return err
	}
	if err := g.stageLocked(8); err != nil {
		return wrap(err)
	}
	h, d := g.hbuf.Bytes(), g.dbuf.Ptr()
	binary.LittleEndian.PutUint64(h, 1)
	if err := g.roundTripLocked(ctx, h[:8], 8, func() error {
		return g.comm.AllReduce(ctx, d, d, 1, Int64, Sum, g.stream)
	}); err != nil {
		return wrap(err)
	}
	if got := int(binary.LittleEndian.Uint64(h)); got != g.Size() {
		return wrap(fmt.Errorf("nccl: barrier counted %d members, want %d", got, g.Size()))
	}
	return nil
}
