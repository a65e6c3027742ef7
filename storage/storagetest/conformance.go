package storagetest

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cpcache/cpcache/storage"
)

// Backend tells the suite how to reach one store.
type Backend struct {
	// Open opens the store with opts. Every call must reach the same underlying store (the
	// same directory, Redis server and prefix, or mem name) so that two namespaces share it.
	// The suite closes what it opens.
	Open func(t *testing.T, opts storage.Options) storage.Storage
	// Mutate replaces the stored bytes (header + payload, as on storage) of key k in s with
	// mutate(old). It fails the test if k is not stored.
	Mutate func(t *testing.T, s storage.Storage, k storage.Key, mutate func(old []byte) []byte)
}

const pageSize = 4096 // multiple of 8, as are all page sizes below

// Conformance runs the suite. Each subtest uses its own namespaces, so the store need not
// be empty.
func Conformance(t *testing.T, b Backend) {
	t.Run("RoundTrip", func(t *testing.T) { testRoundTrip(t, b) })
	t.Run("MissesAndLeading", func(t *testing.T) { testMisses(t, b) })
	t.Run("OverwriteAndDelete", func(t *testing.T) { testOverwriteDelete(t, b) })
	t.Run("Namespaces", func(t *testing.T) { testNamespaces(t, b) })
	t.Run("Clear", func(t *testing.T) { testClear(t, b) })
	t.Run("Corruption", func(t *testing.T) { testCorruption(t, b) })
	t.Run("Forgery", func(t *testing.T) { testForgery(t, b) })
	t.Run("Binding", func(t *testing.T) { testBinding(t, b) })
	t.Run("OldFormat", func(t *testing.T) { testOldFormat(t, b) })
	t.Run("FormatVersions", func(t *testing.T) { testFormatVersions(t, b) })
	t.Run("BadArguments", func(t *testing.T) { testBadArguments(t, b) })
	t.Run("LargeBatch", func(t *testing.T) { testLargeBatch(t, b) })
	t.Run("Concurrent", func(t *testing.T) { testConcurrent(t, b) })
	t.Run("Close", func(t *testing.T) { testClose(t, b) })
}

var nsSeq atomic.Uint64

// namespace returns a namespace unique to this test run.
func namespace(t *testing.T, tag string) storage.Namespace {
	ns, err := storage.NewNamespace(fmt.Sprintf("%s/%s/%d/%d", t.Name(), tag, time.Now().UnixNano(), nsSeq.Add(1)))
	if err != nil {
		t.Fatal(err)
	}
	return ns
}

type env struct {
	t       *testing.T
	s       storage.Storage
	ns      storage.Namespace
	mu      sync.Mutex // guards corrupt: OnCorrupt runs on the storage's goroutines
	corrupt []error    // errors passed to OnCorrupt
}

func open(t *testing.T, b Backend, tag string) *env {
	e := &env{t: t, ns: namespace(t, tag)}
	e.s = b.Open(t, storage.Options{Namespace: e.ns, OnCorrupt: func(err error) {
		e.mu.Lock()
		e.corrupt = append(e.corrupt, err)
		e.mu.Unlock()
	}})
	t.Cleanup(func() {
		e.s.Clear(context.Background())
		if err := e.s.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return e
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

func (e *env) keys(first uint64, n int) []storage.Key {
	ks := make([]storage.Key, n)
	for i := range ks {
		ks[i] = storage.NewKey(e.ns, first+uint64(i))
	}
	return ks
}

func pages(seed uint64, n, size int) [][]byte {
	r := rand.New(rand.NewPCG(seed, 42))
	ps := make([][]byte, n)
	for i := range ps {
		ps[i] = make([]byte, size)
		for j := 0; j < size; j += 8 {
			binary.LittleEndian.PutUint64(ps[i][j:], r.Uint64())
		}
	}
	return ps
}

func buffers(n, size int) [][]byte {
	bs := make([][]byte, n)
	for i := range bs {
		bs[i] = make([]byte, size)
	}
	return bs
}

func (e *env) put(keys []storage.Key, src [][]byte) {
	e.t.Helper()
	if err := e.s.Put(ctx(e.t), keys, src); err != nil {
		e.t.Fatalf("put: %v", err)
	}
}

// get reads keys into fresh buffers and returns them with the found flags and count.
func (e *env) get(keys []storage.Key, size int) ([][]byte, []bool, int) {
	e.t.Helper()
	dst := buffers(len(keys), size)
	found := make([]bool, len(keys))
	n, err := e.s.Get(ctx(e.t), keys, dst, found)
	if err != nil {
		e.t.Fatalf("get: %v", err)
	}
	return dst, found, n
}

func testRoundTrip(t *testing.T, b Backend) {
	e := open(t, b, "a")
	keys := e.keys(100, 8)
	src := pages(1, 8, pageSize)
	before := e.s.Stats()
	e.put(keys, src)
	dst, found, n := e.get(keys, pageSize)
	if n != 8 {
		t.Fatalf("get: %d leading hits, want 8 (found %v)", n, found)
	}
	for i := range keys {
		if !found[i] || !bytes.Equal(dst[i], src[i]) {
			t.Fatalf("page %d: found=%v, equal=%v", i, found[i], bytes.Equal(dst[i], src[i]))
		}
	}
	present := make([]bool, 8)
	if n, err := e.s.Exists(ctx(t), keys, present); err != nil || n != 8 {
		t.Fatalf("exists: %d, %v; want 8", n, err)
	}
	if n, err := e.s.Exists(ctx(t), keys, nil); err != nil || n != 8 {
		t.Fatalf("exists without flags: %d, %v; want 8", n, err)
	}
	st := e.s.Stats()
	if d := st.Puts - before.Puts; d != 8 {
		t.Errorf("stats: %d puts, want 8", d)
	}
	if d := st.Hits - before.Hits; d != 8 {
		t.Errorf("stats: %d hits, want 8", d)
	}
	if d := st.BytesRead - before.BytesRead; d != 8*pageSize {
		t.Errorf("stats: %d bytes read, want %d", d, 8*pageSize)
	}
	if d := st.BytesWritten - before.BytesWritten; d != 8*pageSize {
		t.Errorf("stats: %d bytes written, want %d", d, 8*pageSize)
	}
	// Empty batches are no-ops.
	if err := e.s.Put(ctx(t), nil, nil); err != nil {
		t.Errorf("empty put: %v", err)
	}
	if n, err := e.s.Get(ctx(t), nil, nil, nil); err != nil || n != 0 {
		t.Errorf("empty get: %d, %v", n, err)
	}
	// A page put by one handle is seen by another handle on the same store and namespace.
	other := b.Open(t, storage.Options{Namespace: e.ns})
	defer other.Close()
	dst2 := buffers(1, pageSize)
	if n, err := other.Get(ctx(t), keys[3:4], dst2, nil); err != nil || n != 1 || !bytes.Equal(dst2[0], src[3]) {
		t.Fatalf("second handle: %d hits, %v", n, err)
	}
}

func testMisses(t *testing.T, b Backend) {
	e := open(t, b, "a")
	keys := e.keys(200, 5)
	src := pages(2, 5, pageSize)
	// Store pages 0, 1, 3 and 4; page 2 is missing.
	e.put([]storage.Key{keys[0], keys[1], keys[3], keys[4]}, [][]byte{src[0], src[1], src[3], src[4]})
	want := []bool{true, true, false, true, true}

	present := make([]bool, 5)
	for i := range present {
		present[i] = !want[i] // stale values must be overwritten
	}
	n, err := e.s.Exists(ctx(t), keys, present)
	if err != nil || n != 2 || fmt.Sprint(present) != fmt.Sprint(want) {
		t.Fatalf("exists: n=%d present=%v err=%v; want n=2 present=%v", n, present, err, want)
	}
	if n, err := e.s.Exists(ctx(t), keys, nil); err != nil || n != 2 {
		t.Fatalf("exists (leading only): n=%d err=%v; want 2", n, err)
	}
	before := e.s.Stats()
	dst, found, n := e.get(keys, pageSize)
	if n != 2 || fmt.Sprint(found) != fmt.Sprint(want) {
		t.Fatalf("get: n=%d found=%v; want 2 %v", n, found, want)
	}
	for i := range keys {
		if want[i] && !bytes.Equal(dst[i], src[i]) {
			t.Fatalf("page %d differs", i)
		}
	}
	st := e.s.Stats()
	if st.Misses-before.Misses != 1 || st.Hits-before.Hits != 4 || st.Corrupt != before.Corrupt {
		t.Errorf("stats after get: %+v (before %+v); want +4 hits, +1 miss, no corrupt", st, before)
	}
	if n, err := e.s.Get(ctx(t), keys, buffers(5, pageSize), nil); err != nil || n != 2 {
		t.Fatalf("get (leading only): n=%d err=%v; want 2", n, err)
	}
	// Missing first key: nothing leads.
	if n, err := e.s.Get(ctx(t), keys[2:], buffers(3, pageSize), nil); err != nil || n != 0 {
		t.Fatalf("get from the missing key: n=%d err=%v; want 0", n, err)
	}
	if len(e.corrupt) != 0 {
		t.Errorf("misses reported as corrupt: %v", e.corrupt)
	}
}

func testOverwriteDelete(t *testing.T, b Backend) {
	e := open(t, b, "a")
	keys := e.keys(300, 3)
	e.put(keys, pages(3, 3, pageSize))
	newer := pages(4, 1, pageSize)
	e.put(keys[1:2], newer)
	dst, found, _ := e.get(keys, pageSize)
	if !found[1] || !bytes.Equal(dst[1], newer[0]) {
		t.Fatalf("overwritten page: found=%v, equal=%v", found[1], bytes.Equal(dst[1], newer[0]))
	}
	missing := storage.NewKey(e.ns, 999999)
	if err := e.s.Delete(ctx(t), []storage.Key{keys[1], missing}); err != nil {
		t.Fatalf("delete: %v", err)
	}
	_, found, n := e.get(keys, pageSize)
	if n != 1 || fmt.Sprint(found) != "[true false true]" {
		t.Fatalf("after delete: n=%d found=%v; want 1 [true false true]", n, found)
	}
}

func testNamespaces(t *testing.T, b Backend) {
	e1, e2 := open(t, b, "one"), open(t, b, "two")
	k1, k2 := e1.keys(400, 4), e2.keys(400, 4) // the same page hashes in both
	for i := range k1 {
		if k1[i] == k2[i] {
			t.Fatalf("key %d identical in two namespaces", i)
		}
	}
	p1, p2 := pages(5, 4, pageSize), pages(6, 4, pageSize)
	e1.put(k1, p1)
	if _, found, n := e2.get(k2, pageSize); n != 0 || fmt.Sprint(found) != "[false false false false]" {
		t.Fatalf("namespace two sees namespace one's pages: found=%v", found)
	}
	e2.put(k2, p2)
	d1, _, n1 := e1.get(k1, pageSize)
	d2, _, n2 := e2.get(k2, pageSize)
	if n1 != 4 || n2 != 4 {
		t.Fatalf("hits %d and %d, want 4 and 4", n1, n2)
	}
	for i := range d1 {
		if !bytes.Equal(d1[i], p1[i]) || !bytes.Equal(d2[i], p2[i]) {
			t.Fatalf("page %d mixed up between namespaces", i)
		}
	}
	// A key of one namespace is refused by the other.
	_, err := e2.s.Get(ctx(t), k1[:1], buffers(1, pageSize), nil)
	if !errors.Is(err, storage.ErrBadArgument) || !strings.Contains(err.Error(), "namespace") {
		t.Fatalf("foreign-namespace key: err=%v; want ErrBadArgument naming the namespace", err)
	}
	if len(e1.corrupt)+len(e2.corrupt) != 0 {
		t.Errorf("unexpected corruption: %v %v", e1.corrupt, e2.corrupt)
	}
}

func testClear(t *testing.T, b Backend) {
	e1, e2 := open(t, b, "one"), open(t, b, "two")
	k1, k2 := e1.keys(500, 6), e2.keys(500, 6)
	e1.put(k1, pages(7, 6, pageSize))
	e2.put(k2, pages(8, 6, pageSize))
	if err := e1.s.Clear(ctx(t)); err != nil {
		t.Fatalf("clear: %v", err)
	}
	if n, err := e1.s.Exists(ctx(t), k1, make([]bool, 6)); err != nil || n != 0 {
		t.Fatalf("after clear: %d of the cleared namespace's pages remain (%v)", n, err)
	}
	if _, _, n := e2.get(k2, pageSize); n != 6 {
		t.Fatalf("clear of namespace one removed pages of namespace two: %d of 6 remain", n)
	}
	// The cleared namespace is usable again.
	e1.put(k1[:2], pages(9, 2, pageSize))
	if _, _, n := e1.get(k1[:2], pageSize); n != 2 {
		t.Fatalf("put after clear: %d of 2 hits", n)
	}
	if err := e1.s.Clear(ctx(t)); err != nil {
		t.Fatalf("second clear: %v", err)
	}
	if err := e1.s.Clear(ctx(t)); err != nil {
		t.Fatalf("clear of an empty namespace: %v", err)
	}
}

func testCorruption(t *testing.T, b Backend) {
	e := open(t, b, "a")
	keys := e.keys(600, 9)
	src := pages(10, 9, pageSize)
	e.put(keys, src)
	cases := []struct {
		name   string
		mutate func(old []byte) []byte
	}{
		{"payload bit flip", func(v []byte) []byte { v[len(v)-100] ^= 0x10; return v }},
		{"header bit flip", func(v []byte) []byte { v[33] ^= 1; return v }},
		{"torn (truncated payload)", func(v []byte) []byte { return v[:len(v)/2] }},
		{"torn (truncated header)", func(v []byte) []byte { return v[:20] }},
		{"empty", func(v []byte) []byte { return v[:0] }},
		{"foreign bytes", func(v []byte) []byte { return bytes.Repeat([]byte("not a page "), len(v)/11) }},
		{"trailing garbage", func(v []byte) []byte { return append(v, 0) }},
		{"another key's value", func([]byte) []byte { return nil }}, // filled below
	}
	var other []byte
	b.Mutate(t, e.s, keys[8], func(v []byte) []byte { other = append([]byte(nil), v...); return v })
	cases[len(cases)-1].mutate = func([]byte) []byte { return append([]byte(nil), other...) }
	for i, c := range cases {
		b.Mutate(t, e.s, keys[i], c.mutate)
	}
	before := e.s.Stats()
	dst, found, n := e.get(keys, pageSize)
	if n != 0 {
		t.Fatalf("get: %d leading hits over corrupt values", n)
	}
	for i, c := range cases {
		if found[i] {
			t.Errorf("%s: loaded as a hit", c.name)
		}
	}
	if !found[8] || !bytes.Equal(dst[8], src[8]) {
		t.Errorf("the intact page was not read back")
	}
	st := e.s.Stats()
	if d := st.Corrupt - before.Corrupt; d != uint64(len(cases)) {
		t.Errorf("stats: %d corrupt, want %d", d, len(cases))
	}
	if st.Errors != before.Errors {
		t.Errorf("corrupt values counted as call errors")
	}
	e.mu.Lock()
	reported := append([]error(nil), e.corrupt...)
	e.mu.Unlock()
	if len(reported) != len(cases) {
		t.Fatalf("OnCorrupt called %d times, want %d: %v", len(reported), len(cases), reported)
	}
	for _, err := range reported {
		if !errors.Is(err, storage.ErrCorrupt) || !strings.HasPrefix(err.Error(), "storage: ") {
			t.Errorf("OnCorrupt error %q does not wrap ErrCorrupt with the storage prefix", err)
		}
	}
	// A page read with the wrong page size is not loaded either.
	before = e.s.Stats()
	if _, found, _ := e.get(keys[8:], pageSize/2); found[0] {
		t.Errorf("page loaded into a buffer of the wrong size")
	}
	if d := e.s.Stats().Corrupt - before.Corrupt; d != 1 {
		t.Errorf("wrong-size read: %d corrupt counted, want 1", d)
	}
	// Rewriting a corrupt page repairs it.
	e.put(keys[:1], src[:1])
	if d, f, _ := e.get(keys[:1], pageSize); !f[0] || !bytes.Equal(d[0], src[0]) {
		t.Errorf("rewritten page not read back")
	}
}

func testBadArguments(t *testing.T, b Backend) {
	e := open(t, b, "a")
	keys := e.keys(700, 2)
	check := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, storage.ErrBadArgument) || !strings.HasPrefix(err.Error(), "storage: ") {
			t.Errorf("%s: err=%v; want ErrBadArgument with the storage prefix", what, err)
		}
	}
	check("put with fewer buffers", e.s.Put(ctx(t), keys, buffers(1, pageSize)))
	_, err := e.s.Get(ctx(t), keys, buffers(3, pageSize), nil)
	check("get with more buffers", err)
	_, err = e.s.Get(ctx(t), keys, buffers(2, pageSize), make([]bool, 1))
	check("get with short flags", err)
	_, err = e.s.Exists(ctx(t), keys, make([]bool, 3))
	check("exists with long flags", err)
	check("put of the zero key", e.s.Put(ctx(t), []storage.Key{{}}, buffers(1, pageSize)))
	check("delete of the zero key", e.s.Delete(ctx(t), []storage.Key{{}}))
	if _, err := storage.NewNamespace(""); !errors.Is(err, storage.ErrBadArgument) {
		t.Errorf("empty namespace identity: err=%v", err)
	}
	if e.s.Stats().Errors == 0 {
		t.Errorf("bad calls not counted in Stats.Errors")
	}
}

func testLargeBatch(t *testing.T, b Backend) {
	e := open(t, b, "a")
	const n, size = 300, 72 << 10 // more keys and more bytes than one round trip carries
	keys := e.keys(800, n)
	src := pages(11, n, size)
	e.put(keys, src)
	dst, _, hits := e.get(keys, size)
	if hits != n {
		t.Fatalf("large batch: %d of %d hits", hits, n)
	}
	for i := range dst {
		if !bytes.Equal(dst[i], src[i]) {
			t.Fatalf("large batch: page %d differs", i)
		}
	}
	if err := e.s.Delete(ctx(t), keys); err != nil {
		t.Fatal(err)
	}
	if got, err := e.s.Exists(ctx(t), keys, make([]bool, n)); err != nil || got != 0 {
		t.Fatalf("after deleting the large batch: %d remain, %v", got, err)
	}
}

// testConcurrent: writers overwrite shared keys with whole versions while readers read
// them; a reader sees a miss or exactly one version, never a mix.
func testConcurrent(t *testing.T, b Backend) {
	e := open(t, b, "a")
	const nkeys, versions, size = 4, 3, 8 << 10
	keys := e.keys(900, nkeys)
	vers := make([][][]byte, versions)
	for v := range vers {
		vers[v] = pages(uint64(20+v), nkeys, size)
	}
	var wg sync.WaitGroup
	for w := range 3 {
		wg.Go(func() {
			for it := range 15 {
				if err := e.s.Put(ctx(t), keys, vers[(w+it)%versions]); err != nil {
					t.Errorf("concurrent put: %v", err)
					return
				}
			}
		})
	}
	for range 3 {
		wg.Go(func() {
			dst := buffers(nkeys, size)
			found := make([]bool, nkeys)
			for range 15 {
				if _, err := e.s.Get(ctx(t), keys, dst, found); err != nil {
					t.Errorf("concurrent get: %v", err)
					return
				}
				for i := range keys {
					if !found[i] {
						continue
					}
					ok := false
					for v := range vers {
						ok = ok || bytes.Equal(dst[i], vers[v][i])
					}
					if !ok {
						t.Errorf("key %d: read a page that is no written version", i)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	if len(e.corrupt) != 0 {
		t.Errorf("concurrent writes produced corrupt reads: %v", e.corrupt)
	}
}

func testClose(t *testing.T, b Backend) {
	ns := namespace(t, "a")
	s := b.Open(t, storage.Options{Namespace: ns})
	if err := s.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
	keys := []storage.Key{storage.NewKey(ns, 1)}
	if err := s.Put(ctx(t), keys, buffers(1, 16)); !errors.Is(err, storage.ErrClosed) {
		t.Errorf("put after close: %v; want ErrClosed", err)
	}
	if _, err := s.Get(ctx(t), keys, buffers(1, 16), nil); !errors.Is(err, storage.ErrClosed) {
		t.Errorf("get after close: %v; want ErrClosed", err)
	}
	if _, err := s.Exists(ctx(t), keys, nil); !errors.Is(err, storage.ErrClosed) {
		t.Errorf("exists after close: %v; want ErrClosed", err)
	}
}
