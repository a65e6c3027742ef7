package shm

import (
	"context"
	"fmt"
	"math"
	"time"
	"unsafe"

	"github.com/cpcache/cpcache/parallel"
)

// int64s views the start of a slot's data area as n int64 (slots are 64-byte aligned).
func int64s(data []byte, n int) []int64 {
	if n == 0 {
		return nil
	}
	return unsafe.Slice((*int64)(unsafe.Pointer(&data[0])), n)
}

// AllReduce reduces vals element-wise over all members, in place.
func (g *Group) AllReduce(ctx context.Context, op parallel.ReduceOp, vals []int64) error {
	if !op.Valid() {
		return g.opErr("allreduce", g.peekSeq(), fmt.Errorf("%w: reduce op %d", parallel.ErrBadArgument, int(op)))
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	n := len(vals)
	inShm := n*8 <= g.l.slotBytes
	d := desc{kind: kindAllReduce, arg: uint32(op), n: uint32(min(n, math.MaxUint32))}
	p, seq, deadline, err := g.roundLocked(ctx, "allreduce", d, uint64(n), func(data []byte) {
		if inShm {
			copy(int64s(data, n), vals)
		}
	})
	if err != nil {
		return err
	}
	if !inShm {
		return g.fallbackLocked(ctx, "allreduce", seq, deadline, func(ctx context.Context) error {
			return g.boot.AllReduce(ctx, op, vals)
		})
	}
	copy(vals, int64s(g.slotDataLocked(p, 0), n))
	for r := 1; r < len(g.ranks); r++ {
		op.Apply(vals, int64s(g.slotDataLocked(p, r), n))
	}
	return nil
}

// Broadcast returns root's data on every member.
func (g *Group) Broadcast(ctx context.Context, root int, data []byte) ([]byte, error) {
	if root < 0 || root >= len(g.ranks) {
		return nil, g.opErr("broadcast", g.peekSeq(), fmt.Errorf("%w: root %d not in group of size %d", parallel.ErrBadArgument, root, len(g.ranks)))
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	var length uint64
	if g.rank == root {
		length = uint64(len(data))
	}
	p, seq, deadline, err := g.roundLocked(ctx, "broadcast", desc{kind: kindBroadcast, arg: uint32(root)}, length, func(buf []byte) {
		if g.rank == root && len(data) <= len(buf) {
			copy(buf, data)
		}
	})
	if err != nil {
		return nil, err
	}
	n := g.slotLenLocked(p, root)
	if n > uint64(g.l.slotBytes) {
		var out []byte
		err := g.fallbackLocked(ctx, "broadcast", seq, deadline, func(ctx context.Context) error {
			var err error
			out, err = g.boot.Broadcast(ctx, root, data)
			if err == nil && uint64(len(out)) != n {
				err = fmt.Errorf("shm: bootstrap broadcast returned %d bytes, root announced %d", len(out), n)
			}
			return err
		})
		return out, err
	}
	return append(make([]byte, 0, n), g.slotDataLocked(p, root)[:n]...), nil
}

// AllGather returns every member's data indexed by group rank.
func (g *Group) AllGather(ctx context.Context, data []byte) ([][]byte, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	p, seq, deadline, err := g.roundLocked(ctx, "allgather", desc{kind: kindAllGather}, uint64(len(data)), func(buf []byte) {
		if len(data) <= len(buf) {
			copy(buf, data)
		}
	})
	if err != nil {
		return nil, err
	}
	for r := range g.ranks {
		if g.slotLenLocked(p, r) > uint64(g.l.slotBytes) {
			var out [][]byte
			err := g.fallbackLocked(ctx, "allgather", seq, deadline, func(ctx context.Context) error {
				var err error
				out, err = g.boot.AllGather(ctx, data)
				if err == nil && len(out) != len(g.ranks) {
					err = fmt.Errorf("shm: bootstrap allgather returned %d parts for %d members", len(out), len(g.ranks))
				}
				return err
			})
			return out, err
		}
	}
	out := make([][]byte, len(g.ranks))
	for r := range out {
		n := int(g.slotLenLocked(p, r))
		out[r] = append(make([]byte, 0, n), g.slotDataLocked(p, r)[:n]...)
	}
	return out, nil
}

// Barrier returns once every member has entered it.
func (g *Group) Barrier(ctx context.Context) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	_, _, _, err := g.roundLocked(ctx, "barrier", desc{kind: kindBarrier}, 0, nil)
	return err
}

// fallbackLocked runs an operation whose payload did not fit through the bootstrap group,
// under the deadline of the shared-memory round that announced it. A failure is fatal for
// the group, as in the shared-memory path, and is published to the other members.
func (g *Group) fallbackLocked(ctx context.Context, op string, seq uint64, deadline time.Time, fn func(context.Context) error) error {
	g.fallbacks++
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	if err := fn(ctx); err != nil {
		err = fmt.Errorf("shm: %s through bootstrap group: %w", op, err)
		g.broken = err
		g.publishLocked(abortFailed, -1)
		return g.opErr(op, seq, err)
	}
	return nil
}

// peekSeq is the position the next operation will have (for argument errors).
func (g *Group) peekSeq() uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.seq
}
