package stores_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cpcache/cpcache/internal/testenv/redistest"
	"github.com/cpcache/cpcache/storage"
)

// Throughput of each backend for 64 KiB pages, in batches of 64 pages (4 MiB), against a
// baseline measured in the same benchmark: the same bytes written with os.WriteFile and read
// with os.ReadFile, one file per page, in a directory on the same filesystem as the file
// backend (t.TempDir). Metrics: MB/s of the backend, plain-MB/s of the baseline, and
// x-plain = backend/baseline (above 1 is faster than plain file I/O). Operations: put-new
// writes pages under new keys (a backup; both sides delete their files untimed after each
// batch), put-overwrite rewrites the same keys (worst case for the atomic rename on the file
// backend: a fresh inode per write against an in-place truncate), get reads the batch.

const (
	benchPage  = 64 << 10
	benchBatch = 64
)

type benchBackend struct {
	name string
	open func(b *testing.B, ns storage.Namespace) storage.Storage
}

func benchBackends() []benchBackend {
	file := func(workers int) func(b *testing.B, ns storage.Namespace) storage.Storage {
		return func(b *testing.B, ns storage.Namespace) storage.Storage {
			return openURL(b, "file://"+b.TempDir(), storage.Options{Namespace: ns, Workers: workers})
		}
	}
	return []benchBackend{
		{"file", file(0)},
		{"file-1worker", file(1)},
		{"redis", func(b *testing.B, ns storage.Namespace) storage.Storage {
			r := redistest.Start(b)
			return openURL(b, r.URL("bench"), storage.Options{Namespace: ns})
		}},
		{"mem", func(b *testing.B, ns storage.Namespace) storage.Storage {
			return openURL(b, "mem://bench", storage.Options{Namespace: ns})
		}},
	}
}

func BenchmarkStorage(b *testing.B) {
	for _, be := range benchBackends() {
		for _, op := range []string{"put-new", "put-overwrite", "get"} {
			b.Run(be.name+"/"+op, func(b *testing.B) { benchOp(b, be, op) })
		}
	}
}

func benchOp(b *testing.B, be benchBackend, op string) {
	ns := mustNamespace(b, "bench/"+be.name)
	s := be.open(b, ns)
	defer s.Close()
	ctx := context.Background()
	keys := make([]storage.Key, benchBatch)
	src := make([][]byte, benchBatch)
	dst := make([][]byte, benchBatch)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range keys {
		keys[i] = storage.NewKey(ns, uint64(i))
		src[i] = make([]byte, benchPage)
		for j := range src[i] {
			src[i][j] = byte(r.Uint32())
		}
		dst[i] = make([]byte, benchPage)
	}
	plainDir := b.TempDir()
	plainNames := make([]string, benchBatch)
	for i := range plainNames {
		plainNames[i] = filepath.Join(plainDir, fmt.Sprintf("page-%03d", i))
	}
	if err := s.Put(ctx, keys, src); err != nil {
		b.Fatal(err)
	}
	for i := range plainNames {
		if err := os.WriteFile(plainNames[i], src[i], 0o600); err != nil {
			b.Fatal(err)
		}
	}
	found := make([]bool, benchBatch)
	var tStore, tPlain time.Duration
	b.ResetTimer()
	for it := range b.N {
		if op == "put-new" {
			for i := range keys {
				keys[i] = storage.NewKey(ns, uint64(it*benchBatch+i+benchBatch))
			}
		}
		t0 := time.Now()
		if op != "get" {
			if err := s.Put(ctx, keys, src); err != nil {
				b.Fatal(err)
			}
		} else {
			if n, err := s.Get(ctx, keys, dst, found); err != nil || n != benchBatch {
				b.Fatalf("get: %d hits, %v", n, err)
			}
		}
		t1 := time.Now()
		for i, name := range plainNames {
			if op != "get" {
				if err := os.WriteFile(name, src[i], 0o600); err != nil {
					b.Fatal(err)
				}
			} else if _, err := os.ReadFile(name); err != nil {
				b.Fatal(err)
			}
		}
		tStore += t1.Sub(t0)
		tPlain += time.Since(t1)
		if op == "put-new" {
			if err := s.Delete(ctx, keys); err != nil {
				b.Fatal(err)
			}
			for _, name := range plainNames {
				if err := os.Remove(name); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	bytes := float64(b.N) * benchBatch * benchPage / 1e6
	store, plain := bytes/tStore.Seconds(), bytes/tPlain.Seconds()
	b.ReportMetric(store, "MB/s")
	b.ReportMetric(plain, "plain-MB/s")
	b.ReportMetric(store/plain, "x-plain")
	b.ReportMetric(0, "ns/op")
}
