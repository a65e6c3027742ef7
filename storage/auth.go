package storage

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"runtime"

	"github.com/zeebo/blake3"
	"golang.org/x/sys/cpu"
)

// MAC computes and checks the MACs of stored values (format.go) with one storage key:
// every backend encodes and verifies its values through one (NewMAC). A value's payload
// MAC is one of two algorithms (MACAlg), named in its header so that any reader verifies
// it whatever its CPU: AES-256-GMAC where the CPU has AES and carry-less multiply
// instructions (2.6× keyed BLAKE3 on a Xeon with VAES, see doc.go), else keyed BLAKE3;
// the header MAC is keyed BLAKE3 in both. Each algorithm has its own 32-byte key derived
// from the storage key. It is safe for concurrent use: each BLAKE3 call takes a keyed state
// from a free list (a channel, not a sync.Pool, which drops states at random under the race
// detector: MACs must not allocate per page); the GCM is stateless.
type MAC struct {
	macKey      [32]byte       // derived from the storage key (macKeyContext)
	free        chan *macState // idle states keyed with macKey
	gcm         cipher.AEAD    // AES-256-GCM under a key derived with gmacKeyContext
	alg         MACAlg         // the payload MAC this MAC writes
	fingerprint uint64         // of the key (KeyFingerprint); never the key itself
	insecure    bool           // the key is empty (Options.Insecure): anyone can forge values
}

// MACAlg is the algorithm of a value's payload MAC, recorded in its header (format.go).
type MACAlg uint8

const (
	// MACBlake3 is keyed BLAKE3 over the header's first bytes and the payload.
	MACBlake3 MACAlg = 1
	// MACGMAC is AES-256-GMAC (AES-GCM with an empty plaintext and the payload as
	// additional data) under the header's random 96-bit nonce.
	MACGMAC MACAlg = 2
)

func (a MACAlg) String() string {
	switch a {
	case MACBlake3:
		return "blake3"
	case MACGMAC:
		return "aes-gmac"
	}
	return fmt.Sprintf("MACAlg(%d)", uint8(a))
}

// PreferredMACAlg is the payload MAC that NewMAC writes on this CPU: AES-GMAC where the
// CPU has AES and carry-less multiply (x86 AES-NI and PCLMULQDQ, arm64 AES and PMULL),
// which Go's AES-GCM uses; keyed BLAKE3 elsewhere (GHASH in software is slower than it).
func PreferredMACAlg() MACAlg {
	switch runtime.GOARCH {
	case "amd64":
		if cpu.X86.HasAES && cpu.X86.HasPCLMULQDQ {
			return MACGMAC
		}
	case "arm64":
		if cpu.ARM64.HasAES && cpu.ARM64.HasPMULL {
			return MACGMAC
		}
	}
	return MACBlake3
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
	// gmacKeyContext derives the AES-256-GMAC key: a key of its own, never the BLAKE3 one.
	gmacKeyContext = "cpcache storage value AES-GMAC v5"
)

// NewMAC returns the MAC of key, writing the payload MAC of PreferredMACAlg; an empty key
// is the insecure one (a MAC anyone can compute, i.e. a checksum: values carry none, see
// Options.Insecure). It verifies values of either algorithm.
func NewMAC(key []byte) *MAC { return NewMACAlg(key, PreferredMACAlg()) }

// NewMACAlg is NewMAC writing payload MACs of alg (MACBlake3 or MACGMAC; anything else
// panics: a programming error).
func NewMACAlg(key []byte, alg MACAlg) *MAC {
	if alg != MACBlake3 && alg != MACGMAC {
		panic("storage: NewMACAlg of " + alg.String())
	}
	a := &MAC{free: make(chan *macState, maxIdleMACStates), insecure: len(key) == 0, alg: alg}
	blake3.DeriveKey(macKeyContext, key, a.macKey[:])
	var gk [32]byte
	blake3.DeriveKey(gmacKeyContext, key, gk[:])
	block, err := aes.NewCipher(gk[:])
	if err != nil {
		panic("storage: AES rejected a 32-byte key: " + err.Error())
	}
	if a.gcm, err = cipher.NewGCM(block); err != nil {
		panic("storage: GCM of AES: " + err.Error())
	}
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

// gmac writes AES-GMAC(nonce; payload) to out (16 bytes): the GCM tag of an empty
// plaintext with payload as additional data. The tag is sealed into a pooled state's
// buffer: a caller's array passed through the cipher.AEAD interface would escape to the
// heap, one allocation per page.
func (m *MAC) gmac(out *[macSize]byte, nonce, payload []byte) {
	st := m.state()
	copy(out[:], m.gcm.Seal(st.out[:0], nonce, nil, payload))
	m.release(st)
}

// Alg is the payload MAC that m writes.
func (m *MAC) Alg() MACAlg { return m.alg }

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
