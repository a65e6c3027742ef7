// Package refmodel is a small, deterministic decoder-only transformer that is a real client
// of the cache: Llama-style blocks (RMSNorm, RoPE, grouped-query attention, SwiGLU MLP) with
// weights drawn from a seed, in three variants that exercise the KV layouts' shapes: GQA (a K
// and a V part per layer, sharded), MLA (one replicated latent part per layer that attention
// reads back through up-projections) and GQA with a side buffer (a small replicated "indexer
// key" part per layer whose dot product with the query biases every attention score).
//
// Its KV shape is a kvlayout.Layout (Model.Layout) so it maps onto kvmem buffers; it reads
// and writes KV only through a KV (TokenKV: the bytes of one part of one layer of one token
// position on this rank), so the same forward pass runs over plain memory or the cache's L1.
//
// Float determinism: a token's KV depends only on the tokens before it, and is computed by
// the same loops in the same order whatever the batch or the chunking of a prefill (no
// reduction whose order depends on how many tokens are computed together). So a prefix loaded
// from the cache is bit-identical to one recomputed, and an output difference means a data
// path fault. Every product that is summed is converted to float32 explicitly, which the Go
// spec says forbids fusing it into a multiply-add, so the arithmetic is the same on every
// architecture's compiler and in every inlined copy of a loop.
//
// Context parallelism: page i (PageTokens tokens) lives on CP rank i mod C. A rank writes the
// KV only of the pages it owns and computes, for each query and head, one attention partial
// per own page (running max, sum of exponentials, weighted values). The partials of all ranks
// are exchanged with one parallel.Group AllGather per layer and merged page by page in page
// order on every rank, so the result is bit-identical for every C and wherever a page came
// from. Everything but the attention over cached pages is computed redundantly on every rank.
package refmodel

// # The oracle
//
// The package's tests (oracle_test.go) run the model as an engine over hicache: C in-process
// CP ranks (C = 1, 2, 4), each lending the model's per-layer host buffers to its Cache
// (hicache.Config.L1 and KVLayout), serve multi-turn conversations whose prompts hold the
// previous turn's generated answer, and compare every request's generated tokens and the
// hash of its final logits with a cache-off run: they must be equal for L1 hits, for L2 hits
// (every page evicted after each request, or a small L1 evicting on its own), both L2
// layouts, every write policy and all three variants. Since the model is deterministic, any
// difference is a data-path fault; broken_test.go shows the check catches a load that swapped
// two layers, a page in its neighbour's slot, a side buffer dropped and a skipped layer wait.
//
// How an engine maps onto the same calls, per request, identically on every rank:
//   - Match the prompt; if it has host pages, LoadBack its Last and Step (the loads start),
//     then Match again for the L1 slots of the whole prefix (L1KV.Slots).
//   - Lock the prefix, run the prefill over the tokens after it with Pass.BeforeLayer
//     calling WaitL1Layer for each layer before it reads the prefix, then decode.
//   - Insert the sequence whose KV exists; write the KV of the Fill pages this rank owns into
//     their slots (L1KV.StorePage); Unlock; Step while Pending. On ErrL1Full (write-back:
//     what could be evicted is still being backed up) EvictL1, Step until idle, retry.
//
// In hicache's EngineOwned L1 mode (oracle_slots_test.go) the engine's allocator picks the
// slots instead: each rank has a free list over its L1 buffers' slots.
//   - Match, Lock the Last; make room first, from the replicated L1UsedBy of every rank, so
//     that every rank's allocator has a slot for each page from the L1 prefix on that it
//     owns (EvictL1Slots and Step until it does).
//   - Host pages: LoadBackPlan, a slot from the allocator for each, LoadBackSlots, Match
//     again, Step; the prefill waits layer by layer as above.
//   - Take a slot for each new page the rank owns before the forward pass, which writes
//     their KV there (L1KV.Slots covers them); InsertSlots with them and Match's slots.
//   - Every slot the cache lets go goes back to the allocator exactly once: InsertResult.Freed,
//     LoadResult.Freed, EvictL1Slots' slots, FreedL1 after every Step (write-back evictions
//     committing) and after Flush. The allocator checks each slot's place on every move.
