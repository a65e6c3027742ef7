package nccl_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/cpcache/cpcache/cuda"
	"github.com/cpcache/cpcache/cuda/cudatest"
	"github.com/cpcache/cpcache/nccl"
	"github.com/cpcache/cpcache/parallel"
	"github.com/cpcache/cpcache/parallel/grouptest"
	"github.com/cpcache/cpcache/parallel/local"
)

// requireNCCL returns device 0 with NCCL loadable, or skips (fails under CPCACHE_REQUIRE_GPU=1).
func requireNCCL(t *testing.T) *cuda.Device {
	t.Helper()
	_, dev := cudatest.RequireGPU(t)
	lib, err := nccl.Open()
	if err != nil {
		cudatest.Unavailable(t, err.Error())
		return nil
	}
	fmt.Printf("info: nccl %v from %s (config %v, split %v)\n", lib.Version(), lib.Path(), lib.Supports("config"), lib.Supports("split"))
	t.Cleanup(func() { lib.Close() })
	return dev
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// devBuf is a device buffer with host-side helpers.
type devBuf struct {
	*cuda.DeviceBuffer
}

func alloc(t *testing.T, dev *cuda.Device, n int, fill byte) devBuf {
	t.Helper()
	b, err := dev.Alloc(n)
	must(t, err)
	t.Cleanup(func() { b.Close() })
	must(t, b.Fill(fill))
	return devBuf{b}
}

func (b devBuf) bytes(t *testing.T) []byte {
	t.Helper()
	out := make([]byte, b.Size())
	must(t, b.Read(0, out))
	return out
}

func float32s(n int, seed float32) []byte {
	out := make([]byte, 4*n)
	for i := 0; i < n; i++ {
		binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(seed+float32(i)*0.5))
	}
	return out
}

// checkResult asserts that the first len(want) bytes of b equal want and the rest still
// hold the 0xee sentinel (a wrong count or element size shows up here).
func checkResult(t *testing.T, what string, b devBuf, want []byte) {
	t.Helper()
	got := b.bytes(t)
	if !bytes.Equal(got[:len(want)], want) {
		t.Errorf("%s: result differs", what)
	}
	if !bytes.Equal(got[len(want):], bytes.Repeat([]byte{0xee}, len(got)-len(want))) {
		t.Errorf("%s: wrote past the expected %d bytes", what, len(want))
	}
}

func TestGPUOneRankCollectives(t *testing.T) {
	dev := requireNCCL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, blocking := range []bool{false, true} {
		t.Run(fmt.Sprintf("blocking=%v", blocking), func(t *testing.T) {
			g := local.World(1, local.Options{})[0]
			comm, err := nccl.NewComm(ctx, g, dev, nccl.Options{Timeout: time.Minute, Blocking: blocking})
			must(t, err)
			defer func() { must(t, comm.Close()) }()
			count, cudev, rank, err := comm.Query()
			must(t, err)
			if count != 1 || cudev != dev.Ordinal() || rank != 0 {
				t.Errorf("comm count %d device %d rank %d", count, cudev, rank)
			}
			fmt.Printf("info: nccl comm blocking=%v non-blocking mode=%v\n", blocking, comm.NonBlocking())
			s, err := dev.NewStream()
			must(t, err)
			defer s.Close()
			const n = 1000
			src := float32s(n, 1.25)
			send := alloc(t, dev, 4*n, 0)
			must(t, send.Write(0, src))

			recv := alloc(t, dev, 4*n+64, 0xee)
			must(t, comm.AllReduce(ctx, send.Ptr(), recv.Ptr(), n, nccl.Float32, nccl.Sum, s))
			must(t, comm.Wait(ctx, s))
			checkResult(t, "allreduce float32 sum", recv, src)

			ints := make([]byte, 8*n)
			for i := 0; i < n; i++ {
				binary.LittleEndian.PutUint64(ints[8*i:], uint64(int64(i)*-977))
			}
			inplace := alloc(t, dev, 8*n+64, 0xee)
			must(t, inplace.Write(0, ints))
			must(t, comm.AllReduce(ctx, inplace.Ptr(), inplace.Ptr(), n, nccl.Int64, nccl.Min, s))
			must(t, comm.Wait(ctx, s))
			checkResult(t, "allreduce int64 min in place", inplace, ints)

			bc := alloc(t, dev, 4*n+64, 0xee)
			must(t, comm.Broadcast(ctx, send.Ptr(), bc.Ptr(), n, nccl.Float32, 0, s))
			ag := alloc(t, dev, 4*n+64, 0xee)
			must(t, comm.AllGather(ctx, send.Ptr(), ag.Ptr(), n, nccl.Float32, s))
			rs := alloc(t, dev, 4*n+64, 0xee)
			must(t, comm.ReduceScatter(ctx, send.Ptr(), rs.Ptr(), n, nccl.Float32, nccl.Max, s))
			must(t, comm.Wait(ctx, s))
			checkResult(t, "broadcast", bc, src)
			checkResult(t, "allgather", ag, src)
			checkResult(t, "reducescatter", rs, src)

			// Two reductions fused in one group call.
			g1 := alloc(t, dev, 4*n+64, 0xee)
			g2 := alloc(t, dev, 8*n+64, 0xee)
			must(t, comm.Group(ctx, func() error {
				if err := comm.AllReduce(ctx, send.Ptr(), g1.Ptr(), n, nccl.Float32, nccl.Prod, s); err != nil {
					return err
				}
				return comm.AllReduce(ctx, inplace.Ptr(), g2.Ptr(), n, nccl.Int64, nccl.Sum, s)
			}))
			must(t, comm.Wait(ctx, s))
			checkResult(t, "group allreduce 1", g1, src)
			checkResult(t, "group allreduce 2", g2, ints)

			if err := comm.Broadcast(ctx, send.Ptr(), bc.Ptr(), n, nccl.Float32, 1, s); err == nil {
				t.Errorf("broadcast root 1 of a 1-rank comm must be rejected")
			}
			must(t, comm.AsyncError())

			if comm.Library().Supports("split") {
				sub, err := comm.Split(ctx, 0, 0)
				must(t, err)
				if sub == nil || sub.Size() != 1 || sub.Rank() != 0 {
					t.Fatalf("split: %+v", sub)
				}
				sr := alloc(t, dev, 4*n+64, 0xee)
				must(t, sub.AllReduce(ctx, send.Ptr(), sr.Ptr(), n, nccl.Float32, nccl.Sum, s))
				must(t, sub.Wait(ctx, s))
				checkResult(t, "allreduce on split comm", sr, src)
				must(t, sub.Close())
				none, err := comm.Split(ctx, nccl.NoColor, 0)
				if err != nil || none != nil {
					t.Errorf("split with NoColor = %v, %v; want nil, nil", none, err)
				}
				// Split returns only once the parent is usable again (a non-blocking split
				// leaves the parent in progress until it completes).
				after := alloc(t, dev, 4*n+64, 0xee)
				must(t, comm.AllReduce(ctx, send.Ptr(), after.Ptr(), n, nccl.Float32, nccl.Sum, s))
				must(t, comm.Wait(ctx, s))
				checkResult(t, "allreduce on the parent after split", after, src)
			} else {
				fmt.Printf("info: nccl %v has no ncclCommSplit; split not tested\n", comm.Library().Version())
			}
		})
	}
}

func TestGPUGroupAdapterConformance(t *testing.T) {
	dev := requireNCCL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	base := local.World(1, local.Options{Kind: "attn_cp"})[0]
	g, err := nccl.NewGroup(ctx, base, dev, nccl.Options{Timeout: time.Minute})
	must(t, err)
	if g.Name() != "nccl:attn_cp[0]" || g.Size() != 1 || g.Rank() != 0 {
		t.Errorf("identity: %s size %d rank %d", g.Name(), g.Size(), g.Rank())
	}
	must(t, grouptest.Conformance(ctx, g))
	must(t, grouptest.Soak(ctx, g, 40))
	if err := g.AllReduce(ctx, parallel.ReduceOp(9), []int64{1}); !errors.Is(err, parallel.ErrBadArgument) {
		t.Errorf("bad op: %v", err)
	}
	must(t, g.Close())
	must(t, g.Close())
	if err := g.Barrier(ctx); !errors.Is(err, parallel.ErrClosed) {
		t.Errorf("barrier after close = %v, want parallel.ErrClosed", err)
	}
}

// TestGPUZInitTimeout creates rank 0 of a 2-rank communicator whose rank 1 never comes: the
// initialisation must fail by its deadline (aborting the communicator) instead of hanging.
// It runs last in this file because an NCCL that hangs in abort would stall what follows.
func TestGPUZInitTimeout(t *testing.T) {
	dev := requireNCCL(t)
	lib, err := nccl.Open()
	must(t, err)
	defer lib.Close()
	id, err := lib.NewUniqueID()
	must(t, err)
	const timeout = 5 * time.Second
	done := make(chan error, 1)
	go func() {
		c, err := lib.InitRank(context.Background(), dev, id, 0, 2, nccl.Options{Timeout: timeout})
		if err == nil {
			c.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, parallel.ErrTimeout) {
			t.Errorf("init with a missing peer: %v, want an error wrapping parallel.ErrTimeout", err)
		}
		fmt.Printf("info: nccl init with a missing peer failed as expected: %v\n", err)
	case <-time.After(timeout + 45*time.Second):
		t.Errorf("init with a missing peer did not return within %v (abort hung)", timeout+45*time.Second)
	}
}
