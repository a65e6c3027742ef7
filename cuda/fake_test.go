package cuda_test

import (
	"strings"
	"testing"

	"github.com/cpcache/cpcache/internal/testenv/fakelib"
)

// TestFakeDriverRunsGPUTests runs this binary's TestGPU* tests in a child process against a
// host-memory fake of libcuda (csrc/cuda_fake.c) with CPCACHE_REQUIRE_GPU=1, so the GPU code
// paths (context handling, copies in every direction, pinned and registered memory, batched
// copies, events, IPC between processes over memfd) run on every CI machine. NVML topology
// and bandwidth need a real GPU.
func TestFakeDriverRunsGPUTests(t *testing.T) {
	fakelib.SkipInChild(t)
	lib := fakelib.Build(t, "cuda_fake")
	out := fakelib.RunGPUTests(t, "Topology|Bandwidth|FakeDriver", "CPCACHE_CUDA_LIBRARY="+lib)
	for _, name := range []string{"TestGPUDeviceInfo", "TestGPUAllocCopyRoundTrip", "TestGPUPinnedHostMemory",
		"TestGPURegisteredHostMemory", "TestGPUBatchCopy", "TestGPUEvents", "TestGPUEventOutlivesItsStream", "TestGPUEventStreamWait", "TestGPUFakeBatchRejectsOverlap", "TestGPUIPCAcrossProcesses"} {
		if !strings.Contains(out, "--- PASS: "+name) {
			t.Errorf("%s did not pass on the fake driver:\n%s", name, out)
		}
	}
	if !strings.Contains(out, "info: ipc: same-process open refused as expected") {
		t.Errorf("the fake driver opened an IPC handle in the exporting process:\n%s", out)
	}
	if !strings.Contains(out, "--- SKIP: TestGPUBatchCopyFallsBackToPerCopy") {
		t.Errorf("the batch fallback test ran without its failure injection:\n%s", out)
	}
	if !strings.Contains(out, `entry point "cuMemcpyBatchAsync", used driver batch call: true`) {
		t.Errorf("the fake driver's cuMemcpyBatchAsync was not used:\n%s", out)
	}
}

// TestFakeDriverBatchFailureFallsBack runs the batch-fallback test against the fake driver
// with its batch call failing.
func TestFakeDriverBatchFailureFallsBack(t *testing.T) {
	fakelib.SkipInChild(t)
	lib := fakelib.Build(t, "cuda_fake")
	out := fakelib.RunTests(t, "^TestGPUBatchCopyFallsBackToPerCopy$", "", "CPCACHE_CUDA_LIBRARY="+lib, envFakeBatchFail+"=1")
	if !strings.Contains(out, "--- PASS: TestGPUBatchCopyFallsBackToPerCopy") {
		t.Errorf("the per-copy fallback did not pass on the fake driver:\n%s", out)
	}
}
