package nccl_test

import (
	"strings"
	"testing"

	"github.com/cpcache/cpcache/internal/testenv/fakelib"
)

// TestFakeLibrariesRunGPUTests runs this binary's TestGPU* tests in a child process against
// host-memory fakes of libcuda and libnccl (csrc/cuda_fake.c, csrc/nccl_fake.c) with
// CPCACHE_REQUIRE_GPU=1: bootstrap over a parallel.Group, non-blocking initialisation and
// collectives (ncclInProgress polling), group calls, split, finalize, the parallel.Group adapter's
// conformance, and the deadline-and-abort path all run on every CI machine. The fake checks
// that a CUDA context is current for every call on a communicator (ncclCommGetAsyncError,
// the queries, abort).
func TestFakeLibrariesRunGPUTests(t *testing.T) {
	fakelib.SkipInChild(t)
	cudaLib, ncclLib := fakelib.Build(t, "cuda_fake"), fakelib.Build(t, "nccl_fake")
	// The NCCL fake runs a collective at the call, not in its stream's order: the CUDA fake's
	// copies before it must have run, so its streams are eager here.
	out := fakelib.RunGPUTests(t, "", "CPCACHE_CUDA_LIBRARY="+cudaLib, "CPCACHE_NCCL_LIBRARY="+ncclLib, "CPCACHE_FAKE_CUDA_DEFER=0")
	for _, want := range []string{"--- PASS: TestGPUOneRankCollectives/blocking=false", "--- PASS: TestGPUOneRankCollectives/blocking=true",
		"--- PASS: TestGPUGroupAdapterConformance", "--- PASS: TestGPUZInitTimeout", "non-blocking mode=true",
		// The fake is NCCL 2.18: the two-process test on one GPU skips, saying why.
		"--- SKIP: TestGPUTwoProcessReductions", "need NCCL >= 2.30 with NCCL_MULTI_RANK_GPU_ENABLE=1"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}
