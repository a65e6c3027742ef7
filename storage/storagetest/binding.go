package storagetest

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"

	"github.com/cpcache/cpcache/storage"
)

// binds returns n distinct bindings.
func binds(seed byte, n int) []storage.Binding {
	out := make([]storage.Binding, n)
	for i := range out {
		out[i].Tokens[0], out[i].Tokens[1] = seed, byte(i)
		out[i].Parent[0], out[i].Parent[31] = seed+1, byte(i)
	}
	return out
}

// testBinding: a value put with a binding (its page's token digest and parent id) is read
// back by GetBound only under the same binding; under another it is a miss, counted in
// Corrupt and Mismatched, reported with ErrMismatch, never served; the MACs cover the
// binding, so rewriting it (checksums recomputed) is a forgery.
func testBinding(t *testing.T, b Backend) {
	e := open(t, b, "a")
	keys := e.keys(700, 5)
	src := pages(13, 5, pageSize)
	bs := binds(7, 5)
	if err := e.s.PutBound(ctx(t), keys, bs, src); err != nil {
		t.Fatalf("put bound: %v", err)
	}
	dst := buffers(5, pageSize)
	found := make([]bool, 5)
	if n, err := e.s.GetBound(ctx(t), keys, bs, dst, found); err != nil || n != 5 {
		t.Fatalf("get bound under the same bindings: %d hits, %v", n, err)
	}
	for i := range src {
		if !bytes.Equal(dst[i], src[i]) {
			t.Fatalf("page %d read back differs", i)
		}
	}
	// Page 0 asked for with other tokens, page 1 under another parent; page 2's binding
	// rewritten on storage with its checksums recomputed (a forger without the MAC key).
	want := append([]storage.Binding(nil), bs...)
	want[0].Tokens[5] ^= 1
	want[1].Parent[9] ^= 1
	b.Mutate(t, e.s, keys[2], func(v []byte) []byte {
		v[44] ^= 1 // the token digest field
		return Reseal(v)
	})
	before := e.s.Stats()
	clear(found)
	n, err := e.s.GetBound(ctx(t), keys, want, dst, found)
	if err != nil {
		t.Fatal(err)
	}
	if n != 0 || found[0] || found[1] || found[2] || !found[3] || !found[4] {
		t.Fatalf("found %v (leading %d), want only pages 3 and 4", found, n)
	}
	st := e.s.Stats()
	if d := st.Mismatched - before.Mismatched; d != 2 {
		t.Errorf("Mismatched +%d, want 2 (other tokens, other parent)", d)
	}
	if d := st.Forged - before.Forged; d != 1 {
		t.Errorf("Forged +%d, want 1 (the rewritten binding)", d)
	}
	if d := st.Corrupt - before.Corrupt; d != 3 {
		t.Errorf("Corrupt +%d, want 3", d)
	}
	e.mu.Lock()
	reported := append([]error(nil), e.corrupt...)
	e.mu.Unlock()
	mism := 0
	for _, err := range reported {
		if errors.Is(err, storage.ErrMismatch) {
			mism++
			if !errors.Is(err, storage.ErrCorrupt) {
				t.Errorf("mismatch %q does not wrap ErrCorrupt", err)
			}
		}
	}
	if mism != 2 {
		t.Errorf("OnCorrupt got %d ErrMismatch errors, want 2: %v", mism, reported)
	}
	// A mismatched length of binds is a bad argument.
	if _, err := e.s.GetBound(ctx(t), keys, bs[:2], dst, nil); !errors.Is(err, storage.ErrBadArgument) {
		t.Errorf("GetBound with 2 bindings for 5 keys: %v, want ErrBadArgument", err)
	}
	if err := e.s.PutBound(ctx(t), keys, bs[:2], src); !errors.Is(err, storage.ErrBadArgument) {
		t.Errorf("PutBound with 2 bindings for 5 keys: %v, want ErrBadArgument", err)
	}
}

// testOldFormat: a value of format version 3 (written before page ids were 256-bit) is a
// miss for Get and GetBound, counted in Corrupt and OldFormat, never served.
func testOldFormat(t *testing.T, b Backend) {
	e := open(t, b, "a")
	keys := e.keys(800, 2)
	src := pages(14, 2, pageSize)
	e.put(keys, src)
	for _, k := range keys {
		b.Mutate(t, e.s, k, func(v []byte) []byte {
			binary.LittleEndian.PutUint16(v[4:6], 3)
			return Reseal(v)
		})
	}
	before := e.s.Stats()
	if _, found, n := e.get(keys[:1], pageSize); n != 0 || found[0] {
		t.Fatalf("Get served a version 3 value")
	}
	if n, err := e.s.GetBound(ctx(t), keys[1:], make([]storage.Binding, 1), buffers(1, pageSize), nil); err != nil || n != 0 {
		t.Fatalf("GetBound of a version 3 value: %d hits, %v", n, err)
	}
	st := e.s.Stats()
	if d := st.OldFormat - before.OldFormat; d != 2 {
		t.Errorf("OldFormat +%d, want 2", d)
	}
	if d := st.Corrupt - before.Corrupt; d != 2 {
		t.Errorf("Corrupt +%d, want 2", d)
	}
}
