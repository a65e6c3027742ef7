package stores_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cpcache/cpcache/storage"
	"github.com/cpcache/cpcache/storage/stores"
)

// within runs fn and fails the test if it has not returned after d: a FIFO without a
// writer blocks a plain open forever, so a regression hangs instead of failing.
func within(t *testing.T, d time.Duration, what string, fn func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn()
	}()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("%s still blocked after %v (opening a FIFO without a writer)", what, d)
	}
}

// TestDirForeignFIFO: a FIFO (or any file that is not a regular one) planted under a page's
// name is a foreign value: Exists and Get answer by their deadline with a miss, count it as
// corrupt and delete it, and the next backup writes a genuine page that loads.
func TestDirForeignFIFO(t *testing.T) {
	dir := t.TempDir()
	ns := mustNamespace(t, "fifo")
	s := openURL(t, "file://"+dir, storage.Options{Namespace: ns, MACKey: []byte(strings.Repeat("k", 32)), Timeout: time.Second})
	defer s.Close()
	k := storage.NewKey(ns, 1)
	page := []byte(strings.Repeat("p", 64))
	plant := func() {
		t.Helper()
		if err := s.Put(testCtx(t), []storage.Key{k}, [][]byte{page}); err != nil {
			t.Fatal(err)
		}
		name := stores.DirPath(s, k)
		if err := os.Remove(name); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Mkfifo(name, 0o600); err != nil {
			t.Skipf("mkfifo: %v", err)
		}
	}
	for _, op := range []string{"get", "exists", "exists with present"} {
		plant()
		before := s.Stats()
		var n int
		var err error
		within(t, 10*time.Second, op, func() { n, err = lookup(t, s, op, k, len(page)) })
		if n != 0 || err != nil {
			t.Errorf("%s of a FIFO: %d, %v; want a miss", op, n, err)
		}
		st := s.Stats()
		if st.Corrupt != before.Corrupt+1 || st.Purged != before.Purged+1 {
			t.Errorf("%s of a FIFO: corrupt %d→%d, purged %d→%d; want it counted and deleted", op, before.Corrupt, st.Corrupt, before.Purged, st.Purged)
		}
		if _, err := os.Lstat(stores.DirPath(s, k)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: the FIFO is still there (%v)", op, err)
		}
	}
	if err := s.Put(testCtx(t), []storage.Key{k}, [][]byte{page}); err != nil {
		t.Fatal(err)
	}
	if n, err := s.Get(testCtx(t), []storage.Key{k}, [][]byte{make([]byte, len(page))}, nil); n != 1 || err != nil {
		t.Errorf("get after a fresh backup: %d, %v", n, err)
	}
}

// TestReadKeyFileFIFO: a key file that is a FIFO is refused as not a regular file, at once.
func TestReadKeyFileFIFO(t *testing.T) {
	name := filepath.Join(t.TempDir(), "key")
	if err := syscall.Mkfifo(name, 0o600); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
	var err error
	within(t, 10*time.Second, "ReadKeyFile", func() { _, err = stores.ReadKeyFile(name) })
	if !errors.Is(err, storage.ErrBadArgument) || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("err=%v; want ErrBadArgument saying not a regular file", err)
	}
}

// lookup asks s for key k's page of size bytes by op: "get" (Get), "exists" (Exists of
// headers) or "exists with present" (Exists as a backup asks it).
func lookup(t *testing.T, s storage.Storage, op string, k storage.Key, size int) (int, error) {
	switch op {
	case "get":
		return s.Get(testCtx(t), []storage.Key{k}, [][]byte{make([]byte, size)}, nil)
	case "exists":
		return s.Exists(testCtx(t), []storage.Key{k}, nil)
	default:
		return s.Exists(testCtx(t), []storage.Key{k}, make([]bool, 1))
	}
}
