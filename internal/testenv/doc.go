// Package testenv gathers the project's test helpers, one sub-package each, so that the
// runtime packages under internal/ (mix, shmseg) stay apart from test-only code:
//
//   - multiproc: runs a test's roles as real rank processes and collects their results;
//   - glootest: a role wrapper that joins a Gloo world from the multiproc environment;
//   - netnstest: network namespaces for multi-host tests (root only);
//   - redistest: a throwaway redis-server for storage and rendezvous tests;
//   - fakelib: builds the host-memory fake libcuda/libnccl that GPU code paths run on in CI;
//   - shimdigest: checks that the cgo shims were rebuilt after a csrc change.
//
// Nothing outside _test.go files imports them, except other test helpers.
package testenv
