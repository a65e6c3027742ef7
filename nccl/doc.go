// Package nccl binds NCCL, loaded at run time, for cpcache's GPU collectives.
//
// libnccl.so.2 is opened with dlopen (CPCACHE_NCCL_LIBRARY overrides the path; otherwise
// the dynamic linker's search, CUDA/NCCL install directories and Python wheel layouts such
// as site-packages/nvidia/nccl/lib are tried), so binaries build and start without NCCL and
// fail with a *cuda.LoadError only when a communicator is asked for. The C half is
// csrc/nccl_loader.c; optional entry points are version-gated (ncclCommInitRankConfig and
// ncclCommFinalize >= 2.14, ncclCommSplit >= 2.18, ncclGetLastError >= 2.13).
//
// Bootstrap: NewComm(ctx, group, dev, opts) runs on every member of a CPU dist.Group; rank 0
// creates the 128-byte unique id and broadcasts it over the group, then every member
// initialises its communicator on dev.
//
// Never hang: with NCCL >= 2.14 communicators are non-blocking (ncclConfig_t.blocking = 0,
// passed as the 2.14 prefix of the struct, which later NCCL versions accept by its size and
// version fields). Initialisation and each collective return ncclInProgress and are polled;
// Comm.Wait polls the stream and ncclCommGetAsyncError until the deadline of its context (or
// Options.Timeout), then aborts the communicator (ncclCommAbort) and returns an error
// wrapping dist.ErrTimeout. Later calls fail with ErrAborted.
//
// Threading: NCCL learns the device from the calling thread's current CUDA context, so every
// NCCL call runs with the OS thread locked and the device's primary context made current
// (cuda.Device.MakeCurrent) for the duration of that call; Group keeps the thread locked
// across ncclGroupStart..ncclGroupEnd because NCCL's group state is per thread.
//
// Usage loop:
//
//	comm, err := nccl.NewComm(ctx, cpuGroup, dev, nccl.Options{})
//	defer comm.Close()
//	comm.AllReduce(ctx, buf, buf, n, nccl.Float32, nccl.Sum, stream) // enqueue
//	err = comm.Wait(ctx, stream)                                      // poll, deadline, abort
//
// Group (NewGroup/WrapComm) is a dist.Group over a communicator: small host vectors are
// staged through pinned memory and a device buffer, so the consensus step can run on NCCL.
//
// Ownership: a Comm owns its ncclComm_t and a reference to the library; Close finalises
// and destroys it (nil-safe, idempotent). The cuda.Device and streams stay the caller's and
// must outlive the Comm; a Group owns its Comm, stream and staging buffers.
package nccl
