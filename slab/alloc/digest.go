package alloc

import "github.com/cpcache/cpcache/internal/mix"

// The placement digest is the wrapping sum, over every used page, of a fixed 64-bit hash of
// (slab, index, range, committed), plus a constant derived from the pool's shape. Addition is
// commutative, so the digest depends only on the set of used pages and their owners, not on
// the order of operations; each page change adds or subtracts one term, so maintenance is
// O(1) per page. The hash has no per-process seed: equal states give equal digests on every
// rank and in every run.

const (
	digestPageKey      = 0x9e3779b97f4a7c15
	digestRangeKey     = 0xc2b2ae3d27d4eb4f
	digestCommittedKey = 0x165667b19e3779f9
	digestShapeKey     = 0xd6e8feb86659fd93
)

// rangeKey is the part of a page's term that depends on its range (hoisted out of loops).
func rangeKey(id RangeID) uint64 { return mix.Mix64(uint64(id) ^ digestRangeKey) }

// pageBase combines a page's address with its range key; the term is mix.Mix64 of it (xor the
// committed key for committed pages).
func pageBase(p Page, rk uint64) uint64 {
	return mix.Mix64(uint64(uint32(p.Slab))<<32|uint64(uint32(p.Index))+digestPageKey) ^ rk
}

func termOf(base uint64, committed bool) uint64 {
	if committed {
		base ^= digestCommittedKey
	}
	return mix.Mix64(base)
}

// freshDigest is the digest of an all-free pool of the given shape.
func freshDigest(slabs, pagesPerSlab int) uint64 {
	return mix.Mix64(mix.Mix64(uint64(slabs)+digestShapeKey) ^ uint64(pagesPerSlab))
}
