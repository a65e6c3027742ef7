package stores_test

import (
	"bytes"
	"context"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/cpcache/cpcache/storage"
	"github.com/cpcache/cpcache/storage/storagetest"
	"github.com/cpcache/cpcache/storage/stores"
)

// TestDirExistsVerifies: Exists on a file store authenticates what it counts from headers
// alone, reading no payload: a damaged header is absent (counted, reported, deleted, so the
// backup rewrites it), in both forms, while a payload damaged behind a genuine header is
// present until a Get reads it, rejects and deletes it; the backup after that rewrites it.
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
	if _, err := s.Exists(testCtx(t), keys, present); err != nil || present[0] || !present[1] || !present[2] {
		t.Fatalf("exists with flags: %v, %v; want [false true true] (the damaged header gone, payloads not read)", present, err)
	}
	if _, err := os.Stat(stores.DirPath(s, keys[0])); !os.IsNotExist(err) {
		t.Errorf("the value with a damaged header was not deleted: %v", err)
	}
	if st := s.Stats(); st.Corrupt != 1 || st.Purged != 1 || len(reports) != 1 {
		t.Errorf("after exists: stats %+v, %d reports; want 1 corrupt, 1 purged, 1 report", st, len(reports))
	}
	dst := [][]byte{make([]byte, 512)}
	if n, err := s.Get(testCtx(t), keys[1:2], dst, nil); n != 0 || err != nil {
		t.Fatalf("get of the damaged payload: %d, %v; want a miss", n, err)
	}
	if _, err := s.Exists(testCtx(t), keys, present); err != nil || present[0] || present[1] || !present[2] {
		t.Fatalf("exists with flags after the get: %v, %v; want [false false true]", present, err)
	}
	if st := s.Stats(); st.Corrupt != 2 || st.Purged != 2 || st.Forged != 0 || len(reports) != 2 {
		t.Errorf("stats %+v, %d reports; want 2 corrupt, 2 purged, 0 forged, 2 reports", st, len(reports))
	}
}

// TestDirStoreRepairsItself replays one workload against a file store, as a serving cache
// meets it: each conversation asks once how much of its history is stored, reads that
// prefix, computes the rest and backs the history up (later turns would hit L1 and L2, not
// storage). A first run fills the store, a second measures the undamaged storage hit rate,
// then 10% of the files are damaged (bit flips in headers and payloads, forged payloads with
// valid checksums). No damaged page is ever loaded. A damaged header is found by the backup's
// Exists and rewritten at once; a payload flipped behind a genuine header only by the Get
// that reaches it (Exists reads no payload), which stops a history's prefix there, so each
// run repairs the first such page of each history. The store must therefore be repaired (a run
// that rejects nothing, at 99% of the undamaged rate) after at most 1 + (the most such pages
// one history has) runs, having rejected and deleted each damaged file exactly once.
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
	history := map[string]int{} // file → its conversation
	{
		s := openURL(t, "file://"+dir, storage.Options{Namespace: ns})
		for c := range conversations {
			for i := range historyPages {
				history[stores.DirPath(s, storage.NewKey(ns, uint64(c)<<32|uint64(i)))] = c
			}
		}
		s.Close()
	}
	r := rand.New(rand.NewPCG(15, 2))
	damaged := 0
	payloadFlips := make([]int, conversations) // per history: payloads flipped behind a genuine header
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
			payloadFlips[history[f]]++
		case 2:
			copy(v[storage.HeaderSize:], bytes.Repeat([]byte("evil"), pageSize/4))
			storagetest.Reseal(v)
		}
		if err := os.WriteFile(f, v, 0o600); err != nil {
			t.Fatal(err)
		}
		damaged++
	}
	maxRuns := 1 + slices.Max(payloadFlips)
	var rates []float64
	var rejected, purged uint64
	for len(rates) < maxRuns+1 {
		rate, st := run()
		rates = append(rates, rate)
		rejected, purged = rejected+st.Corrupt, purged+st.Purged
		if st.Corrupt == 0 { // nothing left to repair
			break
		}
	}
	t.Logf("storage hit rate: undamaged %.3f; after damaging %d of %d files (at most %d payloads of one history flipped behind a genuine header), runs %.3f (%d values rejected, %d deleted)",
		undamaged, damaged, len(files), slices.Max(payloadFlips), rates, rejected, purged)
	if last := rates[len(rates)-1]; last < 0.99*undamaged || len(rates)-1 > maxRuns {
		t.Errorf("storage hit rate %.3f after %d runs that repaired; want 99%% of the undamaged %.3f after at most %d", last, len(rates)-1, undamaged, maxRuns)
	}
	if rejected != uint64(damaged) || purged != uint64(damaged) {
		t.Errorf("%d values rejected and %d deleted; want each of the %d damaged ones once", rejected, purged, damaged)
	}
}
