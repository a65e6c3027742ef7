package zmq

import (
	"go/build"
	"testing"
)

// TestPackageHasNoCgo: only cuda/, nccl/, gloo/ and cmd/libcpcache may import "C"; this
// package reaches libzmq through purego, so it builds with CGO_ENABLED=0 (`make pure`) and
// carries no C or header files.
func TestPackageHasNoCgo(t *testing.T) {
	ctx := build.Default
	ctx.CgoEnabled = true // list the cgo files whatever the environment says
	pkg, err := ctx.ImportDir(".", 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(pkg.CgoFiles) > 0 || len(pkg.CFiles) > 0 || len(pkg.HFiles) > 0 {
		t.Fatalf("package zmq uses cgo: Go files importing \"C\" %v, C files %v, headers %v",
			pkg.CgoFiles, pkg.CFiles, pkg.HFiles)
	}
}
