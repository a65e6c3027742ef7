package core

import "testing"

// TestPrefetchOutcome: a finished prefetch says how many pages storage held, how many were
// inserted and why the others were not (here: the quota, held by an earlier read), so that
// a scheduler can ask again instead of computing what storage holds.
func TestPrefetchOutcome(t *testing.T) {
	const n = 2
	cores := make([]*Core, n)
	for i := range cores {
		c, err := New(Config{Options: Options{PageSize: 4, L1Pages: 32}, Slabs: n, PagesPerSlab: 32, CPRank: i, L3: true,
			L3Config: L3Config{PrefetchQuotaPages: 6}})
		if err != nil {
			t.Fatal(err)
		}
		cores[i] = c
	}
	r := &coreRig{cores: cores}
	step := func() { t.Helper(); r.finishStorageJobs(t) }
	seq := fourPages
	var ids []uint64
	for _, s := range [][]int32{seq(100), seq(200)} {
		var id uint64
		for i, c := range cores {
			res := c.Prefetch(Request{Tokens: s})
			if i == 0 {
				id = res.ID
			} else if res.ID != id || id == 0 {
				t.Fatalf("rank %d: prefetch %d, rank 0 %d", i, res.ID, id)
			}
		}
		ids = append(ids, id)
	}
	if _, ok := cores[0].PrefetchOutcome(ids[0]); ok {
		t.Fatal("an outcome before the prefetch ended")
	}
	// Storage holds all 4 pages of both: the first read reserves 4 of the 6 quota pages,
	// the second gets the 2 left.
	step() // the queries are answered
	step() // the reads are done
	want := []PrefetchOutcome{{Stored: 4, Inserted: 4}, {Stored: 4, Inserted: 2, Refused: RefusedQuota}}
	for i, c := range cores {
		for k, id := range ids {
			if c.PrefetchPending(id) {
				t.Fatalf("rank %d: prefetch %d still pending", i, id)
			}
			if got, ok := c.PrefetchOutcome(id); !ok || got != want[k] {
				t.Fatalf("rank %d: prefetch %d outcome %+v (%t), want %+v", i, id, got, ok, want[k])
			}
		}
	}
	if !RefusedQuota.Transient() || RefusedCut.Transient() {
		t.Fatal("the quota is transient, a cut is not")
	}
}

// finishStorageJobs steps every core once after each finished the storage jobs it was
// handed (all of its pages stored and read).
func (r *coreRig) finishStorageJobs(t *testing.T) {
	t.Helper()
	for _, c := range r.cores {
		var done Done
		for _, j := range c.Ready().Jobs {
			done.Storage = append(done.Storage, StorageDone{Kind: j.Kind, Seq: j.Seq, Pages: len(j.Hashes)})
		}
		c.Report(done)
	}
	for i, err := range r.stepAll() {
		if err != nil {
			t.Fatalf("rank %d: %v", i, err)
		}
	}
}

// fourPages is the 16 tokens base, base+1, …: 4 pages of 4 tokens.
func fourPages(base int32) []int32 {
	s := make([]int32, 16)
	for i := range s {
		s[i] = base + int32(i)
	}
	return s
}

// stepSolo steps a lone core (one rank, its own vector) after reporting d, checks its
// invariants and returns what it has to do next.
func stepSolo(t *testing.T, c *Core, d Done) Ready {
	t.Helper()
	c.Report(d)
	c.Ready()
	if err := c.Apply(c.Vector(make([]int64, VectorLen))); err != nil {
		t.Fatal(err)
	}
	if err := c.CheckInvariants(); err != nil {
		t.Fatal(err)
	}
	return c.Ready()
}
