package stores_test

import (
	"bytes"
	"context"
	"encoding/csv"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cpcache/cpcache/internal/testenv/redistest"
	"github.com/cpcache/cpcache/storage"
	"github.com/cpcache/cpcache/storage/stores"
)

// BenchmarkDataPath measures the data path of the file and Redis backends, MAC on, against
// what their medium does without cpcache, each ratio taken in the same run on the same
// machine:
//
//   - file-get: a Get of a batch of pages (default workers) against reads of the very
//     files the store wrote, one file after the other (open, one pread into a reused
//     buffer, close: system calls, no os.File): through the page cache, warm for both (x-raw-read, cpu-x-raw-read:
//     the raw read's MB/s and CPU time over the store's), and with O_DIRECT, which reads
//     the disk (ratio:file_get_<size>_vs_odirect_read: the store's MB/s over O_DIRECT's;
//     ratio:file_get_cold_<size>_vs_odirect_read: the same with the store's files evicted
//     from the page cache before each Get). ratio:file_get_cpu_vs_pagecache_read_<size>
//     is the store's CPU time per byte over the warm raw read's.
//   - file-put: a Put overwriting the batch against writing the same stored bytes to a
//     temporary file and renaming it over the page's file, one file after the other
//     (ratio:file_put_cpu_vs_write_rename_<size>: the store's CPU time over the raw one's).
//   - redis-get, redis-put: a Get, or a Put overwriting the same keys, of one batch against
//     redis-benchmark GET, SET with the same value size (-d: page + header) and the
//     batch as its pipeline (-P batch, one connection: one batch in flight, as one call),
//     on the same redis-server, in rounds that alternate with the store's calls.
//     x-redis-benchmark = store bytes/s / redis-benchmark's;
//     ratio:redis_<op>_cpu_vs_redis_benchmark_<size> = the client's CPU time (this
//     process) over the redis-benchmark process's for the same values.
//
// On a shared machine the wall-clock ratios move with the load (a parallel call suffers
// more from other processes than a one-thread loop): the CPU-time ratios, a core at a
// time, are the steadier ones. make bench-storage runs this benchmark a few times and
// prints the median of each ratio:NAME metric as "ratio NAME VALUE" (bench-summary).
//
// Batches: 32 pages of 64 KiB (2 MiB), 8 pages of 2 MiB (16 MiB). Above 1 is faster than
// the baseline for throughput ratios (x-*, *_vs_odirect_read), below 1 cheaper for cost
// ratios (*_cpu_vs_*).
func BenchmarkDataPath(b *testing.B) {
	for _, sz := range dataPathSizes {
		b.Run("file-get/"+sz.name, func(b *testing.B) { benchFileGet(b, sz) })
	}
	for _, sz := range dataPathSizes {
		b.Run("file-put/"+sz.name, func(b *testing.B) { benchFilePut(b, sz) })
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
	fi, err := os.Stat(names[0])
	if err != nil {
		b.Fatal(err)
	}
	valueLen := int(fi.Size()) // header + page, of the format this store writes
	raw := make([]byte, valueLen)
	rawRead := func() {
		for _, name := range names {
			fd, err := unix.Open(name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				b.Fatal(err)
			}
			if n, err := unix.Pread(fd, raw, 0); n != len(raw) {
				b.Fatalf("raw read of %s: %d bytes, %v", name, n, err)
			}
			unix.Close(fd)
		}
	}
	// O_DIRECT: a buffer aligned to the page size, the length rounded up to it (the read
	// stops at the end of the file).
	direct, err := unix.Mmap(-1, 0, (valueLen+4095)&^4095, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		b.Fatal(err)
	}
	defer unix.Munmap(direct)
	directRead := func() bool {
		for _, name := range names {
			fd, err := unix.Open(name, unix.O_RDONLY|unix.O_DIRECT|unix.O_CLOEXEC, 0)
			if err != nil {
				if err == unix.EINVAL {
					return false // the file system does not take O_DIRECT (tmpfs)
				}
				b.Fatal(err)
			}
			n, err := unix.Pread(fd, direct, 0)
			unix.Close(fd)
			if err == unix.EINVAL {
				return false
			}
			if n != valueLen {
				b.Fatalf("O_DIRECT read of %s: %d bytes, %v", name, n, err)
			}
		}
		return true
	}
	evict := func() {
		for _, name := range names {
			fd, err := unix.Open(name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				b.Fatal(err)
			}
			unix.Fadvise(fd, 0, 0, unix.FADV_DONTNEED)
			unix.Close(fd)
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
	hasDirect := directRead()
	var tStore, tRaw, tDirect, tCold, cStore, cRaw time.Duration
	b.ResetTimer()
	for range b.N {
		t0, c0 := time.Now(), processCPU(b)
		get()
		t1, c1 := time.Now(), processCPU(b)
		rawRead()
		t2, c2 := time.Now(), processCPU(b)
		tStore += t1.Sub(t0)
		tRaw += t2.Sub(t1)
		cStore += c1 - c0
		cRaw += c2 - c1
		if hasDirect {
			directRead()
			tDirect += time.Since(t2)
			b.StopTimer()
			evict()
			b.StartTimer()
			t3 := time.Now()
			get()
			tCold += time.Since(t3)
		}
	}
	b.StopTimer()
	for i := range dst {
		if !bytes.Equal(dst[i], src[i]) {
			b.Fatalf("page %d read back differs", i)
		}
	}
	reportRatio(b, float64(b.N*len(keys)*sz.page), tStore, tRaw, "raw-read")
	b.ReportMetric(cRaw.Seconds()/cStore.Seconds(), "cpu-x-raw-read")
	b.ReportMetric(cStore.Seconds()/cRaw.Seconds(), "ratio:file_get_cpu_vs_pagecache_read_"+sz.name)
	if hasDirect {
		b.ReportMetric(tDirect.Seconds()/tStore.Seconds(), "ratio:file_get_"+sz.name+"_vs_odirect_read")
		b.ReportMetric(tDirect.Seconds()/tCold.Seconds(), "ratio:file_get_cold_"+sz.name+"_vs_odirect_read")
	}
}

func benchFilePut(b *testing.B, sz dataPathSize) {
	ns := mustNamespace(b, "bench/datapath")
	s := openURL(b, "file://"+b.TempDir(), storage.Options{Namespace: ns, MACKey: bytes.Repeat([]byte("k"), 32)})
	ctx := context.Background()
	keys, src, _ := dataPathPages(ns, sz)
	if err := s.Put(ctx, keys, src); err != nil {
		b.Fatal(err)
	}
	// The raw side writes the very bytes the store stored (header + page) to a temporary
	// file beside the page's own copy and renames it over that, as the store does.
	rawDir := b.TempDir()
	values := make([][]byte, len(keys))
	names := make([]string, len(keys))
	for i, k := range keys {
		v, err := os.ReadFile(stores.DirPath(s, k))
		if err != nil {
			b.Fatal(err)
		}
		values[i] = v
		names[i] = filepath.Join(rawDir, strconv.Itoa(i))
	}
	rawPut := func() {
		for i, name := range names {
			tmp := name + ".tmp"
			f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := f.Write(values[i]); err != nil {
				b.Fatal(err)
			}
			if err := f.Close(); err != nil {
				b.Fatal(err)
			}
			if err := os.Rename(tmp, name); err != nil {
				b.Fatal(err)
			}
		}
	}
	put := func() {
		if err := s.Put(ctx, keys, src); err != nil {
			b.Fatal(err)
		}
	}
	put()
	rawPut()
	var tStore, tRaw, cStore, cRaw time.Duration
	b.ResetTimer()
	for range b.N {
		t0, c0 := time.Now(), processCPU(b)
		put()
		t1, c1 := time.Now(), processCPU(b)
		rawPut()
		tStore += t1.Sub(t0)
		tRaw += time.Since(t1)
		cStore += c1 - c0
		cRaw += processCPU(b) - c1
	}
	b.StopTimer()
	reportRatio(b, float64(b.N*len(keys)*sz.page), tStore, tRaw, "write-rename")
	b.ReportMetric(cStore.Seconds()/cRaw.Seconds(), "ratio:file_put_cpu_vs_write_rename_"+sz.name)
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
			"-t", test, "-d", strconv.Itoa(storage.StoredLen(sz.page)), "-P", strconv.Itoa(sz.batch), "-c", "1",
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
	b.ReportMetric(cStore.Seconds()/cBase.Seconds(), "ratio:redis_"+op+"_cpu_vs_redis_benchmark_"+sz.name)
}
