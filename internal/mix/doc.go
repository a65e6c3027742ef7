// Package mix holds the fixed 64-bit mixing function that cpcache's deterministic hashes are
// built from (the slab placement digest, workload token ids).
//
// Contract: Mix64 is a pure bijection on uint64 with full avalanche and no per-process seed;
// its values are part of the digests and token streams that ranks compare across processes
// and runs, so it must never change.
//
// Ownership: no state. Usage loop: h = mix.Mix64(h ^ part) for each part of a key.
package mix
