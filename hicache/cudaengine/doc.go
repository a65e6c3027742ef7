// Package cudaengine is the copy engine for GPUs. Its L1 is either a flat device KV pool
// (New: slot s at L1 + s × pageBytes, a page an opaque blob) or the inference engine's own
// KV memory (NewKV: a device buffer per (layer, part), token-slot indexed like SGLang or
// block-major like vLLM: the device form of a kvmem.L1, KVOf). L2 pages are resolved by an L2Addr
// (device slabs opened over CUDA IPC, or pinned host slabs by their device-visible address)
// and, with a KV L1, laid out page_first or layer_first. Copies run through the CUDA driver
// (package cuda, loaded at run time), so this package is the one place of the hicache tree
// that needs cgo; the driver (package hicache) builds without it.
//
// With a KV L1 a page is copied as chunks: for each layer and part, the page's P tokens of
// that part at its L1 slot (one copy when the buffer's tokens are packed, one per token when
// TokenStride is larger; copies that continue each other on both sides are merged) and one
// contiguous chunk of the L2 page. A load is enqueued layer 0 of every page of the step's
// transfers first, with an event recorded after each layer, and its ticket is layered: layer
// i finishes when layer i's event completes, in order. WaitLayerOn (engine.StreamWaiter)
// makes the inference engine's compute stream wait for layer i's event (cuStreamWaitEvent)
// without blocking the host thread, so layer i's attention runs while layer i+1 copies.
// Backups stay one copy call and one event per group.
//
// Ownership: the Engine owns its streams, events and waiter goroutines; the device, the L1
// memory and the slabs stay the caller's. Each direction has Options.Streams lanes: a
// non-blocking stream on which the driver's transfers of one step (SubmitStep; split
// evenly over the lanes) are enqueued as one batch per layer of the group's tickets
// (cuMemcpyBatchAsync where the driver has it, else per-copy), each followed by an event; a
// waiter finishes tickets in stream order. KV written into L1 must be complete before the
// Step that starts its backups. Close (nil-safe, idempotent) waits for what was enqueued and
// releases the lanes.
//
// Usage:
//
//	e, err := cudaengine.New(dev, l1.Ptr(), l1Pages, pageBytes, cudaengine.DevicePageAddr(set), cudaengine.Options{})
//	cache, err := hicache.New(ctx, hicache.Config{..., Engine: e})
//
//	// the engine's own memory (a kvmem.L1 of device buffers), layer-wise loads:
//	kv, err := cudaengine.KVOf(l1, kvmem.PageFirst, set.PagesPerSlab(), cudaengine.DevicePageAddr(set))
//	e, err := cudaengine.NewKV(dev, kv, cudaengine.Options{})
//	err = e.WaitLayerOn(ticket, layer, torchStream.cuda_stream) // before layer's attention
package cudaengine
