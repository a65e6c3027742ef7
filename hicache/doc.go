// Package hicache is cpcache's hierarchical KV cache for context-parallel (CP) groups: a
// radix-tree prefix cache over paged KV whose L1 is each rank's device KV pool and whose L2
// is a page pool shared by the ranks of a CP group through memory slabs (slab.Set), kept
// identical on every rank of the replica group by one consensus step per scheduler step.
//
// # Structure
//
// Core is a deterministic state machine — no goroutines, clocks, I/O or collectives: the
// radix tree (nodes are runs of whole pages with chained page hashes, usable as L3 keys),
// the replicated L1 accounting (lowest free slot first), the replicated L2 allocator
// (slab.Allocator: page i of a sequence lives in slab i mod C, written and read only by its
// owner, CP rank i mod C), the write policies, the queues of backups and loads in flight,
// and the consensus vector. Cache is the driver: it runs the core's transfers on an Engine
// (HostEngine: worker goroutines over host memory; CUDAEngine: streams and events) and its
// consensus collective on the replica group. package kvtest makes KV content checkable
// (FillKV/CheckKV) and provides an in-process L2 for tests.
//
// # Scoping by construction
//
// New takes the parallel.Layout, this rank, the consensus group and the slab set. It fails with
// ErrScope, naming both groups, if any member of the slab group is missing from the
// consensus group, or if the consensus group is not the layout's replica group (the
// attention-DP block). This rejects the historical bug — under CP8 DP2 with DP attention,
// the size-1 attention-TP group given as consensus group, so that every collective silently
// did nothing. A size-1 consensus group passes only when the layout replicates nothing.
//
// # One scheduler step
//
// Every rank of the replica group runs the same scheduler. Calls marked R are replicated:
// every rank must make them in the same order with the same arguments (they change
// replicated state); calls marked L are local.
//
//  1. For each new request: m, err := cache.Match(tokens) (R) gives the device hit (L1 pages),
//     the host hit (pages only in L2 that follow it) and the deepest node m.Last.
//     cache.Lock(m.Last) (R) pins the prefix while the request runs.
//     If the request continues beyond the hit and L3 is on: res := cache.Prefetch(tokens)
//     (R); step until !cache.PrefetchPending(res.ID) (R; RevokePrefetch (R) stops waiting),
//     then match again: the prefetched pages are host pages. cache.PrefetchWait(ctx, tokens)
//     (R) does both for a scheduler that fetches before the prefill.
//  2. If the host hit is worth it: cache.LoadBack(m.Last) (R) allocates L1 slots and starts
//     this rank's reads of its own pages; before a layer reads that prefix from L1, the
//     model calls cache.WaitL1(ctx, m.Last) (L), which waits for this rank's copies only.
//  3. After prefill: res, err := cache.Insert(tokens) (R) caches the sequence's whole pages; the
//     engine writes the KV of every res.Fill page it owns (cache.Owns(page.Index)) into its
//     L1 slot (for a host L1: cache.L1Page(slot)) before the next Step.
//     cache.Unlock(node) (R) when a request finishes; cache.EvictL1/EvictL2 (R) when the
//     scheduler needs room. cache.HintEvict (L) reports local memory pressure instead.
//  4. cache.Step(ctx) (R), exactly once per scheduler step, on every rank, even when
//     nothing is pending: backups made since the last step start; finished transfers are
//     counted (local events); one AllReduce(MIN) of a fixed-length int64 vector runs on the
//     replica group; every rank applies the same agreed result — commits the backups every
//     rank finished (aborts the first one any rank failed), finishes loads, evicts the
//     largest hinted amount — and checks the digests.
//  5. cache.Flush(ctx) (R), only when idle (Pending() == 0 and no locks; else ErrBusy and
//     nothing changes): a barrier, then the tree, L1 accounting, queues, hints and the L2
//     allocator are reset; the allocator's digest equals a fresh one on every rank. Then
//     Config.OnFlush runs (where an L3 tier clears its own state).
//
// # The consensus vector
//
// Slots (VectorLen int64s): the configuration fingerprint, the tree digest and the L2
// placement digest, each as x and -x so one MIN yields min and max; the seq of this rank's
// first unfinished backup and of its first failed one (MaxInt64 if none), the same for
// load-backs; the negated L1 and L2 eviction hints; and the L3 slots (below). Rules that
// follow from it:
//
//   - Only scheduler calls and agreed results change replicated state. A copy finishing on
//     one rank changes nothing until the step in which every rank reports it.
//   - Reserve → agree → commit or abort: a backup reserves its L2 pages at once (the
//     allocator is replicated, so every rank picks the same pages), its copies may fail on
//     one rank, and it commits or aborts on every rank at the same step.
//   - No page is freed or reused while any rank has I/O on it: nodes with a backup or load
//     in flight are not evictable, and L2 eviction takes only nodes held in L2 alone.
//   - An Insert may split a node whose backup or load-back is in flight (two requests
//     sharing a prefix in one step): its allocator range is split at the same page, both
//     halves stay in the one transfer's op, and they commit, abort or finish together at
//     the step the group agrees the transfer's seq is over. No page moves.
//   - A digest mismatch returns a *DivergedError wrapping ErrPlacementDiverged on every
//     rank, naming the step and the min/max digests. Transfers in flight are canceled and
//     drained before Step returns; no slab byte is written afterwards; nodes held only in L2
//     are dropped and the cache serves from L1 until a Flush.
//
// # L3: storage below L2
//
// With Config.Storage (a storage.Storage opened for Config.StorageNamespace; see package
// storage for file:// and redis:// URLs) the group gets a third tier that survives L2
// eviction, Flush and restarts, and is shared by every instance using the same store. One
// I/O rank per slab group (CP rank 0) does all storage traffic for its slabs, in background
// goroutines of the driver; the core only queues work and applies agreed results. Keys are
// the nodes' chained page hashes plus the slab group's TP index, in the namespace. Wiring
// it (every rank opens its own handle on the same URL):
//
//	ns, err := hicache.NewStorageNamespace(model, layout, pageTokens, pageBytes)
//	st, err := storage.Open(ctx, "redis://host:6379/cpcache", storage.Options{Namespace: ns})
//	defer st.Close() // after cache.Close
//	cfg.Storage, cfg.StorageNamespace = st, ns
//	cfg.L3 = hicache.L3Options{PrefetchPolicy: hicache.PrefetchTimeout, MinPrefetchPages: 2}
//
// The protocol, all through the same one AllReduce(MIN) per step:
//
//   - Backup: when an L2 backup commits (any write policy; not with L3Options.NoBackup),
//     the node's pages are pinned (not evictable from L2, not dropped with an ancestor)
//     and the I/O ranks write the pages storage does not hold yet. Slots: the seq of the
//     I/O rank's first unfinished backup and of its first failed one (others contribute
//     the queue end and MaxInt64); every rank unpins the agreed prefix of the queue.
//   - Prefetch: cache.Prefetch(tokens) (R) queues a query for the continuation beyond what
//     the tree holds (at most PrefetchQuotaPages pages). The I/O ranks count the leading
//     pages stored; slot i of the query slots is that count for queue entry i, or -1 while
//     unanswered (others: MaxInt64), so MIN is the count every shard holds; a query that
//     was revoked, or (timeout policy) outlived its timer, counts 0 pages. At the answer
//     step every rank reserves L2 pages for it (reserve → agree → commit or abort: nothing
//     below MinPrefetchPages, over the quota, without L2 room, or when the tree changed)
//     and the I/O ranks read them into the slabs, verifying each page, in chunks of
//     ReadChunkPages. Per read: done (MIN: all finished), pages completed so far (MIN) and a
//     cut flag (-1 when this rank's PrefetchTimeout timer expired). A read ends when all are
//     done, or when cut (timer, or RevokePrefetch under best-effort and timeout policies):
//     every rank then inserts exactly the agreed pages as an L2-only node below the prefix
//     (splitting the prefix's node if it ends inside one) and Match reports them as host
//     pages; the other reserved pages are released at once if every read has stopped, or
//     queued for release. Release slot: the seq of the I/O rank's first release whose read
//     has not stopped; every rank frees the agreed prefix of the queue, so no page is
//     reused while a read may still write it.
//   - A storage error (unreachable Redis, full disk, a torn or foreign value) is counted
//     (Stats.StorageErrors) and logged (L3Options.Log), and is a miss, a shorter read or a
//     skipped backup; it never blocks a step (storage calls run in the background, each
//     bounded by the storage's deadline) and never publishes an unverified page. A stored page that fails verification is deleted,
//     so that the next backup of it replaces it.
//   - Flush needs the L3 queues empty too (Pending counts them); it resets their seqs.
//     Storage contents survive it unless L3Options.ClearOnFlush (the I/O ranks then clear
//     the namespace).
//
// Counters: CoreStats.L3HitPages (agreed storage hits; Stats.StorageHitTokens in tokens),
// L3PrefetchedPages, L3BackedUpPages, L3FailedBackups and L3DiscardedPages are agreed;
// Stats.StorageErrors, StoragePagesRead and StoragePagesWritten are this rank's own.
//
// # Write policies
//
// WriteThrough backs a node up when inserted; WriteThroughSelective after WriteThreshold
// insertions; WriteBack when it is evicted from L1 (its L1 pages are freed once the backup
// commits). Load-back needs a host hit of at least MinLoadPages and at most LoadQuotaPages
// pages loading at once. L1 eviction takes least recently used leaves; a node with an L2
// copy becomes L2-only, other nodes are dropped (or, under WriteBack, backed up first).
//
// # Engines
//
// HostEngine copies with worker goroutines between a host L1 pool it allocates
// (Cache.L1Page) and host slabs. CUDAEngine copies between a device KV pool and pinned host
// slabs (HostPageAddr) or device slabs (DevicePageAddr), one stream per direction, each
// transfer one batched copy plus an event; its streams are non-blocking, so the model's
// writes into L1 must be complete before the Step that starts their backups.
//
// # Ownership and concurrency
//
// A Cache owns its Core and, when it made it, its engine; the caller owns the group and the
// slab set and closes them after Cache.Close. Cache methods are safe for concurrent use, but
// the replicated ones must be issued by one scheduler goroutine per rank.
package hicache
