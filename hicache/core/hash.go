package core

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
)

// Page identity. The id of page j of a sequence is a cryptographic hash chained over the
// prefix and seeded by the isolation key:
//
//	root(key) = SHA-256(tagRoot ‖ len(key) as 8 bytes little endian ‖ key)
//	id_0      = SHA-256(tagPage ‖ root(key) ‖ tokens of page 0, each int32 little endian)
//	id_j      = SHA-256(tagPage ‖ id_{j-1}  ‖ tokens of page j, each int32 little endian)
//
// so it covers every token of pages 0..j and the key, and nobody can choose two prefixes
// (within one key or across keys) with equal ids: that would be a SHA-256 collision. The
// function is fixed (no per-process seed): equal prefixes under equal keys have equal ids on
// every rank and in every run, which the replicated tree and the L3 keys rely on.
//
// SHA-256 was chosen over BLAKE3 (github.com/zeebo/blake3) by measurement, hashing tag ‖ id
// ‖ page with a reused state (BenchmarkPageIDHash) on the development machine (x86-64 with
// SHA-NI, go1.26, 2 shared cores):
//
//	tokens/page   SHA-256     BLAKE3
//	16            127 ns      330 ns
//	64            259 ns      716 ns
//	256           716 ns      2557 ns
//
// (BLAKE3's SIMD pays off only across several 1 KiB chunks; a page of 16-256 tokens is one.)

// PageID is the identity of a page: its chained hash. It is comparable and fixed-size.
type PageID [32]byte

// PageIDSize is the size of a PageID in bytes.
const PageIDSize = 32

// Domain-separation tags. Part of the identity: changing them changes every id (and so
// every L3 key derived from ids).
const (
	tagRoot = "cpcache/page/root/v1\x00"
	tagPage = "cpcache/page/id/v1\x00"
)

// RootID is the chain value before the first page under the empty isolation key.
var RootID = keyRoot("")

// Index returns the first 8 bytes of id as a little-endian integer: a well-mixed 64-bit
// index (map buckets, placement digests), never an identity (two ids may share it).
func (id PageID) Index() uint64 { return binary.LittleEndian.Uint64(id[:8]) }

// Compare orders ids by their bytes (for sorted listings).
func (id PageID) Compare(o PageID) int { return bytes.Compare(id[:], o[:]) }

// IsZero reports whether id is the zero PageID (never the id of a page).
func (id PageID) IsZero() bool { return id == PageID{} }

// String returns the id in hex.
func (id PageID) String() string { return hex.EncodeToString(id[:]) }

// KeyRoot is the chain value before the first page under isolation key key. The empty key
// has its own fixed root (RootID), which a non-empty key cannot reach (its length prefix
// differs).
func KeyRoot(key string) PageID {
	if key == "" {
		return RootID
	}
	return keyRoot(key)
}

func keyRoot(key string) PageID {
	b := make([]byte, 0, len(tagRoot)+8+len(key))
	b = append(b, tagRoot...)
	b = binary.LittleEndian.AppendUint64(b, uint64(len(key)))
	b = append(b, key...)
	return sha256.Sum256(b)
}

// hasher computes page ids with a reused buffer: no allocation per page once the buffer
// has grown to a page. Not safe for concurrent use; the core keeps one (Core.hs).
type hasher struct {
	buf []byte
}

// page returns the id of page chained onto prev (KeyRoot for the first page).
func (h *hasher) page(prev PageID, page []int32) PageID {
	b := append(h.buf[:0], tagPage...)
	b = append(b, prev[:]...)
	for _, t := range page {
		b = binary.LittleEndian.AppendUint32(b, uint32(t))
	}
	h.buf = b
	return sha256.Sum256(b)
}

// PageHash returns the id of page chained onto prev (KeyRoot for the first page).
func PageHash(prev PageID, page []int32) PageID {
	var h hasher
	return h.page(prev, page)
}

// PrefixHashes returns the id of every whole page of tokens under the empty isolation key.
func PrefixHashes(tokens []int32, pageSize int) []PageID {
	return KeyPrefixHashes("", tokens, pageSize)
}

// KeyPrefixHashes returns the id of every whole page of tokens under isolation key key.
func KeyPrefixHashes(key string, tokens []int32, pageSize int) []PageID {
	var h hasher
	return h.prefix(nil, KeyRoot(key), tokens, pageSize)
}

// prefix appends to dst the ids of the whole pages of tokens chained onto prev.
func (h *hasher) prefix(dst []PageID, prev PageID, tokens []int32, pageSize int) []PageID {
	n := len(tokens) / pageSize
	dst = append(dst, make([]PageID, n)...)
	out := dst[len(dst)-n:]
	for i := range out {
		prev = h.page(prev, tokens[i*pageSize:(i+1)*pageSize])
		out[i] = prev
	}
	return dst
}

// TokenDigest is the digest of one page's tokens alone (SHA-256 of a tag and the tokens,
// each int32 little endian): what an L3 value binds besides its parent's id, so that a
// prefetch can check that the bytes it read were stored for the tokens it asked for.
func TokenDigest(page []int32) [32]byte {
	var h hasher
	return h.tokens(page)
}

// tokens is TokenDigest computed in h's buffer.
func (h *hasher) tokens(page []int32) [32]byte {
	b := append(h.buf[:0], tagTokens...)
	for _, t := range page {
		b = binary.LittleEndian.AppendUint32(b, uint32(t))
	}
	h.buf = b
	return sha256.Sum256(b)
}

// Binding is what the L3 value of a page is bound to beside its key (storage.Binding):
// the digest of the page's tokens (TokenDigest) and the id of what the page chains from
// (the previous page's id, or its isolation key's root for a sequence's first page). A
// prefetch checks it before the page enters the tree.
type Binding struct {
	Tokens [32]byte
	Parent PageID
}

// binding is the Binding of page (its tokens) chained from prev.
func (h *hasher) binding(prev PageID, page []int32) Binding {
	return Binding{Tokens: h.tokens(page), Parent: prev}
}

const tagTokens = "cpcache/page/tokens/v1\x00"

// root is KeyRoot computed in h's buffer.
func (h *hasher) root(key string) PageID {
	if key == "" {
		return RootID
	}
	b := append(h.buf[:0], tagRoot...)
	b = binary.LittleEndian.AppendUint64(b, uint64(len(key)))
	b = append(b, key...)
	h.buf = b
	return sha256.Sum256(b)
}

// MarshalText returns the id in hex (so JSON writes it as a string).
func (id PageID) MarshalText() ([]byte, error) { return hex.AppendEncode(nil, id[:]), nil }

// UnmarshalText parses the hex form MarshalText writes.
func (id *PageID) UnmarshalText(b []byte) error {
	if hex.DecodedLen(len(b)) != PageIDSize {
		return fmt.Errorf("core: page id %q: want %d hex digits", b, 2*PageIDSize)
	}
	_, err := hex.Decode(id[:], b)
	if err != nil {
		return fmt.Errorf("core: page id %q: %w", b, err)
	}
	return nil
}
