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
// path fault.
//
// Context parallelism: page i (PageTokens tokens) lives on CP rank i mod C. A rank writes the
// KV only of the pages it owns and computes, for each query and head, one attention partial
// per own page (running max, sum of exponentials, weighted values). The partials of all ranks
// are exchanged with one parallel.Group AllGather per layer and merged page by page in page
// order on every rank, so the result is bit-identical for every C and wherever a page came
// from. Everything but the attention over cached pages is computed redundantly on every rank.
package refmodel
