package stores_test

import (
	"testing"

	"github.com/cpcache/cpcache/internal/testenv/redistest"
	"github.com/cpcache/cpcache/storage"
)

// TestRedisEvictionIsAMiss: a Redis server bounded by maxmemory with allkeys-lru (the policy
// the README gives) evicts whole pages; the cache sees each as a miss, counted in
// Stats.Misses, never a partial or bad page (Redis removes a key whole, and a value that is
// not exactly a header and its page would be rejected by its length and MAC anyway).
func TestRedisEvictionIsAMiss(t *testing.T) {
	for _, policy := range []string{"allkeys-lru", "volatile-lru"} {
		t.Run(policy, func(t *testing.T) {
			r := redistest.Start(t, "--maxmemory", "2mb", "--maxmemory-policy", policy)
			url := r.URL("evict")
			if policy == "volatile-lru" {
				url += "?ttl=1h" // volatile-lru evicts only keys with a TTL
			}
			ns := mustNamespace(t, "redis-evict")
			s := openURL(t, url, storage.Options{Namespace: ns})
			defer s.Close()
			ctx := testCtx(t)
			const n, batch, size = 512, 16, 16 << 10 // 8 MiB of pages through 2 MiB
			for i := 0; i < n; i += batch {
				ids := make([]uint64, batch)
				for j := range ids {
					ids[j] = uint64(i + j)
				}
				keys, binds := chainPages(ns, 0, ids)
				pages := make([][]byte, batch)
				for j := range pages {
					pages[j] = make([]byte, size)
					pages[j][0] = byte(i + j)
				}
				if err := s.PutBound(ctx, keys, binds, pages); err != nil {
					t.Fatalf("put %d: %v", i, err)
				}
			}
			var keys []storage.Key
			var binds []storage.Binding
			for i := 0; i < n; i += batch { // the chains as written
				ids := make([]uint64, batch)
				for j := range ids {
					ids[j] = uint64(i + j)
				}
				k, b := chainPages(ns, 0, ids)
				keys, binds = append(keys, k...), append(binds, b...)
			}
			dst := make([][]byte, n)
			for i := range dst {
				dst[i] = make([]byte, size)
			}
			found := make([]bool, n)
			if _, err := s.GetBound(ctx, keys, binds, dst, found); err != nil {
				t.Fatal(err)
			}
			hits := 0
			for i, ok := range found {
				if ok {
					hits++
					if dst[i][0] != byte(i) {
						t.Fatalf("page %d: wrong bytes", i)
					}
				}
			}
			st := s.Stats()
			t.Logf("%s: %d of %d pages left after maxmemory 2mb; stats %+v", policy, hits, n, st)
			if hits == 0 || hits == n {
				t.Fatalf("%d of %d pages found: want Redis to have evicted some, not all", hits, n)
			}
			if st.Misses != uint64(n-hits) || st.Corrupt != 0 || st.Hits != uint64(hits) {
				t.Fatalf("stats %+v: want %d misses, %d hits, 0 corrupt", st, n-hits, hits)
			}
		})
	}
}
