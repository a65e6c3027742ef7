// Package core is the deterministic state machine of cpcache's hierarchical KV cache — the
// place to start reading. One Core is one rank's replica of its group's cache metadata: the
// radix tree over whole pages (page ids: SHA-256 chained over the prefix and the isolation
// key, from which storage keys derive; hash.go), the L1
// accounting (one pool per CP rank, page i of a sequence in CP rank i mod C's pool, lowest
// free slot first), the replicated L2 allocator (slab/alloc: page i of a
// sequence lives in slab i mod C, owned by CP rank i mod C), the write policies, load-back
// quota, LRU eviction with deterministic ties, the queues of backups, loads and storage jobs
// in flight, the digests and the consensus vector.
//
// # Contract
//
// A Core has no goroutines, clocks, I/O, sync or cgo (TestCoreImportsNothingImpure checks
// its imports), and no per-process randomness: N replicas fed the same replicated inputs
// hold the same state and the same digests, whatever their local timing. Replicated inputs
// are the scheduler's calls (Match, Insert, Lock, Unlock, EvictL1, EvictL2, LoadBack,
// Prefetch, RevokePrefetch, Reset) and Apply's agreed vector; every rank must make them
// identically. Local inputs (Report, HintEvict, PerturbPlacement) change only what this
// rank contributes to the next vector. A Core is not safe for concurrent use: its driver
// (package hicache) serializes calls.
//
// # The boundary
//
// A driver talks to the core through four calls, in the spirit of raft's Ready/Advance, and
// read-only accessors (Config, Stats, Node, Loading, Queues, digests):
//
//	rd := c.Ready()        // after a scheduler call: transfers and storage jobs to start
//	c.Report(done)         // once per step: this rank's finished transfers and storage jobs
//	rd = c.Ready()         // once per step: the work made since
//	v := c.Vector(vec)     // once per step: this rank's vector to all-reduce
//	err := c.Apply(agreed) // the MIN over the replica group: commits, aborts, digest checks
//
// Nodes are named by Handles, checked at every call (see Handle).
//
// # The consensus vector
//
// Slots (VectorLen int64s): the configuration fingerprint, the tree digest and the L2
// placement digest, each as x and -x so one MIN yields min and max; the seq of this rank's
// first unfinished backup and of its first failed one (MaxInt64 if none), the same for
// load-backs; the negated L1 and L2 eviction hints; whether this rank is idle; and the L3
// slots (below). Rules that follow from it:
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
//     are dropped and the group is in quarantine (no hits, inserts or slab I/O) until the
//     first step at which every rank is idle, which resets every rank at once.
//
// # Load-back and eviction
//
//   - Match ends its hit at a node boundary when the hit ends inside a node held only in
//     L2: that node is split there (a storage backup in flight on it keeps pinning both
//     halves until it is acknowledged). LoadBack(Last) then loads the leading HostPages of
//     the match, bounded by the load quota left (LoadQuotaPages minus the pages loading)
//     and by the L1 pages free once unlocked leaves off the path were evicted; a node the
//     bound cuts is split and its head loads, the rest stays in L2 for a later call. A hit
//     of 3 pages of an 8-page node loads 3; a 20-page hit with a quota of 16 loads 16, then
//     4. Below MinLoadPages nothing loads.
//   - EvictL1(n) takes least recently used unlocked L1 leaves, never more than n pages: a
//     leaf longer than what is still wanted is split and gives its tail. Under write-back a
//     page without an L2 copy is backed up and its slot freed at the step that commits the
//     backup (pending); pages pending from earlier calls or hints count toward n, so a
//     request repeated while they are written starts no more.
//   - Both are splits of nodes without I/O of L1 or L2 in flight, the same on every rank
//     (the choices depend on replicated state only).
//
// # L3 (storage) in the vector
//
//   - Every rank does the storage I/O of the pages it owns (sequence page i is CP rank
//     i mod C's, in slab i mod C) with its own storage handle: its StorageJobs hold only
//     those pages, and a rank that owns none of a job's pages gets none (its share is done
//     at once). Where a slot counts leading pages, a rank contributes the prefix it vouches
//     for: the position of its first own page not done (stored, read, verified), or the
//     job's length when none is left; the MIN is the prefix every rank has done.
//   - Backup: when an L2 backup commits (any write policy; not with L3Options.NoBackup),
//     the node's pages are pinned (not evictable from L2, not dropped with an ancestor)
//     and every rank writes its pages that storage does not hold yet. Slots: the seq of
//     this rank's first unfinished backup and of its first failed one (the queue end and
//     MaxInt64 when none): a backup is done once every rank stored its part, failed when
//     any rank's part failed; every rank unpins the agreed prefix of the queue.
//   - Prefetch: cache.Prefetch(req) (R) queues a query for the continuation beyond what
//     the tree holds (at most PrefetchQuotaPages pages). Each rank counts the leading own
//     pages stored; slot i of the query slots is the prefix it vouches for, for queue entry
//     i, or -1 while unanswered, so MIN is the longest prefix every rank (and every shard)
//     holds; a query that was revoked counts 0 pages, one that (timeout policy) outlived a
//     rank's timer counts none of that rank's pages. At the answer
//     step every rank reserves L2 pages for it (reserve → agree → commit or abort: nothing
//     below MinPrefetchPages, over the quota, without L2 room, when the tree changed, or
//     when L3Config.Cost finds the read slower than the prefill: RefusedCost; a
//     continuation of which no leading part can pay off is not even queried), with
//     MeasuredReads from the read bandwidth agreed in vL3ReadRate (MIN: the slowest rank's)
//     and every rank reads its own pages into its slab, verifying each, in chunks of
//     ReadChunkPages. Per read: done (MIN: all finished), the prefix completed so far (MIN)
//     and a cut flag (-1 when this rank's PrefetchTimeout timer expired). A read ends when all are
//     done, or when cut (timer, or RevokePrefetch under best-effort and timeout policies):
//     every rank then inserts exactly the agreed pages as an L2-only node below the prefix
//     (splitting the prefix's node if it ends inside one) and Match reports them as host
//     pages; the other reserved pages are released at once if every read has stopped, or
//     queued for release. Release slot: the seq of this rank's first release whose read
//     has not stopped; every rank frees the agreed prefix of the queue, so no page is
//     reused while any rank's read may still write it.
//   - L2 as a staging area: a prefetch (or a backup into L2) that finds L2 full first evicts
//     L2-only leaves, least recently used first, then frees the L2 copies of stored L1
//     nodes (dropL2Copies): nodes whose every page storage holds (an acknowledged backup
//     to storage, or pages a prefetch inserted), with valid L1 pages and no I/O on either
//     copy, least recently used first and only those holding a page in a slab still
//     short, until the read fits. The L1 pages stay, so no hit is lost; an L1 eviction
//     then drops such a node (it has no L2 copy), and a later prefetch reads it again.
//     Under write-through every L1 page has an L2 copy, so without this rule an L2 no
//     larger than L1 (per slab against per rank, the same as the group's L2 against its
//     L1: slab c holds the pages of CP rank c's pool) holds nothing evictable once full,
//     and every prefetch would be refused for want of room (RefusedNoRoom). The choice reads
//     only replicated state (the L1 LRU order, the flags, the allocator), so every rank
//     drops the same copies; the stored flag is in the state digest. A node split while
//     its storage backup runs is stored, head and tail, once the backup is acknowledged.
//   - A storage error (unreachable Redis, full disk, a torn or foreign value) is counted
//     (hicache Stats.StorageErrors) and logged, and is a miss, a shorter read or a
//     skipped backup; it never blocks a step (storage calls run in the background, each
//     bounded by the storage's deadline) and never publishes an unverified page. A stored page that fails verification is deleted,
//     so that the next backup of it replaces it.
//   - Storage circuit: slot vL3Circuit is -1 when this rank's circuit breaker is open
//     (the driver reports it with StorageCircuit), else 0: MIN opens the circuit when any
//     rank's is open and closes it when every rank's is closed. While the agreed
//     circuit is open no prefetch starts and no backup to storage is queued (the node
//     stays in L2 without a storage copy); work already queued ends as misses or failed
//     backups. The agreed state is in the tree digest.
//   - Flush needs the L3 queues empty too (Pending counts them); it resets their seqs.
//     Storage contents survive it unless L3Options.ClearOnFlush (CP rank 0 of each slab
//     group then clears the namespace).
package core
