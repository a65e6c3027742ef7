package stores_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"hash/crc32"
	"os"
	"path/filepath"
	"testing"

	"github.com/zeebo/blake3"

	"github.com/cpcache/cpcache/hicache/core"
	"github.com/cpcache/cpcache/internal/mix"
	"github.com/cpcache/cpcache/storage"
	"github.com/cpcache/cpcache/storage/stores"
)

// How cpcache stored a page before page ids were 256-bit, copied here: the 64-bit chained
// page hash (FNV-1a + mixer, seeded by the isolation key), the key derived from it and the
// TP shard (storage.NewKeyBytes of hash ‖ shard, big endian), and the version 3 value format
// (an 80-byte header, keyed BLAKE3 MACs). testdata/v3-store holds three pages the code of
// that time wrote (tokens 1..12 with -9 for 9, key "tenant", page i's bytes i*64+j): the
// copy must reproduce them byte for byte.

const (
	v3Root      = 0x243f6a8885a308d3
	v3FNVOffset = 0xcbf29ce484222325
	v3FNVPrime  = 0x100000001b3
	v3MACKey    = "v3 fixture storage MAC key......"
)

func v3KeyRoot(key string) uint64 {
	if key == "" {
		return v3Root
	}
	x := uint64(v3FNVOffset)
	for i := 0; i < len(key); i++ {
		x = (x ^ uint64(key[i])) * v3FNVPrime
	}
	r := mix.Mix64(x^uint64(len(key))<<56) ^ v3Root
	if r == v3Root {
		r = ^r
	}
	return r
}

func v3Hashes(key string, tokens []int32, P int) []uint64 {
	out := make([]uint64, len(tokens)/P)
	h := v3KeyRoot(key)
	for i := range out {
		x := h ^ v3FNVOffset
		for _, t := range tokens[i*P : (i+1)*P] {
			x = (x ^ uint64(uint32(t))) * v3FNVPrime
		}
		h = mix.Mix64(x)
		out[i] = h
	}
	return out
}

func v3Key(ns storage.Namespace, h uint64, shard uint32) storage.Key {
	var b [12]byte
	binary.BigEndian.PutUint64(b[:8], h)
	binary.BigEndian.PutUint32(b[8:], shard)
	return storage.NewKeyBytes(ns, b[:])
}

func v3Value(t *testing.T, key storage.Key, payload []byte) []byte {
	var mk [32]byte
	blake3.DeriveKey("cpcache storage value MAC v3", []byte(v3MACKey), mk[:])
	mac := func(out []byte, parts ...[]byte) {
		h, err := blake3.NewKeyed(mk[:])
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range parts {
			h.Write(p)
		}
		copy(out, h.Sum(nil))
	}
	crc := crc32.MakeTable(crc32.Castagnoli)
	v := make([]byte, 80+len(payload))
	copy(v[0:4], "CPKV")
	binary.LittleEndian.PutUint16(v[4:6], 3)
	copy(v[8:32], key[:])
	binary.LittleEndian.PutUint64(v[32:40], uint64(len(payload)))
	binary.LittleEndian.PutUint32(v[40:44], crc32.Checksum(payload, crc))
	mac(v[44:60], []byte{'P'}, v[:44], payload)
	mac(v[60:76], []byte{'H'}, v[:60])
	binary.LittleEndian.PutUint32(v[76:80], crc32.Checksum(v[:76], crc))
	copy(v[80:], payload)
	return v
}

// TestOldFormatStoreNotServed: a directory store filled as cpcache filled it before page
// ids were 256-bit (the three pages of testdata/v3-store, which the code of that time wrote,
// and 60 more written by the copy of its encoder) serves none of its pages: the keys of the
// same prompts under page ids (storage.PageKey) are none of the old keys, and each old value
// read under its own key is a miss counted in Stats.OldFormat.
func TestOldFormatStoreNotServed(t *testing.T) {
	ns, err := storage.NewNamespace("v3-fixture;page_tokens=4;page_bytes=64")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.CopyFS(dir, os.DirFS("testdata/v3-store")); err != nil {
		t.Fatal(err)
	}
	st, err := stores.Open(context.Background(), "file://"+dir, storage.Options{Namespace: ns, MACKey: []byte(v3MACKey)})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx := context.Background()
	const P = 4
	page := func(i int) []byte {
		p := make([]byte, 64)
		for j := range p {
			p[j] = byte(i*64 + j)
		}
		return p
	}
	// The copy of the old encoder writes the fixture's bytes exactly.
	fixture := []int32{1, 2, 3, 4, 5, 6, 7, 8, -9, 10, 11, 12}
	for i, h := range v3Hashes("tenant", fixture, P) {
		k := v3Key(ns, h, 0)
		got, err := os.ReadFile(stores.DirPath(st, k))
		if err != nil {
			t.Fatalf("fixture page %d: %v", i, err)
		}
		if want := v3Value(t, k, page(i)); !bytes.Equal(got, want) {
			t.Fatalf("fixture page %d differs from the copy of the old encoder", i)
		}
	}
	// More prompts under several keys and two TP shards, written as the old code would.
	type prompt struct {
		key  string
		toks []int32
	}
	prompts := []prompt{{"tenant", fixture}}
	for k, key := range []string{"", "tenant", "other"} {
		toks := make([]int32, 10*P)
		for i := range toks {
			toks[i] = int32(1000*k + 7*i)
		}
		prompts = append(prompts, prompt{key, toks})
	}
	var oldKeys []storage.Key
	for _, pr := range prompts {
		key, toks := pr.key, pr.toks
		for shard := range uint32(2) {
			for i, h := range v3Hashes(key, toks, P) {
				k := v3Key(ns, h, shard)
				oldKeys = append(oldKeys, k)
				path := stores.DirPath(st, k)
				if _, err := os.Stat(path); err == nil {
					continue // a fixture page
				}
				if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, v3Value(t, k, page(i)), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			// The new code asks for the same pages by their page ids: none is stored.
			ids := core.KeyPrefixHashes(key, toks, P)
			keys := make([]storage.Key, len(ids))
			binds := make([]storage.Binding, len(ids))
			for i, id := range ids {
				keys[i] = storage.PageKey(ns, id, shard)
				binds[i].Tokens = core.TokenDigest(toks[i*P : (i+1)*P])
				binds[i].Parent = core.KeyRoot(key)
				if i > 0 {
					binds[i].Parent = ids[i-1]
				}
			}
			present := make([]bool, len(keys))
			if n, err := st.Exists(ctx, keys, present); err != nil || n != 0 {
				t.Fatalf("key %q shard %d: %d pages present under page-id keys (%v)", key, shard, n, err)
			}
			dst := make([][]byte, len(keys))
			for i := range dst {
				dst[i] = make([]byte, 64)
			}
			if n, err := st.GetBound(ctx, keys, binds, dst, make([]bool, len(keys))); err != nil || n != 0 {
				t.Fatalf("key %q shard %d: %d pages served under page-id keys (%v)", key, shard, n, err)
			}
		}
	}
	if len(oldKeys) < 60 {
		t.Fatalf("%d old pages written", len(oldKeys))
	}
	// Each old value read under its own (old) key is a miss, counted.
	dst := make([][]byte, len(oldKeys))
	for i := range dst {
		dst[i] = make([]byte, 64)
	}
	found := make([]bool, len(oldKeys))
	if n, err := st.Get(ctx, oldKeys, dst, found); err != nil || n != 0 {
		t.Fatalf("old keys: %d values served (%v)", n, err)
	}
	s := st.Stats()
	if s.Hits != 0 || s.OldFormat != uint64(len(oldKeys)) || s.Corrupt != uint64(len(oldKeys)) {
		t.Fatalf("stats %+v: want 0 hits and %d old-format values", s, len(oldKeys))
	}
}
