// Package slab is the shared L2 of a context-parallel (CP) group: one memory slab per CP rank,
// mapped by every rank (Set), and the replicated page allocator that decides which pages of
// those slabs hold which cache data (Allocator).
//
// # Replicated allocator
//
// An L2 page is addressed by Page{Slab, Index}. Every rank of the replica group holds its own
// Allocator and applies the same calls, in the same order, driven only by replicated inputs
// (the scheduler's decisions) and by the results of collectives. The replica rules:
//
//  1. Placement is a pure function of state. Reserve(id, start, k) puts page j of the range
//     (sequence page start+j) in slab (start+j) mod C — the CP rank that holds it in L1 — at
//     that slab's lowest free index. Two replicas with equal used sets pick equal pages,
//     whatever their histories.
//  2. All or nothing. A Reserve that does not fit changes nothing and returns ErrNoSpace (a
//     normal result: evict, using FreeCounts/Shortfall, and retry). Bad use (k <= 0, a range
//     larger than the pool, an unknown or duplicate id, a double free) returns a typed error
//     wrapping a sentinel (ErrBadArgument, ErrTooLarge, ErrUnknownRange, ErrDoubleFree, ...)
//     and never corrupts state.
//  3. Reserve → agree → Commit or Abort. A range is reserved while its write is in flight; the
//     group agrees (one consensus step) that the write completed on every rank, then every
//     rank Commits it; if any rank disagrees every rank Aborts it. Free releases a committed
//     range on eviction, once no rank has I/O in flight on it. Split follows a radix-node
//     split without moving pages.
//  4. The placement digest (Digest, DigestPair) is a fixed hash of the state — which pages are
//     used, by which range, committed or not — maintained in O(1) per page change. Equal
//     states give equal digests on every rank and in every run (no per-process seed). Check
//     it at every consensus step of a group larger than one rank; a mismatch means a replica
//     diverged, and L2 use must stop.
//  5. Reset (on flush, when idle) restores exactly the freshly constructed state: all pages
//     free, no ranges, nothing reserved or committed, the fresh digest.
//
// The Allocator is single-threaded, has no goroutines and no I/O.
//
// Usage loop, per scheduler step on every rank (hicache):
//
//	pages, err := alloc.Reserve(nodeID, pagesAbove, k) // ErrNoSpace: evict (alloc.Free), retry
//	// ... start the writes of pages, by their owners ...
//	d, negD := alloc.DigestPair()                       // into the step's MIN all-reduce
//	// ... after the all-reduce: every rank saw the write done -> alloc.Commit(nodeID)
//	//                           some rank failed             -> alloc.Abort(nodeID)
//	//                           min(d) != -min(negD)         -> divergence: stop L2
//
// # Slabs
//
// OpenSet creates this rank's slab, exchanges specs and handles over the group (one
// AllGather), maps every peer's slab, and agrees on the outcome (a second AllGather) so that
// every rank succeeds or every rank fails with the same error, which names the odd ranks. The
// backing shared-memory segments are anonymous (memfd, see internal/shmseg): each rank offers
// its own to the others of the group over an abstract Unix socket, to processes of the same
// user only, until every member has mapped it. They never have a name in /dev/shm, and the
// kernel frees each with the last process that maps it, so no crash, at any moment of setup
// or later, can leave one behind. The ranks of a group must share a host and a network
// namespace. The Set remembers its group (Group, Ranks): that membership is the slab group
// hicache checks against its consensus group.
//
// Backends: Host (shared memory; with Spec.PinHost every slab is also registered with CUDA
// through Spec.Pinner, and DevicePtr gives its device-visible address) and CUDAIPC (device
// memory exported with an IPC handle through Spec.DeviceBackend; one process per rank, on
// one node). slab itself is pure Go and knows no CUDA, and has no process-wide state: the
// CUDA implementation of both interfaces lives in slab/cudaslab (cudaslab.Open(dev) loads
// the driver, an error on a machine without one: skip GPU work; its Spec method names it in
// a Spec; Close it after the sets that used it). Tests pass fakes in the Spec. PinHost
// without a Pinner and CUDAIPC without a DeviceBackend are errors, never ignored.
//
// Access and ownership: page access is bounds-checked by Page{Slab, Index}. WritePage and
// ReadPage copy under the set's lock; Page hands out a slice of the mapping, exactly one page
// long, which is the only mapped memory the package exposes and is invalid after Close;
// DevicePtr gives device addresses. The set does not enforce who writes which slab (hicache's
// rule: page i of a sequence lives in slab i mod C and is written, from L1 and from storage,
// only by its owner, CP rank i mod C).
// Close unmaps everything (and frees this rank's device slab), is nil-safe and idempotent,
// and must not race with accesses; it does not close the group, which the caller owns.
//
// Usage, on every rank of the slab group:
//
//	set, err := slab.OpenSet(ctx, cpGroup, slab.Spec{Backend: slab.Host, PageSize: ps, Pages: n, Layout: desc})
//	if err != nil { ... }              // identical on every rank; names the odd ranks
//	defer set.Close()
//	alloc, _ := slab.NewAllocator(set.Size(), set.PagesPerSlab())
//	buf, _ := set.Page(slab.Page{Slab: set.Rank(), Index: i})
package slab
