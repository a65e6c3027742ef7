// Package workload produces the request streams that `cpcache run` serves: a built-in
// synthetic multi-turn conversation workload and replays of Mooncake-format traces.
//
// Token ids are deterministic functions of their origin (a trace block id, or a client,
// round and position), with fixed hashes and no per-process seeds, so every rank of a job
// derives the same requests from the same inputs without exchanging them, and two requests
// that share a prefix in the source share it token for token.
//
// ReuseBound and LRUBlockHits compute reference hit counts from a workload alone: the
// tokens an unlimited cache serves with requests one at a time, and what an LRU of blocks
// of a trace's hash-id size (512 tokens, 512/N at TraceOptions.Scale N) and of a given
// capacity serves.
//
// Contract: Synthetic and ReadTrace/ReadTraceFile return requests in issue order or an
// error naming the bad field or trace line (trace errors wrap ErrBadTrace); nothing is
// returned along with an error. Ownership: the returned slice and its token slices are the
// caller's; the package keeps no state.
//
// Limits: a trace is checked line by line while it streams in, before a line's tokens exist
// (MaxTraceLineBytes, MaxInputTokens, MaxOutputTokens, at most MaxInputTokens/BlockTokens
// hash_ids), and a workload holds at most MaxWorkloadTokens prompt tokens
// (TraceOptions.MaxTokens lowers it); a synthetic config is bounded so that its size is
// known, and checked, before anything is generated.
//
// Usage loop:
//
//	reqs, err := workload.Synthetic(workload.DefaultSynthetic) // or ReadTraceFile(path, opts)
//	for _, r := range reqs { /* route r, serve it */ }
package workload
