package stores_test

import (
	"bufio"
	"container/heap"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cpcache/cpcache/storage"
	"github.com/cpcache/cpcache/storage/storagetest"
	"github.com/cpcache/cpcache/storage/stores"
)

// capPayload is the page size of the capacity tests: small, so that a directory of a few
// thousand pages is cheap to write and scan.
const capPayload = 1024

var capStored = int64(storage.StoredLen(capPayload))

// pageID is the id of test page x (a chained page id, as hicache/core.PageID).
func pageID(x uint64) [32]byte {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], x)
	return sha256.Sum256(append([]byte("cpcache/test/page\x00"), b[:]...))
}

// chainPages returns the keys and bindings of the chain of page ids ids (each bound to the
// one before it; the first to a root id) in shard shard.
func chainPages(ns storage.Namespace, shard uint32, ids []uint64) ([]storage.Key, []storage.Binding) {
	keys := make([]storage.Key, len(ids))
	binds := make([]storage.Binding, len(ids))
	parent := sha256.Sum256([]byte("cpcache/test/root"))
	for i, x := range ids {
		id := pageID(x)
		keys[i] = storage.PageKey(ns, id, shard)
		binds[i] = storage.Binding{Tokens: sha256.Sum256(id[:]), Parent: parent}
		parent = id
	}
	return keys, binds
}

func capPages(n int, seed byte) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		out[i] = make([]byte, capPayload)
		for j := range out[i] {
			out[i][j] = seed + byte(i*7+j)
		}
	}
	return out
}

// dirBytes is what the capacity counts under root: the sizes of the page files and of the
// writes in progress.
func dirBytes(t testing.TB, root string) (n int64) {
	filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || filepath.Dir(path) == root {
			return nil // vanished meanwhile, or the root's own files (key, usage)
		}
		if fi, err := d.Info(); err == nil && fi.Mode().IsRegular() {
			n += fi.Size()
		}
		return nil
	})
	return n
}

// TestDirCapURL: max_bytes takes a byte count with a unit and refuses a bad one naming it;
// ttl takes a positive duration.
func TestDirCapURL(t *testing.T) {
	dir := t.TempDir()
	ns := mustNamespace(t, "capurl")
	for _, v := range []string{"1048576", "512MiB", "2GiB", "3gb", "64k", "1TiB"} {
		s, err := stores.Open(testCtx(t), "file://"+dir+"?max_bytes="+v+"&ttl=1h", storage.Options{Namespace: ns})
		if err != nil {
			t.Fatalf("max_bytes=%s: %v", v, err)
		}
		s.Close()
	}
	for _, q := range []string{"max_bytes=12XB", "max_bytes=-5", "max_bytes=0", "max_bytes=lots", "max_bytes=99999999999TiB", "ttl=-1h", "ttl=soon", "ttl=0s"} {
		_, err := stores.Open(testCtx(t), "file://"+dir+"?"+q, storage.Options{Namespace: ns})
		val := q[strings.IndexByte(q, '=')+1:]
		if !errors.Is(err, storage.ErrBadArgument) || !strings.Contains(err.Error(), strconv.Quote(val)) {
			t.Errorf("%s: got %v, want ErrBadArgument naming %q", q, err, val)
		}
	}
	if _, err := stores.Open(testCtx(t), "file://"+dir, storage.Options{Namespace: ns, MaxBytes: -1}); !errors.Is(err, storage.ErrBadArgument) {
		t.Errorf("MaxBytes -1: got %v, want ErrBadArgument", err)
	}
}

// TestDirCapConformance: a store with a capacity (that its tests stay far below) and a TTL
// keeps the storage contract.
func TestDirCapConformance(t *testing.T) {
	dir := t.TempDir()
	storagetest.Conformance(t, storagetest.Backend{
		Open: func(t *testing.T, opts storage.Options) storage.Storage {
			return openURL(t, "file://"+dir+"?max_bytes=1GiB&ttl=1h", opts)
		},
		Mutate: mutateDirFile,
	})
}

// TestDirCapLaterPagesFirst: a chain that must lose pages loses its last ones, never its
// first (a page whose prefix is gone can never be read), in any tensor-parallel shard.
func TestDirCapLaterPagesFirst(t *testing.T) {
	for _, shard := range []uint32{0, 3} {
		t.Run(fmt.Sprint("shard", shard), func(t *testing.T) {
			dir := t.TempDir()
			ns := mustNamespace(t, "capchain")
			max := 20 * capStored // high watermark: 19 pages, low: 17
			s := openURL(t, fmt.Sprintf("file://%s?max_bytes=%d", dir, max), storage.Options{Namespace: ns, Workers: 1})
			defer s.Close()
			ctx := testCtx(t)
			a, abind := chainPages(ns, shard, []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10})
			b, bbind := chainPages(ns, shard, []uint64{101, 102, 103, 104, 105, 106, 107, 108, 109, 110})
			// Chain a is written page by page, each batch its own, oldest first: a plain LRU
			// would evict a[0] first.
			for i := range a {
				if err := s.PutBound(ctx, a[i:i+1], abind[i:i+1], capPages(1, byte(i))); err != nil {
					t.Fatal(err)
				}
			}
			if err := s.PutBound(ctx, b, bbind, capPages(len(b), 9)); err != nil {
				t.Fatal(err)
			}
			present := make([]bool, len(a))
			if _, err := s.Exists(ctx, a, present); err != nil {
				t.Fatal(err)
			}
			n := slices.Index(present, false)
			if n < 0 || slices.Contains(present[n:], true) {
				t.Fatalf("chain a after eviction: present %v, want a prefix with its later pages evicted", present)
			}
			if n > 7 {
				t.Fatalf("chain a after eviction: %d of its pages present, want at most 7 (20 pages past the high watermark, evicted to the low, 17)", n)
			}
			if k, _ := s.Exists(ctx, b, nil); k != len(b) {
				t.Fatalf("chain b, the more recent: %d of %d pages present", k, len(b))
			}
			if st := s.Stats(); st.Evicted != uint64(len(a)-n) || st.Expired != 0 {
				t.Fatalf("stats: %d evicted, %d expired; want %d evicted", st.Evicted, st.Expired, len(a)-n)
			}
			if got := dirBytes(t, dir); got > stores.DirLowWater(max) {
				t.Fatalf("directory holds %d bytes after eviction, more than the low watermark %d", got, stores.DirLowWater(max))
			}
			// A hit is a use: reading chain a's prefix makes it more recent than chain b.
			if _, err := s.GetBound(ctx, a[:n], abind[:n], make2(n), nil); err != nil {
				t.Fatal(err)
			}
			c, cbind := chainPages(ns, shard, []uint64{201, 202, 203})
			if err := s.PutBound(ctx, c, cbind, capPages(len(c), 3)); err != nil {
				t.Fatal(err)
			}
			if k, _ := s.Exists(ctx, a[:n], nil); k != n {
				t.Fatalf("chain a's prefix, read last: %d of %d pages present after the next eviction", k, n)
			}
			if k, _ := s.Exists(ctx, b, nil); k == len(b) {
				t.Fatalf("chain b, not read since its Put, lost no page to the next eviction")
			}
		})
	}
}

func make2(n int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		out[i] = make([]byte, capPayload)
	}
	return out
}

// TestDirCapTTL: a page not used for longer than the TTL is a miss and is removed by the next
// sweep (counted as expired); a page read meanwhile stays.
func TestDirCapTTL(t *testing.T) {
	dir := t.TempDir()
	ns := mustNamespace(t, "capttl")
	s := openURL(t, "file://"+dir+"?ttl=1h", storage.Options{Namespace: ns})
	defer s.Close()
	var offset atomic.Int64
	stores.SetDirClock(s, func() time.Time { return time.Now().Add(time.Duration(offset.Load())) })
	ctx := testCtx(t)
	keys, binds := chainPages(ns, 0, []uint64{1, 2, 3, 4})
	if err := s.PutBound(ctx, keys, binds, capPages(4, 1)); err != nil {
		t.Fatal(err)
	}
	offset.Store(int64(40 * time.Minute))
	if n, err := s.GetBound(ctx, keys[:2], binds[:2], make2(2), nil); err != nil || n != 2 {
		t.Fatalf("get at 40 min: %d hits, %v; want 2", n, err)
	}
	offset.Store(int64(80 * time.Minute)) // pages 0, 1 used 40 min ago; 2, 3 written 80 min ago
	found := make([]bool, 4)
	if _, err := s.GetBound(ctx, keys, binds, make2(4), found); err != nil {
		t.Fatal(err)
	}
	if want := []bool{true, true, false, false}; !slices.Equal(found, want) {
		t.Fatalf("get at 80 min: found %v, want %v", found, want)
	}
	if n, _ := s.Exists(ctx, keys[2:], nil); n != 0 {
		t.Fatalf("exists at 80 min: %d expired pages present", n)
	}
	// The next Put sweeps: the expired pages' files go.
	other, obind := chainPages(ns, 0, []uint64{50})
	if err := s.PutBound(ctx, other, obind, capPages(1, 5)); err != nil {
		t.Fatal(err)
	}
	for i, k := range keys {
		_, err := os.Stat(stores.DirPath(s, k))
		if gone := errors.Is(err, fs.ErrNotExist); gone != (i >= 2) {
			t.Errorf("page %d: file removed %v, want %v (%v)", i, gone, i >= 2, err)
		}
	}
	if st := s.Stats(); st.Expired != 2 || st.Evicted != 0 {
		t.Fatalf("stats: %d expired, %d evicted; want 2 expired", st.Expired, st.Evicted)
	}
}

// capWriter writes n pages of seed's own chains into the store at url, batch pages a call.
func capWriter(ctx context.Context, url, keyFile string, ns storage.Namespace, seed uint64, n, batch int) error {
	s, err := stores.Open(ctx, url, storage.Options{Namespace: ns, MACKeyFile: keyFile})
	if err != nil {
		return err
	}
	defer s.Close()
	pages := capPages(batch, byte(seed))
	for i := 0; i < n; i += batch {
		ids := make([]uint64, batch)
		for j := range ids {
			ids[j] = seed<<32 | uint64(i+j)
		}
		keys, binds := chainPages(ns, 0, ids)
		if err := s.PutBound(ctx, keys, binds, pages); err != nil {
			return err
		}
	}
	return nil
}

const (
	envCapChild = "CPCACHE_TEST_CAP_CHILD" // url,keyfile,namespace identity,seed,pages,batch
)

// TestDirCapChildWriter is the child process of TestDirCapSharedByProcesses.
func TestDirCapChildWriter(t *testing.T) {
	spec := os.Getenv(envCapChild)
	if spec == "" {
		t.Skip("a helper: runs only as the child process of TestDirCapSharedByProcesses")
	}
	f := strings.Split(spec, ",")
	ns, err := storage.NewNamespace(f[2])
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := strconv.ParseUint(f[3], 10, 64)
	n, _ := strconv.Atoi(f[4])
	batch, _ := strconv.Atoi(f[5])
	if err := capWriter(testCtx(t), f[0], f[1], ns, seed, n, batch); err != nil {
		t.Fatal(err)
	}
}

// TestDirCapSharedByProcesses: several stores (three in this process, two in child
// processes) writing one directory far past its capacity keep it within the capacity plus
// the stated overshoot (one batch per writer), watched throughout, and below the capacity
// once they are done.
func TestDirCapSharedByProcesses(t *testing.T) {
	dir := t.TempDir()
	keyFile := filepath.Join(t.TempDir(), "key")
	if _, err := stores.LoadOrCreateKeyFile(keyFile); err != nil {
		t.Fatal(err)
	}
	const (
		writers, children = 3, 2
		pages, batch      = 400, 8
	)
	ns := mustNamespace(t, "capshared")
	max := 128 * capStored
	url := fmt.Sprintf("file://%s?max_bytes=%d", dir, max)
	ctx := testCtx(t)

	var peak atomic.Int64
	stop := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for {
			peak.Store(max64(peak.Load(), dirBytes(t, dir)))
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	var wg sync.WaitGroup
	errs := make(chan error, writers+children)
	for w := range children {
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run", "^TestDirCapChildWriter$", "-test.count=1")
		cmd.Env = append(os.Environ(), envCapChild+"="+strings.Join([]string{url, keyFile, "capshared", fmt.Sprint(100 + w), fmt.Sprint(pages), fmt.Sprint(batch)}, ","))
		wg.Go(func() {
			if out, err := cmd.CombinedOutput(); err != nil {
				errs <- fmt.Errorf("child %d: %v\n%s", w, err, out)
			}
		})
	}
	total := make(chan storage.Stats, writers)
	for w := range writers {
		wg.Go(func() {
			s, err := stores.Open(ctx, url, storage.Options{Namespace: ns, MACKeyFile: keyFile})
			if err != nil {
				errs <- err
				return
			}
			defer s.Close()
			pages := capPages(batch, byte(w))
			for i := 0; i < 400; i += batch {
				ids := make([]uint64, batch)
				for j := range ids {
					ids[j] = uint64(w)<<32 | uint64(i+j)
				}
				keys, binds := chainPages(ns, 0, ids)
				if err := s.PutBound(ctx, keys, binds, pages); err != nil {
					errs <- err
					return
				}
			}
			total <- s.Stats()
		})
	}
	wg.Wait()
	close(stop)
	<-watched
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	close(total)
	var evicted uint64
	for st := range total {
		evicted += st.Evicted
	}
	written := int64(writers+children) * pages * capStored
	overshoot := int64(writers+children) * batch * capStored
	final := dirBytes(t, dir)
	t.Logf("wrote %d bytes through a capacity of %d: peak %d (%.3f of the capacity), final %d; this process evicted %d pages",
		written, max, peak.Load(), float64(peak.Load())/float64(max), final, evicted)
	if p := peak.Load(); p > max+overshoot {
		t.Errorf("directory peaked at %d bytes, past the capacity %d plus one batch per writer (%d)", p, max, overshoot)
	}
	if final > max+overshoot {
		t.Errorf("directory holds %d bytes at the end, past the capacity %d plus one batch per writer", final, max)
	}
	if evicted == 0 {
		t.Errorf("the stores of this process evicted nothing")
	}
	// Once quiet, the next Put's scan (or the counter) finds the directory under the cap.
	s := openURL(t, url, storage.Options{Namespace: ns, MACKeyFile: keyFile})
	defer s.Close()
	keys, binds := chainPages(ns, 0, []uint64{1 << 40})
	if err := s.PutBound(ctx, keys, binds, capPages(1, 1)); err != nil {
		t.Fatal(err)
	}
	if got := dirBytes(t, dir); got > max {
		t.Errorf("directory holds %d bytes after a quiet Put, past the capacity %d", got, max)
	}
}

func max64(a, b int64) int64 {
	if a > b {
		return a
	}
	return b
}

// traceChains returns the first n requests of the Mooncake conversation trace (each a chain
// of block ids, prefix-identified), or a synthetic trace of the same shape when the shared
// data is not there.
func traceChains(t *testing.T, n int) [][]uint64 {
	for _, p := range []string{
		filepath.Join("..", "..", "..", "shared", "data", "traces", "conversation_trace.jsonl"),
		filepath.Join("..", "..", "..", "..", "shared", "data", "traces", "conversation_trace.jsonl"),
	} {
		f, err := os.Open(p)
		if err != nil {
			continue
		}
		defer f.Close()
		var out [][]uint64
		sc := bufio.NewScanner(f)
		sc.Buffer(nil, 1<<20)
		for len(out) < n && sc.Scan() {
			var r struct {
				HashIDs []uint64 `json:"hash_ids"`
			}
			if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
				t.Fatalf("%s: %v", p, err)
			}
			out = append(out, r.HashIDs)
		}
		t.Logf("trace: the first %d requests of %s", len(out), p)
		return out
	}
	// Synthetic: a few system prompts, conversations that grow turn by turn, and one-offs.
	rng := rand.New(rand.NewPCG(1, 2))
	var out [][]uint64
	next := uint64(1000)
	var convs [][]uint64
	for len(out) < n {
		switch r := rng.IntN(10); {
		case r < 4 && len(convs) > 0:
			i := rng.IntN(len(convs))
			for range 1 + rng.IntN(4) {
				convs[i] = append(convs[i], next)
				next++
			}
			out = append(out, slices.Clone(convs[i]))
		default:
			c := []uint64{uint64(rng.IntN(4))}
			for range 2 + rng.IntN(12) {
				c = append(c, next)
				next++
			}
			convs = append(convs, c)
			out = append(out, slices.Clone(c))
		}
	}
	t.Log("trace: synthetic (the shared Mooncake trace is not there)")
	return out
}

// lruModel is an LRU cache of whole pages that knows chains: a request touches its whole
// chain, and among pages last used by the same request the later ones go first. It is
// what the directory store's eviction approximates with file times.
type lruModel struct {
	cap   int
	clock int64
	used  map[uint64]modelUse // page -> its last use
	queue modelQueue          // every use; those a later use replaced are skipped
}

// modelUse orders a page's use for eviction: by request, then deeper first.
type modelUse struct {
	page         uint64
	clock, depth int64
}

type modelQueue []modelUse

func (q modelQueue) Len() int { return len(q) }
func (q modelQueue) Less(i, j int) bool {
	return q[i].clock < q[j].clock || q[i].clock == q[j].clock && q[i].depth > q[j].depth
}
func (q modelQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *modelQueue) Push(x any)   { *q = append(*q, x.(modelUse)) }
func (q *modelQueue) Pop() any {
	x := (*q)[len(*q)-1]
	*q = (*q)[:len(*q)-1]
	return x
}

func (m *lruModel) request(chain []uint64) (hits int) {
	for hits < len(chain) {
		if _, ok := m.used[chain[hits]]; !ok {
			break
		}
		hits++
	}
	m.clock++
	for d, p := range chain {
		u := modelUse{p, m.clock, int64(d)}
		m.used[p] = u
		heap.Push(&m.queue, u)
	}
	for len(m.used) > m.cap {
		u := heap.Pop(&m.queue).(modelUse)
		if m.used[u.page] == u {
			delete(m.used, u.page)
		}
	}
	return hits
}

// modelHitRate is the model's hit rate on second after it served first.
func modelHitRate(first, second [][]uint64, capPages int) float64 {
	m := &lruModel{cap: capPages, used: map[uint64]modelUse{}}
	for _, c := range first {
		m.request(c)
	}
	hits, pages := 0, 0
	for _, c := range second {
		hits += m.request(c)
		pages += len(c)
	}
	return float64(hits) / float64(pages)
}

// TestDirCapSecondRunHitRate: a store with a capacity serves a trace of prefix chains twice
// (each request reads its chain's stored prefix and writes the rest, as the cache's prefetch
// and backup do); the second run's hit rate is what an LRU of that capacity gives on the
// same sequence (the model evicts one page at a time at the capacity; the store evicts from
// 95% of it down to 85%, so its rate lies between the model's at 85% and at 100%). The
// second run serves the requests in reverse order, starting where the first ended, so that
// its hits are what the eviction kept: in trace order an LRU smaller than the working set
// keeps nothing the next run reads first (its hit rate is then the trace's own reuse).
func TestDirCapSecondRunHitRate(t *testing.T) {
	trace := traceChains(t, 200)
	unique := map[uint64]bool{}
	for i, c := range trace {
		trace[i] = c[:min(len(c), 64)]
		for _, p := range trace[i] {
			unique[p] = true
		}
	}
	capN := len(unique) / 2
	max := int64(capN) * capStored
	dir := t.TempDir()
	ns := mustNamespace(t, "caphit")
	s := openURL(t, fmt.Sprintf("file://%s?max_bytes=%d", dir, max), storage.Options{Namespace: ns, Workers: 1})
	defer s.Close()
	ctx := testCtx(t)
	bufs := make2(64)
	payload := capPages(64, 7)
	run := func(trace [][]uint64) (hits, pages int) {
		for _, c := range trace {
			keys, binds := chainPages(ns, 0, c)
			n, err := s.GetBound(ctx, keys, binds, bufs[:len(c)], nil)
			if err != nil {
				t.Fatal(err)
			}
			if n < len(c) {
				if err := s.PutBound(ctx, keys[n:], binds[n:], payload[:len(c)-n]); err != nil {
					t.Fatal(err)
				}
			}
			hits += n
			pages += len(c)
		}
		return hits, pages
	}
	second := slices.Clone(trace)
	slices.Reverse(second)
	run(trace)
	hits, pages := run(second)
	got := float64(hits) / float64(pages)
	lo := modelHitRate(trace, second, int(stores.DirLowWater(max)/capStored))
	hi := modelHitRate(trace, second, capN)
	unlimited := modelHitRate(trace, second, len(unique))
	mid := modelHitRate(trace, second, capN*9/10) // the store's mean occupancy
	st := s.Stats()
	t.Logf("%d requests, %d pages, %d unique, capacity %d pages: second-run hit rate %.4f; LRU model %.4f at 85%%, %.4f at 90%%, %.4f at 100%% of the capacity, %.4f unlimited; %d evicted; directory %d of %d bytes",
		len(trace), pages, len(unique), capN, got, lo, mid, hi, unlimited, st.Evicted, dirBytes(t, dir), max)
	const slack = 0.01
	if got < lo-slack || got > hi+slack {
		t.Errorf("second-run hit rate %.4f, want within [%.4f, %.4f] (the LRU model at 85%% and 100%% of the capacity, ±%.2f)", got, lo, hi, slack)
	}
	if st.Evicted == 0 || dirBytes(t, dir) > max {
		t.Errorf("%d evicted, directory %d bytes of a capacity of %d", st.Evicted, dirBytes(t, dir), max)
	}
}

// TestDirCapFrozenAndLocked: the capacity's accounting never hangs a Put. On a frozen file
// system a capped store's Put returns at its deadline; while another store holds the
// eviction lock and never lets it go (a scan stuck in the kernel), a Put past the high
// watermark but within the capacity goes on without waiting, and one past the capacity
// waits only until its deadline; once the holder dies (its flock goes with its descriptor)
// the next Put evicts and succeeds.
func TestDirCapFrozenAndLocked(t *testing.T) {
	dir := t.TempDir()
	ns := mustNamespace(t, "capfrozen")
	max := 20 * capStored
	url := fmt.Sprintf("file://%s?max_bytes=%d", dir, max)
	st := openURL(t, url, storage.Options{Namespace: ns})
	defer st.Close()
	ctx := testCtx(t)
	put := func(ctx context.Context, s storage.Storage, first, n int) error {
		ids := make([]uint64, n)
		for i := range ids {
			ids[i] = uint64(first + i)
		}
		keys, binds := chainPages(ns, 0, ids)
		return s.PutBound(ctx, keys, binds, capPages(n, byte(first)))
	}
	if err := put(ctx, st, 0, 18); err != nil { // 18 pages: under the high watermark (19)
		t.Fatal(err)
	}
	holder, err := os.OpenFile(filepath.Join(dir, ".cpcache-evict"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	if err := syscall.Flock(int(holder.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	// 20 pages reserved: past the high watermark, within the capacity: no wait.
	if err := put(ctx, st, 200, 2); err != nil {
		t.Fatalf("put past the high watermark while another store holds the eviction lock: %v", err)
	}
	start := time.Now()
	returnsWithin(t, "put past the capacity while the eviction lock is held", 100*time.Millisecond,
		func(ctx context.Context) error { return put(ctx, st, 300, 4) })
	t.Logf("the Put past the capacity returned after %v", time.Since(start))
	holder.Close() // the holder dies
	if err := put(ctx, st, 400, 4); err != nil {
		t.Fatalf("put after the lock's holder died: %v", err)
	}
	if got := dirBytes(t, dir); got > max {
		t.Fatalf("directory holds %d bytes after the eviction, past the capacity %d", got, max)
	}
	if st.Stats().Evicted == 0 {
		t.Fatal("nothing evicted")
	}

	frozen := stores.WithFaults(st, stores.Faults{Freeze: true})
	returnsWithin(t, "put with a capacity", 50*time.Millisecond, func(ctx context.Context) error { return put(ctx, frozen, 500, 1) })
	frozen.Close() // thaw (and close st)
	waitUnstuck(t, st)
}

// BenchmarkDirCapPut is the cost of the capacity's accounting: Puts of new 64 KiB pages in
// batches of 8, one worker (CPU per page, what a rank's backup pays), without a capacity,
// with one never reached (the reservation under flock, a futimens per page), with
// one 2048 pages wide that the Puts keep crossing (a scan every 102 pages in the steady
// state, which removes as many pages as were written) and, its baseline, no capacity and
// each batch's Put followed by a Delete of the batch written 2048 pages before (the removal
// an eviction cannot avoid). Then Gets of stored pages, without and with a capacity (one futimens
// per hit).
//
// Metrics beside ns/page: cpu-ns/page, the process's CPU time (user and system) per page,
// less sensitive than the wall time to a loaded machine. $CPCACHE_BENCH_DIR, if set, is where
// the stores go (a tmpfs such as /dev/shm takes the disk out of the comparison).
func BenchmarkDirCapPut(b *testing.B) {
	const page, batch = 64 << 10, 8
	benchDir := func(b *testing.B) string {
		if d := os.Getenv("CPCACHE_BENCH_DIR"); d != "" {
			d, err := os.MkdirTemp(d, "capbench-")
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { os.RemoveAll(d) })
			return d
		}
		return b.TempDir()
	}
	stored := int64(storage.StoredLen(page))
	for _, c := range []struct{ name, query string }{
		{"none", ""},
		{"unreached", "?max_bytes=1TiB"},
		{"evicting", fmt.Sprintf("?max_bytes=%d", 2048*stored)},
		{"none+delete", ""},
	} {
		b.Run("put/"+c.name, func(b *testing.B) {
			ns := mustNamespace(b, "capbench")
			s := openURL(b, "file://"+benchDir(b)+c.query, storage.Options{Namespace: ns, Workers: 1})
			defer s.Close()
			src := make([][]byte, batch)
			for i := range src {
				src[i] = make([]byte, page)
			}
			ctx := context.Background()
			b.SetBytes(batch * page)
			next := uint64(0)
			cpu0 := cpuTime()
			for b.Loop() {
				ids := make([]uint64, batch)
				for j := range ids {
					ids[j] = next
					next++
				}
				keys, binds := chainPages(ns, 0, ids)
				if err := s.PutBound(ctx, keys, binds, src); err != nil {
					b.Fatal(err)
				}
				if c.name == "none+delete" && ids[0] >= 2048 {
					for j := range ids {
						ids[j] -= 2048
					}
					old, _ := chainPages(ns, 0, ids)
					if err := s.Delete(ctx, old); err != nil {
						b.Fatal(err)
					}
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batch), "ns/page")
			b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N*batch), "cpu-ns/page")
			b.ReportMetric(float64(s.Stats().Evicted)/float64(b.N*batch), "evicted/page")
		})
	}
	for _, c := range []struct{ name, query string }{{"none", ""}, {"capped", "?max_bytes=1TiB"}} {
		b.Run("get/"+c.name, func(b *testing.B) {
			ns := mustNamespace(b, "capbench")
			s := openURL(b, "file://"+benchDir(b)+c.query, storage.Options{Namespace: ns, Workers: 1})
			defer s.Close()
			ids := make([]uint64, batch)
			for j := range ids {
				ids[j] = uint64(j)
			}
			keys, binds := chainPages(ns, 0, ids)
			src := make([][]byte, batch)
			for i := range src {
				src[i] = make([]byte, page)
			}
			ctx := context.Background()
			if err := s.PutBound(ctx, keys, binds, src); err != nil {
				b.Fatal(err)
			}
			b.SetBytes(batch * page)
			cpu0 := cpuTime()
			for b.Loop() {
				if n, err := s.GetBound(ctx, keys, binds, src, nil); n != batch || err != nil {
					b.Fatal(n, err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batch), "ns/page")
			b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N*batch), "cpu-ns/page")
		})
	}
}

// cpuTime is the process's CPU time so far (user and system), in ns.
func cpuTime() int64 {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// BenchmarkDirCapFirstScan is the first Put of a store opened with a capacity on a
// directory filled without one ($CPCACHE_BENCH_PAGES pages of 1 KiB, default 20000, in
// $CPCACHE_BENCH_DIR or a temporary directory): the scan lists every page and reads every
// header once. capacity-above: nothing to evict; capacity-half: half of the pages go.
func BenchmarkDirCapFirstScan(b *testing.B) {
	n := 20000
	if v, err := strconv.Atoi(os.Getenv("CPCACHE_BENCH_PAGES")); err == nil && v > 0 {
		n = v
	}
	for _, c := range []struct {
		name string
		max  int64
	}{{"capacity-above", 2 * int64(n) * capStored}, {"capacity-half", int64(n) / 2 * capStored}} {
		b.Run(c.name, func(b *testing.B) {
			ns := mustNamespace(b, "capscan")
			for b.Loop() {
				b.StopTimer()
				dir := b.TempDir()
				if d := os.Getenv("CPCACHE_BENCH_DIR"); d != "" {
					var err error
					if dir, err = os.MkdirTemp(d, "capscan-"); err != nil {
						b.Fatal(err)
					}
				}
				fill := openURL(b, "file://"+dir, storage.Options{Namespace: ns})
				ctx := context.Background()
				for i := 0; i < n; i += 64 {
					ids := make([]uint64, 64)
					for j := range ids {
						ids[j] = uint64(i + j)
					}
					keys, binds := chainPages(ns, 0, ids)
					if err := fill.PutBound(ctx, keys, binds, capPages(64, 1)); err != nil {
						b.Fatal(err)
					}
				}
				fill.Close()
				s := openURL(b, fmt.Sprintf("file://%s?max_bytes=%d", dir, c.max), storage.Options{Namespace: ns, Timeout: time.Minute})
				keys, binds := chainPages(ns, 0, []uint64{1 << 40})
				b.StartTimer()
				start := time.Now()
				if err := s.PutBound(ctx, keys, binds, capPages(1, 2)); err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(float64(time.Since(start).Nanoseconds())/float64(n), "ns/page-scanned")
				b.StopTimer()
				if c.name == "capacity-half" && dirBytes(b, dir) > c.max {
					b.Fatalf("directory %d bytes after the first Put, past %d", dirBytes(b, dir), c.max)
				}
				s.Close()
				os.RemoveAll(dir)
				b.StartTimer()
			}
		})
	}
}

// TestDirCapFilledWithoutCapacity: a store opened with a capacity on a directory that stores
// without one filled past it (as the 1.27 GB a run leaves) brings it within the capacity at
// its first Put, and the chains lose their later pages, never their first: the parents come
// from the pages' headers (read without touching the pages' atime, which would make every
// page look just used).
func TestDirCapFilledWithoutCapacity(t *testing.T) {
	dir := t.TempDir()
	ns := mustNamespace(t, "capfilled")
	fill := openURL(t, "file://"+dir, storage.Options{Namespace: ns})
	ctx := testCtx(t)
	var chains [][]storage.Key
	for c := range 4 {
		ids := make([]uint64, 30)
		for i := range ids {
			ids[i] = uint64(c*1000 + i)
		}
		keys, binds := chainPages(ns, 2, ids)
		for i := range keys { // page by page: the earlier pages are the older files
			if err := fill.PutBound(ctx, keys[i:i+1], binds[i:i+1], capPages(1, byte(i))); err != nil {
				t.Fatal(err)
			}
		}
		chains = append(chains, keys)
	}
	fill.Close()
	max := 60 * capStored
	s := openURL(t, fmt.Sprintf("file://%s?max_bytes=%d", dir, max), storage.Options{Namespace: ns})
	defer s.Close()
	keys, binds := chainPages(ns, 2, []uint64{1 << 40})
	if err := s.PutBound(ctx, keys, binds, capPages(1, 1)); err != nil {
		t.Fatal(err)
	}
	if got := dirBytes(t, dir); got > stores.DirLowWater(max)+capStored {
		t.Fatalf("directory holds %d bytes after the first Put, past the low watermark %d (capacity %d)", got, stores.DirLowWater(max), max)
	}
	for c, keys := range chains {
		present := make([]bool, len(keys))
		if _, err := s.Exists(ctx, keys, present); err != nil {
			t.Fatal(err)
		}
		if n := slices.Index(present, false); n >= 0 && slices.Contains(present[n:], true) {
			t.Errorf("chain %d: present %v, want a prefix", c, present)
		}
	}
	if st := s.Stats(); st.Evicted < 120-60 {
		t.Fatalf("%d evicted, want at least 60 of the 120 pages", st.Evicted)
	}
}
