// Package fakelib builds the stand-in shared libraries that let the GPU packages' tests run
// on machines without a GPU: the host-memory fakes of libcuda and libnccl in csrc/
// (cuda_fake.c, nccl_fake.c) and small generated stubs that export a loader's symbol table.
//
// Contract: every builder compiles with the system's gcc into t.TempDir() and returns the
// library's path; it skips t (with the reason) when gcc or the csrc source is missing (a GPU
// bundle run has no sources), and fails t when the compiler fails. RunGPUTests re-runs the
// calling test binary's TestGPU* tests in a child process against such libraries.
//
// Ownership: the libraries live in the test's temporary directory and go with it.
//
// Usage loop: a package's fake-library test calls SkipInChild, builds its libraries with
// Build, passes their paths to RunGPUTests in CPCACHE_*_LIBRARY variables, and checks the
// returned output for the tests that must have passed. Loader tests build stubs with Stub.
package fakelib
