package main

import (
	"fmt"
	"io"
	"runtime"

	"github.com/cpcache/cpcache/internal/version"
)

func init() {
	register(command{name: "version", summary: "print cpcache's version (also cpcache --version)", run: runVersion})
}

// runVersion prints "cpcache 0.1.0 (go1.26.0 linux/amd64)": the version of the VERSION file
// the binary was built from (see internal/version), and the toolchain.
func runVersion(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("version", "", "Prints cpcache's version and the Go toolchain it was built with.", stderr)
	if status, done := parseFlags(fs, args); done {
		return status
	}
	if fs.NArg() > 0 {
		return fail(stderr, 2, fmt.Errorf("version: unexpected argument %q", fs.Arg(0)))
	}
	fmt.Fprintf(stdout, "%s (%s %s/%s)\n", version.String(), runtime.Version(), runtime.GOOS, runtime.GOARCH)
	return 0
}
