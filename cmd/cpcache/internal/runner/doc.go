// Package runner is `cpcache run`: a multi-rank serving simulation that drives the
// hierarchical cache the way an inference engine does, over real Gloo groups, a real
// consensus group (shared memory when a replica's ranks share a host, else Gloo) and real
// host shared-memory L2 slabs, and verifies every byte it loads back.
//
// # Contract
//
// Prepare validates a Config (layout, capacities, write policy) and loads the workload (the
// built-in synthetic multi-turn conversations, or a Mooncake trace); every error wraps
// ErrBadInput and names the bad value, so the command can exit with status 2 before any
// rank starts. Every size is bounded (limits.go), so no product of them overflows; an
// explicit rendezvous store is checked (gloo.CheckStore); URLs in errors and the report never
// show a password (internal/redact). Plan.CheckHost then checks that the local ranks fit the
// host's available memory (each rank's L1 pool, L2 slab and copy of the workload). RunRank
// then runs the calling process as one rank of the job described by the launcher's
// environment (parallel.FromEnv): every rank calls it with the same Plan. Its first
// collective compares the flags that shape the scheduler and its workload (agree.go:
// layout, capacities, policies, workload flags and a digest of the requests, virtual time
// and the cost model, storage behaviour, consensus, memory, faults) across the world, so
// that ranks started with different flags stop at once with a bad input naming the flag and
// both values instead of waiting for each other until a step deadline.
//
// Requests go to DP replicas by Route: client mod attn_dp for synthetic conversations (every
// turn meets its history), a hash of the first trace block (512 tokens, 512/N at --trace-scale N)
// mod attn_dp for traces (requests sharing a first block meet in one cache). Every rank of a replica runs the same
// scheduler (sim/sched) on the same requests; each scheduler step decodes one token of every running
// request (inserting a finished request with its answer and releasing it), admits queued
// requests within a token budget and the L1 pages left (match, lock, load the L2 part back,
// wait for this rank's copies and check every loaded page it owns against kvtest's content,
// "compute" the missing pages — each CP rank writes the pages it owns, as a function of
// the page's prefix hash, position and the rank's TP shard — and insert), then makes
// exactly one consensus step. An insert or a load-back that finds L1 full first steps until
// no copy is in flight (pages are freed only once their copies are over) and tries again,
// so that what is evicted, the hits and the virtual times follow replicated decisions, not
// the host's copy speed. The consensus group is wrapped in parallel.Count, and the report
// states the collectives per scheduler step (less those of Flush calls a fault makes), which
// must be exactly 1.
//
// # Virtual time
//
// Each replica keeps a virtual clock (sim/vtime), the same on every rank because it advances
// only from replicated decisions. With TimeVirtual (the default for traces) a request is
// admitted only once the clock reached its trace timestamp (divided by Speed), and when
// nothing runs the clock jumps to the next arrival; with TimeNone every request arrives at 0
// and they are served back to back. Each scheduler step advances the clock by its modelled
// duration from a CostProfile (sim/vtime: prefill per computed token plus a quadratic attention
// term, decode per step and per running request, L2→L1 loads and L1→L2 backups from page
// bytes and bandwidth, storage latency and bandwidth). Nothing sleeps. From the clock the
// report gives TTFT and queueing quantiles, prefill tokens computed and throughput; the same
// figures with the cache off come from simulateNoCache: the same scheduler over a cache that
// holds nothing (sched.CacheOff, over sched.NullCache) under the same costs, so "TTFT saved"
// needs no second run.
//
// # Miss attribution and references
//
// A replica's leader keeps a sched.MissTracker (an observer of its scheduler) that observes
// which pages were inserted, which are answers of running requests, and what each match
// found, and counts every missed prompt token under one cause (report.MissCauses:
// compulsory, capacity in L1 or L2,
// in flight, quarantined, storage, partial page); the causes sum to the tokens missed. The
// report sets them beside references computed from the workload alone (workload.ReuseBound,
// the unlimited-capacity bound, and workload.LRUBlockHits, an LRU of the trace's blocks of the
// same capacity). A sweep (ParseSweep; sim/report's SweepResult and WriteSweepTable) is one
// run per value of a parameter; report.WriteHTML draws a run (and a sweep) as a
// self-contained HTML page of inline SVG charts made with gonum.org/v1/plot. The figures,
// text, JSON and HTML of a report are package sim/report's.
//
// # Storage (L3)
//
// With Config.Storage (a storage URL: file:///dir, redis://host:port/prefix) every rank
// opens its own handle in the run's namespace (hicache.NewStorageNamespace of the kvtest
// content, the page size in tokens and bytes, and the attention-TP size: runs of another
// shape never read these pages; runs differing only in CP or DP size share them) and the
// cache gets its L3 tier: CP rank 0 of each slab group backs committed L2 pages up and
// reads prefetches. Prepare opens and closes the storage once, so a bad URL, an
// unreachable server or a missing or unsafe MAC key file is a bad input; before serving,
// the ranks compare their storage key fingerprints (job.Open) and stop with a bad input if
// they differ. With StorageClear, world rank 0 clears the namespace and every rank waits
// for its outcome, agreed over the world, before its cache starts.
//
// Prefetch overlaps decoding: when a queued request's prompt continues beyond its L1 and L2
// hit, the scheduler locks the matched prefix and calls Prefetch, and the request waits in
// the queue — every other request but its conversation's later turns keeps being admitted
// and decoded — until the prefetch is over (PrefetchPending false) and, in virtual time, its
// modelled read time has passed; then it is admitted, and the pages inserted from storage
// are host pages, loaded back into L1 and verified like any L2 page. The requests waiting
// for prefetches hold at most the cache's prefetch quota of prompt pages (the first always
// asks; the others wait their turn in queue order), and from the end of its read to its
// prefill a request's match stays locked, so that what was read is served. These holds pin
// L1 pages no admission accounts for: an insert or a load-back that finds L1 full releases
// them, and none is taken again until a step in which nothing wanted room, so that the call
// is retried with no hold in its way (what was lost meanwhile is read again). A step that
// moves nothing with nothing in flight ends the run with a "no progress" error, on every
// rank at the same step; while requests wait for prefetches, after maxQuietSteps (sim/sched)
// such steps in a row.
// Prefetches of a shared prefix asked together are read once; a request whose prefetch
// gained pages and whose prompt goes on asks again for the rest; stored pages the cache
// refused (no L2 room, quota, a changed tree, a duplicate read; Cache.PrefetchOutcome) are
// asked for again once an admission or a finish changed the room, up to
// maxPrefetchAttempts (sim/sched) times; what is still refused, and what a read cut or lost
// (the PrefetchTimeout timer, a revoke, a storage error), is counted in the report (the
// refused pages by cause: report.RefusedPages), never computed silently. A load-back
// longer than the cache's load quota is loaded in parts. With TimeConfig.PrefetchSync the scheduler instead waits for a prefetch, for comparison, in
// scheduler steps in which running requests decode nothing (counted in PrefetchSteps; each
// makes its one consensus step). Prompt tokens served from prefetched pages are counted as
// storage hits (HitL3), not L2 hits; the report adds them, the agreed pages prefetched and
// backed up (per replica, from its leader), and the storage errors and pages read and
// written summed over ranks (each rank does the storage I/O of the pages it owns).
//
// A bad page does not stop the run: it is counted, named (request and page) and makes
// RunRank return an error wrapping ErrIntegrity after the report. A placement divergence
// quarantines the group (no hits) until its agreed recovery, or fails the run with
// Config.Strict. A lost peer or a failed collective fails the rank at once.
//
// # The reference model (--engine model)
//
// With Config.Engine EngineModel the reference transformer of sim/refmodel does the compute
// (modelEngine, the scheduler's sched.Engine) instead of kvtest's bytes: Config.Model is its
// KV layout (Config.ModelVariant: gqa, mla, side), each rank's per-layer L1 holds the KV of
// the pages it owns, and the model merges its attention partials over the rank's
// attention-CP group (job.Rank.Groups), not the counted consensus group, so a step still
// makes exactly one consensus collective. A synthetic turn's prompt holds the answer the
// model generated for the previous turn (the workload's placeholder answer of the same
// length replaced before admission); token t of the workload is the model's t mod its
// vocabulary. A prefill reads the cached prefix from L1 (after WaitL1Layer for each layer
// when pages were loaded) and computes only the tokens after it; each decode step computes a
// token; the pages an insert asks for are stored from the model's KV. When a request
// finishes, the same request is computed without the cache (from its first token, over
// plain memory, on the same CP group) and its generated tokens and final-logits hash are
// compared: sched.Counts' OutputsChecked and OutputsDiffering, the report's Model. A
// differing output is counted and named like a bad page (ErrIntegrity after the report).
//
// # Device memory (--device cuda)
//
// With Config.Device DeviceCUDA every rank loads the CUDA driver, picks its device
// (SelectDevice: Config.CUDADevice, else LOCAL_RANK mod the device count; the ranks agree
// over the world that every one of them has one before any slab is made), allocates its L1
// pool in device memory and runs the cache on a cudaengine.Engine whose L2 addresses are
// the slab pages' device pointers (cudaengine.DevicePageAddr): CUDA IPC device slabs
// (L2Device) or host slabs registered with the driver (L2Host, whose device pointer is used,
// never the host pointer). The scheduler reaches L1 through a pinned staging page: computed
// KV is copied to the device, and every page loaded back is copied to the host and checked.
// Each rank times its engine's transfers (bytes over the time a transfer was in flight, per
// direction) and rank 0 adds a large copy of the same directions as the baseline; the
// report's Device section states devices, memory kinds and both bandwidths.
//
// # Ownership and output
//
// RunRank opens (job.Open) and closes the world, layout groups, consensus group, device
// memory (L1 pool, driver), slab set, engine and cache of its process (closed in reverse
// order). At
// the end the ranks gather their results over the world group and rank 0 builds the
// Report: per-replica counts (requests, tokens, steps) once per replica, page and check
// counts summed over ranks. When EnvStatusDir is set (by `cpcache run` starting its own
// ranks) every rank writes a status file and a metrics file (its metrics.Collector and
// runner counters, protobuf) there and rank 0 the report, and the starting process draws
// the progress, serves the ranks' metrics with its own Go and process collectors (a
// Watcher) and prints the report; otherwise (under mpirun or torchrun) rank 0 does that
// itself, with its own metrics only.
//
// # Usage
//
//	plan, err := runner.Prepare(cfg)     // exit 2 on error
//	rep, err := runner.RunRank(ctx, plan, runner.Output{Progress: os.Stderr})
//	if rep != nil { rep.WriteText(os.Stdout) } // rank 0
package runner
