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
//	  4     2  format version (3), little endian
//	  6     2  flags: 0, or flagUnauthenticated (the MAC fields are zero)
//	  8    24  key
//	 32     8  payload length, little endian
//	 40     4  CRC-32C of the payload
//	 44    16  payload MAC: BLAKE3(MAC key; "P" ‖ bytes 0..43 ‖ payload), first 16 bytes
//	 60    16  header MAC:  BLAKE3(MAC key; "H" ‖ bytes 0..59), first 16 bytes
//	 76     4  CRC-32C of bytes 0..75
//	 80     -  payload
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
const (
	HeaderSize    = 80
	formatVersion = 3
	formatMagic   = "CPKV"
	// MaxValueSize bounds a page (Redis bulk strings are limited to 512 MiB).
	MaxValueSize = 256 << 20

	offPayloadCRC = 40
	offPayloadMAC = 44
	offHeaderMAC  = 60
	offHeaderCRC  = 76
	macSize       = 16

	// flagUnauthenticated marks a value written by an insecure store.
	flagUnauthenticated = 1
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Checksum is the CRC-32C of b, the checksum of the value format's payload and header.
func Checksum(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

// UpdateChecksum returns the checksum of the bytes crc covered followed by b, so that a
// payload can be checksummed block by block (UpdateChecksum(0, b) == Checksum(b)).
func UpdateChecksum(crc uint32, b []byte) uint32 { return crc32.Update(crc, castagnoli, b) }

// EncodeHeader fills hdr for payload stored under key, authenticated with m.
func (m *MAC) EncodeHeader(hdr *[HeaderSize]byte, key Key, payload []byte) {
	m.EncodeHeaderSum(hdr, key, payload, Checksum(payload))
}

// EncodeHeaderSum is EncodeHeader for a payload whose checksum crc (Checksum) was computed
// already.
func (m *MAC) EncodeHeaderSum(hdr *[HeaderSize]byte, key Key, payload []byte, crc uint32) {
	copy(hdr[0:4], formatMagic)
	binary.LittleEndian.PutUint16(hdr[4:6], formatVersion)
	copy(hdr[8:32], key[:])
	binary.LittleEndian.PutUint64(hdr[32:40], uint64(len(payload)))
	binary.LittleEndian.PutUint32(hdr[offPayloadCRC:], crc)
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

// CheckHeader verifies hdr against the expected key and payload length. The returned error
// says what is wrong (the caller wraps it into an ErrCorrupt OpError); it wraps
// ErrForged when the header's checksum holds but its MAC or key does not.
func (m *MAC) CheckHeader(hdr []byte, key Key, wantLen int) error {
	if len(hdr) < HeaderSize {
		return fmt.Errorf("value of %d bytes is shorter than the %d-byte header", len(hdr), HeaderSize)
	}
	if string(hdr[0:4]) != formatMagic {
		return fmt.Errorf("bad magic %q", hdr[0:4])
	}
	if v := binary.LittleEndian.Uint16(hdr[4:6]); v != formatVersion {
		return fmt.Errorf("format version %d, want %d (%s)", v, formatVersion, oldFormat(v))
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
	}
	return "unknown version"
}

// StoredLen returns the total stored size of a payload of n bytes.
func StoredLen(n int) int { return HeaderSize + n }
