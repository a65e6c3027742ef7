// Package nccl binds NCCL, loaded at run time, for cpcache's GPU collectives.
//
// libnccl.so.2 is opened with dlopen (CPCACHE_NCCL_LIBRARY overrides the path; otherwise
// the dynamic linker's search, CUDA/NCCL install directories and Python wheel layouts such
// as site-packages/nvidia/nccl/lib are tried), so binaries build and start without NCCL and
// fail with a *cuda.LoadError only when a communicator is asked for. The C half is
// csrc/nccl_loader.c; optional entry points are version-gated (ncclCommInitRankConfig and
// ncclCommFinalize >= 2.14, ncclCommSplit >= 2.18, ncclGetLastError >= 2.13).
//
// Bootstrap: NewComm(ctx, group, dev, opts) runs on every member of a CPU parallel.Group; rank 0
// creates the 128-byte unique id and broadcasts it over the group, then every member
// initialises its communicator on dev.
//
// Never hang: with NCCL >= 2.14 communicators are non-blocking (ncclConfig_t.blocking = 0,
// passed as the 2.14 prefix of the struct, which later NCCL versions accept by its size and
// version fields). Initialisation and each collective return ncclInProgress and are polled;
// Comm.Wait polls the stream and ncclCommGetAsyncError until the deadline of its context (or
// Options.Timeout), then aborts the communicator (ncclCommAbort) and returns an error
// wrapping parallel.ErrTimeout. Later calls fail with ErrAborted.
//
// Non-blocking rules (checked against NCCL 2.28's src/init.cc and src/group.cc): a
// communicator is not used (not even finalised or destroyed) until ncclCommGetAsyncError
// reported ncclSuccess for its last operation; ncclCommSplit may return ncclSuccess while the
// split still runs, with the parent in progress and the child stored into the out-pointer by
// an NCCL thread when it completes, so Split passes C memory for it, polls the parent, then
// the child; Close polls before ncclCommFinalize and aborts instead when that fails.
//
// Threading: NCCL learns the device from the calling thread's current CUDA context, so every
// NCCL call runs with the OS thread locked and the device's primary context made current
// (cuda.Device.MakeCurrent) for the duration of that call; Group keeps the thread locked
// across ncclGroupStart..ncclGroupEnd because NCCL's group state is per thread. For the same
// reason, create/split/finalize/destroy/abort run on a fresh goroutine whose OS thread is
// retired when the call fails: some NCCL error paths (2.28 ncclCommDestroy) leave that
// thread's group state open, which would swallow later calls on a reused thread.
//
// Tests: csrc/nccl_fake.c models these rules strictly (busy communicators rejected, split
// published late, a leaked group latched process-wide), so the TestGPU* tests run against it
// on every CI machine catch their violation.
//
// Usage loop:
//
//	comm, err := nccl.NewComm(ctx, cpuGroup, dev, nccl.Options{})
//	defer comm.Close()
//	comm.AllReduce(ctx, buf, buf, n, nccl.Float32, nccl.Sum, stream) // enqueue
//	err = comm.Wait(ctx, stream)                                      // poll, deadline, abort
//
// Group (NewGroup/WrapComm) is a parallel.Group over a communicator: small host vectors are
// staged through pinned memory and a device buffer, so the consensus step can run on NCCL.
//
// Ownership: a Comm owns its ncclComm_t and a reference to the library; Close finalises
// and destroys it (nil-safe, idempotent). The cuda.Device and streams stay the caller's and
// must outlive the Comm; a Group owns its Comm, stream and staging buffers.
package nccl
