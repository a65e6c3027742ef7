// Package grouptest is the conformance suite every parallel.Group backend passes: in-process,
// Gloo and shared memory alike. Each function runs on one member and returns an error that
// names the first wrong result; the caller runs it on every member of a group (goroutines for
// in-process backends, one call per process for real ones) and fails on any error.
//
// Contract: Conformance and Soak make the same sequence of calls on every member and return
// nil only when every result equals the value computed locally from the ranks (ReduceInput
// and Reduced give those values to backend tests of their own). Parallel runs a function per
// member on goroutines, for in-process groups. ClosedPeer checks, on an in-process group's
// members, that closing one fails the others' pending and later collectives with
// parallel.ErrPeerLost and its own with parallel.ErrClosed.
//
// Ownership: the functions use the group they are given and never close it.
//
// Usage loop: build the group's members; on each member call Conformance (and Soak with a
// modest iteration count), via Parallel for in-process members or in each rank process; fail
// the test on any returned error.
package grouptest
