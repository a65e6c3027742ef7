package stores_test

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/cpcache/cpcache/internal/testenv/redistest"
	"github.com/cpcache/cpcache/storage"
	"github.com/cpcache/cpcache/storage/stores"
)

// TestKeyFiles: a created key file is 0600 and random; concurrent creators agree on one
// key; unsafe or short key files are refused with an error that names the file, never the
// key.
func TestKeyFiles(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "key")
	keys := make([][]byte, 8)
	errs := make([]error, len(keys))
	var wg sync.WaitGroup
	for i := range keys {
		wg.Go(func() { keys[i], errs[i] = stores.LoadOrCreateKeyFile(path) })
	}
	wg.Wait()
	for i := range keys {
		if errs[i] != nil || !bytes.Equal(keys[i], keys[0]) {
			t.Fatalf("creator %d: %q, %v; want the same key as creator 0", i, keys[i], errs[i])
		}
	}
	if len(keys[0]) != 64 {
		t.Errorf("created key of %d bytes, want 64 hex digits", len(keys[0]))
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode: %v, %v; want 0600", fi.Mode(), err)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, ".tmp-key-*")); len(left) != 0 {
		t.Errorf("temporary files left: %v", left)
	}
	if other, _ := stores.LoadOrCreateKeyFile(filepath.Join(t.TempDir(), "key")); bytes.Equal(other, keys[0]) {
		t.Errorf("two created keys are equal")
	}

	const secret = "s3cretKEY"
	write := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, c := range []struct {
		name, path, want string
	}{
		{"readable by others", write("open", secret+strings.Repeat("x", 32), 0o644), "mode 0644"},
		{"too short", write("short", secret+"\n", 0o600), "at least 16"},
		{"missing", filepath.Join(dir, "none"), "no such file"},
		{"a directory", dir, "not a regular file"},
	} {
		_, err := stores.ReadKeyFile(c.path)
		if !errors.Is(err, storage.ErrBadArgument) || !strings.HasPrefix(err.Error(), "storage: key "+c.path) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err=%v; want ErrBadArgument naming %s and saying %q", c.name, err, c.path, c.want)
		}
		if err != nil && strings.Contains(err.Error(), secret) {
			t.Errorf("%s: the error shows the key: %v", c.name, err)
		}
	}
	if _, err := stores.ReadKeyFile(filepath.Join(dir, "none")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing key file: %v; want fs.ErrNotExist", err)
	}
	// White space around the key is not part of it.
	k, err := stores.ReadKeyFile(write("spaced", "  "+strings.Repeat("k", 20)+"\n\n", 0o400))
	if err != nil || string(k) != strings.Repeat("k", 20) {
		t.Errorf("key with white space: %q, %v", k, err)
	}
}

// TestFileStoreKeyBesideIt: a file store opened without a key creates one beside its pages
// and every later opener uses it; a store opened with another key sees the pages as forged.
func TestFileStoreKeyBesideIt(t *testing.T) {
	t.Setenv(stores.EnvKeyFile, "")
	dir := t.TempDir()
	ns := mustNamespace(t, "beside")
	a := openURL(t, "file://"+dir, storage.Options{Namespace: ns})
	defer a.Close()
	fi, err := os.Stat(filepath.Join(dir, stores.DirKeyFile))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file beside the store: %v, %v; want mode 0600", fi, err)
	}
	k := []storage.Key{storage.NewKey(ns, 1)}
	page := [][]byte{bytes.Repeat([]byte{7}, 256)}
	if err := a.Put(testCtx(t), k, page); err != nil {
		t.Fatal(err)
	}
	b := openURL(t, "file://"+dir, storage.Options{Namespace: ns})
	defer b.Close()
	if n, err := b.Get(testCtx(t), k, [][]byte{make([]byte, 256)}, nil); n != 1 || err != nil {
		t.Fatalf("a second opener of the store: %d hits, %v", n, err)
	}
	if storage.KeyFingerprint(a) != storage.KeyFingerprint(b) || len(storage.KeyFingerprint(a)) != 16 {
		t.Errorf("fingerprints %q and %q", storage.KeyFingerprint(a), storage.KeyFingerprint(b))
	}
	c := openURL(t, "file://"+dir, storage.Options{Namespace: ns, MACKey: bytes.Repeat([]byte("k"), 32)})
	defer c.Close()
	if n, _ := c.Get(testCtx(t), k, [][]byte{make([]byte, 256)}, nil); n != 0 || c.Stats().Forged != 1 {
		t.Fatalf("a store with another key: %d hits, %d forged; want 0 and 1", n, c.Stats().Forged)
	}
	if _, err := stores.Open(testCtx(t), "file://"+dir, storage.Options{Namespace: ns, MACKey: []byte("short")}); !errors.Is(err, storage.ErrBadArgument) {
		t.Errorf("a 5-byte MAC key: %v; want ErrBadArgument", err)
	}
}

// TestRedisNeedsKey: a Redis store does not open without a MAC key unless the caller opts
// out with Insecure; an insecure store's pages do not load in a keyed one.
func TestRedisNeedsKey(t *testing.T) {
	r := redistest.Start(t)
	t.Setenv(stores.EnvKeyFile, "")
	ns := mustNamespace(t, "needs-key")
	_, err := stores.Open(testCtx(t), r.URL("nokey"), storage.Options{Namespace: ns})
	if !errors.Is(err, storage.ErrNoKey) || !errors.Is(err, storage.ErrBadArgument) || !strings.Contains(err.Error(), stores.EnvKeyFile) {
		t.Fatalf("open without a key: %v; want ErrNoKey naming %s", err, stores.EnvKeyFile)
	}
	insecure := openURL(t, r.URL("nokey"), storage.Options{Namespace: ns, Insecure: true})
	defer insecure.Close()
	if fp := storage.KeyFingerprint(insecure); fp != "insecure" {
		t.Errorf("insecure fingerprint %q", fp)
	}
	k := []storage.Key{storage.NewKey(ns, 1)}
	if err := insecure.Put(testCtx(t), k, [][]byte{make([]byte, 64)}); err != nil {
		t.Fatal(err)
	}
	keyed := openURL(t, r.URL("nokey"), storage.Options{Namespace: ns, MACKey: bytes.Repeat([]byte("k"), 32)})
	defer keyed.Close()
	if n, _ := keyed.Get(testCtx(t), k, [][]byte{make([]byte, 64)}, nil); n != 0 || keyed.Stats().Forged != 1 {
		t.Errorf("keyed store read an insecure page: %d hits, %d forged", n, keyed.Stats().Forged)
	}
}
