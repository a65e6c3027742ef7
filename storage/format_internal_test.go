package storage

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"strings"
	"testing"
)

// TestHeaderModes: a keyed store's values carry MACs that verify under its key only; an
// insecure store's values carry no MAC (flag set, MAC fields zero) and each kind of store
// rejects the other's values as forged; a value of the HMAC-SHA256 format 2 is refused
// with a reason that names it.
func TestHeaderModes(t *testing.T) {
	key, payload := NewKey(Namespace{}, 7), bytes.Repeat([]byte("kv"), 512)
	keyed, other, insecure := NewMAC(bytes.Repeat([]byte("k"), 32)), NewMAC(bytes.Repeat([]byte("o"), 32)), NewMAC(nil)
	encode := func(m *MAC) []byte {
		var hdr [HeaderSize]byte
		m.EncodeHeader(&hdr, key, nil, payload)
		return hdr[:]
	}
	check := func(m *MAC, hdr []byte) error {
		if err := m.CheckHeader(hdr, key, nil, len(payload)); err != nil {
			return err
		}
		return m.CheckPayload(hdr, payload)
	}

	hk, hi := encode(keyed), encode(insecure)
	if err := check(keyed, hk); err != nil {
		t.Errorf("keyed value under its key: %v", err)
	}
	if err := check(insecure, hi); err != nil {
		t.Errorf("insecure value in an insecure store: %v", err)
	}
	if f := binary.LittleEndian.Uint16(hi[6:8]); f != flagUnauthenticated || !bytes.Equal(hi[offNonce:layoutV5.headerCRC()], make([]byte, nonceSize+2*macSize)) || hi[offAlg] != 0 {
		t.Errorf("insecure header: flags %#x, MAC fields %x", f, hi[offAlg:layoutV5.headerCRC()])
	}
	for _, c := range []struct {
		name string
		m    *MAC
		hdr  []byte
		want string
	}{
		{"keyed value, other key", other, hk, "header MAC"},
		{"insecure value, keyed store", keyed, hi, "without a MAC key"},
		{"keyed value, insecure store", insecure, hk, "insecure store does not have"},
	} {
		if err := check(c.m, c.hdr); !errors.Is(err, ErrForged) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v; want ErrForged saying %q", c.name, err, c.want)
		}
	}

	v2 := bytes.Clone(hk)
	binary.LittleEndian.PutUint16(v2[4:6], 2)
	binary.LittleEndian.PutUint32(v2[layoutV5.headerCRC():], Checksum(v2[:layoutV5.headerCRC()]))
	if err := check(keyed, v2); err == nil || errors.Is(err, ErrForged) || !strings.Contains(err.Error(), "version 2 values carry HMAC-SHA256") {
		t.Errorf("format 2 value: %v", err)
	}
}

// v4Golden is a version 4 value's header (payload: "v4 page " 64 times, key NewKey of
// namespace "v4 golden" and 42, tokens digest 0..31, parent 100..131) as the previous
// release wrote it under v4GoldenKey, and the same value of an insecure store (no binding).
const (
	v4Golden         = "43504b5604000000508d64c02c4ce0bf262aaf97a6fc4fa1f6fd5a0fe0711a200002000000000000809b29ef000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f6465666768696a6b6c6d6e6f707172737475767778797a7b7c7d7e7f80818283a81e58ad757fd216ea8e1d85daab452da1c1698e3d1652d07c938e9d78ef9b7ddc20f52b"
	v4GoldenInsecure = "43504b5604000100508d64c02c4ce0bf262aaf97a6fc4fa1f6fd5a0fe0711a200002000000000000809b29ef00000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000088a7e79b"
	v4GoldenKey      = "v4 golden storage MAC key......."
)

func v4GoldenValue(t *testing.T) (hdr, payload []byte, key Key, bind Binding) {
	t.Helper()
	hdr, err := hex.DecodeString(v4Golden)
	if err != nil || len(hdr) != 144 {
		t.Fatalf("golden: %d bytes, %v", len(hdr), err)
	}
	ns, err := NewNamespace("v4 golden")
	if err != nil {
		t.Fatal(err)
	}
	for i := range bind.Tokens {
		bind.Tokens[i], bind.Parent[i] = byte(i), byte(100+i)
	}
	return hdr, bytes.Repeat([]byte("v4 page "), 64), NewKey(ns, 42), bind
}

// TestFormatVersions: a value of each version read is read right under MACs of either
// algorithm (the reader's own choice of algorithm does not matter); HeaderLen says each
// one's header size; a tampered value of each version and algorithm is refused (forged or
// damaged, never read); versions 1 to 3, and an unknown one, are refused, never misread.
func TestFormatVersions(t *testing.T) {
	hdr4, payload, key, bind := v4GoldenValue(t)
	mk := []byte(v4GoldenKey)
	readers := []*MAC{NewMACAlg(mk, MACBlake3), NewMACAlg(mk, MACGMAC)}
	check := func(m *MAC, hdr, payload []byte, bind *Binding) error {
		if err := m.CheckHeader(hdr, key, bind, len(payload)); err != nil {
			return err
		}
		var dst = make([]byte, len(payload))
		if err := m.CheckPayloadCopy(hdr, payload, dst); err != nil {
			return err
		}
		if !bytes.Equal(dst, payload) {
			return errors.New("payload copied wrong")
		}
		return nil
	}
	values := map[string][]byte{"v4": hdr4}
	for _, w := range []MACAlg{MACBlake3, MACGMAC} {
		var h [HeaderSize]byte
		NewMACAlg(mk, w).EncodeHeader(&h, key, &bind, payload)
		if MACAlg(h[offAlg]) != w || binary.LittleEndian.Uint16(h[4:6]) != 5 {
			t.Fatalf("%v: header names algorithm %d, version %d", w, h[offAlg], binary.LittleEndian.Uint16(h[4:6]))
		}
		values["v5-"+w.String()] = h[:]
	}
	for name, hdr := range values {
		if got, want := HeaderLen(hdr), map[bool]int{true: 144, false: 160}[name == "v4"]; got != want {
			t.Errorf("%s: HeaderLen %d, want %d", name, got, want)
		}
		// The eviction's order reads the parent id of a header of either version.
		if p, ok := PeekParent(hdr); !ok || p != bind.Parent {
			t.Errorf("%s: PeekParent %x %v, want %x", name, p, ok, bind.Parent)
		}
		if _, ok := PeekParent(hdr[:HeaderLen(hdr)-1]); ok {
			t.Errorf("%s: PeekParent read a header cut short", name)
		}
		for _, m := range readers {
			if err := check(m, hdr, payload, &bind); err != nil {
				t.Errorf("%s read by a %v writer: %v", name, m.Alg(), err)
			}
			if err := check(m, hdr, payload, &Binding{}); !errors.Is(err, ErrMismatch) {
				t.Errorf("%s under another binding: %v, want ErrMismatch", name, err)
			}
			l, _ := layoutOf(hdr)
			// A payload bit flipped: damage (the checksum says so).
			p := bytes.Clone(payload)
			p[100] ^= 1
			if err := check(m, hdr, p, &bind); err == nil || errors.Is(err, ErrForged) || !strings.Contains(err.Error(), "payload checksum") {
				t.Errorf("%s, payload flipped: %v, want a checksum error", name, err)
			}
			// The payload replaced and its checksum recomputed: forged.
			h := bytes.Clone(hdr)
			p = bytes.Repeat([]byte("evil"), len(payload)/4)
			binary.LittleEndian.PutUint32(h[offPayloadCRC:], Checksum(p))
			binary.LittleEndian.PutUint32(h[l.headerCRC():], Checksum(h[:l.headerCRC()]))
			if err := check(m, h, p, &bind); !errors.Is(err, ErrForged) {
				t.Errorf("%s, payload replaced: %v, want ErrForged", name, err)
			}
			// Every header byte but the CRC's flipped in turn: never read.
			for i := range l.headerCRC() {
				h := bytes.Clone(hdr)
				h[i] ^= 0x10
				binary.LittleEndian.PutUint32(h[l.headerCRC():], Checksum(h[:l.headerCRC()]))
				if err := check(m, h, payload, &bind); err == nil {
					t.Errorf("%s, header byte %d flipped (CRC recomputed): read", name, i)
				}
			}
		}
	}
	// A GMAC value whose algorithm byte says BLAKE3 (or the reverse), header resealed: forged.
	for _, w := range []MACAlg{MACBlake3, MACGMAC} {
		h := bytes.Clone(values["v5-"+w.String()])
		h[offAlg] = byte(MACBlake3 + MACGMAC - w)
		binary.LittleEndian.PutUint32(h[layoutV5.headerCRC():], Checksum(h[:layoutV5.headerCRC()]))
		if err := check(readers[0], h, payload, &bind); !errors.Is(err, ErrForged) {
			t.Errorf("%v value relabelled: %v, want ErrForged", w, err)
		}
	}
	// Insecure v4 values are read by an insecure store, refused by a keyed one.
	ins, _ := hex.DecodeString(v4GoldenInsecure)
	if err := check(NewMAC(nil), ins, payload, nil); err != nil {
		t.Errorf("insecure v4 value: %v", err)
	}
	if err := check(readers[1], ins, payload, nil); !errors.Is(err, ErrForged) {
		t.Errorf("insecure v4 value in a keyed store: %v", err)
	}
	// Older and unknown versions: refused by version, whatever their bytes.
	for _, v := range []uint16{1, 2, 3, 6} {
		for name, hdr := range values {
			h := bytes.Clone(hdr)
			binary.LittleEndian.PutUint16(h[4:6], v)
			err := check(readers[1], h, payload, &bind)
			if err == nil || (v < 4) != errors.Is(err, ErrOldFormat) {
				t.Errorf("%s as version %d: %v", name, v, err)
			}
			if _, ok := PeekParent(h); ok {
				t.Errorf("%s as version %d: PeekParent read it", name, v)
			}
			if HeaderLen(h) != HeaderSize {
				t.Errorf("%s as version %d: HeaderLen %d", name, v, HeaderLen(h))
			}
		}
	}
}

// TestGMACNonces: every value written draws a fresh nonce, so two writes of the same page
// under the same key never share one (GMAC's one requirement).
func TestGMACNonces(t *testing.T) {
	m := NewMACAlg([]byte("nonce test key, 32 bytes long..."), MACGMAC)
	key, payload := NewKey(Namespace{}, 1), []byte("same page")
	seen := map[[nonceSize]byte]bool{}
	for range 1000 {
		var h [HeaderSize]byte
		m.EncodeHeader(&h, key, nil, payload)
		n := [nonceSize]byte(h[offNonce:])
		if seen[n] || n == [nonceSize]byte{} {
			t.Fatalf("nonce %x drawn twice (or zero)", n)
		}
		seen[n] = true
	}
}
