package core

import (
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// The core's purity is a rule the compiler does not check by itself: this test does. The core
// and every project package it depends on may import only computation from the standard
// library — no I/O, clocks, concurrency, cgo or per-process randomness — and may not start
// goroutines, so that N replicas fed the same inputs are bound to compute the same state.
// (Transitive standard-library imports are not checked: fmt itself imports os.)

const module = "github.com/cpcache/cpcache/"

// pureDirs are the project packages the core may depend on (relative to this directory),
// and the import paths they are known by.
var pureDirs = map[string]string{
	".":                  module + "hicache/core",
	"../../slab/alloc":   module + "slab/alloc",
	"../../internal/mix": module + "internal/mix",
}

// forbidden reports why importing path would make a pure package impure ("" if it is fine).
func forbidden(path string) string {
	for _, p := range []string{"C", "os", "net", "sync", "time", "context", "syscall", "unsafe", "io", "log",
		"runtime", "math/rand", "crypto/rand", "hash/maphash", "plugin"} {
		if path == p || strings.HasPrefix(path, p+"/") {
			return "I/O, clocks, concurrency, cgo or per-process randomness"
		}
	}
	if strings.HasPrefix(path, module) && !slices.Contains(slices.Collect(maps.Values(pureDirs)), path) {
		return "a project package outside the pure set (hicache/core, slab/alloc, internal/mix)"
	}
	return ""
}

func TestCoreImportsNothingImpure(t *testing.T) {
	for dir, pkg := range pureDirs {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil || len(files) == 0 {
			t.Fatalf("%s: no Go files in %s (%v)", pkg, dir, err)
		}
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			fset := token.NewFileSet()
			file, err := parser.ParseFile(fset, f, nil, parser.SkipObjectResolution)
			if err != nil {
				t.Fatal(err)
			}
			for _, imp := range file.Imports {
				path, _ := strconv.Unquote(imp.Path.Value)
				if why := forbidden(path); why != "" {
					t.Errorf("%s imports %q: %s", fset.Position(imp.Pos()), path, why)
				}
			}
			ast.Inspect(file, func(n ast.Node) bool {
				if g, ok := n.(*ast.GoStmt); ok {
					t.Errorf("%s starts a goroutine", fset.Position(g.Pos()))
				}
				return true
			})
		}
	}
}

// The check must be able to fail: each kind of impurity is caught.
func TestForbiddenCatchesImpureImports(t *testing.T) {
	for _, p := range []string{"os", "os/exec", "net/http", "sync", "sync/atomic", "time", "context", "C",
		"math/rand/v2", "hash/maphash", module + "slab", module + "parallel"} {
		if forbidden(p) == "" {
			t.Errorf("import %q passes the purity check", p)
		}
	}
	for _, p := range []string{"fmt", "errors", "slices", "math", "math/bits", "hash/fnv", module + "slab/alloc"} {
		if why := forbidden(p); why != "" {
			t.Errorf("import %q rejected: %s", p, why)
		}
	}
}
