package nccl_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

const fakeEnv = "CPCACHE_TEST_FAKE_GPU"

func buildFake(t *testing.T, name string) string {
	t.Helper()
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skipf("gcc not found (needed to build the fake libraries): %v", err)
	}
	src := filepath.Join("..", "csrc", name+".c")
	if _, err := os.Stat(src); err != nil {
		t.Skipf("fake library source not here (bundle run?): %v", err)
	}
	lib := filepath.Join(t.TempDir(), "lib"+name+".so")
	if out, err := exec.Command(gcc, "-shared", "-fPIC", "-O1", "-o", lib, src).CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v\n%s", src, err, out)
	}
	return lib
}

// TestFakeLibrariesRunGPUTests runs this binary's TestGPU* tests in a child process against
// host-memory fakes of libcuda and libnccl (csrc/cuda_fake.c, csrc/nccl_fake.c) with
// CPCACHE_REQUIRE_GPU=1: bootstrap over a dist.Group, non-blocking initialisation and
// collectives (ncclInProgress polling), group calls, split, finalize, the dist.Group adapter's
// conformance, and the deadline-and-abort path all run on every CI machine.
func TestFakeLibrariesRunGPUTests(t *testing.T) {
	if os.Getenv(fakeEnv) != "" {
		t.Skip("already running against the fakes")
	}
	if os.Getenv("CPCACHE_REQUIRE_GPU") == "1" {
		t.Skip("a real GPU run: the fake-library run is for machines without one")
	}
	cudaLib, ncclLib := buildFake(t, "cuda_fake"), buildFake(t, "nccl_fake")
	cmd := exec.Command(os.Args[0], "-test.v", "-test.count=1", "-test.run", "^TestGPU")
	cmd.Env = append(os.Environ(), fakeEnv+"=1", "CPCACHE_REQUIRE_GPU=1",
		"CPCACHE_CUDA_LIBRARY="+cudaLib, "CPCACHE_NCCL_LIBRARY="+ncclLib)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("GPU tests on the fake libraries failed: %v\n%s", err, out)
	}
	for _, want := range []string{"--- PASS: TestGPUOneRankCollectives/blocking=false", "--- PASS: TestGPUOneRankCollectives/blocking=true",
		"--- PASS: TestGPUGroupAdapterConformance", "--- PASS: TestGPUZInitTimeout", "non-blocking mode=true"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}
