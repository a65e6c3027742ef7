package cuda_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// fakeEnv marks a child process that runs the GPU tests against csrc/cuda_fake.c.
const fakeEnv = "CPCACHE_TEST_FAKE_GPU"

// BuildFake compiles csrc/<name>.c into a shared library in a temporary directory.
func buildFake(t *testing.T, name string) string {
	t.Helper()
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skipf("gcc not found (needed to build the fake driver): %v", err)
	}
	src := filepath.Join("..", "csrc", name+".c")
	if _, err := os.Stat(src); err != nil {
		t.Skipf("fake driver source not here (bundle run?): %v", err)
	}
	lib := filepath.Join(t.TempDir(), "lib"+name+".so")
	if out, err := exec.Command(gcc, "-shared", "-fPIC", "-O1", "-o", lib, src).CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v\n%s", src, err, out)
	}
	return lib
}

// TestFakeDriverRunsGPUTests runs this binary's TestGPU* tests in a child process against a
// host-memory fake of libcuda (csrc/cuda_fake.c) with CPCACHE_REQUIRE_GPU=1, so the GPU code
// paths (context handling, copies in every direction, pinned and registered memory, batched
// copies, events) run on every CI machine. IPC, NVML topology and bandwidth need a real GPU.
func TestFakeDriverRunsGPUTests(t *testing.T) {
	if os.Getenv(fakeEnv) != "" {
		t.Skip("already running against the fake driver")
	}
	if os.Getenv("CPCACHE_REQUIRE_GPU") == "1" {
		t.Skip("a real GPU run: the fake-driver run is for machines without one")
	}
	lib := buildFake(t, "cuda_fake")
	cmd := exec.Command(os.Args[0], "-test.v", "-test.count=1", "-test.run", "^TestGPU",
		"-test.skip", "IPC|Topology|Bandwidth|FakeDriver")
	cmd.Env = append(os.Environ(), fakeEnv+"=1", "CPCACHE_REQUIRE_GPU=1", "CPCACHE_CUDA_LIBRARY="+lib)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("GPU tests on the fake driver failed: %v\n%s", err, out)
	}
	for _, name := range []string{"TestGPUDeviceInfo", "TestGPUAllocCopyRoundTrip", "TestGPUPinnedHostMemory",
		"TestGPURegisteredHostMemory", "TestGPUBatchCopy", "TestGPUEvents"} {
		if !strings.Contains(string(out), "--- PASS: "+name) {
			t.Errorf("%s did not pass on the fake driver:\n%s", name, out)
		}
	}
	if !strings.Contains(string(out), `entry point "cuMemcpyBatchAsync", used driver batch call: true`) {
		t.Errorf("the fake driver's cuMemcpyBatchAsync was not used:\n%s", out)
	}
}
