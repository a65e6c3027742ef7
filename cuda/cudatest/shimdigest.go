package cudatest

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"regexp"
	"testing"
)

var digestLine = regexp.MustCompile(`(?m)^// csrc-digest: (\S+)$`)

// CheckShimDigest (for tests of the packages that compile csrc/ files: cuda, nccl) fails t when the digest
// line in the package's shim (run from the package directory) does not match the current
// content of the named csrc files, printing the line to put there.
func CheckShimDigest(t testing.TB, shim string, csrcFiles ...string) {
	t.Helper()
	h := sha256.New()
	for _, f := range csrcFiles {
		b, err := os.ReadFile(filepath.Join("..", "csrc", f))
		if err != nil {
			t.Fatalf("csrc digest: %v", err)
		}
		h.Write([]byte(f))
		h.Write(b)
	}
	want := hex.EncodeToString(h.Sum(nil))[:16]
	src, err := os.ReadFile(shim)
	if err != nil {
		t.Fatalf("csrc digest: %v", err)
	}
	m := digestLine.FindSubmatch(src)
	if m == nil || string(m[1]) != want {
		t.Errorf("%s is stale for the csrc files it includes (the go command would not rebuild them): "+
			"set its line to\n// csrc-digest: %s", shim, want)
	}
}
