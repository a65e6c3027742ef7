package storage

import (
	"bytes"
	"encoding/binary"
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
	if f := binary.LittleEndian.Uint16(hi[6:8]); f != flagUnauthenticated || !bytes.Equal(hi[offPayloadMAC:offHeaderCRC], make([]byte, 2*macSize)) {
		t.Errorf("insecure header: flags %#x, MAC fields %x", f, hi[offPayloadMAC:offHeaderCRC])
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
	binary.LittleEndian.PutUint32(v2[offHeaderCRC:], Checksum(v2[:offHeaderCRC]))
	if err := check(keyed, v2); err == nil || errors.Is(err, ErrForged) || !strings.Contains(err.Error(), "version 2 values carry HMAC-SHA256") {
		t.Errorf("format 2 value: %v", err)
	}
}
