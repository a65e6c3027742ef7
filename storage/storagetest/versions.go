package storagetest

import (
	"bytes"
	"context"
	"encoding/binary"
	"slices"
	"testing"

	"github.com/zeebo/blake3"

	"github.com/cpcache/cpcache/storage"
)

// V4Value is the version 4 stored value (the previous release's format: a 144-byte
// header, keyed BLAKE3 payload and header MACs, no algorithm field, no nonce) of payload
// under key, bound to bind (nil: the zero Binding), authenticated with MAC key macKey, as
// that release wrote it (storage/format.go).
func V4Value(macKey []byte, key storage.Key, bind *storage.Binding, payload []byte) []byte {
	var mk [32]byte
	blake3.DeriveKey("cpcache storage value MAC v3", macKey, mk[:])
	mac := func(out []byte, parts ...[]byte) {
		h, err := blake3.NewKeyed(mk[:])
		if err != nil {
			panic(err)
		}
		for _, p := range parts {
			h.Write(p)
		}
		copy(out, h.Sum(nil))
	}
	v := make([]byte, 144+len(payload))
	copy(v[0:4], "CPKV")
	binary.LittleEndian.PutUint16(v[4:6], 4)
	copy(v[8:32], key[:])
	binary.LittleEndian.PutUint64(v[32:40], uint64(len(payload)))
	binary.LittleEndian.PutUint32(v[40:44], storage.Checksum(payload))
	if bind != nil {
		copy(v[44:76], bind.Tokens[:])
		copy(v[76:108], bind.Parent[:])
	}
	mac(v[108:124], []byte{'P'}, v[:108], payload)
	mac(v[124:140], []byte{'H'}, v[:124])
	binary.LittleEndian.PutUint32(v[140:144], storage.Checksum(v[:140]))
	copy(v[144:], payload)
	return v
}

// testFormatVersions: a value of format version 4 (written by the previous release under
// the same MAC key) is read right, by Get and by GetBound under its binding; a version 4
// value whose payload was replaced (checksum recomputed) is forged, one under another
// binding a mismatch: never read. Values written today (version 5) beside them read too.
func testFormatVersions(t *testing.T, b Backend) {
	macKey := []byte("conformance: format versions key")
	e := &env{t: t, ns: namespace(t, "versions")}
	e.s = b.Open(t, storage.Options{Namespace: e.ns, MACKey: macKey})
	t.Cleanup(func() {
		e.s.Clear(context.Background())
		e.s.Close()
	})
	keys := e.keys(900, 4)
	src := pages(15, 4, pageSize)
	binds := make([]storage.Binding, 4)
	for i := range binds {
		binds[i].Tokens[0], binds[i].Parent[0] = byte(i+1), byte(i+7)
	}
	if err := e.s.PutBound(ctx(t), keys, binds, src); err != nil {
		t.Fatal(err)
	}
	b.Mutate(t, e.s, keys[0], func([]byte) []byte { return V4Value(macKey, keys[0], &binds[0], src[0]) })
	b.Mutate(t, e.s, keys[1], func([]byte) []byte {
		v := V4Value(macKey, keys[1], &binds[1], src[1])
		copy(v[144:], bytes.Repeat([]byte("evil"), pageSize/4))
		binary.LittleEndian.PutUint32(v[40:44], storage.Checksum(v[144:]))
		binary.LittleEndian.PutUint32(v[140:144], storage.Checksum(v[:140]))
		return v
	})
	b.Mutate(t, e.s, keys[2], func([]byte) []byte { return V4Value(macKey, keys[2], &binds[3], src[2]) })
	before := e.s.Stats()
	dst, found := buffers(4, pageSize), make([]bool, 4)
	if _, err := e.s.GetBound(ctx(t), keys, binds, dst, found); err != nil {
		t.Fatal(err)
	}
	if want := []bool{true, false, false, true}; !slices.Equal(found, want) {
		t.Fatalf("found %v, want %v (v4 genuine, v4 forged, v4 of another binding, v5)", found, want)
	}
	for _, i := range []int{0, 3} {
		if !bytes.Equal(dst[i], src[i]) {
			t.Errorf("page %d read back differs", i)
		}
	}
	st := e.s.Stats()
	if d := st.Forged - before.Forged; d != 1 {
		t.Errorf("Forged +%d, want 1", d)
	}
	if d := st.Mismatched - before.Mismatched; d != 1 {
		t.Errorf("Mismatched +%d, want 1", d)
	}
	if d := st.OldFormat - before.OldFormat; d != 0 {
		t.Errorf("OldFormat +%d: version 4 values are read, not old", d)
	}
}
