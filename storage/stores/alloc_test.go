package stores_test

import (
	"context"
	"runtime"
	"testing"

	"github.com/cpcache/cpcache/internal/testenv/redistest"
	"github.com/cpcache/cpcache/storage"
)

// TestRedisGetAllocations: go-redis reads each value into a pooled buffer, which Get
// verifies and copies into the caller's buffer; per page that is at most one value's bytes
// and a few small objects (no second copy, no per-page buffer growth).
func TestRedisGetAllocations(t *testing.T) {
	r := redistest.Start(t)
	ns := mustNamespace(t, "alloc")
	s := openURL(t, r.URL("alloc"), storage.Options{Namespace: ns, PoolSize: 1})
	defer s.Close()
	const n, page = 64, 16 << 10
	keys := make([]storage.Key, n)
	bufs := make([][]byte, n)
	for i := range keys {
		keys[i] = storage.NewKey(ns, uint64(i))
		bufs[i] = make([]byte, page)
	}
	if err := s.Put(testCtx(t), keys, bufs); err != nil {
		t.Fatal(err)
	}
	found := make([]bool, n)
	get := func(k int) {
		if got, err := s.Get(context.Background(), keys[:k], bufs[:k], found[:k]); err != nil || got != k {
			t.Fatalf("get: %d, %v", got, err)
		}
	}
	bytesPerRun := func(k int) float64 {
		const runs = 10
		get(k)
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		for range runs {
			get(k)
		}
		runtime.ReadMemStats(&after)
		return float64(after.TotalAlloc-before.TotalAlloc) / runs
	}
	small, large := testing.AllocsPerRun(10, func() { get(4) }), testing.AllocsPerRun(10, func() { get(n) })
	perPage := (large - small) / (n - 4)
	bytesPerPage := (bytesPerRun(n) - bytesPerRun(4)) / (n - 4)
	t.Logf("per page: %.1f allocations, %.0f bytes (value %d bytes)", perPage, bytesPerPage, page+storage.HeaderSize)
	if perPage > 6 || bytesPerPage > 1.25*(page+storage.HeaderSize) {
		t.Fatalf("get allocates %.1f objects and %.0f bytes per %d-byte page; want at most 6 and one value's bytes", perPage, bytesPerPage, page)
	}
}
