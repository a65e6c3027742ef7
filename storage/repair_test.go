package storage_test

import (
	"bytes"
	"context"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/cpcache/cpcache/storage"
	"github.com/cpcache/cpcache/storage/storagetest"
)

// TestDirExistsVerifies: Exists on a file store authenticates what it counts: the prefix
// query (no flags) each header, the backup's form (with flags) each whole value. A value that
// fails is absent, counted, reported and deleted, so the backup rewrites it.
func TestDirExistsVerifies(t *testing.T) {
	ns := mustNamespace(t, "exists-verifies")
	var reports []error
	s := openURL(t, "file://"+t.TempDir(), storage.Options{Namespace: ns, Workers: 1, OnCorrupt: func(err error) { reports = append(reports, err) }})
	defer s.Close()
	keys := []storage.Key{storage.NewKey(ns, 1), storage.NewKey(ns, 2), storage.NewKey(ns, 3)}
	pages := [][]byte{bytes.Repeat([]byte{1}, 512), bytes.Repeat([]byte{2}, 512), bytes.Repeat([]byte{3}, 512)}
	if err := s.Put(testCtx(t), keys, pages); err != nil {
		t.Fatal(err)
	}
	flip := func(k storage.Key, off int) {
		mutateDirFile(t, s, k, func(v []byte) []byte { v[off] ^= 0x40; return v })
	}
	flip(keys[0], 35)                     // the header's length field
	flip(keys[1], storage.HeaderSize+100) // the payload
	if n, err := s.Exists(testCtx(t), keys, nil); n != 0 || err != nil {
		t.Fatalf("prefix query over a damaged header: %d, %v; want 0", n, err)
	}
	if n, err := s.Exists(testCtx(t), keys[1:], nil); n != 2 || err != nil {
		t.Fatalf("prefix query over a damaged payload: %d, %v; want 2 (headers only: get verifies payloads)", n, err)
	}
	present := make([]bool, 3)
	if _, err := s.Exists(testCtx(t), keys, present); err != nil || present[0] || present[1] || !present[2] {
		t.Fatalf("exists with flags: %v, %v; want [false false true]", present, err)
	}
	for i, k := range keys[:2] {
		if _, err := os.Stat(storage.DirPath(s, k)); !os.IsNotExist(err) {
			t.Errorf("damaged value %d was not deleted: %v", i, err)
		}
	}
	if st := s.Stats(); st.Corrupt != 2 || st.Purged != 2 || st.Forged != 0 || len(reports) != 2 {
		t.Errorf("stats %+v, %d reports; want 2 corrupt, 2 purged, 0 forged, 2 reports", st, len(reports))
	}
}

// TestDirStoreRepairsItself replays one workload against a file store five times, as a
// serving cache meets it: each conversation asks once how much of its history is stored,
// reads that prefix, computes the rest and backs the history up (later turns would hit L1
// and L2, not storage). A first run fills the store, a second measures the undamaged storage
// hit rate, then 10% of the files are damaged (bit flips in headers and payloads, forged
// payloads with valid checksums). The damaged run loses hits at the first bad page of each
// history but rejects, deletes and rewrites every bad page of the histories it backs up, so
// the run after it must be back to at least 90% of the undamaged rate.
func TestDirStoreRepairsItself(t *testing.T) {
	const (
		conversations = 48
		historyPages  = 24
		pageSize      = 512
	)
	dir := t.TempDir()
	ns := mustNamespace(t, "repairs-itself")
	page := func(k storage.Key) []byte { return bytes.Repeat(k[8:16], pageSize/8) }
	run := func() (rate float64, st storage.Stats) {
		s := openURL(t, "file://"+dir, storage.Options{Namespace: ns})
		defer s.Close()
		ctx := context.Background()
		hit := 0
		for c := range conversations {
			keys := make([]storage.Key, historyPages)
			for i := range keys {
				keys[i] = storage.NewKey(ns, uint64(c)<<32|uint64(i))
			}
			n, err := s.Exists(ctx, keys, nil)
			if err != nil {
				t.Fatal(err)
			}
			dst := make([][]byte, n)
			for i := range dst {
				dst[i] = make([]byte, pageSize)
			}
			got, err := s.Get(ctx, keys[:n], dst, nil)
			if err != nil {
				t.Fatal(err)
			}
			for i := range got {
				if !bytes.Equal(dst[i], page(keys[i])) {
					t.Fatalf("a wrong page was loaded for key %s", keys[i])
				}
			}
			hit += got
			present := make([]bool, len(keys))
			if _, err := s.Exists(ctx, keys, present); err != nil {
				t.Fatal(err)
			}
			for i, p := range present {
				if !p {
					if err := s.Put(ctx, keys[i:i+1], [][]byte{page(keys[i])}); err != nil {
						t.Fatal(err)
					}
				}
			}
		}
		return float64(hit) / float64(conversations*historyPages), s.Stats()
	}
	run()
	undamaged, _ := run()
	if undamaged < 0.99 {
		t.Fatalf("undamaged storage hit rate %.3f; want all pages stored by the first run", undamaged)
	}
	files, err := filepath.Glob(filepath.Join(dir, ns.String(), "*", "*"))
	if err != nil || len(files) != conversations*historyPages {
		t.Fatalf("%d files (%v); want %d", len(files), err, conversations*historyPages)
	}
	r := rand.New(rand.NewPCG(15, 2))
	damaged := 0
	for i, f := range files {
		if r.IntN(10) != 0 {
			continue
		}
		v, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		switch i % 3 {
		case 0:
			v[r.IntN(storage.HeaderSize)] ^= 1 << r.IntN(8)
		case 1:
			v[storage.HeaderSize+r.IntN(pageSize)] ^= 1 << r.IntN(8)
		case 2:
			copy(v[storage.HeaderSize:], bytes.Repeat([]byte("evil"), pageSize/4))
			storagetest.Reseal(v)
		}
		if err := os.WriteFile(f, v, 0o600); err != nil {
			t.Fatal(err)
		}
		damaged++
	}
	during, st := run()
	after, _ := run()
	t.Logf("storage hit rate: undamaged %.3f; after damaging %d of %d files %.3f (%d values rejected, %d forged, %d deleted); the run after %.3f (%.0f%% of undamaged)",
		undamaged, damaged, len(files), during, st.Corrupt, st.Forged, st.Purged, after, 100*after/undamaged)
	if after < 0.9*undamaged {
		t.Errorf("storage hit rate of the run after the damaged one %.3f, below 90%% of the undamaged %.3f", after, undamaged)
	}
	if st.Corrupt != uint64(damaged) || st.Purged != uint64(damaged) {
		t.Errorf("%d values rejected and %d deleted; want each of the %d damaged ones once", st.Corrupt, st.Purged, damaged)
	}
}
