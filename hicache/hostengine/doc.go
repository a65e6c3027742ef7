// Package hostengine is the copy engine for host memory: an L1 pool it allocates (one
// []byte of l1Pages × pageBytes) and host-mapped L2 slab pages (engine.HostSlabs: slab.Set
// over shared memory, or kvtest.MemSlabs), copied by worker goroutines. It is what the
// hicache driver uses when no Engine is given, and what CPU tests and `cpcache run` run on.
//
// Ownership: the Engine owns its L1 pool and goroutines; the slabs stay the caller's. Submit
// queues a transfer and returns its ticket at once; workers take transfers in order and
// finish each ticket with nil, a copy error, ErrCanceled (Cancel before it started) or
// ErrClosed. Close (nil-safe, idempotent) cancels what has not started and waits for what
// runs. NewKV is the layered mode: the L1 is the engine's own per-(layer, part) buffers (a
// *kvmem.L1, host memory) and the slabs' pages are in a kvmem.L2Layout; each transfer copies
// layer 0 of every page, then layer 1, ..., gathering or scattering chunk by chunk, and its
// ticket (engine.NewLayeredTicket) finishes each layer as it lands. Options.Delay and Options.Fail let tests model slow or failing copies per rank.
package hostengine
