package core

import (
	"fmt"
	"slices"
	"testing"
)

// shareRig steps C cores of one slab group with L3: every rank collects the work its core
// hands out and reports its storage jobs through answer (how many of the job's own pages
// it stored, found or verified).
type shareRig struct {
	t     *testing.T
	cores []*Core
	jobs  [][]StorageJob // per rank: storage jobs handed out and not yet reported
}

func newShareRig(t *testing.T, C int) *shareRig {
	r := &shareRig{t: t, jobs: make([][]StorageJob, C)}
	for i := range C {
		c, err := New(Config{Options: Options{PageSize: 2, L1Pages: 64}, Slabs: C, PagesPerSlab: 16, CPRank: i, L3: true,
			L3Config: L3Config{PrefetchQuotaPages: 64}})
		if err != nil {
			t.Fatal(err)
		}
		r.cores = append(r.cores, c)
	}
	return r
}

// step reports every rank's finished transfers and the storage jobs answer decides (n >= 0:
// done with n of its pages; n < 0: still running), then makes one agreed step.
func (r *shareRig) step(answer func(rank int, j StorageJob) int) {
	r.t.Helper()
	for i, c := range r.cores {
		rd := c.Ready()
		r.jobs[i] = append(r.jobs[i], rd.Jobs...)
		var done Done
		for _, tr := range rd.Transfers {
			done.Transfers = append(done.Transfers, TransferDone{Kind: tr.Kind, Seq: tr.Seq})
		}
		keep := r.jobs[i][:0]
		for _, j := range r.jobs[i] {
			if n := answer(i, j); n >= 0 {
				done.Storage = append(done.Storage, StorageDone{Kind: j.Kind, Seq: j.Seq, Pages: n})
			} else {
				keep = append(keep, j)
			}
		}
		r.jobs[i] = keep
		c.Report(done)
	}
	agreed := make([]int64, VectorLen)
	for i, c := range r.cores {
		rd, vec := c.Ready(), c.Vector(make([]int64, VectorLen))
		r.jobs[i] = append(r.jobs[i], rd.Jobs...)
		if len(rd.Transfers) > 0 {
			r.t.Fatalf("rank %d: transfers %+v made between Ready calls", i, rd.Transfers)
		}
		if i == 0 {
			copy(agreed, vec)
		} else {
			for k := range agreed {
				agreed[k] = min(agreed[k], vec[k])
			}
		}
	}
	for i, c := range r.cores {
		if err := c.Apply(slices.Clone(agreed)); err != nil {
			r.t.Fatalf("rank %d: %v", i, err)
		}
		if err := c.CheckInvariants(); err != nil {
			r.t.Fatalf("rank %d: %v", i, err)
		}
	}
	for i, c := range r.cores {
		if c.StateDigest() != r.cores[0].StateDigest() {
			r.t.Fatalf("rank %d state digest %#x, rank 0 %#x", i, c.StateDigest(), r.cores[0].StateDigest())
		}
	}
}

// pending returns rank i's storage jobs of kind not yet reported.
func (r *shareRig) pending(i int, kind StorageKind) []StorageJob {
	var out []StorageJob
	for _, j := range r.jobs[i] {
		if j.Kind == kind {
			out = append(out, j)
		}
	}
	return out
}

// checkShare checks that rank i's one job of kind covers exactly its pages among the first
// k of hashes (sequence pages 0, 1, ...): positions j with j mod C == i, in its slab.
func (r *shareRig) checkShare(i int, kind StorageKind, hashes []PageID, k int) StorageJob {
	r.t.Helper()
	C := len(r.cores)
	var want []PageID
	for j := i; j < k; j += C {
		want = append(want, hashes[j])
	}
	js := r.pending(i, kind)
	if len(want) == 0 {
		if len(js) != 0 {
			r.t.Fatalf("rank %d owns none of %d pages but got %s jobs %+v", i, k, kind, js)
		}
		return StorageJob{}
	}
	if len(js) != 1 || !slices.Equal(js[0].Hashes, want) {
		r.t.Fatalf("rank %d: %s jobs %+v, want one of its pages %v", i, kind, js, want)
	}
	for _, p := range js[0].Pages {
		if p.Slab != i {
			r.t.Fatalf("rank %d: %s %d of page %v in another rank's slab", i, kind, js[0].Seq, p)
		}
	}
	if kind != StorageQuery && len(js[0].Pages) != len(want) {
		r.t.Fatalf("rank %d: %s %d has %d pages for %d hashes", i, kind, js[0].Seq, len(js[0].Pages), len(want))
	}
	return js[0]
}

// TestStorageEveryRankItsShare: with CP2, CP4 and CP8, every rank gets storage jobs for
// exactly the pages it owns (in its slab); a backup counts only once every rank stored its
// part; the agreed stored length is the longest prefix every rank holds (the last rank lacks
// its second page), and the group inserts the longest prefix every rank verified (rank 0
// verifies only its first page), the same on every rank.
func TestStorageEveryRankItsShare(t *testing.T) {
	for _, C := range []int{2, 4, 8} {
		t.Run(fmt.Sprintf("cp%d", C), func(t *testing.T) {
			r := newShareRig(t, C)
			k := 2*C + 1 // pages: not a multiple of C
			tokens := make([]int32, 2*k)
			for i := range tokens {
				tokens[i] = int32(1000*C + i)
			}
			hashes := PrefixHashes(tokens, 2)
			for i, c := range r.cores {
				if _, err := c.Insert(Request{Tokens: tokens}); err != nil {
					t.Fatalf("rank %d: %v", i, err)
				}
			}
			// The write-through backup to L2 commits; the backups to storage start.
			hold := true
			putAnswer := func(rank int, j StorageJob) int {
				if j.Kind == StoragePut && hold && rank == C-1 {
					return -1
				}
				return len(j.Hashes)
			}
			r.step(putAnswer) // the L2 backup committed: storage backups made
			for i, c := range r.cores {
				r.jobs[i] = append(r.jobs[i], c.Ready().Jobs...)
				r.checkShare(i, StoragePut, hashes, k)
			}
			for range 3 {
				r.step(putAnswer)
			}
			for i, c := range r.cores {
				if st := c.Stats(); st.L3BackedUpPages != 0 {
					t.Fatalf("rank %d: %d pages backed up while rank %d has not stored its part", i, st.L3BackedUpPages, C-1)
				}
			}
			hold = false
			r.step(putAnswer)
			for i, c := range r.cores {
				if st := c.Stats(); st.L3BackedUpPages != int64(k) || st.L3FailedBackups != 0 {
					t.Fatalf("rank %d: %d pages backed up, %d failed, want %d and 0", i, st.L3BackedUpPages, st.L3FailedBackups, k)
				}
				if freed, _ := c.EvictL1(1 << 20); freed != k {
					t.Fatalf("rank %d: freed %d L1 pages, want %d", i, freed, k)
				}
				if freed := c.EvictL2(1 << 20); freed != k || c.Nodes() != 0 {
					t.Fatalf("rank %d: freed %d L2 pages (%d nodes left), want %d", i, freed, c.Nodes(), k)
				}
			}

			var id uint64
			for i, c := range r.cores {
				res := c.Prefetch(Request{Tokens: tokens})
				if res.ID == 0 || res.Start != 0 || res.Pages != k {
					t.Fatalf("rank %d: prefetch %+v", i, res)
				}
				id = res.ID
			}
			stored := 2*C - 1 // the last rank's second page (sequence page 2C-1) is missing
			verified := C     // rank 0 verifies its first page only (sequence page C fails)
			r.step(func(rank int, j StorageJob) int {
				r.checkShare(rank, StorageQuery, hashes, k)
				if rank == C-1 {
					return 1
				}
				return len(j.Hashes)
			})
			for i, c := range r.cores {
				r.jobs[i] = append(r.jobs[i], c.Ready().Jobs...)
				r.checkShare(i, StorageRead, hashes, stored)
			}
			r.step(func(rank int, j StorageJob) int {
				if rank == 0 {
					return 1
				}
				return len(j.Hashes)
			})
			want := PrefetchOutcome{Stored: stored, Inserted: verified, Refused: RefusedShort}
			for i, c := range r.cores {
				if c.PrefetchPending(id) {
					t.Fatalf("rank %d: prefetch still pending", i)
				}
				if got, ok := c.PrefetchOutcome(id); !ok || got != want {
					t.Fatalf("rank %d: outcome %+v (%t), want %+v", i, got, ok, want)
				}
				if m := c.Match(Request{Tokens: tokens}); m.DevicePages != 0 || m.HostPages != verified {
					t.Fatalf("rank %d: match %d device + %d host pages, want 0 + %d", i, m.DevicePages, m.HostPages, verified)
				}
				if st := c.Stats(); st.L3HitPages != int64(stored) || st.L3PrefetchedPages != int64(verified) || st.L3DiscardedPages != int64(stored-verified) {
					t.Fatalf("rank %d: %d hit, %d prefetched, %d discarded pages; want %d, %d, %d", i,
						st.L3HitPages, st.L3PrefetchedPages, st.L3DiscardedPages, stored, verified, stored-verified)
				}
			}
		})
	}
}
