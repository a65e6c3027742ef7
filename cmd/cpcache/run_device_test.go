package main

import (
	"bytes"
	"errors"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cpcache/cpcache/cmd/cpcache/internal/runner"
	"github.com/cpcache/cpcache/internal/testenv/fakelib"
)

// fakeCUDA builds the host-memory fake of libcuda (csrc/cuda_fake.c: memfd-backed device
// memory whose IPC handles other processes open) and returns the variable that loads it.
func fakeCUDA(t *testing.T) string {
	t.Helper()
	return "CPCACHE_CUDA_LIBRARY=" + fakelib.Build(t, "cuda_fake")
}

// TestRunDeviceCUDAOnFakeDriver runs `cpcache run --device cuda` as 8 rank processes
// sharing one (fake) device: L1 pools in device memory, L2 slabs in device memory opened by
// every peer over IPC, copies through the CUDA engine, every loaded page copied back and
// checked. The same with pinned host L2 on 4 ranks.
func TestRunDeviceCUDAOnFakeDriver(t *testing.T) {
	lib := fakeCUDA(t)
	for _, c := range []struct {
		l2     string
		world  int
		memory string
	}{
		{"device", 8, "CUDA IPC"},
		{"host", 4, "pinned host"},
	} {
		t.Run("l2="+c.l2, func(t *testing.T) {
			status, rep, out, errOut := runBinary(t, []string{lib},
				append(append([]string{"--device", "cuda", "--l2", c.l2, "--world", strconv.Itoa(c.world), "--dp", "1", "--attn-cp", strconv.Itoa(c.world)}, smallSynthetic...), l1For(c.world)...)...)
			requireHealthy(t, status, rep, out, errOut)
			assert.Positive(t, rep.TokensHitL2, "histories evicted from L1 must come back from L2")
			assert.Positive(t, rep.PagesVerified)
			require.NotNil(t, rep.Device, "a CUDA run reports its device")
			assert.Equal(t, []string{"0 cpcache fake GPU"}, rep.Device.Devices)
			assert.Equal(t, c.world, rep.Device.RanksPerDevice, "every rank shares the one device")
			assert.Contains(t, rep.Device.L2Memory, c.memory)
			assert.True(t, rep.Device.Batched, "the fake driver has cuMemcpyBatchAsync")
			assert.Positive(t, rep.Device.BackupGBps)
			assert.Positive(t, rep.Device.LoadGBps)
			assert.Positive(t, rep.Device.LargeLoadGBps)
			assert.Empty(t, rep.Device.BaselineError)
			assert.Contains(t, out, "page copies          backup")
			assert.Contains(t, out, "L1 memory            device memory")
		})
	}
}

// TestRunDeviceCUDAModelOnFakeDriver: --device cuda --model: job.Open allocates per-layer
// token-slot L1 buffers on the device, the CUDA engine copies chunk by chunk between them and
// the L2 slabs in either layout, the scheduler waits for load-backs layer by layer and checks
// each layer's chunks copied back from the device; 0 bad pages, one collective per step.
func TestRunDeviceCUDAModelOnFakeDriver(t *testing.T) {
	lib := fakeCUDA(t)
	for _, c := range []struct{ l2, layout string }{{"device", "page_first"}, {"host", "layer_first"}} {
		t.Run(c.l2+"/"+c.layout, func(t *testing.T) {
			status, rep, out, errOut := runBinary(t, []string{lib}, "--device", "cuda", "--l2", c.l2, "--world", "2", "--dp", "1", "--attn-cp", "2",
				"--clients", "3", "--rounds", "2", "--model", "deepseek-v3", "--l2-layout", c.layout, "--l1-pages", "96", "--l2-pages", "160")
			requireHealthy(t, status, rep, out, errOut)
			require.NotNil(t, rep.KVLayout)
			assert.Equal(t, "device, per layer and part a token-slot buffer", rep.KVLayout.L1)
			assert.Equal(t, c.layout, rep.KVLayout.L2Layout)
			assert.Positive(t, rep.PagesLoadedL2, "pages came back from L2")
			assert.Positive(t, rep.KVLayout.LayerWaits)
			assert.Zero(t, rep.KVLayout.LayerWaits%61, "every load-back waits for each of the 61 layers")
			assert.Contains(t, out, "  kv memory            L1 device, per layer and part a token-slot buffer; L2 "+c.layout+"; 61 layers × 1 parts = 61 chunks of a page\n")
		})
	}
}

// TestRunDeviceCUDADetectsACorruptDevicePage flips a byte of a device slab page (through
// the driver) before it is loaded back: the copy-back check must catch it.
func TestRunDeviceCUDADetectsACorruptDevicePage(t *testing.T) {
	status, rep, _, errOut := runBinary(t, []string{fakeCUDA(t), runner.EnvCorruptRank + "=2"},
		append([]string{"--device", "cuda", "--world", "4", "--dp", "1", "--attn-cp", "4"}, smallSynthetic...)...)
	assert.Equal(t, 1, status, errOut)
	require.NotNil(t, rep, errOut)
	assert.Positive(t, rep.BadPages)
	assert.Regexp(t, `rank 2: request \d+: page \d+ loaded from L2 is wrong`, errOut)
}

// TestRunDeviceCUDAWithoutDriverFailsEveryRank: a rank that cannot load the driver makes
// every rank fail at once with its reason.
func TestRunDeviceCUDAWithoutDriverFailsEveryRank(t *testing.T) {
	// Ranks of another launcher (cpcache launch): no process checks before they start.
	bin := cpcacheBinary(t)
	cmd := exec.Command(bin, "launch", "-n", "2", "--", bin, "run",
		"--device", "cuda", "--world", "2", "--dp", "1", "--attn-cp", "2", "--clients", "2", "--rounds", "2")
	cmd.Env = append(withoutLauncherEnv(nil), "CPCACHE_CUDA_LIBRARY=/nonexistent/libcuda.so.1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	status := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		status = ee.ExitCode()
	}
	errOut := stderr.String()
	assert.Equal(t, 1, status, errOut)
	assert.Contains(t, errOut, "failed on 2 of 2 ranks")
	assert.Contains(t, errOut, "/nonexistent/libcuda.so.1")
}

// TestRunDeviceBadFlagsExitTwo: memory flags that do not fit together are bad input, named
// in one line, before any rank starts.
func TestRunDeviceBadFlagsExitTwo(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--device", "gpu"}, `device "gpu" (want host or cuda)`},
		{[]string{"--l2", "device"}, "--l2 device needs --device cuda"},
		{[]string{"--cuda-device", "1"}, "--cuda-device 1 needs --device cuda"},
		{[]string{"--device", "cuda", "--l2", "nvme"}, `--l2 "nvme"`},
		{[]string{"--device", "cuda", "--cuda-device", "-2"}, "--cuda-device -2"},
		{[]string{"--device", "cuda", "--storage", "file://" + t.TempDir()}, "needs L2 pages in host memory: use --l2 host"},
	} {
		status, out, errOut := runCmd(append([]string{"run"}, c.args...)...)
		assert.Equal(t, 2, status, "%v: %s", c.args, errOut)
		assert.Empty(t, out, c.args)
		assert.Contains(t, errOut, c.want, c.args)
		assert.NotContains(t, errOut, "starting", "%v: no rank may start", c.args)
		assert.Len(t, strings.Split(strings.TrimSpace(errOut), "\n"), 1, "%v: one line: %q", c.args, errOut)
	}
}

// TestRunCUDAWithoutDriverFailsBeforeRanks: `run --device cuda` on a machine without the
// driver fails in the starting process, before any rank, with one short line naming the
// library and the variable that overrides it.
func TestRunCUDAWithoutDriverFailsBeforeRanks(t *testing.T) {
	bin := cpcacheBinary(t)
	cmd := exec.Command(bin, "run", "--device", "cuda", "--world", "2", "--dp", "1", "--attn-cp", "2")
	cmd.Env = append(withoutLauncherEnv(nil), "CPCACHE_CUDA_LIBRARY=/nonexistent/libcuda.so.1")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 {
		t.Fatalf("run --device cuda without a driver: %v, stderr %q; want exit 2", err, stderr.String())
	}
	msg := strings.TrimSpace(stderr.String())
	if strings.Contains(msg, "\n") || len(msg) > 200 || !strings.Contains(msg, "no CUDA driver: libcuda.so.1 not found (set CPCACHE_CUDA_LIBRARY") {
		t.Errorf("stderr %q (%d bytes): want one line under 200 bytes naming libcuda.so.1 and CPCACHE_CUDA_LIBRARY", msg, len(msg))
	}
	if strings.Contains(stdout.String()+msg, "[0]") || strings.Contains(msg, "rank") {
		t.Errorf("a rank started: stdout %q, stderr %q", stdout.String(), msg)
	}
}
