// Package job assembles one rank of a cpcache job: Open makes, in order, the world (a Gloo
// world over the rendezvous store, or a given in-process one), the caller's start agreement,
// the layout groups, the consensus group (counted), the CUDA device and the L1 pool, the L2
// slabs, the copy engine, the L3 storage with its MAC-key agreement and an optional clear by
// rank 0, and the cache (hicache.New). `cpcache run` (cmd/cpcache/internal/runner), the C ABI
// (cmd/libcpcache) and the in-process test rigs open their ranks through it.
//
// No rank acts alone (the design's failure model): every step that can fail on one rank
// (CUDA, the L1 pool and engine, the storage, its clear) is agreed by every rank of the
// world before the next collective, so that every rank returns an error naming the failing
// rank and its cause instead of waiting for a peer that left. Values no rank could use are
// refused, naming them, before any collective.
//
// With Config.KVEvents the replica's leader then publishes its KV events (Rank.Events, the
// start agreed by every rank); every rank gets its metrics registry (Rank.Metrics,
// MetricsText), served on Config.MetricsAddr when set.
//
// (*Rank).Close releases everything in the reverse order of creation.
package job
