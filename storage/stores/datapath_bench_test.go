package stores_test

import (
	"bytes"
	"context"
	"encoding/csv"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cpcache/cpcache/internal/testenv/redistest"
	"github.com/cpcache/cpcache/storage"
	"github.com/cpcache/cpcache/storage/stores"
)

// BenchmarkDataPath measures the data path of the file and Redis backends, MAC on (keyed
// BLAKE3), against what their medium does without cpcache, each ratio taken in the same
// run on the same machine:
//
//   - file-get: a warm Get of a batch of pages against raw reads of the very files the store
//     wrote (open, one pread into a reused buffer, close; one file after the other, as
//     os.ReadFile), the page cache warm for both. x-raw-read = raw time / Get time.
//   - redis-get, redis-put: a Get, or a Put overwriting the same keys, of one batch against
//     redis-benchmark GET, SET with the same value size (-d: page + 80-byte header) and the
//     batch as its pipeline (-P batch, one connection: one batch in flight, as one call),
//     on the same redis-server, in rounds that alternate with the store's calls.
//     x-redis-benchmark = store bytes/s / redis-benchmark's.
//
// On a shared machine the wall-clock ratios move with the load (a parallel call suffers
// more from other processes than a one-thread loop), so each also reports cpu-x-<baseline>:
// the baseline's CPU time over the store's for the same bytes (for Redis, the client's:
// this process against the redis-benchmark process), the ratio a core at a time.
//
// Batches: 32 pages of 64 KiB (2 MiB), 8 pages of 2 MiB (16 MiB). Above 1 is faster than
// the baseline; issue 24 asks for 0.8.
func BenchmarkDataPath(b *testing.B) {
	for _, sz := range dataPathSizes {
		b.Run("file-get/"+sz.name, func(b *testing.B) { benchFileGet(b, sz) })
	}
	for _, sz := range dataPathSizes {
		for _, op := range []string{"get", "put"} {
			b.Run("redis-"+op+"/"+sz.name, func(b *testing.B) { benchRedisVsBaseline(b, sz, op) })
		}
	}
}

type dataPathSize struct {
	name        string
	page, batch int
}

var dataPathSizes = []dataPathSize{{"64KiB", 64 << 10, 32}, {"2MiB", 2 << 20, 8}}

// dataPathPages returns a batch of keys of ns and random pages of sz, and buffers to read
// them into.
func dataPathPages(ns storage.Namespace, sz dataPathSize) (keys []storage.Key, src, dst [][]byte) {
	rng := rand.New(rand.NewPCG(1, 2))
	keys = make([]storage.Key, sz.batch)
	src, dst = make([][]byte, sz.batch), make([][]byte, sz.batch)
	for i := range keys {
		keys[i] = storage.NewKey(ns, uint64(i))
		src[i], dst[i] = make([]byte, sz.page), make([]byte, sz.page)
		for j := 0; j < sz.page; j += 8 {
			v := rng.Uint64()
			for k := range 8 {
				src[i][j+k] = byte(v >> (8 * k))
			}
		}
	}
	return keys, src, dst
}

func benchFileGet(b *testing.B, sz dataPathSize) {
	ns := mustNamespace(b, "bench/datapath")
	s := openURL(b, "file://"+b.TempDir(), storage.Options{Namespace: ns, MACKey: bytes.Repeat([]byte("k"), 32)})
	ctx := context.Background()
	keys, src, dst := dataPathPages(ns, sz)
	if err := s.Put(ctx, keys, src); err != nil {
		b.Fatal(err)
	}
	names := make([]string, len(keys))
	for i, k := range keys {
		names[i] = stores.DirPath(s, k)
	}
	raw := make([]byte, storage.HeaderSize+sz.page)
	rawRead := func() {
		for _, name := range names {
			f, err := os.Open(name)
			if err != nil {
				b.Fatal(err)
			}
			if n, err := f.ReadAt(raw, 0); n != len(raw) {
				b.Fatalf("raw read of %s: %d bytes, %v", name, n, err)
			}
			f.Close()
		}
	}
	found := make([]bool, len(keys))
	get := func() {
		if n, err := s.Get(ctx, keys, dst, found); err != nil || n != len(keys) {
			b.Fatalf("get: %d of %d pages, %v", n, len(keys), err)
		}
	}
	get() // warm: both sides read the same cached files
	rawRead()
	var tStore, tRaw, cStore, cRaw time.Duration
	b.ResetTimer()
	for range b.N {
		t0, c0 := time.Now(), processCPU(b)
		get()
		t1, c1 := time.Now(), processCPU(b)
		rawRead()
		tStore += t1.Sub(t0)
		tRaw += time.Since(t1)
		cStore += c1 - c0
		cRaw += processCPU(b) - c1
	}
	b.StopTimer()
	for i := range dst {
		if !bytes.Equal(dst[i], src[i]) {
			b.Fatalf("page %d read back differs", i)
		}
	}
	reportRatio(b, float64(b.N*len(keys)*sz.page), tStore, tRaw, "raw-read")
	b.ReportMetric(cRaw.Seconds()/cStore.Seconds(), "cpu-x-raw-read")
}

// processCPU is the CPU time (user and system) this process has used so far.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportRatio reports the store's MB/s, the baseline's, and their ratio x-<baseline>.
func reportRatio(b *testing.B, bytes float64, tStore, tBase time.Duration, baseline string) {
	store, base := bytes/tStore.Seconds()/1e6, bytes/tBase.Seconds()/1e6
	b.ReportMetric(store, "MB/s")
	b.ReportMetric(base, baseline+"-MB/s")
	b.ReportMetric(store/base, "x-"+baseline)
	b.ReportMetric(0, "ns/op")
}

func benchRedisVsBaseline(b *testing.B, sz dataPathSize, op string) {
	tool, err := exec.LookPath("redis-benchmark")
	if err != nil {
		b.Skipf("redis-benchmark is not installed (Debian package redis-tools): %v", err)
	}
	ns := mustNamespace(b, "bench/datapath")
	r := redistest.Start(b)
	s := openURL(b, r.URL("bench"), storage.Options{Namespace: ns, MACKey: bytes.Repeat([]byte("k"), 32)})
	ctx := context.Background()
	keys, src, dst := dataPathPages(ns, sz)
	if err := s.Put(ctx, keys, src); err != nil {
		b.Fatal(err)
	}
	call := func() {
		if op == "put" {
			if err := s.Put(ctx, keys, src); err != nil {
				b.Fatal(err)
			}
		} else if n, err := s.Get(ctx, keys, dst, nil); err != nil || n != len(keys) {
			b.Fatalf("get: %d of %d pages, %v", n, len(keys), err)
		}
	}
	call()
	// redis-benchmark's GET reads the key its SET wrote: set it first, untimed.
	cmd := map[string]string{"get": "get", "put": "set"}[op]
	var cBase time.Duration
	baseline := func(n int, test string) float64 {
		c := exec.Command(tool, "-h", "127.0.0.1", "-p", r.Addr()[strings.LastIndexByte(r.Addr(), ':')+1:],
			"-t", test, "-d", strconv.Itoa(storage.HeaderSize+sz.page), "-P", strconv.Itoa(sz.batch), "-c", "1",
			"-n", strconv.Itoa(n), "--csv")
		out, err := c.CombinedOutput()
		if c.ProcessState != nil {
			cBase += c.ProcessState.UserTime() + c.ProcessState.SystemTime()
		}
		if err != nil {
			b.Fatalf("redis-benchmark: %v\n%s", err, out)
		}
		recs, err := csv.NewReader(bytes.NewReader(out)).ReadAll()
		if err != nil || len(recs) < 2 || len(recs[1]) < 2 {
			b.Fatalf("redis-benchmark printed %q: %v", out, err)
		}
		rps, err := strconv.ParseFloat(recs[1][1], 64)
		if err != nil || rps <= 0 {
			b.Fatalf("redis-benchmark: requests per second %q: %v", recs[1][1], err)
		}
		return rps
	}
	baseline(sz.batch, "set")
	cBase = 0
	// Rounds of the store's calls alternate with rounds of redis-benchmark, so that both
	// see the same load on a shared machine; redis-benchmark times its own requests.
	const rounds = 4
	var tStore, tBase, cStore time.Duration
	b.ResetTimer()
	for r := range rounds {
		calls := b.N/rounds + min(1, max(0, b.N%rounds-r))
		if calls == 0 {
			continue
		}
		t0, c0 := time.Now(), processCPU(b)
		for range calls {
			call()
		}
		tStore += time.Since(t0)
		cStore += processCPU(b) - c0
		b.StopTimer()
		rps := baseline(calls*sz.batch, cmd)
		tBase += time.Duration(float64(calls*sz.batch) / rps * float64(time.Second))
		b.StartTimer()
	}
	b.StopTimer()
	if op == "get" {
		for i := range dst {
			if !bytes.Equal(dst[i], src[i]) {
				b.Fatalf("page %d read back differs", i)
			}
		}
	}
	reportRatio(b, float64(b.N*len(keys)*sz.page), tStore, tBase, "redis-benchmark")
	b.ReportMetric(cBase.Seconds()/cStore.Seconds(), "cpu-x-redis-benchmark")
}
