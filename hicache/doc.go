// Package hicache is cpcache's hierarchical KV cache for context-parallel (CP) groups: a
// radix-tree prefix cache over paged KV whose L1 is each rank's device KV pool and whose L2
// is a page pool shared by the ranks of a CP group through memory slabs (slab.Set), kept
// identical on every rank of the replica group by one consensus step per scheduler step.
//
// # Structure
//
// The cache is four layers, each its own package, and this one drives them:
//
//   - hicache/core: the deterministic state machine — the radix tree (nodes are runs of
//     whole pages with their page ids, 256-bit chained hashes from which L3 keys derive), the replicated L1
//     accounting, the replicated L2 allocator (slab/alloc), the write policies, the queues of
//     transfers and storage jobs in flight, the digests and the consensus vector. No
//     goroutines, clocks, I/O, sync or cgo (a test checks its imports). Start reading there.
//   - hicache/engine: the copy-engine interface (Engine, Ticket); hicache/hostengine copies
//     host memory with goroutines, hicache/cudaengine (the one package of this tree that
//     needs cgo, through package cuda) copies with CUDA streams and events.
//   - package storage: the L3 interface (Storage, keys, the value format), reached through
//     this package's storage driver; the backends are package storage/stores, which the
//     caller opens and hands to New (Config.Storage).
//   - hicache (this package), the driver: Cache runs the core's transfers on an Engine, this
//     rank's storage jobs on its storage handle, and its consensus collective on the replica
//     group. It talks to the core only through its boundary — Ready (work to start), Vector
//     (the vector to reduce), Report (local completions), Apply (the agreed vector) — and
//     never reads its fields. Nodes are named by checked handles (Handle), and their state
//     comes as copies (NodeInfo, MatchResult). Types of the core that a scheduler needs are
//     aliased here (Handle, MatchResult, Options, ...), so a scheduler imports this package
//     alone.
//
// This package depends on the standard library, the project, golang.org/x/sys and the
// page MAC's hash only (TestDriverDependsOnNothingExternal): storage clients and Prometheus
// (package hicache/metrics) are linked only by the programs that use them.
//
// Package hicache/kvtest makes KV content checkable (FillKV/CheckKV) and provides an
// in-process L2 for tests; package hicache/kvevents publishes the KV events of
// Cache.Subscribe in vLLM's wire format.
//
// # Scoping by construction
//
// New takes the parallel.Layout, this rank, the consensus group and the slab set. It fails with
// ErrScope, naming both groups, if any member of the slab group is missing from the
// consensus group, or if the consensus group is not the layout's replica group (the
// attention-DP block). This rejects, for example, the size-1 attention-TP group given as
// consensus group under CP8 DP2 with DP attention, with which every collective would
// silently do nothing. A size-1 consensus group passes only when the layout replicates
// nothing.
//
// # One scheduler step
//
// Every rank of the replica group runs the same scheduler. Calls marked R are replicated:
// every rank must make them in the same order with the same arguments (they change
// replicated state); calls marked L are local.
//
//  1. For each new request, req := Request{Tokens: prompt, Key: isolationKey} (the empty key
//     unless tenants or adapters must not share pages): m, err := cache.Match(req) (R) gives
//     the device hit (L1 pages), the host hit (pages only in L2 that follow it) and the
//     deepest node's handle m.Last (a hit that ends inside a node held only in L2 splits it
//     there, so m.Last's prefix is the hit). cache.Lock(m.Last) (R) pins the prefix while
//     the request runs.
//     If the request continues beyond the hit and L3 is on: res := cache.Prefetch(req)
//     (R); step until !cache.PrefetchPending(res.ID) (R; RevokePrefetch (R) stops waiting),
//     then match again: the prefetched pages are host pages. cache.PrefetchWait(ctx, req)
//     (R) does both for a scheduler that fetches before the prefill.
//  2. If the host hit is worth it: cache.LoadBack(m.Last) (R) allocates L1 slots for the
//     leading m.HostPages, at most the load quota left (Options.LoadQuotaPages, half of the CP group's L1
//     by default, minus the pages loading) and what L1 can free (a node the bound cuts is
//     split, its head loads: at CP1 a 20-page hit with L1 of 32 loads 16, then 4 at the next
//     call); res.Pages says how many. This
//     rank's reads of its own pages start at the next Step. The scheduler then waits until
//     cache.LoadPending(m.Last) (R) is false — the group agreed the loads are over; a copy
//     that failed on any rank has made its node stale on every rank — and matches again:
//     every rank gets the same hit. Before a layer reads that prefix from L1, the model
//     calls cache.WaitL1(ctx, m.Last) (L), which waits for this rank's copies only.
//  3. After prefill: res, err := cache.Insert(req) (R) caches the sequence's whole pages; the
//     engine writes the KV of every res.Fill page it owns (cache.Owns(page.Index)) into its
//     L1 slot (for a host L1: cache.L1Page(slot)) before the next Step. Each rank's L1 holds
//     only the pages it owns (page i on CP rank i mod C): a slot is one of the owner's pool,
//     so a node of n pages takes about n/C slots of each rank, and Match's L1Slots are -1
//     for the pages this rank does not own.
//     cache.Unlock(node) (R) when a request finishes; cache.EvictL1/EvictL2 (R) when the
//     scheduler needs room: EvictL1(n) never takes more than n pages, and returns those
//     freed now and (write-back) those pending, freed at the step that commits their
//     backup; pending pages of earlier calls count toward n, so repeating a request while
//     they are written starts no more. cache.HintEvict (L) reports local memory pressure
//     instead.
//  4. cache.Step(ctx) (R), exactly once per scheduler step, on every rank, even when
//     nothing is pending: finished transfers are counted (local events); one AllReduce(MIN)
//     of a fixed-length int64 vector runs on the replica group, without the cache's mutex
//     (local calls answer meanwhile); every rank applies the same agreed result — checks the
//     digests, commits the backups every rank finished (aborts the first one any rank
//     failed), finishes loads, evicts the largest hinted amount — and only then starts the
//     backups and loads chosen since the last step: no slab byte is written from a state the
//     digests have not checked.
//  5. cache.Flush(ctx) (R), only when idle (Pending() == 0 and no locks; else ErrBusy and
//     nothing changes): a barrier (in quarantine, where idleness may differ across ranks,
//     an AllReduce that agrees it instead), then the tree, L1 accounting, queues, hints and the L2
//     allocator are reset; the allocator's digest equals a fresh one on every rank. With
//     L3Options.ClearOnFlush CP rank 0 of each slab group then clears the storage namespace.
//
// # Failures are agreed
//
// No rank acts alone. New's first collective carries each rank's start failure, so every
// rank returns the same *StartError; AgreeStart gives a job's other construction steps
// (opening a storage, checking host memory) the same agreement. A copy that fails on one rank is reported in the vector
// and aborts the backup, or makes the loaded node stale, on every rank at the same step.
// A digest mismatch (configuration, tree or placement) returns a *DivergedError on every rank
// at the same step and puts the group into quarantine: Match serves no hit, Insert caches
// nothing, no slab I/O starts, running requests finish with the L1 pages they hold; at the
// first step at which every rank is idle the group resets at once (Stats.Recoveries) and
// caching resumes. Digests are checked at every step. Only process death ends a rank alone,
// and the groups turn it into parallel.ErrPeerLost on every survivor within the deadline.
//
// # The consensus vector
//
// What the one AllReduce(MIN) of a step carries, and the rules that follow from it (reserve
// → agree → commit or abort; nothing freed while any rank has I/O on it; splits of nodes
// with I/O in flight; divergence), are the core's: see package core.
//
// # L3: storage below L2
//
// With Config.Storage (a storage.Storage opened for Config.StorageNamespace; see package
// storage for file:// and redis:// URLs) the group gets a third tier that survives L2
// eviction, Flush and restarts, and is shared by every instance using the same store. Every
// rank does the storage traffic of the pages it owns (sequence page i is CP rank i mod C's,
// in its slab) with its own storage handle, in background goroutines of the driver: it
// checks, reads and verifies, and writes only those, so a CP group of C ranks has C
// clients' bandwidth and no rank carries the group's bytes. The core only queues work and
// applies agreed results: the stored length of a prefix is the longest one every rank
// holds, a read inserts the longest prefix every rank verified, and a backup is done once
// every rank stored its part. Keys derive from the pages' 256-bit ids plus the slab group's
// TP index (storage.PageKey), in the namespace; each value also binds its page's token
// digest and its parent's id, which a prefetch checks (storage.Binding) (not the CP rank or size: a store filled by a CP1 job
// serves a CP4 job, and back). Wiring it (every rank opens its own handle on the same URL,
// with the same MAC key: a shared Redis needs one, see package storage):
//
//	ns, err := hicache.NewStorageNamespace(model, layout, pageTokens, pageBytes, kvLayout) // kvLayout: Config.KVLayout, or nil
//	st, err := stores.Open(ctx, "redis://host:6379/cpcache", storage.Options{Namespace: ns, MACKeyFile: "/etc/cpcache/storage.key"})
//	defer st.Close() // after cache.Close
//	cfg.Storage, cfg.StorageNamespace = st, ns
//	cfg.L3 = hicache.L3Options{PrefetchPolicy: hicache.PrefetchTimeout, MinPrefetchPages: 2}
//
// The protocol (backups to storage, prefetch queries and reads, releases of cut reads) runs
// through the same one AllReduce(MIN) per step; package core documents its slots. A storage
// error (unreachable Redis, full disk, a torn or foreign value) is counted
// (Stats.StorageErrors) and logged (L3Options.Log), and is a miss, a shorter read or a
// skipped backup; it never blocks a step (storage calls run in the background on each
// rank) and never publishes an unverified page. Storage contents survive a Flush unless
// L3Options.ClearOnFlush. Each storage call is bounded by L3Options.CallTimeout; after
// CircuitFailures consecutive failed calls of a rank, or its first one past the deadline,
// that rank's circuit breaker opens, the group agrees it at the next step and stops queueing
// prefetches and backups (serving from L1 and L2), and every rank whose breaker is open
// probes the store with backoff (one Exists, in the background) until it answers; the group
// agrees the circuit closed once every rank's breaker is (Stats.StorageCircuitOpen,
// StorageCircuitOpenSeconds).
//
// L3Options.PrefetchCost makes prefetches cost-aware: a stored continuation is read only when
// reading it (latency + each I/O rank's pages at its bandwidth) is faster than its prefill
// (per token plus attention over the tokens before it), else it is skipped for cost
// (RefusedCost, CoreStats.L3CostSkippedPages) and the engine computes it; a continuation of
// which no leading part can pay off is not even asked about (PrefetchResult.CostSkipped).
// The engine gives its prefill costs; the read bandwidth is given, or with MeasuredReads
// follows what the I/O ranks measure (an EWMA of their completed reads, Stats.
// StorageReadRateLocal), agreed through the vector as the slowest rank's (Stats.
// StorageReadRate), so that every rank decides alike:
//
//	cfg.L3.PrefetchCost = hicache.PrefetchCost{ComputeNsPerToken: 5070, AttentionNsPerTokenPair: 0.166,
//		StorageLatencyNs: 100e3, StorageBytesPerNs: 7, PageBytes: 16 * 131072, MeasuredReads: true}
//
// # Fault injection
//
// Config.Faults (nil by default: one nil check per failpoint) injects failures on one rank:
// an error in New, a copy reported failed at completion, a tree or placement perturbation
// before a step's vector; stores.WithFaults makes a storage hang or fail. cpcache run
// --fault uses both; every injected failure must end as the failure model above says.
//
// Counters: CoreStats.L3HitPages (agreed storage hits; Stats.StorageHitTokens in tokens),
// L3PrefetchedPages, L3BackedUpPages, L3FailedBackups and L3DiscardedPages are agreed;
// Stats.StorageErrors, StoragePagesRead and StoragePagesWritten are this rank's own (its
// pages only: sum them over the ranks for a group's storage traffic).
//
// # Metrics
//
// Package hicache/metrics exports a rank's Stats to Prometheus:
// metrics.NewCollector(cache, metrics.RankLabels(layout, rank), storage) is a
// prometheus.Collector (cpcache_ names, labels rank, replica and slab_group, a histogram of
// the consensus latency fed from Stats.ConsensusLatency) that the engine registers.
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
// With no Config.Engine the Cache makes a hostengine.Engine: worker goroutines copying
// between a host L1 pool it allocates (Cache.L1Page) and host slabs. A GPU engine passes a
// cudaengine.Engine: copies between a device KV pool and pinned host slabs
// or device slabs, both by device address (cudaengine.DevicePageAddr), one stream per
// direction, each transfer one batched copy plus an event; its streams are non-blocking, so
// the model's writes into L1 must be complete before the Step that starts their backups.
//
// # Ownership and concurrency
//
// A Cache owns its core and, when it made it, its engine; the caller owns the group and the
// slab set and closes them after Cache.Close. Cache methods are safe for concurrent use, but
// the replicated ones must be issued by one scheduler goroutine per rank.
package hicache
