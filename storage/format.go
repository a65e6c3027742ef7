package storage

import (
	"crypto/hmac"
	"encoding/binary"
	"fmt"
	"hash/crc32"
)

// On-storage value format, shared by every backend: a fixed header followed by the payload.
//
//	off  size  field
//	  0     4  magic "CPKV"
//	  4     2  format version (4), little endian
//	  6     2  flags: 0, or flagUnauthenticated (the MAC fields are zero)
//	  8    24  key
//	 32     8  payload length, little endian
//	 40     4  CRC-32C of the payload
//	 44    32  binding: digest of the page's tokens (Binding.Tokens)
//	 76    32  binding: id of the page before it (for a sequence's first, the root of its isolation key)
//	108    16  payload MAC: BLAKE3(MAC key; "P" ‖ bytes 0..107 ‖ payload), first 16 bytes
//	124    16  header MAC:  BLAKE3(MAC key; "H" ‖ bytes 0..123), first 16 bytes
//	140     4  CRC-32C of bytes 0..139
//	144     -  payload
//
// A value is accepted only if every field checks out and the total length is exactly
// HeaderSize+length: a torn write, a file written by something else, or a value stored
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
// Values of an older format version are misses (never read, counted in Stats.OldFormat and
// deleted): version 3 values were stored under keys derived from a 64-bit page hash that
// tenants could collide (see hicache/core/hash.go), and carry no binding.
const (
	HeaderSize    = 144
	formatVersion = 4
	formatMagic   = "CPKV"
	// MaxValueSize bounds a page (Redis bulk strings are limited to 512 MiB).
	MaxValueSize = 256 << 20

	offPayloadCRC = 40
	offBinding    = 44
	offPayloadMAC = 108
	offHeaderMAC  = 124
	offHeaderCRC  = 140
	macSize       = 16

	// flagUnauthenticated marks a value written by an insecure store.
	flagUnauthenticated = 1
)

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
	copy(hdr[0:4], formatMagic)
	binary.LittleEndian.PutUint16(hdr[4:6], formatVersion)
	copy(hdr[8:32], key[:])
	binary.LittleEndian.PutUint64(hdr[32:40], uint64(len(payload)))
	binary.LittleEndian.PutUint32(hdr[offPayloadCRC:], crc)
	if bind == nil {
		clear(hdr[offBinding:offPayloadMAC])
	} else {
		copy(hdr[offBinding:], bind.Tokens[:])
		copy(hdr[offBinding+DigestSize:], bind.Parent[:])
	}
	if m.insecure {
		binary.LittleEndian.PutUint16(hdr[6:8], flagUnauthenticated)
		clear(hdr[offPayloadMAC:offHeaderCRC])
	} else {
		binary.LittleEndian.PutUint16(hdr[6:8], 0)
		m.sum(hdr[offPayloadMAC:offHeaderMAC], domainPayload, hdr[:offPayloadMAC], payload)
		m.sum(hdr[offHeaderMAC:offHeaderCRC], domainHeader, hdr[:offHeaderMAC], nil)
	}
	binary.LittleEndian.PutUint32(hdr[offHeaderCRC:], Checksum(hdr[:offHeaderCRC]))
}

// CheckHeader verifies hdr against the expected key, binding (nil: not checked) and
// payload length. The returned error says what is wrong (the caller wraps it into an
// ErrCorrupt OpError); it wraps ErrForged when the header's checksum holds but its MAC or
// key does not, ErrMismatch when all of that holds but the binding differs, and
// ErrOldFormat for a value of an older format version.
func (m *MAC) CheckHeader(hdr []byte, key Key, bind *Binding, wantLen int) error {
	if len(hdr) < HeaderSize {
		return fmt.Errorf("value of %d bytes is shorter than the %d-byte header", len(hdr), HeaderSize)
	}
	if string(hdr[0:4]) != formatMagic {
		return fmt.Errorf("bad magic %q", hdr[0:4])
	}
	if v := binary.LittleEndian.Uint16(hdr[4:6]); v != formatVersion {
		if v < formatVersion {
			return KindCause(ErrOldFormat, fmt.Errorf("format version %d, want %d (%s)", v, formatVersion, oldFormat(v)))
		}
		return fmt.Errorf("format version %d, want %d (unknown version)", v, formatVersion)
	}
	if got, want := binary.LittleEndian.Uint32(hdr[offHeaderCRC:]), Checksum(hdr[:offHeaderCRC]); got != want {
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
	if !m.insecure && !m.verify(hdr[offHeaderMAC:offHeaderCRC], domainHeader, hdr[:offHeaderMAC], nil) {
		return forged("header MAC does not verify (written without this storage's key)")
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
	want := *bind
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
// same length) in the same pass, block by block as each is hashed, while it is in cache. A
// keyed store verifies the MAC alone: the MAC covers the header's checksum field, so a
// payload whose MAC verifies has the checksum its writer computed, and the checksum (a
// second pass over the payload) is computed only to tell damage from forgery when the MAC
// fails. An insecure store has only the checksum. dst's contents are unspecified when the
// payload is rejected.
func (m *MAC) CheckPayloadCopy(hdr, payload, dst []byte) error {
	if m.insecure {
		if dst != nil {
			copy(dst, payload)
		}
		return comparePayload(hdr, Checksum(payload), make([]byte, macSize))
	}
	var mac [macSize]byte
	m.sumCopy(mac[:], domainPayload, hdr[:offPayloadMAC], payload, dst)
	if hmac.Equal(hdr[offPayloadMAC:offHeaderMAC], mac[:]) {
		return nil
	}
	return comparePayload(hdr, Checksum(payload), mac[:])
}

// comparePayload checks a payload's checksum and MAC, as computed, against hdr's.
func comparePayload(hdr []byte, crc uint32, mac []byte) error {
	if want := binary.LittleEndian.Uint32(hdr[offPayloadCRC:]); crc != want {
		return fmt.Errorf("payload checksum %08x, header says %08x", crc, want)
	}
	if !hmac.Equal(hdr[offPayloadMAC:offHeaderMAC], mac) {
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

// PeekParent returns the parent id a header of the current format binds its value to
// (Binding.Parent), without verifying anything: what the directory backend's eviction reads
// to order a chain's pages (a forged header can only reorder evictions, which whoever can
// write the store can do anyway). ok is false for a header of another format or version,
// or one bound to no parent (Put).
func PeekParent(hdr []byte) (parent [DigestSize]byte, ok bool) {
	if len(hdr) < HeaderSize || string(hdr[0:4]) != formatMagic || binary.LittleEndian.Uint16(hdr[4:6]) != formatVersion {
		return parent, false
	}
	parent = [DigestSize]byte(hdr[offBinding+DigestSize:])
	return parent, parent != [DigestSize]byte{}
}

// StoredLen returns the total stored size of a payload of n bytes.
func StoredLen(n int) int { return HeaderSize + n }
