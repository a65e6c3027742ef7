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

// TestDirExistsVerifiesHeaders: Exists on a file store authenticates each value's header,
// so a damaged or forged header is absent (counted, reported, deleted) and the next backup
// rewrites it; a damaged payload is caught by Get, which deletes it the same way.
func TestDirExistsVerifiesHeaders(t *testing.T) {
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
		name := storage.DirPath(s, k)
		v, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		v[off] ^= 0x40
		if err := os.WriteFile(name, v, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	flip(keys[0], 35)                     // the header's length field
	flip(keys[1], storage.HeaderSize+100) // the payload
	present := make([]bool, 3)
	if _, err := s.Exists(testCtx(t), keys, present); err != nil || present[0] || !present[1] || !present[2] {
		t.Fatalf("exists after damage: %v, %v; want [false true true] (a payload is verified by get)", present, err)
	}
	if _, err := os.Stat(storage.DirPath(s, keys[0])); !os.IsNotExist(err) {
		t.Errorf("the value with a damaged header was not deleted: %v", err)
	}
	if n, err := s.Get(testCtx(t), keys[1:2], [][]byte{make([]byte, 512)}, nil); n != 0 || err != nil {
		t.Fatalf("get of a damaged payload: %d, %v; want a miss", n, err)
	}
	if n, _ := s.Exists(testCtx(t), keys, present); n != 0 || present[1] || !present[2] {
		t.Fatalf("after the get: present %v; want the damaged payload gone", present)
	}
	if st := s.Stats(); st.Corrupt != 2 || st.Purged != 2 || st.Forged != 0 || len(reports) != 2 {
		t.Errorf("stats %+v, %d reports; want 2 corrupt, 2 purged, 0 forged, 2 reports", st, len(reports))
	}
}

// TestDirStoreRepairsItself replays one workload against a file store four times: a first
// run fills it, a second measures the undamaged storage hit rate, then 10% of the files are
// damaged (bit flips in headers and payloads, forged payloads with valid checksums) and the
// third run must still hit at least 90% of the undamaged rate: each damaged value is
// rejected once, deleted, and rewritten by the backup that follows the miss, as the cache
// does. The fourth run is as good as the undamaged one.
func TestDirStoreRepairsItself(t *testing.T) {
	const (
		conversations = 24
		turns         = 8
		turnPages     = 3
		pageSize      = 512
	)
	dir := t.TempDir()
	ns := mustNamespace(t, "repairs-itself")
	page := func(k storage.Key) []byte { return bytes.Repeat(k[8:16], pageSize/8) }
	// One run: each turn of each conversation asks how much of its prefix is stored, reads
	// it, and backs up the pages that are not stored.
	run := func() (rate float64, st storage.Stats) {
		s := openURL(t, "file://"+dir, storage.Options{Namespace: ns})
		defer s.Close()
		ctx := context.Background()
		hit, asked := 0, 0
		for turn := range turns {
			for c := range conversations {
				keys := make([]storage.Key, (turn+1)*turnPages)
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
				hit, asked = hit+got, asked+len(keys)
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
		}
		return float64(hit) / float64(asked), s.Stats()
	}
	run()
	undamaged, _ := run()
	if undamaged < 0.99 {
		t.Fatalf("undamaged storage hit rate %.3f; want all pages stored by the first run", undamaged)
	}
	files, err := filepath.Glob(filepath.Join(dir, ns.String(), "*", "*"))
	if err != nil || len(files) != conversations*turns*turnPages {
		t.Fatalf("%d files (%v); want %d", len(files), err, conversations*turns*turnPages)
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
	after, st := run()
	repaired, _ := run()
	t.Logf("storage hit rate: undamaged %.3f, after damaging %d of %d files %.3f (%.0f%% of undamaged; %d rejected, %d forged, %d deleted), next run %.3f",
		undamaged, damaged, len(files), after, 100*after/undamaged, st.Corrupt, st.Forged, st.Purged, repaired)
	if after < 0.9*undamaged {
		t.Errorf("storage hit rate after damage %.3f, below 90%% of the undamaged %.3f", after, undamaged)
	}
	if st.Corrupt != uint64(damaged) || st.Purged != uint64(damaged) {
		t.Errorf("%d values rejected and %d deleted; want each of the %d damaged ones once", st.Corrupt, st.Purged, damaged)
	}
	if repaired < undamaged {
		t.Errorf("storage hit rate of the run after the repair %.3f, want %.3f", repaired, undamaged)
	}
}
