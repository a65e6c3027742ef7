package storage

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
)

// NamespaceSize and KeySize are the sizes of a Namespace ID and a Key in bytes.
const (
	NamespaceSize = 8
	KeySize       = NamespaceSize + 16
)

// Domain-separation tags. They are part of the on-storage format: changing them orphans
// every stored page.
const (
	nsTag    = "cpcache/storage/namespace/v1\x00"
	keyTag   = "cpcache/storage/key/v1\x00"
	chainTag = "cpcache/storage/chain/v1\x00"
	pageTag  = "cpcache/storage/page/v2\x00"
)

// Namespace is the identity of everything that makes two pages with the same token prefix
// incompatible: model, KV layout, dtype, page size, CP/TP shape... It is derived from an
// identity string by a fixed hash (SHA-256, no per-process seed), so every process that
// builds the same identity string gets the same Namespace. Keys of different namespaces
// never collide, and a Storage opened for one namespace rejects keys of another.
type Namespace struct {
	id   [NamespaceSize]byte
	name string
}

// NewNamespace derives a Namespace from identity, which must be non-empty. Callers should
// include everything that changes the bytes of a page, e.g.
// "model=llama3-8b;dtype=bf16;layout=mla;page_tokens=64;page_bytes=65536".
func NewNamespace(identity string) (Namespace, error) {
	if identity == "" {
		return Namespace{}, &OpError{Backend: "key", Op: "namespace", Kind: ErrBadArgument, Err: errors.New("empty identity string")}
	}
	h := sha256.New()
	h.Write([]byte(nsTag))
	h.Write([]byte(identity))
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	ns := Namespace{name: identity}
	copy(ns.id[:], sum[:])
	return ns, nil
}

// IsZero reports whether ns is the zero Namespace (not built by NewNamespace).
func (ns Namespace) IsZero() bool { return ns.id == [NamespaceSize]byte{} }

// Identity returns the identity string ns was derived from.
func (ns Namespace) Identity() string { return ns.name }

// ID returns the fixed-size namespace identifier stored in every key.
func (ns Namespace) ID() [NamespaceSize]byte { return ns.id }

// String returns the hex ID, the name of the namespace on storage (directory, key infix).
func (ns Namespace) String() string { return hex.EncodeToString(ns.id[:]) }

// Key addresses one page on storage: the namespace ID followed by a 128-bit hash of the
// namespace and the page's chained prefix hash. It is comparable and fixed-size.
type Key [KeySize]byte

// NewKey returns the key of the page whose chained prefix hash is pageHash: a hash that
// already depends on every token of the prefix up to and including this page (as the radix
// tree computes it). Use ChainKeys when you have per-page hashes that are not chained.
func NewKey(ns Namespace, pageHash uint64) Key {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], pageHash)
	return NewKeyBytes(ns, b[:])
}

// NewKeyBytes is NewKey for a chained prefix hash of any width (e.g. a 128- or 256-bit hash).
func NewKeyBytes(ns Namespace, chained []byte) Key {
	h := sha256.New()
	h.Write([]byte(keyTag))
	h.Write(ns.id[:])
	h.Write(chained)
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	var k Key
	copy(k[:NamespaceSize], ns.id[:])
	copy(k[NamespaceSize:], sum[:])
	return k
}

// PageKey returns the key of the page whose identity is id (a 256-bit cryptographic chained
// page id, hicache/core.PageID) in tensor-parallel shard shard (TP shards hold different
// bytes for one prefix). Its domain tag differs from NewKey's and NewKeyBytes', so no key
// they derive (those of pages stored under 64-bit page hashes, format version 3) is ever a
// PageKey.
func PageKey(ns Namespace, id [32]byte, shard uint32) Key { return PageKeyIn(ns.id, id, shard) }

// PageKeyIn is PageKey for the namespace whose ID is ns (Namespace.ID): what a store that
// holds only keys (the directory backend's eviction, which finds a page's parent from the
// parent id its value is bound to) computes.
func PageKeyIn(ns [NamespaceSize]byte, id [32]byte, shard uint32) Key {
	var b [len(pageTag) + NamespaceSize + 32 + 4]byte
	n := copy(b[:], pageTag)
	n += copy(b[n:], ns[:])
	n += copy(b[n:], id[:])
	binary.BigEndian.PutUint32(b[n:], shard)
	sum := sha256.Sum256(b[:])
	var k Key
	copy(k[:NamespaceSize], ns[:])
	copy(k[NamespaceSize:], sum[:])
	return k
}

// ChainKeys appends to dst the keys of consecutive pages of one sequence, given per-page
// hashes that are not chained: key i depends on pageHashes[0..i] and on parent, the key of
// the page before pageHashes[0] (the zero Key for the first page of a sequence).
func ChainKeys(ns Namespace, parent Key, pageHashes []uint64, dst []Key) []Key {
	prev := parent
	h := sha256.New()
	var sum [sha256.Size]byte
	var b [8]byte
	for _, ph := range pageHashes {
		h.Reset()
		h.Write([]byte(chainTag))
		h.Write(prev[:])
		binary.BigEndian.PutUint64(b[:], ph)
		h.Write(b[:])
		h.Sum(sum[:0])
		k := NewKeyBytes(ns, sum[:16])
		dst = append(dst, k)
		prev = k
	}
	return dst
}

// IsZero reports whether k is the zero Key, which is never a valid page key.
func (k Key) IsZero() bool { return k == Key{} }

// NamespaceID returns the namespace part of k.
func (k Key) NamespaceID() [NamespaceSize]byte {
	var id [NamespaceSize]byte
	copy(id[:], k[:NamespaceSize])
	return id
}

// String returns "<namespace hex>:<hash hex>".
func (k Key) String() string {
	var b [2*KeySize + 1]byte
	return string(k.appendString(b[:0]))
}

func (k Key) appendString(dst []byte) []byte {
	dst = hex.AppendEncode(dst, k[:NamespaceSize])
	dst = append(dst, ':')
	return hex.AppendEncode(dst, k[NamespaceSize:])
}

var _ fmt.Stringer = Key{}
