package cudaengine

import (
	"bytes"
	"os"
	"testing"

	"github.com/cpcache/cpcache/cuda/cudatest"
	"github.com/cpcache/cpcache/hicache/core"
	"github.com/cpcache/cpcache/slab"
)

// envFakeCopyFailAt makes the fake driver's Nth async copy fail (csrc/cuda_fake.c), the
// copies enqueued before it staying queued as a real driver's would be in flight.
const envFakeCopyFailAt = "CPCACHE_FAKE_CUDA_COPY_FAIL_AT"

// TestGPUFailedEnqueueWaitsForQueuedCopies: when a transfer's copy call fails after some of
// its copies were enqueued, its ticket finishes only once those copies are done, since the
// core frees or reuses its pages when the ticket says it failed.
func TestGPUFailedEnqueueWaitsForQueuedCopies(t *testing.T) {
	if os.Getenv(envFakeCopyFailAt) == "" {
		t.Skipf("needs the fake driver's failure injection (%s): a real driver's copies do not fail on demand", envFakeCopyFailAt)
	}
	_, dev := cudatest.RequireGPU(t)
	const pb, pages = 4 << 10, 4
	pool, err := newTestPool(dev, pages, pb, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	l1, l2, e := pool.l1, pool.l2, pool.e
	want := make([]byte, pages*pb)
	for i := range want {
		want[i] = byte(i*3 + 1)
	}
	if err := l1.Write(0, want); err != nil {
		t.Fatal(err)
	}
	tr := core.Transfer{Kind: core.Write, Node: 1}
	for s := range pages {
		tr.Copies = append(tr.Copies, core.Copy{L1: int32(s), L2: slab.Page{Index: s}})
	}
	tk := e.Submit(tr)
	if tk.Err() == nil {
		t.Fatalf("the injected copy failure (%s=%s) did not fail the transfer", envFakeCopyFailAt, os.Getenv(envFakeCopyFailAt))
	}
	t.Logf("transfer failed as injected: %v", tk.Err())
	// The ticket is done: the copies enqueued before the failing one must have landed (the
	// host reads the pinned L2 buffer directly, without asking the driver to wait).
	got := l2.Bytes()
	landed := 0
	for s := range pages {
		if bytes.Equal(got[s*pb:(s+1)*pb], want[s*pb:(s+1)*pb]) {
			landed++
		}
	}
	if landed == 0 {
		t.Errorf("the transfer's ticket finished while its enqueued copies were still queued")
	}
	if landed == pages {
		t.Errorf("every page landed although a copy failed")
	}
}
