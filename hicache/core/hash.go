package core

import "github.com/cpcache/cpcache/internal/mix"

// Page hashes are chained over the prefix: the hash of page j covers every token of pages
// 0..j and the isolation key, so it identifies the whole prefix within its key and can key
// an L3 store. The function is fixed (no per-process seed): equal prefixes under equal keys
// hash equally on every rank and in every run.

// RootHash is the chain value before the first page under the empty isolation key.
const RootHash uint64 = 0x243f6a8885a308d3

const (
	fnvOffset = 0xcbf29ce484222325
	fnvPrime  = 0x100000001b3
)

// KeyRoot is the chain value before the first page under isolation key key: RootHash for
// the empty key (so that caches and stores without keys keep their hashes), else a 64-bit
// hash of the key's bytes (FNV-1a, finalized by mix64 and xored with RootHash). Two
// different keys share pages only if their KeyRoots are equal, which for keys an operator
// assigns happens with probability 2^-64 per pair, the same odds as two different
// prefixes colliding under one key.
func KeyRoot(key string) uint64 {
	if key == "" {
		return RootHash
	}
	x := uint64(fnvOffset)
	for i := 0; i < len(key); i++ {
		x = (x ^ uint64(key[i])) * fnvPrime
	}
	r := mix.Mix64(x^uint64(len(key))<<56) ^ RootHash
	if r == RootHash {
		r = ^r // never the empty key's root
	}
	return r
}

// PageHash chains the hash of one page of tokens onto prev (KeyRoot for the first page).
func PageHash(prev uint64, page []int32) uint64 {
	x := prev ^ fnvOffset
	for _, t := range page {
		x = (x ^ uint64(uint32(t))) * fnvPrime
	}
	return mix.Mix64(x)
}

// PrefixHashes returns the chained hash of every whole page of tokens under the empty
// isolation key.
func PrefixHashes(tokens []int32, pageSize int) []uint64 {
	return KeyPrefixHashes("", tokens, pageSize)
}

// KeyPrefixHashes returns the chained hash of every whole page of tokens under isolation
// key key.
func KeyPrefixHashes(key string, tokens []int32, pageSize int) []uint64 {
	n := len(tokens) / pageSize
	out := make([]uint64, n)
	h := KeyRoot(key)
	for i := range out {
		h = PageHash(h, tokens[i*pageSize:(i+1)*pageSize])
		out[i] = h
	}
	return out
}
