package cuda_test

import (
	"bytes"
	"os"
	"strings"
	"testing"

	"github.com/cpcache/cpcache/cuda"
	"github.com/cpcache/cpcache/cuda/cudatest"
)

// envFakeBatchFail makes the fake driver's cuMemcpyBatchAsync fail (csrc/cuda_fake.c).
const envFakeBatchFail = "CPCACHE_FAKE_CUDA_BATCH_FAIL"

// TestGPUBatchCopyFallsBackToPerCopy: when the driver's batch call fails at run time, the
// copies still land (enqueued one by one), CopyBatch reports it did not batch, and the
// stream stays per-copy with the reason in BatchError.
func TestGPUBatchCopyFallsBackToPerCopy(t *testing.T) {
	if os.Getenv(envFakeBatchFail) != "1" {
		t.Skipf("needs the fake driver's failure injection (%s=1): a real driver's batch call does not fail on demand", envFakeBatchFail)
	}
	_, dev := cudatest.RequireGPU(t)
	const page, pages = 4096, 8
	host, err := dev.AllocHost(page * pages)
	must(t, err)
	defer closeT(t, host)
	d, err := dev.Alloc(page * pages)
	must(t, err)
	defer closeT(t, d)
	s, err := dev.NewStream()
	must(t, err)
	defer closeT(t, s)
	copy(host.Bytes(), pattern(page*pages, 9))
	var up []cuda.Copy1
	for i := range pages {
		up = append(up, cuda.Copy1{Dst: d.Ptr().Add(i * page), Src: host.DevicePtr().Add(i * page), Size: page})
	}
	for round := range 2 {
		must(t, s.Memset(d.Ptr(), 0, d.Size()))
		batched, err := s.CopyBatch(up)
		must(t, err)
		must(t, s.Synchronize())
		if batched {
			t.Errorf("round %d: CopyBatch reports the failed batch call as used", round)
		}
		got := make([]byte, page*pages)
		must(t, d.Read(0, got))
		if !bytes.Equal(got, host.Bytes()) {
			t.Errorf("round %d: the per-copy fallback did not copy the pages", round)
		}
	}
	if err := s.BatchError(); err == nil || !strings.Contains(err.Error(), "CUDA_ERROR_NOT_SUPPORTED") {
		t.Errorf("BatchError = %v, want the batch call's CUDA_ERROR_NOT_SUPPORTED", err)
	}
}
