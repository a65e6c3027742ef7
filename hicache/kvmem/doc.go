// Package kvmem describes an engine's KV memory as the cache moves it: the Shape of a page on
// one rank (a kvlayout.Layout at an attention-TP degree and a page size in tokens), the
// engine's L1 as per-(layer, part) buffers with strides (L1: SGLang's token-slot buffers,
// vLLM's block-major tensors, host or device memory, lent by the engine), the two layouts of
// an L2 slab (PageFirst: a page holds every layer, the L3 value; LayerFirst: a slab holds per
// layer that layer of all its pages), the address of every chunk in each, and host
// gather/scatter of one page between an L1 slot and an L2 page.
//
// A chunk is the P tokens of one part of one layer of one page: ChunkBytes(part) =
// P × the part's bytes per token on this rank. Within a layer the parts follow the layout's
// order; within a page (page-first) the layers follow in order.
//
// Contract: Shape and L1 are immutable once made and safe for concurrent use; NewL1 checks
// the description (every (layer, part) exactly once, all host or all device, strides at least
// the part's bytes, each buffer big enough for its slots, no two buffers overlapping) and its
// errors are *Error wrapping ErrBadL1, naming the layer and part. Gather and Scatter read and
// write only the chunks of the slot and page they are given; concurrent calls on different
// slots and pages are safe.
//
// Ownership: the buffers' memory stays the engine's; an L1 only records where it is.
package kvmem
