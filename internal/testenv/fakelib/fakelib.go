package fakelib

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Env marks a child process that runs the GPU tests against the fake libraries.
const Env = "CPCACHE_TEST_FAKE_GPU"

func gcc(t testing.TB, what string) string {
	t.Helper()
	path, err := exec.LookPath("gcc")
	if err != nil {
		t.Skipf("gcc not found (needed to build the %s): %v", what, err)
	}
	return path
}

// Build compiles csrc/<name>.c (csrc in the package directory the test runs in or the
// nearest directory above it that has one) into lib<name>.so.
func Build(t testing.TB, name string) string {
	t.Helper()
	cc := gcc(t, "fake libraries")
	src, err := findSource(name + ".c")
	if err != nil {
		t.Skipf("fake library source not here (bundle run?): %v", err)
	}
	lib := filepath.Join(t.TempDir(), "lib"+name+".so")
	if out, err := exec.Command(cc, "-shared", "-fPIC", "-O1", "-o", lib, src).CombinedOutput(); err != nil {
		t.Fatalf("fakelib: build %s: %v\n%s", src, err, out)
	}
	return lib
}

// findSource looks for csrc/file in the working directory and its parents.
func findSource(file string) (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		p := filepath.Join(dir, "csrc", file)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no csrc/%s in the working directory or above it", file)
		}
		dir = parent
	}
}

// Stub compiles a library named file that defines every symbol in symbols: as special[name]
// where given (C source of the whole function), else as `int name(void) { return ret; }`.
func Stub(t testing.TB, file string, symbols []string, special map[string]string, ret int) string {
	t.Helper()
	cc := gcc(t, "stub library")
	var b strings.Builder
	for _, name := range symbols {
		if src, ok := special[name]; ok {
			b.WriteString(src + "\n")
			continue
		}
		fmt.Fprintf(&b, "int %s(void) { return %d; }\n", name, ret)
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "stub.c")
	if err := os.WriteFile(src, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	lib := filepath.Join(dir, file)
	if out, err := exec.Command(cc, "-shared", "-fPIC", "-o", lib, src).CombinedOutput(); err != nil {
		t.Fatalf("fakelib: build stub %s: %v\n%s", file, err, out)
	}
	return lib
}

// SkipInChild skips the calling test in the child that RunGPUTests starts, and on a real
// GPU run (CPCACHE_REQUIRE_GPU=1), where the fakes have nothing to add.
func SkipInChild(t testing.TB) {
	t.Helper()
	if os.Getenv(Env) != "" {
		t.Skip("already running against the fake libraries")
	}
	if os.Getenv("CPCACHE_REQUIRE_GPU") == "1" {
		t.Skip("a real GPU run: the fake-library run is for machines without one")
	}
}

// RunGPUTests runs this test binary's TestGPU* tests (except those matching skip, when not
// empty) in a child process with CPCACHE_REQUIRE_GPU=1, Env and env set, and returns its
// output. It fails t when the child fails.
func RunGPUTests(t testing.TB, skip string, env ...string) string {
	t.Helper()
	return RunTests(t, "^TestGPU", skip, env...)
}

// RunTests is RunGPUTests for the tests matching run.
func RunTests(t testing.TB, run, skip string, env ...string) string {
	t.Helper()
	args := []string{"-test.v", "-test.count=1", "-test.run", run}
	if skip != "" {
		args = append(args, "-test.skip", skip)
	}
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(append(os.Environ(), Env+"=1", "CPCACHE_REQUIRE_GPU=1"), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("GPU tests on the fake libraries failed: %v\n%s", err, out)
	}
	return string(out)
}
