package shimdigest

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// recorder captures Errorf/Fatalf instead of failing the test.
type recorder struct {
	testing.TB
	errs []string
}

func (r *recorder) Helper()                   {}
func (r *recorder) Errorf(f string, a ...any) { r.errs = append(r.errs, fmt.Sprintf(f, a...)) }
func (r *recorder) Fatalf(f string, a ...any) { r.errs = append(r.errs, fmt.Sprintf(f, a...)) }

// inPkgDir lays out pkg/ and csrc/ under a temporary directory and makes pkg/ the working
// directory, as go test does for a real package.
func inPkgDir(t *testing.T, csrc map[string]string) {
	root := t.TempDir()
	for _, d := range []string{"pkg", "csrc"} {
		if err := os.Mkdir(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for name, body := range csrc {
		if err := os.WriteFile(filepath.Join(root, "csrc", name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Chdir(filepath.Join(root, "pkg"))
}

func writeShim(t *testing.T, digest string) {
	if err := os.WriteFile("shim.c", []byte("// shim\n// csrc-digest: "+digest+"\n#include \"../csrc/a.c\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestCheckFollowsCsrcEdits(t *testing.T) {
	inPkgDir(t, map[string]string{"x_a.c": "int a;", "x_b.h": "int b;", "y.c": "int y;"})
	d, err := Digest("../csrc", "x_*")
	if err != nil {
		t.Fatal(err)
	}
	if lit, _ := Digest("../csrc", "x_a.c", "x_b.h"); lit != d {
		t.Errorf("pattern x_* digest %s differs from the same files named in order (%s)", d, lit)
	}
	writeShim(t, d)
	r := &recorder{TB: t}
	if Check(r, "shim.c", "x_*"); len(r.errs) != 0 {
		t.Errorf("fresh digest reported stale: %q", r.errs)
	}
	if err := os.WriteFile("../csrc/x_b.h", []byte("int b2;"), 0o644); err != nil {
		t.Fatal(err)
	}
	d2, _ := Digest("../csrc", "x_*")
	r = &recorder{TB: t}
	if Check(r, "shim.c", "x_*"); len(r.errs) != 1 || !strings.Contains(r.errs[0], "// csrc-digest: "+d2) || d2 == d {
		t.Errorf("after a csrc edit: errors %q, want one naming the new line with %s (old %s)", r.errs, d2, d)
	}
	// y.c is not covered: editing it changes nothing.
	if err := os.WriteFile("../csrc/y.c", []byte("int y2;"), 0o644); err != nil {
		t.Fatal(err)
	}
	if d3, _ := Digest("../csrc", "x_*"); d3 != d2 {
		t.Errorf("digest of x_* changed (%s -> %s) after editing y.c", d2, d3)
	}
}

func TestCheckBadInput(t *testing.T) {
	inPkgDir(t, map[string]string{"a.c": "int a;"})
	if _, err := Digest("../csrc", "nope_*"); err == nil || !strings.Contains(err.Error(), `"nope_*"`) {
		t.Errorf("pattern matching nothing: %v, want an error naming it", err)
	}
	if err := os.WriteFile("shim.c", []byte("no digest line\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := &recorder{TB: t}
	if Check(r, "shim.c", "a.c"); len(r.errs) != 1 || !strings.Contains(r.errs[0], "shim.c is stale") {
		t.Errorf("shim without a digest line: errors %q", r.errs)
	}
	r = &recorder{TB: t}
	if Check(r, "missing.c", "a.c"); len(r.errs) != 1 || !strings.Contains(r.errs[0], "missing.c") {
		t.Errorf("missing shim: errors %q", r.errs)
	}
}
