package storage

import (
	"crypto/hmac"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"hash/crc32"
)

// On-storage value format, shared by every backend: a fixed header followed by the payload.
// Version 5, written today:
//
//	off  size  field
//	  0     4  magic "CPKV"
//	  4     2  format version (5), little endian
//	  6     2  flags: 0, or flagUnauthenticated (the MAC fields are zero)
//	  8    24  key
//	 32     8  payload length, little endian
//	 40     4  CRC-32C of the payload
//	 44    32  binding: digest of the page's tokens (Binding.Tokens)
//	 76    32  binding: id of the page before it (for a sequence's first, the root of its isolation key)
//	108     1  payload MAC algorithm (MACAlg: 1 keyed BLAKE3, 2 AES-256-GMAC; 0 unauthenticated)
//	109     3  zero
//	112    12  nonce: random, drawn for each value written (AES-GMAC's IV)
//	124    16  payload MAC: BLAKE3(MAC key; "P" ‖ bytes 0..123 ‖ payload), first 16 bytes,
//	           or AES-256-GMAC(GMAC key; nonce; payload), the GCM tag of an empty plaintext
//	140    16  header MAC:  BLAKE3(MAC key; "H" ‖ bytes 0..139), first 16 bytes
//	156     4  CRC-32C of bytes 0..155
//	160     -  payload
//
// Version 4 is the same without bytes 108..123 (payload MAC at 108, over "P" ‖ bytes 0..107
// ‖ payload, keyed BLAKE3 only; header MAC at 124; header CRC at 140; payload at 144): it is
// read as it is (its header says its length), so a store written by the previous release
// stays warm; it is never written.
//
// The header MAC covers the algorithm, the nonce and the payload MAC: whatever algorithm a
// header names, a value verifies only if its header was written with the storage's key,
// and its payload only if its MAC under that algorithm holds (an AES-GMAC payload MAC is
// bound to the value's key, length and binding through the header MAC, which covers it).
// A reader verifies either algorithm, whatever its CPU has (Go's AES-GCM has a
// constant-time software fallback); doc.go says why the GMAC nonces are sound.
//
// A value is accepted only if every field checks out and the total length is exactly
// its header's size plus the length: a torn write, a file written by something else, or a value stored
// under the wrong key is a miss. The CRCs tell damage from forgery: a value whose checksums
// hold but whose MACs do not was written without the storage's MAC key (forged, or by a
// store user with another key), and one whose MACs hold for another key was replayed under
// this one; both are errors wrapping ErrForged. The header MAC lets Exists authenticate a
// value from its header alone, reading no payload (auth.go). An insecure store (Options.Insecure) computes no
// MACs: it writes flagUnauthenticated and zero MAC fields, and reads only such values; a
// keyed store rejects them as forged.
//
// The binding says what the value was stored for beyond its key: a reader that knows the
// page's tokens and its parent (GetBound, as the cache's prefetch does) gets a miss wrapping ErrMismatch, counted in
// Stats.Mismatched, when they differ, even under a genuine MAC; so a page is served only for
// the tokens and the prefix it was written for, whatever the key derivation. Both binding
// fields are covered by both MACs.
//
// Values of an older format version than 4 are misses (never read, counted in Stats.OldFormat and
// deleted): version 3 values were stored under keys derived from a 64-bit page hash that
// tenants could collide (see hicache/core/hash.go), and carry no binding.
const (
	HeaderSize    = 160
	formatVersion = 5
	formatMagic   = "CPKV"
	// MaxValueSize bounds a page (Redis bulk strings are limited to 512 MiB).
	MaxValueSize = 256 << 20

	offPayloadCRC = 40
	offBinding    = 44
	offAlg        = 108
	offNonce      = 112
	nonceSize     = 12
	macSize       = 16

	// flagUnauthenticated marks a value written by an insecure store.
	flagUnauthenticated = 1
)

// layout is where a format version keeps its MACs.
type layout struct {
	size       int // of the header
	payloadMAC int // offset of the payload MAC; the header MAC follows it, the header CRC that
	hasAlg     bool
}

func (l layout) headerMAC() int { return l.payloadMAC + macSize }
func (l layout) headerCRC() int { return l.payloadMAC + 2*macSize }

var (
	layoutV4 = layout{size: 144, payloadMAC: 108}
	layoutV5 = layout{size: HeaderSize, payloadMAC: 124, hasAlg: true}
)

// layoutOf returns the layout of the value whose header starts v (at least its first 6
// bytes), and whether its version is one this package reads.
func layoutOf(v []byte) (layout, bool) {
	if len(v) < 6 {
		return layout{}, false
	}
	switch binary.LittleEndian.Uint16(v[4:6]) {
	case 5:
		return layoutV5, true
	case 4:
		return layoutV4, true
	}
	return layout{}, false
}

// HeaderLen returns the size of the header that starts v by its version: HeaderSize for
// values written today, less for an older version still read (4); HeaderSize when v is too
// short to say or its version is one not read (CheckHeader then says why).
func HeaderLen(v []byte) int {
	if l, ok := layoutOf(v); ok && string(v[0:4]) == formatMagic {
		return l.size
	}
	return HeaderSize
}

// DigestSize is the size of each field of a Binding.
const DigestSize = 32

// Binding is what a stored value is bound to beyond its key: the digest of its page's
// tokens and the id of the page before it in its sequence (for a sequence's first page, what
// its chain starts from: the cache binds its isolation key's root, core.KeyRoot).
// PutBound stores one per key and GetBound checks it; Put stores the zero Binding, and Get
// and Exists do not check it.
type Binding struct {
	Tokens [DigestSize]byte
	Parent [DigestSize]byte
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Checksum is the CRC-32C of b, the checksum of the value format's payload and header.
func Checksum(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

// UpdateChecksum returns the checksum of the bytes crc covered followed by b, so that a
// payload can be checksummed block by block (UpdateChecksum(0, b) == Checksum(b)).
func UpdateChecksum(crc uint32, b []byte) uint32 { return crc32.Update(crc, castagnoli, b) }

// EncodeHeader fills hdr for payload stored under key with binding bind, authenticated
// with m.
func (m *MAC) EncodeHeader(hdr *[HeaderSize]byte, key Key, bind *Binding, payload []byte) {
	m.EncodeHeaderSum(hdr, key, bind, payload, Checksum(payload))
}

// EncodeHeaderSum is EncodeHeader for a payload whose checksum crc (Checksum) was computed
// already. A nil bind is the zero Binding.
func (m *MAC) EncodeHeaderSum(hdr *[HeaderSize]byte, key Key, bind *Binding, payload []byte, crc uint32) {
	l := layoutV5
	copy(hdr[0:4], formatMagic)
	binary.LittleEndian.PutUint16(hdr[4:6], formatVersion)
	copy(hdr[8:32], key[:])
	binary.LittleEndian.PutUint64(hdr[32:40], uint64(len(payload)))
	binary.LittleEndian.PutUint32(hdr[offPayloadCRC:], crc)
	if bind == nil {
		clear(hdr[offBinding:offAlg])
	} else {
		copy(hdr[offBinding:], bind.Tokens[:])
		copy(hdr[offBinding+DigestSize:], bind.Parent[:])
	}
	clear(hdr[offAlg:offNonce])
	if m.insecure {
		binary.LittleEndian.PutUint16(hdr[6:8], flagUnauthenticated)
		clear(hdr[offNonce:l.headerCRC()])
	} else {
		binary.LittleEndian.PutUint16(hdr[6:8], 0)
		hdr[offAlg] = byte(m.alg)
		// A fresh random nonce for every value written (doc.go: why it is unique enough).
		rand.Read(hdr[offNonce:l.payloadMAC])
		m.sumPayload(hdr[l.payloadMAC:l.headerMAC()], l, m.alg, hdr[:], payload, nil)
		m.sum(hdr[l.headerMAC():l.headerCRC()], domainHeader, hdr[:l.headerMAC()], nil)
	}
	binary.LittleEndian.PutUint32(hdr[l.headerCRC():], Checksum(hdr[:l.headerCRC()]))
}

// sumPayload writes the payload MAC of alg over hdr (of layout l) and payload to out,
// copying payload into dst (when not nil) on the way: keyed BLAKE3 block by block, each
// block copied right after it is hashed; AES-GMAC over the whole payload, then the copy
// (Go's GCM takes its additional data in one piece).
func (m *MAC) sumPayload(out []byte, l layout, alg MACAlg, hdr, payload, dst []byte) {
	if alg == MACGMAC {
		var tag [macSize]byte
		m.gmac(&tag, hdr[offNonce:offNonce+nonceSize], payload)
		copy(out, tag[:])
		if dst != nil {
			copy(dst, payload)
		}
		return
	}
	m.sumCopy(out, domainPayload, hdr[:l.payloadMAC], payload, dst)
}

// CheckHeader verifies hdr (a header of any version read, HeaderLen(hdr) bytes or more)
// against the expected key, binding (nil: not checked) and payload length. The returned error says what is wrong (the caller wraps it into an
// ErrCorrupt OpError); it wraps ErrForged when the header's checksum holds but its MAC or
// key does not, ErrMismatch when all of that holds but the binding differs, and
// ErrOldFormat for a value of a format version no longer read.
func (m *MAC) CheckHeader(hdr []byte, key Key, bind *Binding, wantLen int) error {
	if len(hdr) < 6 || string(hdr[0:4]) != formatMagic {
		if len(hdr) < 4 {
			return fmt.Errorf("value of %d bytes is shorter than the %d-byte header", len(hdr), HeaderSize)
		}
		return fmt.Errorf("bad magic %q", hdr[0:4])
	}
	l, ok := layoutOf(hdr)
	if !ok {
		v := binary.LittleEndian.Uint16(hdr[4:6])
		if v < formatVersion {
			return KindCause(ErrOldFormat, fmt.Errorf("format version %d, want %d (%s)", v, formatVersion, oldFormat(v)))
		}
		return fmt.Errorf("format version %d, want %d (unknown version)", v, formatVersion)
	}
	if len(hdr) < l.size {
		return fmt.Errorf("truncated header: %d bytes of the %d-byte header", len(hdr), l.size)
	}
	if got, want := binary.LittleEndian.Uint32(hdr[l.headerCRC():]), Checksum(hdr[:l.headerCRC()]); got != want {
		return fmt.Errorf("header checksum %08x, computed %08x", got, want)
	}
	switch f := binary.LittleEndian.Uint16(hdr[6:8]); {
	case f&^flagUnauthenticated != 0:
		return fmt.Errorf("unknown flags %#x", f)
	case f == flagUnauthenticated && !m.insecure:
		return forged("value written without a MAC key (by an insecure store)")
	case f != flagUnauthenticated && m.insecure:
		return forged("value authenticated with a MAC key that this insecure store does not have")
	}
	if !m.insecure && !m.verify(hdr[l.headerMAC():l.headerCRC()], domainHeader, hdr[:l.headerMAC()], nil) {
		return forged("header MAC does not verify (written without this storage's key)")
	}
	if l.hasAlg && !m.insecure {
		// Covered by the header MAC: an unknown algorithm was written by a newer release
		// with this key, not forged.
		if a := MACAlg(hdr[offAlg]); a != MACBlake3 && a != MACGMAC {
			return fmt.Errorf("payload MAC algorithm %d unknown to this release", a)
		}
	}
	if Key(hdr[8:32]) != key {
		return forged("value of key %s replayed under another key", Key(hdr[8:32]))
	}
	if n := binary.LittleEndian.Uint64(hdr[32:40]); n != uint64(wantLen) {
		return fmt.Errorf("payload length %d, want %d", n, wantLen)
	}
	if bind == nil {
		return nil
	}
	want := bind // not a copy: its digests in an error message would move a copy to the heap
	if [DigestSize]byte(hdr[offBinding:]) != want.Tokens {
		return KindCause(ErrMismatch, fmt.Errorf("value stored for other tokens (token digest %x, want %x)", hdr[offBinding:offBinding+8], want.Tokens[:8]))
	}
	if [DigestSize]byte(hdr[offBinding+DigestSize:]) != want.Parent {
		return KindCause(ErrMismatch, fmt.Errorf("value stored under another parent page (%x, want %x)", hdr[offBinding+DigestSize:offBinding+DigestSize+8], want.Parent[:8]))
	}
	return nil
}

// CheckPayload verifies payload against the checksum and MAC in a header that passed
// CheckHeader.
func (m *MAC) CheckPayload(hdr []byte, payload []byte) error {
	return m.CheckPayloadCopy(hdr, payload, nil)
}

// CheckPayloadCopy is CheckPayload that also copies payload into dst (when not nil, of the
// same length) in the same pass where the algorithm allows: keyed BLAKE3 block by block as
// each is hashed, while it is in cache; AES-GMAC (which takes the payload in one piece)
// verifies first and copies only a payload that verified, so dst never holds a rejected
// payload's bytes. A keyed store verifies the MAC alone: the MAC is bound to the header's
// checksum field (keyed BLAKE3 covers it, AES-GMAC's header MAC does), so a payload whose
// MAC verifies has the checksum its writer computed, and the checksum (a second pass over
// the payload) is computed only to tell damage from forgery when the MAC fails. An
// insecure store has only the checksum. dst's contents are unspecified when the payload is
// rejected.
func (m *MAC) CheckPayloadCopy(hdr, payload, dst []byte) error {
	l, _ := layoutOf(hdr)
	if m.insecure {
		if dst != nil {
			copy(dst, payload)
		}
		return comparePayload(hdr, l, Checksum(payload), make([]byte, macSize))
	}
	alg := MACBlake3
	if l.hasAlg {
		alg = MACAlg(hdr[offAlg])
	}
	var mac [macSize]byte
	if alg == MACGMAC {
		m.gmac(&mac, hdr[offNonce:offNonce+nonceSize], payload)
		if hmac.Equal(hdr[l.payloadMAC:l.headerMAC()], mac[:]) {
			if dst != nil {
				copy(dst, payload)
			}
			return nil
		}
	} else {
		m.sumCopy(mac[:], domainPayload, hdr[:l.payloadMAC], payload, dst)
		if hmac.Equal(hdr[l.payloadMAC:l.headerMAC()], mac[:]) {
			return nil
		}
	}
	return comparePayload(hdr, l, Checksum(payload), mac[:])
}

// comparePayload checks a payload's checksum and MAC, as computed, against hdr's.
func comparePayload(hdr []byte, l layout, crc uint32, mac []byte) error {
	if want := binary.LittleEndian.Uint32(hdr[offPayloadCRC:]); crc != want {
		return fmt.Errorf("payload checksum %08x, header says %08x", crc, want)
	}
	if !hmac.Equal(hdr[l.payloadMAC:l.headerMAC()], mac) {
		return forged("payload MAC does not verify (payload replaced, checksum recomputed)")
	}
	return nil
}

// oldFormat says why a value of an older format version is not read.
func oldFormat(v uint16) string {
	switch v {
	case 1:
		return "version 1 values were not authenticated"
	case 2:
		return "version 2 values carry HMAC-SHA256 MACs; version 3 uses keyed BLAKE3"
	case 3:
		return "version 3 values are keyed by a 64-bit page hash that tenants can collide, and bind no tokens"
	}
	return "unknown version"
}

// PeekParent returns the parent id a header of a format read today (versions 4 and 5,
// which keep the binding at the same offset) binds its value to (Binding.Parent), without
// verifying anything: what the directory backend's eviction reads to order a chain's pages
// (a forged header can only reorder evictions, which whoever can write the store can do
// anyway). ok is false for a header of another format or version, or one bound to no
// parent (Put).
func PeekParent(hdr []byte) (parent [DigestSize]byte, ok bool) {
	l, known := layoutOf(hdr)
	if !known || len(hdr) < l.size || string(hdr[0:4]) != formatMagic {
		return parent, false
	}
	parent = [DigestSize]byte(hdr[offBinding+DigestSize:])
	return parent, parent != [DigestSize]byte{}
}

// StoredLen returns the total stored size of a payload of n bytes.
func StoredLen(n int) int { return HeaderSize + n }
