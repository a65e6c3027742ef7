package alloc

import (
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

func mustAlloc(t testing.TB, slabs, perSlab int) *Allocator {
	t.Helper()
	a, err := New(slabs, perSlab)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// sameState compares two allocators' full states (not their digests).
func sameState(a, b *Allocator) bool {
	if !slices.Equal(a.Ranges(), b.Ranges()) || !slices.Equal(a.FreeCounts(), b.FreeCounts()) {
		return false
	}
	for _, id := range a.Ranges() {
		pa, ca, _ := a.Range(id)
		pb, cb, _ := b.Range(id)
		if ca != cb || !slices.Equal(pa, pb) {
			return false
		}
	}
	return true
}

func TestResetRestoresFreshlyConstructedAllFreeState(t *testing.T) {
	for _, shape := range [][2]int{{1, 1}, {3, 5}, {8, 200}, {2, 5000}} {
		busy := mustAlloc(t, shape[0], shape[1])
		r := rand.New(rand.NewPCG(uint64(shape[0]), uint64(shape[1])))
		maxK := max(2, shape[0]*shape[1]/6)
		for range 3000 {
			o := randomOp(r, 64, maxK)
			if o.kind == opReset {
				continue
			}
			apply(busy, o)
		}
		if busy.NumRanges() == 0 || busy.TotalFree() == shape[0]*shape[1] {
			t.Fatalf("%v: history left the allocator idle; the test would prove nothing", shape)
		}
		busy.Reset()

		fresh := mustAlloc(t, shape[0], shape[1])
		if busy.Digest() != fresh.Digest() {
			t.Fatalf("%v: digest after Reset %#x, fresh %#x", shape, busy.Digest(), fresh.Digest())
		}
		if !slices.Equal(busy.FreeCounts(), fresh.FreeCounts()) || busy.NumRanges() != 0 ||
			busy.ReservedPages() != 0 || busy.CommittedPages() != 0 {
			t.Fatalf("%v: after Reset free %v ranges %d reserved %d committed %d", shape,
				busy.FreeCounts(), busy.NumRanges(), busy.ReservedPages(), busy.CommittedPages())
		}
		for s := range shape[0] {
			for i := range shape[1] {
				if free, _ := busy.IsFree(Page{s, i}); !free {
					t.Fatalf("%v: page (%d,%d) still used after Reset", shape, s, i)
				}
			}
		}
		// Indistinguishable from now on: the same calls give the same pages and digests.
		for n := range 2000 {
			o := randomOp(r, 64, maxK)
			p1, e1 := apply(busy, o)
			p2, e2 := apply(fresh, o)
			if !slices.Equal(p1, p2) || (e1 == nil) != (e2 == nil) || busy.Digest() != fresh.Digest() {
				t.Fatalf("%v: op %d %v after Reset: pages %v err %v digest %#x; fresh: %v %v %#x",
					shape, n, o, p1, e1, busy.Digest(), p2, e2, fresh.Digest())
			}
		}
	}
}

func TestAllocatorMatchesNaiveModel(t *testing.T) {
	shapes := []struct{ slabs, perSlab, ops, seeds int }{
		{1, 1, 200, 20}, {1, 7, 300, 20}, {3, 5, 400, 40}, {4, 16, 400, 40},
		{8, 70, 300, 10}, {2, 5000, 150, 3},
	}
	for _, sh := range shapes {
		maxK := max(2, sh.slabs*sh.perSlab/4)
		for seed := range sh.seeds {
			r := rand.New(rand.NewPCG(uint64(seed), 7))
			ops := make([]op, sh.ops)
			for i := range ops {
				ops[i] = randomOp(r, 24, maxK)
			}
			if err := runAgainstModel(sh.slabs, sh.perSlab, ops); err != nil {
				t.Fatalf("shape %d×%d seed %d: %v", sh.slabs, sh.perSlab, seed, err)
			}
		}
	}
}

func FuzzAllocatorMatchesModel(f *testing.F) {
	f.Add([]byte{0, 1, 0, 5, 1, 1, 0, 0, 3, 1, 0, 0})
	f.Add([]byte{0, 2, 3, 9, 0, 3, 1, 23, 4, 2, 5, 2, 2, 2, 0, 0, 5, 0, 0, 0})
	f.Add([]byte{0, 1, 0, 0, 0, 1, 0, 17, 0, 1, 0, 17, 3, 1, 0, 0, 2, 1, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		if err := runAgainstModel(3, 5, decodeOps(data)); err != nil {
			t.Fatal(err)
		}
	})
}

func TestReplicasFedSameOpsKeepIdenticalDigests(t *testing.T) {
	const replicas = 5
	r := rand.New(rand.NewPCG(42, 42))
	as := make([]*Allocator, replicas)
	for i := range as {
		as[i] = mustAlloc(t, 8, 64)
	}
	digests := map[uint64]bool{}
	for n := range 5000 {
		o := randomOp(r, 48, 40)
		p0, e0 := apply(as[0], o)
		for i := 1; i < replicas; i++ {
			p, e := apply(as[i], o)
			if !slices.Equal(p, p0) || (e == nil) != (e0 == nil) || as[i].Digest() != as[0].Digest() {
				t.Fatalf("op %d %v: replica %d pages %v err %v digest %#x; replica 0: %v %v %#x",
					n, o, i, p, e, as[i].Digest(), p0, e0, as[0].Digest())
			}
		}
		digests[as[0].Digest()] = true
	}
	if len(digests) < 1000 {
		t.Fatalf("only %d distinct digests over 5000 ops: the digest barely depends on the state", len(digests))
	}
}

// divergenceTrial perturbs one replica with one extra or one missing op at a random position.
// effective: the perturbation changed the state; detected: the digests differ right after it.
func divergenceTrial(seed uint64) (effective, detected, persisted bool) {
	r := rand.New(rand.NewPCG(seed, 99))
	ops := make([]op, 120)
	for i := range ops {
		ops[i] = randomOp(r, 24, 24)
	}
	a, _ := New(4, 32)
	b, _ := New(4, 32)
	at := r.IntN(len(ops))
	extra := r.IntN(2) == 0
	for i, o := range ops {
		if i == at {
			if extra {
				apply(b, randomOp(r, 24, 24))
			}
			apply(a, o)
			if extra {
				apply(b, o)
			}
			effective = !sameState(a, b)
			detected = a.Digest() != b.Digest()
			continue
		}
		apply(a, o)
		apply(b, o)
	}
	persisted = a.Digest() != b.Digest()
	return effective, detected, persisted
}

func TestSingleExtraOrMissingOpChangesDigest(t *testing.T) {
	const trials = 4000
	var effective, detected, noops, falseAlarms, persisted int
	for seed := range uint64(trials) {
		eff, det, pers := divergenceTrial(seed)
		switch {
		case eff && det:
			effective++
			detected++
		case eff:
			effective++
		case det:
			falseAlarms++
		default:
			noops++
		}
		if eff && pers {
			persisted++
		}
	}
	t.Logf("divergence detection: %d/%d state-changing perturbations detected (%.2f%%); %d perturbations were no-ops (a failed call changes nothing); %d/%d still visible in the final digest after the remaining ops",
		detected, effective, 100*float64(detected)/float64(effective), noops, persisted, effective)
	if falseAlarms != 0 {
		t.Fatalf("%d equal states had different digests", falseAlarms)
	}
	if effective < trials/5 {
		t.Fatalf("only %d of %d perturbations changed the state: the generator is too weak", effective, trials)
	}
	if detected != effective {
		t.Fatalf("digest missed %d of %d divergences", effective-detected, effective)
	}
}

func TestPlacementDependsOnlyOnState(t *testing.T) {
	// Two histories that end with the same used set: range 2 committed on the same pages.
	a := mustAlloc(t, 2, 16)
	mustReserve(t, a, 1, 0, 4)
	pa := mustReserve(t, a, 2, 0, 4)
	must(t, a.Commit(1))
	must(t, a.Commit(2))
	must(t, a.Free(1))

	b := mustAlloc(t, 2, 16)
	mustReserve(t, b, 3, 0, 4)
	pb := mustReserve(t, b, 2, 0, 4)
	mustReserve(t, b, 4, 1, 6)
	must(t, b.Commit(2))
	must(t, b.Abort(3))
	must(t, b.Commit(4))
	must(t, b.Free(4))

	if !slices.Equal(pa, pb) || !sameState(a, b) {
		t.Fatalf("histories should end in the same state: %v vs %v", pa, pb)
	}
	if a.Digest() != b.Digest() {
		t.Fatalf("equal states, digests %#x and %#x", a.Digest(), b.Digest())
	}
	for id := RangeID(10); id < 14; id++ {
		x, y := mustReserve(t, a, id, int(id), 3), mustReserve(t, b, id, int(id), 3)
		if !slices.Equal(x, y) {
			t.Fatalf("next reservation %d: %v vs %v", id, x, y)
		}
	}
}

func TestReserveFollowsCPOwnershipAndLowestFreeIndex(t *testing.T) {
	a := mustAlloc(t, 4, 8)
	got := mustReserve(t, a, 1, 2, 6)
	want := []Page{{2, 0}, {3, 0}, {0, 0}, {1, 0}, {2, 1}, {3, 1}}
	if !slices.Equal(got, want) {
		t.Fatalf("reserve from sequence page 2: %v, want %v", got, want)
	}
	must(t, a.Abort(1))
	got = mustReserve(t, a, 2, 0, 5)
	want = []Page{{0, 0}, {1, 0}, {2, 0}, {3, 0}, {0, 1}}
	if !slices.Equal(got, want) {
		t.Fatalf("reserve after abort: %v, want %v", got, want)
	}
	if got, want := a.FreeCounts(), []int{6, 7, 7, 7}; !slices.Equal(got, want) {
		t.Fatalf("free counts %v, want %v", got, want)
	}
	if sf := a.Shortfall(0, 29); !slices.Equal(sf, []int{2, 0, 0, 0}) || a.Fits(0, 29) || !a.Fits(1, 25) {
		t.Fatalf("shortfall(0, 29) = %v, fits(0,29)=%v fits(1,25)=%v", sf, a.Fits(0, 29), a.Fits(1, 25))
	}
}

func TestBadUseIsATypedErrorAndChangesNothing(t *testing.T) {
	a := mustAlloc(t, 2, 4)
	mustReserve(t, a, 1, 0, 2)
	mustReserve(t, a, 2, 0, 4)
	must(t, a.Commit(2))
	before := a.Digest()
	snapshot := mustAlloc(t, 2, 4)
	mustReserve(t, snapshot, 1, 0, 2)
	mustReserve(t, snapshot, 2, 0, 4)
	must(t, snapshot.Commit(2))

	cases := []struct {
		name string
		call func() error
		want []error
		text string
	}{
		{"zero pages", func() error { _, err := a.Reserve(3, 0, 0); return err }, []error{ErrBadArgument}, "0 pages"},
		{"negative start", func() error { _, err := a.Reserve(3, -1, 1); return err }, []error{ErrBadArgument}, "sequence page -1"},
		{"more than the pool", func() error { _, err := a.Reserve(3, 0, 9); return err }, []error{ErrTooLarge}, "9 pages"},
		{"more than one slab", func() error { _, err := a.Reserve(3, 1, 8); return err }, []error{ErrNoSpace}, "slab"},
		{"no space now", func() error { _, err := a.Reserve(3, 0, 3); return err }, []error{ErrNoSpace}, "has 1 free"},
		{"duplicate id", func() error { _, err := a.Reserve(1, 0, 1); return err }, []error{ErrRangeExists}, "range 1"},
		{"commit unknown", func() error { return a.Commit(7) }, []error{ErrUnknownRange}, "range 7"},
		{"commit twice", func() error { return a.Commit(2) }, []error{ErrCommitted}, "range 2"},
		{"free reserved", func() error { return a.Free(1) }, []error{ErrNotCommitted}, "range 1"},
		{"abort committed", func() error { return a.Abort(2) }, []error{ErrCommitted}, "range 2"},
		{"free unknown", func() error { return a.Free(9) }, []error{ErrDoubleFree, ErrUnknownRange}, "range 9"},
		{"abort unknown", func() error { return a.Abort(9) }, []error{ErrDoubleFree, ErrUnknownRange}, "range 9"},
		{"split at 0", func() error { return a.Split(2, 0, 5) }, []error{ErrBadArgument}, "split point 0"},
		{"split onto existing", func() error { return a.Split(2, 1, 1) }, []error{ErrRangeExists}, "new range id 1"},
		{"split unknown", func() error { return a.Split(8, 1, 5) }, []error{ErrUnknownRange}, "range 8"},
	}
	for _, c := range cases {
		err := c.call()
		for _, w := range c.want {
			if !errors.Is(err, w) {
				t.Errorf("%s: error %v does not wrap %v", c.name, err, w)
			}
		}
		if err != nil && (!strings.Contains(err.Error(), c.text) || !strings.HasPrefix(err.Error(), "slab: ")) {
			t.Errorf("%s: error %q should start with \"slab: \" and name %q", c.name, err, c.text)
		}
		if a.Digest() != before || !sameState(a, snapshot) {
			t.Fatalf("%s changed the state", c.name)
		}
	}
	// A real double free: the first Free succeeds, the second is refused.
	must(t, a.Free(2))
	if err := a.Free(2); !errors.Is(err, ErrDoubleFree) {
		t.Fatalf("second free: %v, want ErrDoubleFree", err)
	}
	if _, err := New(0, 4); !errors.Is(err, ErrBadArgument) || !strings.Contains(err.Error(), "0 slabs") {
		t.Fatalf("New(0, 4): %v", err)
	}
	if _, err := a.IsFree(Page{2, 0}); !errors.Is(err, ErrBadArgument) {
		t.Fatalf("IsFree out of range: %v", err)
	}
}

func TestSplitKeepsPagesAndMovesOwnership(t *testing.T) {
	a := mustAlloc(t, 2, 8)
	pages := mustReserve(t, a, 1, 0, 5)
	must(t, a.Commit(1))
	d := a.Digest()
	must(t, a.Split(1, 2, 7))
	if a.Digest() == d {
		t.Fatal("split changed owners but not the digest")
	}
	head, c1, _ := a.Range(7)
	tail, c2, _ := a.Range(1)
	if !slices.Equal(head, pages[:2]) || !slices.Equal(tail, pages[2:]) || !c1 || !c2 {
		t.Fatalf("split: head %v (%v) tail %v (%v) from %v", head, c1, tail, c2, pages)
	}
	must(t, a.Free(7))
	must(t, a.Free(1))
	if a.Digest() != mustAlloc(t, 2, 8).Digest() || a.TotalFree() != 16 {
		t.Fatal("freeing both halves did not restore the empty state")
	}
}

func TestDigestPairGivesMinAndMaxWithOneMin(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 200 {
		a := mustAlloc(t, 3, 9)
		for range 20 {
			apply(a, randomOp(r, 8, 5))
		}
		d, neg := a.DigestPair()
		if d < 0 || neg != -d || uint64(d) != a.Digest()&(1<<63-1) {
			t.Fatalf("DigestPair = (%d, %d) for digest %#x", d, neg, a.Digest())
		}
	}
}

func TestBitTreeLowestMatchesLinearScan(t *testing.T) {
	for _, n := range []int{1, 63, 64, 65, 4095, 4096, 4097, 300000} {
		bt := newBitTree(n)
		free := make([]bool, n)
		for i := range free {
			free[i] = true
		}
		r := rand.New(rand.NewPCG(uint64(n), 3))
		for range 3000 {
			i := r.IntN(n)
			if r.IntN(3) == 0 {
				i = bt.lowest()
				if i < 0 {
					continue
				}
			}
			if free[i] {
				bt.take(i)
			} else {
				bt.put(i)
			}
			free[i] = !free[i]
			want := slices.Index(free, true)
			if got := bt.lowest(); got != want {
				t.Fatalf("n=%d: lowest %d, linear scan %d", n, got, want)
			}
		}
	}
}

func mustReserve(t *testing.T, a *Allocator, id RangeID, start, k int) []Page {
	t.Helper()
	p, err := a.Reserve(id, start, k)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
