package stores_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cpcache/cpcache/storage"
	"github.com/cpcache/cpcache/storage/storagetest"
	"github.com/cpcache/cpcache/storage/stores"
)

func mustNamespace(t testing.TB, id string) storage.Namespace {
	ns, err := storage.NewNamespace(id)
	if err != nil {
		t.Fatal(err)
	}
	return ns
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func openURL(t testing.TB, url string, opts storage.Options) storage.Storage {
	t.Helper()
	s, err := stores.Open(testCtx(t), url, opts)
	if err != nil {
		t.Fatalf("open %s: %v", url, err)
	}
	return s
}

// mutateDirFile is the directory backend's storagetest Mutate: it rewrites k's file in place.
func mutateDirFile(t *testing.T, s storage.Storage, k storage.Key, mutate func([]byte) []byte) {
	name := stores.DirPath(s, k)
	old, err := os.ReadFile(name)
	if err != nil {
		t.Fatalf("mutate: %v", err)
	}
	if err := os.WriteFile(name, mutate(old), 0o600); err != nil {
		t.Fatalf("mutate: %v", err)
	}
}

func TestDirConformance(t *testing.T) {
	dir := t.TempDir()
	storagetest.Conformance(t, storagetest.Backend{
		Open: func(t *testing.T, opts storage.Options) storage.Storage {
			return openURL(t, "file://"+dir, opts)
		},
		Mutate: mutateDirFile,
	})
}

func TestDirConformanceFsync(t *testing.T) {
	if testing.Short() {
		t.Skip("short mode: the fsync variant only adds fsync calls to the same code")
	}
	dir := t.TempDir()
	storagetest.Conformance(t, storagetest.Backend{
		Open: func(t *testing.T, opts storage.Options) storage.Storage {
			return openURL(t, "file://"+dir+"?fsync=true", opts)
		},
		Mutate: mutateDirFile,
	})
}

func TestMemConformance(t *testing.T) {
	storagetest.Conformance(t, storagetest.Backend{
		Open: func(t *testing.T, opts storage.Options) storage.Storage {
			return openURL(t, "mem://conformance", opts)
		},
		Mutate: func(t *testing.T, s storage.Storage, k storage.Key, mutate func([]byte) []byte) {
			if !stores.MutateMem("conformance", k, mutate) {
				t.Fatalf("mutate: key %s not stored", k)
			}
		},
	})
}

// TestDirLayout checks the on-disk layout: a namespace directory, fan-out subdirectories
// named by the first key byte, no temporary files left behind.
func TestDirLayout(t *testing.T) {
	dir := t.TempDir()
	ns := mustNamespace(t, "layout")
	s := openURL(t, "file://"+dir, storage.Options{Namespace: ns})
	defer s.Close()
	keys := []storage.Key{storage.NewKey(ns, 1), storage.NewKey(ns, 2), storage.NewKey(ns, 3)}
	if err := s.Put(testCtx(t), keys, [][]byte{{1}, {2}, {3}}); err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		name := stores.DirPath(s, k)
		rel, err := filepath.Rel(dir, name)
		if err != nil {
			t.Fatal(err)
		}
		parts := strings.Split(rel, string(filepath.Separator))
		if len(parts) != 3 || parts[0] != ns.String() || len(parts[1]) != 2 || !strings.HasPrefix(parts[2], parts[1]) {
			t.Errorf("page file %s: want <namespace>/<2 hex>/<hash hex>", rel)
		}
		fi, err := os.Stat(name)
		if err != nil || fi.Size() != storage.HeaderSize+1 {
			t.Errorf("page file %s: %v, size %d", rel, err, fi.Size())
		}
	}
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && strings.HasPrefix(d.Name(), ".tmp-") {
			t.Errorf("temporary file left: %s", p)
		}
		return nil
	})
}

// TestDirTornWrite simulates a crash during a write: a half-written temporary file next to
// the page, and a half-written file under the page's own name (e.g. copied by a tool that
// is not atomic). Neither is loaded; a complete rewrite is.
func TestDirTornWrite(t *testing.T) {
	dir := t.TempDir()
	ns := mustNamespace(t, "torn")
	var reasons []error
	s := openURL(t, "file://"+dir, storage.Options{Namespace: ns, OnCorrupt: func(err error) { reasons = append(reasons, err) }})
	defer s.Close()
	k := storage.NewKey(ns, 7)
	page := bytes.Repeat([]byte{0xab}, 64<<10)
	if err := s.Put(testCtx(t), []storage.Key{k}, [][]byte{page}); err != nil {
		t.Fatal(err)
	}
	name := stores.DirPath(s, k)
	full, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	// A leftover temporary file does not disturb reads of the complete page.
	if err := os.WriteFile(filepath.Join(filepath.Dir(name), ".tmp-crashed"), full[:1000], 0o600); err != nil {
		t.Fatal(err)
	}
	dst := [][]byte{make([]byte, len(page))}
	if n, err := s.Get(testCtx(t), []storage.Key{k}, dst, nil); err != nil || n != 1 {
		t.Fatalf("get beside a leftover temp file: %d, %v", n, err)
	}
	// A torn page file is a miss and is counted.
	for _, cut := range []int{storage.HeaderSize - 1, storage.HeaderSize, storage.HeaderSize + 4096, len(full) - 1} {
		if err := os.WriteFile(name, full[:cut], 0o600); err != nil {
			t.Fatal(err)
		}
		before := s.Stats()
		n, err := s.Get(testCtx(t), []storage.Key{k}, dst, nil)
		if err != nil || n != 0 {
			t.Fatalf("torn at %d bytes: %d hits, %v; want a miss", cut, n, err)
		}
		if d := s.Stats().Corrupt - before.Corrupt; d != 1 {
			t.Errorf("torn at %d bytes: %d corrupt counted, want 1", cut, d)
		}
	}
	if len(reasons) != 4 || !errors.Is(reasons[0], storage.ErrCorrupt) || !strings.Contains(reasons[0].Error(), "truncated") {
		t.Errorf("corruption reports: %v", reasons)
	}
	// A foreign file (right name, someone else's content) is a miss.
	if err := os.WriteFile(name, []byte(strings.Repeat("#!/bin/sh\necho not a page\n", 10)), 0o600); err != nil {
		t.Fatal(err)
	}
	if n, _ := s.Get(testCtx(t), []storage.Key{k}, dst, nil); n != 0 {
		t.Fatalf("foreign file loaded")
	}
	if !strings.Contains(reasons[len(reasons)-1].Error(), "magic") {
		t.Errorf("foreign file reason: %v", reasons[len(reasons)-1])
	}
	// A page file of another namespace, copied under this name, is a miss.
	other := mustNamespace(t, "torn-other")
	so := openURL(t, "file://"+dir, storage.Options{Namespace: other})
	defer so.Close()
	ko := storage.NewKey(other, 7)
	if err := so.Put(testCtx(t), []storage.Key{ko}, [][]byte{page}); err != nil {
		t.Fatal(err)
	}
	foreign, _ := os.ReadFile(stores.DirPath(so, ko))
	os.WriteFile(name, foreign, 0o600)
	if n, _ := s.Get(testCtx(t), []storage.Key{k}, dst, nil); n != 0 {
		t.Fatalf("another namespace's page loaded")
	}
	// Rewriting restores it.
	if err := s.Put(testCtx(t), []storage.Key{k}, [][]byte{page}); err != nil {
		t.Fatal(err)
	}
	if n, err := s.Get(testCtx(t), []storage.Key{k}, dst, nil); err != nil || n != 1 || !bytes.Equal(dst[0], page) {
		t.Fatalf("rewritten page: %d hits, %v", n, err)
	}
}

// TestDirErrors: I/O failures other than a missing file are errors, not misses.
func TestDirErrors(t *testing.T) {
	dir := t.TempDir()
	ns := mustNamespace(t, "errors")
	s := openURL(t, "file://"+dir, storage.Options{Namespace: ns})
	defer s.Close()
	k := storage.NewKey(ns, 1)
	// A directory where the page file should be: reading it fails with an error.
	if err := os.MkdirAll(stores.DirPath(s, k), 0o700); err != nil {
		t.Fatal(err)
	}
	_, err := s.Get(testCtx(t), []storage.Key{k}, [][]byte{make([]byte, 8)}, nil)
	if err == nil || !strings.HasPrefix(err.Error(), "storage: file ") || !strings.Contains(err.Error(), " get: ") {
		t.Fatalf("get of a directory: err=%v; want a storage error", err)
	}
	if err := s.Put(testCtx(t), []storage.Key{k}, [][]byte{make([]byte, 8)}); err == nil {
		t.Fatalf("put over a directory succeeded")
	}
	if s.Stats().Errors != 2 {
		t.Errorf("errors counted: %d, want 2", s.Stats().Errors)
	}
	// A cancelled context is ErrUnavailable.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Put(ctx, []storage.Key{storage.NewKey(ns, 2)}, [][]byte{{1}}); !errors.Is(err, storage.ErrUnavailable) || !errors.Is(err, context.Canceled) {
		t.Fatalf("put with a cancelled context: %v", err)
	}
	// The root is a file.
	file := filepath.Join(dir, "plain")
	os.WriteFile(file, nil, 0o600)
	if _, err := stores.Open(testCtx(t), "file://"+file, storage.Options{Namespace: ns}); !errors.Is(err, storage.ErrBadArgument) || !strings.Contains(err.Error(), file) {
		t.Fatalf("open over a file: %v", err)
	}
}

// TestDirClearRemovesCrashedClears: a Clear that crashed after moving its namespace aside
// left the whole old namespace in a .trash directory for ever; the next Clear of the
// namespace removes it (and nothing of another namespace).
func TestDirClearRemovesCrashedClears(t *testing.T) {
	dir := t.TempDir()
	ns, other := mustNamespace(t, "clear-crash"), mustNamespace(t, "clear-other")
	s := openURL(t, "file://"+dir, storage.Options{Namespace: ns})
	defer s.Close()
	left := filepath.Join(dir, ".trash-"+ns.String()+"-123", "ns", "ab")
	kept := filepath.Join(dir, ".trash-"+other.String()+"-456", "ns")
	for _, d := range []string{left, kept} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "page"), make([]byte, 1024), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Clear(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, ".trash-"+ns.String()+"-123")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the crashed Clear's trash is still there: %v", err)
	}
	if _, err := os.Stat(kept); err != nil {
		t.Errorf("another namespace's trash was touched: %v", err)
	}
}

// TestDirClearHonoursItsContext: a Clear whose context is done fails with ErrUnavailable
// and clears nothing, as every other call of the store; it must not clear regardless.
func TestDirClearHonoursItsContext(t *testing.T) {
	ns := mustNamespace(t, "clear-ctx")
	s := openURL(t, "file://"+t.TempDir(), storage.Options{Namespace: ns})
	defer s.Close()
	keys := []storage.Key{storage.NewKey(ns, 1)}
	page := [][]byte{make([]byte, 64)}
	if err := s.Put(testCtx(t), keys, page); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Clear(ctx); !errors.Is(err, storage.ErrUnavailable) || !errors.Is(err, context.Canceled) {
		t.Errorf("clear with a cancelled context: %v, want ErrUnavailable wrapping context.Canceled", err)
	}
	if n, err := s.Exists(testCtx(t), keys, nil); n != 1 || err != nil {
		t.Errorf("after a cancelled clear: %d pages, %v; want the page kept", n, err)
	}
	if err := s.Clear(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	if n, err := s.Exists(testCtx(t), keys, nil); n != 0 || err != nil {
		t.Errorf("after clear: %d pages, %v", n, err)
	}
}

// TestDirClearLeavesAnotherClearsFreshTrash: the trash directory of a concurrent Clear that
// has not yet moved its namespace into it is left alone; removed, that Clear's Rename would
// fail as if the namespace were missing, and it would report success having cleared nothing.
func TestDirClearLeavesAnotherClearsFreshTrash(t *testing.T) {
	dir := t.TempDir()
	ns := mustNamespace(t, "clear-concurrent")
	s := openURL(t, "file://"+dir, storage.Options{Namespace: ns})
	defer s.Close()
	fresh := filepath.Join(dir, ".trash-"+ns.String()+"-789")
	if err := os.Mkdir(fresh, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := s.Clear(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(fresh); err != nil {
		t.Errorf("the concurrent Clear's trash was removed before it moved its namespace in: %v", err)
	}
}

// TestDirPutRacesClear: a Put concurrent with a Clear of its namespace (another instance's
// flush) either lands or is cleared, and the Clear succeeds. The Put must not fail with the
// rename's ENOENT when the Clear moves the fan-out directory, temporary file included, aside
// between the two; the Clear must not fail with ENOTEMPTY when a temporary file is created
// in a directory it has just moved aside and is removing.
func TestDirPutRacesClear(t *testing.T) {
	dir := t.TempDir()
	ns := mustNamespace(t, "put-clear")
	clearer := openURL(t, "file://"+dir, storage.Options{Namespace: ns})
	defer clearer.Close()
	var keys []storage.Key
	var pages [][]byte
	for h := range 32 {
		keys = append(keys, storage.NewKey(ns, uint64(h)))
		pages = append(pages, bytes.Repeat([]byte{byte(h)}, 4<<10))
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 4 {
		putter := openURL(t, "file://"+dir, storage.Options{Namespace: ns, Workers: 4})
		defer putter.Close()
		wg.Go(func() {
			for i := range 40 {
				if err := putter.Put(testCtx(t), keys, pages); err != nil {
					errs <- fmt.Errorf("putter %d, put %d, concurrent with clears: %w", g, i, err)
					return
				}
			}
		})
	}
	done := make(chan struct{})
	cleared := make(chan struct{})
	go func() {
		defer close(cleared)
		for {
			select {
			case <-done:
				return
			default:
			}
			if err := clearer.Clear(testCtx(t)); err != nil {
				errs <- fmt.Errorf("clear concurrent with puts: %w", err)
				return
			}
		}
	}()
	wg.Wait()
	close(done)
	<-cleared
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
