package hicache

import (
	"strings"
	"testing"

	"github.com/cpcache/cpcache/internal/testenv/fakelib"
)

// TestFakeDriverRunsGPUTests runs this binary's TestGPU* tests in a child process against the
// host-memory fake of libcuda (csrc/cuda_fake.c), so the CUDA engine's path (streams, batched
// copies, events, completion waiters) runs on every CI machine. The copy-efficiency
// measurement is left to real GPUs: on the fake it only times memmove.
func TestFakeDriverRunsGPUTests(t *testing.T) {
	fakelib.SkipInChild(t)
	lib := fakelib.Build(t, "cuda_fake")
	out := fakelib.RunGPUTests(t, "Efficiency", "CPCACHE_CUDA_LIBRARY="+lib)
	if !strings.Contains(out, "--- PASS: TestGPUCUDAEngineReplicas") {
		t.Errorf("TestGPUCUDAEngineReplicas did not pass on the fake driver:\n%s", out)
	}
}
