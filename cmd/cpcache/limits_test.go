package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// v1MemoryCgroup makes a child of this process's cgroup v1 memory cgroup with a memory
// limit, removed at the end of the test; it skips, saying why, where there is no writable
// cgroup v1 memory hierarchy.
func v1MemoryCgroup(t *testing.T, limit int64) string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Skipf("no /proc/self/cgroup: %v", err)
	}
	var path string
	for line := range strings.Lines(string(b)) {
		parts := strings.SplitN(strings.TrimSpace(line), ":", 3)
		if len(parts) == 3 && hasWord(parts[1], "memory") {
			path = parts[2]
		}
	}
	parent := filepath.Join("/sys/fs/cgroup/memory", path)
	if path == "" {
		t.Skip("this host has no cgroup v1 memory controller (cgroup v2 only)")
	}
	if _, err := os.Stat(filepath.Join(parent, "memory.limit_in_bytes")); err != nil {
		t.Skipf("this process's cgroup v1 memory cgroup is not at %s: %v", parent, err)
	}
	dir := filepath.Join(parent, "cpcache-test-"+strconv.Itoa(os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Skipf("cannot make a cgroup v1 memory cgroup (needs root and a writable hierarchy): %v", err)
	}
	t.Cleanup(func() {
		// The cgroup empties once its processes are reaped; a removal races their exit.
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			if err := os.Remove(dir); err == nil || errors.Is(err, os.ErrNotExist) || time.Now().After(deadline) {
				return
			}
		}
	})
	if err := os.WriteFile(filepath.Join(dir, "memory.limit_in_bytes"), []byte(strconv.FormatInt(limit, 10)), 0o644); err != nil {
		t.Skipf("cannot set a cgroup v1 memory limit: %v", err)
	}
	return dir
}

func hasWord(list, w string) bool {
	for c := range strings.SplitSeq(list, ",") {
		if c == w {
			return true
		}
	}
	return false
}

// TestRunRefusesOverACgroupV1MemoryLimit: `cpcache run` in a cgroup v1 memory cgroup whose
// limit is below what its 16 ranks need is refused before any rank starts (exit 2, naming
// the limit's file and cgroup). Before, only cgroup v2's memory.max was read: the ranks
// started and were OOM-killed (exit 137).
func TestRunRefusesOverACgroupV1MemoryLimit(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the cpcache binary")
	}
	dir := v1MemoryCgroup(t, 256<<20)
	j := newJobEnv(t)
	// The shell joins the cgroup, then becomes cpcache: every rank would be in it.
	cmd := exec.Command("sh", "-c", `echo $$ > "$1/cgroup.procs" && exec "$2" run --clients 32 --rounds 4`, "sh", dir, j.path)
	cmd.Env = j.env
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- cmd.Wait() }()
	var err error
	select {
	case err = <-done:
	case <-time.After(60 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatalf("still running after 60 s; stderr:\n%s", stderr.String())
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 {
		t.Fatalf("%v, want exit status 2; stderr:\n%s", err, stderr.String())
	}
	want := "of memory available (cgroup memory.limit_in_bytes of "
	if errOut := stderr.String(); !strings.Contains(errOut, want) || strings.Contains(errOut, "starting") {
		t.Errorf("stderr %q: want one line containing %q, no rank started", errOut, want)
	}
	j.requireNothingLeft(t, 2*time.Second, "run over a cgroup v1 limit")
}
