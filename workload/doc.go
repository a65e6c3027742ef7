// Package workload produces the request streams that `cpcache run` serves: a built-in
// synthetic multi-turn conversation workload and replays of Mooncake-format traces.
//
// Token ids are deterministic functions of their origin (a trace block id, or a client,
// round and position), with fixed hashes and no per-process seeds, so every rank of a job
// derives the same requests from the same inputs without exchanging them, and two requests
// that share a prefix in the source share it token for token.
package workload
