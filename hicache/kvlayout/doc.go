// Package kvlayout describes the shape of an engine's KV memory: how many layers, and per
// layer the parts a token has (K and V, an MLA latent, side buffers), each with its bytes per
// token and whether attention-TP ranks split it or each hold all of it. The cache needs that
// shape to move a page between the engine's buffers and its own tiers part by part, to size
// its pages per rank, to check at open that every rank describes the same model, and to keep
// pages of another model out of its storage namespace (Fingerprint).
//
// A Layout is NumLayers layers, each holding the same Parts in the same order. A Part's
// BytesPerToken counts the whole part over all ranks; PartBytesPerToken(i, attnTP) is what one
// attention-TP rank holds (a Sharded part divided by attnTP, which must divide it; a
// Replicated part whole). A page of T tokens holds, on each rank, NumLayers × parts chunks of
// PartBytesPerToken × T bytes: PageBytes(T, attnTP) in all. A layout counts bytes, not KV
// heads: a Sharded part splits evenly by bytes, which is what an engine holds while attnTP
// divides the KV head count. Above that count engines replicate heads (SGLang gives each rank
// max(kv heads / attnTP, 1) heads), and a Sharded part's even split is not what a rank holds.
//
// How engines' memory maps onto a layout (the addresses and strides of each (layer, part) are
// not part of it: they describe where one engine keeps these bytes, and are given beside it):
//
//   - SGLang's MHA pool (MHATokenToKVPool) keeps per layer a K buffer and a V buffer indexed by
//     token slot, [slots, kv heads per rank, head dim]: parts "k" and "v", Sharded, with
//     BytesPerToken = kv heads × head dim × dtype size over the whole model; a token slot's
//     stride in either buffer is PartBytesPerToken(i, attnTP).
//   - vLLM keeps per layer one tensor [2, blocks, block size, kv heads per rank, head dim] (or
//     block-major [blocks, 2, ...], depending on the attention backend): the same two Sharded
//     parts, K at index 0 and V at index 1; a block of block-size tokens is a page, and each
//     part of a block is one contiguous chunk of PartBytesPerToken × block size bytes.
//   - MLA (SGLang's MLATokenToKVPool, DeepSeek) keeps per layer one buffer of the compressed KV
//     and the rotary key, kv_lora_rank + qk_rope_head_dim values per token: one Replicated part,
//     the same bytes on every attention-TP rank (AllReplicated), so the ranks of a TP group can
//     share one copy in the lower tiers.
//   - Side buffers that must travel with a page (a sparse-attention indexer's keys, a draft
//     model's KV for speculative decoding) are further parts: an indexer's keys Replicated, a
//     draft model's K and V Sharded like the target's. A layout has one part list for all
//     layers, so a draft model whose layer count differs from the target's is a layout of its
//     own.
//
// Contract: every function is pure and safe for concurrent use; a Layout is a value (Clone
// copies its Parts). Validate is the one definition of a usable layout: Parse, Decode and
// every size method reject what it rejects. Equal layouts have equal Encode, String and
// Fingerprint, and unequal ones unequal; Diff names the first difference. Every error wraps
// ErrBadLayout and names the part (*Error) or the token (*ParseError).
//
// Usage: an engine takes a layout from a flag (Parse: a preset name such as "llama-3-8b", or
// "layers=32;k=2048:sharded;v=2048:sharded"), sizes its per-layer buffers with
// PartBytesPerToken, and passes the layout when opening the cache; ranks compare Encode or
// Fingerprint and report Diff when they differ.
package kvlayout
