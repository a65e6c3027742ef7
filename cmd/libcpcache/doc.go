// Command libcpcache is cpcache's hierarchical KV cache (package hicache) as a C library for
// engines written in C, C++ or Python: built with -buildmode=c-shared (libcpcache.so) or
// -buildmode=c-archive (libcpcache.a), declared by the hand-written header
// include/cpcache.h (the contract: per-function replicated/local marks and thread safety),
// bound to Python by python/cpcache (ctypes). `make capi` builds both libraries into build/;
// CMakeLists.txt builds and installs them with a find_package(cpcache) configuration.
//
// Build with -tags cpcache_nonvml: package cuda's NVML topology query (go-nvml) leaves
// hundreds of undefined nvml* symbols in a c-shared library, which executables linked with
// -lcpcache and ctypes (RTLD_NOW) refuse; the cache does not need it.
//
// # What the library does at cpcache_open
//
// It first makes the Go runtime's environment the process's current one (syncEnviron: the
// runtime copied it when it started, and a Python caller's os.environ assignments since are
// putenv calls it would miss). It opens one rank of the job through job.Open (its Config made
// by jobConfig from the C config), which joins the job — rank and world from the launcher's
// environment (parallel.FromEnv: cpcache launch, torchrun, mpirun, Slurm) or explicit —
// through the rendezvous store (gloo.NewWorld): a URL, or the caller's store callbacks
// (cpcache_config.store: callbackStore, a parallel.Store calling them through C trampolines), makes the layout's groups (gloo.NewLayoutGroups), the
// consensus group (shm.Consensus: shared memory on one host, else Gloo), the slab set of this
// rank's CP group (slab.OpenSet: host shared memory, or CUDA IPC with slab/cudaslab's
// backend in the slab.Spec), the copy engine over the L1 pool, the optional storage
// (stores.Open) and the hicache.Cache. The library adds job.Open's start agreement: the
// host-memory check and the comparison of every rank's configuration (agreeConfig), before
// any pool is allocated. cpcache_close closes them in reverse order (the job.Rank's
// Close). One cache per process (lib.cur).
//
// L1 pools: CPCACHE_L1_ALLOC is an anonymous mapping the library makes (not Go heap, so its
// address may be handed to C); CPCACHE_L1_HOST is the engine's host buffer; both are copied
// by a hostengine.Engine over that memory (Options.Pool). CPCACHE_L1_DEVICE is the engine's
// device pointer, copied by a cudaengine.Engine (pinned host slabs or CUDA IPC slabs).
// l1_buffers replace the pool with the engine's per-(layer, part) buffers (resolveKV): host
// buffers (CPCACHE_MEM_HOST, l1_kind CPCACHE_L1_ALLOC) go to the cache's layered host engine
// (job.L1Cache), device buffers (CPCACHE_MEM_DEVICE, l1_kind CPCACHE_L1_DEVICE, l1_base NULL)
// to the CUDA KV engine that job.Open's engine step builds over them (job.L1Device:
// cudaengine.KVOf and NewKV, as for `cpcache run --device cuda --model`), with per-layer
// events for cpcache_wait_l1_layer_on. One kind per L1; a mix, or a kind l1_kind does not
// take, is CPCACHE_ERR_INVALID naming the buffer, before any rank talks to another.
//
// # The boundary
//
// No Go pointer crosses it. Handles are integers: a cache handle names the one open session
// (never reused, so a closed handle stays invalid); a node handle is the cache's own
// (hicache.Handle: generation << 40 | node id), equal on every rank of the replica group and
// checked by the core at every call; the generation changes at every flush and every
// recovery from a quarantine, which restart node ids, and at every open (above any
// generation a rank's earlier cache used, agreed by the job: Options.Generation). Tokens
// are read from C memory in place by Match and copied for Insert and Prefetch (the tree
// keeps them).
// Results are written into caller-provided structs and arrays whose sizes are checked
// before anything changes, so a replicated call either happens on every rank or fails on
// every rank. Capacities (slots_cap, fill_cap) are bounds: Go views of C buffers are only as
// long as what is written. Every exported function recovers panics (CPCACHE_ERR_INTERNAL,
// with a one-line message: the call, the place and the panic value; the stack goes to stderr
// once, see panic.go) and records the error text in a thread-local buffer
// (csrc/cpcache_capi.c), which works because an exported function runs on its C caller's
// thread from entry to return.
//
// # Fork
//
// The header's functions are C (csrc/cpcache_capi.c, from the one list
// csrc/cpcache_entries.h); each calls the Go export cpcapi_<name> of this package unless the
// process is a child forked after the library was loaded, which gets CPCACHE_ERR_FORKED at
// once: the Go runtime does not survive fork (only the forking thread does), so a call into
// Go there could wait forever on a lock held by a thread that is gone, or run on a copy of
// the parent's cache. A pthread_atfork child handler, registered by a constructor at load,
// sets the flag each call reads (cpcache_open and cpcache_close also compare getpid() with
// the pid recorded at load). cpcache_version answers in the child from the string this
// package's init stored in C (cpcapi_set_version). Tested by ctest/fork.c and
// python/tests/test_fork.py; python/tests/test_abi.py checks that the list is the header's
// functions and what libcpcache.so exports.
//
// # Signals in a foreign process
//
// The Go runtime starts when libcpcache.so is loaded (c-shared) or at program start
// (c-archive). It installs handlers only for the synchronous signals (SIGSEGV, SIGBUS,
// SIGFPE) and SIGPIPE, keeping the engine's own handlers for everything else (adding
// SA_ONSTACK to them): the engine's SIGINT/SIGTERM handling is untouched — Python still
// raises KeyboardInterrupt, a C engine's handler still runs. A fault in the engine's own
// code still reaches the engine's handler (the runtime forwards synchronous signals raised
// in non-Go code). Gloo writes to sockets without MSG_NOSIGNAL, and package gloo routes
// SIGPIPE to a channel (os/signal.Notify) on its first world: a broken connection on a Go
// thread is then an error (parallel.ErrPeerLost), but a SIGPIPE raised on a thread the engine
// created is forwarded to the engine's disposition — so engines should ignore SIGPIPE, as
// servers do (Python does by default; examples/c/engine.c does). Tested by
// ctest/bad_calls.c (SIGINT handler, EPIPE on an engine thread) and python/tests (Ctrl-C in
// the example exits 130 after closing the cache, with no Go crash dump).
//
// # Threads
//
// Calls on a session hold its mutex (session.mu; cpcache_wait_l1 and cpcache_wait_l1_layer
// release it before waiting), and the cache has its own, so any thread may call; the replicated calls must come from one
// scheduler thread in the replicated order. Go's threads (copy workers, Gloo's waits) are
// the runtime's; the engine's threads are never taken over.
//
// # Usage
//
// See the header, examples/c/engine.c (C), python/examples/hicache_controller.py (Python,
// mapped onto an SGLang-style HiCache controller) and docs/c.md and docs/python.md.
package main
