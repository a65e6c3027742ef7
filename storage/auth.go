package storage

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"

	"github.com/zeebo/blake3"
)

// MAC computes and checks the MACs of stored values (format.go) with one storage key:
// every backend encodes and verifies its values through one (NewMAC). The MAC is keyed BLAKE3 (twice the speed of HMAC-SHA256 with SHA extensions, more
// on cores with AVX-512) under a 32-byte key derived from the storage key. It is safe for
// concurrent use: each call takes a keyed state from a free list (a channel, not a
// sync.Pool, which drops states at random under the race detector: MACs must not allocate
// per page).
type MAC struct {
	macKey      [32]byte       // derived from the storage key (macKeyContext)
	free        chan *macState // idle states keyed with macKey
	fingerprint uint64         // of the key (KeyFingerprint); never the key itself
	insecure    bool           // the key is empty (Options.Insecure): anyone can forge values
}

// maxIdleMACStates bounds the free list: more concurrent MACs than this allocate.
const maxIdleMACStates = 64

// macState is one pooled keyed BLAKE3 state and its output buffer (no allocation per MAC).
type macState struct {
	h   *blake3.Hasher
	out [32]byte
}

// Domains: the payload MAC and the header MAC of a value never verify as each other.
var (
	domainPayload = []byte{'P'}
	domainHeader  = []byte{'H'}
)

const (
	fingerprintID = "cpcache/storage/key-fingerprint/v1"
	// macKeyContext derives the BLAKE3 MAC key from the storage key (any length).
	macKeyContext = "cpcache storage value MAC v3"
)

// NewMAC returns the MAC of key; an empty key is the insecure one (a MAC anyone can
// compute, i.e. a checksum: values carry none, see Options.Insecure).
func NewMAC(key []byte) *MAC {
	a := &MAC{free: make(chan *macState, maxIdleMACStates), insecure: len(key) == 0}
	blake3.DeriveKey(macKeyContext, key, a.macKey[:])
	// The fingerprint stays HMAC-SHA256 so that it does not change with the MAC.
	var fp [sha256.Size]byte
	h := hmac.New(sha256.New, key)
	h.Write([]byte(fingerprintID))
	h.Sum(fp[:0])
	a.fingerprint = binary.BigEndian.Uint64(fp[:8])
	return a
}

// NewRandomMAC returns a MAC with a fresh random key (a store private to one process).
func NewRandomMAC() *MAC {
	return NewMAC([]byte(rand.Text()))
}

// state takes a keyed state, reset, from the free list; release gives it back.
func (m *MAC) state() *macState {
	select {
	case st := <-m.free:
		st.h.Reset()
		return st
	default:
		h, err := blake3.NewKeyed(m.macKey[:])
		if err != nil {
			panic("storage: blake3 rejected a 32-byte key: " + err.Error())
		}
		return &macState{h: h}
	}
}

func (m *MAC) release(st *macState) {
	select {
	case m.free <- st:
	default:
	}
}

// sum writes the first len(out) bytes of BLAKE3(macKey; domain ‖ a ‖ b) to out.
func (m *MAC) sum(out []byte, domain, a, b []byte) {
	st := m.state()
	st.h.Write(domain)
	st.h.Write(a)
	st.h.Write(b)
	copy(out, st.h.Sum(st.out[:0]))
	m.release(st)
}

// sumCopy is sum that also copies b into dst (when not nil, len(b) bytes) in the same
// pass: each block of b is copied right after it is hashed, from cache.
func (m *MAC) sumCopy(out []byte, domain, a, b, dst []byte) {
	if dst == nil {
		m.sum(out, domain, a, b)
		return
	}
	st := m.state()
	st.h.Write(domain)
	st.h.Write(a)
	for len(b) > 0 {
		n := min(len(b), copyBlock)
		st.h.Write(b[:n])
		copy(dst[:n], b[:n])
		b, dst = b[n:], dst[n:]
	}
	copy(out, st.h.Sum(st.out[:0]))
	m.release(st)
}

// copyBlock is how much of a payload sumCopy hashes before it copies it: small enough to
// be still in the core's L1/L2 cache, a multiple of BLAKE3's 8 KiB vector batch.
const copyBlock = 32 << 10

// verify reports whether tag is the MAC of domain ‖ a ‖ b (constant time).
func (m *MAC) verify(tag []byte, domain, a, b []byte) bool {
	var want [macSize]byte
	m.sum(want[:], domain, a, b)
	return hmac.Equal(tag, want[:len(tag)])
}

// Fingerprint is the printable key fingerprint (16 hex digits, "insecure" for the empty
// key). It reveals nothing of the key: users of one store compare fingerprints to find a
// mismatched key.
func (m *MAC) Fingerprint() string {
	if m.insecure {
		return "insecure"
	}
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], m.fingerprint)
	return hex.EncodeToString(b[:])
}

// KeyFingerprint returns a fingerprint of the MAC key s was opened with (16 hex digits,
// "insecure" for Options.Insecure; "" for a Storage that has no MAC key of its own, such
// as a wrapper). It reveals nothing of the key: users of one store compare fingerprints to
// find a mismatched key. A backend tells its fingerprint by a method KeyFingerprint() string.
func KeyFingerprint(s Storage) string {
	if f, ok := s.(interface{ KeyFingerprint() string }); ok {
		return f.KeyFingerprint()
	}
	return ""
}
