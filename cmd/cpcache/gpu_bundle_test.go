package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cpcache/cpcache/internal/testenv/fakelib"
)

// The GPU bundle's run.sh (cuda/testdata/gpu-run.sh) is tested here, where the cpcache
// binary is built: a bundle of the real binary, the fake libcuda and libnccl, and stub test
// binaries (shell scripts printing `go test -v` lines), so the script's budget, accounting
// and summary are checked on every CI machine without building the GPU test binaries.

// summaryRE is the line run.sh must always end with.
var summaryRE = regexp.MustCompile(`(?m)^== gpu checks: (ok|FAILED): (\d+) passed, (\d+) failed, (\d+) skipped in \d+s of a (\d+)s deadline(.*) \(logs in .*\)$`)

// stubTest writes a test-binary stand-in that prints its arguments as an info line, passes
// one test, skips one with a reason, then sleeps sleepSeconds.
func stubTest(t *testing.T, dir, name string, sleepSeconds int) {
	t.Helper()
	script := "#!/bin/sh\n" +
		`echo "info: ` + name + ` args: $* require=$CPCACHE_REQUIRE_GPU"` + "\n" +
		"echo '=== RUN   TestGPUOne'\necho '--- PASS: TestGPUOne (0.00s)'\n" +
		"echo '=== RUN   TestGPUTwo'\necho '    x_test.go:1: NVML unavailable'\necho '--- SKIP: TestGPUTwo (0.00s)'\n"
	if sleepSeconds > 0 {
		script += "exec sleep " + strconv.Itoa(sleepSeconds) + "\n"
	}
	script += "echo PASS\n"
	require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(script), 0o755))
}

// stubEngine writes a stand-in for the C example (build/engine): each rank prints its
// report line, with the slab kind --cuda-ipc asks for; it fails unless given --device 0.
func stubEngine(t *testing.T, dir string) {
	t.Helper()
	script := "#!/bin/sh\n" +
		`case " $* " in *" --device 0 "*) ;; *) echo "engine: no --device 0 in $*" >&2; exit 2 ;; esac` + "\n" +
		`slabs=pinned-host; case " $* " in *" --cuda-ipc "*) slabs=cuda-ipc ;; esac` + "\n" +
		`echo "rank $RANK/$WORLD_SIZE (cp $RANK/4, dp 0, consensus shm): requests=64 tokens_hit_l2=6016 pages_verified=96 bad_pages=0 l1=device0 slabs=$slabs layer_waits=92 layer_waits_on=92"` + "\n"
	require.NoError(t, os.WriteFile(filepath.Join(dir, "engine"), []byte(script), 0o755))
}

// gpuBundle lays out a bundle in a temporary directory: run.sh, the cpcache binary and the
// stub test binaries named in stubs (name → seconds to sleep); it returns the directory and
// the environment that loads the fake libraries, with a stand-in for the C example.
func gpuBundle(t *testing.T, stubs map[string]int) (string, []string) {
	t.Helper()
	dir := t.TempDir()
	script, err := os.ReadFile(filepath.Join("..", "..", "cuda", "testdata", "gpu-run.sh"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "run.sh"), script, 0o755))
	require.NoError(t, os.Symlink(cpcacheBinary(t), filepath.Join(dir, "cpcache")))
	stubEngine(t, dir)
	for name, sleep := range stubs {
		stubTest(t, dir, name, sleep)
	}
	env := append([]string{"OUT=" + filepath.Join(dir, "logs"), fakeCUDA(t), "CPCACHE_NCCL_LIBRARY=" + fakelib.Build(t, "nccl_fake")},
		withoutLauncherEnv(func(name string) bool {
			return name == "CPCACHE_REQUIRE_GPU" || name == "OUT" || strings.HasPrefix(name, "CPCACHE_GPU_")
		})...)
	return dir, env
}

func runScript(t *testing.T, dir string, env []string, during func(*exec.Cmd)) (string, int) {
	t.Helper()
	cmd := exec.Command(filepath.Join(dir, "run.sh"))
	cmd.Env = env
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Start())
	if during != nil {
		during(cmd)
	}
	err := cmd.Wait()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("run.sh: %v\n%s", err, out.String())
	}
	return out.String(), cmd.ProcessState.ExitCode()
}

// TestGPUBundleRunOnFakeLibraries runs run.sh with CPCACHE_REQUIRE_GPU unset in the
// environment: the stubs get CPCACHE_REQUIRE_GPU=1 and a per-package timeout within 120 s,
// the missing cudaslab.test is a failure, nccl runs last, the 8-rank `cpcache run --device
// cuda` runs (device and pinned host L2) on the fake driver and prints its report, the C
// example (a stand-in here: capi-test runs the real one on the fake driver) runs twice, and the
// summary line says it all. The two --model runs use per-layer device L1 buffers
// (job.Open allocates them).
func TestGPUBundleRunOnFakeLibraries(t *testing.T) {
	dir, env := gpuBundle(t, map[string]int{"cuda.test": 0, "hicache.test": 0, "cudaengine.test": 0, "libcpcache.test": 0, "nccl.test": 0})
	out, status := runScript(t, dir, env, nil)
	assert.Equal(t, 1, status, out)
	assert.Regexp(t, `(?m)^preflight: glibc: \S+`, out)
	assert.Regexp(t, `(?m)^preflight: libstdc\+\+: `, out)
	assert.Contains(t, out, "preflight: every bundled binary links on this image")
	assert.Regexp(t, `info: cuda.test args: .*-test.timeout=115s .*require=1`, out)
	assert.Contains(t, out, "cudaslab: FAILED: "+filepath.Join(dir, "cudaslab.test")+" is missing")
	assert.Contains(t, out, "--- SKIP: TestGPUTwo", "skips are listed")
	assert.Contains(t, out, "NVML unavailable", "with their reason")
	for _, run := range []string{"--l2 device", "--l2 host", "--l2 device --model llama-3-8b --l2-layout page_first", "--l2 host --model deepseek-v3 --l2-layout layer_first"} {
		assert.Contains(t, out, "== cpcache run --device cuda "+run+" (8 ranks)")
	}
	assert.Equal(t, 4, strings.Count(out, "pages verified"), "every device run prints its report")
	assert.Equal(t, 4, strings.Count(out, "bad pages 0\n"))
	assert.Equal(t, 4, strings.Count(out, "(1.00 consensus collectives per step)"))
	assert.Contains(t, out, "L1 device, per layer and part a token-slot buffer; L2 layer_first; 61 layers × 1 parts")
	for _, slabs := range []string{"pinned-host", "cuda-ipc"} {
		assert.Equal(t, 4, strings.Count(out, "bad_pages=0 l1=device0 slabs="+slabs+" "), "the C example's 4 ranks over %s slabs print their lines", slabs)
	}
	assert.Contains(t, out, "== engine --attn-cp 4 --device 0 --cuda-ipc (4 ranks, the C ABI)")
	assert.Contains(t, out, "device               0 cpcache fake GPU (up to 8 ranks per device)")
	assert.Less(t, strings.Index(out, "pinned host shared memory"), strings.Index(out, "== nccl.test"), "nccl runs last")
	m := summaryRE.FindStringSubmatch(out)
	require.NotNil(t, m, "no summary line:\n%s", out)
	assert.Equal(t, []string{"FAILED", "11", "0", "5", "360"}, m[1:6], "5 stubs pass and skip one each, 4 device runs and 2 C-example runs pass")
	assert.Contains(t, m[6], "cudaslab.test missing")
}

// TestGPUBundleUnpacksAndCleansUp: the bundle's entry point (cuda/testdata/gpu-unpack.sh,
// the gpu-bundle/run.sh of `make gpu-check`) unpacks bundle.tar.gz under $TMPDIR, runs the
// packed run.sh (here with 5 s left, so the steps report not run) with its logs beside the
// entry point, and removes what it unpacked; a bundle that does not unpack ends with a
// FAILED summary line that says so.
func TestGPUBundleUnpacksAndCleansUp(t *testing.T) {
	packed, env := gpuBundle(t, map[string]int{"cuda.test": 0})
	dir, tmp := t.TempDir(), t.TempDir()
	out, err := exec.Command("tar", "-czf", filepath.Join(dir, "bundle.tar.gz"), "-C", packed, ".").CombinedOutput()
	require.NoError(t, err, "%s", out)
	script, err := os.ReadFile(filepath.Join("..", "..", "cuda", "testdata", "gpu-unpack.sh"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "run.sh"), script, 0o755))
	env = slices.DeleteFunc(env, func(kv string) bool { return strings.HasPrefix(kv, "OUT=") })
	env = append(env, "TMPDIR="+tmp, "CPCACHE_GPU_DEADLINE_S=5")

	text, status := runScript(t, dir, env, nil)
	assert.Equal(t, 1, status, text)
	assert.Contains(t, text, "preflight: every bundled binary links on this image", "the packed run.sh ran")
	assert.Contains(t, text, "cuda: NOT RUN: the 5s deadline was reached")
	m := summaryRE.FindStringSubmatch(text)
	require.NotNil(t, m, "no summary line:\n%s", text)
	assert.Equal(t, []string{"FAILED", "0", "0", "0", "5"}, m[1:6])
	assert.Contains(t, text, "(logs in "+dir+")", "logs beside the entry point")
	assert.FileExists(t, filepath.Join(dir, "gpu-info.txt"))
	left, err := os.ReadDir(tmp)
	require.NoError(t, err)
	assert.Empty(t, left, "the unpacked bundle is removed")

	require.NoError(t, os.WriteFile(filepath.Join(dir, "bundle.tar.gz"), []byte("not a tarball"), 0o644))
	text, status = runScript(t, dir, env, nil)
	assert.Equal(t, 1, status, text)
	m = summaryRE.FindStringSubmatch(text)
	require.NotNil(t, m, "no summary line when the bundle does not unpack:\n%s", text)
	assert.Equal(t, "FAILED", m[1])
	assert.Contains(t, m[6], "cannot unpack "+filepath.Join(dir, "bundle.tar.gz"))
	left, err = os.ReadDir(tmp)
	require.NoError(t, err)
	assert.Empty(t, left, "nothing is left of a bundle that did not unpack")
}

// TestGPUBundleSummaryAtDeadlineAndSignal: with no time left every step is reported as not
// run, and a SIGTERM in the middle of a step still ends with the summary line.
func TestGPUBundleSummaryAtDeadlineAndSignal(t *testing.T) {
	dir, env := gpuBundle(t, map[string]int{"cuda.test": 60, "cudaslab.test": 0, "hicache.test": 0, "cudaengine.test": 0, "libcpcache.test": 0, "nccl.test": 0})
	out, status := runScript(t, dir, append(env, "CPCACHE_GPU_DEADLINE_S=5"), nil)
	assert.Equal(t, 1, status, out)
	assert.Contains(t, out, "cuda: NOT RUN: the 5s deadline was reached")
	assert.Contains(t, out, "nccl: NOT RUN")
	m := summaryRE.FindStringSubmatch(out)
	require.NotNil(t, m, "no summary line at the deadline:\n%s", out)
	assert.Equal(t, []string{"FAILED", "0", "0", "0", "5"}, m[1:6])
	assert.Contains(t, m[6], "nccl not run: the 5s deadline was reached")

	started := time.Now()
	out, status = runScript(t, dir, append(env, "CPCACHE_GPU_DEADLINE_S=9999"), func(cmd *exec.Cmd) {
		// Wait for the sleeping cuda.test stub to start, then stop the script.
		logs := filepath.Join(dir, "logs", "cuda.log")
		for time.Since(started) < 30*time.Second {
			if b, _ := os.ReadFile(logs); strings.Contains(string(b), "TestGPUTwo") {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		assert.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	})
	assert.NotEqual(t, 0, status, out)
	assert.Less(t, time.Since(started), 30*time.Second, "the signal ends the run at once")
	m = summaryRE.FindStringSubmatch(out)
	require.NotNil(t, m, "no summary line after SIGTERM:\n%s", out)
	assert.Equal(t, "360", m[5], "a deadline above 360 s is clamped")
	assert.Contains(t, m[6], "interrupted by SIGTERM")
}

// TestGPUBundlePreflightRefusesAnImageTooOld: when the dynamic linker reports a missing
// symbol version, the preflight says plainly that the bundle cannot run here and stops.
func TestGPUBundlePreflightRefusesAnImageTooOld(t *testing.T) {
	dir, env := gpuBundle(t, map[string]int{"cuda.test": 0, "cudaslab.test": 0, "hicache.test": 0, "cudaengine.test": 0, "libcpcache.test": 0, "nccl.test": 0})
	fakeBin := t.TempDir()
	ldd := "#!/bin/sh\ncase \"$1\" in *cuda.test) echo \"$1: /lib/libc.so.6: version \\`GLIBC_2.99' not found (required by $1)\";; esac\n"
	require.NoError(t, os.WriteFile(filepath.Join(fakeBin, "ldd"), []byte(ldd), 0o755))
	for i, kv := range env {
		if strings.HasPrefix(kv, "PATH=") {
			env[i] = "PATH=" + fakeBin + ":" + strings.TrimPrefix(kv, "PATH=")
		}
	}
	out, status := runScript(t, dir, env, nil)
	assert.Equal(t, 1, status, out)
	assert.Contains(t, out, "GLIBC_2.99' not found")
	assert.Contains(t, out, "THIS BUNDLE CANNOT RUN ON THIS IMAGE")
	assert.NotContains(t, out, "== gpu-info", "nothing runs after a failed preflight")
	m := summaryRE.FindStringSubmatch(out)
	require.NotNil(t, m, "no summary line:\n%s", out)
	assert.Contains(t, m[6], "the bundle cannot run on this image: cuda.test")
}

// TestGPUBundleFindsNCCLThroughPython: without CPCACHE_NCCL_LIBRARY and with no NCCL where
// the loader looks, run.sh asks Python where the nvidia.nccl package is (here a python3
// stand-in first on PATH) and uses its lib/libnccl.so.2 before walking the filesystem.
func TestGPUBundleFindsNCCLThroughPython(t *testing.T) {
	dir, env := gpuBundle(t, nil)
	pkg := filepath.Join(t.TempDir(), "site-packages", "nvidia", "nccl")
	require.NoError(t, os.MkdirAll(filepath.Join(pkg, "lib"), 0o755))
	nccl := filepath.Join(pkg, "lib", "libnccl.so.2")
	var kept []string
	for _, kv := range env {
		if name, lib, _ := strings.Cut(kv, "="); name == "CPCACHE_NCCL_LIBRARY" {
			require.NoError(t, os.Symlink(lib, nccl))
			continue
		}
		kept = append(kept, kv)
	}
	bin := t.TempDir()
	python := "#!/bin/sh\necho " + pkg + "\n"
	require.NoError(t, os.WriteFile(filepath.Join(bin, "python3"), []byte(python), 0o755))
	for i, kv := range kept {
		if strings.HasPrefix(kv, "PATH=") {
			kept[i] = "PATH=" + bin + ":" + strings.TrimPrefix(kv, "PATH=")
		}
	}
	// No time for the steps: only the preflight, the NCCL search and gpu-info run.
	out, _ := runScript(t, dir, append(kept, "CPCACHE_GPU_DEADLINE_S=5"), nil)
	assert.Contains(t, out, "run.sh: NCCL from the Python package nvidia.nccl: "+nccl)
	assert.Contains(t, out, "nccl: 2.18.3 from "+nccl, "gpu-info loads the NCCL Python pointed to")
	assert.NotContains(t, out, "filesystem walk")
	assert.Regexp(t, summaryRE, out)
}
