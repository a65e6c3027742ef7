package stores_test

import (
	"context"
	"math/rand/v2"
	"testing"

	"github.com/cpcache/cpcache/internal/testenv/redistest"
	"github.com/cpcache/cpcache/storage"
	"github.com/cpcache/cpcache/storage/stores"
)

// BenchmarkRedisPages measures the Redis backend alone (no file I/O in the loop, unlike
// BenchmarkStorage): batches of 64 pages of 64 KiB, put under new keys (deleted untimed)
// and read back. Each mode is a way to open the store (redisBenchModes); "nomac" is the
// same work as the hand-written client this backend replaced (checksums, no MACs), so
// storage/stores/testdata/redis-baseline.sh can run this file against that client's commit and
// compare side by side.
func BenchmarkRedisPages(b *testing.B) {
	for _, m := range redisBenchModes() {
		for _, op := range []string{"put", "get"} {
			b.Run(m.name+"/"+op, func(b *testing.B) { benchRedisPages(b, m.opts, op) })
		}
	}
}

type redisBenchMode struct {
	name string
	opts func(b *testing.B, ns storage.Namespace) storage.Options
}

func benchRedisPages(b *testing.B, opts func(*testing.B, storage.Namespace) storage.Options, op string) {
	const page, batch = 64 << 10, 64
	ns, err := storage.NewNamespace("bench/redis-pages")
	if err != nil {
		b.Fatal(err)
	}
	r := redistest.Start(b)
	s, err := stores.Open(context.Background(), r.URL("bench"), opts(b, ns))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(1, 2))
	keys := make([]storage.Key, batch)
	src, dst := make([][]byte, batch), make([][]byte, batch)
	for i := range keys {
		keys[i] = storage.NewKey(ns, uint64(i))
		src[i], dst[i] = make([]byte, page), make([]byte, page)
		for j := range src[i] {
			src[i][j] = byte(rng.Uint32())
		}
	}
	if err := s.Put(ctx, keys, src); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(page * batch)
	b.ResetTimer()
	for it := range b.N {
		if op == "get" {
			if n, err := s.Get(ctx, keys, dst, nil); err != nil || n != batch {
				b.Fatalf("get: %d of %d pages, %v", n, batch, err)
			}
			continue
		}
		for i := range keys {
			keys[i] = storage.NewKey(ns, uint64((it+1)*batch+i))
		}
		if err := s.Put(ctx, keys, src); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if err := s.Delete(ctx, keys); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}
