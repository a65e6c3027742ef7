package hicache

import (
	"context"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cpcache/cpcache/hicache/kvtest"
	"github.com/cpcache/cpcache/storage"
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

func (s hangingStore) Put(ctx context.Context, keys []storage.Key, src [][]byte) error {
	if err := s.wait(ctx); err != nil {
		return err
	}
	return s.Storage.Put(ctx, keys, src)
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
// deadline): the I/O ranks' breakers open at the first timed-out call, every rank
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
	for i, c := range r.caches {
		if secs := c.Stats().StorageCircuitOpenSeconds; (secs > 0) != c.core.IORank() {
			t.Fatalf("rank %d (I/O rank %t): circuit open for %.3fs", i, c.core.IORank(), secs)
		}
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
