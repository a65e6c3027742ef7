package cudatest

import (
	"fmt"
	"strings"
	"testing"

	"github.com/cpcache/cpcache/cuda"
)

// recorder captures Skipf/Fatalf instead of stopping the test.
type recorder struct {
	testing.TB
	skipped, failed string
}

func (r *recorder) Helper()                   {}
func (r *recorder) Skipf(f string, a ...any)  { r.skipped = sprintf(f, a...) }
func (r *recorder) Fatalf(f string, a ...any) { r.failed = sprintf(f, a...) }
func (r *recorder) Cleanup(func())            {}
func sprintf(f string, a ...any) string       { return strings.TrimSpace(fmt.Sprintf(f, a...)) }

func TestRequireGPUSkipsOrFails(t *testing.T) {
	if drv, err := cuda.Open(); err == nil {
		drv.Close()
		t.Skip("a CUDA driver is present here; this test checks the no-GPU behaviour")
	}
	t.Setenv(RequireEnv, "")
	r := &recorder{TB: t}
	if drv, dev := RequireGPU(r); drv != nil || dev != nil {
		t.Fatalf("RequireGPU returned a device without a driver")
	}
	if r.failed != "" || !strings.Contains(r.skipped, "no GPU: cuda: cannot load libcuda.so.1") {
		t.Errorf("without %s: skipped=%q failed=%q", RequireEnv, r.skipped, r.failed)
	}
	t.Setenv(RequireEnv, "1")
	r = &recorder{TB: t}
	RequireGPU(r)
	if r.skipped != "" || !strings.Contains(r.failed, "CPCACHE_REQUIRE_GPU=1 but no GPU is usable") {
		t.Errorf("with %s=1: skipped=%q failed=%q", RequireEnv, r.skipped, r.failed)
	}
}
