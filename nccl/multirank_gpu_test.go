package nccl_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/cpcache/cpcache/cuda"
	"github.com/cpcache/cpcache/gloo"
	"github.com/cpcache/cpcache/internal/testenv/glootest"
	"github.com/cpcache/cpcache/internal/testenv/multiproc"
	"github.com/cpcache/cpcache/nccl"
	"github.com/cpcache/cpcache/parallel"
)

func TestMain(m *testing.M) { multiproc.Main(m) }

// multiRankGPUEnv lets NCCL (>= 2.30) put several ranks of one communicator on one GPU.
const multiRankGPUEnv = "NCCL_MULTI_RANK_GPU_ENABLE"

func init() {
	multiproc.Register("nccl-two-ranks-one-gpu", glootest.Role(time.Minute, twoRanksOneGPU))
}

// TestGPUTwoProcessReductions runs a 2-rank communicator in two processes on GPU 0 and
// checks that Sum, Min and Max give different, correct results: with one rank every
// reduction returns its input, so a wrong reduce-op mapping would pass unnoticed.
func TestGPUTwoProcessReductions(t *testing.T) {
	requireNCCL(t)
	lib, err := nccl.Open()
	must(t, err)
	v := lib.Version()
	lib.Close()
	if !v.AtLeast(2, 30, 0) {
		t.Skipf("NCCL %v: two ranks of one communicator on one GPU need NCCL >= 2.30 with %s=1", v, multiRankGPUEnv)
	}
	multiproc.Run(t, multiproc.Spec{Role: "nccl-two-ranks-one-gpu", N: 2, Timeout: 2 * time.Minute,
		Env: []string{"CPCACHE_STORE=file://" + t.TempDir(), multiRankGPUEnv + "=1"}})
}

// twoRanksOneGPU: rank r contributes x_r[i] = (r+1)*(i+1) - 3*r (rank 0: i+1, rank 1:
// 2i-1), so Sum, Min and Max differ at every element, through the Comm and through the
// parallel.Group adapter.
func twoRanksOneGPU(ctx context.Context, world *gloo.Group) error {
	drv, err := cuda.Open()
	if err != nil {
		return err
	}
	defer drv.Close()
	dev, err := drv.Device(0)
	if err != nil {
		return err
	}
	defer dev.Close()
	comm, err := nccl.NewComm(ctx, world, dev, nccl.Options{Timeout: time.Minute})
	if err != nil {
		return err
	}
	defer comm.Close()
	s, err := dev.NewStream()
	if err != nil {
		return err
	}
	defer s.Close()
	const n = 256
	r := int64(world.Rank())
	x := func(rank, i int64) int64 { return (rank+1)*(i+1) - 3*rank }
	in := make([]byte, 8*n)
	for i := range int64(n) {
		binary.LittleEndian.PutUint64(in[8*i:], uint64(x(r, i)))
	}
	send, err := dev.Alloc(8 * n)
	if err != nil {
		return err
	}
	defer send.Close()
	recv, err := dev.Alloc(8 * n)
	if err != nil {
		return err
	}
	defer recv.Close()
	if err := send.Write(0, in); err != nil {
		return err
	}
	out := make([]byte, 8*n)
	for _, c := range []struct {
		op   nccl.RedOp
		want func(a, b int64) int64
	}{
		{nccl.Sum, func(a, b int64) int64 { return a + b }},
		{nccl.Min, func(a, b int64) int64 { return min(a, b) }},
		{nccl.Max, func(a, b int64) int64 { return max(a, b) }},
	} {
		if err := comm.AllReduce(ctx, send.Ptr(), recv.Ptr(), n, nccl.Int64, c.op, s); err != nil {
			return err
		}
		if err := comm.Wait(ctx, s); err != nil {
			return err
		}
		if err := recv.Read(0, out); err != nil {
			return err
		}
		for i := range int64(n) {
			got, want := int64(binary.LittleEndian.Uint64(out[8*i:])), c.want(x(0, i), x(1, i))
			if got != want {
				return fmt.Errorf("rank %d: allreduce %v element %d = %d, want %d", r, c.op, i, got, want)
			}
		}
	}
	if err := comm.Close(); err != nil {
		return err
	}
	// The parallel.Group adapter maps parallel's reduce ops onto NCCL's.
	g, err := nccl.NewGroup(ctx, world, dev, nccl.Options{Timeout: time.Minute})
	if err != nil {
		return err
	}
	defer g.Close()
	for _, c := range []struct {
		op   parallel.ReduceOp
		want int64
	}{{parallel.Sum, 3 + 7}, {parallel.Min, 3}, {parallel.Max, 7}} {
		vals := []int64{3 + 4*r} // rank 0: 3, rank 1: 7
		if err := g.AllReduce(ctx, c.op, vals); err != nil {
			return err
		}
		if vals[0] != c.want {
			return fmt.Errorf("rank %d: group allreduce %v = %d, want %d", r, c.op, vals[0], c.want)
		}
	}
	if os.Getenv(multiRankGPUEnv) != "1" {
		return fmt.Errorf("%s not set in the rank process", multiRankGPUEnv)
	}
	return nil
}
