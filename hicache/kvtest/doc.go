// Package kvtest makes KV-cache content checkable: the bytes of a page are a fixed function
// of the page's chained prefix hash, its sequence position and the rank's shard, so a page
// that was written to or read from the wrong place is caught by CheckKV. hicache's tests and
// the multi-rank runner fill pages with FillKV where an engine would write computed KV, and
// check every page they read back. A page of a layered shape (kvmem) has content per chunk,
// a function of (page hash, index, layer, part, TP shard) and the position in the chunk:
// FillL1Page/CheckL1Page on an engine's per-layer L1 slot, FillPageFirst/CheckPageFirst on
// page-first bytes; a swapped layer or part is a bad page, and the *ChunkError names the
// layer, part and byte offset of the first bad byte (found word by word). MemSlabs is an in-process L2 (one byte slice per slab) for
// tests that run many ranks in one process.
//
// Contract: FillKV and CheckKV are pure functions of (page hash, index, shard, length);
// CheckKV's error names the first wrong byte. MemSlabs implements hicache's SlabSet and
// HostSlabs for the ranks of one slab group.
//
// Ownership: FillKV writes only into the slice it is given. A MemSlabs is shared by every
// in-process rank of its slab group; its Close is nil-safe and idempotent.
//
// Usage: after an Insert, each rank calls FillKV(l1Page, f.Hash, f.Index, shard) for every
// fill page it owns; after a match (and WaitL1), CheckKV on every device page it owns.
package kvtest
