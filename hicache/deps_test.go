package hicache

import (
	"os/exec"
	"strings"
	"testing"
)

// The driver links what it needs and nothing more: the standard library, the project and
// the few modules below. Storage clients (package storage/stores: go-redis), Prometheus
// (package hicache/metrics) and everything they pull in (protobuf) stay out, so that
// libcpcache and any other user of the cache does not link them. The compiler checks
// nothing of this by itself; this test does, from the go tool's own dependency list.

// allowedModules are the modules outside the standard library and the project the driver
// may depend on, each with why.
var allowedModules = map[string]string{
	"golang.org/x/sys":              "system calls the syscall package lacks (memfd, munmap of the slabs); the Go project's own",
	"github.com/zeebo/blake3":       "the MAC of every stored page (package storage's value format)",
	"github.com/klauspost/cpuid/v2": "blake3's CPU feature detection",
}

// outside reports why the driver may not depend on path, a package that is not in the
// standard library ("" if it may).
func outside(path string) string {
	if path == "github.com/cpcache/cpcache" || strings.HasPrefix(path, "github.com/cpcache/cpcache/") {
		return ""
	}
	for mod := range allowedModules {
		if path == mod || strings.HasPrefix(path, mod+"/") {
			return ""
		}
	}
	return "outside the standard library, the project and the allowed modules"
}

func TestDriverDependsOnNothingExternal(t *testing.T) {
	gotool, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go tool to list the dependencies with: %v", err)
	}
	out, err := exec.Command(gotool, "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".").Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("go list -deps: %v\n%s", err, stderr)
	}
	deps := strings.Fields(string(out))
	if len(deps) == 0 || deps[len(deps)-1] != "github.com/cpcache/cpcache/hicache" {
		t.Fatalf("go list -deps listed %d packages, not ending with hicache: %v", len(deps), deps)
	}
	for _, p := range deps {
		if why := outside(p); why != "" {
			t.Errorf("hicache depends on %s: %s", p, why)
		}
	}
}

// The check must be able to fail: the storage clients, Prometheus and protobuf are caught.
func TestOutsideCatchesExternalModules(t *testing.T) {
	for _, p := range []string{"github.com/redis/go-redis/v9", "github.com/prometheus/client_golang/prometheus",
		"google.golang.org/protobuf/proto", "github.com/cpcache/cpcachex", "golang.org/x/sysx/unix"} {
		if outside(p) == "" {
			t.Errorf("dependency %q passes the check", p)
		}
	}
	for _, p := range []string{"github.com/cpcache/cpcache/storage", "golang.org/x/sys/unix", "github.com/zeebo/blake3"} {
		if why := outside(p); why != "" {
			t.Errorf("dependency %q rejected: %s", p, why)
		}
	}
}
