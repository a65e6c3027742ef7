package main

import (
	"strings"
	"testing"

	"github.com/cpcache/cpcache/cuda"
)

func TestGPUInfoWithoutGPU(t *testing.T) {
	if drv, err := cuda.Open(); err == nil {
		drv.Close()
		t.Skip("a CUDA driver is present; this test checks the no-GPU report")
	}
	t.Setenv("CPCACHE_NCCL_LIBRARY", "/nonexistent/libnccl.so.2")
	status, out, errOut := runCmd("gpu-info")
	if status != 0 {
		t.Fatalf("gpu-info exit %d without a GPU, want 0; stderr %s", status, errOut)
	}
	for _, want := range []string{
		"cuda: not available: cuda: cannot load libcuda.so.1",
		"nccl: not available: nccl: cannot load libnccl.so.2",
		"/nonexistent/libnccl.so.2: ",
		"topology: not available:",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

func TestGPUInfoBadArgument(t *testing.T) {
	if status, _, errOut := runCmd("gpu-info", "extra"); status != 2 || !strings.Contains(errOut, `unexpected argument "extra"`) {
		t.Errorf("status %d, stderr %q", status, errOut)
	}
}
