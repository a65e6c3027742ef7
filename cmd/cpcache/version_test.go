package main

import (
	"bytes"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// repoVersion is the repository's VERSION file, the version's one source.
func repoVersion(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../../VERSION")
	if err != nil {
		t.Fatal(err)
	}
	v := strings.TrimSpace(string(b))
	if v == "" || strings.ContainsAny(v, " \t\n") {
		t.Fatalf("VERSION holds %q, want one word such as 0.1.0", b)
	}
	return v
}

// TestVersion: `cpcache --version` and `cpcache version` print the VERSION file's version
// (the binary linked as the Makefile links it), and both exit 0; a stray argument is a bad
// input.
func TestVersion(t *testing.T) {
	bin := cpcacheBinary(t)
	want := "cpcache " + repoVersion(t) + " ("
	for _, args := range [][]string{{"--version"}, {"version"}} {
		out, err := exec.Command(bin, args...).Output()
		if err != nil || !strings.HasPrefix(string(out), want) {
			t.Errorf("cpcache %s: %v, %q; want it to start with %q", args[0], err, out, want)
		}
	}
	var stdout, stderr bytes.Buffer
	if status := run([]string{"version", "extra"}, &stdout, &stderr); status != 2 || !strings.Contains(stderr.String(), `"extra"`) {
		t.Errorf("cpcache version extra: status %d, stderr %q; want 2 naming the argument", status, stderr.String())
	}
	// Without the linker flag (this test binary) the version says so.
	stdout.Reset()
	if status := run([]string{"--version"}, &stdout, &stderr); status != 0 || !strings.HasPrefix(stdout.String(), "cpcache dev (") {
		t.Errorf("unlinked --version: status %d, %q; want cpcache dev", status, stdout.String())
	}
}
