package cudaengine

import (
	"bytes"
	"errors"
	"os"
	"testing"

	"github.com/cpcache/cpcache/cuda/cudatest"
	"github.com/cpcache/cpcache/hicache/core"
	"github.com/cpcache/cpcache/hicache/engine"
	"github.com/cpcache/cpcache/internal/testenv/fakelib"
	"github.com/cpcache/cpcache/slab"
)

var _ engine.StreamWaiter = (*Engine)(nil)

// holdWaiters makes e's lane waiters wait for a value on the returned channel before they
// wait for each event, so a test sees a transfer between its layers.
func holdWaiters(e *Engine) chan<- struct{} {
	gate := make(chan struct{})
	e.beforeEventWait = func() { <-gate }
	return gate
}

// TestGPUWaitLayerOnFlatPool: with a flat L1 pool a load has one layer; WaitLayerOn makes a
// compute stream wait for it without blocking the host, and says what is wrong with a
// negative layer or a ticket of another engine. The engine's waiter is held, so on the fake
// driver (streams run only when waited for) nothing but the compute stream's wait can have
// run the load.
func TestGPUWaitLayerOnFlatPool(t *testing.T) {
	_, dev := cudatest.RequireGPU(t)
	fake := os.Getenv(fakelib.Env) != ""
	const pb, pages = 4 << 10, 4
	pool, err := newTestPool(dev, pages, pb, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	want := make([]byte, pages*pb)
	for i := range want {
		want[i] = byte(i*13 + 5)
	}
	copy(pool.l2.Bytes(), want)
	compute, err := dev.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer compute.Close()
	scratch, err := dev.Alloc(pb)
	if err != nil {
		t.Fatal(err)
	}
	defer scratch.Close()
	gate := holdWaiters(pool.e)
	tr := core.Transfer{Kind: core.Load, Node: 3}
	for s := range pages {
		tr.Copies = append(tr.Copies, core.Copy{L1: int32(s), L2: slab.Page{Index: pages - 1 - s}})
	}
	tk := pool.e.Submit(tr)
	if tk.Layers() != 1 {
		t.Fatalf("a flat pool's load reports %d layers, want 1", tk.Layers())
	}
	if err := pool.e.WaitLayerOn(tk, 0, compute.Handle()); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, pb)
	if fake {
		if err := pool.l1.Read(0, got); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, make([]byte, pb)) {
			t.Error("WaitLayerOn ran the load on the calling thread")
		}
	}
	if err := compute.CopyDtoD(scratch.Ptr(), pool.l1.Ptr(), pb); err != nil {
		t.Fatal(err)
	}
	if err := compute.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if err := scratch.Read(0, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want[(pages-1)*pb:]) {
		t.Error("the compute stream ran before the load it waited for")
	}
	if tk.Finished() {
		t.Error("the ticket finished while the engine's waiter was held")
	}
	close(gate)
	if err := tk.Err(); err != nil {
		t.Fatal(err)
	}
	if err := pool.e.WaitLayerOn(tk, 0, compute.Handle()); err != nil {
		t.Errorf("WaitLayerOn on a finished load: %v, want nil (nothing to wait for)", err)
	}
	if err := pool.e.WaitLayerOn(tk, -1, compute.Handle()); !errors.Is(err, core.ErrBadArgument) {
		t.Errorf("WaitLayerOn for layer -1: %v, want ErrBadArgument", err)
	}
	if err := pool.e.WaitLayerOn(engine.NewTicket(tr), 0, compute.Handle()); !errors.Is(err, core.ErrBadArgument) {
		t.Errorf("WaitLayerOn for another engine's ticket: %v, want ErrBadArgument", err)
	}
	failed := pool.e.Submit(core.Transfer{Kind: core.Load, Node: 4, Copies: []core.Copy{{L1: pages, L2: slab.Page{}}}})
	if err := pool.e.WaitLayerOn(failed, 0, compute.Handle()); !errors.Is(err, core.ErrBadArgument) || err.Error() != failed.Err().Error() {
		t.Errorf("WaitLayerOn for a failed load: %v, want its error %v", err, failed.Err())
	}
}
