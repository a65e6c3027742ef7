package storage_test

import (
	"context"
	"testing"

	"github.com/cpcache/cpcache/internal/testenv/redistest"
	"github.com/cpcache/cpcache/storage"
)

// TestRedisGetAllocations: reading pages from Redis goes straight into the caller's buffers;
// the allocations of a batch do not grow with the number of pages.
func TestRedisGetAllocations(t *testing.T) {
	r := redistest.Start(t)
	ns := mustNamespace(t, "alloc")
	s := openURL(t, r.URL("alloc"), storage.Options{Namespace: ns, PoolSize: 1})
	defer s.Close()
	const n = 64
	keys := make([]storage.Key, n)
	bufs := make([][]byte, n)
	for i := range keys {
		keys[i] = storage.NewKey(ns, uint64(i))
		bufs[i] = make([]byte, 16<<10)
	}
	if err := s.Put(testCtx(t), keys, bufs); err != nil {
		t.Fatal(err)
	}
	found := make([]bool, n)
	allocs := func(k int) float64 {
		return testing.AllocsPerRun(10, func() {
			if got, err := s.Get(context.Background(), keys[:k], bufs[:k], found[:k]); err != nil || got != k {
				t.Fatalf("get: %d, %v", got, err)
			}
		})
	}
	small, large := allocs(4), allocs(n)
	if large-small >= (n-4)/2 {
		t.Fatalf("get of %d pages: %.0f allocations, of 4 pages: %.0f; want no per-page allocation", n, large, small)
	}
	t.Logf("allocations per Get: %.0f (4 pages), %.0f (%d pages)", small, large, n)
}
