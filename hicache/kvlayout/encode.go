package kvlayout

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
)

// The encoding: the magic "kvl", a version byte, then unsigned varints (encoding/binary's
// Uvarint, minimal form): the layer count, the part count, and per part in order the name's
// length, the name's bytes, the bytes per token and one byte of sharding. Equal layouts have
// equal encodings and unequal layouts unequal ones, so ranks compare encodings (or their
// fingerprints) and the storage namespace contains one.
const (
	encodingMagic   = "kvl"
	encodingVersion = 1
)

// Encode returns l's canonical encoding. For a valid layout Decode(Encode()) is l; a layout
// that does not validate is encoded as it is (a negative count as its two's complement) and
// Decode rejects the result.
func (l Layout) Encode() []byte {
	b := make([]byte, 0, 4+2*binary.MaxVarintLen64+len(l.Parts)*(2+MaxNameLen/4+binary.MaxVarintLen32))
	b = append(b, encodingMagic...)
	b = append(b, encodingVersion)
	b = binary.AppendUvarint(b, uint64(int64(l.NumLayers)))
	b = binary.AppendUvarint(b, uint64(len(l.Parts)))
	for _, p := range l.Parts {
		b = binary.AppendUvarint(b, uint64(len(p.Name)))
		b = append(b, p.Name...)
		b = binary.AppendUvarint(b, uint64(int64(p.BytesPerToken)))
		b = append(b, byte(p.Sharding))
	}
	return b
}

// Decode returns the layout whose Encode is b. The error (wrapping ErrBadLayout) says b is
// not an encoding of this version (bad magic or version, truncated, trailing bytes, a
// non-minimal varint) or the layout it holds does not validate (Validate's *Error).
func Decode(b []byte) (Layout, error) {
	in := b
	if len(b) < len(encodingMagic)+1 || string(b[:len(encodingMagic)]) != encodingMagic {
		return Layout{}, layoutErr("encoding: no %q magic", encodingMagic)
	}
	if v := b[len(encodingMagic)]; v != encodingVersion {
		return Layout{}, layoutErr("encoding: version %d, this package reads %d", v, encodingVersion)
	}
	b = b[len(encodingMagic)+1:]
	next := func(what string, max uint64) (int, error) {
		v, n := binary.Uvarint(b)
		if n <= 0 {
			return 0, layoutErr("encoding: %s truncated or overflowing", what)
		}
		if v > max {
			return 0, layoutErr("encoding: %s %d exceeds %d", what, v, max)
		}
		b = b[n:]
		return int(v), nil
	}
	layers, err := next("layer count", MaxLayers)
	if err != nil {
		return Layout{}, err
	}
	n, err := next("part count", MaxParts)
	if err != nil {
		return Layout{}, err
	}
	l := Layout{NumLayers: layers, Parts: make([]Part, 0, min(n, len(b)/3))}
	for i := range n {
		nameLen, err := next(fmt.Sprintf("part %d: name length", i), MaxNameLen)
		if err != nil {
			return Layout{}, err
		}
		if nameLen > len(b) {
			return Layout{}, layoutErr("encoding: part %d: name truncated", i)
		}
		name := string(b[:nameLen])
		b = b[nameLen:]
		bpt, err := next(fmt.Sprintf("part %d: bytes per token", i), MaxPartBytes)
		if err != nil {
			return Layout{}, err
		}
		if len(b) == 0 {
			return Layout{}, layoutErr("encoding: part %d: sharding truncated", i)
		}
		l.Parts = append(l.Parts, Part{Name: name, BytesPerToken: bpt, Sharding: Sharding(b[0])})
		b = b[1:]
	}
	if len(b) != 0 {
		return Layout{}, layoutErr("encoding: %d bytes after the last part", len(b))
	}
	if err := l.Validate(); err != nil {
		return Layout{}, err
	}
	if !bytes.Equal(l.Encode(), in) {
		return Layout{}, layoutErr("encoding: not canonical (a varint not in its minimal form)")
	}
	return l, nil
}

// Fingerprint returns the first 16 bytes of the SHA-256 of Encode, in hex (32 characters):
// short enough for a storage namespace and a log line, long enough that two different layouts
// do not share one by chance.
func (l Layout) Fingerprint() string {
	sum := sha256.Sum256(l.Encode())
	return hex.EncodeToString(sum[:16])
}
