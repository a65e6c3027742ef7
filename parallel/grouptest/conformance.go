package grouptest

import (
	"bytes"
	"context"
	"fmt"

	"github.com/cpcache/cpcache/parallel"
)

// Conformance checks identity, every collective with several sizes and roots, and values
// computed locally from the ranks. It makes the same sequence of calls on every member.
func Conformance(ctx context.Context, g parallel.Group) error {
	if err := checkIdentity(ctx, g); err != nil {
		return err
	}
	for _, n := range []int{0, 1, 8, 64} {
		for _, op := range []parallel.ReduceOp{parallel.Min, parallel.Max, parallel.Sum} {
			if err := checkAllReduce(ctx, g, op, n, 0); err != nil {
				return err
			}
		}
	}
	for root := 0; root < g.Size(); root++ {
		for _, n := range []int{0, 1, 100, 4096} {
			if err := checkBroadcast(ctx, g, root, n); err != nil {
				return err
			}
		}
	}
	for _, scale := range []int{0, 1, 64} {
		if err := checkAllGather(ctx, g, scale); err != nil {
			return err
		}
	}
	if err := g.Barrier(ctx); err != nil {
		return fmt.Errorf("grouptest: barrier: %w", err)
	}
	return nil
}

// Soak runs iters back-to-back operations whose values change with the iteration, so that a
// result from one operation leaking into the next (a generation mix-up) is caught.
func Soak(ctx context.Context, g parallel.Group, iters int) error {
	for it := 0; it < iters; it++ {
		switch it % 4 {
		case 0, 1:
			if err := checkAllReduce(ctx, g, parallel.ReduceOp(it%3), 8, it); err != nil {
				return fmt.Errorf("iteration %d: %w", it, err)
			}
		case 2:
			if err := checkBroadcastSalted(ctx, g, it%g.Size(), 16+it%48, it); err != nil {
				return fmt.Errorf("iteration %d: %w", it, err)
			}
		case 3:
			if err := checkAllGatherSalted(ctx, g, 1, it); err != nil {
				return fmt.Errorf("iteration %d: %w", it, err)
			}
		}
	}
	return nil
}

// ReduceInput is the value member rank contributes at index i of a test vector.
func ReduceInput(rank, i, salt int) int64 {
	v := int64((rank+1)*1_000_003+i*7919+salt*104729) % 2_000_003
	if (rank+i+salt)%3 == 0 {
		v = -v
	}
	return v << 20 // exercise high bits
}

// Reduced is the expected result of op over size members at index i.
func Reduced(op parallel.ReduceOp, size, i, salt int) int64 {
	acc := ReduceInput(0, i, salt)
	for r := 1; r < size; r++ {
		a := []int64{acc}
		op.Apply(a, []int64{ReduceInput(r, i, salt)})
		acc = a[0]
	}
	return acc
}

// payload is the deterministic payload of member rank: n bytes.
func payload(rank, n, salt int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rank*31 + i*7 + salt*13 + i>>8)
	}
	return b
}

func checkIdentity(ctx context.Context, g parallel.Group) error {
	size, rank := g.Size(), g.Rank()
	if size < 1 || rank < 0 || rank >= size {
		return fmt.Errorf("grouptest: rank %d size %d out of range", rank, size)
	}
	if len(g.Ranks()) != size {
		return fmt.Errorf("grouptest: Ranks() has %d entries, Size() is %d", len(g.Ranks()), size)
	}
	self := fmt.Sprintf("%d|%s|%v", rank, g.Name(), g.Ranks())
	all, err := g.AllGather(ctx, []byte(self))
	if err != nil {
		return fmt.Errorf("grouptest: identity allgather: %w", err)
	}
	if len(all) != size {
		return fmt.Errorf("grouptest: allgather returned %d parts, want %d", len(all), size)
	}
	for r, part := range all {
		want := fmt.Sprintf("%d|%s|%v", r, g.Name(), g.Ranks())
		if string(part) != want {
			return fmt.Errorf("grouptest: member %d reports identity %q, want %q", r, part, want)
		}
	}
	return nil
}

func checkAllReduce(ctx context.Context, g parallel.Group, op parallel.ReduceOp, n, salt int) error {
	vals := make([]int64, n)
	for i := range vals {
		vals[i] = ReduceInput(g.Rank(), i, salt)
	}
	if err := g.AllReduce(ctx, op, vals); err != nil {
		return fmt.Errorf("grouptest: allreduce %s n=%d: %w", op, n, err)
	}
	for i, v := range vals {
		if want := Reduced(op, g.Size(), i, salt); v != want {
			return fmt.Errorf("grouptest: allreduce %s n=%d salt=%d: element %d = %d, want %d", op, n, salt, i, v, want)
		}
	}
	return nil
}

func checkBroadcast(ctx context.Context, g parallel.Group, root, n int) error {
	return checkBroadcastSalted(ctx, g, root, n, 0)
}

func checkBroadcastSalted(ctx context.Context, g parallel.Group, root, n, salt int) error {
	var data []byte
	if g.Rank() == root {
		data = payload(root, n, salt)
	} else if g.Rank()%2 == 1 {
		data = payload(g.Rank(), 3, salt) // garbage that must be ignored
	}
	got, err := g.Broadcast(ctx, root, data)
	if err != nil {
		return fmt.Errorf("grouptest: broadcast root=%d n=%d: %w", root, n, err)
	}
	if want := payload(root, n, salt); !bytes.Equal(got, want) {
		return fmt.Errorf("grouptest: broadcast root=%d n=%d salt=%d: got %d bytes %x…, want %d bytes %x…",
			root, n, salt, len(got), head(got), len(want), head(want))
	}
	return nil
}

// gatherLen is the length member rank contributes to an AllGather at scale.
func gatherLen(rank, scale int) int { return ((rank * 7) % 5) * scale }

func checkAllGather(ctx context.Context, g parallel.Group, scale int) error {
	return checkAllGatherSalted(ctx, g, scale, 0)
}

func checkAllGatherSalted(ctx context.Context, g parallel.Group, scale, salt int) error {
	got, err := g.AllGather(ctx, payload(g.Rank(), gatherLen(g.Rank(), scale)+salt%7, salt))
	if err != nil {
		return fmt.Errorf("grouptest: allgather scale=%d: %w", scale, err)
	}
	if len(got) != g.Size() {
		return fmt.Errorf("grouptest: allgather returned %d parts, want %d", len(got), g.Size())
	}
	for r, part := range got {
		if want := payload(r, gatherLen(r, scale)+salt%7, salt); !bytes.Equal(part, want) {
			return fmt.Errorf("grouptest: allgather scale=%d salt=%d: part %d is %d bytes %x…, want %d bytes %x…",
				scale, salt, r, len(part), head(part), len(want), head(want))
		}
	}
	return nil
}

func head(b []byte) []byte { return b[:min(len(b), 8)] }
