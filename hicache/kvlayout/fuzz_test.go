package kvlayout

import (
	"bytes"
	"errors"
	"testing"
)

// roundTrips checks that a valid layout survives String/Parse and Encode/Decode unchanged,
// and that its fingerprint is its encoding's.
func roundTrips(t *testing.T, l Layout) {
	t.Helper()
	if err := l.Validate(); err != nil {
		t.Fatalf("%v does not validate: %v", l, err)
	}
	text := l.String()
	back, err := Parse(text)
	if err != nil {
		t.Fatalf("Parse(%q) of a valid layout's String: %v", text, err)
	}
	if d := back.Diff(l); d != "" || back.String() != text {
		t.Fatalf("Parse(%q) differs: %s", text, d)
	}
	enc := l.Encode()
	dec, err := Decode(enc)
	if err != nil {
		t.Fatalf("Decode(Encode(%q)): %v", text, err)
	}
	if d := dec.Diff(l); d != "" || !bytes.Equal(dec.Encode(), enc) || dec.Fingerprint() != l.Fingerprint() {
		t.Fatalf("Decode(Encode(%q)) differs: %s", text, d)
	}
}

func FuzzParse(f *testing.F) {
	for _, name := range PresetNames() {
		f.Add(name)
		l, _ := Preset(name)
		f.Add(l.String())
	}
	for _, s := range []string{"", "layers=1;a=1:replicated", " layers = 2 ; k = 4 : sharded ", "layers=1;k=1:sharded;k=1:sharded",
		"layers=65536;k=16383:sharded", "layers=1;layers=1", ";", "=", "k=1:", "layers=00;x=1073741824:replicated"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		l, err := Parse(s)
		if err != nil {
			if !errors.Is(err, ErrBadLayout) {
				t.Fatalf("Parse(%q): %v does not wrap ErrBadLayout", s, err)
			}
			return
		}
		roundTrips(t, l)
	})
}

func FuzzDecode(f *testing.F) {
	for _, name := range PresetNames() {
		l, _ := Preset(name)
		f.Add(l.Encode())
	}
	f.Add([]byte("kvl\x01\x82\x00\x02\x01k\x04\x01\x01v\x04\x01"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		l, err := Decode(b)
		if err != nil {
			if !errors.Is(err, ErrBadLayout) {
				t.Fatalf("Decode(%x): %v does not wrap ErrBadLayout", b, err)
			}
			return
		}
		if !bytes.Equal(l.Encode(), b) {
			t.Fatalf("Decode(%x) accepted a non-canonical encoding of %v", b, l)
		}
		roundTrips(t, l)
	})
}
