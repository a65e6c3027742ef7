package hicache

import (
	"context"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cpcache/cpcache/hicache/core"
	"github.com/cpcache/cpcache/hicache/kvtest"
	"github.com/cpcache/cpcache/internal/testenv/redistest"
)

// storageErrors sums the storage errors of every rank.
func (r *rig) storageErrors() int64 {
	var n int64
	for _, c := range r.caches {
		n += c.Stats().StorageErrors
	}
	return n
}

// TestL3RedisDown kills a real redis-server mid-run: backups are skipped and queries miss
// with counted errors until the storage circuit opens, a read cut off by the server's death
// inserts only the prefix every rank verified of its own pages, every step completes with
// agreeing digests,
// every loaded page has the right content; once the server is back, a probe closes the
// circuit and backups succeed again.
func TestL3RedisDown(t *testing.T) {
	srv := redistest.Start(t)
	ns := testNamespace(t)
	gate := make(chan struct{})
	arrived := make(chan struct{}, l3Ranks) // a rank verified the first chunk of its pages and waits
	var gateOn sync.Mutex                   // protects holding
	holding := false
	rc := l3RigConfig(l3Layout, openStores(t, "redis://"+srv.Addr()+"/hicachetest?timeout=300ms", ns), ns,
		L3Options{PrefetchPolicy: PrefetchWaitComplete, ReadChunkPages: 2, CircuitProbeInterval: 5 * time.Millisecond})
	rc.l3Hook = func(int) func(context.Context, core.StorageKind, uint64, int) error {
		return func(ctx context.Context, kind core.StorageKind, _ uint64, chunk int) error {
			gateOn.Lock()
			hold := holding && kind == core.StorageRead && chunk == 1
			gateOn.Unlock()
			if !hold {
				return nil
			}
			arrived <- struct{}{}
			select {
			case <-gate:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	r := newRig(t, rc)
	seqs := kvtest.RandomSequences(rand.New(rand.NewPCG(11, 11)), 12, 4)
	r.insertAll(seqs[:4])
	st := r.sameStats()
	if st.L3BackedUpPages == 0 || r.storageErrors() != 0 {
		t.Fatalf("server up: %d pages backed up, %d storage errors", st.L3BackedUpPages, r.storageErrors())
	}

	// A read cut off by the server's death: every rank's first chunk (2 of its own pages:
	// sequence pages 0-3 between the two CP ranks) arrives, then the server dies while the
	// ranks wait before their second.
	const verified = 2 * 2 // ReadChunkPages × the CP size
	r.evictAll()
	long := seqs[0]
	for _, s := range seqs[:4] {
		if len(s) > len(long) {
			long = s
		}
	}
	stored := r.storedPages(long)
	gateOn.Lock()
	holding = true
	gateOn.Unlock()
	res := make([]PrefetchResult, len(r.caches))
	if err := r.each("prefetch", func(i int, c *Cache) (err error) { res[i], err = c.Prefetch(Request{Tokens: long}); return err }); err != nil {
		t.Fatal(err)
	}
	for k := 0; r.caches[0].core.Queues().Reads == 0; k++ {
		if k > 10000 || !r.caches[0].PrefetchPending(res[0].ID) {
			t.Fatalf("prefetch of %d stored pages never started reading", stored)
		}
		if err := r.step(); err != nil {
			t.Fatal(err)
		}
	}
	if stored < verified+2 {
		t.Fatalf("only %d pages of the longest sequence stored: not every rank has a second chunk", stored)
	}
	for range l3Ranks {
		<-arrived
	}
	srv.Kill()
	close(gate)
	for k := 0; r.caches[0].PrefetchPending(res[0].ID); k++ {
		if k > 10000 {
			t.Fatal("prefetch never finished")
		}
		if err := r.step(); err != nil {
			t.Fatal(err)
		}
	}
	gateOn.Lock()
	holding = false
	gateOn.Unlock()
	ms, err := r.matchLoad(long, true)
	if err != nil {
		t.Fatal(err)
	}
	if ms[0].DevicePages != verified {
		t.Fatalf("after the server died mid-read: %d pages in the tree, want the %d the ranks verified (%d stored)", ms[0].DevicePages, verified, stored)
	}

	// Server down: backups are skipped, queries miss; nothing hangs.
	errs := r.storageErrors()
	r.insertAll(seqs[4:8])
	if st := r.sameStats(); st.L3FailedBackups == 0 || r.storageErrors() <= errs {
		t.Fatalf("server down: %d failed backups, storage errors %d -> %d", st.L3FailedBackups, errs, r.storageErrors())
	}
	r.evictAll()
	before := r.sameStats().L3PrefetchedPages
	for _, s := range seqs[:8] {
		r.prefetch(s, -1)
		if _, err := r.matchLoad(s, true); err != nil {
			t.Fatal(err)
		}
	}
	if got := r.sameStats().L3PrefetchedPages; got != before {
		t.Fatalf("prefetched %d pages from a dead server", got-before)
	}

	// Repeated failures opened the storage circuit on every rank alike.
	if !r.sameCircuit() {
		t.Fatal("server down: the storage circuit never opened")
	}

	// Server back (empty): a probe closes the circuit, and backups succeed again, by
	// themselves.
	srv.Start()
	r.waitCircuit(false)
	r.evictAll()
	errs = r.storageErrors()
	backed := r.sameStats().L3BackedUpPages
	r.insertAll(seqs[8:])
	if st := r.sameStats(); st.L3BackedUpPages <= backed || r.storageErrors() != errs {
		t.Fatalf("server back: backed up %d -> %d pages, storage errors %d -> %d", backed, st.L3BackedUpPages, errs, r.storageErrors())
	}
	r.evictAll()
	for _, s := range seqs[8:] {
		r.prefetch(s, -1)
		if _, err := r.matchLoad(s, true); err != nil {
			t.Fatal(err)
		}
	}
	if st := r.sameStats(); st.L3PrefetchedPages == before {
		t.Fatal("nothing prefetched once the server was back")
	}
	r.checkCollectives()
}

// TestL3PageEvictedBeforeReadIsAMiss: pages the group agreed were stored but that are gone
// when read (a store's capacity, a TTL or Redis's maxmemory evicted them after the query)
// end the prefetch short: a miss, counted by the store, not a storage error, and no value
// counted corrupt.
func TestL3PageEvictedBeforeReadIsAMiss(t *testing.T) {
	ns := testNamespace(t)
	dir := t.TempDir()
	var vanish atomic.Bool
	evict := func(int) func(context.Context, core.StorageKind, uint64, int) error {
		return func(ctx context.Context, kind core.StorageKind, _ uint64, chunk int) error {
			if kind == core.StorageRead && chunk == 1 && vanish.Load() {
				// Every page file goes between the query and this chunk's read.
				filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
					if err == nil && d.Type().IsRegular() && !strings.HasPrefix(d.Name(), ".") {
						os.Remove(p)
					}
					return nil
				})
			}
			return ctx.Err()
		}
	}
	rc := l3RigConfig(l3Layout, openStores(t, "file://"+dir, ns), ns, L3Options{PrefetchPolicy: PrefetchWaitComplete, ReadChunkPages: 1})
	rc.l3Hook = evict
	r := newRig(t, rc)
	seqs := kvtest.RandomSequences(rand.New(rand.NewPCG(17, 17)), 6, 8)
	r.insertAll(seqs)
	backed := r.sameStats().L3BackedUpPages
	r.evictAll()
	vanish.Store(true)
	for _, s := range seqs {
		r.prefetch(s, -1)
		if _, err := r.matchLoad(s, true); err != nil {
			t.Fatal(err)
		}
	}
	st := r.sameStats()
	var misses, corrupt uint64
	for _, c := range r.caches {
		ss := c.l3.st.Stats()
		misses, corrupt = misses+ss.Misses, corrupt+ss.Corrupt
	}
	t.Logf("%d pages backed up, %d prefetched; store: %d misses, %d corrupt; %d storage errors", backed, st.L3PrefetchedPages, misses, corrupt, r.storageErrors())
	if st.L3PrefetchedPages >= backed || misses == 0 {
		t.Fatalf("the pages never vanished: %d of %d prefetched, %d misses", st.L3PrefetchedPages, backed, misses)
	}
	if r.storageErrors() != 0 || corrupt != 0 {
		t.Fatalf("pages evicted before their read: %d storage errors, %d corrupt values; want misses only", r.storageErrors(), corrupt)
	}
}

// TestL3TornFileIsMiss tears, damages and replaces page files of the directory backend: a
// query stops at the first page whose header does not verify, a prefetch at the first page
// its owner could not verify (a miss with a counted error), and every page that reaches
// L1 has the right content.
func TestL3TornFileIsMiss(t *testing.T) {
	ns := testNamespace(t)
	dir := t.TempDir()
	r := newRig(t, l3RigConfig(l3Layout, openStores(t, "file://"+dir, ns), ns, L3Options{PrefetchPolicy: PrefetchWaitComplete, ReadChunkPages: 3}))
	seqs := kvtest.RandomSequences(rand.New(rand.NewPCG(13, 13)), 8, 4)
	r.insertAll(seqs)
	backed := r.sameStats().L3BackedUpPages
	var files []string
	if err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			files = append(files, p)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	slices.Sort(files)
	if len(files) < 10 {
		t.Fatalf("%d page files stored", len(files))
	}
	for i, f := range files {
		switch i % 9 {
		case 2: // a payload bit flip: the header verifies (the query counts the page), the read does not
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			b[len(b)-1] ^= 1
			if err := os.WriteFile(f, b, 0o600); err != nil {
				t.Fatal(err)
			}
		case 4: // torn: the second half is missing
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(f, b[:len(b)/2], 0o600); err != nil {
				t.Fatal(err)
			}
		case 7: // foreign: another page's file under this name
			b, err := os.ReadFile(files[(i+2)%len(files)])
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(f, b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	r.evictAll()
	for _, s := range seqs {
		r.prefetch(s, -1)
		if _, err := r.matchLoad(s, true); err != nil {
			t.Fatal(err)
		}
	}
	st := r.sameStats()
	var corrupt uint64
	for _, c := range r.caches {
		corrupt += c.l3.st.Stats().Corrupt // each rank's handle finds the bad values among its own pages
	}
	t.Logf("%d pages backed up, %d hit, %d prefetched, %d discarded; %d corrupt values, %d storage errors",
		backed, st.L3HitPages, st.L3PrefetchedPages, st.L3DiscardedPages, corrupt, r.storageErrors())
	if corrupt == 0 || r.storageErrors() == 0 || st.L3PrefetchedPages >= backed || st.L3PrefetchedPages == 0 {
		t.Fatalf("torn files: %d corrupt values, %d storage errors, %d of %d pages prefetched", corrupt, r.storageErrors(), st.L3PrefetchedPages, backed)
	}

	// Each bad value found is deleted, so backing the sequences up again replaces it: after
	// a few rounds of backup and prefetch no bad value is left and every stored prefix comes
	// back whole.
	for round := 0; ; round++ {
		if round == 20 {
			t.Fatal("bad values are never repaired")
		}
		r.drain()
		r.flushAndCheckFresh()
		r.insertAll(seqs)
		r.evictAll()
		errs := r.storageErrors()
		short := 0
		for _, s := range seqs {
			stored := r.storedPages(s)
			pf := r.prefetch(s, -1)
			ms, err := r.matchLoad(s, true)
			if err != nil {
				t.Fatal(err)
			}
			if ms[0].DevicePages != max(stored, pf.Start) {
				short++
			}
		}
		if r.storageErrors() == errs {
			if short > 0 {
				t.Fatalf("round %d: no storage error, but %d prefixes came back short", round, short)
			}
			t.Logf("repaired after %d rounds", round+1)
			break
		}
	}
}
