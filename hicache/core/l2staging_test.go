package core

import (
	"testing"

	"github.com/cpcache/cpcache/hicache/kvtest"
)

// stepL3 makes one consensus step after every rank finished all its transfers and its
// storage jobs (puts only when puts is set: a backup to storage not acknowledged keeps its
// node unstored); it checks that the replicas agree.
func (r *coreRig) stepL3(puts bool) {
	r.t.Helper()
	for i, c := range r.cores {
		rd := c.Ready()
		r.pending[i] = append(r.pending[i], rd.Transfers...)
		var done Done
		for _, t := range r.pending[i] {
			done.Transfers = append(done.Transfers, TransferDone{Kind: t.Kind, Seq: t.Seq, Err: r.run(i, t)})
		}
		r.pending[i] = nil
		r.jobs[i] = append(r.jobs[i], rd.Jobs...)
		keep := r.jobs[i][:0]
		for _, j := range r.jobs[i] {
			if j.Kind == StoragePut && !puts {
				keep = append(keep, j)
				continue
			}
			done.Storage = append(done.Storage, StorageDone{Kind: j.Kind, Seq: j.Seq, Pages: len(j.Hashes)})
		}
		r.jobs[i] = keep
		c.Report(done)
	}
	for i, err := range r.stepAll() {
		if err != nil {
			r.t.Fatalf("rank %d: %v", i, err)
		}
	}
	r.checkSame()
}

// TestPrefetchDropsL2CopiesOfStoredL1Pages: with L2 no larger than L1 under write-through,
// every L1 page has an L2 copy and a full L2 holds nothing evictable. A prefetch then frees
// the L2 copies of L1 pages that storage holds (their L1 pages stay: the hit is kept), the
// same on every replica, and is inserted whole; it is refused for want of room while the
// backups to storage are not acknowledged (those copies are the only ones outside L1).
// Before, every such prefetch was refused (RefusedNoRoom) and storage served nothing.
func TestPrefetchDropsL2CopiesOfStoredL1Pages(t *testing.T) {
	const n = 4
	r := &coreRig{t: t, pb: 64, slabs: kvtest.NewMemSlabs(make([]int, n), 4, 64)}
	for i := range n {
		c, err := New(Config{Options: Options{PageSize: 4, L1Pages: 4}, Slabs: n, PagesPerSlab: 4, CPRank: i, L3: true,
			L3Config: L3Config{PrefetchQuotaPages: 16}})
		if err != nil {
			t.Fatal(err)
		}
		r.cores = append(r.cores, c)
		r.l1 = append(r.l1, make([]byte, c.cfg.L1Pages*r.pb))
		r.pending = append(r.pending, nil)
	}
	r.jobs = make([][]StorageJob, n)
	a, b := seqTokens(16, 0, 1), seqTokens(8, 0, 1000)
	if _, err := r.insert(a); err != nil { // 16 pages: every L1 pool and every slab full
		t.Fatal(err)
	}
	r.stepL3(false) // the backup to L2 commits; its backup to storage is not acknowledged
	r.stepL3(false)
	prefetch := func() PrefetchOutcome {
		t.Helper()
		var id uint64
		for i, c := range r.cores {
			res := c.Prefetch(Request{Tokens: b})
			if i == 0 {
				id = res.ID
			} else if res.ID != id || id == 0 {
				t.Fatalf("rank %d: prefetch %d, rank 0 %d", i, res.ID, id)
			}
		}
		for k := 0; r.cores[0].PrefetchPending(id); k++ {
			if k > 10 {
				t.Fatal("the prefetch never ends")
			}
			r.stepL3(false)
		}
		out, _ := r.cores[0].PrefetchOutcome(id)
		return out
	}
	if out := prefetch(); out.Inserted != 0 || out.Refused != RefusedNoRoom {
		t.Fatalf("before the backup to storage is acknowledged: %+v, want refused for want of L2 room", out)
	}
	r.stepL3(true) // storage holds a
	r.stepL3(true)
	if out := prefetch(); out != (PrefetchOutcome{Stored: 8, Inserted: 8}) {
		t.Fatalf("after: %+v, want all 8 stored pages inserted", out)
	}
	for i, c := range r.cores {
		if got := c.Stats().DroppedL2CopyPages; got != 16 {
			t.Fatalf("rank %d: %d L2 copies dropped, want a's 16", i, got)
		}
	}
	if m := r.match(a)[0]; m.DevicePages != 16 { // match verifies the L1 pages
		t.Fatalf("a after the drop: %d device pages, want 16 (its L1 pages stay)", m.DevicePages)
	}
	if m := r.match(b)[0]; m.HostPages != 8 {
		t.Fatalf("b: %d host pages, want 8", m.HostPages)
	}
}
