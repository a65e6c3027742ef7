// Package shimdigest guards the cgo packages (cuda, nccl, gloo) against stale builds after
// edits to csrc/.
//
// The go command rebuilds a cgo package when a file inside the package changes, but not when
// a file it #includes from ../csrc changes. Each such package therefore keeps a line
//
//	// csrc-digest: <16 hex digits>
//
// in its shim source file, naming the csrc content it was last built from. Check, called by
// the package's TestShimDigest, fails when that line does not match the current csrc files
// and prints the line to put there; updating it changes a file of the package, so Go rebuilds.
//
// Contract: Check is called from a test running in the package directory (the go test
// default); csrc files are named relative to ../csrc, by name or by filepath.Match pattern.
// The digest covers the names and contents of the matched files in order.
//
// Ownership: stateless; nothing to close.
//
// Usage loop: func TestShimDigest(t *testing.T) { shimdigest.Check(t, "shim.c", "loader.h", ...) }
package shimdigest
