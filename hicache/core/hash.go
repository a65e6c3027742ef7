package core

import "github.com/cpcache/cpcache/internal/mix"

// Page hashes are chained over the prefix: the hash of page j covers every token of pages
// 0..j, so it identifies the whole prefix and can key an L3 store. The function is fixed (no
// per-process seed): equal prefixes hash equally on every rank and in every run.

// RootHash is the chain value before the first page.
const RootHash uint64 = 0x243f6a8885a308d3

const fnvPrime = 0x100000001b3

// PageHash chains the hash of one page of tokens onto prev (RootHash for the first page).
func PageHash(prev uint64, page []int32) uint64 {
	x := prev ^ 0xcbf29ce484222325
	for _, t := range page {
		x = (x ^ uint64(uint32(t))) * fnvPrime
	}
	return mix.Mix64(x)
}

// PrefixHashes returns the chained hash of every whole page of tokens.
func PrefixHashes(tokens []int32, pageSize int) []uint64 {
	n := len(tokens) / pageSize
	out := make([]uint64, n)
	h := RootHash
	for i := range out {
		h = PageHash(h, tokens[i*pageSize:(i+1)*pageSize])
		out[i] = h
	}
	return out
}
