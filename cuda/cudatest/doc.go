// Package cudatest holds test helpers for code that needs a GPU.
//
// RequireGPU skips a test, saying why, on a machine without a usable CUDA driver and
// device; when CPCACHE_REQUIRE_GPU=1 it fails instead, so that a GPU run cannot pass by
// skipping everything.
//
// CheckShimDigest guards the cgo packages (cuda, nccl) against stale builds after edits to
// csrc/, which the go command does not track.
package cudatest
