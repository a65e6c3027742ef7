package main

import (
	"bytes"
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
	var out, errb bytes.Buffer
	if status := run([]string{"gpu-info"}, &out, &errb); status != 0 {
		t.Fatalf("gpu-info exit %d without a GPU, want 0; stderr %s", status, errb.String())
	}
	for _, want := range []string{
		"cuda: not available: cuda: cannot load libcuda.so.1",
		"nccl: not available: nccl: cannot load libnccl.so.2",
		"/nonexistent/libnccl.so.2: ",
		"topology: not available:",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

func TestGPUInfoBadArgument(t *testing.T) {
	var out, errb bytes.Buffer
	if status := run([]string{"gpu-info", "extra"}, &out, &errb); status != 2 || !strings.Contains(errb.String(), `unexpected argument "extra"`) {
		t.Errorf("status %d, stderr %q", status, errb.String())
	}
}
