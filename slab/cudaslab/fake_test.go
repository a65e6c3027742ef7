package cudaslab

import (
	"strings"
	"testing"

	"github.com/cpcache/cpcache/internal/testenv/fakelib"
)

// TestFakeDriverRunsCUDASlabTests runs this package's CUDA tests in a child process against
// the host-memory fake of libcuda (csrc/cuda_fake.c) with CPCACHE_REQUIRE_GPU=1: pinned host
// slabs registered with the driver and read through their device pointers, and device slabs
// shared between two processes over the fake's memfd-backed IPC handles, bytes checked.
func TestFakeDriverRunsCUDASlabTests(t *testing.T) {
	fakelib.SkipInChild(t)
	if testing.Short() {
		t.Skip("runs a multi-process test; skipped in -short mode")
	}
	lib := fakelib.Build(t, "cuda_fake")
	out := fakelib.RunTests(t, "^Test(CUDA|MultiprocCUDA)", "", "CPCACHE_CUDA_LIBRARY="+lib)
	for _, name := range []string{"TestCUDAPinnedHostSlabsAreDeviceVisible", "TestMultiprocCUDAIPCSlabs"} {
		if !strings.Contains(out, "--- PASS: "+name) {
			t.Errorf("%s did not pass on the fake driver:\n%s", name, out)
		}
	}
}
