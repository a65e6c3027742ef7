// Package version is cpcache's release version, shared by the binary, libcpcache and the
// report. Its one source is the repository's VERSION file: the Makefile and CMakeLists.txt
// read it and set it here at link time,
//
//	go build -ldflags "-X github.com/cpcache/cpcache/internal/version.version=$(cat VERSION)"
//
// A build without the flag (go build, go test) reports the module version `go install
// module@vX.Y.Z` records, else "dev".
package version

import "runtime/debug"

// version is set with -ldflags -X by the Makefile and CMake; empty in a plain go build.
var version string

// Version is cpcache's version: "0.1.0" from a make or CMake build, the module's version
// from go install, "dev" otherwise.
func Version() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "dev"
}

// String is the version as the binary and cpcache_version() print it: "cpcache 0.1.0".
func String() string { return "cpcache " + Version() }
