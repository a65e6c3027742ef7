// Package cudaengine is the copy engine for GPUs: L1 is a device KV pool (slot s at
// L1 + s × pageBytes) and L2 pages are resolved by an L2Addr (device slabs opened over CUDA
// IPC, or pinned host slabs by their device-visible address). Copies run through the CUDA
// driver (package cuda, loaded at run time), so this package is the one place of the
// hicache tree that needs cgo; the driver (package hicache) builds without it.
//
// Ownership: the Engine owns its streams, events and waiter goroutines; the device, the L1
// pool and the slabs stay the caller's. Each direction has Options.Streams lanes: a
// non-blocking stream on which the driver's transfers of one step (SubmitStep; split
// evenly over the lanes) are enqueued as one batch (cuMemcpyBatchAsync where the driver has
// it, else per-copy) followed by one event; a waiter finishes tickets in stream order. KV written
// into L1 must be complete before the Step that starts its backups. Close (nil-safe,
// idempotent) waits for what was enqueued and releases the lanes.
//
// Usage:
//
//	e, err := cudaengine.New(dev, l1.Ptr(), l1Pages, pageBytes, cudaengine.DevicePageAddr(set), cudaengine.Options{})
//	cache, err := hicache.New(ctx, hicache.Config{..., Engine: e})
package cudaengine
