package storagetest

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"slices"
	"testing"

	"github.com/cpcache/cpcache/storage"
)

// Offsets of the value format (storage/format.go) that a forger needs: the two CRC-32C
// fields and what they cover.
const (
	offPayloadCRC = 40
	offHeaderCRC  = storage.HeaderSize - 4
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Reseal recomputes both checksums of a stored value (header + payload) after a forger
// changed it, as anyone can: the value then passes every check but the MACs.
func Reseal(v []byte) []byte {
	binary.LittleEndian.PutUint32(v[offPayloadCRC:], crc32.Checksum(v[storage.HeaderSize:], castagnoli))
	binary.LittleEndian.PutUint32(v[offHeaderCRC:], crc32.Checksum(v[:offHeaderCRC], castagnoli))
	return v
}

// testForgery: values whose checksums are valid but that were not written with this
// storage's MAC key under this key are never loaded; each is counted in Corrupt and Forged,
// reported with ErrForged and deleted, so that the next backup replaces it.
func testForgery(t *testing.T, b Backend) {
	e := open(t, b, "a")
	keys := e.keys(650, 6)
	src := pages(11, 6, pageSize)
	e.put(keys, src)
	// A store user with another MAC key writes under keys[3] (alien) and keys[4] (moved to keys[5]).
	otherKey := []byte("another storage key, 32 bytes..")
	alien := b.Open(t, storage.Options{Namespace: e.ns, MACKey: otherKey})
	defer alien.Close()
	if err := alien.Put(ctx(t), keys[3:5], pages(12, 2, pageSize)); err != nil {
		t.Fatalf("put with another key: %v", err)
	}
	var genuine1, alien4 []byte
	b.Mutate(t, e.s, keys[1], func(v []byte) []byte { genuine1 = slices.Clone(v); return v })
	b.Mutate(t, e.s, keys[4], func(v []byte) []byte { alien4 = slices.Clone(v); return v })
	evil := bytes.Repeat([]byte("evil"), pageSize/4)
	cases := []struct {
		name   string
		key    int
		mutate func(old []byte) []byte
	}{
		{"payload replaced, checksums recomputed", 0, func(v []byte) []byte {
			copy(v[storage.HeaderSize:], evil)
			return Reseal(v)
		}},
		{"genuine value of another key (replay)", 2, func([]byte) []byte { return slices.Clone(genuine1) }},
		{"written with another MAC key", 3, func(v []byte) []byte { return v }},
		{"another MAC key's value, key field rewritten", 5, func([]byte) []byte {
			v := slices.Clone(alien4)
			copy(v[8:32], keys[5][:])
			return Reseal(v)
		}},
	}
	for _, c := range cases {
		b.Mutate(t, e.s, keys[c.key], c.mutate)
	}
	before := e.s.Stats()
	dst, found, _ := e.get(keys, pageSize)
	for _, c := range cases {
		if found[c.key] {
			t.Errorf("%s: loaded as a hit", c.name)
		}
	}
	if !found[1] || !bytes.Equal(dst[1], src[1]) {
		t.Errorf("genuine page 1 not read back (found %v)", found)
	}
	if found[4] {
		t.Errorf("a value written with another MAC key was loaded")
	}
	st := e.s.Stats()
	if d := st.Forged - before.Forged; d != uint64(len(cases)+1) { // +1: keys[4], written with another key
		t.Errorf("stats: %d forged, want %d", d, len(cases)+1)
	}
	if d := st.Corrupt - before.Corrupt; d != st.Forged-before.Forged {
		t.Errorf("stats: %d corrupt, %d forged; forged values are counted in both", d, st.Forged-before.Forged)
	}
	if d := st.Purged - before.Purged; d != st.Forged-before.Forged {
		t.Errorf("stats: %d purged, want %d (every rejected value deleted)", d, st.Forged-before.Forged)
	}
	e.mu.Lock()
	for _, err := range e.corrupt {
		if !errors.Is(err, storage.ErrForged) || !errors.Is(err, storage.ErrCorrupt) {
			t.Errorf("OnCorrupt error %q does not wrap ErrForged and ErrCorrupt", err)
		}
	}
	e.mu.Unlock()
	// Rejected values are gone: a backup (which asks Exists first) writes them again.
	present := make([]bool, len(keys))
	if _, err := e.s.Exists(ctx(t), keys, present); err != nil {
		t.Fatalf("exists: %v", err)
	}
	if want := []bool{false, true, false, false, false, false}; !slices.Equal(present, want) {
		t.Errorf("after the get, present = %v, want %v (rejected values deleted)", present, want)
	}
	e.put(keys, src)
	if dst, _, n := e.get(keys, pageSize); n != len(keys) || !bytes.Equal(dst[0], src[0]) {
		t.Errorf("after the backup: %d of %d hits", n, len(keys))
	}
	// The other MAC key's store rejects this store's values in turn, and its fingerprint differs.
	if n, err := alien.Get(ctx(t), keys[:1], buffers(1, pageSize), nil); err != nil || n != 0 {
		t.Errorf("a store with another MAC key loaded a page: %d, %v", n, err)
	}
	if fa, fe := storage.KeyFingerprint(alien), storage.KeyFingerprint(e.s); fa == fe || fa == "" || fe == "" {
		t.Errorf("key fingerprints %q and %q: want two different ones", fa, fe)
	}
}
