package hicache

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cpcache/cpcache/hicache/kvtest"
	"github.com/cpcache/cpcache/storage"
	"github.com/cpcache/cpcache/storage/stores"
)

// hangingStore wraps a storage: while hang is set every call blocks until its context ends
// (a stopped server that still accepts connections). calls counts the calls made, probes
// the one-key Exists calls among them.
type hangingStore struct {
	storage.Storage
	hang          *atomic.Bool
	calls, probes *atomic.Int64
}

func (s hangingStore) wait(ctx context.Context) error {
	s.calls.Add(1)
	if !s.hang.Load() {
		return nil
	}
	<-ctx.Done()
	return ctx.Err()
}

func (s hangingStore) Exists(ctx context.Context, keys []storage.Key, present []bool) (int, error) {
	if len(keys) == 1 && present == nil {
		s.probes.Add(1)
	}
	if err := s.wait(ctx); err != nil {
		return 0, err
	}
	return s.Storage.Exists(ctx, keys, present)
}

func (s hangingStore) Get(ctx context.Context, keys []storage.Key, dst [][]byte, found []bool) (int, error) {
	if err := s.wait(ctx); err != nil {
		return 0, err
	}
	return s.Storage.Get(ctx, keys, dst, found)
}

func (s hangingStore) GetBound(ctx context.Context, keys []storage.Key, binds []storage.Binding, dst [][]byte, found []bool) (int, error) {
	if err := s.wait(ctx); err != nil {
		return 0, err
	}
	return s.Storage.GetBound(ctx, keys, binds, dst, found)
}

func (s hangingStore) Put(ctx context.Context, keys []storage.Key, src [][]byte) error {
	if err := s.wait(ctx); err != nil {
		return err
	}
	return s.Storage.Put(ctx, keys, src)
}

func (s hangingStore) PutBound(ctx context.Context, keys []storage.Key, binds []storage.Binding, src [][]byte) error {
	if err := s.wait(ctx); err != nil {
		return err
	}
	return s.Storage.PutBound(ctx, keys, binds, src)
}

// sameCircuit checks that every rank agrees on the storage circuit and returns its state.
func (r *rig) sameCircuit() bool {
	r.t.Helper()
	open := r.caches[0].Stats().StorageCircuitOpen
	for i, c := range r.caches {
		if got := c.Stats().StorageCircuitOpen; got != open {
			r.t.Fatalf("rank %d: storage circuit open %t, rank 0 %t", i, got, open)
		}
	}
	return open
}

// waitCircuit steps (pausing between steps, so that probes can run) until every rank
// agrees the storage circuit is in the wanted state.
func (r *rig) waitCircuit(open bool) {
	r.t.Helper()
	for deadline := time.Now().Add(20 * time.Second); r.sameCircuit() != open; {
		if time.Now().After(deadline) {
			r.t.Fatalf("storage circuit never became open=%t", open)
		}
		time.Sleep(2 * time.Millisecond)
		r.mustStep()
	}
}

// TestL3CircuitBreakerHangingStorage stops answering storage calls (they hang until their
// deadline): every rank's breaker opens at its first timed-out call, every rank
// agrees the circuit open at the same step, no prefetch or backup is queued and no storage
// call is made but the probes while it is open, every step completes and hits are served
// from L1/L2; once the store answers a probe, the circuit closes everywhere and backups and
// prefetches resume.
func TestL3CircuitBreakerHangingStorage(t *testing.T) {
	ns := testNamespace(t)
	var hang atomic.Bool
	var calls, probes atomic.Int64
	mem := openStores(t, "mem://breaker-"+t.Name(), ns)
	store := func(i int) storage.Storage {
		return hangingStore{Storage: mem(i), hang: &hang, calls: &calls, probes: &probes}
	}
	rc := l3RigConfig(l3Layout, store, ns, L3Options{CallTimeout: 30 * time.Millisecond, CircuitFailures: 2,
		CircuitProbeInterval: 5 * time.Millisecond, PrefetchPolicy: PrefetchWaitComplete})
	r := newRig(t, rc)
	seqs := kvtest.RandomSequences(rand.New(rand.NewPCG(21, 21)), 12, 4)
	r.insertAll(seqs[:4])
	if st := r.sameStats(); st.L3BackedUpPages == 0 || r.sameCircuit() {
		t.Fatalf("store up: %d pages backed up, circuit open %t", st.L3BackedUpPages, r.sameCircuit())
	}

	// The store hangs: the first calls time out, the breakers open, the group agrees.
	hang.Store(true)
	r.evictAll()
	for _, s := range seqs[:4] {
		r.prefetch(s, -1) // each query waits at most the call deadline, then misses
		if r.sameCircuit() {
			break
		}
	}
	r.waitCircuit(true)
	opened := 0
	for i, c := range r.caches {
		// A rank's breaker opens at its own first call that hung (each rank queries only its
		// own pages; once the group agreed the circuit open, the others make none).
		st := c.Stats()
		if (st.StorageCircuitOpenSeconds > 0) != (st.StorageErrors > 0) {
			t.Fatalf("rank %d: circuit open for %.3fs after %d failed storage calls", i, st.StorageCircuitOpenSeconds, st.StorageErrors)
		}
		if st.StorageErrors > 0 {
			opened++
		}
	}
	if opened == 0 {
		t.Fatal("the circuit is agreed open, but no rank's breaker opened")
	}
	r.drain()

	// Open: nothing is queued for storage, and only probes reach it.
	before, beforeProbes := calls.Load(), probes.Load()
	for _, s := range seqs[:4] {
		if res := r.prefetch(s, -1); res.ID != 0 {
			t.Fatalf("prefetch %+v started with the circuit open", res)
		}
	}
	r.insertAll(seqs[4:8])
	if q := r.caches[0].core.Queues(); q.Puts != 0 || q.Queries != 0 {
		t.Fatalf("circuit open: queued %d backups and %d queries to storage", q.Puts, q.Queries)
	}
	if made, probed := calls.Load()-before, probes.Load()-beforeProbes; made != probed {
		t.Fatalf("circuit open: %d storage calls, of which only %d probes", made, probed)
	}
	if _, err := r.matchLoad(seqs[5], true); err != nil {
		t.Fatal(err)
	}
	r.checkAgree()

	// The store answers again: a probe closes the circuit; backups and prefetches resume.
	hang.Store(false)
	r.waitCircuit(false)
	backed := r.sameStats().L3BackedUpPages
	r.insertAll(seqs[8:])
	if st := r.sameStats(); st.L3BackedUpPages <= backed {
		t.Fatalf("circuit closed: backed up %d -> %d pages", backed, st.L3BackedUpPages)
	}
	r.evictAll()
	prefetched := r.sameStats().L3PrefetchedPages
	for _, s := range seqs[8:] {
		r.prefetch(s, -1)
		if _, err := r.matchLoad(s, true); err != nil {
			t.Fatal(err)
		}
	}
	if st := r.sameStats(); st.L3PrefetchedPages == prefetched {
		t.Fatal("nothing prefetched once the circuit closed")
	}
	r.checkCollectives()
}

// TestBreakerBackoff checks the breaker alone: it opens at the threshold of consecutive
// failures (a success in between resets the count) or at the first timed-out call, probes back off exponentially up to
// the cap, a canceled probe changes nothing, and an answered probe closes it and adds the
// time open.
func TestBreakerBackoff(t *testing.T) {
	now := time.Unix(0, 0)
	b := newBreaker(&L3Options{CircuitFailures: 3, CircuitProbeInterval: time.Second})
	b.now = func() time.Time { return now }
	fail := context.DeadlineExceeded
	b.record(fail, false)
	b.record(fail, false)
	b.record(nil, false)
	b.record(fail, false)
	b.record(fail, false)
	if b.isOpen() {
		t.Fatal("open after 2 consecutive failures")
	}
	b.record(fail, false)
	if !b.isOpen() {
		t.Fatal("closed after 3 consecutive failures")
	}
	if b.probeDue() {
		t.Fatal("probe due at once")
	}
	for _, wait := range []time.Duration{1, 2, 4, 8, 16, 32, 32} {
		now = now.Add(wait*time.Second - time.Millisecond)
		if b.probeDue() {
			t.Fatalf("probe due before %ds", wait)
		}
		now = now.Add(time.Millisecond)
		if !b.probeDue() || b.probeDue() {
			t.Fatalf("not exactly one probe due after %ds", wait)
		}
		b.probed(fail, false)
	}
	now = now.Add(32 * time.Second)
	if !b.probeDue() {
		t.Fatal("no probe due")
	}
	b.probed(nil, true) // canceled: still open
	if !b.isOpen() || !b.probeDue() {
		t.Fatal("a canceled probe changed the breaker")
	}
	b.probed(nil, false)
	if b.isOpen() {
		t.Fatal("open after an answered probe")
	}
	if got, want := b.openSeconds(), float64(1+2+4+8+16+32+32+32); got != want {
		t.Fatalf("open for %vs, want %vs", got, want)
	}
	// One call past its deadline opens it at once.
	b.record(fail, true)
	if !b.isOpen() {
		t.Fatal("closed after a timed-out call")
	}
}

// TestL3CircuitBreakerFrozenFileSystem runs the L3 tier on a real directory store whose
// file system operations freeze (stores.Faults.Freeze: they block in the "kernel",
// ignoring every context, as on a frozen ext4 or a hung NFS mount): the calls are abandoned
// at their deadline, every rank's breaker opens and the group agrees it; every step,
// Flush (which clears the store, abandoned too) and insert goes on from L1/L2 while the
// file system stays frozen; the circuit stays open, probes answered or not, while
// operations are stuck; the abandoned operations are counted. After the thaw they finish,
// the circuit closes and backups resume.
func TestL3CircuitBreakerFrozenFileSystem(t *testing.T) {
	ns := testNamespace(t)
	plain := openStores(t, "file://"+t.TempDir(), ns)
	var mu sync.Mutex            // protects frozen (the ranks open their stores at once)
	var frozen []storage.Storage // every rank's store, frozen from the start
	store := func(i int) storage.Storage {
		st := stores.WithFaults(plain(i), stores.Faults{Freeze: true, Ops: []string{"put", "clear"}})
		mu.Lock()
		frozen = append(frozen, st)
		mu.Unlock()
		return st
	}
	rc := l3RigConfig(l3Layout, store, ns, L3Options{CallTimeout: 30 * time.Millisecond, CircuitFailures: 2,
		CircuitProbeInterval: 5 * time.Millisecond, ClearOnFlush: true})
	r := newRig(t, rc)
	seqs := kvtest.RandomSequences(rand.New(rand.NewPCG(22, 22)), 8, 4)

	// Every step and the whole insert-and-drain returns: the backups' writes are abandoned
	// at their deadline, the circuit opens and the backups fail.
	within(t, 30*time.Second, "inserting on a frozen file system", func() { r.insertAll(seqs[:4]) })
	r.waitCircuit(true)
	var abandoned int64
	for i, c := range r.caches {
		st := c.Stats()
		if st.StorageAbandoned == 0 || st.StorageStuck == 0 || st.StorageCircuitOpenSeconds == 0 {
			t.Fatalf("rank %d: %d storage operations abandoned, %d stuck, circuit open %.3fs", i, st.StorageAbandoned, st.StorageStuck, st.StorageCircuitOpenSeconds)
		}
		abandoned += st.StorageAbandoned
	}
	if st := r.sameStats(); st.L3BackedUpPages != 0 {
		t.Fatalf("%d pages backed up to a frozen file system", st.L3BackedUpPages)
	}
	// Probes find the store (lookups answer) but operations are stuck: it stays open.
	for range 20 {
		time.Sleep(5 * time.Millisecond) // a probe interval: probes run and answer
		r.mustStep()
		if !r.sameCircuit() {
			t.Fatal("the circuit closed while operations were stuck in the kernel")
		}
	}
	if _, err := r.matchLoad(seqs[1], true); err != nil {
		t.Fatal(err)
	}
	within(t, 30*time.Second, "flushing (clearing the store) on a frozen file system", func() { r.flushAndCheckFresh() })
	r.insertAll(seqs[4:6])
	r.checkAgree()
	t.Logf("%d storage operations abandoned while frozen", abandoned)

	// The thaw: the stuck operations finish, a probe closes the circuit, backups resume.
	for _, st := range frozen {
		st.(interface{ Thaw() }).Thaw()
	}
	r.waitCircuit(false)
	r.insertAll(seqs[6:])
	if st := r.sameStats(); st.L3BackedUpPages == 0 {
		t.Fatal("nothing backed up after the thaw")
	}
	// Nothing stays stuck: an operation of the backups above that a loaded machine kept past
	// its deadline (abandoned, counted stuck) returns soon after.
	for i, c := range r.caches {
		for deadline := time.Now().Add(10 * time.Second); c.Stats().StorageStuck != 0; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("rank %d: %d operations stuck 10 s after the thaw", i, c.Stats().StorageStuck)
			}
		}
	}
	r.checkCollectives()
}

// within runs fn and ends the test binary with a panic naming what if fn has not returned
// after d (a regression blocks instead of failing; fn runs on the test's goroutine, so it
// may call t.Fatal).
func within(t *testing.T, d time.Duration, what string, fn func()) {
	t.Helper()
	watchdog := time.AfterFunc(d, func() { panic(fmt.Sprintf("%s: %s still blocked after %v", t.Name(), what, d)) })
	defer watchdog.Stop()
	fn()
}
