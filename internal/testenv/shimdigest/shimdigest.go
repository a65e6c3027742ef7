package shimdigest

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"testing"
)

var digestLine = regexp.MustCompile(`(?m)^// csrc-digest: (\S+)$`)

// Digest returns the digest of the csrc files matched by patterns (names or filepath.Match
// patterns relative to dir, each match taken in sorted order): the first 16 hex digits of
// the SHA-256 of each file's name followed by its content. A pattern matching no file is an
// error naming it.
func Digest(dir string, patterns ...string) (string, error) {
	h := sha256.New()
	for _, p := range patterns {
		matches, err := filepath.Glob(filepath.Join(dir, p))
		if err != nil {
			return "", fmt.Errorf("shimdigest: pattern %q: %w", p, err)
		}
		if len(matches) == 0 {
			return "", fmt.Errorf("shimdigest: %q matches no file in %s", p, dir)
		}
		for _, m := range matches {
			b, err := os.ReadFile(m)
			if err != nil {
				return "", fmt.Errorf("shimdigest: %w", err)
			}
			h.Write([]byte(filepath.Base(m)))
			h.Write(b)
		}
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

// Check fails t when the csrc-digest line in shim (a file of the package under test, run
// from the package directory) does not match the current content of the ../csrc files
// matched by patterns, printing the line to put there.
func Check(t testing.TB, shim string, patterns ...string) {
	t.Helper()
	want, err := Digest(filepath.Join("..", "csrc"), patterns...)
	if err != nil {
		t.Fatalf("csrc digest: %v", err)
		return
	}
	src, err := os.ReadFile(shim)
	if err != nil {
		t.Fatalf("csrc digest: %v", err)
		return
	}
	m := digestLine.FindSubmatch(src)
	if m == nil || string(m[1]) != want {
		t.Errorf("%s is stale for the csrc files it includes (the go command would not rebuild them): "+
			"set its line to\n// csrc-digest: %s", shim, want)
	}
}
