package kvlayout

import (
	"bytes"
	"encoding/hex"
	"testing"
)

func TestEncodeDecodeRoundTrip(t *testing.T) {
	layouts := []Layout{
		kv(1, 1),
		{NumLayers: MaxLayers, Parts: []Part{{"kv", 1152, Replicated}}},
		{NumLayers: 3, Parts: []Part{{"a", MaxPartBytes / (1 << 20) / 3, Sharded}, {"b.c-d_e", 300, Replicated}}},
	}
	for _, name := range PresetNames() {
		l, _ := Preset(name)
		layouts = append(layouts, l)
	}
	for _, l := range layouts {
		enc := l.Encode()
		got, err := Decode(enc)
		if err != nil {
			t.Errorf("%v: Decode(Encode) = %v", l, err)
			continue
		}
		if d := got.Diff(l); d != "" {
			t.Errorf("%v: Decode(Encode) differs: %s", l, d)
		}
		if !bytes.Equal(got.Encode(), enc) || got.Fingerprint() != l.Fingerprint() {
			t.Errorf("%v: re-encoding differs", l)
		}
	}
}

// The encoding and the fingerprint are part of the storage namespace: a change to either
// makes every stored page unreachable, so both are pinned.
func TestEncodingIsStable(t *testing.T) {
	l := Layout{NumLayers: 300, Parts: []Part{{"k", 2048, Sharded}, {"ix", 5, Replicated}}}
	want := []byte{'k', 'v', 'l', 1, 0xac, 0x02, 2, 1, 'k', 0x80, 0x10, 1, 2, 'i', 'x', 5, 2}
	if got := l.Encode(); !bytes.Equal(got, want) {
		t.Errorf("Encode = %x, want %x", got, want)
	}
	for _, c := range []struct{ preset, fingerprint string }{
		// sha256 of "kvl" 01 20 02 01 'k' 80 10 01 01 'v' 80 10 01, first 16 bytes
		{"llama-3-8b", "0f03f6187032bb7d5a52ef3eee0c8121"},
		// sha256 of "kvl" 01 3d 01 02 'k' 'v' 80 09 02, first 16 bytes
		{"deepseek-v3", "fbba38576556a6b2de4b8f41d8ee9815"},
		{"llama-3-70b", "caed252b15c0719aa0e9831289d4dbc1"},
		{"llama-3-8b-indexer", "96a6bb6250e3bdac65717b40435d5d81"},
	} {
		l, _ := Preset(c.preset)
		if got := l.Fingerprint(); got != c.fingerprint || len(got) != 32 {
			t.Errorf("%s: Fingerprint = %s, want %s", c.preset, got, c.fingerprint)
		}
	}
}

func TestFingerprintSeparatesLayouts(t *testing.T) {
	base := kv(32, 2048)
	seen := map[string]string{base.Fingerprint(): base.String()}
	for _, l := range []Layout{
		kv(33, 2048), kv(32, 2050),
		{NumLayers: 32, Parts: []Part{{"k", 2048, Sharded}, {"v", 2048, Replicated}}},
		{NumLayers: 32, Parts: []Part{{"v", 2048, Sharded}, {"k", 2048, Sharded}}},
		{NumLayers: 32, Parts: []Part{{"k", 2048, Sharded}}},
		{NumLayers: 32, Parts: []Part{{"k", 2048, Sharded}, {"v", 2048, Sharded}, {"i", 1, Replicated}}},
	} {
		fp := l.Fingerprint()
		if other, dup := seen[fp]; dup {
			t.Errorf("%s and %s share fingerprint %s", l, other, fp)
		}
		seen[fp] = l.String()
		if len(fp) != 32 {
			t.Errorf("fingerprint %q is not 32 hex digits", fp)
		}
		if _, err := hex.DecodeString(fp); err != nil {
			t.Errorf("fingerprint %q: %v", fp, err)
		}
	}
	if kv(32, 2048).Fingerprint() != base.Fingerprint() {
		t.Error("equal layouts have different fingerprints")
	}
}

func TestDecodeRejects(t *testing.T) {
	good := kv(2, 4).Encode() // kvl 1 | 2 | 2 | 1 'k' 4 1 | 1 'v' 4 1
	with := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), good...)) }
	for _, c := range []struct {
		name   string
		b      []byte
		index  int
		part   string
		reason string
	}{
		{"empty", nil, -1, "", `no "kvl" magic`},
		{"magic only", []byte("kvl"), -1, "", "magic"},
		{"bad magic", with(func(b []byte) []byte { b[0] = 'K'; return b }), -1, "", "magic"},
		{"other version", with(func(b []byte) []byte { b[3] = 2; return b }), -1, "", "version 2, this package reads 1"},
		{"no layer count", []byte("kvl\x01"), -1, "", "layer count truncated"},
		{"truncated varint", []byte("kvl\x01\x80"), -1, "", "layer count truncated"},
		{"too many layers", []byte("kvl\x01\x81\x80\x04\x01"), -1, "", "layer count 65537 exceeds 65536"},
		{"too many parts", []byte("kvl\x01\x02\x81\x02"), -1, "", "part count 257 exceeds 256"},
		{"no parts", []byte("kvl\x01\x02\x00"), -1, "", "no parts"},
		{"zero layers", []byte("kvl\x01\x00\x01\x01k\x04\x01"), -1, "", "layer count 0 is not positive"},
		{"name truncated", good[:11], -1, "", "part 1: name truncated"},
		{"long name", []byte("kvl\x01\x01\x01\x41"), -1, "", "part 0: name length 65 exceeds 64"},
		{"bytes truncated", good[:12], -1, "", "part 1: bytes per token truncated"},
		{"sharding truncated", good[:13], -1, "", "part 1: sharding truncated"},
		{"trailing byte", append(append([]byte(nil), good...), 0), -1, "", "1 bytes after the last part"},
		{"huge bytes", []byte("kvl\x01\x01\x01\x01k\x81\x80\x80\x80\x04\x01"), -1, "", "part 0: bytes per token 1073741825 exceeds"},
		{"non-minimal varint", []byte("kvl\x01\x82\x00\x02\x01k\x04\x01\x01v\x04\x01"), -1, "", "not canonical"},
		{"bad sharding", with(func(b []byte) []byte { b[len(b)-1] = 3; return b }), 1, "v", "sharding(3)"},
		{"duplicate name", with(func(b []byte) []byte { b[len(b)-3] = 'k'; return b }), 1, "k", "duplicate name"},
		{"zero bytes", with(func(b []byte) []byte { b[len(b)-2] = 0; return b }), 1, "v", "bytes per token 0"},
	} {
		t.Run(c.name, func(t *testing.T) {
			l, err := Decode(c.b)
			if err == nil {
				t.Fatalf("Decode(%x) = %v, want an error", c.b, l)
			}
			wantErr(t, err, c.index, c.part, c.reason)
		})
	}
	if _, err := Decode(good); err != nil {
		t.Fatalf("the good encoding does not decode: %v", err)
	}
}

// Decode works on its input only: it neither keeps nor changes it.
func TestDecodeDoesNotAliasItsInput(t *testing.T) {
	b := kv(2, 4).Encode()
	l, err := Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	for i := range b {
		b[i] = 0
	}
	if l.String() != "layers=2;k=4:sharded;v=4:sharded" {
		t.Errorf("changing the input changed the layout: %v", l)
	}
}
