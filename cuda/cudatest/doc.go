// Package cudatest holds test helpers for code that needs a GPU.
//
// Contract: RequireGPU skips a test, saying why, on a machine without a usable CUDA driver
// and device; when CPCACHE_REQUIRE_GPU=1 (Required) it fails instead, so that a GPU run
// cannot pass by skipping everything. Unavailable applies the same rule to a reason found
// by the caller.
//
// Ownership: the driver and device RequireGPU returns belong to the test and are closed by
// t.Cleanup; callers must not close them.
//
// Usage loop: at the top of each GPU test, drv, dev := cudatest.RequireGPU(t); then use dev.
package cudatest
