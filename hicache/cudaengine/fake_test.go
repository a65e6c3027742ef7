package cudaengine

import (
	"strings"
	"testing"

	"github.com/cpcache/cpcache/internal/testenv/fakelib"
)

// TestFakeDriverRunsGPUTests runs this package's TestGPU* tests against the host-memory fake
// of libcuda (csrc/cuda_fake.c): the page-copy measurement then moves 1 MiB each way through
// every engine variant (blocking or spinning waits, 1 or 4 streams per direction, transfers
// one by one or as a step) and checks every byte; its timings are memmove's and mean
// nothing. The step batching, the layer-wise wait and the KV L1 (chunk placement for every L1
// kind and L2 layout, layered loads) tests run there too.
func TestFakeDriverRunsGPUTests(t *testing.T) {
	fakelib.SkipInChild(t)
	lib := fakelib.Build(t, "cuda_fake")
	out := fakelib.RunGPUTests(t, "", "CPCACHE_CUDA_LIBRARY="+lib)
	if !strings.Contains(out, "--- PASS: TestGPUPageCopyEfficiency") {
		t.Errorf("TestGPUPageCopyEfficiency did not pass on the fake driver:\n%s", out)
	}
	if !strings.Contains(out, "streams 4 batched true") || !strings.Contains(out, "(step true ") {
		t.Errorf("the 4-stream engine or the per-step submission did not run:\n%s", out)
	}
	for _, name := range []string{"TestGPUStepBatching", "TestGPUWaitLayerOnFlatPool", "TestGPUKVChunkPlacement", "TestGPUKVLayeredLoad", "TestGPUKVRejectsBadInput", "TestGPUKVCopyEfficiency"} {
		if !strings.Contains(out, "--- PASS: "+name) {
			t.Errorf("%s did not pass on the fake driver:\n%s", name, out)
		}
	}
}

// TestFakeDriverCopyFailureWaitsForQueuedCopies runs the partial-enqueue test against the
// fake driver with its batch call failing (so the copies go one by one) and the third copy
// failing; the fake's streams run copies only when waited for.
func TestFakeDriverCopyFailureWaitsForQueuedCopies(t *testing.T) {
	fakelib.SkipInChild(t)
	lib := fakelib.Build(t, "cuda_fake")
	out := fakelib.RunTests(t, "^TestGPUFailedEnqueueWaitsForQueuedCopies$", "", "CPCACHE_CUDA_LIBRARY="+lib,
		"CPCACHE_FAKE_CUDA_BATCH_FAIL=1", envFakeCopyFailAt+"=3")
	if !strings.Contains(out, "--- PASS: TestGPUFailedEnqueueWaitsForQueuedCopies") {
		t.Errorf("the partial-enqueue test did not pass on the fake driver:\n%s", out)
	}
}

// TestFakeDriverKVLayerFailure runs the layered-load failure test against the fake driver with
// its batch call failing (copies one by one) and the 11th copy failing (layer 1's second).
func TestFakeDriverKVLayerFailure(t *testing.T) {
	fakelib.SkipInChild(t)
	lib := fakelib.Build(t, "cuda_fake")
	out := fakelib.RunTests(t, "^TestGPUKVFailedLayerFailsTheLoad$", "", "CPCACHE_CUDA_LIBRARY="+lib,
		"CPCACHE_FAKE_CUDA_BATCH_FAIL=1", envFakeCopyFailAt+"=11")
	if !strings.Contains(out, "--- PASS: TestGPUKVFailedLayerFailsTheLoad") {
		t.Errorf("the layered-load failure test did not pass on the fake driver:\n%s", out)
	}
}
