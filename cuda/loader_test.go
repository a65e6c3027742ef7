package cuda

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cpcache/cpcache/internal/testenv/fakelib"
)

// buildStub compiles a fake libcuda exporting every table symbol except omit. Its cuInit
// fails with CUDA_ERROR_NO_DEVICE and its error-name calls answer like the driver's, so the
// trampolines and error formatting can be checked without a GPU.
func buildStub(t *testing.T, omit ...string) string {
	t.Helper()
	skip := map[string]bool{}
	for _, o := range omit {
		skip[o] = true
	}
	special := map[string]string{
		"cuInit": "int cuInit(unsigned int f) { (void)f; return 100; }",
		"cuGetErrorName": `int cuGetErrorName(int e, const char **s) {
  if (e == 100) { *s = "CUDA_ERROR_NO_DEVICE"; return 0; }
  return 1; }`,
		"cuGetErrorString": `int cuGetErrorString(int e, const char **s) {
  if (e == 100) { *s = "no CUDA-capable device is detected"; return 0; }
  return 1; }`,
	}
	var names []string
	for _, s := range symbols() {
		if !skip[s.Name] && !s.Optional {
			names = append(names, s.Name)
		}
	}
	return fakelib.Stub(t, "libcuda-stub.so.1", names, special, 999)
}

func TestLoadMissingLibrary(t *testing.T) {
	_, err := openWith(LibrarySearch{Env: "CPCACHE_TEST_NO_SUCH_VAR", Sonames: []string{"libcpcache-no-such-lib.so.1"}})
	var le *LoadError
	if !errors.As(err, &le) {
		t.Fatalf("want *LoadError, got %T %v", err, err)
	}
	if !errors.Is(err, ErrLibraryNotFound) {
		t.Errorf("want ErrLibraryNotFound, got %v", err)
	}
	for _, want := range []string{"cuda: cannot load libcpcache-no-such-lib.so.1", "libcpcache-no-such-lib.so.1: ", "cannot open shared object file", "CPCACHE_TEST_NO_SUCH_VAR"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
}

func TestLoadEnvOverrideIsExclusive(t *testing.T) {
	t.Setenv("CPCACHE_TEST_CUDA_LIB", "/nonexistent/dir/libcuda.so.1")
	s := LibrarySearch{Env: "CPCACHE_TEST_CUDA_LIB", Sonames: []string{"libc.so.6"}}
	if got := s.Candidates(); len(got) != 1 || got[0] != "/nonexistent/dir/libcuda.so.1" {
		t.Fatalf("candidates with override = %q, want only the override", got)
	}
	_, err := openWith(s)
	if !errors.Is(err, ErrLibraryNotFound) || !strings.Contains(err.Error(), "/nonexistent/dir/libcuda.so.1") {
		t.Fatalf("want not-found naming the override path, got %v", err)
	}
}

func TestLoadMissingSymbolNamesVersion(t *testing.T) {
	lib := buildStub(t, "cuMemAlloc_v2", "cuIpcOpenMemHandle_v2")
	t.Setenv("CPCACHE_TEST_CUDA_LIB", lib)
	_, err := openWith(LibrarySearch{Env: "CPCACHE_TEST_CUDA_LIB", Sonames: []string{"libcuda.so.1"}})
	if !errors.Is(err, ErrMissingSymbol) {
		t.Fatalf("want ErrMissingSymbol, got %v", err)
	}
	for _, want := range []string{lib + ": missing symbols", "cuMemAlloc_v2 (since CUDA 3.2)", "cuIpcOpenMemHandle_v2 (since CUDA 11.0)"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "cuMemcpyBatchAsync") {
		t.Errorf("optional symbols must not be reported missing: %v", err)
	}
	// The failed open left nothing loaded.
	if libraryLoaded() {
		t.Errorf("a failed open must leave the library unloaded")
	}
}

func TestLoadStubReportsDriverError(t *testing.T) {
	lib := buildStub(t)
	t.Setenv("CPCACHE_TEST_CUDA_LIB", lib)
	drv, err := openWith(LibrarySearch{Env: "CPCACHE_TEST_CUDA_LIB", Sonames: []string{"libcuda.so.1"}})
	if err == nil {
		drv.Close()
		t.Fatal("stub cuInit fails; Open must too")
	}
	var ce *Error
	if !errors.As(err, &ce) {
		t.Fatalf("want *Error, got %T %v", err, err)
	}
	if ce.Call != "cuInit" || ce.Code != ErrorNoDevice || ce.Name != "CUDA_ERROR_NO_DEVICE" || ce.Message != "no CUDA-capable device is detected" {
		t.Errorf("error fields = %+v", *ce)
	}
	if !errors.Is(err, ErrorNoDevice) || errors.Is(err, ErrorOutOfMemory) {
		t.Errorf("errors.Is on Result codes is wrong for %v", err)
	}
	want := "cuda: cuInit: no CUDA-capable device is detected [CUDA_ERROR_NO_DEVICE = 100]"
	if err.Error() != want {
		t.Errorf("message\n got %q\nwant %q", err.Error(), want)
	}
	// Open failed after loading, so it must have unloaded again (the stub is not kept).
	if libraryLoaded() {
		t.Errorf("after cuInit failed the library must be closed again")
	}
}

func TestCandidates(t *testing.T) {
	dir := t.TempDir()
	a := filepath.Join(dir, "a")
	wheel := filepath.Join(dir, "venv", "lib", "python3.12", "site-packages", "nvidia", "nccl", "lib")
	for _, d := range []string{a, wheel} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{filepath.Join(a, "libx.so.2"), filepath.Join(wheel, "libx.so.2")} {
		if err := os.WriteFile(f, nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	s := LibrarySearch{
		Env:     "CPCACHE_TEST_UNSET_VAR",
		Sonames: []string{"libx.so.2", "libx.so"},
		Dirs:    []string{filepath.Join(dir, "missing"), a, a},
		Globs:   []string{filepath.Join(dir, "venv", "lib", "python3*", "site-packages", "nvidia", "nccl", "lib", "libx.so.2")},
	}
	got := s.Candidates()
	want := []string{"libx.so.2", "libx.so", filepath.Join(a, "libx.so.2"), filepath.Join(wheel, "libx.so.2")}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("candidates\n got %q\nwant %q", got, want)
	}
	t.Setenv("VIRTUAL_ENV", filepath.Join(dir, "venv"))
	found := false
	for _, g := range PythonLibGlobs("nvidia/nccl/lib/libx.so.2") {
		if m, _ := filepath.Glob(g); len(m) == 1 && m[0] == filepath.Join(wheel, "libx.so.2") {
			found = true
		}
	}
	if !found {
		t.Errorf("PythonLibGlobs does not find the wheel layout under VIRTUAL_ENV")
	}
	t.Setenv("VIRTUAL_ENV", "")

	// A venv's python3 first on PATH (not activated), and a PYTHONPATH entry, come first.
	bin := filepath.Join(dir, "venv", "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bin, "python3"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin)
	t.Setenv("PYTHONPATH", filepath.Join(dir, "pp"))
	globs := PythonLibGlobs("nvidia/nccl/lib/libx.so.2")
	if globs[0] != filepath.Join(dir, "pp", "nvidia/nccl/lib/libx.so.2") {
		t.Errorf("PythonLibGlobs does not start with the PYTHONPATH entry: %q", globs)
	}
	found = false
	for _, g := range globs {
		if m, _ := filepath.Glob(g); len(m) == 1 && m[0] == filepath.Join(wheel, "libx.so.2") {
			found = true
		}
	}
	if !found {
		t.Errorf("PythonLibGlobs does not find the wheel of the python3 on PATH: %q", globs)
	}
}
